"""torchtitan config functions for what torchtitan 0.3.0's Llama 3 registry has a model for but
publishes no function for: its 1B and 3B flavours (Llama 3.2's shapes), and float8 for 1B to 70B.

    torchrun ... -m torchtitan.train --module trainer.torchtitan_configs --config llama3_1b ...

torchtitan picks the model, and any model converter, only in the function ``--config`` names
(``ConfigManager._load_config`` in torchtitan/config/manager.py); no ``--section.key`` override
reaches them. Each function here is torchtitan's published function for the nearest model
(``llama3_8b``, ``llama3_70b``) with the flavour's model built by torchtitan's own
``model_registry``; the spec's overrides then apply as they do to a published function. It runs
where torchtitan runs, on the nodes, and imports nothing else of this project.
"""

from __future__ import annotations

from torchtitan.components.quantization import Float8LinearConverter
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import config_registry as published
from torchtitan.models.llama3 import model_registry
from torchtitan.trainer import Trainer


def float8_linears() -> Float8LinearConverter.Config:
    """torchao's rowwise float8 recipe for the decoder's Linear layers. The output projection stays
    in bf16, as torchtitan's own float8 function for 405B leaves it (``filter_fqns=["lm_head"]``):
    the 1B and 3B flavours tie it to the embedding. Not ``auto_filter_small_kn``: torchao's
    filter behind it (``_auto_filter_for_rowwise``) passes only ``nn.Linear`` modules, and
    torchtitan 0.3.0 hands its filter ``Linear.Config`` objects, so it would convert nothing."""
    return Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"])


def with_flavour(config: Trainer.Config, flavour: str, float8: bool = False) -> Trainer.Config:
    """``config`` training the registry's ``flavour``; its loss sized to that flavour's vocabulary."""
    config.model_spec = model_registry(flavour, converters=[float8_linears()] if float8 else None)
    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)
    return config


def llama3_1b() -> Trainer.Config:
    return with_flavour(published.llama3_8b(), "1B")


def llama3_3b() -> Trainer.Config:
    return with_flavour(published.llama3_8b(), "3B")


def llama3_1b_float8() -> Trainer.Config:
    return with_flavour(published.llama3_8b(), "1B", float8=True)


def llama3_3b_float8() -> Trainer.Config:
    return with_flavour(published.llama3_8b(), "3B", float8=True)


def llama3_8b_float8() -> Trainer.Config:
    return with_flavour(published.llama3_8b(), "8B", float8=True)


def llama3_70b_float8() -> Trainer.Config:
    return with_flavour(published.llama3_70b(), "70B", float8=True)
