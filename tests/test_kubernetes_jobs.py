"""The Kubernetes job layer read against real recorded API objects (tests/assets/kubernetes/
SOURCES.md names each one's source): how a job or pod ended, in the words the tasks understand,
and a pod log that arrives in pieces; then the layer's own calls, made by the official client
against a local API server that answers with those objects (tests/kubernetes_api_server.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from blocks.kubernetes import runbook_cluster
from jobs import kubernetes
from jobs.contract import JobFailed, JobRequest
from jobs.kubernetes import (KubernetesTarget, PodLogs, PodOutcome, failed_indexes, job_condition, job_outcome,
                             pod_commands, pod_outcome)
from jobs.node import Command
from pretrain.presets import load_spec
from render import kubernetes as manifests
from render.kubernetes import batch_job, leased
from kubernetes_api_server import RECORDED, RecordedApiServer, RecordedPod, Replay, recorded
from kubernetes_schemas import invalid
from tests.model_that_fits import MODEL_THAT_FITS

pytestmark = pytest.mark.pure


def test_an_oom_killed_container_is_out_of_memory_with_its_exit_code():
    status = {"phase": "Failed", "containerStatuses": recorded("pod-container-statuses-oomkilled.yaml")}
    outcome = pod_outcome(status, node="ip-10-0-1-1")
    assert outcome == PodOutcome("OUT_OF_MEMORY", "137", "container f0601d8477447476d919-oom-task-0 OOMKilled",
                                 "ip-10-0-1-1")


def test_an_oom_killed_container_in_a_pod_that_succeeded_is_still_out_of_memory():
    # the runtime recorded exit code 0 and the pod phase Succeeded (flyteorg/flyteplugins#48)
    assert pod_outcome(recorded("pod-status-oomkilled-succeeded.yaml")).state == "OUT_OF_MEMORY"


def test_an_evicted_pod_is_preempted_with_the_kubelets_reason():
    outcome = pod_outcome(recorded("pod-status-evicted.yaml"))
    assert outcome.state == "PREEMPTED"
    assert outcome.detail.startswith("Evicted: The node was low on resource: memory. Container node was using")


def test_a_pod_the_scheduler_preempted_is_preempted_whatever_its_container_exit_code():
    condition = recorded("pod-condition-preempted.json")
    # a SIGKILL after the grace period leaves exit code 137, as an OOM kill would
    status = {"phase": "Failed", "conditions": [condition],
              "containerStatuses": [{"name": "pytorch", "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}
    outcome = pod_outcome(status)
    assert outcome.state == "PREEMPTED" and outcome.detail.startswith("PreemptionByKubeScheduler: Kube-scheduler:")


def test_a_job_that_reached_its_backoff_limit_fails_with_its_pods_reason():
    status = recorded("job-status-backoff-limit-exceeded.json")
    assert job_condition(status) == ("Failed", "BackoffLimitExceeded: Job has reached the specified backoff limit")
    pods = [pod_outcome({"phase": "Failed", "containerStatuses": recorded("pod-container-statuses-oomkilled.yaml")},
                        node="ip-10-0-1-1")]
    outcome = job_outcome(status, pods)
    assert (outcome.state, outcome.exit_code, outcome.node) == ("OUT_OF_MEMORY", "137", "ip-10-0-1-1")
    assert outcome.detail.endswith("BackoffLimitExceeded: Job has reached the specified backoff limit")
    # without a pod left to say why (deleted by its ttl), the job's own condition does
    assert job_outcome(status, []) == PodOutcome("FAILED", "", "BackoffLimitExceeded: Job has reached the specified "
                                                               "backoff limit")


def test_a_job_with_an_active_pod_runs_on():
    assert job_condition(recorded("job-status-running.json")) is None
    assert job_outcome(recorded("job-status-running.json"), [PodOutcome("FAILED", "1")]).state == ""


def test_a_pytorchjob_that_succeeded_completed():
    status = recorded("pytorchjob-status-succeeded.yaml")
    assert job_condition(status) == ("Succeeded", "PyTorchJobSucceeded: PyTorchJob pytorch-tcp-dist-mnist is "
                                                  "successfully completed.")
    assert job_outcome(status, []).state == "COMPLETED"


def test_failed_indexes_read_the_compressed_list():
    assert failed_indexes({"failedIndexes": "1,3-5,7"}) == {1, 3, 4, 5, 7}
    assert failed_indexes({}) == set()


def test_pod_logs_arriving_in_pieces_come_out_as_the_recorded_lines():
    text = (RECORDED / "getdata-job-logs.txt").read_text()
    logs = PodLogs()
    lines = []
    for start in range(0, len(text), 37):  # pieces that cut lines anywhere
        logs.add("getdata-job-x7k2p", text[start:start + 37])
        lines += logs.read_new()
    assert [line for _, line in lines] == text.splitlines()
    assert {pod for pod, _ in lines} == {"getdata-job-x7k2p"}
    assert list(logs.tail) == text.splitlines()[-30:]  # what a failure quotes


def test_commands_run_the_images_python_not_the_flows():
    request = JobRequest("tokenize-0-of-1", Command([sys.executable, "-m", "trainer", "tokenize"]), 10)
    assert pod_commands([request])[0].argv == ["python", "-m", "trainer", "tokenize"]
    with pytest.raises(TypeError, match="command lines"):
        pod_commands([JobRequest("x", print, 10)])


def target(server: RecordedApiServer, volume: Path | None = None) -> KubernetesTarget:
    """The runbook's cluster, its API server the local one; ``volume``: the shared volume's mount
    path, and the spec's root there."""
    settings = {"mount_path": str(volume)} if volume else {}
    cluster = runbook_cluster().model_copy(update={"image": "megatron-lm:0.16.1", "namespace": "training",
                                                   "api_server": server.url, **settings})
    return KubernetesTarget(cluster, load_spec("gpt3-7.5b-eks", [*MODEL_THAT_FITS, *([f"paths.root={volume}/pretrain"]
                                                                                      if volume else [])]))


def listed(server: RecordedApiServer) -> list[tuple[str, str, str]]:
    """What the run summary lists of the jobs created on ``server``: name, nodes, outcome (outside a
    flow run every test's jobs are listed together, so those of others are left out)."""
    created = {f"{body['metadata']['namespace']}/{body['metadata']['name']}" for body in server.created()}
    return [(job["name"], job["nodes"], job["outcome"]) for job in kubernetes.jobs_of_this_flow_run()
            if job["job_id"] in created]


GETDATA_LOG = (RECORDED / "getdata-job-logs.txt").read_text()
OOM_KILLED = RecordedPod("ip-10-0-1-1", {"phase": "Failed",
                                         "containerStatuses": recorded("pod-container-statuses-oomkilled.yaml")})

# A pod evicted from a node tainted NoExecute: the pod disruption condition of Kubernetes'
# documentation (Pod disruption conditions) on the recorded one; no recorded object of a taint
# manager eviction was found.
LOST_TO_A_TAINT = {"phase": "Failed", "conditions": [{**recorded("pod-condition-preempted.json"),
                                                      "reason": "DeletionByTaintManager",
                                                      "message": "Taint manager: deleting due to NoExecute taint"}]}


def test_a_job_that_ran_out_of_memory_fails_with_the_pods_reason_node_and_log_through_the_api(tmp_path):
    """Created, followed (pods by the Job controller's label, each pod's log with follow=true)
    and read to its end through the client's real routes; a finished job is left to its ttl."""
    replay = Replay([recorded("job-status-running.json"), recorded("job-status-backoff-limit-exceeded.json")],
                    [OOM_KILLED], GETDATA_LOG)
    with RecordedApiServer([replay]) as server:
        with pytest.raises(JobFailed) as failed:
            job = target(server)
            kubernetes.run_job(JobRequest("getdata", Command([sys.executable, "-m", "trainer", "fetch"]), 10), job, tmp_path, manifests, poll_s=0.01)
    (body,) = server.created()
    name = body["metadata"]["name"]
    # what was rendered, every field through the client's V1Job model and back: the command in the
    # image's python, under the lease the flow renewed while it followed the job
    lease = tmp_path / name / "lease"
    (command,) = leased([Command(["python", "-m", "trainer", "fetch"])], str(lease), 300)
    assert body == batch_job(job.cluster, job.spec, name, "getdata", command, 10)
    assert lease.exists()
    assert invalid(body) == []
    assert name.startswith("getdata-")
    assert [r.query["labelSelector"] for r in server.sent("GET", "/pods$")][0] == [f"batch.kubernetes.io/job-name={name}"]
    (log,) = server.sent("GET", "/log$")
    assert log.path == f"/api/v1/namespaces/training/pods/{name}-0/log"
    assert log.query == {"container": ["pytorch"], "follow": ["true"]}
    outcome = failed.value
    assert (outcome.state, outcome.exit_code, outcome.nodes) == ("OUT_OF_MEMORY", "137", "ip-10-0-1-1")
    assert outcome.log_tail == GETDATA_LOG.splitlines()[-30:]
    assert f"kubectl logs -n training -l batch.kubernetes.io/job-name={name}" in str(outcome)
    assert not server.sent("DELETE")


def test_a_training_job_that_succeeded_is_a_pytorchjob_created_at_the_kubeflow_route(tmp_path):
    with RecordedApiServer([Replay([recorded("pytorchjob-status-succeeded.yaml")])]) as server:
        request = JobRequest("gpt-train", Command(["torchrun", "--nnodes", "$NNODES"]), 60, nodes=2, gpus_per_node=8)
        assert kubernetes.run_job(request, target(server), tmp_path, manifests, poll_s=0.01) == [0, 0]
    (create,) = server.sent("POST")
    assert create.path == "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs"
    assert create.body["kind"] == "PyTorchJob" and invalid(create.body) == []
    name = create.body["metadata"]["name"]
    assert [r.path for r in server.sent("GET", "/status$")][0] == \
        f"/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/{name}/status"
    assert [r.query["labelSelector"] for r in server.sent("GET", "/pods$")][0] == \
        [f"training.kubeflow.org/job-name={name}"]


def test_an_indexed_job_that_failed_as_a_whole_fails_every_index(tmp_path):
    """tokenize's shards: one Indexed Job; without failedIndexes in its status (a Job past its
    backoff limit) no index can be trusted."""
    requests = [JobRequest(f"tokenize-{i}-of-2", Command(["python", "-m", "trainer", "tokenize", str(i)]), 10)
                for i in range(2)]
    replay = Replay([recorded("job-status-backoff-limit-exceeded.json")], [OOM_KILLED], log=GETDATA_LOG)
    seen = []  # what tokenize's progress reader gets: each line with the pod it came from
    with RecordedApiServer([replay]) as server:
        outcomes = kubernetes.run_array(requests, target(server), tmp_path, manifests, poll_s=0.01,
                                        on_line=lambda pod, line: seen.append((pod, line)))
    (body,) = server.created()
    assert body["spec"]["completionMode"] == "Indexed" and body["spec"]["completions"] == 2 and invalid(body) == []
    assert [o.state for o in outcomes] == ["OUT_OF_MEMORY", "OUT_OF_MEMORY"]
    assert [line for _, line in seen] == GETDATA_LOG.splitlines()
    assert {pod.startswith(body["metadata"]["name"]) for pod, _ in seen} == {True}


def test_an_exception_while_following_deletes_the_job_with_foreground_propagation(tmp_path):
    """A hung run (on_poll raises) leaves no job behind: the DELETE carries DeleteOptions with
    propagationPolicy Foreground, so the pods are gone before the job is."""

    class Hung(Exception):
        pass

    def hang() -> None:
        raise Hung

    with RecordedApiServer([Replay([recorded("job-status-running.json")], [OOM_KILLED])]) as server:
        with pytest.raises(Hung):
            kubernetes.run_job(JobRequest("getdata", Command(["true"]), 10), target(server), tmp_path, manifests, poll_s=0.01, on_poll=hang)
    (delete,) = server.sent("DELETE")
    name = server.created()[0]["metadata"]["name"]
    assert delete.path == f"/apis/batch/v1/namespaces/training/jobs/{name}"
    assert delete.body == {"propagationPolicy": "Foreground"}


def test_a_job_past_the_wait_is_deleted_once_and_fails_cancelled(tmp_path):
    """The deleted job is gone (404) when the layer looks at it again on its way out: that is
    what was asked, not an error hiding the outcome."""
    with RecordedApiServer([Replay([recorded("job-status-running.json")], [OOM_KILLED])]) as server:
        with pytest.raises(JobFailed) as failed:
            kubernetes.run_job(JobRequest("getdata", Command(["true"]), 10), target(server), tmp_path, manifests, poll_s=0.01, max_wait_s=0)
    assert failed.value.state == "CANCELLED"
    assert len(server.sent("DELETE")) == 1
    assert listed(server) == [("getdata", "ip-10-0-1-1", "CANCELLED: no result after 0 s")]  # the run summary's row


def test_training_runs_on_the_nodes_precompile_ran_on_and_leaves_out_a_lost_one(tmp_path):
    """precompile's PyTorchJob ran on two nodes; training, pinned to them, loses one to a NoExecute
    taint (NODE_FAIL), and the shared attempt loop resubmits it on the other node only, where it
    succeeds."""
    from tasks.executor import job_nodes, on_nodes
    from tasks.attempts import MetricsFollower, run_attempts

    done = recorded("pytorchjob-status-succeeded.yaml")
    failed = recorded("job-status-backoff-limit-exceeded.json")  # a Failed condition, as a failed PyTorchJob has
    replays = [Replay([done], [RecordedPod("ip-10-0-1-1", {"phase": "Succeeded"}),
                               RecordedPod("ip-10-0-1-2", {"phase": "Succeeded"})]),
               Replay([failed], [RecordedPod("ip-10-0-1-1", LOST_TO_A_TAINT),
                                 RecordedPod("ip-10-0-1-2", {"phase": "Failed"})]),
               Replay([done], [RecordedPod("ip-10-0-1-2", {"phase": "Succeeded"})])]
    with RecordedApiServer(replays) as server:
        eks = target(server, tmp_path)
        spec = eks.spec
        precompile = []
        kubernetes.run_job(JobRequest("gpt-precompile", Command(["torchrun"]), 10, nodes=2, gpus_per_node=8), eks,
                tmp_path, manifests, poll_s=0.01, on_submit=precompile.append)
        pinned = on_nodes(eks, job_nodes(precompile[0]))
        follower = MetricsFollower(spec, tmp_path / "metrics.jsonl", 10, 600)
        attempts = run_attempts(spec, pinned, follower, budget=1, run=tmp_path, checkpoint_step=lambda: 0,
                                prepare=lambda attempt, launch: JobRequest(
            "gpt-train", Command(["torchrun"]), 60, nodes=2, gpus_per_node=8))
    assert [a["outcome"].split(":")[0] for a in attempts.history] == ["NODE_FAIL", "completed"]
    assert attempts.history[0]["nodes"] == "ip-10-0-1-1,ip-10-0-1-2" and attempts.excluded == {"ip-10-0-1-1"}
    # the run summary's jobs: each with its pods' nodes and how it ended
    assert listed(server) == [
        ("gpt-precompile", "ip-10-0-1-1,ip-10-0-1-2", "completed"),
        ("gpt-train", "ip-10-0-1-1,ip-10-0-1-2",
         "NODE_FAIL: DeletionByTaintManager: Taint manager: deleting due to NoExecute taint; "
         "BackoffLimitExceeded: Job has reached the specified backoff limit"),
        ("gpt-train", "ip-10-0-1-2", "completed")]

    def node_terms(body):
        pod = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        term, = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        return [(e["operator"], e["values"]) for e in term["matchExpressions"]]

    _, first, second = server.created()
    assert node_terms(first) == [("In", ["ip-10-0-1-1", "ip-10-0-1-2"])]
    assert node_terms(second) == [("In", ["ip-10-0-1-2"]), ("NotIn", ["ip-10-0-1-1"])]
    assert all(invalid(body) == [] for body in server.created())


def test_a_run_that_may_go_on_with_fewer_nodes_is_resubmitted_elastic_without_the_lost_node(tmp_path):
    """On Kubernetes going on with fewer nodes (cluster.min_nodes) is the PyTorchJob's
    elasticPolicy, inside the job: after a node failure the attempt loop resubmits the same
    elastic job with the lost node left out, and asks no Slurm partition how many nodes are left."""
    from tasks.attempts import MetricsFollower, run_attempts

    replays = [Replay([recorded("job-status-backoff-limit-exceeded.json")],
                      [RecordedPod("ip-10-0-1-1", LOST_TO_A_TAINT), RecordedPod("ip-10-0-1-2", {"phase": "Failed"})]),
               Replay([recorded("pytorchjob-status-succeeded.yaml")], [RecordedPod("ip-10-0-1-2", {"phase": "Succeeded"})])]
    with RecordedApiServer(replays) as server:
        cluster = runbook_cluster().model_copy(update={"image": "pretrain:cpu", "namespace": "training",
                                                       "api_server": server.url, "mount_path": str(tmp_path)})
        spec = load_spec("tiny-local", ["cluster.block=kubernetes-cluster/eks", f"paths.root={tmp_path}/pretrain",
                                        "cluster.nodes=2", "cluster.min_nodes=1"])
        follower = MetricsFollower(spec, tmp_path / "metrics.jsonl", 10, 600)
        attempts = run_attempts(spec, KubernetesTarget(cluster, spec), follower, budget=1, run=tmp_path,
                                checkpoint_step=lambda: 0,
                                prepare=lambda attempt, launch: JobRequest("tiny-train", Command(["torchrun"]), 60, nodes=2))
    assert [a["outcome"].split(":")[0] for a in attempts.history] == ["NODE_FAIL", "completed"]
    first, second = server.created()
    for body in (first, second):
        assert body["spec"]["elasticPolicy"]["minReplicas"] == 1 and body["spec"]["elasticPolicy"]["maxReplicas"] == 2
        assert body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2 and invalid(body) == []
    pod = second["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                         "values": ["ip-10-0-1-1"]}]


def test_an_attempt_that_failed_names_the_node_whose_gpu_reported_an_xid_and_leaves_it_out(tmp_path):
    """The training job fails, its pods on both nodes Failed (no node failure), while the device
    sampler's file of one node holds an XID: the attempt's outcome, and the run's failure, name
    that node and what its GPU reported, and the resubmission is kept off it."""
    from tasks.attempts import MetricsFollower, run_attempts
    from trainer.monitor.nvml import gpu_record

    devices = tmp_path / "devices"
    devices.mkdir()
    sample = gpu_record(3, utilization_pct=0, memory_used_bytes=2**30, power_mw=None, temperature_c=None,
                        sm_clock_mhz=None, new_ecc_uncorrected=0, xids=[79])
    (devices / "ip-10-0-1-1.jsonl").write_text(json.dumps({"kind": "device", "node": "ip-10-0-1-1", "time": 1.0,
                                                           **sample}) + "\n")
    failed = Replay([recorded("job-status-backoff-limit-exceeded.json")],
                    [RecordedPod("ip-10-0-1-1", {"phase": "Failed"}), RecordedPod("ip-10-0-1-2", {"phase": "Failed"})])
    with RecordedApiServer([failed, failed]) as server:
        eks = target(server, tmp_path)
        follower = MetricsFollower(eks.spec, tmp_path / "metrics.jsonl", 10, 600, devices_dir=devices)
        attempts = run_attempts(eks.spec, eks, follower, budget=1, run=tmp_path, checkpoint_step=lambda: 0,
                                prepare=lambda attempt, launch: JobRequest(
            "gpt-train", Command(["torchrun"]), 60, nodes=2, gpus_per_node=8))
    first, second = (a["outcome"] for a in attempts.history)
    assert first.startswith("FAILED: ") and first.endswith(" -- device errors on ip-10-0-1-1 (gpu3: XID 79)")
    assert attempts.excluded == {"ip-10-0-1-1"}
    assert "device errors" not in second  # the node was left out: its errors are not the second attempt's
    assert "device errors on ip-10-0-1-1 (gpu3: XID 79)" in str(attempts.failure())
    _, resubmitted = server.created()
    pod = resubmitted["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [(e["operator"], e["values"]) for e in term["matchExpressions"]] == [("NotIn", ["ip-10-0-1-1"])]


def test_a_pod_whose_lease_is_not_renewed_stops_its_program_and_fails(tmp_path):
    """What every pod runs its command under (jobs/lease.py): nobody renews the lease, as when the
    flow's pod was killed, and the program is stopped after the lease's time."""
    lease = tmp_path / "lease"
    lease.touch()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "jobs.lease", str(lease), "2", "--", "sleep", "60"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and time.monotonic() - started < 10
    assert f"has not renewed {lease} for 2 s" in done.stdout
    ok = subprocess.run([sys.executable, "-m", "jobs.lease", str(lease), "2", "--", "sh", "-c", "exit 3"])
    assert ok.returncode == 3  # the program's own exit code while the lease holds


def test_a_terminated_flow_process_deletes_its_job_within_its_grace_period(tmp_path):
    """How a cancelled flow run ends on Kubernetes: the worker deletes the flow's pod, and the
    kubelet sends its process SIGTERM, then SIGKILL 30 s later (the pod's default grace period,
    the issue's limit). The DELETE must arrive in between: on the signal, not at the next poll,
    ten minutes away here (it arrives within a second; docs/kubernetes.md)."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the layer installs its own, as in a flow process
    signalled = []
    try:
        with RecordedApiServer([Replay([recorded("job-status-running.json")])]) as server:
            def terminate_once_followed() -> None:
                while not server.sent("GET", "/status$"):
                    time.sleep(0.01)
                signalled.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGTERM)

            threading.Thread(target=terminate_once_followed, daemon=True).start()
            with pytest.raises(SystemExit):
                kubernetes.run_job(JobRequest("gpt-train", Command(["torchrun"]), 60, nodes=2, gpus_per_node=8), target(server),
                        tmp_path, manifests, poll_s=600.0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    (delete,) = server.sent("DELETE")
    assert delete.path.startswith("/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/")
    assert delete.body == {"propagationPolicy": "Foreground"}
    assert delete.at - signalled[0] < 30


def test_a_flow_run_cancelled_through_the_prefect_api_deletes_its_job_at_the_next_check(tmp_path, monkeypatch):
    """A run cancelled in the UI, the CLI or the API while it follows a job: the layer reads the
    flow run's state from the Prefect API (every 5 s, jobs.contract.CancelWatch), sees Cancelling, and
    its very next request is the foreground DELETE of the job, before any further poll. The
    Prefect API's one route this needs (GET /api/flow_runs/ID) is answered by the loopback server
    too, with a flow run serialized by Prefect's own model; the flow's pod knows its run from
    PREFECT__FLOW_RUN_ID, which the worker sets."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelling

    from jobs.contract import FlowRunCancelled

    run = FlowRun(flow_id=uuid.uuid4(), name="gpt3-7.5b-eks", state=Cancelling())
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", str(run.id))
    answers = {f"/api/flow_runs/{run.id}": run.model_dump(mode="json")}
    with RecordedApiServer([Replay([recorded("job-status-running.json")])], answers) as server:
        with temporary_settings({PREFECT_API_URL: f"{server.url}/api"}), pytest.raises(FlowRunCancelled) as cancelled:
            kubernetes.run_job(JobRequest("gpt-train", Command(["torchrun"]), 60, nodes=2, gpus_per_node=8),
                               target(server), tmp_path, manifests, poll_s=1.0, max_wait_s=60)
    name = server.created()[0]["metadata"]["name"]
    assert f"(Cancelling); deleted Kubernetes job(s) training/{name}" in str(cancelled.value)
    (read,) = server.sent("GET", f"^/api/flow_runs/{run.id}$")
    after = server.requests[server.requests.index(read) + 1:]
    assert (after[0].method, after[0].path) == \
        ("DELETE", f"/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/{name}")
    assert after[0].body == {"propagationPolicy": "Foreground"}
    assert len(server.sent("DELETE")) == 1
