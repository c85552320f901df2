"""The local copy of an s3:// repository against a real S3-compatible server (moto's, in
a thread): what a sync downloads, keeps and removes, how a storage outage is lived
through, and where the copy goes."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_support import AWS_ENV, LocalS3, local_s3

from sluice.repository import scan_repositories
from sluice.repository.errors import RepositoryError
from sluice.repository.mirror import open_repositories


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalS3]:
    with local_s3() as server:
        yield server


@pytest.fixture
def bucket(s3: LocalS3, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket holding ``repo/m/config.pbtxt`` and ``repo/m/1/model.bin``; the AWS
    variables set for this process's s3fs."""
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    name = f"mirror-{uuid.uuid4().hex[:8]}"
    s3.client.create_bucket(Bucket=name)  # type: ignore[attr-defined]
    _put(s3, name, "repo/m/config.pbtxt", b"max_batch_size: 1")
    _put(s3, name, "repo/m/1/model.bin", b"v1")
    return name


def _put(s3: LocalS3, bucket: str, key: str, body: bytes) -> None:
    s3.client.put_object(Bucket=bucket, Key=key, Body=body)  # type: ignore[attr-defined]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_sync_copies_only_what_changed(s3: LocalS3, bucket: str) -> None:
    repositories = open_repositories([s3.url(bucket, "repo")])
    (mirror,) = repositories.mirrors
    (root,) = repositories
    assert root == mirror.local
    assert _files(root) == {"m/config.pbtxt": b"max_batch_size: 1", "m/1/model.bin": b"v1"}
    model_mtime = (root / "m/1/model.bin").stat().st_mtime_ns
    assert mirror.sync() == (0, 0)

    (root / "m/1/__pycache__").mkdir()  # written by a model process: not the bucket's
    (root / "m/1/__pycache__/model.cpython.pyc").write_bytes(b"pyc")
    _put(s3, bucket, "repo/m/config.pbtxt", b"max_batch_size: 2")
    _put(s3, bucket, "repo/m/2/model.bin", b"v2")
    assert mirror.sync() == (2, 0)
    assert (root / "m/config.pbtxt").read_bytes() == b"max_batch_size: 2"
    assert (root / "m/2/model.bin").read_bytes() == b"v2"
    # an unchanged object is not downloaded again: its file keeps its mtime, so the
    # model's fingerprint changes only with its own files
    assert (root / "m/1/model.bin").stat().st_mtime_ns == model_mtime
    assert (root / "m/1/__pycache__/model.cpython.pyc").read_bytes() == b"pyc"

    s3.client.delete_object(Bucket=bucket, Key="repo/m/2/model.bin")  # type: ignore[attr-defined]
    assert mirror.sync() == (0, 1)
    assert not (root / "m/2").exists()  # the folder left empty goes too
    assert not (root / ".sluice-download").exists()
    assert sorted(scan_repositories(repositories).models) == ["m"]


def test_scan_refreshes_the_copy(s3: LocalS3, bucket: str) -> None:
    repositories = open_repositories([s3.url(bucket, "repo")])
    _put(s3, bucket, "repo/n/1/model.bin", b"n")
    assert sorted(scan_repositories(repositories).models) == ["m", "n"]


def test_an_outage_keeps_the_copy_and_logs_once(
    s3: LocalS3, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    repositories = open_repositories([s3.url(bucket, "repo")])
    (mirror,) = repositories.mirrors
    for key in ("repo/m/config.pbtxt", "repo/m/1/model.bin"):
        s3.client.delete_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]
    s3.client.delete_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    with pytest.raises(RepositoryError, match="The specified bucket does not exist"):
        mirror.sync()
    with caplog.at_level(logging.INFO, logger="sluice.repository.mirror"):
        assert sorted(scan_repositories(repositories).models) == ["m"]  # as it was
        assert sorted(scan_repositories(repositories).models) == ["m"]
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, caplog.text
        assert "serving the local copy as it was" in errors[0].getMessage()
        s3.client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
        _put(s3, bucket, "repo/k/1/model.bin", b"k")
        assert sorted(scan_repositories(repositories).models) == ["k"]
        assert "reachable again" in caplog.text


def test_missing_folder_and_bucket_are_refused(s3: LocalS3, bucket: str) -> None:
    with pytest.raises(RepositoryError) as caught:
        open_repositories([s3.url(bucket, "nothing")])
    assert str(caught.value) == (
        f"failed to open model repository '{s3.url(bucket, 'nothing')}': not a directory: "
        f"no objects under '{bucket}/nothing'"
    )
    url = f"s3://{s3.host_port}/no-such-bucket"
    with pytest.raises(RepositoryError, match="The specified bucket does not exist"):
        open_repositories([url])


def test_mount_directory_variable_places_the_copy(
    s3: LocalS3, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path))
    url = s3.url(bucket, "repo")
    repositories = open_repositories([url, url, str(tmp_path / "local")])
    assert tuple(repositories) == (tmp_path / bucket / "repo", tmp_path / "local")
    assert (tmp_path / bucket / "repo/m/1/model.bin").read_bytes() == b"v1"
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path / "absent"))
    with pytest.raises(RepositoryError, match=r"TRITON_AWS_MOUNT_DIRECTORY=.* is not a directory"):
        open_repositories([url])


def test_credentials_come_from_triton_credential_file(
    s3: LocalS3, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no credentials anywhere: botocore finds none and the repository cannot be listed
    for name in AWS_ENV:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "absent"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    url = s3.url(bucket, "repo")
    with pytest.raises(RepositoryError, match="Unable to locate credentials"):
        open_repositories([url])
    path = tmp_path / "cloud_credential.json"
    entry = {
        "key_id": AWS_ENV["AWS_ACCESS_KEY_ID"],
        "secret_key": AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        "region": AWS_ENV["AWS_DEFAULT_REGION"],
    }
    path.write_text(json.dumps({"s3": {f"s3://{s3.host_port}/{bucket}": entry}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    (root,) = open_repositories([url])
    assert (root / "m/1/model.bin").read_bytes() == b"v1"
