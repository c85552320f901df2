"""A local S3-compatible server for the cloud repository tests: moto's server mode on a
free port, in a thread of the test process, reached over real HTTP by ``sluice serve``'s
s3fs as by the test's boto3 client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sluice.broker.redis_server import free_port

#: Credentials and region the server's clients use (moto accepts any), passed to the
#: ``sluice serve`` under test through Triton's (and botocore's) variables.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "sluice-test",
    "AWS_SECRET_ACCESS_KEY": "sluice-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class LocalS3:
    """A running local S3 server.

    Attributes:
        host_port: ``127.0.0.1:<port>``, as it appears in ``s3://host:port/bucket/path``.
        client: a boto3 S3 client of that server.
    """

    host_port: str
    client: object

    def url(self, bucket: str, path: str) -> str:
        """Triton's path of a private S3 instance: ``s3://host:port/bucket/path``."""
        return f"s3://{self.host_port}/{bucket}/{path}"

    def upload(self, bucket: str, prefix: str, folder: Path) -> list[str]:
        """Upload every file under ``folder`` as ``prefix/<relative path>``; returns the keys."""
        keys = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            self.client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())  # type: ignore[attr-defined]
            keys.append(key)
        return keys


@contextmanager
def local_s3() -> Iterator[LocalS3]:
    """Start moto's S3 server on a free port of 127.0.0.1; stop it on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=AWS_ENV["AWS_DEFAULT_REGION"],
    )
    try:
        yield LocalS3(f"127.0.0.1:{port}", client)
    finally:
        client.close()
        server.stop()
