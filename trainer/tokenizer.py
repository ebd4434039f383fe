"""Tokenizers for the tokenize node program, with the token ids Megatron's
``preprocess_data.py`` produces for the same files and options.

- ``gpt2-bpe``: GPT-2 byte-level BPE from vocab.json + merges.txt (Megatron GPT2BPETokenizer);
  no BOS, EOD ``<|endoftext|>``.
- ``hf``: a Hugging Face tokenizer directory. Like Megatron's HuggingFaceTokenizer, the
  tokenizer's own special tokens are added (Llama 3 puts ``<|begin_of_text|>`` before every
  document) and EOD is the ``eos_token`` of tokenizer_config.json.
- ``sentencepiece``: a ``.model`` file (Megatron GPTSentencePieceTokenizer): no BOS, EOD eos.

Byte-level BPE vocabularies are encoded with gigatoken (Rust, all cores, no per-document
Python calls); the Hugging Face ``tokenizers`` engine is the fallback and the reference the
tests compare against.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded; the message names the file and the fix."""


def _hash_files(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclass
class Tokenizer:
    kind: str
    vocab_size: int
    eod: int
    fingerprint: str  # sha256 of the tokenizer files: part of every output key
    prefix: list[int] = field(default_factory=list)  # special tokens before each document (BOS)
    suffix: list[int] = field(default_factory=list)
    engine: str = "hf"
    _hf: Any = None
    _fast: Any = None
    _sp: Any = None

    def encode_texts(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of ``texts`` without specials: one flat uint32 array and the per-text counts."""
        if self._fast is not None:
            import awkward as ak

            encoded = self._fast.encode_batch(texts)
            return ak.to_numpy(ak.flatten(encoded)).astype(np.uint32, copy=False), ak.to_numpy(ak.num(encoded))
        if self._sp is not None:
            ids = self._sp.encode(texts)
        else:
            ids = [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]
        counts = np.fromiter((len(x) for x in ids), np.int64, len(ids))
        flat = np.fromiter((t for x in ids for t in x), np.uint32, int(counts.sum()))
        return flat, counts


def _gigatoken(hf_tokenizer: Any, engine: str) -> Any:
    if engine == "hf":
        return None
    try:
        import gigatoken

        return gigatoken.Tokenizer(hf_tokenizer)
    except Exception as exc:  # gigatoken supports byte-level and byte-fallback BPE only
        if engine == "gigatoken":
            raise TokenizerError(f"gigatoken cannot encode this tokenizer ({exc}); use --engine hf") from None
        return None


def _special_affixes(hf_tokenizer: Any) -> tuple[list[int], list[int]]:
    """The tokens the tokenizer's post-processor puts around a document (e.g. BOS)."""
    with_specials = hf_tokenizer.encode("a", add_special_tokens=True).ids
    plain = hf_tokenizer.encode("a", add_special_tokens=False).ids
    for i in range(len(with_specials) - len(plain) + 1):
        if with_specials[i:i + len(plain)] == plain:
            return with_specials[:i], with_specials[i + len(plain):]
    raise TokenizerError("cannot tell which special tokens the tokenizer adds around a document")


def load_tokenizer(kind: Literal["gpt2-bpe", "hf", "sentencepiece"], *, vocab_file: str | None = None,
                   merges_file: str | None = None, model: str | None = None,
                   engine: Literal["auto", "gigatoken", "hf"] = "auto") -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    def must_exist(path: str | None, what: str) -> Path:
        if not path:
            raise TokenizerError(f"--{what} is required for --tokenizer-type {kind}")
        p = Path(path).expanduser()
        if not p.exists():
            raise TokenizerError(f"{p}: no such file ({what}); check the path")
        return p

    if kind == "gpt2-bpe":
        vocab_path, merges_path = must_exist(vocab_file, "vocab-file"), must_exist(merges_file, "merge-file")
        try:
            vocab = json.loads(vocab_path.read_text())
            bpe = models.BPE.from_file(str(vocab_path), str(merges_path))
        except Exception as exc:
            raise TokenizerError(f"{vocab_path} / {merges_path}: not a GPT-2 vocab.json and merges.txt ({exc})") from None
        if "<|endoftext|>" not in vocab:
            raise TokenizerError(f"{vocab_path}: has no <|endoftext|> token for the end of documents")
        hf = HFTokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.decoder = decoders.ByteLevel()
        return Tokenizer(kind, len(vocab), vocab["<|endoftext|>"], _hash_files([vocab_path, merges_path]),
                         engine="gigatoken" if (fast := _gigatoken(hf, engine)) else "hf", _hf=hf, _fast=fast)

    if kind == "hf":
        directory = must_exist(model, "tokenizer-model")
        tokenizer_json = directory / "tokenizer.json" if directory.is_dir() else directory
        config_path = tokenizer_json.with_name("tokenizer_config.json")
        try:
            hf = HFTokenizer.from_file(str(tokenizer_json))
        except Exception as exc:
            raise TokenizerError(f"{tokenizer_json}: not a Hugging Face tokenizer.json ({exc})") from None
        try:
            eos = json.loads(config_path.read_text()).get("eos_token")
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"{config_path}: needed for the end-of-document token ({exc})") from None
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if eos is None or hf.token_to_id(eos) is None:
            raise TokenizerError(f"{config_path}: eos_token {eos!r} is not in the vocabulary")
        prefix, suffix = _special_affixes(hf)
        files = [tokenizer_json, config_path]
        return Tokenizer(kind, hf.get_vocab_size(with_added_tokens=True), hf.token_to_id(eos),
                         _hash_files(files), prefix, suffix,
                         engine="gigatoken" if (fast := _gigatoken(hf, engine)) else "hf", _hf=hf, _fast=fast)

    if kind == "sentencepiece":
        import sentencepiece

        path = must_exist(model, "tokenizer-model")
        try:
            sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except Exception as exc:
            raise TokenizerError(f"{path}: not a SentencePiece model ({exc})") from None
        return Tokenizer(kind, sp.vocab_size(), sp.eos_id(), _hash_files([path]), engine="sentencepiece", _sp=sp)

    raise TokenizerError(f"unknown tokenizer type {kind!r}; choose gpt2-bpe, hf or sentencepiece")
