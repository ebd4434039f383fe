"""fetch, for the spec's hf:// fields other than data: the tokenizer, the checkpoint to continue
from, NxDT's config.json. Each becomes a content-addressed output on the shared filesystem
(``<root>/hub/hub-<key>/``, keyed by the commit), and the stages after fetch get a spec naming
those directories instead of the URIs, so no node and no job file ever sees the Hub or the token.
"""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger
from prefect.tasks import exponential_backoff

from pretrain.hub import HubAccess, HubError, access_for, fetch_files
from pretrain.hub_refs import download_patterns, local_value, spec_references, with_local_values
from pretrain.spec import PretrainSpec
from tasks.artifacts import artifact_key, retryable


def hub_access(spec: PretrainSpec) -> HubAccess:
    """The spec's hub settings with the token of its Secret block (hub.token_block), if any."""
    token = None
    if spec.hub.token_block:
        from prefect.blocks.system import Secret

        try:
            token = Secret.load(spec.hub.token_block).get()
        except ValueError:
            raise HubError(f"hub.token_block={spec.hub.token_block!r}: no Secret block of that name; create it "
                           "with a Hugging Face token (Secret(value=...).save(name), or in the UI under "
                           "Blocks)") from None
    return access_for(spec, token)


@task(name="fetch-hub-files", retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=5),
      retry_condition_fn=retryable)
def fetch_hub_files(spec: PretrainSpec, reuse_only: bool = False) -> PretrainSpec:
    """Download each hf:// field's files (only those the field needs); return the spec with the
    fields pointing at them. ``reuse_only``: never download (fetch was left out of the run)."""
    logger = get_run_logger()
    access = hub_access(spec)
    values, rows = {}, []
    for field, ref in spec_references(spec).items():
        patterns = download_patterns(field, ref)
        directory, done, cached = fetch_files(ref, patterns, access, spec.paths.root, reuse_only)
        values[field] = local_value(field, ref, str(directory))
        logger.info("%s: %s at commit %s -> %s%s", field, ref.uri, done["commit"], values[field],
                    " (cached)" if cached else "")
        rows.append({"field": field, "uri": ref.uri, "commit": done["commit"], "files": len(done["files"]),
                     "bytes": sum(f["bytes"] for f in done["files"].values()), "cached": cached,
                     "path": values[field]})
    create_table_artifact(rows, key=artifact_key(spec.name, "hub"),
                          description="Hugging Face Hub files of the spec, by commit")
    return with_local_values(spec, values)
