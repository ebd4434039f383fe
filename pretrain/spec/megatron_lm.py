"""backend.megatron_lm: Megatron-LM's settings and the training image the image stage builds for it, and
what its launch would train differently from the rest of the spec."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pretrain.hub_refs import is_hub_uri
from pretrain.spec.strict import Strict
from pretrain.spec.training import Restarts
from trainer.model_shape import check_heads_over_tp, check_kv_heads_over_tp

if TYPE_CHECKING:
    from pretrain.spec.pretrain_spec import PretrainSpec


# A commit names the same tree for ever; a tag or branch can move under an unchanged spec, and
# the image stage's key (the rendered Containerfile) would not see it.
_COMMIT_HEX = 40


class ImageSpec(Strict):
    """The training image the image stage builds on a node (podman or docker) and imports to a
    squashfs for pyxis/enroot (render/image.py renders its Containerfile)."""

    base: str = Field(description="FROM: the base image, e.g. the runbooks' NGC PyTorch "
                      "nvcr.io/nvidia/pytorch:24.09-py3, or scratch.")
    megatron_lm_repository: str = Field("https://github.com/NVIDIA/Megatron-LM.git",
                                        description="Git URL Megatron-LM is cloned from.")
    megatron_lm_commit: str | None = Field(None, description="The 40-hex commit of Megatron-LM checked out at "
                                           "/workspace/Megatron-LM (core_v0.16.1 is "
                                           "55ac7082517c3878ae653c07c09c534b8aed49f6); None clones nothing "
                                           "(a base that has it already).")
    efa_installer: str | None = Field(None, description="Version of the AWS EFA installer put into the image "
                                      "(user space only: libfabric with the EFA provider, Open MPI), e.g. 1.42.0; "
                                      "None installs nothing (no EFA, or a base that has it).")
    aws_ofi_nccl: str | None = Field(None, description="Version of aws-ofi-nccl, NCCL's plugin for libfabric, built "
                                     "into the image against the EFA installer's libfabric, e.g. 1.16.0.")
    install_project: bool = Field(True, description="Install this project (its source at the running version) "
                                  "and submitit into the image: the job layer runs its Python inside the container.")
    pip: list[str] = Field(default_factory=list, description="Extra pip packages, each pinned (name==version).")
    env: dict[str, str] = Field(default_factory=dict, description="ENV of the image, e.g. NCCL/EFA settings.")
    copy_files: dict[str, str] = Field(default_factory=dict, description="Files or directories put into the image, "
                                       "'/absolute/destination': 'path on the machine the flow runs on'.")
    engine_flags: list[str] = Field(default_factory=list, description="Global flags of podman (or docker) on the "
                                    "build node, e.g. --root on its local NVMe; render/image.py "
                                    "SANDBOX_PODMAN_FLAGS lists those a machine without systemd needs.")

    @field_validator("megatron_lm_commit")
    @classmethod
    def _commit(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != _COMMIT_HEX or any(c not in "0123456789abcdef" for c in value)):
            raise ValueError(f"backend.megatron_lm.image.megatron_lm_commit={value!r}: give the full 40-hex commit "
                             "(git rev-parse core_v0.16.1^{commit}); a tag or branch can move under an unchanged key")
        return value

    @field_validator("pip")
    @classmethod
    def _pinned(cls, value: list[str]) -> list[str]:
        if loose := [req for req in value if "==" not in req and "@" not in req]:
            raise ValueError(f"backend.megatron_lm.image.pip={loose}: pin each package (name==version, or "
                             "name @ URL): an unpinned one changes the image under an unchanged key")
        return value

    @field_validator("copy_files")
    @classmethod
    def _absolute(cls, value: dict[str, str]) -> dict[str, str]:
        if relative := [dst for dst in value if not dst.startswith("/")]:
            raise ValueError(f"backend.megatron_lm.image.copy_files: destinations {relative} must be absolute "
                             "paths in the image, e.g. /opt/site/nccl.conf")
        return value

    @field_validator("efa_installer", "aws_ofi_nccl")
    @classmethod
    def _release(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not re.fullmatch(r"\d+(\.\d+)+", value):
            raise ValueError(f"backend.megatron_lm.image.{info.field_name}={value!r}: give a release number such "
                             "as 1.16.0 (the download's name is built from it)")
        return value

    @model_validator(mode="after")
    def _plugin_needs_libfabric(self) -> ImageSpec:
        if self.aws_ofi_nccl and not self.efa_installer:
            raise ValueError("backend.megatron_lm.image.aws_ofi_nccl is built against the EFA installer's "
                             "libfabric: set backend.megatron_lm.image.efa_installer too")
        return self


class MegatronLMSpec(Restarts):
    hang_timeout_min: float = Field(30.0, gt=0, description="Cancel and resubmit a run whose iteration lines "
                                    "have not advanced for this long (the first run builds the dataset's index first).")
    container_image: str | None = Field(None, description="pyxis/enroot image with Megatron-LM at "
                                        "/workspace/Megatron-LM, at the release `version` names; exclusive with image.")
    image: ImageSpec | None = Field(None, description="Build the training image (the image stage) and train in its "
                                    ".sqsh instead of naming container_image.")
    # The release the launch has run with (benchmarks/megatron_lm_gpu.py): NVIDIA/Megatron-LM tag
    # core_v0.16.1 (commit 55ac7082517c3878ae653c07c09c534b8aed49f6), the megatron-core that
    # pyproject pins. docs/render.md lists the releases whose parser the arguments were checked with.
    version: str = Field("0.16.1", description="Megatron-LM release in the image (MAJOR.MINOR.PATCH, as "
                         "megatron/core/package_info.py gives it); the arguments are rendered for it.")
    container_mounts: list[str] = Field(default_factory=list, description="'SRC:DST' mounts.")
    lr_decay_samples: int | None = Field(None, gt=0, description="--lr-decay-samples for sample-based "
                                         "training; default training.train_samples.")
    lr_warmup_samples: int | None = Field(None, ge=0, description="--lr-warmup-samples for sample-based "
                                          "training; default training.warmup_steps x global batch.")
    init_method_std: float = Field(0.02, gt=0, description="--init-method-std (Megatron's default 0.02).")
    recompute_activations: bool = Field(False, description="--recompute-activations: selective recomputation "
                                        "of the attention core.")
    extra_args: list[str] = Field(default_factory=list, description="pretrain_gpt.py arguments the spec has no "
                                  "field for, appended verbatim (e.g. --transformer-impl local where the image "
                                  "has no Transformer Engine).")

    @model_validator(mode="after")
    def _one_image(self) -> MegatronLMSpec:
        if self.image is not None and self.container_image:
            raise ValueError(f"backend.megatron_lm.container_image={self.container_image!r} and "
                             "backend.megatron_lm.image are both set: keep image (the image stage builds it) or "
                             "container_image (an image built elsewhere), not both")
        return self

    @field_validator("version")
    @classmethod
    def _release(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) != 3 or not all(part.isdigit() for part in parts):
            raise ValueError(f"backend.megatron_lm.version={value!r}: give the release as MAJOR.MINOR.PATCH, "
                             "e.g. 0.16.1 for tag core_v0.16.1")
        return value


def check_megatron_lm(spec: PretrainSpec) -> None:
    """What the Megatron-LM launch (render/megatron_lm.py) would otherwise train differently
    from what the spec says, silently."""
    m, p = spec.model, spec.parallel
    # the head rules of trainer/model_shape.py, as Megatron-LM splits the heads over tp
    check_heads_over_tp(m.num_attention_heads, p.tp)
    check_kv_heads_over_tp(m.kv_heads, p.tp)
    if m.family != "gpt":
        raise ValueError(f"model.family={m.family}: backend.kind=megatron-lm renders the GPT-3 runbooks' "
                         "pretrain_gpt.py arguments (learned positions, LayerNorm, GeLU), which would train a "
                         "GPT under that name; train a Llama with backend.kind=torchtitan or native")
    t, mlm = spec.training, spec.backend.megatron_lm or MegatronLMSpec()
    if t.train_steps and (mlm.lr_warmup_samples is not None or mlm.lr_decay_samples is not None):
        raise ValueError("backend.megatron_lm.lr_warmup_samples / lr_decay_samples apply to training.train_samples; "
                         "with training.train_steps the schedule is training.warmup_steps and train_steps: set "
                         "them to null")
    if mlm.lr_warmup_samples is not None and t.warmup_steps:
        raise ValueError(f"training.warmup_steps={t.warmup_steps} and backend.megatron_lm.lr_warmup_samples="
                         f"{mlm.lr_warmup_samples} are both set, and Megatron-LM reads the samples: keep one "
                         "(set the other to 0 or null)")
    if is_hub_uri(m.init_from):
        raise ValueError(f"model.init_from={m.init_from!r}: Megatron-LM loads its own checkpoints "
                         "(latest_checkpointed_iteration.txt and iter_*/), not a Hugging Face one; convert it "
                         "with Megatron-LM's tools/checkpoint/convert.py and give the converted directory")
