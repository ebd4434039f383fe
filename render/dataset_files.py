"""Files a launch reads: the tokenizer's, and those beside the dataset.

A GPT-2 BPE tokenizer's vocab and merges are named in the spec by URI or path on the control
plane's machine; NxDT's and Megatron-LM's data loaders open them on every node. The tokenize
stage keeps a copy of them with the tokens they produced, and the runbooks download them beside
a pre-tokenized dataset, so the launch names the copies beside the dataset.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pretrain.spec import PretrainSpec


class MissingTokenizerFile(FileNotFoundError):
    retryable = False  # the spec names a file that is not there; trying again finds the same


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


def arrow_output(spec: PretrainSpec) -> bool:
    """NxDT's Llama configs (``model_source: hf``) read HF Arrow blocks of the sequence length."""
    return spec.backend.kind == "neuron" and spec.model.family == "llama"


def local_path(value: str, data_dir: Path) -> Path:
    """Where a tokenizer file named in the spec is read: a URI among the fetched files, by its name."""
    return data_dir / Path(value).name if "://" in value else Path(value).expanduser()


def tokenizer_paths(spec: PretrainSpec, data_dir: Path) -> dict[str, Path]:
    """The tokenizer's files by the ``trainer tokenize`` flag that names each; a URI is looked up
    by name among the fetched files in ``data_dir``."""
    t = spec.tokenizer
    named = ({"--vocab-file": t.vocab_file, "--merge-file": t.merges_file} if t.type == "gpt2-bpe"
             else {"--tokenizer-model": t.path})
    return {flag: local_path(value, data_dir) for flag, value in named.items()}


def tokenizer_files(spec: PretrainSpec, data_dir: Path) -> dict[str, Path]:
    """:func:`tokenizer_paths`, each checked to exist."""
    files = tokenizer_paths(spec, data_dir)
    for flag, local in files.items():
        if not local.exists():
            value = {"--vocab-file": spec.tokenizer.vocab_file, "--merge-file": spec.tokenizer.merges_file}.get(
                flag, spec.tokenizer.path)
            raise MissingTokenizerFile(f"tokenizer file {value} not found (looked at {local}); fix tokenizer in "
                                       "the spec, or add the URI to data.sources so fetch brings it")
    return files


def eod_id(spec: PretrainSpec, data_dir: str) -> int:
    """The tokenizer's end-of-document id, which the trainer's dataset needs."""
    from trainer.tokenizer import load_tokenizer

    files = tokenizer_files(spec, Path(data_dir))
    return load_tokenizer(spec.tokenizer.type, vocab_file=str(files.get("--vocab-file", "")) or None,
                          merges_file=str(files.get("--merge-file", "")) or None,
                          model=str(files.get("--tokenizer-model", "")) or None).eod
