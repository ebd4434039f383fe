"""The megatron-lm backend's ``pretrain_gpt.py`` arguments against Megatron-LM's own parser, at
each release named: the ``gpt3-7.5b-gpu`` preset rendered for that release
(``backend.megatron_lm.version``) and parsed by ``parse_args`` of that tag's
``megatron/training/arguments.py``, which refuses an argument it does not know.

    python benchmarks/megatron_lm_args.py --repo MEGATRON_LM_GIT_DIR [TAG ...]

``--repo`` is a clone of NVIDIA/Megatron-LM (bare or not); the tags default to the releases
docs/render.md lists. Only the tag's ``megatron/`` package is unpacked, into a temporary
directory, and imported on this machine's torch (CPU is enough); the few modules its import
chain needs and parsing never uses are stubbed where they are not installed (einops, setuptools'
pkg_resources, and the batch-invariant kernels that need triton). Exits non-zero unless every
tag parses.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.megatron_lm_gpu import megatron_version  # noqa: E402
from pretrain.presets import load_spec  # noqa: E402
from render.megatron_lm import pretrain_gpt_args  # noqa: E402

TAGS = ["core_v0.16.1", "core_v0.12.1", "core_r0.8.0"]
# module -> the installed module whose absence makes it needed
STUBS = {"einops": "einops", "pkg_resources": "pkg_resources",
         "megatron.core.transformer.custom_layers.batch_invariant_kernels": "triton"}


class _Anything:
    """Whatever a stubbed module is asked for: a class that accepts any call and decorates as identity."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) else self


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Anything,), {})


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: list[str]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if any(name == stub or name.startswith(f"{stub}.") for stub in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def parse(args_file: str) -> None:
    """In the child, with the tag's megatron/ first on sys.path: parse the arguments or exit 2."""
    missing = [name for name, needs in STUBS.items() if importlib.util.find_spec(needs) is None]
    sys.meta_path.insert(0, _Stubs(missing))
    sys.argv = ["pretrain_gpt.py", *json.loads(Path(args_file).read_text())]
    from megatron.training.arguments import parse_args

    parse_args()  # argparse exits 2 naming an argument it does not know


def unpack(repo: str, tag: str, into: Path) -> None:
    archive = subprocess.run(["git", "--git-dir", repo, "archive", f"refs/tags/{tag}", "megatron"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def check(repo: str, tag: str) -> bool:
    with tempfile.TemporaryDirectory(prefix=f"megatron-{tag}-") as tmp:
        unpack(repo, tag, Path(tmp))
        version = megatron_version(Path(tmp))
        # with a checkpoint to start from, so that --pretrained-checkpoint is parsed too
        args = pretrain_gpt_args(load_spec("gpt3-7.5b-gpu", [f"backend.megatron_lm.version={version}",
                                                             "model.init_from=/fsx/megatron-gpt3-7.5b"]),
                                 "/fsx/data/oscar_text_document", "/fsx/checkpoints")
        (Path(tmp) / "args.json").write_text(json.dumps(args))
        done = subprocess.run([sys.executable, __file__, "--parse", str(Path(tmp) / "args.json")], check=False,
                              env={**os.environ, "PYTHONPATH": tmp}, capture_output=True, text=True)
    error = [line for line in done.stderr.splitlines() if "error:" in line or "Error" in line]
    print(f"{tag} (Megatron-LM {version}): {len(args)} arguments, "
          + ("parsed" if done.returncode == 0 else f"refused: {error[-1] if error else done.stderr[-500:]}"))
    return done.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", help="NVIDIA/Megatron-LM git directory")
    parser.add_argument("--parse", help=argparse.SUPPRESS)  # the child's mode
    parser.add_argument("tags", nargs="*", default=TAGS)
    options = parser.parse_args()
    if options.parse:
        parse(options.parse)
        return
    if not options.repo:
        parser.error("--repo is required")
    results = [check(options.repo, tag) for tag in options.tags]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
