"""Hugging Face Hub downloads with huggingface_hub: a revision resolved to its commit, the files a
stage needs (``snapshot_download`` with allow-patterns) into huggingface_hub's cache, then linked
into a content-addressed stage output. No Prefect here: the fetch stage passes the token it read
from its Secret block.

The commit, never the branch name, keys an output, so a moving ``main`` gives a new output and a
pinned commit reuses the old one. With ``HF_HUB_OFFLINE=1`` huggingface_hub resolves revisions
and serves snapshots from its cache only, and so does every function here.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                    RepositoryNotFoundError, RevisionNotFoundError, RevisionResolutionError)

from pretrain import manifest
from pretrain.hub_refs import HubRef
from pretrain.spec import PretrainSpec
from pretrain.transfer import FetchError

HUB_FORMAT = 1  # bump when the layout of hub outputs changes
# Waits before each retry of a rate-limited (HTTP 429) call, unless the Hub says how long (Retry-After).
RATE_LIMIT_BACKOFF_S = (2.0, 4.0, 8.0, 16.0, 32.0)
TOKENS_PAGE = "https://huggingface.co/settings/tokens"

T = TypeVar("T")


@dataclass(frozen=True)
class HubAccess:
    """How to reach the Hub: ``token`` as read from the Secret block ``token_block`` (kept out of
    every repr, so no log line or error can carry it)."""

    token_block: str | None = None
    token: str | None = field(default=None, repr=False)
    endpoint: str | None = None
    cache_dir: str | None = None

    @property
    def url(self) -> str:
        return (self.endpoint or constants.ENDPOINT).rstrip("/")

    @property
    def credentials(self) -> str | bool:
        # False, not None: huggingface_hub would otherwise send a token saved on the machine
        return self.token or False

    def who(self) -> str:
        return (f"the token in Secret block {self.token_block!r}" if self.token_block
                else "anonymous access (no hub.token_block)")


def access_for(spec: PretrainSpec, token: str | None) -> HubAccess:
    """The spec's hub settings with the token read from its block; the cache defaults to the
    shared filesystem (``<root>/hub-cache``), not the head node's small home directory."""
    hub = spec.hub
    return HubAccess(hub.token_block, token, hub.endpoint,
                     hub.cache_dir or str(Path(spec.paths.root).expanduser() / "hub-cache"))


class HubError(FetchError):
    """A Hub reference that cannot be fetched as asked; the message says what to do."""


@contextmanager
def hub_errors(ref: HubRef, access: HubAccess) -> Iterator[None]:
    """huggingface_hub's exceptions as messages that name the URI, the token's block and the fix."""
    uri = ref.uri
    try:
        yield
    except GatedRepoError:
        fix = (f"accept its licence at {ref.page(access.url)} while signed in as the owner of the token in "
               f"Secret block {access.token_block!r}" if access.token_block else
               f"create a token at {TOKENS_PAGE}, save it in a Prefect Secret block, name that block in "
               f"hub.token_block, and accept the licence at {ref.page(access.url)}")
        raise HubError(f"{uri}: the repository is gated and {access.who()} has no access to it: {fix}") from None
    except RevisionNotFoundError:
        raise HubError(f"{uri}: no revision {ref.revision!r} in {ref.repo_id}; give a branch, tag or commit "
                       f"that exists (see {ref.page(access.url)}/tree/main)") from None
    except RepositoryNotFoundError:
        kind = "dataset" if ref.repo_type == "dataset" else "model"
        raise HubError(f"{uri}: no {kind} repository {ref.repo_id!r} at {access.url} readable with {access.who()}: "
                       "check the name (datasets are hf://datasets/ORG/NAME); a private repository needs "
                       "a token with read access in hub.token_block") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            fix = (f"put a valid token ({TOKENS_PAGE}) in that block" if access.token_block
                   else "name a Secret block holding a token in hub.token_block")
            raise HubError(f"{uri}: the Hub refused {access.who()} (HTTP 401): {fix}") from None
        if status == 429:
            raise HubError(f"{uri}: still rate limited by the Hub (HTTP 429) after {len(RATE_LIMIT_BACKOFF_S)} "
                           "retries; try again later, or with a token (hub.token_block), whose limits are "
                           "higher", retryable=True) from None
        raise HubError(f"{uri}: the Hub answered HTTP {status} ({exc.server_message or exc}); trying again",
                       retryable=status is None or status >= 500) from None
    except (LocalEntryNotFoundError, RevisionResolutionError) as exc:
        if constants.HF_HUB_OFFLINE:
            raise HubError(f"{uri}: HF_HUB_OFFLINE is set and huggingface_hub's cache ({access.cache_dir}) does "
                           f"not hold revision {ref.revision!r} of {ref.repo_id}: fetch it once with the Hub "
                           "reachable, or point hub.cache_dir at a cache that holds it") from None
        raise HubError(f"{uri}: cannot reach the Hub at {access.url} and the cache does not hold this revision "
                       f"({exc.__class__.__name__}); check the network and hub.endpoint", retryable=True) from None


def with_rate_limit_backoff(call: Callable[[], T]) -> T:
    """``call()``, retried while the Hub answers 429: after its Retry-After, else the next backoff."""
    for wait in (*RATE_LIMIT_BACKOFF_S, None):
        try:
            return call()
        except HfHubHTTPError as exc:
            if wait is None or exc.response is None or exc.response.status_code != 429:
                raise
            retry_after = exc.response.headers.get("Retry-After", "")
            time.sleep(float(retry_after) if retry_after.isdigit() else wait)
    raise AssertionError("unreachable")


def resolve_commit(ref: HubRef, access: HubAccess) -> str:
    """The commit ``ref.revision`` points at now (from the cache's refs when offline)."""
    api = HfApi(endpoint=access.endpoint, token=access.credentials)
    with hub_errors(ref, access):
        revision = with_rate_limit_backoff(lambda: api.resolve_revision(
            ref.repo_id, repo_type=ref.repo_type, revision=ref.revision, cache_dir=access.cache_dir))
    return revision.resolved


def snapshot(ref: HubRef, commit: str, patterns: tuple[str, ...], access: HubAccess) -> Path:
    """The files of ``ref`` at ``commit`` that ``patterns`` match (all when empty), in the cache;
    a pattern that matches nothing is an error naming it."""
    with hub_errors(ref, access):
        folder = Path(with_rate_limit_backoff(lambda: snapshot_download(
            ref.repo_id, repo_type=ref.repo_type, revision=commit, allow_patterns=list(patterns) or None,
            cache_dir=access.cache_dir, token=access.credentials, endpoint=access.endpoint)))
    present = snapshot_files(folder)
    if not present:
        raise HubError(f"{ref.uri}: no file of {ref.repo_id} at {commit[:12]} matches {', '.join(patterns)}; "
                       f"see the files at {ref.page(access.url)}/tree/{commit} and fix the patterns")
    return folder


def snapshot_files(folder: Path) -> list[str]:
    """Files of a snapshot folder (links into the cache's blobs), relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def link_files(folder: Path, dest: Path, names: list[str]) -> None:
    """Each of ``names`` from a snapshot into ``dest``, hard-linked to the cache's blob (no second
    copy of 140 GB of weights), copied where the two are on different filesystems."""
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.unlink(missing_ok=True)
        blob = (folder / name).resolve()
        try:
            os.link(blob, tmp)
        except OSError:
            shutil.copyfile(blob, tmp)
        os.replace(tmp, target)


def hub_key_inputs(ref: HubRef, commit: str, patterns: tuple[str, ...]) -> dict[str, Any]:
    """What a hub output is a function of: the repository at a commit, and the files asked for."""
    return {"format": HUB_FORMAT, "repo_type": ref.repo_type, "repo_id": ref.repo_id, "commit": commit,
            "patterns": list(patterns)}


def fetch_files(ref: HubRef, patterns: tuple[str, ...], access: HubAccess, root: str,
                reuse_only: bool = False) -> tuple[Path, dict[str, Any], bool]:
    """``ref``'s files that ``patterns`` match, at the commit its revision resolves to, as a
    content-addressed output under ``root``. Returns the directory, its manifest, and whether it
    was there already. ``reuse_only``: never download; a missing output raises MissingOutput."""
    commit = resolve_commit(ref, access)

    def build(staging: Path) -> dict[str, Any]:
        folder = snapshot(ref, commit, patterns, access)
        link_files(folder, staging, snapshot_files(folder))
        return {"uri": ref.uri, "revision": ref.revision, "commit": commit}

    # the hub's files come with the fetch stage: a run without it asks for fetch
    output = manifest.cached_output(root, "hub", hub_key_inputs(ref, commit, patterns), build, reuse_only,
                                    asked_as="fetch")
    return output.directory, output.manifest, output.cached
