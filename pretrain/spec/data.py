"""Where a run's text and tokenizer come from: the data, tokenizer and hub sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pretrain.hub_refs import checked, is_hub_uri, parse_hub_uri
from pretrain.spec.strict import Strict


class HubDataset(Strict):
    """A dataset repository read with the ``datasets`` library, as NxD's get_dataset.py reads
    wikicorpus, and written as JSONL shards for the tokenize stage."""

    config: str | None = Field(None, description="The dataset's configuration (load_dataset's name), e.g. raw_en.")
    split: str = Field("train", description="The split to write, e.g. train.")


class DataSource(Strict):
    uri: str = Field(description="s3://bucket/key, s3://bucket/prefix/, https://..., a local path, or "
                     "hf://[datasets/]ORG/NAME[@REVISION][/PATTERNS] (the Hugging Face Hub; token from hub.token_block).")
    credentials: str | None = Field(
        None, description="s3://: name of a prefect-aws AwsCredentials block; https://: name of a Secret "
        "block holding a bearer token. None: anonymous access (public buckets such as s3://neuron-s3, "
        "public URLs). hf:// sources use hub.token_block.")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint, overriding the block's.")
    decompress: bool = Field(False, description="Unpack .xz/.gz/.zst/.bz2 files after download.")
    sha256: str | None = Field(None, description="Expected sha256 of a single-file source.")
    dataset: HubDataset | None = Field(None, description="For hf://datasets/ URIs: read the repository with "
                                       "the datasets library (config, split) and write JSONL shards; unset: "
                                       "its files as they are (a tokenized save_to_disk directory, say).")

    @model_validator(mode="after")
    def _hub_source(self) -> DataSource:
        if not is_hub_uri(self.uri):
            if self.dataset is not None:
                raise ValueError(f"dataset: is for hf://datasets/ sources; uri={self.uri!r} is not one")
            return self
        ref = parse_hub_uri(self.uri, "uri")
        if self.credentials or self.endpoint_url:
            raise ValueError(f"uri={self.uri!r}: an hf:// source takes its token from hub.token_block and its "
                             "endpoint from hub.endpoint; remove credentials/endpoint_url from the source")
        if self.dataset is not None and ref.repo_type != "dataset":
            raise ValueError(f"uri={self.uri!r} is a model repository; dataset: needs hf://datasets/ORG/NAME")
        return self


class BlendSource(Strict):
    prefix: str = Field(description="A tokenized Megatron dataset on the shared filesystem: the path "
                        "of its .bin/.idx pair without the suffix.")
    weight: float = Field(gt=0, description="Its share of the blend, relative to the other weights.")


class DataSpec(Strict):
    sources: list[DataSource] = Field(min_length=1, description="Raw data: JSONL corpora, or "
                                      "already tokenized .bin/.idx files.")
    weight: float = Field(1.0, gt=0, description="The share of this spec's own dataset in a blend.")
    blend: list[BlendSource] = Field(default_factory=list, description="Other tokenized datasets "
                                     "trained on with this one, each sampled by its weight (Megatron's blend).")
    json_keys: list[str] = Field(["text"], description="JSON keys holding the text (Megatron --json-keys); "
                                 "tokenize writes a dataset of each, and training reads the first's.")
    split: str = Field("969,30,1", description="train,valid,test weights, Megatron style.")
    tokenize_shards: int | None = Field(None, gt=0, description="Slurm array tasks for tokenize; "
                                        "default one per 256 MB of input.")

    @field_validator("split")
    @classmethod
    def _split_is_three_weights(cls, value: str) -> str:
        parts = value.split(",")
        if len(parts) != 3 or not all(p.strip().replace(".", "", 1).isdigit() for p in parts):
            raise ValueError(f"data.split={value!r}: give three non-negative weights, e.g. '969,30,1'")
        if sum(float(p) for p in parts) <= 0:
            raise ValueError(f"data.split={value!r}: the weights must not all be zero")
        return value

    @property
    def split_weights(self) -> tuple[float, float, float]:
        train, valid, test = (float(p) for p in self.split.split(","))
        return train, valid, test


class TokenizerSpec(Strict):
    type: Literal["gpt2-bpe", "hf", "sentencepiece"] = Field(
        description="gpt2-bpe: vocab.json + merges.txt (Megatron GPT2BPETokenizer); hf: a "
        "directory with tokenizer.json (e.g. Llama 3); sentencepiece: a .model file.")
    path: str | None = Field(None, description="hf directory or sentencepiece .model (path or URI).")
    vocab_file: str | None = Field(None, description="gpt2-bpe vocab.json (path or URI).")
    merges_file: str | None = Field(None, description="gpt2-bpe merges.txt (path or URI).")
    append_eod: bool = Field(True, description="Append the end-of-document token (Megatron --append-eod).")

    @field_validator("path", "vocab_file", "merges_file")
    @classmethod
    def _hub_uri(cls, value: str | None, info: ValidationInfo) -> str | None:
        return checked(value, f"tokenizer.{info.field_name}")

    @model_validator(mode="after")
    def _files_for_type(self) -> TokenizerSpec:
        if self.type == "gpt2-bpe" and not (self.vocab_file and self.merges_file):
            raise ValueError("tokenizer.vocab_file and tokenizer.merges_file are required for "
                             "tokenizer.type=gpt2-bpe")
        if self.type != "gpt2-bpe" and not self.path:
            raise ValueError(f"tokenizer.path is required for tokenizer.type={self.type}")
        return self


class HubSpec(Strict):
    """Access to the Hugging Face Hub for every hf:// URI of the spec."""

    token_block: str | None = Field(None, description="Name of a Prefect Secret block holding a Hugging Face "
                                    "token: gated (meta-llama) and private repositories need one. None: anonymous.")
    endpoint: str | None = Field(None, description="The Hub's URL; None: huggingface_hub's (HF_ENDPOINT, else "
                                 "https://huggingface.co).")
    cache_dir: str | None = Field(None, description="huggingface_hub's cache, where downloads land before they are "
                                  "linked into stage outputs; None: <paths.root>/hub-cache. With HF_HUB_OFFLINE=1 "
                                  "only this cache is read.")
