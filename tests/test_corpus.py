"""The demo's corpus, the standard library's docstrings: parsed once per machine and kept, so
every later process (the demo's tokenizer, each test worker) reads it instead of parsing ~2,000
files again; a changed source file or interpreter is parsed afresh."""

from __future__ import annotations

import os

import pytest

from pretrain import corpus

pytestmark = pytest.mark.pure

DOC = '"""{} docstring, long enough to be kept in the corpus."""\n'


@pytest.fixture
def sources(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = []
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text(DOC.format(f"Module {name}'s"))
        files.append((tmp_path, tmp_path / f"{name}.py"))
    return files


def test_the_kept_corpus_is_what_parsing_gives_and_is_read_back(sources, tmp_path):
    first = corpus._kept_documents(sources)
    assert first == tuple(corpus._parse(sources)) and [d["source"] for d in first] == ["a.py", "b.py"]
    [kept] = (tmp_path / "cache" / "pretrain-pipeline").glob("stdlib-corpus-*.jsonl")
    kept.write_text(kept.read_text().replace("Module a's", "Kept", 1))  # a later process reads the copy
    assert corpus._kept_documents(sources)[0]["text"].startswith("Kept docstring")


def test_a_changed_source_file_is_parsed_afresh(sources):
    key = corpus._cache_path(sources)
    assert corpus._cache_path(sources) == key and corpus._cache_path(sources[:1]) != key
    stat = sources[0][1].stat()
    os.utime(sources[0][1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert corpus._cache_path(sources) != key
    sources[1][1].write_text(DOC.format("An edited"))
    assert corpus._kept_documents(sources)[1]["text"].startswith("An edited docstring")

