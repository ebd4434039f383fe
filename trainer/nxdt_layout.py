"""Where each parameter of a Hugging Face Llama lives in NxD Training's sharded checkpoint
(``model/dp_rank_00_tp_rank_XX_pp_rank_YY.pt``), for a given tp, pp, KV replication and
hardware backend (in aws-neuron/neuronx-distributed, under ``src/neuronx_distributed/``:
``scripts/checkpoint_converter.py``, ``modules/qkv_linear.py``, ``pipeline/partition.py``; see
docs/stages.md, "convert").

Pure index arithmetic, no tensors: the converter reads exactly the rows and columns a shard
needs, and the tests check the placement on its own.

Q heads and K/V heads are placed the way NxD's ``GQAQKVColumnParallelLinear`` uses them at run
time, so every rank's Q heads attend with the K/V head it holds:
- trn1: K/V tiled (``repeat``: K0..K7, K0..K7, ...), Q heads reordered to match;
- trn2: K/V interleaved (``repeat_interleave``: K0, K0, K0, K0, K1, ...), Q heads in order.
NxD's own converter tiles K/V on trn2 too, which pairs most trn2 ranks with the wrong K/V head
(``convert_full_state_to_tp`` in NxD's ``scripts/checkpoint_converter.py``, against
``_initialize_affine_weight`` in its ``modules/qkv_linear.py``); this layout follows the model
instead.

The attention's Q/K/V are named as NxDT's Llama builds them: GQAQKVColumnParallelLinear's
``qkv_proj.weight_q/k/v`` (or fused ``weight_qkv``) under ``qkv_linear: true``, plain
``q_proj``/``k_proj``/``v_proj`` ColumnParallelLinear weights under ``qkv_linear: false``
(``LlamaAttention`` in aws-neuron/neuronx-distributed-training
``src/neuronx_distributed_training/models/hf_models/modeling_llama.py``, commit 9169aa0; NxD's
converter names them the same, ``get_hf_to_nxd_model_keys`` in its
``scripts/checkpoint_converter.py``, commit fbac349). Without qkv_linear there is no replication
and the heads stay in order: each rank holds a contiguous slice of Q, K and V rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from trainer.model_shape import (check_converted_kv_heads, check_heads_over_tp, check_kv_heads_over_tp,
                                 check_qkv_layout)

# Q/K/V tensor names under model.layers.N.self_attn, by (qkv_linear, fuse_qkv); check_qkv_layout
# refuses fuse_qkv without qkv_linear.
QKV_NAMES: dict[tuple[bool, bool], tuple[str, ...]] = {
    (True, False): ("qkv_proj.weight_q", "qkv_proj.weight_k", "qkv_proj.weight_v"),
    (True, True): ("qkv_proj.weight_qkv",),
    (False, False): ("q_proj.weight", "k_proj.weight", "v_proj.weight"),
}

# NxDT names a cut by the module it follows; "model.layers.018" would name no module.
_CUT = re.compile(r"model\.layers\.(0|[1-9][0-9]*)")


class LayoutError(ValueError):
    """A layout NxD cannot hold; the message names the setting and the fix."""


@dataclass(frozen=True)
class NxdtLayout:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tp: int
    pp: int = 1
    kv_multiplier: int = 1
    hw_backend: Literal["trn1", "trn2"] = "trn1"
    fuse_qkv: bool = False
    qkv_linear: bool = True
    pipeline_cuts: tuple[int, ...] = ()  # index of the last layer of each stage but the last

    def __post_init__(self) -> None:
        try:  # the spec asks the same rules, before anything is queued
            check_qkv_layout(self.qkv_linear, self.fuse_qkv, self.kv_multiplier)
            check_heads_over_tp(self.num_heads, self.tp)
            check_kv_heads_over_tp(self.num_kv_heads, self.tp, self.kv_multiplier)
            check_converted_kv_heads(self.num_kv_heads, self.tp, self.kv_multiplier)
        except ValueError as exc:
            raise LayoutError(str(exc)) from None
        if self.pipeline_cuts and len(self.pipeline_cuts) != self.pp - 1:
            raise LayoutError(f"{len(self.pipeline_cuts)} pipeline cuts for pp={self.pp}; give {self.pp - 1}")

    @classmethod
    def cut_indices(cls, cuts: list[str], num_layers: int) -> tuple[int, ...]:
        """``["model.layers.18", ...]`` as in the NxDT YAML, to layer indices. NxD puts a layer on
        the first stage whose cut is at or after it, so a cut out of order or repeated leaves a
        stage without layers, and one past the last layer names no module: both are refused."""
        indices: list[int] = []
        for cut in cuts:
            if not (match := _CUT.fullmatch(cut)):
                raise LayoutError(f"{cut!r} is not a layer name of the form model.layers.N")
            index = int(match[1])
            if indices and index <= indices[-1]:
                raise LayoutError(f"{cut} does not come after model.layers.{indices[-1]}: give each cut once, "
                                  "in increasing layer order")
            if index >= num_layers:
                raise LayoutError(f"{cut} is beyond the last layer, model.layers.{num_layers - 1}")
            indices.append(index)
        return tuple(indices)

    # ---------------------------------------------------------------- pipeline

    def stage_of_layer(self) -> list[int]:
        """The pp rank of every layer: the YAML's cuts, else NxD's automatic partition (L//P
        layers each, the remainder to the last stages)."""
        if self.pipeline_cuts:
            cuts = list(self.pipeline_cuts)
            return [next((s for s, cut in enumerate(cuts) if layer <= cut), len(cuts))
                    for layer in range(self.num_layers)]
        base, extra = divmod(self.num_layers, self.pp)
        sizes = [base + (1 if stage >= self.pp - extra else 0) for stage in range(self.pp)]
        return [stage for stage, size in enumerate(sizes) for _ in range(size)]

    def layers_of_stage(self, stage: int) -> list[int]:
        return [layer for layer, s in enumerate(self.stage_of_layer()) if s == stage]

    # ---------------------------------------------------------------- tensor parallel heads

    @property
    def qkv_names(self) -> tuple[str, ...]:
        """The names of a layer's Q/K/V tensors under ``self_attn``."""
        return QKV_NAMES[self.qkv_linear, self.fuse_qkv]

    @property
    def q_heads_per_rank(self) -> int:
        return self.num_heads // self.tp

    @property
    def kv_heads_per_rank(self) -> int:
        return self.num_kv_heads * self.kv_multiplier // self.tp

    def q_heads(self, rank: int) -> list[int]:
        """The HF Q heads rank ``rank`` holds, in its row order."""
        n = self.q_heads_per_rank
        if self.kv_multiplier == 1 or self.hw_backend == "trn2":
            return list(range(rank * n, (rank + 1) * n))
        # trn1: rank r holds K/V head r % kv; give it that group's (r // kv)-th slice of Q heads.
        group, slot = rank % self.num_kv_heads, rank // self.num_kv_heads
        per_group = self.num_heads // self.num_kv_heads
        first = group * per_group + slot * n
        return list(range(first, first + n))

    def kv_heads(self, rank: int) -> list[int]:
        """The HF K/V heads rank ``rank`` holds (after replication), in its row order."""
        if self.kv_multiplier == 1:
            m = self.kv_heads_per_rank
            return list(range(rank * m, (rank + 1) * m))
        return [self.replicated_kv_head(rank, interleaved=self.hw_backend == "trn2")]

    def replicated_kv_head(self, rank: int, interleaved: bool) -> int:
        """Under replication (one KV head a rank), the head rank ``rank`` holds when K/V are
        interleaved (``repeat_interleave``: trn2's model) or tiled (``repeat``: trn1's model, and
        NxD's converter on either backend)."""
        return rank // self.kv_multiplier if interleaved else rank % self.num_kv_heads
