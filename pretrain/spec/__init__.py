"""PretrainSpec: the one description of a pretraining run that every stage is rendered from.

Conversion flags, NxDT YAML, Megatron-LM arguments and sbatch scripts all come from this one
object, so they cannot disagree. Validation rejects the runbooks' known traps before anything is
queued, each with a message that names the field and the fix.

The sections every run has are in their own modules (data, model, training, cluster), each
backend's settings and its checks against the rest of the spec in its module (native, nxdt,
megatron_lm, torchtitan), and PretrainSpec with the checks that span sections in pretrain_spec.
"""

from pretrain.spec.data import DataSource, DataSpec
from pretrain.spec.megatron_lm import ImageSpec, MegatronLMSpec
from pretrain.spec.model import RopeScaling
from pretrain.spec.pretrain_spec import PretrainSpec
from pretrain.spec.torchtitan import (TORCHTITAN_FLAVOURS, TORCHTITAN_PUBLISHED, TORCHTITAN_ROPE_THETA, TorchtitanSpec,
                                      flavour_overrides)

__all__ = ["TORCHTITAN_FLAVOURS", "TORCHTITAN_PUBLISHED", "TORCHTITAN_ROPE_THETA", "DataSource", "DataSpec",
           "ImageSpec", "MegatronLMSpec", "PretrainSpec", "RopeScaling", "TorchtitanSpec", "flavour_overrides"]
