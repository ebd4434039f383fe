"""The local stack owned by the project: `pretrain stack up|down|status|reset|env`.

A real Slurm cluster with accounting (one node, or several in network namespaces), an S3-compatible server and a Prefect server,
all configured and kept under one directory (``$PRETRAIN_STACK_DIR``, default
``~/.pretrain/stack``). ``up`` is idempotent and safe after a crash; ``down`` stops only the
processes the stack started, by the pids it recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import tempfile
from pathlib import Path

from deployments.stack import prefect_server, s3, slurm
from deployments.stack.processes import StackError

ALL = ("slurm", "s3", "prefect")
DEFAULT_BASE_PORT = 6817  # Slurm's own default controller port
# Which stack directory holds each base port on this machine: a link per port, named after it.
CLAIMS = Path(tempfile.gettempdir()) / "pretrain-stack-ports"

__all__ = ["ALL", "StackError", "api_settings", "down", "environment", "main", "reset", "status", "up"]


def stack_dir(path: str | Path | None = None) -> Path:
    return Path(path or os.environ.get("PRETRAIN_STACK_DIR", "~/.pretrain/stack")).expanduser()


def _ports(base: int) -> dict[str, int]:
    return {"slurmctld": base, "slurmd": base + 1, "slurmdbd": base + 2, "mariadb": base + 3,
            "s3": base + 4, "prefect": 4200 + base - DEFAULT_BASE_PORT}


def _config(root: Path, base_port: int | None, nodes: int | None = None) -> dict:
    """The stack's ports and node count, fixed at its first start so every later command finds
    it again; ``up --nodes N`` changes the count."""
    path = root / "stack.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    base = base_port or old.get("base_port", DEFAULT_BASE_PORT)
    count = old.get("nodes", 1) if nodes is None else nodes
    if count < 1:
        raise StackError(f"--nodes {count}: a cluster has at least one node")
    auth = old.get("env", {}).get("PREFECT_API_AUTH_STRING")
    if old.get("base_port") == base and old.get("nodes", 1) == count and auth:
        return old
    ports = _ports(base)
    config = {
        "base_port": base, "ports": ports, "nodes": count,
        "env": {"SLURM_CONF": str(root / "slurm" / "etc" / "slurm.conf"),
                "PRETRAIN_S3_ENDPOINT": f"http://127.0.0.1:{ports['s3']}",
                "PREFECT_API_URL": f"http://127.0.0.1:{ports['prefect']}/api",
                # The Prefect server takes only clients that send this (basic authentication,
                # prefect_server.py): made once, kept across changes of port or node count.
                "PREFECT_API_AUTH_STRING": auth or f"pretrain:{secrets.token_urlsafe(24)}"},
    }
    root.mkdir(parents=True, exist_ok=True)
    # Readable by its owner only: it holds the Prefect server's credential.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(config, indent=2) + "\n")
    os.chmod(path, 0o600)  # a stack.json written before it held the credential
    return config


def _slurm(root: Path, config: dict) -> slurm.SlurmLayout:
    return slurm.SlurmLayout(root / "slurm", config["base_port"], config.get("nodes", 1))


def _claim(root: Path, base_port: int) -> None:
    """Hold ``base_port`` for the stack in ``root``, or refuse while another stack's daemons run
    on it. Its ports, its nodes' subnet and the names of their namespaces and links all derive
    from the base port, so a second stack's ``up`` would take the first one's nodes down (it
    removes what it takes for a crashed stack's leftovers) and fail on its ports. A claim whose
    stack runs nothing any more, or holds another port now, is taken over."""
    CLAIMS.mkdir(exist_ok=True)
    claim = CLAIMS / str(base_port)
    if claim.is_symlink():
        other = Path(os.readlink(claim))
        if other != root.resolve() and (other / "stack.json").exists() \
                and _config(other, None)["base_port"] == base_port:
            running = [f"{name} {pid}" for pids in status(other).values() for name, pid in pids.items() if pid]
            if running:
                raise StackError(
                    f"base port {base_port} is held by the stack in {other} ({', '.join(running)}): its ports, "
                    f"subnet and node namespaces would be this one's too. Stop it (`pretrain stack down --dir "
                    f"{other}`) or give this stack another --base-port")
        claim.unlink()
    claim.symlink_to(root.resolve())


def up(path: str | Path | None = None, components: tuple[str, ...] = ALL,
       base_port: int | None = None, nodes: int | None = None) -> dict[str, object]:
    """Start what is not running yet; return the pids of every component. ``nodes``: the Slurm
    nodes (1, ``localhost``, unless the stack was started with more)."""
    root = stack_dir(path)
    config = _config(root, base_port, nodes)
    _claim(root, config["base_port"])
    pids: dict[str, object] = {}
    if "slurm" in components:
        pids["slurm"] = slurm.up(_slurm(root, config))
    if "s3" in components:
        pids["s3"] = s3.up(root / "s3", config["ports"]["s3"])
    if "prefect" in components:
        pids["prefect"] = prefect_server.up(root / "prefect", config["ports"]["prefect"],
                                            config["env"]["PREFECT_API_AUTH_STRING"])
    return pids


def down(path: str | Path | None = None, components: tuple[str, ...] = ALL) -> list[str]:
    """Stop (in reverse order) what the stack started; return what was stopped."""
    root = stack_dir(path)
    if not (root / "stack.json").exists():
        return []
    config = _config(root, None)
    stopped = []
    if "prefect" in components and prefect_server.down(root / "prefect"):
        stopped.append("prefect")
    if "s3" in components and s3.down(root / "s3"):
        stopped.append("s3")
    if "slurm" in components:
        stopped += slurm.down(_slurm(root, config))
    return stopped


def reset(path: str | Path | None = None, components: tuple[str, ...] = ALL) -> dict[str, object]:
    """Stop, wipe the Slurm controller state with its accounting database (together, or job-id
    reuse fools submitit), the S3 data and the Prefect database; start again."""
    root = stack_dir(path)
    config = _config(root, None)
    down(root, components)
    if "slurm" in components and slurm.installed():
        layout = _slurm(root, config)
        slurm.write_config(layout)
        slurm.drop_accounting(layout)
        slurm.down(layout)
    if "prefect" in components:
        shutil.rmtree(root / "prefect" / "prefect", ignore_errors=True)
    return up(root, components)


def status(path: str | Path | None = None) -> dict[str, dict[str, int | None]]:
    root = stack_dir(path)
    if not (root / "stack.json").exists():
        return {"slurm": dict.fromkeys(slurm.DAEMONS), "s3": {"s3": None}, "prefect": {"prefect": None}}
    config = _config(root, None)
    return {"slurm": slurm.status(_slurm(root, config)),
            "s3": {"s3": s3.status(root / "s3")},
            "prefect": {"prefect": prefect_server.status(root / "prefect")}}


def environment(path: str | Path | None = None) -> dict[str, str]:
    """SLURM_CONF, PRETRAIN_S3_ENDPOINT, PREFECT_API_URL and PREFECT_API_AUTH_STRING of the stack."""
    return dict(_config(stack_dir(path), None)["env"])


def api_settings(path: str | Path | None = None) -> dict:
    """The stack's Prefect API for ``prefect.settings.temporary_settings``: its address and credential."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

    env = environment(path)
    return {PREFECT_API_URL: env["PREFECT_API_URL"], PREFECT_API_AUTH_STRING: env["PREFECT_API_AUTH_STRING"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pretrain stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "status", "reset", "env"])
    parser.add_argument("--dir", help="stack directory (default $PRETRAIN_STACK_DIR or ~/.pretrain/stack)")
    parser.add_argument("--only", action="append", choices=ALL,
                        help="act on these components only (repeatable)")
    parser.add_argument("--base-port", type=int, help=f"first of the stack's ports (default {DEFAULT_BASE_PORT})")
    parser.add_argument("--nodes", type=int, help="Slurm nodes, each in a network namespace of its own when "
                        "more than 1 (default 1, or the count the stack was started with)")
    args = parser.parse_args(argv)
    components = tuple(args.only or ALL)
    try:
        if args.action == "up":
            up(args.dir, components, args.base_port, args.nodes)
        elif args.action == "down":
            print("stopped:", ", ".join(down(args.dir, components)) or "nothing")
            return 0
        elif args.action == "reset":
            reset(args.dir, components)
        elif args.action == "env":
            for key, value in environment(args.dir).items():
                print(f"export {key}={shlex.quote(value)}")
            return 0
    except StackError as exc:
        print(f"error: {exc}")
        return 1
    state = status(args.dir)
    env = environment(args.dir)
    where = {"slurm": env["SLURM_CONF"], "s3": env["PRETRAIN_S3_ENDPOINT"], "prefect": env["PREFECT_API_URL"]}
    for component, pids in state.items():
        line = ", ".join(f"{name} {pid or 'stopped'}" for name, pid in pids.items())
        print(f"{component:8} {'up' if all(pids.values()) else 'DOWN':5} {where[component]}  ({line})")
    wanted = [c for c in ALL if c in components]
    return 0 if all(all(state[c].values()) for c in wanted) else 1
