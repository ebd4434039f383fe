"""A Kubernetes API server on loopback for the job layer's tests: the REST routes the official
client (kubernetes 37.0.0) calls for the layer, answered with the recorded objects of
tests/assets/kubernetes/recorded wrapped in whole API objects (apiVersion, kind, metadata), as an
API server returns them; every request it was sent is kept for the test to read.

Routes (the client's ``resource_path`` of each call the layer makes):

- POST   /apis/batch/v1/namespaces/{ns}/jobs                       create_namespaced_job
- POST   /apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs         create_namespaced_custom_object
- GET    /apis/batch/v1/namespaces/{ns}/jobs/{name}/status         read_namespaced_job_status
- GET    /apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/{name}/status   get_namespaced_custom_object_status
- GET    /api/v1/namespaces/{ns}/pods?labelSelector=KEY=VALUE      list_namespaced_pod
- GET    /api/v1/namespaces/{ns}/pods/{pod}/log?follow=true        read_namespaced_pod_log (streamed)
- DELETE the job's own path, with a DeleteOptions body             delete_namespaced_job, ..._custom_object
- GET    any other path the test gives a recorded answer for, e.g.
         /api/v1/namespaces/{ns}/persistentvolumeclaims/{name}     read_namespaced_persistent_volume_claim
         /api/v1/namespaces/{ns}                                   read_namespace
         /api/flow_runs/{id}, /api/block_types/slug/...            the Prefect API's, for a test that
                                                                   points PREFECT_API_URL here

A created object that the schemas refuse is answered 422 Invalid, as the API server's validation
would; anything else is 404 NotFound. Only the recorded answers are chosen by the test: which
status a job shows at each read, which pods it has, and what the other paths answer (an object,
or a Status with its code).
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import yaml

from kubernetes_schemas import invalid

RECORDED = Path(__file__).parent / "assets" / "kubernetes" / "recorded"
# The labels the Job controller and the training operator put on a job's pods.
POD_LABEL = {"Job": "batch.kubernetes.io/job-name", "PyTorchJob": "training.kubeflow.org/job-name"}
ROUTES = {"jobs": ("batch/v1", "Job"), "pytorchjobs": ("kubeflow.org/v1", "PyTorchJob")}
OBJECT = re.compile(r"^/apis/(?:batch/v1|kubeflow\.org/v1)/namespaces/([^/]+)/(jobs|pytorchjobs)(?:/([^/]+))?(/status)?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)/log)?$")


def recorded(name: str) -> Any:
    text = (RECORDED / name).read_text()
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


@dataclass
class RecordedPod:
    """One pod of a job: the node it ran on and its recorded ``status``."""

    node: str
    status: dict[str, Any]


@dataclass
class Replay:
    """What the cluster shows of one created job: its status at the first, second, ... read of
    it (the last one stays), its pods, and each pod's log."""

    statuses: list[dict[str, Any]]
    pods: list[RecordedPod] = field(default_factory=list)
    log: str = ""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    at: float  # time.monotonic() when it arrived


@dataclass
class _Created:
    body: dict[str, Any]
    replay: Replay
    reads: int = 0
    deleted: bool = False


class RecordedApiServer:
    """Serves ``replays`` in order: the first job created shows the first replay, the next job
    (a resubmission, say) the second; ``answers``: the recorded answer of a GET of each path;
    ``kubelet``: called with each object created, before it is answered, by a test that plays the
    node running its pod."""

    def __init__(self, replays: list[Replay], answers: dict[str, dict[str, Any]] | None = None,
                 kubelet: Callable[[dict[str, Any]], None] | None = None):
        self.replays = list(replays)
        self.answers = dict(answers or {})
        self.kubelet = kubelet
        self.requests: list[Request] = []
        self.objects: dict[tuple[str, str, str], _Created] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the client expects

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_POST(self) -> None:
                server._handle(self, "POST")

            def do_DELETE(self) -> None:
                server._handle(self, "DELETE")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, name="kubernetes-api", daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> RecordedApiServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ what the test reads

    def sent(self, method: str, pattern: str = "") -> list[Request]:
        return [r for r in self.requests if r.method == method and re.search(pattern, r.path)]

    def created(self) -> list[dict[str, Any]]:
        return [r.body for r in self.sent("POST")]

    # ------------------------------------------------------------ answering

    def _handle(self, http: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(http.path)
        length = int(http.headers.get("Content-Length") or 0)
        raw = http.rfile.read(length) if length else b""
        request = Request(method, url.path, parse_qs(url.query), json.loads(raw) if raw else None, time.monotonic())
        with self.lock:
            self.requests.append(request)
        if method == "GET" and (answer := self.answers.get(url.path)) is not None:
            return _json(http, answer["code"] if answer.get("kind") == "Status" else 200, answer)
        if (match := OBJECT.match(url.path)) is not None:
            namespace, plural, name, status = match.groups()
            if method == "POST" and name is None:
                return self._create(http, namespace, plural, request.body)
            created = self.objects.get((plural, namespace, name or ""))
            if created is None or created.deleted:
                return _status(http, 404, "NotFound", f'{plural} "{name}" not found')
            if method == "GET" and status:
                return _json(http, 200, self._read(created))
            if method == "DELETE" and not status:
                created.deleted = True  # its recorded pods have ended: nothing holds the deletion back
                gone = copy.deepcopy(created.body)
                gone["metadata"].update(deletionTimestamp=_now(), finalizers=["foregroundDeletion"])
                return _json(http, 200, gone)
        elif method == "GET" and (match := PODS.match(url.path)) is not None:
            namespace, pod = match.groups()
            if pod is None:
                return _json(http, 200, self._pods(namespace, request.query.get("labelSelector", [""])[0]))
            return self._log(http, namespace, pod)
        _status(http, 404, "NotFound", f"the server could not find the requested resource ({method} {url.path})")

    def _create(self, http: BaseHTTPRequestHandler, namespace: str, plural: str, body: dict[str, Any]) -> None:
        api_version, kind = ROUTES[plural]
        if body.get("apiVersion") != api_version or body.get("kind") != kind:
            return _status(http, 400, "BadRequest", f"{kind} expected at this path, got {body.get('kind')}")
        if problems := invalid(body):
            return _status(http, 422, "Invalid", f'{kind} "{body["metadata"].get("name")}" is invalid: '
                                                 + "; ".join(problems))
        if not self.replays:
            return _status(http, 403, "Forbidden", "the test gave no replay for another job")
        if self.kubelet is not None:
            self.kubelet(body)
        stored = copy.deepcopy(body)
        stored["metadata"].update(uid=str(uuid.uuid4()), resourceVersion="1", creationTimestamp=_now(),
                                  generation=1)
        self.objects[(plural, namespace, body["metadata"]["name"])] = _Created(stored, self.replays.pop(0))
        _json(http, 201, stored)

    def _read(self, created: _Created) -> dict[str, Any]:
        replay = created.replay
        status = replay.statuses[min(created.reads, len(replay.statuses) - 1)]
        created.reads += 1
        return {**created.body, "status": status}

    def _pod_objects(self, namespace: str) -> list[dict[str, Any]]:
        pods = []
        for (plural, ns, name), created in self.objects.items():
            if ns != namespace or created.deleted:
                continue
            kind = ROUTES[plural][1]
            spec = created.body["spec"]
            templates = ([spec["template"]] if kind == "Job"
                         else [r["template"] for r in spec["pytorchReplicaSpecs"].values()])
            for i, pod in enumerate(created.replay.pods):
                template = templates[min(i, len(templates) - 1)]
                labels = {**template.get("metadata", {}).get("labels", {}), POD_LABEL[kind]: name}
                pods.append({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": f"{name}-{i}", "namespace": ns, "labels": labels,
                                          "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{ns}/{name}-{i}"))},
                             "spec": {**template["spec"], "nodeName": pod.node}, "status": pod.status})
        return pods

    def _pods(self, namespace: str, selector: str) -> dict[str, Any]:
        key, _, value = selector.partition("=")
        items = [p for p in self._pod_objects(namespace) if p["metadata"]["labels"].get(key) == value]
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}

    def _log(self, http: BaseHTTPRequestHandler, namespace: str, pod: str) -> None:
        for (_, ns, name), created in self.objects.items():
            if ns == namespace and pod.rpartition("-")[0] == name:
                data = created.replay.log.encode()
                http.send_response(200)
                http.send_header("Content-Type", "text/plain")
                http.send_header("Transfer-Encoding", "chunked")
                http.end_headers()
                for start in range(0, len(data), 100):  # pieces that cut lines anywhere
                    piece = data[start:start + 100]
                    http.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                http.wfile.write(b"0\r\n\r\n")
                return
        _status(http, 404, "NotFound", f'pods "{pod}" not found')


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _json(http: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    http.send_response(code)
    http.send_header("Content-Type", "application/json")
    http.send_header("Content-Length", str(len(data)))
    http.end_headers()
    http.wfile.write(data)


def _status(http: BaseHTTPRequestHandler, code: int, reason: str, message: str) -> None:
    """An error as the API server answers one: a meta/v1 Status."""
    _json(http, code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code})
