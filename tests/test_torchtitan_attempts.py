"""The torchtitan train task's attempt loop driven by real torchtitan log text: the task itself
(``train_torchtitan.fn``) against the loopback Kubernetes API server answering with recorded
job statuses (tests/kubernetes_api_server.py), each attempt's log text written where the node's
torchrun line tees it. torchtitan cannot run on a CPU; no trainer stands in for it."""

from __future__ import annotations

import json
import re

import pytest
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

from blocks.kubernetes import runbook_cluster
from pretrain.presets import load_spec
from pretrain.spec import flavour_overrides
from tasks.artifacts import artifact_key
from tasks.train_torchtitan import train_torchtitan
from kubernetes_api_server import RecordedApiServer, RecordedPod, Replay, recorded
from kubernetes_schemas import invalid
from public_logs import blocks

# Not pure: the task publishes its progress and loss curve as Prefect artifacts (the harness's API).

PR_950, ISSUE_810 = "https://github.com/pytorch/torchtitan/pull/950", "https://github.com/pytorch/torchtitan/issues/810"
PR_1287, PR_3393 = "https://github.com/pytorch/torchtitan/pull/1287", "https://github.com/pytorch/torchtitan/pull/3393"
NEBIUS = "https://github.com/nebius/ml-cookbook/blob/faf9fe53e7d280d085f39288540317567192ed9e/slurm/torchtitan/README.md#L96-L98"
WATCHDOG = ("[PG ID 0 PG GUID 0(default_pg) Rank 4] Process group watchdog thread terminated with exception: "
            "[Rank 4] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=49120, OpType=_ALLGATHER_BASE, "
            "NumelIn=16416832, NumelOut=1050677248, Timeout(ms)=300000) ran for 300015 milliseconds before timing out.")


def attempt_logs() -> tuple[str, str]:
    """What node 0's log receives in each attempt. No public log of one torchtitan run holds a
    failure and its resumption together, so the attempts combine lines of several public runs
    (tests/assets/logs/torchtitan-attempts-public.txt, each block under its source):

    1. steps 22-29 of the llama3 debug model (pytorch/torchtitan#950), then the NCCL watchdog's
       timeout that ended a debug-model run with more than one GPU (pytorch/torchtitan#810);
    2. torchtitan's checkpointer loading a checkpoint and training going on from it
       (pytorch/torchtitan#1287, a run that loaded step 400 of its own), then steps 22-29 of a
       debug-model run that resumed (pytorch/torchtitan#3393), then step 700 of a run whose flops
       torchtitan did not count ("tflops: 0.00  mfu: 0.00%", nebius/ml-cookbook).
    """
    logs = dict(blocks("torchtitan-attempts-public.txt"))
    uncounted = dict(blocks("torchtitan-public-lines.txt"))[NEBIUS][0]
    first = logs[PR_950] + logs[ISSUE_810]
    second = logs[PR_1287] + logs[PR_3393] + [uncounted]
    return "\n".join(first) + "\n", "\n".join(second) + "\n"


def loss_points(spec_name: str) -> list[dict]:
    """The newest loss-points table the task published: what the UI shows a user."""
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(spec_name, "loss-points")])),
            sort=ArtifactSort.CREATED_DESC, limit=1)
    return json.loads(artifact.data)


def test_a_torchtitan_run_that_died_of_an_nccl_timeout_resumes_and_reports_both_attempts(tmp_path):
    """llama3-8b-gpu runs on one node of 8 GPUs: a PyTorchJob of one Master pod (a job with GPUs
    is a PyTorchJob, render/kubernetes.py). Attempt 1's fails (the recorded Failed condition, as a
    failed PyTorchJob has; its pod Failed) after its ranks printed steps 22-29 and the watchdog's
    timeout; attempt 2's succeeds (the recorded PyTorchJob status) after the resumed run printed
    steps 22-29 again and went on. The
    "kubelet" plays node 0 when each job is created: it appends the attempt's text to the log the
    job's command tees into (the pod's own log, which the API server streams, is the same text)."""
    first, second = attempt_logs()
    texts = [first, second]
    teed = []

    def kubelet(body: dict) -> None:
        (container,) = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
        run = re.search(r"tee -a (\S+)/node-\$NODE_RANK\.log", " ".join(container["command"])).group(1)
        log = f"{run}/node-0.log"  # the one node's NODE_RANK; it holds the metrics rank
        with open(log, "a") as f:
            f.write(texts[len(teed)])
        teed.append(log)

    failed = Replay([recorded("job-status-running.json"), recorded("job-status-backoff-limit-exceeded.json")],
                    [RecordedPod("ip-10-0-1-1", {"phase": "Failed"})], first)
    done = Replay([recorded("pytorchjob-status-succeeded.yaml")], [RecordedPod("ip-10-0-1-1", {"phase": "Succeeded"})],
                  second)
    with RecordedApiServer([failed, done], kubelet=kubelet) as server:
        runbook_cluster().model_copy(update={"image": "torchtitan:0.3.0", "namespace": "training",
                                             "mount_path": str(tmp_path), "api_server": server.url}
                                     ).save("torchtitan-attempts", overwrite=True)
        # the run's last step is the second attempt's last line: the job that ends well there ends the run
        # torchtitan's debug model: the 8B's checkpoints (96 GB) would not fit this machine's disk,
        # which the train task checks before it queues anything (pretrain/checkpoint_room.py)
        spec = load_spec("llama3-8b-gpu", [*flavour_overrides("debugmodel"),
                                           "cluster.block=kubernetes-cluster/torchtitan-attempts",
                                           f"paths.root={tmp_path}/pretrain", "name=titan-attempts",
                                           "training.train_steps=700"])
        result = train_torchtitan.fn(spec, str(tmp_path / "data"))

    assert len(server.created()) == 2 and teed[0] == teed[1]  # one log, appended to by both attempts
    for body in server.created():  # one Master pod that asks for the node's 8 GPUs
        assert body["kind"] == "PyTorchJob" and list(body["spec"]["pytorchReplicaSpecs"]) == ["Master"]
        assert invalid(body) == []  # against training-operator v1.9.0's PyTorchJob CRD
        (container,) = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    one, two = result["attempts"]
    assert one["outcome"].startswith("FAILED: ") and one["outcome"].endswith(f" -- {WATCHDOG}")
    assert (one["step"], one["nodes"]) == (29, "ip-10-0-1-1")
    assert (two["outcome"], two["step"]) == ("completed", 700)

    # the loss curve: every step once, the resumed steps with the values the resumed run printed
    rows = {row["step"]: row for row in loss_points(spec.name)}
    assert sorted(rows) == [*range(22, 30), 700]
    assert [rows[s]["loss"] for s in range(22, 30)] == [2.91, 2.923, 3.014, 2.89, 2.941, 2.896, 2.981, 2.958]
    assert rows[700]["loss"] == 0.7052 and rows[700]["mfu_pct"] is None  # "mfu: 0.00%" is unknown, not 0

    # the run summary's figures come from the parsed lines: tps per device times the world size
    # (8 GPUs), MFU as printed; each the median after the first step, over the resumed run's steps
    metrics = result["metrics"]
    assert metrics["final_step"] == 700 and metrics["final_loss"] == 0.7052
    assert metrics["mfu_pct"] == 0.16
    # steps 23-29 and 700: 6,988 6,992 6,999 7,007 | 7,051 7,062 7,064 1,541,366
    assert metrics["tokens_per_s"] == 8 * (7007 + 7051) / 2
    assert result["step"] == 700 and result["skipped_log_lines"] == 0


@pytest.mark.pure
def test_the_first_error_a_rank_printed_is_the_attempts_reason():
    """The rule the task's outcome uses, on the public lines: the watchdog's what(), not the C++
    frames after it; step lines and checkpoint lines are no error."""
    from pretrain.log_parsers import rank_error

    logs = dict(blocks("torchtitan-attempts-public.txt"))
    assert rank_error("\n".join(logs[PR_950] + logs[ISSUE_810])) == WATCHDOG
    assert rank_error("\n".join(logs[PR_1287] + logs[PR_3393])) is None
