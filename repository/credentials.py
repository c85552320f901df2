"""Credentials for a cloud model repository, as fsspec storage options.

Triton's two sources (user guide, ``model_repository.md``, "Cloud Storage with Credential
file" and "Cloud Storage with Environment variables",
https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_repository.md#cloud-storage-with-credential-file-beta):

* ``TRITON_CLOUD_CREDENTIAL_PATH`` names a JSON file with one object per prefix (``s3``,
  ``gs``, ``as``) mapping a path prefix to credentials; the longest prefix the repository
  path starts with wins, ``""`` matching every path. ``s3`` entries hold ``key_id``,
  ``secret_key``, ``session_token`` and ``region``; ``gs`` entries the path of a
  Google credential JSON file; ``as`` entries ``account_str``, ``account_key`` and
  ``auth_type``. Empty values are absent.
* Otherwise (no file, or no entry matches) the environment: the AWS variables as botocore
  reads them, ``GOOGLE_APPLICATION_CREDENTIALS`` as gcsfs reads it, ``AZURE_STORAGE_KEY``
  and ``AZURE_STORAGE_AUTH_TYPE`` here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sluice.repository.errors import RepositoryError

__all__ = ["credential_options"]

#: Triton's values of ``AZURE_STORAGE_AUTH_TYPE`` (or an ``as`` entry's ``auth_type``)
#: that select Azure's default credential chain (managed identity among others).
_AZURE_CHAIN = frozenset({"managed_identity", "default"})


def credential_options(scheme: str, url: str) -> dict[str, object]:
    """The fsspec storage options that carry the credentials of the repository at ``url``
    (Triton's prefix ``scheme``: ``s3``, ``gs`` or ``as``); ``{}``: the filesystem's own
    lookup in the environment.

    Raises:
        RepositoryError: ``TRITON_CLOUD_CREDENTIAL_PATH`` names a file that cannot be
            read, is not JSON, or whose matching entry has the wrong shape; the message
            names the file.
    """
    entry = _file_entry(scheme, url)
    if scheme == "s3":
        return _s3_options(entry) if isinstance(entry, dict) else {}
    if scheme == "gs":
        return {"token": entry} if isinstance(entry, str) and entry else {}
    if isinstance(entry, dict):
        account_key = str(entry.get("account_key") or "")
        auth_type = str(entry.get("auth_type") or "")
    else:
        account_key = os.environ.get("AZURE_STORAGE_KEY", "")
        auth_type = os.environ.get("AZURE_STORAGE_AUTH_TYPE", "")
    if account_key:
        return {"account_key": account_key}
    if auth_type in _AZURE_CHAIN:
        return {"anon": False}  # adlfs then uses azure-identity's default chain
    return {}


def _s3_options(entry: dict[str, object]) -> dict[str, object]:
    options: dict[str, object] = {}
    for field, option in (("key_id", "key"), ("secret_key", "secret"), ("session_token", "token")):
        if entry.get(field):
            options[option] = str(entry[field])
    if entry.get("region"):
        options["client_kwargs"] = {"region_name": str(entry["region"])}
    return options


def _file_entry(scheme: str, url: str) -> object:
    """The credential file's entry for ``url`` (None: no file, or no prefix matches)."""
    path = os.environ.get("TRITON_CLOUD_CREDENTIAL_PATH")
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RepositoryError(
            f"cannot read the cloud credential file TRITON_CLOUD_CREDENTIAL_PATH='{path}': {exc}"
        ) from exc
    entries = data.get(scheme) if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        return None
    matches = [prefix for prefix in entries if url.startswith(prefix)]
    if not matches:
        return None
    entry = entries[max(matches, key=len)]
    expected = str if scheme == "gs" else dict
    if not isinstance(entry, expected):
        raise RepositoryError(
            f"cloud credential file '{path}': the '{scheme}' entry for '{url}' must be"
            f" a {'string' if expected is str else 'JSON object'}"
        )
    return entry
