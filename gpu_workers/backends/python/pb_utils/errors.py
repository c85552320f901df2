"""The errors of python_backend's API: the exception a model raises and the error a
response carries (python_backend ``src/pb_exception.h``, ``src/pb_error.cc`` and the
README)."""

from __future__ import annotations


class TritonModelException(Exception):
    """Exception a model raises (or Triton raises into it) for a failed operation.

    python_backend ``TritonModelException``; ``message()`` returns the text.
    """

    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        """The exception message."""
        return self._msg


class TritonError:
    """An error carried by an :class:`InferenceResponse` (fails only that request).

    python_backend ``TritonError(message, code=TritonError.INTERNAL)``; the
    codes are tritonserver.h ``TRITONSERVER_Error_Code`` values.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    #: code value -> Triton error code name.
    CODE_NAMES: dict[int, str] = {  # noqa: RUF012 - read-only lookup table
        0: "UNKNOWN",
        1: "INTERNAL",
        2: "NOT_FOUND",
        3: "INVALID_ARG",
        4: "UNAVAILABLE",
        5: "UNSUPPORTED",
        6: "ALREADY_EXISTS",
        7: "CANCELLED",
    }

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = int(code)

    def message(self) -> str:
        """The error message."""
        return self._message

    def code(self) -> int:
        """The error code (one of the class attributes)."""
        return self._code

    def code_name(self) -> str:
        """The code's name, e.g. ``"INVALID_ARG"`` (Sluice addition)."""
        return self.CODE_NAMES.get(self._code, "UNKNOWN")

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self.code_name()})"
