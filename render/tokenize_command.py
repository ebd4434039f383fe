"""The ``trainer tokenize`` command lines of the tokenize stage: one per shard of a Slurm array,
then the merge; for NxDT's Llama configs, one job writing the Arrow blocks (their grouping is not
shardable)."""

from __future__ import annotations

from pretrain.spec import PretrainSpec
from render.dataset_files import arrow_output


def tokenize_command(spec: PretrainSpec, inputs: list[str], output_prefix: str, tokenizer: dict[str, str], *,
                     shard: str | None = None, record: str | None = None, python: str = "python") -> list[str]:
    """``tokenizer``: the file of each tokenizer flag (``render.dataset_files.tokenizer_paths``);
    ``shard``: ``i/N``, this job's byte range of the input."""
    t = spec.tokenizer
    argv = [python, "-m", "trainer", "tokenize", "--input", *inputs, "--output-prefix", output_prefix,
            "--tokenizer-type", t.type, "--json-keys", *spec.data.json_keys,
            *(x for pair in tokenizer.items() for x in pair)]
    if t.append_eod:
        argv.append("--append-eod")
    if arrow_output(spec):
        argv += ["--format", "nxd-arrow", "--seq-length", str(spec.model.seq_length)]
    if shard is not None:
        argv += ["--shard", shard]
    if record is not None:
        argv += ["--record", record]
    return argv


def merge_command(spec: PretrainSpec, output_prefix: str, parts: list[str], python: str = "python") -> list[str]:
    """Joins the shards' outputs, in order, into the bytes one unsharded job would write."""
    return [python, "-m", "trainer", "tokenize", "merge", "--output-prefix", output_prefix, *parts,
            "--json-keys", *spec.data.json_keys]
