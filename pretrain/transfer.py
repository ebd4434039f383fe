"""Bring one remote object to local disk: parallel ranged reads, resume, verification.

Sources are read through a small :class:`Reader` interface (S3, HTTP(S), local files), so the
download engine — chunking, resume state, size/ETag/sha256 checks, decompression — is written
once. No Prefect here: the fetch task supplies clients built from its blocks.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Protocol

import botocore.exceptions
import zstandard

ANONYMOUS = "anonymous access"
PART_SIZE = 8 << 20  # ranged-read chunk; also S3's default multipart part size
PARALLEL_THRESHOLD = 2 * PART_SIZE
COMPRESSED_SUFFIXES = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}


class FetchError(RuntimeError):
    """A source that cannot be fetched as asked; the message names the source and the fix.

    ``retryable`` says whether trying again can help (a dropped connection, a corrupt
    transfer) or not (a missing bucket, wrong credentials).
    """

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class IntegrityError(FetchError):
    """The bytes on disk are not the object's: the partial download is discarded."""

    def __init__(self, message: str):
        super().__init__(message, retryable=True)


@dataclass(frozen=True)
class RemoteObject:
    uri: str
    name: str  # relative path inside the fetch output
    size: int
    etag: str  # S3 ETag, HTTP ETag/Last-Modified, or size+mtime for local files


class Reader(Protocol):
    def read_range(self, obj: RemoteObject, start: int, end: int) -> bytes: ...


def safe_relative_name(key: str, source: str) -> str:
    """A key as a path inside the output directory; keys that would escape it are refused."""
    path = PurePosixPath(key)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise FetchError(f"{source}: object key {key!r} would be written outside the output "
                         "directory; rename the object or fetch it by its own URI")
    return path.as_posix()


# ---------------------------------------------------------------- readers


@contextmanager
def _s3_errors(uri: str, access: str) -> Iterator[None]:
    """Turn botocore's exceptions into messages that name the source, the access and the fix."""
    try:
        yield
    except botocore.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket" or (exc.operation_name == "HeadBucket" and status == 404):
            raise FetchError(f"{uri}: bucket does not exist; check the bucket name") from None
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            raise FetchError(f"{uri}: no such object; check the key (or end a prefix with '/')") from None
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
            raise FetchError(f"{uri}: the credentials of {access} were rejected ({code}); "
                             "fix the access key and secret in that block") from None
        if (code in ("AccessDenied", "403") or status == 403) and access == ANONYMOUS:
            raise FetchError(f"{uri}: access denied (HTTP 403) to anonymous access: the object is "
                             "not public; name an AwsCredentials block in the source's "
                             "`credentials`") from None
        if code in ("AccessDenied", "403") or status == 403:
            # HEAD answers carry no error code: wrong keys and missing permission look alike.
            raise FetchError(f"{uri}: access denied (HTTP 403) with {access}: the keys are wrong "
                             "or lack read permission; fix the keys in that block, grant "
                             "s3:GetObject/s3:ListBucket, or set `credentials` on the source") from None
        if code in ("PreconditionFailed", "412") or status == 412:
            raise FetchError(f"{uri}: the object changed during the download; fetching again",
                             retryable=True) from None
        raise FetchError(f"{uri}: S3 error {code or status}: {exc}", retryable=True) from None
    except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
            botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectionClosedError) as exc:
        raise FetchError(f"{uri}: cannot reach the S3 endpoint after retries ({exc}); check "
                         f"`endpoint_url` of the source or of {access}, and the network",
                         retryable=True) from None


class S3Reader:
    """Ranged GETs with a boto3 client; listing of prefixes.

    ``access`` describes the credentials in messages, e.g. "credentials block 'local-s3'".
    """

    def __init__(self, client: Any, access: str = ANONYMOUS):
        self.client = client
        self.access = access

    @staticmethod
    def split(uri: str) -> tuple[str, str]:
        parsed = urllib.parse.urlparse(uri)
        return parsed.netloc, parsed.path.lstrip("/")

    def list(self, uri: str) -> list[RemoteObject]:
        with _s3_errors(uri, self.access):
            return self._list(uri)

    def _list(self, uri: str) -> list[RemoteObject]:
        bucket, key = self.split(uri)
        if key and not key.endswith("/"):
            try:
                head = self.client.head_object(Bucket=bucket, Key=key)
            except botocore.exceptions.ClientError as exc:
                # A HEAD 404 carries no error code: ask whether the bucket itself is missing.
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    self.client.head_bucket(Bucket=bucket)
                raise
            return [RemoteObject(uri, safe_relative_name(PurePosixPath(key).name, uri),
                                 head["ContentLength"], head["ETag"].strip('"'))]
        objects = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for item in page.get("Contents", []):
                if item["Key"].endswith("/"):
                    continue  # folder placeholder objects
                rel = safe_relative_name(item["Key"][len(key):], uri)
                objects.append(RemoteObject(f"s3://{bucket}/{item['Key']}", rel, item["Size"],
                                            item["ETag"].strip('"')))
        if not objects:
            raise FetchError(f"{uri}: no objects under this prefix; check the bucket and prefix")
        return objects

    def read_range(self, obj: RemoteObject, start: int, end: int) -> bytes:
        bucket, key = self.split(obj.uri)
        with _s3_errors(obj.uri, self.access):
            # IfMatch: chunks of one file must all come from the same version of the object
            resp = self.client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                          IfMatch=f'"{obj.etag}"')
            return resp["Body"].read()

    def multipart_part_size(self, obj: RemoteObject) -> int:
        bucket, key = self.split(obj.uri)
        with _s3_errors(obj.uri, self.access):
            return self.client.head_object(Bucket=bucket, Key=key, PartNumber=1)["ContentLength"]


@contextmanager
def _http_errors(uri: str, authorized: bool = False) -> Iterator[None]:
    try:
        yield
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            fix = ("the token in the source's credentials Secret block was refused; renew it" if authorized
                   else "the server wants a token: name a Secret block holding it as the source's credentials")
            raise FetchError(f"{uri}: HTTP {exc.code} {exc.reason}; {fix}") from None
        raise FetchError(f"{uri}: HTTP {exc.code} {exc.reason}; check the URL",
                         retryable=exc.code >= 500) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise FetchError(f"{uri}: cannot reach the server ({exc}); check the URL and the network",
                         retryable=True) from None


class HttpReader:
    """https:// sources; ``token`` (a Hugging Face token, say) is sent as a bearer token."""

    def __init__(self, timeout_s: float = 60, token: str | None = None):
        self.timeout_s = timeout_s
        self.token = token

    def _request(self, uri: str, **kwargs: Any) -> urllib.request.Request:
        request = urllib.request.Request(uri, **kwargs)
        if self.token:
            # Unredirected: a redirect to another host (a CDN) must not receive the token.
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return request

    def list(self, uri: str) -> list[RemoteObject]:
        request = self._request(uri, method="HEAD")
        with _http_errors(uri, bool(self.token)), urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
            size = int(resp.headers.get("Content-Length", -1))
            tag = resp.headers.get("ETag") or resp.headers.get("Last-Modified") or ""
        name = PurePosixPath(urllib.parse.urlparse(uri).path).name
        if size < 0:
            raise FetchError(f"{uri}: the server sends no Content-Length, so the download "
                             "cannot be verified")
        tag = tag.strip('"')
        return [RemoteObject(uri, safe_relative_name(name, uri), size, f"{tag}|{size}")]

    def read_range(self, obj: RemoteObject, start: int, end: int) -> bytes:
        request = self._request(obj.uri, headers={"Range": f"bytes={start}-{end - 1}"})
        with _http_errors(obj.uri, bool(self.token)), urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
            data = resp.read()
            if resp.status == 200 and (start, end) != (0, obj.size):
                data = data[start:end]  # the server ignored Range
        return data


class LocalReader:
    def list(self, uri: str) -> list[RemoteObject]:
        root = Path(uri).expanduser()
        if root.is_file():
            files = [(root, root.name)]
        elif root.is_dir():
            files = [(p, p.relative_to(root).as_posix()) for p in sorted(root.rglob("*")) if p.is_file()]
        else:
            raise FetchError(f"{uri}: no such file or directory")
        return [RemoteObject(str(p), name, p.stat().st_size, f"{p.stat().st_size}-{p.stat().st_mtime_ns}")
                for p, name in files]

    def read_range(self, obj: RemoteObject, start: int, end: int) -> bytes:
        with open(obj.uri, "rb") as f:
            f.seek(start)
            return f.read(end - start)


# ---------------------------------------------------------------- download engine


@dataclass
class DownloadResult:
    name: str
    bytes: int  # size of the object
    bytes_transferred: int  # what this attempt read (less than ``bytes`` after a resume)
    seconds: float
    sha256: str


def _etag_of_file(path: Path, etag: str, part_size: Callable[[], int]) -> str:
    """The S3 ETag the file would have: md5, or md5 of part md5s for multipart uploads."""
    if "-" not in etag:
        digest = hashlib.md5()
        with open(path, "rb") as f:
            while chunk := f.read(PART_SIZE):
                digest.update(chunk)
        return digest.hexdigest()
    size, parts = part_size(), hashlib.md5()
    count = 0
    with open(path, "rb") as f:
        while chunk := f.read(size):
            parts.update(hashlib.md5(chunk).digest())
            count += 1
    return f"{parts.hexdigest()}-{count}"


def download(reader: Reader, obj: RemoteObject, dest: Path, workers: int = 8,
             expected_sha256: str | None = None,
             on_chunk: Callable[[int], None] | None = None) -> DownloadResult:
    """Download ``obj`` to ``dest``, resuming from ``dest.part`` when an earlier attempt left one.

    Chunks are written in place with ``pwrite``; a small state file records finished chunks,
    so a retry reads only what is missing. The file is renamed to ``dest`` only after its size
    and checksum match; on a mismatch the partial data is deleted and IntegrityError raised.
    """
    part, state_path = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    chunks = [(s, min(s + PART_SIZE, obj.size)) for s in range(0, obj.size, PART_SIZE)] or [(0, 0)]
    done: set[int] = set()
    if part.exists() and state_path.exists():
        state = json.loads(state_path.read_text())
        if state.get("etag") == obj.etag and state.get("size") == obj.size:
            done = set(state["done"])
    if not done:
        with open(part, "wb") as f:
            f.truncate(obj.size)
    lock, transferred = threading.Lock(), [0]
    start_time = time.monotonic()
    fd = os.open(part, os.O_WRONLY)

    def fetch_chunk(index: int) -> None:
        start, end = chunks[index]
        data = reader.read_range(obj, start, end) if end > start else b""
        if len(data) != end - start:
            raise IntegrityError(f"{obj.uri}: got {len(data)} bytes for range {start}-{end}, "
                                 f"expected {end - start} (truncated transfer)")
        os.pwrite(fd, data, start)
        with lock:
            done.add(index)
            transferred[0] += len(data)
            state_path.write_text(json.dumps({"etag": obj.etag, "size": obj.size, "done": sorted(done)}))
        if on_chunk is not None:
            on_chunk(index)

    try:
        todo = [i for i in range(len(chunks)) if i not in done]
        if obj.size >= PARALLEL_THRESHOLD and workers > 1:
            with ThreadPoolExecutor(workers) as pool:
                for future in [pool.submit(fetch_chunk, i) for i in todo]:
                    future.result()
        else:
            for i in todo:
                fetch_chunk(i)
        os.fsync(fd)
    finally:
        os.close(fd)
    sha256 = _verify(reader, obj, part, expected_sha256)
    os.replace(part, dest)
    state_path.unlink(missing_ok=True)
    return DownloadResult(obj.name, obj.size, transferred[0], time.monotonic() - start_time, sha256)


def _verify(reader: Reader, obj: RemoteObject, part: Path, expected_sha256: str | None) -> str:
    def discard(message: str) -> IntegrityError:
        part.unlink(missing_ok=True)
        part.with_name(part.name + ".json").unlink(missing_ok=True)
        return IntegrityError(f"{obj.uri}: {message}; the partial download was discarded and "
                              "will be fetched again")

    if part.stat().st_size != obj.size:
        raise discard(f"size {part.stat().st_size} on disk, {obj.size} at the source")
    if isinstance(reader, S3Reader):
        actual = _etag_of_file(part, obj.etag, lambda: reader.multipart_part_size(obj))
        if actual != obj.etag:
            raise discard(f"ETag {actual} on disk, {obj.etag} at the source")
    sha256 = hashlib.sha256()
    with open(part, "rb") as f:
        while chunk := f.read(PART_SIZE):
            sha256.update(chunk)
    if expected_sha256 and sha256.hexdigest() != expected_sha256.lower():
        raise discard(f"sha256 {sha256.hexdigest()} on disk, {expected_sha256} expected by the spec")
    return sha256.hexdigest()


def decompressed_name(name: str) -> str | None:
    """The name without its compression suffix, or None for an uncompressed file."""
    for suffix in (*COMPRESSED_SUFFIXES, ".zst"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def decompress(path: Path) -> Path:
    """Stream-decompress ``path`` beside itself (temporary name, then rename) and remove it."""
    target = path.with_name(decompressed_name(path.name) or path.name)
    tmp = target.with_name(target.name + ".tmp")
    try:
        if path.suffix == ".zst":
            with open(path, "rb") as src, open(tmp, "wb") as dst:
                zstandard.ZstdDecompressor().copy_stream(src, dst)
        else:
            with COMPRESSED_SUFFIXES[path.suffix](path, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, PART_SIZE)
    except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as exc:
        tmp.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise IntegrityError(f"{path.name}: cannot decompress ({exc}); the file is truncated or "
                             "corrupt and will be fetched again") from exc
    os.replace(tmp, target)
    path.unlink()
    return target
