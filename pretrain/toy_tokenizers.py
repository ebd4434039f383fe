"""Small real tokenizers trained on the machine's own text: the demo's tokenizer and the
tests', so nothing is ever downloaded."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


def _byte_level_bpe(texts: list[str], vocab_size: int, specials: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def gpt2_style(directory: Path, texts: list[str]) -> tuple[Path, Path]:
    """vocab.json + merges.txt, as GPT-2 ships them."""
    directory.mkdir(parents=True, exist_ok=True)
    _byte_level_bpe(texts, 4096, ["<|endoftext|>"]).model.save(str(directory))
    return directory / "vocab.json", directory / "merges.txt"


def llama3_style(directory: Path, texts: list[str], vocab_size: int = 4096) -> Path:
    """A tokenizer directory shaped like Llama 3's: BOS added by the post-processor, EOS in
    tokenizer_config.json. ``vocab_size``: at most the model's (torchtitan's debugmodel has 2048)."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = _byte_level_bpe(texts, vocab_size, ["<|begin_of_text|>", "<|end_of_text|>"])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
         "tokenizer_class": "PreTrainedTokenizerFast"}))
    return directory


def sentencepiece_model(directory: Path, texts: list[str]) -> Path:
    import sentencepiece

    directory.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(t for text in texts for t in text.splitlines() if t.strip()),
        model_prefix=str(directory / "sp"), vocab_size=2000, model_type="bpe", byte_fallback=True,
        minloglevel=2)
    return directory / "sp.model"
