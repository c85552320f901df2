"""Cloud repository paths taken apart as Triton writes them (user guide,
model_repository.md, "Model Repository Locations"), and the filesystem each one opens."""

from __future__ import annotations

import importlib.util

import pytest

from sluice.repository.cloud import (
    CloudLocation,
    is_cloud_location,
    open_filesystem,
    parse_location,
)
from sluice.repository.errors import RepositoryError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3://bucket/path/to/repo", ("s3", "bucket", "path/to/repo", None, None)),
        ("s3://bucket", ("s3", "bucket", "", None, None)),
        ("s3://bucket/models/", ("s3", "bucket", "models", None, None)),
        ("s3://minio:9000/bucket/models", ("s3", "bucket", "models", "http://minio:9000", None)),
        (
            "s3://https://s3.example.com:443/bucket/a/b",
            ("s3", "bucket", "a/b", "https://s3.example.com:443", None),
        ),
        ("s3://http://10.0.0.7:9000/b", ("s3", "b", "", "http://10.0.0.7:9000", None)),
        ("gs://bucket/path/to/repo", ("gs", "bucket", "path/to/repo", None, None)),
        ("as://acct/container/path", ("as", "container", "path", None, "acct")),
    ],
)
def test_parse_location(text: str, expected: tuple[object, ...]) -> None:
    location = parse_location(text)
    assert (
        location.scheme,
        location.bucket,
        location.path,
        location.endpoint,
        location.account,
    ) == expected
    assert location.url == text
    assert is_cloud_location(text)


def test_root_is_the_bucket_and_the_path() -> None:
    assert parse_location("s3://h:1/b/x/y").root == "b/x/y"
    assert parse_location("gs://b").root == "b"


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("s3://", "no bucket; expected s3://[host:port/]bucket/path"),
        ("s3://minio:9000/", "no bucket"),
        ("s3://https://no-port/bucket", "expected s3://https://host:port/bucket/path"),
        ("gs://", "no bucket; expected gs://bucket/path"),
        ("as://acct", "no container; expected as://account/container/path"),
        ("as:///container/path", "expected as://account/container/path"),
    ],
)
def test_malformed_paths_name_the_form_expected(text: str, rule: str) -> None:
    with pytest.raises(RepositoryError) as caught:
        parse_location(text)
    assert f"model repository '{text}'" in str(caught.value)
    assert rule in str(caught.value)


@pytest.mark.parametrize("text", ["/models", "models", "s3:/bucket/models", "http://h/x", ""])
def test_local_folders_are_not_cloud_paths(text: str) -> None:
    assert not is_cloud_location(text)


def test_s3_filesystem_reaches_the_private_endpoint() -> None:
    import s3fs

    fs = open_filesystem(parse_location("s3://127.0.0.1:9/bucket/models"))
    assert isinstance(fs, s3fs.S3FileSystem)
    assert fs.client_kwargs == {"endpoint_url": "http://127.0.0.1:9"}
    assert fs.config_kwargs["s3"] == {"addressing_style": "path"}
    assert fs.config_kwargs["connect_timeout"] == 5
    assert fs.retries == 2  # a storage that does not answer holds a scan a bounded time


def test_missing_package_is_named() -> None:
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed (the cloud extra)")
    location = CloudLocation("gs://bucket/models", "gs", "bucket", "models")
    with pytest.raises(RepositoryError) as caught:
        open_filesystem(location)
    assert str(caught.value) == (
        "model repository 'gs://bucket/models' needs the Python package 'gcsfs', which is "
        "not installed: pip install gcsfs (or the 'cloud' extra of sluice)"
    )
