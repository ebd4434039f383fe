"""The fetch stage against the real local S3 server (boto3 over HTTP), an HTTP server and local
files: content-addressed outputs, resume, verification, and the errors users hit."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
import zstandard
from prefect import flow
from prefect_aws import AwsClientParameters, AwsCredentials

from pretrain import manifest
from pretrain.presets import load_spec
from pretrain.transfer import PART_SIZE, FetchError, IntegrityError, RemoteObject, S3Reader, download
from tasks.fetch import fetch, reader_for


def spec_with(root: Path, sources: list[dict]):
    spec = load_spec("tiny-local")
    data = spec.data.model_copy(update={"sources": [type(spec.data.sources[0])(**s) for s in sources]})
    paths = spec.paths.model_copy(update={"root": str(root)})
    return spec.model_copy(update={"data": data, "paths": paths, "name": "fetch-test"})


@flow
def run_fetch(spec, retries: int = 0):
    return fetch.with_options(retries=retries, retry_delay_seconds=0)(spec)


def read_fetch_artifact(state) -> tuple[list[dict], str]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    assert artifact.key == "fetch-test-fetch"
    return json.loads(artifact.data), artifact.description


@pytest.fixture
def bucket(s3):
    name = f"b-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def credentials_block(s3_endpoint):
    name = f"s3-{uuid.uuid4().hex[:8]}"
    AwsCredentials(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1",
                   aws_client_parameters=AwsClientParameters(endpoint_url=s3_endpoint)).save(name)
    return name


def test_prefix_is_fetched_decompressed_and_cached(s3, bucket, credentials_block, tmp_path):
    docs = [json.dumps({"text": f"document {i} " * 20}) for i in range(200)]
    plain = "\n".join(docs).encode()
    s3.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=plain)
    s3.put_object(Bucket=bucket, Key="corpus/b.jsonl.zst", Body=zstandard.ZstdCompressor().compress(plain))
    s3.put_object(Bucket=bucket, Key="corpus/c.jsonl.gz", Body=gzip.compress(plain))
    s3.put_object(Bucket=bucket, Key="corpus/sub/d.jsonl.xz", Body=lzma.compress(plain))
    spec = spec_with(tmp_path, [{"uri": f"s3://{bucket}/corpus/", "credentials": credentials_block,
                                 "decompress": True}])

    state = run_fetch(spec, return_state=True)
    out = Path(state.result())
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.jsonl")) == \
        ["a.jsonl", "b.jsonl", "c.jsonl", "sub/d.jsonl"]
    for name in ("a.jsonl", "b.jsonl", "c.jsonl", "sub/d.jsonl"):
        assert (out / name).read_bytes() == plain
    meta = json.loads((out / "MANIFEST.json").read_text())
    assert meta["files"]["b.jsonl"]["sha256"] == hashlib.sha256(plain).hexdigest()
    assert {s["uri"] for s in meta["sources"]} == {f"s3://{bucket}/corpus/{k}" for k in
                                                  ("a.jsonl", "b.jsonl.zst", "c.jsonl.gz", "sub/d.jsonl.xz")}
    rows, _ = read_fetch_artifact(state)
    assert {r["file"] for r in rows} == {"a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl"}
    assert all(r["MB/s"] is not None for r in rows)

    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    second = run_fetch(spec, return_state=True)
    assert second.result() == str(out)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == mtimes
    rows, description = read_fetch_artifact(second)
    assert "nothing downloaded" in description and all(r["transferred"] == 0 for r in rows)

    # A changed source is a new key: a new output directory, the old one untouched.
    s3.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=plain + b"\n")
    third = run_fetch(spec, return_state=True)
    assert third.result() != str(out) and (out / "MANIFEST.json").exists()


def test_deleted_output_file_is_fetched_again(s3, bucket, tmp_path):
    # A public object, read without credentials like s3://neuron-s3 in the runbooks.
    s3.put_object(Bucket=bucket, Key="one.txt", Body=b"x" * 1000, ACL="public-read")
    spec = spec_with(tmp_path, [{"uri": f"s3://{bucket}/one.txt", "endpoint_url": s3.meta.endpoint_url}])
    out = Path(run_fetch(spec))
    (out / "one.txt").unlink()
    assert Path(run_fetch(spec)) == out and (out / "one.txt").read_bytes() == b"x" * 1000


def multipart_object(s3, bucket: str, key: str, parts: int) -> bytes:
    body = os.urandom(parts * PART_SIZE - 12345)
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)
    etags = []
    for i in range(parts):
        chunk = body[i * PART_SIZE:(i + 1) * PART_SIZE]
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=i + 1, Body=chunk)
        etags.append({"PartNumber": i + 1, "ETag": r["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": etags})
    return body


def drop_connection_after(last_chunk: int):
    def on_chunk(index: int) -> None:
        if index == last_chunk:
            raise ConnectionError("network dropped")
    return on_chunk


def test_large_object_is_downloaded_in_parallel_ranges_and_resumed(s3, bucket, tmp_path):
    body = multipart_object(s3, bucket, "big.bin", parts=4)
    reader = S3Reader(s3)
    (obj,) = reader.list(f"s3://{bucket}/big.bin")
    assert obj.etag.endswith("-4")
    dest = tmp_path / "big.bin"

    # One worker makes the interruption point deterministic: chunks 0 and 1 land, then it stops.
    with pytest.raises(ConnectionError):
        download(reader, obj, dest, workers=1, on_chunk=drop_connection_after(1))
    assert not dest.exists()
    result = download(reader, obj, dest)
    assert result.bytes_transferred == len(body) - 2 * PART_SIZE
    assert dest.read_bytes() == body
    assert result.sha256 == hashlib.sha256(body).hexdigest()


def test_corrupted_partial_download_is_discarded_never_marked_done(s3, bucket, tmp_path):
    body = multipart_object(s3, bucket, "big.bin", parts=3)
    reader = S3Reader(s3)
    (obj,) = reader.list(f"s3://{bucket}/big.bin")
    dest = tmp_path / "big.bin"
    with pytest.raises(ConnectionError):
        download(reader, obj, dest, workers=1, on_chunk=drop_connection_after(2))
    part = dest.with_name("big.bin.part")
    with open(part, "r+b") as f:  # a bit flipped on disk by an earlier, broken attempt
        f.seek(100)
        flipped = f.read(1)[0] ^ 0x01  # the body is random: writing a fixed byte missed 1 run in 256
        f.seek(100)
        f.write(bytes([flipped]))
    with pytest.raises(IntegrityError, match="ETag"):
        download(reader, obj, dest)
    assert not dest.exists() and not part.exists()
    download(reader, obj, dest)
    assert dest.read_bytes() == body


def test_truncated_file_fails_size_check(s3, bucket, tmp_path):
    s3.put_object(Bucket=bucket, Key="small.bin", Body=b"y" * 5000)
    reader = S3Reader(s3)
    (obj,) = reader.list(f"s3://{bucket}/small.bin")
    truncated = RemoteObject(obj.uri, obj.name, obj.size + 10, obj.etag)  # the source promised more bytes
    with pytest.raises(IntegrityError, match="truncated"):
        download(reader, truncated, tmp_path / "small.bin")
    assert not (tmp_path / "small.bin").exists()


def test_checksum_mismatch_fails_and_leaves_no_output(s3, bucket, tmp_path):
    s3.put_object(Bucket=bucket, Key="vocab.json", Body=b"{}", ACL="public-read")
    spec = spec_with(tmp_path, [{"uri": f"s3://{bucket}/vocab.json", "endpoint_url": s3.meta.endpoint_url,
                                 "sha256": "0" * 64}])
    state = run_fetch(spec, return_state=True)
    assert state.is_failed()
    with pytest.raises(IntegrityError, match="sha256"):
        state.result()
    assert not list((tmp_path / "fetch").glob("fetch-*"))  # nothing that looks complete


def test_missing_bucket_key_and_private_objects_name_the_source(s3, bucket, tmp_path):
    with pytest.raises(FetchError, match="bucket does not exist"):
        S3Reader(s3).list("s3://no-such-bucket-here/x.txt")
    with pytest.raises(FetchError, match=f"s3://{bucket}/missing.txt: no such object"):
        S3Reader(s3).list(f"s3://{bucket}/missing.txt")
    with pytest.raises(FetchError, match="no objects under this prefix"):
        S3Reader(s3).list(f"s3://{bucket}/empty/")
    s3.put_object(Bucket=bucket, Key="private.txt", Body=b"secret")
    anonymous = spec_with(tmp_path, [{"uri": f"s3://{bucket}/private.txt", "endpoint_url": s3.meta.endpoint_url}])
    with pytest.raises(FetchError, match="not public; name an AwsCredentials block"):
        reader_for(anonymous.data.sources[0]).list(f"s3://{bucket}/private.txt")


def test_key_escaping_the_output_directory_is_refused(s3, bucket, tmp_path):
    s3.put_object(Bucket=bucket, Key="corpus/../../etc/evil", Body=b"x")
    with pytest.raises(FetchError, match="outside the output directory"):
        S3Reader(s3).list(f"s3://{bucket}/corpus/")


def test_unreachable_endpoint_gives_a_clear_error_after_bounded_retries(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec = spec_with(tmp_path, [{"uri": "s3://b/k", "endpoint_url": f"http://127.0.0.1:{port}"}])
    started = time.monotonic()
    with pytest.raises(FetchError, match="cannot reach the S3 endpoint") as info:
        reader_for(spec.data.sources[0]).list("s3://b/k")
    assert info.value.retryable
    assert time.monotonic() - started < 60


def test_wrong_credentials_are_rejected_with_the_block_named(tmp_path):
    """A second S3 server that checks credentials (moto with IAM auth after two set-up calls)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "2"}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="x", aws_secret_access_key="x")
        iam.create_user(UserName="reader")
        iam.create_access_key(UserName="reader")
        AwsCredentials(aws_access_key_id="AKIAWRONGWRONGWRONG1", aws_secret_access_key="nope",
                       region_name="us-east-1",
                       aws_client_parameters=AwsClientParameters(endpoint_url=endpoint)).save("bad-creds", overwrite=True)
        spec = spec_with(tmp_path, [{"uri": "s3://any-bucket/corpus/", "credentials": "bad-creds"}])
        reader = reader_for(spec.data.sources[0])
        with pytest.raises(FetchError, match="credentials of credentials block 'bad-creds' were rejected") as info:
            reader.list("s3://any-bucket/corpus/")
        assert "nope" not in str(info.value) and not info.value.retryable
        with pytest.raises(FetchError, match="access denied .* with credentials block 'bad-creds'") as info:
            reader.list("s3://any-bucket/data.jsonl")
        assert "nope" not in str(info.value) and not info.value.retryable
    finally:
        server.terminate()
        server.wait(timeout=10)


class RangeHandler(SimpleHTTPRequestHandler):
    """http.server with Range support, as real file servers have."""

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if "Range" not in self.headers or not path.is_file():
            return super().send_head()
        start, end = self.headers["Range"].removeprefix("bytes=").split("-")
        data = path.read_bytes()[int(start):int(end) + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)

    def log_message(self, *args):
        pass


def test_https_style_and_local_sources(tmp_path):
    served = tmp_path / "www"
    served.mkdir()
    vocab = os.urandom(3 * PART_SIZE)
    (served / "gpt2-vocab.json").write_bytes(vocab)
    (served / "gpt2-merges.txt").write_bytes(b"#version: 0.2\n")
    local = tmp_path / "local-corpus"
    local.mkdir()
    (local / "x.jsonl").write_text('{"text": "local"}\n')
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(RangeHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        spec = spec_with(tmp_path / "root", [{"uri": f"{base}/gpt2-vocab.json"},
                                             {"uri": f"{base}/gpt2-merges.txt"},
                                             {"uri": str(local)}])
        out = Path(run_fetch(spec))
        assert (out / "gpt2-vocab.json").read_bytes() == vocab
        assert (out / "x.jsonl").read_text() == '{"text": "local"}\n'
        assert manifest.load_valid(out, json.loads((out / "MANIFEST.json").read_text())["key"], deep=True)
        missing = spec_with(tmp_path / "root", [{"uri": f"{base}/nope.json"}])
        with pytest.raises(FetchError, match="HTTP 404"):
            run_fetch(missing)
    finally:
        server.shutdown()


class TokenRangeHandler(RangeHandler):
    """A file server that, like the Hugging Face Hub for gated models, wants a bearer token,
    and sends one redirect to another host (as the Hub does to its CDN)."""

    token = "hf_" + "x" * 34
    seen_on_redirect: list[str | None] = []

    def send_head(self):
        if self.path.startswith("/cdn/"):
            TokenRangeHandler.seen_on_redirect.append(self.headers.get("Authorization"))
            self.path = self.path.removeprefix("/cdn")
            return super().send_head()
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_error(401, "Unauthorized")
            return None
        if self.path.startswith("/redirect/"):
            self.send_response(302)
            # another host name for the same server: a different origin for urllib
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/cdn/"
                                         + self.path.removeprefix("/redirect/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return super().send_head()


def test_https_source_with_a_token_from_a_secret_block(tmp_path):
    from prefect import get_client
    from prefect.blocks.system import Secret
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    served = tmp_path / "www"
    served.mkdir()
    weights = os.urandom(PART_SIZE + 123)
    (served / "model.safetensors").write_bytes(weights)
    Secret(value=TokenRangeHandler.token).save("hf-token-test", overwrite=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(TokenRangeHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        spec = spec_with(tmp_path / "root", [{"uri": f"{base}/model.safetensors", "credentials": "hf-token-test"}])
        state = run_fetch(spec, return_state=True)
        out = Path(state.result())
        assert (out / "model.safetensors").read_bytes() == weights
        APILogWorker.drain_all(timeout=30)
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[state.state_details.flow_run_id])))
        assert logs and not any(TokenRangeHandler.token in log.message for log in logs)

        # a redirect to another host never carries the token
        TokenRangeHandler.seen_on_redirect.clear()
        redirected = spec_with(tmp_path / "root2", [{"uri": f"{base}/redirect/model.safetensors",
                                                     "credentials": "hf-token-test"}])
        assert (Path(run_fetch(redirected)) / "model.safetensors").read_bytes() == weights
        assert TokenRangeHandler.seen_on_redirect and set(TokenRangeHandler.seen_on_redirect) == {None}

        anonymous = spec_with(tmp_path / "root3", [{"uri": f"{base}/model.safetensors"}])
        with pytest.raises(FetchError, match="HTTP 401.*name a Secret block holding it"):
            run_fetch(anonymous)
        Secret(value="hf_revoked").save("hf-token-revoked", overwrite=True)
        refused = spec_with(tmp_path / "root4", [{"uri": f"{base}/model.safetensors", "credentials": "hf-token-revoked"}])
        with pytest.raises(FetchError, match="HTTP 401.*was refused; renew it") as info:
            run_fetch(refused)
        assert "hf_revoked" not in str(info.value)
    finally:
        server.shutdown()
