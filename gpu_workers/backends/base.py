"""The Backend protocol every model instance implements (Triton python_backend lifecycle).

A backend is one model instance: ``initialize`` once, ``execute`` a list of
requests any number of times, ``finalize`` once. ``execute`` returns exactly
one entry per request, in order; an :class:`InferError` fails only its own
request. Tensor frameworks implement the smaller :class:`TensorBackend` and
are wrapped by ``gpu_workers.backends.tensor_adapter``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc.model_config_pb2 import ModelConfig


class BackendInputError(ValueError):
    """A request's input that this framework cannot take; fails the execution with INVALID_ARG."""


class ModelCodeError(RuntimeError):
    """An exception that the model's own code raised (a Python model's ``initialize``).

    The message names the original exception's type (``KeyError: 'weights'``), as
    python_backend's load error does; the original is chained (``__cause__``). A failed
    load logs its traceback, the user's code being where the fault is; other load
    failures are one line (Triton's ``failed to load``), the traceback at
    ``--log-verbose`` 1.
    """


@dataclass(frozen=True, slots=True)
class InstanceContext:
    """Where and what one model instance is.

    Attributes:
        model_name: model name.
        model_version: version number being served.
        config: the effective (completed) model config.
        instance_name: e.g. ``digits_0_1`` (group name + index).
        kind: ``CPU``, ``GPU`` or ``MODEL`` (Triton instance kind, without ``KIND_``).
        device_id: GPU ordinal for ``GPU`` instances, else 0.
        model_dir: the model's directory (the one holding ``config.pbtxt``).
        version_dir: ``model_dir / str(model_version)``.
        redis_url: the deployment's Redis (a decoupled model sends its responses there).
        key_prefix: the deployment's key prefix.
        record_name: the instance's name in the version's instance records.
        load_id: the model load the instance belongs to.
    """

    model_name: str
    model_version: int
    config: ModelConfig
    instance_name: str
    kind: str
    device_id: int
    model_dir: Path
    version_dir: Path
    redis_url: str = ""
    key_prefix: str = "sluice:"
    record_name: str = ""
    load_id: str = ""

    @property
    def model_file(self) -> Path:
        """The version directory's model file (``default_model_filename``)."""
        return self.version_dir / self.config.default_model_filename


@dataclass(frozen=True, slots=True)
class InferRequest:
    """One request as a backend sees it.

    Attributes:
        request_id: Sluice's id of the request.
        client_id: the client's request id (may be empty).
        inputs: name -> array; shape ``[b] + dims`` for batching models
            (``reshape`` applied); BYTES as ``object`` arrays of ``bytes``.
        requested_outputs: names the client asked for (empty = all).
        parameters: request parameters (custom ones and Triton's reserved ones).
        reply_to: where its responses go (a decoupled model sends them itself).
        deadline_ns: its wall-clock deadline, ns since the epoch (0: none).
    """

    request_id: str
    client_id: str
    inputs: dict[str, np.ndarray]
    requested_outputs: tuple[str, ...] = ()
    parameters: dict[str, Any] = field(default_factory=dict)
    reply_to: str = ""
    deadline_ns: int = 0


@dataclass(frozen=True, slots=True)
class InferResponse:
    """A successful answer: output name -> array (shape ``[b] + dims`` when batching)."""

    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Streamed:
    """The backend answers the request itself, with its own responses (a decoupled
    model's response sender): the instance sends no answer for it."""


@dataclass(frozen=True, slots=True)
class InferError:
    """A failed answer for one request: Triton error code name and message."""

    code: str
    message: str


class Backend(Protocol):
    """One model instance (Triton python_backend: initialize / execute / finalize)."""

    def initialize(self, ctx: InstanceContext) -> None:
        """Load the model; raise to fail the load (the message becomes the reason)."""

    def execute(
        self, requests: Sequence[InferRequest]
    ) -> list[InferResponse | InferError | Streamed]:
        """Run ``requests``; return one entry per request, in order."""

    def finalize(self) -> None:
        """Release the model."""


class TensorBackend(Protocol):
    """A framework that runs one already-concatenated batch of named arrays."""

    def load(self, ctx: InstanceContext) -> None:
        """Load the model file of ``ctx``."""

    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run the model; ``outputs`` are the config names of every output to produce."""

    def close(self) -> None:
        """Release the model."""
