"""An S3-compatible server on 127.0.0.1 for the object-storage tests: moto's server mode, real
HTTP. Within ``authenticated()`` moto checks every request's signature and IAM policy, so that
a request with bad credentials or without permission is denied as AWS denies it (outside it
any credentials pass: moto 5's signature check fails listings by prefix, which pyarrow signs
with a ``/`` delimiter, so only direct object requests are tested under it).

Two users: ``reader`` (``s3:*``: what ember uses) and ``nobody`` (no policy: every request is
denied). Objects are put with boto3 (pyarrow's multipart upload trips over moto's answer).

Example (needs ``moto[server]``)::

    with S3Server() as s3:
        s3.bucket("data")
        s3.put("data/train/a.csv", b"y,c\\n1,x\\n")
        options = s3.options()          # data.storage_options for ember
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from ember.testing.distributed import free_port

__all__ = ["S3Server", "missing", "server_or_skip"]


def missing() -> str | None:
    """What the server needs that is not installed (a message for a skip), or None."""
    try:
        import boto3  # noqa: F401
        from moto.server import ThreadedMotoServer  # noqa: F401
    except ImportError as e:
        return f"the S3 test server needs moto[server] and boto3 ({e}); pip install 'moto[server]' boto3"
    return None


class S3Server:
    """moto's S3 server on a free port of 127.0.0.1 for the with-block; ``url`` its address.
    ``port``: a fixed port (a test that starts the server late)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.keys: dict[str, tuple[str, str]] = {}

    def __enter__(self) -> "S3Server":
        import boto3
        import requests
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        requests.post(f"{self.url}/moto-api/reset", timeout=10)  # one process, one moto: start clean
        kw = dict(endpoint_url=self.url, region_name="us-east-1")
        iam = boto3.client("iam", aws_access_key_id="admin", aws_secret_access_key="admin", **kw)
        for user, actions in (("reader", ["s3:*"]), ("nobody", [])):
            iam.create_user(UserName=user)
            if actions:
                policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
                iam.put_user_policy(UserName=user, PolicyName="access", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            self.keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
        self.client = boto3.client("s3", aws_access_key_id=self.keys["reader"][0],
                                   aws_secret_access_key=self.keys["reader"][1], **kw)
        return self

    def __exit__(self, *exc: object) -> None:
        self._auth(False)
        self._server.stop()

    @contextlib.contextmanager
    def authenticated(self) -> Iterator[None]:
        """Within the block every request is authenticated and authorized (moto's IAM checks)."""
        self._auth(True)
        try:
            yield
        finally:
            self._auth(False)

    def _auth(self, on: bool) -> None:
        import requests

        requests.post(f"{self.url}/moto-api/reset-auth", data=b"0" if on else b"inf", timeout=10).raise_for_status()

    def bucket(self, name: str) -> None:
        self.client.create_bucket(Bucket=name)

    def put(self, key: str, body: bytes) -> None:
        """Put ``body`` at ``bucket/key``."""
        bucket, _, name = key.partition("/")
        self.client.put_object(Bucket=bucket, Key=name, Body=body)

    def upload(self, local: str | Path, key: str) -> str:
        """Upload a local file (or every file under a directory, keys by relative path) to
        ``bucket/key``; returns ``s3://bucket/key``."""
        local = Path(local)
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            self.put(key if local.is_file() else f"{key.rstrip('/')}/{f.relative_to(local).as_posix()}", f.read_bytes())
        return f"s3://{key}"

    def options(self, user: str = "reader", **more: Any) -> dict[str, Any]:
        """``data.storage_options`` reaching this server as ``user``."""
        access, secret = self.keys[user]
        return {"endpoint_override": self.url, "access_key": access, "secret_key": secret, "region": "us-east-1",
                "retries": 2, **more}

    def env(self, user: str = "reader") -> dict[str, str]:
        """The standard environment variables reaching this server as ``user`` (a subprocess)."""
        access, secret = self.keys[user]
        return {**os.environ, "AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": access,
                "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1"}


def server_or_skip(*buckets: str) -> Iterator[S3Server]:
    """A started server holding ``buckets``, for a pytest fixture to ``yield from``; the test
    skips, saying what is missing, when the server cannot start."""
    import pytest

    why = missing()
    if why:
        pytest.skip(why)
    try:
        server = S3Server().__enter__()
    except Exception as e:  # a port, a broken install: say what
        pytest.skip(f"the moto S3 server did not start: {e}")
    try:
        for bucket in buckets:
            server.bucket(bucket)
        yield server
    finally:
        server.__exit__(None, None, None)
