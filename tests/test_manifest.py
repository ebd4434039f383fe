"""Stage outputs are done only when their manifest validates; a failed stage leaves nothing
that looks complete."""

from __future__ import annotations

import pytest

from pretrain import manifest

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it


def test_staged_output_is_renamed_into_place_with_its_manifest(tmp_path):
    key = manifest.stable_hash({"a": 1})
    final = manifest.output_dir(tmp_path, "tokenize", key)
    with manifest.staged_output(final) as staging:
        (staging / "data.bin").write_bytes(b"1234")
        manifest.write_manifest(staging, "tokenize", {"a": 1}, documents=1)
    assert not manifest.staging_dir(final).exists()
    meta = manifest.load_valid(final, key, deep=True)
    assert meta["files"]["data.bin"]["bytes"] == 4 and meta["documents"] == 1
    assert meta["key_inputs"] == {"a": 1}
    assert meta["code_version"]  # provenance, not part of the key


def test_failure_inside_a_stage_leaves_no_final_output(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(ValueError):
        with manifest.staged_output(final) as staging:
            (staging / "data.bin").write_bytes(b"12")
            raise ValueError("disk full")
    assert not final.exists()
    assert (manifest.staging_dir(final) / "data.bin").exists()  # kept for a resumed attempt


def test_a_stage_that_writes_no_manifest_is_not_done(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError, match="without writing MANIFEST.json"):
        with manifest.staged_output(final):
            pass
    assert not final.exists()


def test_validation_catches_truncation_corruption_and_other_keys(tmp_path):
    with manifest.staged_output(tmp_path / "out") as staging:
        (staging / "x").write_bytes(b"abcdef")
        manifest.write_manifest(staging, "fetch", {"k": 1})
    out = tmp_path / "out"
    k1, k2 = manifest.stable_hash({"k": 1}), manifest.stable_hash({"k": 2})
    assert manifest.load_valid(out, k1) is not None
    assert manifest.load_valid(out, k2) is None
    (out / "x").write_bytes(b"abcdeX")  # same size, other bytes
    assert manifest.load_valid(out, k1) is not None
    assert manifest.load_valid(out, k1, deep=True) is None
    (out / "x").write_bytes(b"abc")
    assert manifest.load_valid(out, k1) is None


def test_stable_hash_ignores_key_order_only():
    assert manifest.stable_hash({"a": 1, "b": 2}) == manifest.stable_hash({"b": 2, "a": 1})
    assert manifest.stable_hash({"a": 1}) != manifest.stable_hash({"a": 2})


def test_the_newest_output_and_what_changed_since(tmp_path):
    for inputs in ({"format": 1, "tokenizer": {"--tokenizer-model": "aaa"}, "data.json_keys": ["text"]},
                   {"format": 1, "tokenizer": {"--tokenizer-model": "bbb"}, "data.json_keys": ["text"]}):
        with manifest.staged_output(manifest.output_dir(tmp_path, "tokenize", manifest.stable_hash(inputs))) as s:
            manifest.write_manifest(s, "tokenize", inputs)
    newest = manifest.newest_output(tmp_path, "tokenize")
    assert newest["key_inputs"]["tokenizer"] == {"--tokenizer-model": "bbb"}
    assert manifest.newest_output(tmp_path, "convert") is None
    now = {"format": 2, "tokenizer": {"--tokenizer-model": "bbb"}, "data.json_keys": ["text", "title"]}
    assert manifest.changed_inputs(newest["key_inputs"], now) == [
        'data.json_keys: ["text"] -> ["text", "title"]', "format: 1 -> 2"]
    assert manifest.changed_inputs(now, now) == []


def test_cached_output_builds_once_then_hands_on_and_a_stage_left_out_names_what_to_add(tmp_path):
    """The one caching sequence every stage uses: a second run with the same key inputs builds
    nothing; other inputs build anew; a stage left out of the run never builds."""
    built: list[str] = []

    def build(staging):
        built.append(staging.name)
        (staging / "out.txt").write_text("tokens")
        return {"documents": 3}

    first = manifest.cached_output(tmp_path, "tokenize", {"corpus": "a"}, build)
    assert not first.cached and first.manifest["documents"] == 3
    assert (first.directory / "out.txt").read_text() == "tokens" and len(built) == 1
    again = manifest.cached_output(tmp_path, "tokenize", {"corpus": "a"}, build)
    assert again.cached and again.directory == first.directory and len(built) == 1
    assert manifest.existing_output(tmp_path, "tokenize", {"corpus": "a"}).manifest == first.manifest
    with pytest.raises(manifest.MissingOutput, match="add 'fetch' to the flow's stages"):
        manifest.cached_output(tmp_path, "hub", {"repo": "b"}, build, reuse_only=True, asked_as="fetch")
    assert len(built) == 1
    other = manifest.cached_output(tmp_path, "tokenize", {"corpus": "b"}, build)
    assert not other.cached and other.directory != first.directory and len(built) == 2
