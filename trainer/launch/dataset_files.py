"""Files a training launch reads beside its dataset.

A GPT-2 BPE tokenizer's vocab and merges are named in the spec by URI or path on the control
plane's machine; NxDT's and Megatron-LM's data loaders open them on every node. The tokenize
stage keeps a copy of them with the tokens they produced, and the runbooks download them beside
a pre-tokenized dataset, so the launch names the copies beside the dataset.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from pretrain.spec import PretrainSpec


def gpt2_bpe_files(spec: PretrainSpec, data_prefix: str) -> tuple[str, str]:
    """(vocab, merges) beside the dataset ``data_prefix`` (``<dir>/<name>_text_document``)."""
    tok = spec.tokenizer
    if not (tok.vocab_file and tok.merges_file):
        raise ValueError("tokenizer.vocab_file and tokenizer.merges_file are required for a GPT-2 BPE tokenizer")
    directory = PurePosixPath(data_prefix).parent
    return str(directory / PurePosixPath(tok.vocab_file).name), str(directory / PurePosixPath(tok.merges_file).name)


def blend(spec: PretrainSpec, dataset: str) -> list[tuple[float, str]]:
    """(weight, prefix) of every dataset training samples from: the spec's own, then
    ``data.blend``'s, as Megatron's ``--data-path W1 P1 W2 P2 ...`` lists them."""
    return [(spec.data.weight, dataset), *((b.weight, b.prefix) for b in spec.data.blend)]
