"""A Slurm cluster of three nodes on this machine (`pretrain stack up --nodes 3`): each slurmd in
a network namespace of its own, on a second stack (own directory, ports and subnet), so the
stack the rest of the suite uses is never disturbed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from prefect import flow

from blocks.cluster import SlurmCluster
from deployments import stack
from deployments.stack import nodes
from deployments.stack.processes import alive
from flows.pretrain import pretrain
from jobs.node import Command
from jobs.contract import JobFailed, JobRequest
from jobs.slurm import jobs_of_this_flow_run, run_job, submit, wait, wait_gone
from pretrain import manifest
from pretrain.metrics_records import events, logged_steps, metrics_records
from pretrain.presets import load_spec
from pretrain.toy_tokenizers import llama3_style
from tests.model_that_fits import MODEL_THAT_FITS
from render.dataset_files import tokenizer_paths
from render.tokenize_command import tokenize_command
from slurm_faults import Fault
from tasks.executor import excluded_after, usable_nodes
from tasks.tokenize import tokenize
from tasks.train import train
from trainer.tokenize import output_prefix
from trainer.train.checkpoint import complete_steps

REPO = Path(__file__).resolve().parents[1]
BASE_PORT = 7917  # test_stack.py's second stack is on 7817
PREFIX = nodes.name_prefix(BASE_PORT)
SUBNET = f"10.213.{BASE_PORT % 256}"
NODES = ["node1", "node2", "node3"]


@pytest.fixture(scope="module")
def second_stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes-stack")
    try:
        stack.up(root, ("slurm",), base_port=BASE_PORT, nodes=3)
        yield root
    finally:
        stack.down(root, ("slurm",))


@pytest.fixture
def three_nodes(second_stack, monkeypatch):
    """The second stack, with SLURM_CONF pointing the test's Slurm commands at it. Set per test,
    after the autouse fixtures: a server they start (the Prefect harness) must not inherit it."""
    monkeypatch.setenv("SLURM_CONF", stack.environment(second_stack)["SLURM_CONF"])
    return second_stack


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def node_table() -> dict[str, tuple[str, str, str]]:
    """Node name: (state, address, host name), as the controller sees them."""
    rows = slurm("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t %o %n").split("\n")
    return {r.split()[0]: tuple(r.split()[1:]) for r in rows if r.strip()}


def sbatch_and_wait(*argv: str, timeout_s: float = 30) -> str:
    job_id = slurm("sbatch", "--parsable", *argv).strip()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = slurm("sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id).strip()
        if state == "COMPLETED":
            return job_id
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not complete (sacct: {state!r})")


def test_up_gives_three_idle_nodes_with_their_own_addresses(three_nodes):
    table = node_table()
    assert table == {f"node{k}": ("idle", f"{SUBNET}.{k}", f"node{k}") for k in (1, 2, 3)}
    assert sorted(nodes.leftovers(PREFIX)) == sorted(
        [f"{PREFIX}-{n}" for n in NODES] + [f"{PREFIX}br"] + [f"{PREFIX}n{k}" for k in (1, 2, 3)])
    slurmds = {k: v for k, v in stack.status(three_nodes)["slurm"].items() if k.startswith("slurmd@")}
    assert sorted(slurmds) == [f"slurmd@{n}" for n in NODES] and all(slurmds.values())


def test_a_second_stack_on_the_same_base_port_is_refused_and_the_first_keeps_its_nodes(three_nodes, tmp_path):
    """Its `up` would take the running stack's namespaces for a crashed stack's leftovers."""
    before = stack.status(three_nodes)["slurm"]
    with pytest.raises(stack.StackError) as refused:
        stack.up(tmp_path / "other", ("slurm",), base_port=BASE_PORT, nodes=3)
    message = str(refused.value)
    assert f"base port {BASE_PORT} is held by the stack in {three_nodes.resolve()}" in message
    assert f"pretrain stack down --dir {three_nodes.resolve()}" in message and "another --base-port" in message
    assert stack.status(three_nodes)["slurm"] == before
    assert len(nodes.leftovers(PREFIX)) == 7  # three namespaces, the bridge, three links
    assert {state for state, _, _ in node_table().values()} == {"idle"}


def test_a_job_on_three_nodes_runs_on_three_hosts_that_share_the_data_directory(three_nodes, tmp_path):
    """Each task writes, into the shared directory, its host name, how it resolves the first
    node, and whether it reaches the controller at the head's bridge address and at 127.0.0.1
    (the node's own loopback: the S3 and Prefect servers of the head, on 127.0.0.1, are out of
    reach from a node)."""
    port = BASE_PORT  # slurmctld's
    probe = textwrap.dedent(f"""\
        import os, socket, sys
        def reach(host):
            try:
                socket.create_connection((host, {port}), timeout=2).close()
                return "reached"
            except OSError:
                return "unreachable"
        out = " ".join([socket.gethostname(), socket.gethostbyname("node1"), reach("head"), reach("127.0.0.1")])
        open(os.path.join(sys.argv[1], socket.gethostname()), "w").write(out)
    """)
    (tmp_path / "probe.py").write_text(probe)
    script = f"srun hostname > {tmp_path}/hostnames && srun python3 {tmp_path}/probe.py {tmp_path}"
    sbatch_and_wait("-N", "3", "-o", str(tmp_path / "log"), "--wrap", script)
    assert sorted((tmp_path / "hostnames").read_text().split()) == NODES
    for node in NODES:
        assert (tmp_path / node).read_text().split() == [node, f"{SUBNET}.1", "reached", "unreachable"]


ALL_REDUCE = textwrap.dedent("""\
    import os, socket, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(total)
    with open(os.path.join(sys.argv[1], str(dist.get_rank())), "w") as out:
        out.write(f"{socket.gethostname()} {dist.get_world_size()} {os.environ['MASTER_ADDR']} {total.item():.0f}")
    dist.destroy_process_group()
""")


def test_torchrun_across_three_nodes_all_reduces_over_gloo(three_nodes, tmp_path):
    """torchrun on each node of a Slurm allocation, from the job layer: one rank per node, the
    master address the first node's name, a static rendezvous on it, gloo over the bridge."""
    (tmp_path / "all_reduce.py").write_text(ALL_REDUCE)
    torchrun = Command([sys.executable, "-m", "torch.distributed.run", "--nnodes", "$NNODES", "--node_rank", "$NODE_RANK",
                        "--nproc_per_node", "1", "--master_addr", "$MASTER_ADDR", "--master_port", "$MASTER_PORT",
                        "--max_restarts", "0", str(tmp_path / "all_reduce.py"), str(tmp_path)])
    results = run_job(JobRequest("all-reduce", torchrun, time_limit_min=3, nodes=3), SlurmCluster(executor="slurm"),
                      tmp_path, poll_s=0.5)
    assert results == [0, 0, 0]
    ranks = {rank: (tmp_path / str(rank)).read_text().split() for rank in range(3)}
    assert ranks == {0: ["node1", "3", "node1", "6"], 1: ["node2", "3", "node1", "6"], 2: ["node3", "3", "node1", "6"]}


def test_a_node_lost_mid_job_is_marked_down_and_named_by_the_failure(three_nodes, tmp_path):
    """node3's slurmd killed under a running 3-node job: Slurm marks node3 down (SlurmdTimeout,
    10 s here), the job ends NODE_FAIL, and the failure names node3 as the node lost, the one
    node the next attempt leaves out. `up` brings node3 back."""
    job = submit(JobRequest("lost-node", Command(["sleep", "300"]), time_limit_min=6, nodes=3),
                 SlurmCluster(executor="slurm"), tmp_path)
    deadline = time.monotonic() + 60

    def ranks_running() -> int:  # the job's step runs on every node once each rank's log says so
        logs = Path(job.paths.folder).glob(f"{job.job_id}_*_log.out")
        return sum("$ sleep 300" in log.read_text() for log in logs)

    while ranks_running() < 3:  # RUNNING is the allocation: srun may still be launching on node3
        assert time.monotonic() < deadline, f"job {job.job_id} did not start on the three nodes"
        time.sleep(0.3)
    os.kill(stack.status(three_nodes)["slurm"]["slurmd@node3"], signal.SIGKILL)
    try:
        with pytest.raises(JobFailed) as failed:
            wait(job, "lost-node", poll_s=1, max_wait_s=90)
        assert failed.value.state == "NODE_FAIL" and "lost node node3" in str(failed.value)
        # Slurm would queue the job again, lost node and all; the job layer cancelled it as it ended
        assert wait_gone(job, timeout_s=30)
        assert node_table()["node3"][0] == "down*"
        assert excluded_after(failed.value, SlurmCluster(executor="slurm")) == {"node3"}
    finally:  # node3 back for the module's next tests, whatever this one found
        stack.up(three_nodes, ("slurm",))
    assert {state for state, _, _ in node_table().values()} <= {"idle", "mix"}


STEPS, INTERVAL = 30, 10
LOSS_SPEC = ["name=node-loss", "cluster.executor=slurm", "cluster.nodes=3", "cluster.min_nodes=2",
             "cluster.devices_per_node=1", "cluster.cpus_per_task=1", "model.num_layers=2",
             "training.micro_batch_size=2", "training.global_batch_size=12", f"training.train_steps={STEPS}",
             f"training.checkpoint_interval={INTERVAL}", "training.eval_iters=0", "cluster.time_limit_min=10",
             "backend.native.compile=false", "backend.native.export_hf=false"]


@flow
def train_on_nodes(overrides: list[str], dataset: str, data_dir: str) -> dict:
    return train(load_spec("tiny-local", overrides), dataset, data_dir)


def corpus(directory: Path) -> list[str]:
    """This repository's documentation, one document per page (140 kB of English): text already on
    the machine, as the demo corpus is, without its 8 CPU-seconds of parsing the standard library."""
    texts = [page.read_text() for page in sorted((REPO / "docs").glob("*.md"))]
    with open(directory / "corpus.jsonl", "w") as jsonl:
        jsonl.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    return texts


def tokenized(spec, directory: Path) -> str:
    """The tokenize node program, run by hand on the corpus: the dataset's prefix."""
    argv = tokenize_command(spec, [str(directory / "corpus.jsonl")], str(directory / "corpus"),
                            {flag: str(path) for flag, path in tokenizer_paths(spec, directory).items()},
                            python=sys.executable)
    subprocess.run(argv, check=True, capture_output=True)
    return output_prefix(str(directory / "corpus"), "text")


def test_a_node_lost_mid_training_the_run_goes_on_with_the_nodes_left(three_nodes, tmp_path,
                                                                       clean_queue):
    """The train task in a flow, one rank per node on the three nodes (gloo over the bridge), loses
    node3 mid-run: its link is cut, as a dead switch port or NIC would cut it, so node3 falls
    silent and the other ranks wait for it in the step's all-reduce. Slurm marks node3 down
    (SlurmdTimeout), the job ends NODE_FAIL naming it, and the resubmission leaves node3 out and,
    cluster.min_nodes=2 allowing it, goes on with node1 and node2 rather than wait for a third:
    two data-parallel ranks accumulating three micro-batches of 2 where three ranks took two,
    resumed from the checkpoint that was newest and complete when node3 was lost (DCP reshards
    it), the global batch and the order of samples unchanged, every step in the stream once."""
    clean_queue.append("node-loss-train")
    tokenizer = llama3_style(tmp_path / "tokenizer", corpus(tmp_path))
    overrides = [*LOSS_SPEC, f"paths.root={tmp_path}", f"tokenizer.path={tokenizer}"]
    dataset = tokenized(load_spec("tiny-local", overrides), tmp_path)
    link = f"{PREFIX}n3"  # node3's port on the stack's bridge

    def cut_node3(job_id: str, run_dir: Path) -> tuple[str, list[int]]:
        """node3's state and the complete checkpoints once the job has ended, before the next starts."""
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
        deadline = time.monotonic() + 90
        while slurm("sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id).strip() != "NODE_FAIL":
            assert time.monotonic() < deadline, f"job {job_id} did not end NODE_FAIL"
            time.sleep(0.5)
        return node_table()["node3"][0], complete_steps(run_dir / "checkpoints")

    fault = Fault("node-loss-train", tmp_path, cut_node3, after_step=INTERVAL + 2, checkpoint=INTERVAL)
    fault.start()
    try:
        state = train_on_nodes(overrides, dataset, str(tmp_path), return_state=True)
        fault.check()
    finally:
        # node3 comes back as a rebooted node does: its link up, its slurmd started afresh, which
        # registers at once (the old one would wait for Slurm's next ping of a down node) and
        # has the job's steps left on node3 ended.
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        os.kill(stack.status(three_nodes)["slurm"]["slurmd@node3"], signal.SIGKILL)
        stack.up(three_nodes, ("slurm",))
    assert state.is_completed(), state.message
    result = state.result()
    node3_state, complete_when_lost = fault.result
    assert node3_state == "down*"
    first, last = result["attempts"]
    assert first["job"] == fault.job_id and first["nodes"] == "node1,node2,node3", first
    assert first["outcome"].startswith("NODE_FAIL: ") and "lost node node3" in first["outcome"], first
    assert last["nodes"] == "node1,node2" and last["outcome"] == "completed", last
    assert result["excluded_nodes"] == ["node3"]
    assert result["status"] == "finished" and result["step"] == STEPS

    records = metrics_records(Path(result["run_dir"]) / "metrics.jsonl")
    newest = max(complete_when_lost)
    assert INTERVAL <= newest < STEPS and result["resumed_from"] == newest
    resumed = events(records, "resumed")
    assert [(e["step"], e["from_step"], e["data_parallel"], e["grad_accumulation"]) for e in resumed] == [
        (newest, newest, 2, 3)]
    assert logged_steps(records) == list(range(1, STEPS + 1)), "every step exactly once, in order"
    consumed = [r["consumed_samples"] for r in records if "event" not in r and "loss" in r]
    assert consumed == [12 * step for step in range(1, STEPS + 1)], "the global batch stayed 12 samples"
    assert {node_state for node_state, _, _ in node_table().values()} <= {"idle", "mix"}  # node3 is back


def fetched(root: Path) -> tuple[Path, list[str]]:
    """The corpus as the fetch stage leaves it: its JSONL in a directory with a manifest."""
    key_inputs = {"sources": ["corpus.jsonl"]}
    final = manifest.output_dir(root, "fetch", manifest.stable_hash(key_inputs))
    with manifest.staged_output(final) as staging:
        texts = corpus(staging)
        manifest.write_manifest(staging, "fetch", key_inputs)
    return final, texts


@flow
def tokenize_on_nodes(overrides: list[str], data_dir: str) -> tuple[str, dict[str, str]]:
    """The tokenize stage; the dataset and the node of each of its jobs, as the run summary
    lists them (Slurm's accounting)."""
    dataset = tokenize.with_options(retries=0)(load_spec("tiny-local", overrides), data_dir)
    return dataset, {job["name"]: job["nodes"] for job in jobs_of_this_flow_run()}


def test_sharded_tokenize_runs_its_shards_on_three_nodes_and_merges_the_bytes_of_one_job(three_nodes, tmp_path):
    """The tokenize stage as a Slurm array of 3 tasks (data.tokenize_shards=3). Each task asks for
    the spec's cluster.cpus_per_task for the tokenizer's threads, 2 in tiny-local, and a node of
    this cluster has 2 CPUs: Slurm gives each task a node of its own, as tasks that each ask for a
    node's cores spread over a real cluster. The merge of the three shards, written on three
    hosts, is the dataset one unsharded job writes, byte for byte, under the same content key."""
    data, texts = fetched(tmp_path)
    tokenizer = llama3_style(tmp_path / "tokenizer", texts)
    common = ["cluster.executor=slurm", f"tokenizer.path={tokenizer}"]
    assert load_spec("tiny-local", common).cluster.cpus_per_task == 2
    cpus = {node: slurm("scontrol", "show", "node", node).split("CPUTot=")[1].split()[0] for node in NODES}
    assert cpus == dict.fromkeys(NODES, "2")

    sharded, jobs = tokenize_on_nodes([*common, "data.tokenize_shards=3", f"paths.root={tmp_path / 'sharded'}"],
                                      str(data))
    shards = {name: node for name, node in jobs.items() if name != "tokenize-merge"}
    assert sorted(shards) == [f"tokenize-{i}-of-3" for i in range(3)], jobs
    assert sorted(shards.values()) == NODES, f"one shard per node: {jobs}"
    whole, jobs = tokenize_on_nodes([*common, "data.tokenize_shards=1", f"paths.root={tmp_path / 'whole'}"],
                                    str(data))
    assert sorted(jobs) == ["tokenize-0-of-1", "tokenize-merge"]

    sharded, whole = Path(sharded), Path(whole)
    assert sharded.name == whole.name == "data_text_document"
    for suffix in (".bin", ".idx"):
        assert sharded.with_suffix(suffix).read_bytes() == whole.with_suffix(suffix).read_bytes(), suffix
    apart, one = (json.loads((p.parent / manifest.MANIFEST).read_text()) for p in (sharded, whole))
    assert sharded.parent.name == whole.parent.name  # the same content key: the shard count is not in it
    # Everything the manifest says of the dataset is the same; the shard records differ by count and time.
    assert [s["shard"] for s in apart["shards"]] == ["0/3", "1/3", "2/3"]
    assert [s["shard"] for s in one["shards"]] == ["0/1"]
    assert all(s["documents"] > 0 for s in apart["shards"])
    same = ("stage", "key", "key_inputs", "code_version", "files", "input_bytes", "dtype", "documents", "tokens",
            "skipped")
    assert {k: apart[k] for k in same} == {k: one[k] for k in same}
    assert set(apart) - set(same) == {"created", "shards"} and one["documents"] == len(texts)


def accounting(since: str, *names: str) -> dict[str, dict[str, str]]:
    """The jobs of these names submitted since ``since``, by name: Slurm's record of each."""
    fields = ["JobName", "JobID", "State", "NodeList", "Start", "End"]
    out = slurm("sacct", "-X", "-n", "-P", "-S", since, "--name", ",".join(names), "-o", ",".join(fields))
    return {row[0]: dict(zip(fields, row)) for row in (line.split("|") for line in out.splitlines()) if row[0]}


def held_until_running(blocker: str, job_name: str) -> threading.Thread:
    """Ends job ``blocker`` as soon as a job named ``job_name`` runs, and waits until it is gone."""
    def release() -> None:
        deadline = time.monotonic() + 300
        while not slurm("squeue", "-h", "-n", job_name, "-t", "RUNNING", "-o", "%i").strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)
        slurm("scancel", blocker)
        while slurm("squeue", "-h", "-j", blocker, "-o", "%i").strip() and time.monotonic() < deadline:
            time.sleep(0.3)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


PIN_SPEC = ["name=pinned", "cluster.executor=slurm", "cluster.nodes=2", "cluster.devices_per_node=1",
            "cluster.cpus_per_task=1", "model.num_layers=1", "training.micro_batch_size=2",
            "training.global_batch_size=4", "training.train_steps=2", "training.eval_iters=0",
            "cluster.time_limit_min=10", "backend.native.export_hf=false"]


def test_training_runs_on_the_nodes_precompile_warmed_though_slurm_would_pick_another(three_nodes, tmp_path,
                                                                                       clean_queue):
    """The pretrain flow with a 2-node training on the three nodes. While precompile's
    torch.compile warm-up is scheduled, a job holds node1 (both its CPUs), so the warm-up runs on
    node2 and node3; that job then ends, before training is submitted. Left to itself Slurm would
    start a 2-node job on node1 and node2; training runs on node2 and node3, the nodes the warm-up
    ran on (where a compile cache on node-local disk is warm), and compiles nothing itself. The
    cache here is the shared <paths.root>/compile-cache, which training on node1 would have found
    warm too: a node that differs between the two stages does not show in the graph counts."""
    clean_queue.extend(["pinned-precompile", "pinned-train", "node1-busy"])
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    texts = corpus(tmp_path)
    tokenizer = llama3_style(tmp_path / "tokenizer", texts)
    overrides = [*PIN_SPEC, f"paths.root={tmp_path}", f"tokenizer.path={tokenizer}",
                 f"data.sources=[{{uri: {tmp_path / 'corpus.jsonl'}}}]"]

    blocker = slurm("sbatch", "--parsable", "-w", "node1", "-c", "2", "-J", "node1-busy", "-o", "/dev/null",
                    "--wrap", "sleep 300").strip()
    deadline = time.monotonic() + 30
    while slurm("squeue", "-h", "-j", blocker, "-o", "%T").strip() != "RUNNING":
        assert time.monotonic() < deadline, f"job {blocker} did not start"
        time.sleep(0.3)
    release = held_until_running(blocker, "pinned-precompile")
    outputs = pretrain("tiny-local", overrides)
    release.join(timeout=10)

    precompiled, trained = outputs["precompile"], outputs["train"]
    jobs = accounting(since, "node1-busy", "pinned-precompile", "pinned-train")
    assert jobs["pinned-precompile"]["NodeList"] == "node[2-3]" and jobs["pinned-precompile"]["State"] == "COMPLETED"
    assert jobs["pinned-train"]["NodeList"] == "node[2-3]" and jobs["pinned-train"]["State"] == "COMPLETED"
    # node1 was free before training was submitted ...
    assert jobs["node1-busy"]["End"] <= jobs["pinned-train"]["Start"], jobs
    # ... and a 2-node job of the same shape would start on it now
    test_only = subprocess.run(["sbatch", "--test-only", "-N", "2", "-c", "1", "--wrap", "true"],
                               capture_output=True, text=True, check=True).stderr
    assert "on nodes node[1-2]" in test_only, test_only
    # what the stages record: the warm-up's nodes, handed to training, and the training job's
    assert precompiled["nodes"] == ["node2", "node3"] and precompiled["graphs"]["compiled"] > 0, precompiled
    [attempt] = trained["attempts"]
    assert attempt["job"] == jobs["pinned-train"]["JobID"] and attempt["nodes"] == "node2,node3", attempt
    assert attempt["outcome"] == "completed" and trained["status"] == "finished" and trained["step"] == 2
    # every graph training needed came from the warm-up's cache, on both nodes
    compiled = {row["node"]: (row["compiled"], row["from cache"]) for row in trained["compiled_during_training"]}
    assert sorted(compiled) == ["node2", "node3"], compiled
    assert all(built == 0 and hits > 0 for built, hits in compiled.values()), compiled


def test_only_the_node_slurm_holds_failed_is_excluded_from_the_next_attempt(three_nodes):
    """After NODE_FAIL the job's node list names every node it ran on; the one to leave out is
    the one Slurm now holds down or drained (here node2, drained for the test). A node drained
    between attempts is not counted among those a shrinking run's resubmission may use."""
    def failure(state: str) -> JobFailed:
        return JobFailed("42", "tiny-local-train", state, "", [], exit_code="0:0", nodes="node[1-3]")

    def excluded(failure: JobFailed, device_errors: dict[str, str] | None = None) -> set[str]:
        return excluded_after(failure, SlurmCluster(executor="slurm"), device_errors)

    assert excluded(failure("NODE_FAIL")) == set()  # every node is healthy again: nothing to leave out
    # Whatever ended the job, a node whose devices reported errors (the device sampler) is left out.
    assert excluded(failure("FAILED"), {"node1": "gpu0: XID 79"}) == {"node1"}
    slurm("scontrol", "update", "nodename=node2", "state=drain", "reason=test: failed node")
    try:
        assert excluded(failure("NODE_FAIL")) == {"node2"}
        assert usable_nodes(SlurmCluster(executor="slurm")) == {"node1", "node3"}
        # A crash, a cancel or a time limit says nothing against the nodes: they stay in.
        assert excluded(failure("FAILED")) == set() == excluded(failure("TIMEOUT"))
    finally:
        slurm("scontrol", "update", "nodename=node2", "state=resume")


def test_preflight_publishes_its_table_and_skips_the_probe_while_its_pass_is_recent(three_nodes, tmp_path):
    """A two-node Neuron run on the three-node cluster, its tools on the setup lines' PATH: the
    partition check and the probe job pass, and the table artifact says what was found where.
    The next run of the same spec on the same block submits no probe: it says when and on which
    node the spec passed, in a markdown artifact of the same key."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from tasks.artifacts import artifact_key
    from tasks.preflight import preflight
    from test_fail_fast import neuron_stand_ins

    tools, examples = neuron_stand_ins(tmp_path, "neuron-ls", "neuron_parallel_compile")
    SlurmCluster(executor="slurm", setup=[f"export PATH={tools}:$PATH"]).save("preflight-nodes", overwrite=True)
    spec = load_spec("megatron-gpt-6.7b", [*MODEL_THAT_FITS, f"paths.root={tmp_path}", "cluster.block=preflight-nodes",
                                           "cluster.nodes=2", "cluster.time_limit_min=5", "cluster.startup_min=1",
                                           "backend.neuron.save_before_limit_s=60", "cluster.cpus_per_task=1",
                                           f"backend.neuron.examples_dir={examples}"])

    @flow
    def check():
        return preflight(spec, ["precompile", "train"])

    def artifact(state):
        with get_client(sync_client=True) as client:
            [found] = client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
        return found

    first = check(return_state=True)
    probed = first.result()
    assert probed["probed"] and probed["node"] in NODES and probed["job"]
    table = artifact(first)
    assert (table.key, table.type) == (artifact_key(spec.name, "preflight"), "table")
    rows = {row["check"]: row for row in json.loads(table.data)}
    assert rows["partition debug: nodes"]["ok"] and rows["partition debug: nodes"]["found"].startswith("3 node(s)")
    assert rows["neuron-ls"]["ok"] and "trn1.32xlarge" in rows["neuron-ls"]["found"]
    assert rows["neuron_parallel_compile"]["ok"] and rows["NxDT examples"]["ok"]
    assert f"probed on {probed['node']}" in table.description

    second = check(return_state=True)
    skipped = second.result()
    assert (skipped["probed"], skipped["why"], skipped["job"], skipped["node"]) == (
        False, "passed recently", probed["job"], probed["node"])
    note = artifact(second)
    assert (note.key, note.type) == (table.key, "markdown")
    assert f"on node {probed['node']} (job {probed['job']}); not probed again" in note.data


def test_up_after_a_crash_recovers_and_down_leaves_nothing(three_nodes):
    """Every Slurm daemon SIGKILLed, the namespaces left behind: `up` removes them, builds the
    network anew and the three nodes run a job; `down` then leaves no namespace, link or daemon."""
    before = stack.status(three_nodes)["slurm"]
    killed = ("slurmctld", *(f"slurmd@{n}" for n in NODES))
    for daemon in killed:
        os.kill(before[daemon], signal.SIGKILL)
    time.sleep(0.5)
    assert nodes.leftovers(PREFIX)
    stack.up(three_nodes, ("slurm",))
    after = stack.status(three_nodes)["slurm"]
    assert all(after.values()) and all(after[d] != before[d] for d in killed)
    # mix or alloc: a job of an earlier test ends, on some or all of a node's CPUs; "*": a restarted
    # slurmd has not answered the controller yet. None is down or drained.
    assert {state.rstrip("*") for state, _, _ in node_table().values()} <= {"idle", "mix", "alloc"}
    sbatch_and_wait("-N", "3", "-o", "/dev/null", "--wrap", "srun true", timeout_s=90)

    stack.down(three_nodes, ("slurm",))
    assert nodes.leftovers(PREFIX) == []
    assert not any(alive(pid) for pid in after.values())
    conf = stack.environment(three_nodes)["SLURM_CONF"]
    deadline = time.monotonic() + 10  # SIGKILLed job steps take a moment to go
    while (left := processes_of(conf)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []  # no job step either


def processes_of(slurm_conf: str) -> list[str]:
    """Live processes started with this SLURM_CONF (the stack's daemons and its jobs' steps), as
    ``pid command line``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"SLURM_CONF={slurm_conf}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            continue  # ended meanwhile
    return [f"{pid} {cmd}" for pid, cmd in found if alive(pid)]
