"""Errors raised while reading a model repository.

`repository` imports nothing of Sluice, so the codes are plain strings with the
names of Triton's ``TRITONSERVER_Error_Code`` (docs/reference/errors.md); the API
layer maps them to HTTP and gRPC statuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

__all__ = ["ConfigError", "ModelNotFoundError", "RepositoryError"]


class RepositoryError(Exception):
    """A model repository or a model in it cannot be used.

    Attributes:
        code: Triton error code name; INVALID_ARG (HTTP 400) by default.
        message: The bare rule message, without the model prefix.
        model: Name of the model concerned, if any.
    """

    code: ClassVar[str] = "INVALID_ARG"

    def __init__(self, message: str, *, model: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.model = model


class ConfigError(RepositoryError):
    """A ``config.pbtxt`` (or the configuration derived from it) breaks a Triton rule.

    ``str(error)`` names the model, the file, the field and the rule, e.g.
    ``model 'digits' (/repo/digits/config.pbtxt): field 'max_batch_size': must be >= 0``.

    Attributes:
        path: The config file (or model directory) the error is about.
        field: The offending ``ModelConfig`` field, dotted, e.g. ``input[0].dims``.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        path: Path | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message, model=model)
        self.path = path
        self.field = field

    def __str__(self) -> str:
        head = f"model '{self.model}'" if self.model else ""
        if self.path is not None:
            head = f"{head} ({self.path})" if head else str(self.path)
        parts = [part for part in (head, f"field '{self.field}'" if self.field else "") if part]
        return ": ".join([*parts, self.message])


class ModelNotFoundError(RepositoryError):
    """No model of that name exists in any repository (Triton NOT_FOUND, HTTP 404)."""

    code: ClassVar[str] = "NOT_FOUND"
