"""PretrainSpec, the sections together, and the checks that span them: layout, shrinking, time limit."""

from __future__ import annotations

from pydantic import Field, model_validator

from pretrain.spec.backend import CROSS_CHECKS, BackendSpec
from pretrain.spec.cluster import ClusterSpec, PathsSpec
from pretrain.spec.data import DataSpec, HubSpec, TokenizerSpec
from pretrain.spec.megatron_lm import MegatronLMSpec
from pretrain.spec.model import ModelSpec, ParallelSpec
from pretrain.spec.strict import Strict
from pretrain.spec.training import Restarts, TrainingSpec
from trainer.nxdt_layout import LayoutError, NxdtLayout
from trainer.run_layout import data_parallel_size, grad_accumulation


class PretrainSpec(Strict):
    name: str = Field(description="Run name; artifact keys and output names derive from it.")
    description: str = ""
    data: DataSpec
    tokenizer: TokenizerSpec
    model: ModelSpec
    parallel: ParallelSpec = ParallelSpec()
    training: TrainingSpec
    cluster: ClusterSpec
    backend: BackendSpec = BackendSpec()
    hub: HubSpec = HubSpec()
    paths: PathsSpec = Field(default_factory=PathsSpec)

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.devices_per_node

    @property
    def dp(self) -> int:
        """Data-parallel ranks, by the trainer's own arithmetic (trainer/run_layout.py)."""
        return self.dp_on(self.cluster.nodes, "cluster.nodes")

    def dp_on(self, nodes: int, counted: str) -> int:
        """Data-parallel ranks on ``nodes`` nodes; ``counted``: where that count comes from, for the message."""
        c, p = self.cluster, self.parallel
        return data_parallel_size(nodes * c.devices_per_node, p.tp, p.pp, p.cp,
                                  world=f"{counted} x cluster.devices_per_node = {nodes} x {c.devices_per_node} = ")

    @property
    def grad_accumulation(self) -> int:
        return self.grad_accumulation_on(self.cluster.nodes, "cluster.nodes")

    def grad_accumulation_on(self, nodes: int, counted: str) -> int:
        """Micro-batches per step on ``nodes`` nodes (``counted``: as for :meth:`dp_on`)."""
        t = self.training
        return grad_accumulation(t.global_batch_size, t.micro_batch_size, self.dp_on(nodes, counted),
                                 section="training.")

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.model.seq_length

    @model_validator(mode="after")
    def _runbook_traps(self) -> PretrainSpec:
        p, m, t, kind = self.parallel, self.model, self.training, self.backend.kind
        if kind != "neuron" and p.kv_replicator != 1:
            raise ValueError(f"parallel.kv_replicator is an NxD setting; set it to 1 for backend.kind={kind}")
        CROSS_CHECKS[kind](self)
        # dp = world / (tp x pp x cp) and global batch = micro batch x dp x accumulation, each
        # asked of the rule the trainer runs by; either raises naming its fields
        self.grad_accumulation  # noqa: B018
        self._check_shrinking()
        self._check_time_limit()
        # NxD's automatic partition puts the remainder on the last stages, as the converter does
        # (``create_partitions`` in aws-neuron/neuronx-distributed
        # src/neuronx_distributed/pipeline/partition.py). Megatron-LM needs equal stages and reads
        # no pipeline_cuts.
        # torchtitan cuts its own stages (_check_pipeline_schedule in pretrain/spec/torchtitan.py).
        if self.backend.kind in ("native", "megatron-lm") and m.num_layers % p.pp:
            raise ValueError(f"model.num_layers={m.num_layers} is not divisible by parallel.pp={p.pp}: "
                             "change pp (uneven stages are for backend.kind=neuron and torchtitan)")
        if p.pipeline_cuts and (self.backend.kind == "megatron-lm" or m.family == "gpt"):
            raise ValueError(f"parallel.pipeline_cuts={p.pipeline_cuts}: only NxDT's Llama model places its stages "
                             "by cuts; Megatron-LM and NxDT's GPT split the layers evenly over parallel.pp: set "
                             "parallel.pipeline_cuts=[]")
        if p.pipeline_cuts and len(p.pipeline_cuts) != p.pp - 1:
            raise ValueError(f"parallel.pipeline_cuts has {len(p.pipeline_cuts)} cuts; parallel.pp="
                             f"{p.pp} needs {p.pp - 1}")
        try:
            NxdtLayout.cut_indices(p.pipeline_cuts, m.num_layers)
        except LayoutError as exc:
            raise ValueError(f"parallel.pipeline_cuts: {exc}") from None
        if p.cp > 1 and m.seq_length % (2 * p.cp):
            raise ValueError(f"model.seq_length={m.seq_length} must be divisible by 2 x parallel.cp="
                             f"{2 * p.cp} (ring attention splits each sequence into 2 x cp chunks)")
        _, valid, _ = self.data.split_weights
        if t.eval_batches > 0 and valid == 0:
            raise ValueError(f"training.eval_iters={t.eval_iters} with data.split={self.data.split!r} "
                             "has no validation data (Megatron fails with an AssertionError, torchtitan has no "
                             "held-out files to read): set "
                             "training.eval_iters=0 or give the split a validation weight")
        return self

    @property
    def restarts(self) -> Restarts:
        """The chain-of-jobs settings of the spec's backend."""
        return getattr(self.backend, self.backend.kind.replace("-", "_")) or MegatronLMSpec()

    def _check_time_limit(self) -> None:
        """Each job of the chain must get past one checkpoint, or no job ever advances the run: its
        start-up, one checkpoint interval of steps where the step time is known, and the save
        before the limit must fit in the time limit."""
        c, t, lead = self.cluster, self.training, self.restarts.save_before_limit_s
        parts = [(f"cluster.startup_min={c.startup_min:g}", c.startup_min * 60),
                 (f"backend.{self.backend.kind.replace('-', '_')}.save_before_limit_s={lead}", lead)]
        if t.step_time_s and t.checkpoint_interval != "auto":
            parts.append((f"training.checkpoint_interval={t.checkpoint_interval} x training.step_time_s="
                          f"{t.step_time_s:g}", t.checkpoint_interval * t.step_time_s))
        needed = sum(seconds for _, seconds in parts)
        if c.time_limit_min * 60 < needed:
            raise ValueError(f"cluster.time_limit_min={c.time_limit_min} is shorter than one job needs to advance the "
                             f"run: {' + '.join(name for name, _ in parts)} = {needed / 60:.1f} min; raise the time "
                             "limit, or lower the checkpoint interval")

    def _check_shrinking(self) -> None:
        """A run that may go on with fewer nodes (cluster.min_nodes) must lay out, by the trainer's
        rules, on every count down to it, and its backend must resume on fewer ranks."""
        c = self.cluster
        if c.fewest_nodes == c.nodes:
            return
        if self.backend.kind != "native":
            raise ValueError(f"cluster.min_nodes={c.min_nodes} is below cluster.nodes={c.nodes}: only "
                             "backend.kind=native resumes a run on fewer nodes (its checkpoints reshard to any "
                             f"data-parallel size); unset cluster.min_nodes for backend.kind={self.backend.kind}")
        for nodes in range(c.fewest_nodes, c.nodes):
            allowed = f"{nodes} node(s), which cluster.min_nodes={c.min_nodes} allows"
            try:
                self.grad_accumulation_on(nodes, "nodes")
            except ValueError as exc:
                raise ValueError(f"on {allowed}: {exc}; or raise cluster.min_nodes") from None
