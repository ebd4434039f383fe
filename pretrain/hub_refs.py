"""``hf://`` URIs: what a spec names on the Hugging Face Hub, and where it lands on disk.

Standard library only, so the spec can check a URI without importing huggingface_hub. The
syntax follows huggingface_hub's ``HfFileSystem`` paths (``hf://datasets/ORG/NAME@REV/PATH``),
with a comma between several file patterns:

    hf://ORG/NAME                              a model repository, default branch
    hf://datasets/ORG/NAME@v1.0                a dataset repository at a tag, branch or commit
    hf://ORG/NAME@main/tokenizer*,config.json  only the files these patterns match
    hf://datasets/NAME@refs%2Fconvert%2Fparquet/raw_en/*   a revision with '/' is URL-encoded

A repository is ORG/NAME; a legacy one-word dataset name (``hf://datasets/wikicorpus``) is taken
as such when nothing but a revision follows it.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pretrain.spec import PretrainSpec

SCHEME = "hf://"
DEFAULT_REVISION = "main"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FORMS = ("hf://ORG/NAME[@REVISION][/PATTERN[,PATTERN...]] (a model) or "
          "hf://datasets/ORG/NAME[@REVISION][/PATTERN...] (a dataset)")

# The files each spec field needs when its URI names no patterns: a tokenizer without the
# weights beside it, a checkpoint without its duplicate .bin/.pth copies, one config.json.
FIELD_PATTERNS: dict[str, tuple[str, ...]] = {
    "tokenizer.path": ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"),
    "tokenizer.vocab_file": ("vocab.json",),
    "tokenizer.merges_file": ("merges.txt",),
    "model.init_from": ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json"),
    "backend.neuron.hf_config": ("config.json",),
}


@dataclass(frozen=True)
class HubRef:
    repo_type: str  # "model" or "dataset", as huggingface_hub names them
    repo_id: str
    revision: str
    patterns: tuple[str, ...]  # empty: every file (data) or the field's FIELD_PATTERNS

    @property
    def uri(self) -> str:
        prefix = "datasets/" if self.repo_type == "dataset" else ""
        revision = urllib.parse.quote(self.revision, safe="")
        tail = "/" + ",".join(self.patterns) if self.patterns else ""
        return f"{SCHEME}{prefix}{self.repo_id}@{revision}{tail}"

    def page(self, endpoint: str) -> str:
        """The repository's page, where a gated model's licence is accepted."""
        prefix = "datasets/" if self.repo_type == "dataset" else ""
        return f"{endpoint.rstrip('/')}/{prefix}{self.repo_id}"


def is_hub_uri(value: str | None) -> bool:
    return bool(value) and value.startswith(SCHEME)


def parse_hub_uri(uri: str, field: str) -> HubRef:
    """The repository, revision and patterns of ``uri``; a ValueError names ``field`` and the forms."""
    def bad(why: str) -> ValueError:
        return ValueError(f"{field}={uri!r}: {why}; write {_FORMS}")

    rest = uri.removeprefix(SCHEME)
    repo_type = "model"
    for prefix, kind in (("datasets/", "dataset"), ("models/", "model")):
        if rest.startswith(prefix):
            repo_type, rest = kind, rest.removeprefix(prefix)
    if rest.startswith("spaces/"):
        raise bad("Spaces hold apps, not data or models")
    if "@" in rest:
        repo_id, _, after = rest.partition("@")
        revision, _, tail = after.partition("/")
        revision = urllib.parse.unquote(revision)
        if not revision:
            raise bad("'@' without a revision")
    else:
        parts = rest.split("/")
        one_word = len(parts) == 1 and repo_type == "dataset"
        repo_id, tail = ("/".join(parts[:1]), "") if one_word else ("/".join(parts[:2]), "/".join(parts[2:]))
        revision = DEFAULT_REVISION
    segments = repo_id.split("/")
    if not (len(segments) == 2 or (len(segments) == 1 and repo_type == "dataset")):
        raise bad(f"{repo_id!r} is not a repository name ORG/NAME")
    if not all(_NAME.match(s) for s in segments):
        raise bad(f"{repo_id!r} has characters a repository name cannot have")
    patterns = tuple(p for p in tail.split(",") if p)
    if any(PurePosixPath(p).is_absolute() or ".." in PurePosixPath(p).parts for p in patterns):
        raise bad("a file pattern must stay inside the repository")
    return HubRef(repo_type, repo_id, revision, patterns)


def checked(value: str | None, field: str) -> str | None:
    """``value`` as a spec field holds it, once an hf:// URI in it parses (else a ValueError)."""
    if is_hub_uri(value):
        parse_hub_uri(value, field)
    return value


def download_patterns(field: str, ref: HubRef) -> tuple[str, ...]:
    """The files to download for ``field``: the URI's patterns, else the field's own."""
    return ref.patterns or FIELD_PATTERNS[field]


def local_value(field: str, ref: HubRef, directory: str) -> str:
    """What ``field`` names once its files are in ``directory``: the file itself when the field
    downloads exactly one named file (a config.json, a vocab, a SentencePiece .model); else the
    directory (a tokenizer or checkpoint directory)."""
    patterns = download_patterns(field, ref)
    if field != "model.init_from" and len(patterns) == 1 and not any(c in patterns[0] for c in "*?["):
        return f"{directory}/{patterns[0]}"
    return directory


def spec_references(spec: PretrainSpec) -> dict[str, HubRef]:
    """The spec's fields (besides data sources, which the fetch stage reads) that name hf:// URIs."""
    values = {"tokenizer.path": spec.tokenizer.path, "tokenizer.vocab_file": spec.tokenizer.vocab_file,
              "tokenizer.merges_file": spec.tokenizer.merges_file, "model.init_from": spec.model.init_from,
              "backend.neuron.hf_config": spec.backend.neuron.hf_config if spec.backend.neuron else None}
    return {field: parse_hub_uri(value, field) for field, value in values.items() if is_hub_uri(value)}


def with_local_values(spec: PretrainSpec, values: dict[str, str]) -> PretrainSpec:
    """``spec`` with each field of ``values`` (dotted, as :func:`spec_references` names them) set:
    the stages after fetch see paths on the shared filesystem, never a URI."""
    data = spec.model_dump()
    for field, value in values.items():
        *parents, leaf = field.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    return type(spec).model_validate(data)
