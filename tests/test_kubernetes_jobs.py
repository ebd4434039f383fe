"""The Kubernetes job layer read against real recorded API objects (tests/assets/kubernetes/
SOURCES.md names each one's source): how a job or pod ended, in the words the tasks understand,
and a pod log that arrives in pieces."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from jobs.kubernetes import PodLogs, PodOutcome, _commands, failed_indexes, job_condition, job_outcome, pod_outcome
from jobs.node import Command
from jobs.slurm import JobRequest

pytestmark = pytest.mark.pure

RECORDED = Path(__file__).parent / "assets" / "kubernetes" / "recorded"


def recorded(name: str):
    text = (RECORDED / name).read_text()
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


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


def test_a_kubeflow_job_that_succeeded_completed():
    status = recorded("jaxjob-status-succeeded.yaml")
    assert job_condition(status) == ("Succeeded", "JAXJobSucceeded: JAXJob kubeflow/jaxjob-mnist successfully completed.")
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
    assert _commands([request])[0].argv == ["python", "-m", "trainer", "tokenize"]
    with pytest.raises(TypeError, match="command lines"):
        _commands([JobRequest("x", print, 10)])


class RecordedCluster:
    """Answers the job layer's calls with the recorded objects: a Job past its backoff limit whose
    one pod was OOM-killed on ip-10-0-1-1, its log the runbook's getdata output. Only the answers
    are stand-ins; the job layer's reading of them is the code under test."""

    def __init__(self):
        self.core, self.batch = self, self
        self.deleted = []

    def serialize(self, obj):
        return obj

    def read_namespaced_job_status(self, name, namespace):
        return type("Job", (), {"status": recorded("job-status-backoff-limit-exceeded.json")})

    def list_namespaced_pod(self, namespace, label_selector):
        assert label_selector == "batch.kubernetes.io/job-name=getdata"
        pod = type("Pod", (), {
            "metadata": type("Meta", (), {"name": "getdata-x7k2p"}),
            "spec": type("Spec", (), {"node_name": "ip-10-0-1-1"}),
            "status": {"phase": "Failed", "containerStatuses": recorded("pod-container-statuses-oomkilled.yaml")}})
        return type("PodList", (), {"items": [pod]})

    def read_namespaced_pod_log(self, pod, namespace, container, follow, _preload_content):
        data = (RECORDED / "getdata-job-logs.txt").read_bytes()
        return type("Stream", (), {"stream": lambda self, decode_content: (data[i:i + 100] for i in range(0, len(data), 100))})()

    def delete_namespaced_job(self, name, namespace, body):
        self.deleted.append((name, body.propagation_policy))


def test_a_followed_job_fails_with_the_pods_reason_node_and_log_tail():
    from jobs.kubernetes import SubmittedJob, cancel, wait_all
    from jobs.slurm import SlurmJobFailed

    api = RecordedCluster()
    job = SubmittedJob("Job", "getdata", "training")
    (outcome,) = wait_all(api, [job], ["getdata"], poll_s=0.01)
    assert isinstance(outcome, SlurmJobFailed)
    assert (outcome.state, outcome.exit_code, outcome.nodes) == ("OUT_OF_MEMORY", "137", "ip-10-0-1-1")
    assert outcome.log_tail[-1] == "Download completed."
    assert "kubectl logs -n training -l batch.kubernetes.io/job-name=getdata" in str(outcome)
    cancel(api, job)
    assert api.deleted == [("getdata", "Foreground")]
