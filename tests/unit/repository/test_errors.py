"""sluice.repository.errors: codes and message shape (docs/reference/errors.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.repository import ConfigError, ModelNotFoundError, RepositoryError


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RepositoryError("x"), "INVALID_ARG"),
        (ConfigError("x"), "INVALID_ARG"),
        (ModelNotFoundError("x", model="m"), "NOT_FOUND"),
    ],
)
def test_codes(error: RepositoryError, code: str) -> None:
    assert error.code == code
    assert isinstance(error, RepositoryError)


@pytest.mark.parametrize(
    ("model", "path", "field", "text"),
    [
        (None, None, None, "rule"),
        ("digits", None, None, "model 'digits': rule"),
        (None, Path("/r/d/config.pbtxt"), None, "/r/d/config.pbtxt: rule"),
        (None, None, "max_batch_size", "field 'max_batch_size': rule"),
        (
            "digits",
            Path("/repo/digits/config.pbtxt"),
            "max_batch_size",
            "model 'digits' (/repo/digits/config.pbtxt): field 'max_batch_size': rule",
        ),
    ],
)
def test_config_error_str(
    model: str | None, path: Path | None, field: str | None, text: str
) -> None:
    error = ConfigError("rule", model=model, path=path, field=field)
    assert str(error) == text
    assert error.message == "rule"
    assert (error.model, error.path, error.field) == (model, path, field)
