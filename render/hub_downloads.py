"""What the fetch stage will download from the Hugging Face Hub, for dry runs: every hf:// URI of
the spec with its repository, revision and the files asked for, and the placeholder the rendered
files name in its place (the output is keyed by the commit, known only at run time)."""

from __future__ import annotations

from pretrain.hub_refs import download_patterns, is_hub_uri, local_value, parse_hub_uri, spec_references
from pretrain.spec import PretrainSpec


def placeholder(field: str) -> str:
    return f"<hub-output:{field}>"


def hub_placeholders(spec: PretrainSpec) -> dict[str, str]:
    """Each hf:// field (data sources aside) and the path the stages after fetch will read."""
    return {field: local_value(field, ref, placeholder(field)) for field, ref in spec_references(spec).items()}


def hub_downloads(spec: PretrainSpec, fetched: str) -> str:
    """One line per Hub download; empty when the spec names nothing on the Hub."""
    lines = []
    for field, ref in spec_references(spec).items():
        lines.append(f"{field}: {ref.repo_type} {ref.repo_id} @ {ref.revision}, files "
                     f"{', '.join(download_patterns(field, ref))} -> {local_value(field, ref, placeholder(field))}")
    for i, source in enumerate(spec.data.sources):
        if is_hub_uri(source.uri):
            ref = parse_hub_uri(source.uri, f"data.sources[{i}].uri")
            files = ", ".join(ref.patterns) or "all"
            how = (f", read with datasets (config {source.dataset.config}, split {source.dataset.split}) "
                   "and written as JSONL shards" if source.dataset else "")
            lines.append(f"data.sources[{i}]: {ref.repo_type} {ref.repo_id} @ {ref.revision}, files {files}"
                         f"{how} -> {fetched}")
    if not lines:
        return ""
    token = (f"the token of Secret block {spec.hub.token_block!r}, read on the control plane only"
             if spec.hub.token_block else "anonymous (no hub.token_block)")
    header = [f"# Hugging Face Hub downloads of the fetch stage (huggingface_hub.snapshot_download into "
              f"{spec.hub.cache_dir or '<paths.root>/hub-cache'}); each revision is resolved to its commit, "
              "which keys the output", f"# access: {token}"]
    return "\n".join([*header, *lines]) + "\n"
