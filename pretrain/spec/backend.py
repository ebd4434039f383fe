"""The backend section: which trainer runs, with each backend's settings, and its cross-checks by kind."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Literal

from pydantic import model_validator

from pretrain.spec.megatron_lm import MegatronLMSpec, check_megatron_lm
from pretrain.spec.native import NativeSpec, check_native
from pretrain.spec.nxdt import NeuronSpec, check_nxdt
from pretrain.spec.strict import Strict
from pretrain.spec.torchtitan import TORCHTITAN_FLAVOURS, TorchtitanSpec, check_torchtitan

if TYPE_CHECKING:
    from pretrain.spec.pretrain_spec import PretrainSpec


class BackendSpec(Strict):
    kind: Literal["native", "neuron", "megatron-lm", "torchtitan"] = "native"
    native: NativeSpec = NativeSpec()
    neuron: NeuronSpec | None = None
    megatron_lm: MegatronLMSpec | None = None
    torchtitan: TorchtitanSpec | None = None

    @property
    def cuda(self) -> bool:
        """Whether the training's ranks run on NVIDIA GPUs: its jobs ask Slurm for them, since on a
        cluster that schedules GPUs a job sees none it did not ask for."""
        return (self.kind == "megatron-lm" or (self.kind == "native" and self.native.device == "cuda")
                or (self.kind == "torchtitan" and self.torchtitan.device == "cuda"))

    @property
    def trainium(self) -> bool:
        """Whether the training's ranks run on Trainium NeuronCores (NxDT, or the native trainer or
        torchtitan on device neuron)."""
        return (self.kind == "neuron" or (self.kind == "native" and self.native.device == "neuron")
                or (self.kind == "torchtitan" and self.torchtitan.device == "neuron"))

    @model_validator(mode="after")
    def _settings_for_kind(self) -> BackendSpec:
        if self.kind == "neuron" and self.neuron is None:
            raise ValueError("backend.neuron is required for backend.kind=neuron "
                             "(at least backend.neuron.instance_type: trn1 or trn2)")
        if self.kind == "torchtitan" and self.torchtitan is None:
            raise ValueError("backend.torchtitan is required for backend.kind=torchtitan "
                             f"(at least backend.torchtitan.flavour: one of {', '.join(TORCHTITAN_FLAVOURS)})")
        return self


# Each backend's rules against the rest of the spec, in its own module beside its settings: the head rules of
# trainer/model_shape.py as its trainer or converter asks them, then what it would refuse or train differently.
CROSS_CHECKS: dict[str, Callable[[PretrainSpec], None]] = {
    "native": check_native, "neuron": check_nxdt, "megatron-lm": check_megatron_lm, "torchtitan": check_torchtitan}
