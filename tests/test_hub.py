"""hf:// sources with the real huggingface_hub and datasets code, against a local server that
answers the Hub's routes for repositories these tests write (tests/hub_server.py): commits
keyed outputs, only the files a field needs, the errors users meet, the rate limit, and the
offline cache."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hub_server import LocalHub
from pretrain import hub, manifest
from pretrain.hub import HubAccess, HubError, fetch_files, resolve_commit, snapshot
from pretrain.hub_dataset import write_jsonl_shards
from pretrain.hub_refs import FIELD_PATTERNS, HubRef, download_patterns, local_value, parse_hub_uri

pytestmark = pytest.mark.pure

TOKEN = "hf_" + "t" * 34
LLAMA = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b'{"model": {}}',
         "tokenizer_config.json": b"{}", "special_tokens_map.json": b"{}",
         "model-00001-of-00002.safetensors": b"\0" * 4096, "model-00002-of-00002.safetensors": b"\1" * 4096,
         "model.safetensors.index.json": b"{}", "original/consolidated.00.pth": b"\2" * 4096}


@pytest.fixture
def local_hub():
    server = LocalHub()
    server.tokens.add(TOKEN)
    yield server
    server.close()


def access(server: LocalHub, tmp_path: Path, token: str | None = None, block: str | None = None) -> HubAccess:
    return HubAccess(token_block=block, token=token, endpoint=server.endpoint, cache_dir=str(tmp_path / "cache"))


def downloads(server: LocalHub) -> list[str]:
    return [path for method, path, _ in server.requests if method == "GET" and "/resolve/" in path]


@pytest.mark.parametrize("uri, ref", [
    ("hf://meta-llama/Meta-Llama-3-70B", HubRef("model", "meta-llama/Meta-Llama-3-70B", "main", ())),
    ("hf://datasets/wikicorpus", HubRef("dataset", "wikicorpus", "main", ())),
    ("hf://org/name@v1.0/tokenizer*,config.json", HubRef("model", "org/name", "v1.0", ("tokenizer*", "config.json"))),
    ("hf://datasets/org/data/raw_en/*.parquet", HubRef("dataset", "org/data", "main", ("raw_en/*.parquet",))),
    ("hf://datasets/wikicorpus@refs%2Fconvert%2Fparquet/raw_en/*",
     HubRef("dataset", "wikicorpus", "refs/convert/parquet", ("raw_en/*",))),
])
def test_uri_forms(uri, ref):
    assert parse_hub_uri(uri, "data.sources[0].uri") == ref
    assert parse_hub_uri(ref.uri, "x") == ref  # the canonical form reads back the same


@pytest.mark.parametrize("uri, why", [
    ("hf://meta-llama", "not a repository name ORG/NAME"), ("hf://a/b@", "without a revision"),
    ("hf://spaces/a/b", "Spaces hold apps"), ("hf://a/b@main/../x", "inside the repository"),
    ("hf://a/b c", "characters a repository name cannot have"),
])
def test_bad_uris_name_the_field_and_the_forms(uri, why):
    with pytest.raises(ValueError, match=why) as info:
        parse_hub_uri(uri, "tokenizer.path")
    assert str(info.value).startswith(f"tokenizer.path={uri!r}") and "hf://ORG/NAME[@REVISION]" in str(info.value)


def test_a_field_names_a_file_or_a_directory():
    ref = parse_hub_uri("hf://org/name", "f")
    assert local_value("backend.neuron.hf_config", ref, "/d") == "/d/config.json"
    assert local_value("tokenizer.path", ref, "/d") == "/d"
    assert local_value("model.init_from", ref, "/d") == "/d"
    assert local_value("tokenizer.path", parse_hub_uri("hf://org/name/tokenizer.model", "f"), "/d") == \
        "/d/tokenizer.model"


def test_tokenizer_without_the_weights_keyed_by_the_commit(local_hub, tmp_path):
    repo = local_hub.repo("model", "meta-llama/Meta-Llama-3-70B", gated=True)
    first = repo.commit(LLAMA)
    local_hub.granted.add(TOKEN)
    ref = parse_hub_uri("hf://meta-llama/Meta-Llama-3-70B", "tokenizer.path")
    patterns = download_patterns("tokenizer.path", ref)
    hub_access = access(local_hub, tmp_path, TOKEN, "hf-token")

    out, done, cached = fetch_files(ref, patterns, hub_access, str(tmp_path / "root"))
    assert not cached and sorted(done["files"]) == ["special_tokens_map.json", "tokenizer.json",
                                                    "tokenizer_config.json"]
    assert (out / "tokenizer.json").read_bytes() == LLAMA["tokenizer.json"]
    assert done["commit"] == first and done["revision"] == "main" and done["key_inputs"]["commit"] == first
    assert not any("safetensors" in p or ".pth" in p for p in downloads(local_hub))  # no weights moved
    assert manifest.load_valid(out, done["key"], deep=True)

    # unchanged: the same output, nothing downloaded
    before = len(downloads(local_hub))
    assert fetch_files(ref, patterns, hub_access, str(tmp_path / "root"))[:3:2] == (out, True)
    assert len(downloads(local_hub)) == before

    # main moves: another commit, another output; the pinned commit still finds the first one
    second = repo.commit({**LLAMA, "tokenizer.json": b'{"model": {"v": 2}}'})
    moved, done2, cached2 = fetch_files(ref, patterns, hub_access, str(tmp_path / "root"))
    assert moved != out and done2["commit"] == second and not cached2
    assert (moved / "tokenizer.json").read_bytes() == b'{"model": {"v": 2}}'
    pinned = HubRef(ref.repo_type, ref.repo_id, first, ())
    requests = len(local_hub.requests)
    assert fetch_files(pinned, patterns, hub_access, str(tmp_path / "root"))[0] == out
    assert len(local_hub.requests) == requests  # a commit needs no question to the Hub


def test_checkpoint_files_are_linked_from_the_cache_not_copied(local_hub, tmp_path):
    local_hub.repo("model", "org/llama").commit(LLAMA)
    ref = parse_hub_uri("hf://org/llama", "model.init_from")
    out, done, _ = fetch_files(ref, FIELD_PATTERNS["model.init_from"], access(local_hub, tmp_path),
                               str(tmp_path / "root"))
    assert sorted(done["files"]) == ["config.json", "model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    assert (out / "model-00001-of-00002.safetensors").stat().st_nlink == 2  # the cache's blob and this


def test_gated_repository_says_where_to_accept_the_licence_and_which_block(local_hub, tmp_path):
    local_hub.repo("model", "meta-llama/Meta-Llama-3-70B", gated=True).commit(LLAMA)
    ref = parse_hub_uri("hf://meta-llama/Meta-Llama-3-70B", "tokenizer.path")
    with pytest.raises(HubError, match=r"gated and the token in Secret block 'hf-token' has no access to it: "
                                       rf"accept its licence at {local_hub.endpoint}/meta-llama/Meta-Llama-3-70B") as info:
        resolve_commit(ref, access(local_hub, tmp_path, TOKEN, "hf-token"))
    assert TOKEN not in str(info.value) and not info.value.retryable
    with pytest.raises(HubError, match="gated and anonymous access .* create a token .* hub.token_block"):
        resolve_commit(ref, access(local_hub, tmp_path))
    local_hub.granted.add(TOKEN)
    assert len(resolve_commit(ref, access(local_hub, tmp_path, TOKEN, "hf-token"))) == 40


def test_bad_token_unknown_repository_and_revision(local_hub, tmp_path):
    local_hub.repo("dataset", "org/corpus").commit({"a.jsonl": b'{"text": "a"}\n'})
    revoked = "hf_" + "r" * 34
    with pytest.raises(HubError, match=r"refused the token in Secret block 'old' \(HTTP 401\): put a valid token") as info:
        resolve_commit(parse_hub_uri("hf://datasets/org/corpus", "u"), access(local_hub, tmp_path, revoked, "old"))
    assert revoked not in str(info.value)
    with pytest.raises(HubError, match="no model repository 'org/corpus' .* .datasets are hf://datasets/ORG/NAME"):
        resolve_commit(parse_hub_uri("hf://org/corpus", "u"), access(local_hub, tmp_path))
    with pytest.raises(HubError, match="no revision 'v9' in org/corpus; give a branch, tag or commit"):
        resolve_commit(parse_hub_uri("hf://datasets/org/corpus@v9", "u"), access(local_hub, tmp_path))
    ref = parse_hub_uri("hf://datasets/org/corpus/*.parquet", "u")
    with pytest.raises(HubError, match=r"no file of org/corpus at \w{12} matches \*\.parquet"):
        snapshot(ref, resolve_commit(ref, access(local_hub, tmp_path)), ref.patterns, access(local_hub, tmp_path))


def test_rate_limit_is_retried_with_backoff(local_hub, tmp_path, monkeypatch):
    local_hub.repo("model", "org/m").commit(LLAMA)
    ref = parse_hub_uri("hf://org/m", "u")
    local_hub.rate_limited = 2  # 429 without Retry-After: the backoff waits
    monkeypatch.setattr(hub, "RATE_LIMIT_BACKOFF_S", (0.01, 0.01, 0.01))
    assert len(resolve_commit(ref, access(local_hub, tmp_path))) == 40
    assert [p for _, p, _ in local_hub.requests].count("/api/models/org/m/revision/main") == 3
    local_hub.rate_limited = 100
    with pytest.raises(HubError, match="still rate limited by the Hub .HTTP 429. after 3 retries") as info:
        resolve_commit(ref, access(local_hub, tmp_path))
    assert info.value.retryable


def test_offline_reads_only_the_cache(local_hub, tmp_path):
    """HF_HUB_OFFLINE=1 in a fresh process, with the server gone: a revision fetched before is
    served from huggingface_hub's cache (its output rebuilt from it), another one is refused."""
    local_hub.repo("model", "org/m").commit(LLAMA)
    root, cache = tmp_path / "root", tmp_path / "cache"
    ref = parse_hub_uri("hf://org/m", "tokenizer.path")
    out, done, _ = fetch_files(ref, download_patterns("tokenizer.path", ref), access(local_hub, tmp_path), str(root))
    local_hub.close()
    manifest_before = json.loads((out / "MANIFEST.json").read_text())
    (out / "MANIFEST.json").unlink()  # the output must be rebuilt, from the cache alone
    script = textwrap.dedent(f"""
        from pretrain.hub import HubAccess, HubError, fetch_files
        from pretrain.hub_refs import parse_hub_uri, download_patterns
        access = HubAccess(endpoint={local_hub.endpoint!r}, cache_dir={str(cache)!r})
        ref = parse_hub_uri("hf://org/m", "tokenizer.path")
        out, done, cached = fetch_files(ref, download_patterns("tokenizer.path", ref), access, {str(root)!r})
        print(out, done["commit"], cached)
        try:
            fetch_files(parse_hub_uri("hf://org/m@v2", "u"), ("config.json",), access, {str(root)!r})
        except HubError as exc:
            print(exc)
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()[:2]
    assert first == f"{out} {manifest_before['commit']} False"
    assert "HF_HUB_OFFLINE is set" in second and "'v2'" in second
    assert (out / "tokenizer.json").read_bytes() == LLAMA["tokenizer.json"]


def parquet(rows: dict[str, list]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table(rows), buffer)
    return buffer.getvalue()


def test_datasets_source_is_written_as_jsonl_shards(local_hub, tmp_path):
    readme = textwrap.dedent("""\
        ---
        configs:
        - config_name: raw_en
          data_files:
          - split: train
            path: raw_en/train-*
          - split: validation
            path: raw_en/validation-*
        ---
        A corpus.
        """).encode()
    texts = [f"document {i} é" for i in range(50)]
    local_hub.repo("dataset", "org/wiki").commit({
        "README.md": readme, "raw_en/train-00000-of-00001.parquet": parquet({"id": list(range(50)), "text": texts}),
        "raw_en/validation-00000-of-00001.parquet": parquet({"id": [0], "text": ["held out"]})})
    ref = parse_hub_uri("hf://datasets/org/wiki", "data.sources[0].uri")
    hub_access = access(local_hub, tmp_path)
    folder = snapshot(ref, resolve_commit(ref, hub_access), ref.patterns, hub_access)
    dest = tmp_path / "out"
    dest.mkdir()
    written = write_jsonl_shards(ref, folder, "raw_en", "train", dest)
    assert written["files"] == ["wiki-raw_en-train-00000-of-00001.jsonl"] and written["rows"] == 50
    lines = (dest / written["files"][0]).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["text"] for line in lines] == texts
    assert sorted(p.name for p in dest.iterdir()) == written["files"]
    assert not list(tmp_path.glob(".datasets-cache-*"))  # datasets' cache is gone

    with pytest.raises(HubError, match="config='raw_de'.*fix data.sources"):
        write_jsonl_shards(ref, folder, "raw_de", "train", dest)
    with pytest.raises(HubError, match="split='test'"):
        write_jsonl_shards(ref, folder, "raw_en", "test", dest)


def test_a_loading_script_repository_points_at_its_parquet_conversion(local_hub, tmp_path):
    local_hub.repo("dataset", "wikicorpus").commit({"wikicorpus.py": b"import datasets\n", "README.md": b"x\n"})
    ref = parse_hub_uri("hf://datasets/wikicorpus", "u")
    hub_access = access(local_hub, tmp_path)
    folder = snapshot(ref, resolve_commit(ref, hub_access), ref.patterns, hub_access)
    with pytest.raises(HubError, match=r"loading script \(wikicorpus.py\).*@refs%2Fconvert%2Fparquet"):
        write_jsonl_shards(ref, folder, "raw_en", "train", tmp_path)


def test_plan_tells_a_moved_revision_by_its_commit(local_hub, tmp_path):
    from flows.plan import plan
    from pretrain.presets import load_spec
    from test_formats import ASSETS

    repo = local_hub.repo("model", "org/tok")
    first = repo.commit({p.name: p.read_bytes() for p in (ASSETS / "hf").iterdir()})
    spec = load_spec("tiny-local", [
        "tokenizer.path=hf://org/tok", f"hub.endpoint={local_hub.endpoint}", f"hub.cache_dir={tmp_path / 'cache'}",
        f"paths.root={tmp_path / 'root'}", f"data.sources=[{{uri: {ASSETS / 'corpus.jsonl'}}}]"])
    hub_stage, _, tokenize, *_ = plan(spec)
    assert (hub_stage.stage, hub_stage.action, tokenize.reason) == (
        "hub tokenizer.path", "run", "files from the Hub are new: fetch runs first")
    ref = parse_hub_uri("hf://org/tok", "tokenizer.path")
    out, _, _ = fetch_files(ref, download_patterns("tokenizer.path", ref), access(local_hub, tmp_path),
                            str(tmp_path / "root"))
    assert plan(spec)[0].action == "reuse" and plan(spec)[0].output == str(out)
    second = repo.commit({"tokenizer.json": b"{}"})
    moved = plan(spec)[0]
    assert moved.action == "run" and f'commit: "{first}" -> "{second}"' in moved.reason
