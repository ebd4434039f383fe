"""A small HTTP server on loopback that answers the routes huggingface_hub calls, for repositories
the tests write. It is a test double, not the Hugging Face Hub: it has what huggingface_hub 2.4's
``resolve_revision``, ``list_repo_tree`` and ``snapshot_download`` read, taken from that
package's source (hf_api.py, file_download.py, utils/_http.py):

- ``GET /api/{models|datasets}/{repo}/revision/{rev}``: ``{"id", "sha", "siblings"}``;
- ``GET /api/{models|datasets}/{repo}/tree/{rev}?recursive=...``: files with ``path``, ``size``, ``oid``;
- ``HEAD|GET /{repo}/resolve/{rev}/{path}`` (``/datasets/{repo}/...`` for datasets): the file,
  with ``ETag`` (the git blob id), ``X-Repo-Commit`` and ``Content-Length``; ``Range`` honoured;
- the errors as ``hf_raise_for_status`` tells them apart, by status and ``X-Error-Code`` /
  ``X-Error-Message``: RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo (401 without a
  token, 403 with one that has no access), a refused token (401 "Invalid credentials in
  Authorization header"), and the rate limit (429 with ``Retry-After``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def blob_id(content: bytes) -> str:
    """git's object id of a file, which the Hub sends as ETag of a file not in LFS."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Repo:
    repo_type: str  # "model" or "dataset"
    repo_id: str
    gated: bool = False
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        """A new commit holding ``files``, which ``branch`` then points at; returns its sha."""
        digest = hashlib.sha1(self.repo_id.encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + blob_id(files[path]).encode())
        digest.update(str(len(self.commits)).encode())
        sha = digest.hexdigest()
        self.commits[sha] = dict(files)
        self.refs[branch] = sha
        return sha

    def resolve(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


class LocalHub:
    """Serve repositories on 127.0.0.1 until ``close()``. ``tokens``: valid tokens; ``granted``:
    tokens whose owner accepted a gated repository's licence. ``rate_limited``: how many of the
    next requests are answered 429. ``requests``: (method, path, token) of every request."""

    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.tokens: set[str] = set()
        self.granted: set[str] = set()
        self.rate_limited = 0
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def repo(self, repo_type: str, repo_id: str, gated: bool = False) -> Repo:
        self.repos[(repo_type, repo_id)] = repo = Repo(repo_type, repo_id, gated)
        return repo

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def take_rate_limit(self) -> bool:
        with self._lock:
            if self.rate_limited > 0:
                self.rate_limited -= 1
                return True
            return False


def _handler(hub: LocalHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _send(self, status: int, payload: bytes = b"", headers: dict[str, str] | None = None,
                  body: bool = True) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self.wfile.write(payload)

        def _error(self, status: int, code: str | None, message: str, body: bool) -> None:
            headers = {"X-Error-Message": message, "Content-Type": "application/json"}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, json.dumps({"error": message}).encode(), headers, body)

        def _token(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None

        def _serve(self, body: bool) -> None:
            url = urllib.parse.urlsplit(self.path)
            token = self._token()
            hub.requests.append((self.command, url.path, token))
            if hub.take_rate_limit():
                self._error(429, None, "You have been rate-limited", body)
                return
            if token is not None and token not in hub.tokens:
                self._error(401, None, "Invalid credentials in Authorization header", body)
                return
            route = _route(url.path)
            if route is None:
                self._error(404, None, "Not found", body)
                return
            kind, repo_type, rest = route
            repo, revision, path = _split(hub, repo_type, rest)
            if repo is None:
                # The Hub answers 401 to anonymous requests for repositories it does not show.
                self._error(401 if token is None else 404, "RepoNotFound", "Repository not found", body)
                return
            if repo.gated and token not in hub.granted:
                self._error(401 if token is None else 403, "GatedRepo",
                            f"Access to {repo_type} {repo.repo_id} is restricted. You must have access to it "
                            "and be authenticated to access it.", body)
                return
            sha = repo.resolve(revision)
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
                return
            files = repo.commits[sha]
            if kind == "revision":
                info = {"id": repo.repo_id, "sha": sha, "private": False, "gated": "manual" if repo.gated else False,
                        "siblings": [{"rfilename": p} for p in sorted(files)]}
                self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
            elif kind == "tree":
                under = path.rstrip("/")
                entries = [{"type": "file", "path": p, "size": len(c), "oid": blob_id(c)}
                           for p, c in sorted(files.items()) if not under or p.startswith(under + "/")]
                self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, body)
            elif path not in files:
                self._error(404, "EntryNotFound", f"{path} does not exist on {revision}", body)
            else:
                self._file(files[path], sha, body)

        def _file(self, content: bytes, sha: str, body: bool) -> None:
            headers = {"ETag": f'"{blob_id(content)}"', "X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
            status, payload = 200, content
            if self.headers.get("Range", "").startswith("bytes="):
                start, _, end = self.headers["Range"].removeprefix("bytes=").partition("-")
                stop = int(end) + 1 if end else len(content)
                payload, status = content[int(start):stop], 206
                headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(content)}"
            self._send(status, payload, headers, body)

    return Handler


def _route(path: str) -> tuple[str, str, str] | None:
    """(kind, repo type, the rest of the path) for the API and resolve routes."""
    for prefix, repo_type in (("/api/models/", "model"), ("/api/datasets/", "dataset")):
        if path.startswith(prefix):
            rest = path.removeprefix(prefix)
            for kind in ("revision", "tree"):
                if f"/{kind}/" in rest:
                    return kind, repo_type, rest.replace(f"/{kind}/", "/resolve/", 1)
            return None
    if "/resolve/" in path:
        rest = path.lstrip("/")
        if rest.startswith("datasets/"):
            return "resolve", "dataset", rest.removeprefix("datasets/")
        return "resolve", "model", rest
    return None


def _split(hub: LocalHub, repo_type: str, rest: str) -> tuple[Repo | None, str, str]:
    """``REPO/resolve/REV[/PATH]`` to the repository, the revision (URL-decoded) and the path."""
    repo_id, _, tail = rest.partition("/resolve/")
    revision, _, path = tail.partition("/")
    return hub.repos.get((repo_type, repo_id)), urllib.parse.unquote(revision), urllib.parse.unquote(path)
