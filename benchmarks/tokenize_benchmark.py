"""Tokenize benchmark: `python -m trainer tokenize` against a preprocess_data.py-style baseline
on the same >= 100 MB English corpus and GPT-2-sized byte-level BPE, in one run.

    .venv/bin/python benchmarks/tokenize_benchmark.py [--workdir DIR] [--mb 110] [--workers 2]

The corpus is built from text already on the machine (docstrings of the installed Python and
its packages, and /usr/share/doc), packed into documents of at least 4,000 characters; the
tokenizer is a 50,257-entry byte-level BPE trained on a slice of it (GPT-2's size, so uint16
output). Both commands are timed whole (imports included); their outputs must be
byte-identical. Prints MB/s of each, the ratio, and the peak RSS of ours.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

from timing import run_timed

HERE = Path(__file__).resolve().parent
DOC_CHARS = 4000


def _doc_texts():
    """Text files of /usr/share/doc, in sorted order."""
    for path in sorted(Path("/usr/share/doc").rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        if "\x00" not in text:
            yield text


def build_corpus(path: Path, target_bytes: int) -> None:
    from pretrain.corpus import documents

    def units():
        for doc in documents(include_site_packages=True):
            yield doc["text"]
        yield from _doc_texts()

    written, buffer = 0, []
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for unit in units():
            buffer.append(unit)
            if sum(map(len, buffer)) >= DOC_CHARS:
                line = json.dumps({"text": "\n\n".join(buffer)}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(line.encode())
                buffer = []
                if written >= target_bytes:
                    break
    if written < target_bytes:
        raise SystemExit(f"only {written / 1e6:.0f} MB of text on this machine; ask for less with --mb")
    tmp.replace(path)


def train_tokenizer(corpus: Path, directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        with open(corpus) as f:
            for i, line in enumerate(f):
                if i >= 3000:
                    return
                yield json.loads(line)["text"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts(), trainers.BpeTrainer(
        vocab_size=50257, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    directory.mkdir(parents=True, exist_ok=True)
    tok.model.save(str(directory))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/pretrain-tokenize-bench")
    parser.add_argument("--mb", type=int, default=110)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"corpus-{args.mb}mb.jsonl"
    if not corpus.exists():
        print(f"building a {args.mb} MB corpus from text on this machine ...", flush=True)
        build_corpus(corpus, args.mb * 1_000_000)
    tok = work / "bpe-50257"
    if not (tok / "merges.txt").exists():
        print("training a 50,257-entry byte-level BPE on the corpus ...", flush=True)
        train_tokenizer(corpus, tok)
    size_mb = corpus.stat().st_size / 1e6
    vocab, merges = str(tok / "vocab.json"), str(tok / "merges.txt")

    ours_wall, ours_rss = run_timed([sys.executable, "-m", "trainer", "tokenize", "--input", str(corpus),
                               "--output-prefix", str(work / "ours"), "--tokenizer-type", "gpt2-bpe",
                               "--vocab-file", vocab, "--merge-file", merges, "--append-eod",
                               "--workers", str(args.workers)])
    base_wall, base_rss = run_timed([sys.executable, str(HERE / "megatron_style_preprocess.py"), str(corpus),
                               str(work / "baseline"), vocab, merges, str(args.workers)])
    identical = all(sha256(work / f"ours_text_document{s}") == sha256(work / f"baseline_text_document{s}")
                    for s in (".bin", ".idx"))
    print(f"corpus: {size_mb:.1f} MB, {sum(1 for _ in open(corpus))} documents; workers: {args.workers}")
    print(f"baseline (preprocess_data.py style): {base_wall:7.1f} s  {size_mb / base_wall:6.2f} MB/s  peak RSS {base_rss:6.0f} MB")
    print(f"trainer tokenize:                    {ours_wall:7.1f} s  {size_mb / ours_wall:6.2f} MB/s  peak RSS {ours_rss:6.0f} MB")
    print(f"speed-up: {base_wall / ours_wall:.1f}x   outputs byte-identical: {identical}")
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
