"""The chaos soak: the tiny preset trained across the local Slurm nodes for a fixed wall time
while faults strike at random intervals (issue 25, section 3).

    PYTHONPATH=. .venv/bin/python benchmarks/chaos_soak.py [--minutes 30] [--fault-every-s 180]
        [--seed 0] [--nodes 3] [--faults rank,slurmd,...] [--steps 1000] [--record FILE]

Runs as root (the stack's daemons, network namespaces, a tmpfs). It starts a stack of its own
(`pretrain stack up --nodes 3`: Slurm with one slurmd per network namespace, the S3 server and
a Prefect server) on ``--base-port`` (default 8317) under ``--dir``, apart from the main stack
and the suite's, deploys `pretrain/tiny-local` from deployments/prefect.yaml and starts a process
worker, as a head node runs them. Every flow run is triggered like a user's (`run_deployment`)
and goes through that server and worker, so their faults are real ones. Each flow run trains the
tiny-local model (4 layers, hidden 128) for ``--steps`` steps, one CPU rank per node, micro-batches
of 2 and a global batch of 12 so that the run may go on with 2 nodes or 1 after losing nodes
(``cluster.min_nodes=1``). ``paths.root`` is a tmpfs, so that the disk can fill.

1. Set-up: the corpus on the S3 server, the tokenizer, a flow run that fetches and tokenizes.
2. The baseline: one flow run, uninterrupted.
3. The soak: flow runs of the same spec and seed, one after another, for ``--minutes``, while the
   injector strikes at intervals drawn from ``--seed`` (uniform between a half and one and a half
   ``--fault-every-s``), the kinds in a seeded random order, each once before any repeats. The
   defaults strike about nine faults in 30 minutes, three minutes apart on average, and a flow
   run of 1000 steps spans a few of them, as a production run spans many: its start (the flow,
   the job, the ranks' imports: about 25 s here) is paid once a run, not once a fault.

   - ``rank``: one trainer rank SIGKILLed, on a node of the running job;
   - ``slurmd``: a node's slurmd SIGKILLed; once Slurm marks it down it is started again (a
     rebooted node), and the run goes on without it until the run ends;
   - ``scancel``: the training job cancelled; ``requeue``: ``scontrol requeue`` of it;
   - ``worker``: the Prefect worker SIGKILLed and a new one started;
   - ``server``: the Prefect server stopped and started again;
   - ``slurmctld``: the controller stopped and started again;
   - ``s3``: the S3 server stopped as the next flow run starts, so that its fetch meets it down,
     and started again 20 s later, its objects put back (moto keeps them in memory only);
   - ``disk``: the tmpfs filled, after a checkpoint, to half a checkpoint short of full, so that
     the next checkpoint finds no room; the filler is deleted once that training job has ended.

   Every fault but ``s3`` waits for a training job that runs and logs steps, so that it strikes
   training; ``s3`` is struck as the next flow run starts, while the injector goes on with the
   next kinds. No fault starts after ``--minutes``; the flow run then in flight finishes.
4. The table (pretrain/goodput.py): goodput (useful step time over wall time, against the
   baseline's), the time from each fault to the next step, the steps lost, recomputed and
   duplicated, each run's end state and its loss against the baseline's step by step.
   ``--record`` keeps what the table is computed from.

The stack is stopped and the tmpfs unmounted at the end unless ``--keep-stack``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deployments import stack  # noqa: E402  (the repository on the path first)
from deployments.stack import nodes as stack_nodes  # noqa: E402
from deployments.stack.processes import alive  # noqa: E402
from jobs.nodes import expand_nodes  # noqa: E402
from pretrain.goodput import table  # noqa: E402
from pretrain.metrics_records import events, metrics_records, step_records  # noqa: E402
from trainer.train.checkpoint import complete_steps, step_dir  # noqa: E402

KINDS = ("rank", "slurmd", "scancel", "requeue", "worker", "server", "slurmctld", "s3", "disk")
NAME = "chaos-soak"  # the spec's name: the training jobs are chaos-soak-train
JOB = f"{NAME}-train"
DEPLOYMENT = "pretrain/tiny-local"
POOL = "pretrain"  # the work pool deployments/prefect.yaml names
PREFECT = str(Path(sys.executable).with_name("prefect"))
S3_DOWN_S = 20


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def cli(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run([PREFECT, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"prefect {' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


class Soak:
    """The stack, the worker and the flow runs of one soak."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dir = Path(args.dir)
        self.root = self.dir / "root"  # paths.root, a tmpfs
        self.worker: subprocess.Popen | None = None

    # ------------------------------------------------------------------ set-up

    def up(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(exist_ok=True)
        if not os.path.ismount(self.root):
            # The nodes see the mounts their slurmd found when it started (the machine's root mount
            # is private here): a slurmd started before the tmpfs is restarted.
            stack.down(self.dir, ("slurm",))
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.args.tmpfs_mb}m", "tmpfs", str(self.root)],
                           check=True)
        shutil.rmtree(self.root / "train", ignore_errors=True)  # an earlier soak's runs
        stack.up(self.dir, base_port=self.args.base_port, nodes=self.args.nodes)
        env = stack.environment(self.dir)
        # one thread per rank: the launch sets it from cluster.cpus_per_task=1 (render/native.py)
        self.env = {**os.environ, **env, "PREFECT_HOME": str(self.dir / "prefect-home"), "PYTHONPATH": str(ROOT)}
        os.environ.update({k: self.env[k] for k in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_HOME",
                                                     "SLURM_CONF")})
        cli(self.env, "work-pool", "create", POOL, "--type", "process", "--overwrite")
        cli(self.env, "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--name", "tiny-local")
        from deployments.demo import save_credentials_block, seed_corpus
        from pretrain.corpus import corpus_texts
        from pretrain.toy_tokenizers import llama3_style

        seed_corpus(env["PRETRAIN_S3_ENDPOINT"])
        save_credentials_block(env["PRETRAIN_S3_ENDPOINT"])
        self.tokenizer = self.dir / "tokenizer"
        if not (self.tokenizer / "tokenizer.json").exists():
            llama3_style(self.tokenizer, corpus_texts())
        self.start_worker()

    def start_worker(self) -> None:
        env = {**self.env, "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "2"}
        with open(self.dir / "worker.log", "a") as out:
            self.worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", POOL], cwd=ROOT, env=env,
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def down(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.worker.pid, signal.SIGKILL)
        if self.args.keep_stack:
            return
        stack.down(self.dir)
        subprocess.run(["umount", str(self.root)], check=False)

    # ------------------------------------------------------------------ flow runs

    def overrides(self) -> list[str]:
        a = self.args
        return [f"name={NAME}", f"paths.root={self.root}", f"tokenizer.path={self.tokenizer}",
                "cluster.executor=slurm", f"cluster.nodes={a.nodes}", "cluster.min_nodes=1",
                "cluster.devices_per_node=1", "cluster.cpus_per_task=1", "training.micro_batch_size=2",
                # micro-batches of 2 that every node count from nodes down to 1 (min_nodes) divides
                f"training.global_batch_size={2 * math.lcm(*range(1, a.nodes + 1))}",
                f"training.train_steps={a.steps}", f"training.checkpoint_interval={a.checkpoint_interval}",
                "training.eval_iters=0", f"training.seed={a.seed}", "backend.native.compile=false",
                "backend.native.export_hf=false", "backend.native.max_attempts_without_checkpoint=30",
                # each flow run of the soak is a run of its own, not the next job of the previous one's
                "training.continue_run=false"]

    def trigger(self, stages: list[str] | None = None) -> str:
        from prefect.deployments import run_deployment

        parameters: dict[str, Any] = {"overrides": self.overrides()}
        if stages:
            parameters["stages"] = stages
        for _ in range(90):
            try:
                return str(run_deployment(DEPLOYMENT, parameters=parameters, timeout=0).id)
            except Exception as exc:  # the server is down for a fault: ask again
                log(f"  (no flow run created: {type(exc).__name__})")
                time.sleep(2)
        raise SystemExit(f"the Prefect server at {self.env['PREFECT_API_URL']} took no flow run for 3 minutes")

    def wait(self, run_id: str, timeout_s: float) -> tuple[str, str]:
        """The run's final state and message; a run still going after ``timeout_s`` is cancelled."""
        from prefect import get_client
        from prefect.states import Cancelling

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with get_client(sync_client=True) as client:
                    state = client.read_flow_run(run_id).state
                    if state is not None and state.is_final():
                        return state.name, state.message or ""
                    if time.monotonic() > deadline:
                        client.set_flow_run_state(run_id, Cancelling(message="the soak gave up on it"), force=True)
                        deadline = float("inf")
            except Exception as exc:  # the server is down for a fault: ask again
                log(f"  (flow run state unreadable: {type(exc).__name__})")
            time.sleep(2)


class Observer(threading.Thread):
    """Reads the running flow run's metrics stream twice a second, keeping each step record it
    sees: a step trained again after a resume shows twice, with two times, though the stream keeps
    it once."""

    FIELDS = ("step", "loss", "time", "step_time_ms")

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root = root
        self.lock = threading.Lock()
        self.current: int | str | None = None  # the flow run training now: "baseline", 0, 1, ...; None between runs
        self.paths: dict[Path, int | str | None] = {}  # each metrics stream: the run that writes it
        self.seen: dict[int | str, dict[tuple[int, float], dict]] = {}
        self.last_step_at = 0.0  # when a step last ended, by the records' own clock

    def run_dir(self) -> Path | None:
        with self.lock:
            return next((p.parent for p, run in self.paths.items() if run is not None and run == self.current), None)

    def poll(self) -> None:
        with self.lock:
            for path in (self.root / "train").glob("*/metrics.jsonl"):
                if self.current is None or self.paths.setdefault(path, self.current) != self.current:
                    continue
                try:
                    records = step_records(metrics_records(path))
                except FileNotFoundError:
                    continue  # replaced by a resume right now
                kept = self.seen.setdefault(self.current, {})
                for r in records:
                    if (r["step"], r["time"]) not in kept:
                        kept[r["step"], r["time"]] = {k: r[k] for k in self.FIELDS}
                        self.last_step_at = max(self.last_step_at, r["time"])

    def run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                self.poll()
            time.sleep(0.5)

    def begin(self, run: int | str) -> None:
        with self.lock:
            self.current = run

    def finish(self) -> tuple[list[dict], list[dict], list[dict]]:
        """What the run now ending left: every step record seen, its final stream and the trainer's
        resumes (the step and the data-parallel size of each); its checkpoints are deleted (the
        tmpfs is small)."""
        self.poll()
        with self.lock:
            seen = sorted(self.seen.get(self.current, {}).values(), key=lambda r: r["time"])
            final: list[dict] = []
            resumed: list[dict] = []
            for path in [p for p, run in self.paths.items() if run == self.current]:
                records = metrics_records(path)
                final = [{k: r[k] for k in self.FIELDS} for r in step_records(records)]
                resumed = [{"from_step": r["from_step"], "data_parallel": r["data_parallel"]}
                           for r in events(records, "resumed")]
                shutil.rmtree(path.parent / "checkpoints", ignore_errors=True)
            self.current = None
            return seen, final, resumed


class Injector(threading.Thread):
    """Strikes the faults, one at a time, at seeded random intervals, until ``deadline``."""

    def __init__(self, soak: Soak, observer: Observer, kinds: list[str], every_s: float, seed: int, deadline: float):
        super().__init__(daemon=True)
        self.soak, self.observer, self.every_s, self.deadline = soak, observer, every_s, deadline
        self.rng = random.Random(seed)
        self.kinds = kinds
        self.faults: list[dict[str, Any]] = []
        self.s3_due = threading.Event()  # the main loop strikes it as the next flow run starts
        self.errors: list[str] = []

    def order(self):
        while True:
            kinds = list(self.kinds)
            self.rng.shuffle(kinds)
            yield from kinds

    def run(self) -> None:
        try:
            for kind in self.order():
                due = time.time() + self.rng.uniform(0.5, 1.5) * self.every_s
                while time.time() < min(due, self.deadline):
                    time.sleep(1)
                if time.time() >= self.deadline:
                    return
                log(f"fault due: {kind}")
                if kind == "s3":
                    self.s3_due.set()
                    continue
                try:
                    getattr(self, f"strike_{kind}")()
                except Exception as exc:  # a fault that could not be struck: say so, go on with the next
                    self.errors.append(f"{kind}: {exc!r}")
                    log(f"  the {kind} fault failed: {exc!r}")
        except BaseException as exc:  # reported by the main loop
            self.errors.append(f"the injector stopped: {exc!r}")

    def record(self, kind: str, detail: str, moment: float | None = None) -> None:
        self.faults.append({"kind": kind, "time": moment or time.time(), "run": self.observer.current,
                            "detail": detail})
        log(f"FAULT {kind}: {detail}")

    # ---------------------------------------------------------------- the training job

    def training(self) -> tuple[str, list[str]] | None:
        """Wait for a training job that runs and logs steps: its id and nodes; None at the deadline."""
        from jobs.slurm import query_slurm_state, queued

        while time.time() < self.deadline:
            with contextlib.suppress(subprocess.SubprocessError):
                running = [line.split()[0] for line in queued(JOB) if line.endswith("RUNNING")]
                if running and time.time() - self.observer.last_step_at < 5:
                    record = query_slurm_state(running[0])
                    if record is not None and record.nodes:
                        return running[0], expand_nodes(record.nodes)
            time.sleep(0.5)
        return None

    def strike_rank(self) -> None:
        if (job := self.training()) is None:
            return
        job_id, nodes = job
        node = self.rng.choice(nodes)
        network = stack_nodes.NodeNetwork(self.soak.args.base_port, self.soak.args.nodes, Path("/dev/null"))
        pids = subprocess.run(["ip", "netns", "pids", network.namespace(node)], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"trainer" in argv and b"train" in argv and b"torch.distributed.run" not in argv:
                    os.kill(int(pid), signal.SIGKILL)
                    self.record("rank", f"job {job_id}: the rank on {node} (pid {pid}) SIGKILLed")
                    return
        log(f"  no trainer rank found on {node}; fault skipped")

    def strike_slurmd(self) -> None:
        if (job := self.training()) is None:
            return
        job_id, nodes = job
        node = self.rng.choice(nodes)
        os.kill(stack.status(self.soak.dir)["slurm"][f"slurmd@{node}"], signal.SIGKILL)
        self.record("slurmd", f"job {job_id}: slurmd of {node} SIGKILLed")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not self.node_down(node):
            time.sleep(1)
        stack.up(self.soak.dir, ("slurm",))  # the node reboots: its slurmd starts afresh
        log(f"  {node}'s slurmd started again")

    @staticmethod
    def node_down(node: str) -> bool:
        out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True).stdout
        return out.strip().startswith("down")

    def strike_scancel(self) -> None:
        if (job := self.training()) is not None:
            subprocess.run(["scancel", job[0]], check=True)
            self.record("scancel", f"job {job[0]} cancelled")

    def strike_requeue(self) -> None:
        if (job := self.training()) is not None:
            subprocess.run(["scontrol", "requeue", job[0]], check=True)
            self.record("requeue", f"job {job[0]} requeued")

    def strike_disk(self) -> None:
        """Once the running job has saved a checkpoint, fill the tmpfs to half a checkpoint short
        of full, so that its next checkpoint finds no room; delete the filler once the job ends."""
        while True:
            if (job := self.training()) is None:
                return
            run_dir = self.observer.run_dir()
            if run_dir is not None and (done := complete_steps(run_dir / "checkpoints")):
                break
            time.sleep(1)
        size = sum(f.stat().st_size for f in step_dir(run_dir / "checkpoints", done[-1]).rglob("*") if f.is_file())
        filler = self.soak.root / "filler"
        disk = os.statvfs(self.soak.root)
        room = disk.f_bavail * disk.f_frsize - size // 2
        with open(filler, "wb") as out:
            os.posix_fallocate(out.fileno(), 0, max(room, 1))
        self.record("disk", f"job {job[0]}: {room / 2**20:.0f} MiB filled after checkpoint {done[-1]}, "
                            f"{size // 2 / 2**20:.0f} MiB left (a checkpoint takes {size / 2**20:.0f} MiB)")
        from jobs.slurm import queue_state

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and queue_state(job[0]) is not None:
            time.sleep(1)
        filler.unlink()
        log("  filler deleted")

    # ---------------------------------------------------------------- the control plane

    def strike_worker(self) -> None:
        if self.training() is None:
            return
        worker = self.soak.worker
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone: its flow processes live on
        worker.wait()
        self.record("worker", f"worker pid {worker.pid} SIGKILLed")
        self.soak.start_worker()

    def strike_server(self) -> None:
        if self.training() is None:
            return
        self.record("server", "Prefect server stopped")
        stack.down(self.soak.dir, ("prefect",))
        stack.up(self.soak.dir, ("prefect",))
        log("  Prefect server up again")

    def strike_slurmctld(self) -> None:
        if self.training() is None:
            return
        pid = stack.status(self.soak.dir)["slurm"]["slurmctld"]
        os.kill(pid, signal.SIGTERM)
        self.record("slurmctld", f"slurmctld pid {pid} stopped")
        while alive(pid):
            time.sleep(0.2)
        stack.up(self.soak.dir, ("slurm",))
        log("  slurmctld up again")

    def strike_s3(self) -> None:
        """Called by the main loop as it starts the next flow run. The stack's S3 server (moto)
        keeps its objects in memory only, so they are put back as it starts again, as a real
        service keeps them through an outage."""
        import boto3

        endpoint = self.soak.env["PRETRAIN_S3_ENDPOINT"]
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="soak",
                          aws_secret_access_key="soak")
        kept = {(b["Name"], o["Key"]): s3.get_object(Bucket=b["Name"], Key=o["Key"])["Body"].read()
                for b in s3.list_buckets()["Buckets"]
                for o in s3.list_objects_v2(Bucket=b["Name"]).get("Contents", [])}
        stack.down(self.soak.dir, ("s3",))
        self.record("s3", f"S3 server stopped as the flow run starts, for {S3_DOWN_S} s")

        def restart() -> None:
            time.sleep(S3_DOWN_S)
            stack.up(self.soak.dir, ("s3",))
            for bucket in {bucket for bucket, _ in kept}:
                s3.create_bucket(Bucket=bucket)
            for (bucket, key), body in kept.items():
                s3.put_object(Bucket=bucket, Key=key, Body=body)
            log("  S3 server up again, its objects put back")

        threading.Thread(target=restart, daemon=True).start()
        self.s3_due.clear()


def flow_run(soak: Soak, observer: Observer, run: int | str, timeout_s: float,
             before: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Trigger one flow run and follow it to its end."""
    observer.begin(run)
    started = time.time()
    before()
    run_id = soak.trigger()
    state, message = soak.wait(run_id, timeout_s)
    ended = time.time()
    seen, final, resumed = observer.finish()
    why = f": {message.splitlines()[0]}" if message and state != "Completed" else ""
    log(f"run {run}: {state} in {(ended - started) / 60:.1f} min, {len(final)} steps{why}")
    return {"flow_run": run_id, "state": state, "message": message, "started": started, "ended": ended,
            "seen": seen, "final": final, "resumed": resumed, "data_parallel": soak.args.nodes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30, help="how long faults strike (default 30)")
    parser.add_argument("--fault-every-s", type=float, default=180, help="mean interval between faults (default 180)")
    parser.add_argument("--seed", type=int, default=0, help="of the fault schedule and of training (default 0)")
    parser.add_argument("--nodes", type=int, default=3, choices=[2, 3, 4], help="Slurm nodes (default 3)")
    parser.add_argument("--faults", default=",".join(KINDS), help=f"a subset of {','.join(KINDS)} (default: all)")
    parser.add_argument("--steps", type=int, default=1000, help="steps of each flow run (default 1000)")
    parser.add_argument("--checkpoint-interval", type=int, default=20, help="steps between checkpoints (default 20)")
    parser.add_argument("--base-port", type=int, default=8317, help="the soak stack's first port (default 8317)")
    parser.add_argument("--dir", default="/tmp/chaos-soak", help="the soak stack's directory (default /tmp/chaos-soak)")
    parser.add_argument("--tmpfs-mb", type=int, default=1024, help="size of the tmpfs paths.root is on (default 1024)")
    parser.add_argument("--record", help="write what the table is computed from to this JSON file")
    parser.add_argument("--keep-stack", action="store_true", help="leave the stack running afterwards")
    args = parser.parse_args(argv)
    kinds = args.faults.split(",")
    if unknown := sorted(set(kinds) - set(KINDS)):
        parser.error(f"--faults: unknown {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    if os.geteuid() != 0:
        parser.error("run as root: the stack's daemons, network namespaces and the tmpfs need it")

    # SIGTERM unwinds like Ctrl-C: the worker stopped, the stack down, the tmpfs unmounted
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    soak = Soak(args)
    observer = Observer(soak.root)
    try:
        log(f"stack on base port {args.base_port} with {args.nodes} nodes, under {args.dir}")
        soak.up()
        observer.start()
        log("set-up: fetch and tokenize")
        state, message = soak.wait(soak.trigger(["fetch", "tokenize"]), 900)
        if state != "Completed":
            raise SystemExit(f"the set-up flow run ended {state}: {message}")
        log("the uninterrupted run")
        baseline = flow_run(soak, observer, "baseline", 1800)
        if baseline["state"] != "Completed":
            raise SystemExit(f"the uninterrupted run ended {baseline['state']}: {baseline['message']}")
        started = time.time()
        deadline = started + args.minutes * 60
        injector = Injector(soak, observer, kinds, args.fault_every_s, args.seed, deadline)
        injector.start()
        runs: list[dict[str, Any]] = []
        while time.time() < deadline:
            def before() -> None:
                if injector.s3_due.is_set():
                    injector.strike_s3()
            # a run may take several times the uninterrupted one's time; never forever
            runs.append(flow_run(soak, observer, len(runs), 4 * (baseline["ended"] - baseline["started"]) + 600,
                                 before))
        injector.join(timeout=300)
        for error in injector.errors:
            log(f"injector: {error}")
        record = {"steps": args.steps, "started": started, "ended": time.time(), "baseline": baseline,
                  "runs": runs, "faults": injector.faults, "injector_errors": injector.errors,
                  "load_average_at_end": os.getloadavg(),
                  "command": " ".join(["benchmarks/chaos_soak.py", *(argv if argv is not None else sys.argv[1:])])}
        if args.record:
            Path(args.record).write_text(json.dumps(record) + "\n")
        print()
        print(table(record))
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"\nthe machine's load average at the end (1, 5, 15 min): {load} on {os.cpu_count()} CPUs")
        return 0
    finally:
        soak.down()


if __name__ == "__main__":
    sys.exit(main())
