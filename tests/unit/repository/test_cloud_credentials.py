"""Credentials of a cloud repository: Triton's credential file (TRITON_CLOUD_CREDENTIAL_PATH,
longest matching prefix) before the environment variables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.repository.cloud import parse_location
from sluice.repository.credentials import credential_options
from sluice.repository.errors import RepositoryError


def _options(url: str) -> dict[str, object]:
    location = parse_location(url)
    return credential_options(location.scheme, location.url)


CREDENTIALS = {
    "s3": {
        "": {"key_id": "K0", "secret_key": "S0", "region": "r0", "session_token": ""},
        "s3://bucket-2": {"key_id": "K2", "secret_key": "S2", "session_token": "T2"},
        "s3://http://minio:9000/b": {"key_id": "KM", "secret_key": "SM", "region": ""},
    },
    "gs": {"": "/default.json", "gs://bucket-2": "/two.json"},
    "as": {"as://acct/c": {"account_str": "acct", "account_key": "AK"}},
}


@pytest.fixture
def credential_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cloud_credential.json"
    path.write_text(json.dumps(CREDENTIALS))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    return path


@pytest.mark.usefixtures("credential_file")
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "s3://other/models",
            {"key": "K0", "secret": "S0", "client_kwargs": {"region_name": "r0"}},
        ),
        ("s3://bucket-2/models", {"key": "K2", "secret": "S2", "token": "T2"}),
        ("s3://http://minio:9000/b/m", {"key": "KM", "secret": "SM"}),
        ("gs://bucket-2/models", {"token": "/two.json"}),
        ("gs://elsewhere/models", {"token": "/default.json"}),
        ("as://acct/c/models", {"account_key": "AK"}),
    ],
)
def test_the_longest_matching_prefix_wins(url: str, expected: dict[str, object]) -> None:
    assert _options(url) == expected


def test_without_a_file_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_KEY", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_AUTH_TYPE", raising=False)
    location = parse_location("as://acct/c/m")
    assert _options("s3://b/m") == {}  # botocore reads AWS_*
    assert _options(location.url) == {}  # anonymous
    monkeypatch.setenv("AZURE_STORAGE_AUTH_TYPE", "managed_identity")
    assert _options(location.url) == {"anon": False}
    monkeypatch.setenv("AZURE_STORAGE_KEY", "key")
    assert _options(location.url) == {"account_key": "key"}


def test_no_matching_entry_falls_back_to_the_environment(
    credential_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_KEY", "from-env")
    assert _options("as://other/c/m") == {"account_key": "from-env"}


def test_a_bad_file_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    with pytest.raises(RepositoryError, match="cannot read the cloud credential file"):
        _options("s3://b/m")
    path.write_text(json.dumps({"gs": {"": {"not": "a path"}}}))
    with pytest.raises(RepositoryError) as caught:
        _options("gs://b/m")
    assert str(caught.value) == (
        f"cloud credential file '{path}': the 'gs' entry for 'gs://b/m' must be a string"
    )
