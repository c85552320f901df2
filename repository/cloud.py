"""Cloud model repository locations: Triton's ``s3://``, ``gs://`` and ``as://`` paths.

The path forms and credential variables are Triton's (user guide, ``model_repository.md``,
"Model Repository Locations", https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_repository.md#model-repository-locations):

* ``s3://bucket/path``; a private S3-compatible endpoint as ``s3://host:port/bucket/path``
  (HTTP) or ``s3://https://host:port/bucket/path``. Credentials and region come from
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` and
  ``AWS_DEFAULT_REGION`` (or the AWS config files), as botocore reads them.
* ``gs://bucket/path``; credentials from ``GOOGLE_APPLICATION_CREDENTIALS``, then the
  attached service account, then anonymous access (gcsfs's default order).
* ``as://account/container/path``; the account's shared key from ``AZURE_STORAGE_KEY``;
  without it, ``AZURE_STORAGE_AUTH_TYPE=managed_identity`` or ``default`` selects the
  Azure default credential chain (managed identity among others), else anonymous access.

``TRITON_CLOUD_CREDENTIAL_PATH``, Triton's credential file, takes precedence over the
variables (:mod:`sluice.repository.credentials`).

The storage is reached through fsspec: s3fs for S3, gcsfs and adlfs (the ``cloud`` extra)
for the others, imported only when such a repository is named.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluice.repository.credentials import credential_options
from sluice.repository.errors import RepositoryError

if TYPE_CHECKING:
    import fsspec

__all__ = ["CloudLocation", "is_cloud_location", "open_filesystem", "parse_location"]

#: Triton's prefix -> (fsspec protocol, the Python package that provides it).
_SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "as": ("abfs", "adlfs"),
}
#: Triton's variable naming the folder a repository of that prefix is copied into.
MOUNT_VARIABLES: dict[str, str] = {
    "s3": "TRITON_AWS_MOUNT_DIRECTORY",
    "gs": "TRITON_GCS_MOUNT_DIRECTORY",
    "as": "TRITON_AZURE_MOUNT_DIRECTORY",
}
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}")
#: S3 client timeouts, in s, and attempts per call: a scan (which runs in the supervisor's
#: watch loop) waits that long at most when the storage does not answer.
S3_CONNECT_TIMEOUT_S = 5
S3_READ_TIMEOUT_S = 60
S3_ATTEMPTS = 2


@dataclass(frozen=True, slots=True)
class CloudLocation:
    """One cloud repository path, taken apart.

    Attributes:
        url: The path as given (``s3://...``), used in messages.
        scheme: Triton's prefix without ``://``: ``s3``, ``gs`` or ``as``.
        bucket: The bucket (S3, GCS) or container (Azure).
        path: The folder inside the bucket, without leading or trailing ``/`` ("" for
            the bucket's root).
        endpoint: S3 only: ``http://host:port`` or ``https://host:port`` of a private
            S3-compatible server (None: AWS).
        account: Azure only: the storage account.
    """

    url: str
    scheme: str
    bucket: str
    path: str
    endpoint: str | None = None
    account: str | None = None

    @property
    def root(self) -> str:
        """The repository's path as the fsspec filesystem names it: ``bucket/path``."""
        return f"{self.bucket}/{self.path}" if self.path else self.bucket


def is_cloud_location(text: str) -> bool:
    """Whether a ``--model-repository`` value names cloud storage (``s3://``, ``gs://``,
    ``as://``) rather than a local folder."""
    return any(text.startswith(f"{scheme}://") for scheme in _SCHEMES)


def parse_location(text: str) -> CloudLocation:
    """Take a cloud repository path apart (the forms in this module's docstring).

    Raises:
        RepositoryError: not one of those forms (no bucket, an S3 endpoint without a
            port, an Azure path without a container), naming the path and the form
            expected.
    """
    scheme, _, rest = text.partition("://")
    if scheme not in _SCHEMES:
        raise RepositoryError(
            f"model repository '{text}': not a cloud path (s3://, gs:// or as://)"
        )
    endpoint = account = None
    if scheme == "s3":
        endpoint, rest = _s3_endpoint(text, rest)
    elif scheme == "as":
        account, _, rest = rest.partition("/")
        if not account:
            raise RepositoryError(
                f"model repository '{text}': expected as://account/container/path"
            )
    bucket, _, path = rest.partition("/")
    if not bucket:
        expected = {"s3": "s3://[host:port/]bucket/path", "gs": "gs://bucket/path"}
        raise RepositoryError(
            f"model repository '{text}': no "
            f"{'container' if scheme == 'as' else 'bucket'}; expected "
            f"{expected.get(scheme, 'as://account/container/path')}"
        )
    return CloudLocation(text, scheme, bucket, path.strip("/"), endpoint, account)


def _s3_endpoint(text: str, rest: str) -> tuple[str | None, str]:
    """The private endpoint of an S3 path (None: AWS) and the ``bucket/path`` after it.

    Triton: ``s3://host:port/bucket/path`` is a private instance reached over HTTP,
    ``s3://https://host:port/...`` over HTTPS; a first part without a port is a bucket.
    """
    protocol = "http"
    for prefix in ("https://", "http://"):
        if rest.startswith(prefix):
            protocol, rest = prefix[:-3], rest[len(prefix) :]
            host, _, after = rest.partition("/")
            if _HOST_PORT.fullmatch(host) is None:
                raise RepositoryError(
                    f"model repository '{text}': expected s3://{prefix}host:port/bucket/path"
                )
            return f"{protocol}://{host}", after
    host, _, after = rest.partition("/")
    if _HOST_PORT.fullmatch(host) is not None:
        return f"{protocol}://{host}", after
    return None, rest


def open_filesystem(location: CloudLocation) -> fsspec.AbstractFileSystem:
    """The fsspec filesystem that reaches ``location``, with Triton's credentials (this
    module's docstring).

    Raises:
        RepositoryError: the package for that storage is not installed (naming it and the
            ``cloud`` extra); a credential file that cannot be used.
    """
    protocol, package = _SCHEMES[location.scheme]
    if importlib.util.find_spec(package) is None:
        raise RepositoryError(
            f"model repository '{location.url}' needs the Python package '{package}', "
            f"which is not installed: pip install {package} (or the 'cloud' extra of sluice)"
        )
    import fsspec

    options: dict[str, object] = {"skip_instance_cache": True}
    if location.scheme == "s3":
        config: dict[str, object] = {
            "connect_timeout": S3_CONNECT_TIMEOUT_S,
            "read_timeout": S3_READ_TIMEOUT_S,
            "retries": {"max_attempts": S3_ATTEMPTS, "mode": "standard"},
        }
        if location.endpoint is not None:
            options["client_kwargs"] = {"endpoint_url": location.endpoint}
            config["s3"] = {"addressing_style": "path"}  # MinIO and most private servers
        options["config_kwargs"] = config
    elif location.scheme == "as":
        options["account_name"] = location.account
    for name, value in credential_options(location.scheme, location.url).items():
        if name == "client_kwargs":  # the region, beside the endpoint
            value = {**options.get("client_kwargs", {}), **value}  # type: ignore[dict-item]
        options[name] = value
    filesystem = fsspec.filesystem(protocol, **options)
    if location.scheme == "s3":
        filesystem.retries = S3_ATTEMPTS  # s3fs's own retries around botocore's (5 by default)
    return filesystem
