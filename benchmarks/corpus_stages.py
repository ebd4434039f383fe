"""The fetch and tokenize stages' outputs, made on this machine for the GPU benchmarks: nothing
is downloaded. The corpus is this machine's docstrings (``pretrain.corpus``), the tokenizers toy
BPEs trained on it (``pretrain.toy_tokenizers``), and the tokenize stage's own command writes the
Megatron ``.bin/.idx`` pair."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pretrain import manifest  # noqa: E402
from pretrain.corpus import corpus_texts, write_jsonl  # noqa: E402
from pretrain.spec import PretrainSpec  # noqa: E402
from pretrain.toy_tokenizers import gpt2_style, llama3_style  # noqa: E402
from render.dataset_files import tokenizer_paths  # noqa: E402
from render.tokenize_command import tokenize_command  # noqa: E402
from trainer.tokenize import output_prefix  # noqa: E402

CORPUS_BYTES = 8_000_000
CORPUS = "corpus.jsonl"  # the fetched file


def fetched_corpus(work: Path) -> Path:
    """The fetch stage's output: the corpus as JSONL (:data:`CORPUS`) beside its MANIFEST.json."""
    fetched = work / "fetched"
    fetched.mkdir(parents=True)
    documents = write_jsonl(fetched / CORPUS, CORPUS_BYTES, include_site_packages=True)
    manifest.write_manifest(fetched, "fetch", {"corpus": CORPUS_BYTES})
    print(f"corpus: {documents} documents", flush=True)
    return fetched


def llama3_tokenizer(work: Path, vocab_size: int) -> Path:
    """A Llama-3-style BPE trained on the corpus, of at most 4,096 entries (a model's vocabulary
    may be larger): its directory."""
    return llama3_style(work / "tokenizer", corpus_texts(CORPUS_BYTES), vocab_size=min(vocab_size, 4096))


def gpt2_tokenizer(work: Path) -> tuple[Path, Path]:
    """A GPT-2-style BPE trained on the corpus: its vocab and merges files."""
    return gpt2_style(work / "gpt2-tokenizer", corpus_texts(CORPUS_BYTES))


def tokenized(spec: PretrainSpec, corpus: Path, data: Path) -> str:
    """The tokenize stage's command on ``corpus`` with ``spec``'s tokenizer, into ``data``: the
    prefix of the ``.bin/.idx`` pair."""
    data.mkdir(parents=True)
    prefix = str(data / "corpus")
    files = {flag: str(path) for flag, path in tokenizer_paths(spec, data).items()}
    subprocess.run(tokenize_command(spec, [str(corpus)], prefix, files, python=sys.executable), cwd=ROOT, check=True)
    return output_prefix(prefix, "text")
