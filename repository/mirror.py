"""Local copies of cloud model repositories, brought up to date on demand.

As Triton does, a cloud repository (``s3://``, ``gs://``, ``as://``:
:mod:`sluice.repository.cloud`) is served from a local copy: every process (the
supervisor's scans, the instances' model files) reads the copy. :meth:`RepositoryMirror.sync`
lists the bucket and downloads only the objects that are new or changed (by size, ETag
and modification time), each written aside and moved into place in one rename, and
removes the local files whose objects are gone. Unchanged files keep their modification
time, so a poll or a load reloads exactly the models whose files changed in the bucket.

The copy lives in a private temporary folder removed when the server exits, or, when
Triton's ``TRITON_AWS_MOUNT_DIRECTORY`` / ``TRITON_GCS_MOUNT_DIRECTORY`` /
``TRITON_AZURE_MOUNT_DIRECTORY`` names an existing folder, in
``<that folder>/<bucket>/<path>``, which is kept.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Self

from sluice.repository.cloud import (
    MOUNT_VARIABLES,
    CloudLocation,
    is_cloud_location,
    open_filesystem,
    parse_location,
)
from sluice.repository.errors import RepositoryError

if TYPE_CHECKING:
    import fsspec

__all__ = ["Repositories", "RepositoryMirror", "open_repositories"]

logger = logging.getLogger(__name__)

#: hidden folder of the copy where downloads are written before they are moved in place
#: (hidden folders are not models: :mod:`sluice.repository.scan`).
_STAGING = ".sluice-download"
#: local files the model processes write themselves, never removed by a sync.
_LOCAL_ONLY = frozenset({"__pycache__"})


class RepositoryMirror:
    """The local copy of one cloud model repository.

    Args:
        location: the repository in cloud storage.
        local: the folder of the copy (created when missing).
        filesystem: the fsspec filesystem that reaches ``location``.
    """

    def __init__(
        self, location: CloudLocation, local: Path, filesystem: fsspec.AbstractFileSystem
    ) -> None:
        self.location = location
        self.local = local
        self._fs = filesystem
        #: relative path -> the object's signature when it was downloaded
        self._copied: dict[str, str] = {}
        self._failing = False

    def sync(self) -> tuple[int, int]:
        """Bring the copy up to date with the bucket.

        Returns:
            How many files were downloaded, and how many removed.

        Raises:
            RepositoryError: the bucket or the folder does not exist, or the storage
                cannot be listed or read (credentials, network); the message names the
                repository and the cause. The copy keeps what it had.
        """
        remote = self._listing()
        self.local.mkdir(parents=True, exist_ok=True)
        changed = [
            rel
            for rel, signature in remote.items()
            if self._copied.get(rel) != signature or not (self.local / rel).is_file()
        ]
        removed = self._remove_stale(set(remote))
        if changed:
            self._download(changed)
        for rel in changed:
            self._copied[rel] = remote[rel]
        if changed or removed:
            logger.info(
                "model repository %s: %d file(s) copied, %d removed (local copy %s)",
                self.location.url,
                len(changed),
                removed,
                self.local,
            )
        return len(changed), removed

    def refresh(self) -> None:
        """:meth:`sync`, logging a failure (once until it works again) instead of raising:
        the scans then read the copy as it was, so a storage outage does not unload
        the models."""
        try:
            self.sync()
        except RepositoryError as exc:
            if not self._failing:
                logger.error("%s; serving the local copy as it was", exc)
            self._failing = True
            return
        if self._failing:
            logger.info("model repository %s: reachable again", self.location.url)
        self._failing = False

    def _fail(self, cause: object) -> RepositoryError:
        return RepositoryError(f"failed to open model repository '{self.location.url}': {cause}")

    def _listing(self) -> dict[str, str]:
        """Relative path -> signature of every object under the repository's folder."""
        root = self.location.root
        try:
            self._fs.invalidate_cache()  # the listing must be read anew on every sync
            found = self._fs.find(root, detail=True)
            if not found and not self.location.path and not self._fs.exists(root):
                raise FileNotFoundError(f"bucket '{self.location.bucket}' does not exist")
        except FileNotFoundError as exc:
            raise self._fail(exc) from exc
        except Exception as exc:  # botocore, aiohttp, google-auth, azure errors alike
            raise self._fail(f"{type(exc).__name__}: {exc}") from exc
        if not found and self.location.path:
            raise self._fail(f"not a directory: no objects under '{root}'")
        listing: dict[str, str] = {}
        for name, info in found.items():
            if info.get("type", "file") != "file" or not name.startswith(f"{root}/"):
                continue  # folder markers
            rel = PurePosixPath(name[len(root) + 1 :])
            if not rel.parts or ".." in rel.parts or rel.parts[0].startswith("."):
                logger.warning("model repository %s: skipping '%s'", self.location.url, name)
                continue
            listing[str(rel)] = _signature(info)
        return listing

    def _download(self, relative: Sequence[str]) -> None:
        """Download the objects into the staging folder, then move each into place."""
        staging = self.local / _STAGING
        shutil.rmtree(staging, ignore_errors=True)
        remote = [f"{self.location.root}/{rel}" for rel in relative]
        staged = [staging / rel for rel in relative]
        for path in staged:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._fs.get(remote, [str(p) for p in staged])
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise self._fail(f"download failed: {type(exc).__name__}: {exc}") from exc
        for rel, path in zip(relative, staged, strict=True):
            target = self.local / rel
            if target.is_dir():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        shutil.rmtree(staging, ignore_errors=True)

    def _remove_stale(self, remote: set[str]) -> int:
        """Remove the local files whose objects are gone, then the folders left empty."""
        removed = 0
        for dirpath, dirnames, filenames in os.walk(self.local, topdown=True):
            base = Path(dirpath)
            dirnames[:] = [d for d in dirnames if d not in _LOCAL_ONLY and d != _STAGING]
            for name in filenames:
                rel = (base / name).relative_to(self.local).as_posix()
                if rel not in remote:
                    (base / name).unlink()
                    self._copied.pop(rel, None)
                    removed += 1
        for dirpath, _dirnames, _filenames in sorted(os.walk(self.local), reverse=True):
            path = Path(dirpath)
            if path != self.local and not any(path.iterdir()):
                path.rmdir()
        return removed


def _signature(info: dict[str, object]) -> str:
    """What tells a changed object: its size, ETag (or MD5) and modification time, under
    the names s3fs, gcsfs and adlfs give them."""
    keys = ("size", "ETag", "etag", "md5Hash", "LastModified", "last_modified", "updated")
    return "|".join(str(info.get(key, "")) for key in keys)


class Repositories(tuple[Path, ...]):
    """The ``--model-repository`` values as local folders: a tuple of the roots, in order
    (a cloud repository's root is its copy), that also knows the copies to refresh.

    :func:`sluice.repository.scan.scan_repositories` calls :meth:`refresh` before it
    scans, so every scan (start, poll, explicit load) reads the buckets as they are.

    Attributes:
        mirrors: The cloud repositories' copies.
    """

    mirrors: tuple[RepositoryMirror, ...]

    def __new__(cls, roots: Sequence[Path], mirrors: Sequence[RepositoryMirror] = ()) -> Self:
        self = super().__new__(cls, roots)
        self.mirrors = tuple(mirrors)
        return self

    def refresh(self) -> None:
        """:meth:`RepositoryMirror.refresh` every copy (never raises)."""
        for mirror in self.mirrors:
            mirror.refresh()


def open_repositories(values: Sequence[str]) -> Repositories:
    """Turn ``--model-repository`` values into local folders, copying each cloud
    repository (:func:`sluice.repository.cloud.is_cloud_location`) first.

    Raises:
        RepositoryError: a cloud path that is malformed, whose package is missing, whose
            bucket or folder does not exist or that cannot be read; a mount folder
            variable naming no folder. The message names the path and the cause.
    """
    roots: list[Path] = []
    mirrors: list[RepositoryMirror] = []
    for value in values:
        if not is_cloud_location(value):
            roots.append(Path(value))
            continue
        if any(mirror.location.url == value for mirror in mirrors):
            continue  # the same repository given twice is scanned once, as a folder is
        location = parse_location(value)
        filesystem = open_filesystem(location)
        mirror = RepositoryMirror(location, _local_folder(location), filesystem)
        mirror.sync()
        roots.append(mirror.local)
        mirrors.append(mirror)
    return Repositories(roots, mirrors)


def _local_folder(location: CloudLocation) -> Path:
    """Where the copy of ``location`` goes: under Triton's mount folder variable of its
    kind when set (kept), else in a new temporary folder removed when the process exits."""
    variable = MOUNT_VARIABLES[location.scheme]
    mount = os.environ.get(variable)
    if mount:
        if not Path(mount).is_dir():
            raise RepositoryError(
                f"model repository '{location.url}': {variable}='{mount}' is not a directory"
            )
        base = Path(mount)
    else:
        base = Path(tempfile.mkdtemp(prefix="sluice-repository-"))
        atexit.register(shutil.rmtree, base, True)
    return base.joinpath(location.bucket, *PurePosixPath(location.path).parts)
