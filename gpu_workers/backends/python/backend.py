"""Triton's Python backend (``backend: "python"``): runs a ``model.py`` unchanged.

The model file defines ``TritonPythonModel`` written against
``triton_python_backend_utils`` (docs/reference/python-backend.md; Triton python_backend
README). Sluice imports it in the worker process itself (Triton uses a stub process;
there is no ``EXECUTION_ENV_PATH`` support yet), hands ``execute`` the whole
list of requests of one call as Triton does, and converts the answers to
:class:`InferResponse` / :class:`InferError` (:mod:`.conversion`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import itertools
import json
import logging
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.cluster import sync_client
from sluice.broker.keys import KeySchema
from sluice.gpu_workers.answers import Answers, output_datatypes
from sluice.gpu_workers.backends.base import (
    InferError,
    InferRequest,
    InferResponse,
    InstanceContext,
    ModelCodeError,
    Streamed,
)
from sluice.gpu_workers.backends.python import pb_utils
from sluice.gpu_workers.backends.python.conversion import (
    OutputSpec,
    from_pb_response,
    to_pb_request,
)
from sluice.gpu_workers.backends.python.decoupled import ResponsePump, make_converter
from sluice.repository.render import config_to_json

__all__ = ["PythonBackend"]

logger = logging.getLogger(__name__)

_DEFAULT_FILE = "model.py"
_module_counter = itertools.count()
_sys_path_lock = threading.Lock()


def _import_model_file(path: Path, tag: str) -> ModuleType:
    """Import ``path`` as a fresh module; its directory goes on ``sys.path`` for siblings.

    Raises:
        FileNotFoundError: the file does not exist.
        ImportError: the file cannot be imported.
    """
    if not path.is_file():
        raise FileNotFoundError(f"Python model file '{path}' does not exist")
    directory = str(path.parent)
    with _sys_path_lock:
        if directory not in sys.path:
            sys.path.insert(0, directory)
    safe = re.sub(r"\W", "_", tag)
    module_name = f"_sluice_python_model_{safe}_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import Python model file '{path}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _model_class(module: ModuleType, path: Path) -> type:
    cls = getattr(module, "TritonPythonModel", None)
    if not isinstance(cls, type):
        raise ImportError(f"Python model file '{path}' does not define class TritonPythonModel")
    return cls


def _model_file(config: ModelConfig, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or _DEFAULT_FILE)


def _check_supported(config: ModelConfig) -> None:
    """Refuse what Sluice cannot run yet, with a clear load error.

    Raises:
        RuntimeError: ``EXECUTION_ENV_PATH``, or a decoupled model with sequence batching.
    """
    if "EXECUTION_ENV_PATH" in config.parameters:
        raise RuntimeError(
            f"model '{config.name}': parameter EXECUTION_ENV_PATH is not supported by Sluice "
            "yet; install the model's dependencies into the worker's environment instead"
        )
    if config.model_transaction_policy.decoupled and config.HasField("sequence_batching"):
        raise RuntimeError(
            f"model '{config.name}': a decoupled model with sequence batching is not "
            "supported by Sluice yet"
        )


def _response_pump(ctx: InstanceContext) -> ResponsePump:
    """The pump of a decoupled model's instance, on a Redis connection pool of its own."""
    client = sync_client(ctx.redis_url, protocol=2, socket_timeout=30)
    answers = Answers(
        ctx.model_name, ctx.model_version, ctx.load_id, output_datatypes(ctx.config),
        ctx.config.max_batch_size > 0,
    )  # fmt: skip
    return ResponsePump(client, KeySchema(ctx.key_prefix), answers, ctx.record_name)


class PythonBackend:
    """Runs a Triton ``model.py`` in-process (Triton python_backend lifecycle)."""

    def __init__(self) -> None:
        self._ctx: InstanceContext | None = None
        self._model: Any = None
        self._outputs: dict[str, OutputSpec] = {}
        self._output_names: list[str] = []
        self._input_reshape: dict[str, tuple[int, ...]] = {}
        self._batching = False
        self._pump: ResponsePump | None = None

    @staticmethod
    def initialize_args(ctx: InstanceContext) -> dict[str, str]:
        """Triton's ``args`` dict for ``TritonPythonModel.initialize``
        (docs/reference/python-backend.md)."""
        return {
            "model_config": json.dumps(config_to_json(ctx.config)),
            "model_instance_kind": ctx.kind,
            "model_instance_name": ctx.instance_name,
            "model_instance_device_id": str(ctx.device_id),
            "model_repository": str(ctx.model_dir),
            "model_version": str(ctx.model_version),
            "model_name": ctx.model_name,
        }

    def initialize(self, ctx: InstanceContext) -> None:
        """Import the model file, instantiate ``TritonPythonModel``, call its ``initialize``.

        Raises:
            RuntimeError: unsupported config (EXECUTION_ENV_PATH, decoupled), or the
                model's ``initialize`` raised (fails the load; the message names the
                exception's type, as python_backend's load error does, ``KeyError:
                'weights'``, and the original is chained).
            FileNotFoundError, ImportError: the model file is missing or broken.
        """
        config = ctx.config
        _check_supported(config)
        path = _model_file(config, ctx.version_dir)
        module = _import_model_file(
            path, f"{ctx.model_name}_{ctx.model_version}_{ctx.instance_name}"
        )
        model = _model_class(module, path)()
        self._ctx = ctx
        self._batching = config.max_batch_size > 0
        self._input_reshape = {
            t.name: tuple(t.reshape.shape) for t in config.input if t.HasField("reshape")
        }
        self._outputs = {
            t.name: OutputSpec(t.name, t.data_type, tuple(t.dims), t.HasField("reshape"))
            for t in config.output
        }
        self._output_names = [t.name for t in config.output]
        # implicit state outputs (sequence batching): the batcher takes them from every
        # response, whether the client asked for them or not
        self._state_outputs = frozenset(s.output_name for s in config.sequence_batching.state)
        for state in config.sequence_batching.state:
            self._outputs.setdefault(
                state.output_name,
                OutputSpec(state.output_name, state.data_type, tuple(state.dims), False),
            )
        if config.model_transaction_policy.decoupled:
            self._pump = _response_pump(ctx)
        init = getattr(model, "initialize", None)
        if init is not None:
            try:
                init(self.initialize_args(ctx))
            except Exception as exc:
                raise ModelCodeError(f"{type(exc).__name__}: {exc}") from exc
        self._model = model
        logger.info(
            "Python model '%s' instance '%s' loaded from %s",
            ctx.model_name,
            ctx.instance_name,
            path,
        )

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | InferError]:
        """Call the model's ``execute`` once with every request; one answer per request.

        A raised exception, a non-list result or a list of the wrong length
        fails every request with INTERNAL (Triton python_backend).
        """
        assert self._ctx is not None and self._model is not None, "initialize() was not called"
        name = self._ctx.model_name
        instance = self._ctx.instance_name
        pb_requests = [
            to_pb_request(
                r,
                output_names=self._output_names,
                input_reshape=self._input_reshape,
                batching=self._batching,
            )
            for r in requests
        ]
        if self._pump is not None:
            for request, pb_request in zip(requests, pb_requests, strict=True):
                pb_request._response_sender = self._pump.sender(
                    request.request_id, request.reply_to, request.deadline_ns,
                    make_converter(self._pump, functools.partial(self._convert, pb_request)),
                )  # fmt: skip
        try:
            responses = self._model.execute(pb_requests)
            if inspect.iscoroutine(responses):  # python_backend allows ``async def execute``
                responses = asyncio.run(responses)
        except pb_utils.TritonModelException as exc:
            logger.exception("Python model '%s' execute raised", name)
            return self._fail_all(
                len(requests),
                f"Failed to process the request(s) for model "
                f"instance '{instance}', message: {exc.message()}",
            )
        except Exception as exc:
            logger.exception("Python model '%s' execute raised", name)
            return self._fail_all(
                len(requests),
                f"Failed to process the request(s) for model "
                f"instance '{instance}', message: {type(exc).__name__}: {exc}",
            )
        if self._pump is not None:
            # a decoupled model answers through its senders; execute returns None
            return [Streamed()] * len(requests)
        if not isinstance(responses, list | tuple):
            return self._fail_all(
                len(requests),
                f"model '{name}': execute() must return a list of InferenceResponse objects, "
                f"got {type(responses).__name__}",
            )
        if len(responses) != len(requests):
            return self._fail_all(
                len(requests),
                f"model '{name}': number of InferenceResponse objects ({len(responses)}) does "
                f"not match the number of InferenceRequest objects ({len(requests)})",
            )
        return [
            from_pb_response(
                resp,
                req,
                self._outputs,
                model=name,
                batching=self._batching,
                keep=self._state_outputs,
            )
            for resp, req in zip(responses, pb_requests, strict=True)
        ]

    def finish_streams(self, timeout_s: float) -> bool:
        """Before the instance stops (shutdown, or a reload handing over): wait, at most
        ``timeout_s``, until a decoupled model has sent the final flag of every request
        it took; True when none is left open."""
        if self._pump is None:
            return True
        return self._pump.wait_idle(timeout_s)

    def _convert(self, pb_request: Any, response: Any) -> InferResponse | InferError:
        assert self._ctx is not None
        return from_pb_response(
            response, pb_request, self._outputs, model=self._ctx.model_name,
            batching=self._batching, keep=self._state_outputs,
        )  # fmt: skip

    @staticmethod
    def _fail_all(count: int, message: str) -> list[InferResponse | InferError]:
        return [InferError("INTERNAL", message) for _ in range(count)]

    def finalize(self) -> None:
        """Call the model's ``finalize`` if it has one."""
        model, self._model = self._model, None
        fin = getattr(model, "finalize", None)
        if fin is not None:
            fin()
        if self._pump is not None:
            self._pump.stop()

    @staticmethod
    def auto_complete(config: ModelConfig, version_dir: Path) -> None:
        """Run the model's ``auto_complete_config`` on ``config``, in place.

        Triton python_backend: the static ``auto_complete_config`` receives a
        ``pb_utils.ModelConfig`` over the config's JSON and returns it; the
        result replaces the config. Nothing else is added for Python models.

        Raises:
            RuntimeError: EXECUTION_ENV_PATH in the config.
            Exception: the model file fails to import or ``auto_complete_config`` raises.
        """
        if "EXECUTION_ENV_PATH" in config.parameters:
            _check_supported(config)
        path = _model_file(config, version_dir)
        module = _import_model_file(path, f"{config.name}_autocomplete")
        try:
            hook = getattr(_model_class(module, path), "auto_complete_config", None)
            if hook is None:
                return
            wrapper = pb_utils.ModelConfig(config_to_json(config))
            result = hook(wrapper)
            if result is None:
                result = wrapper
            data = result.as_dict() if isinstance(result, pb_utils.ModelConfig) else result
            completed = ModelConfig()
            json_format.ParseDict(data, completed, ignore_unknown_fields=False)
            config.CopyFrom(completed)
        finally:
            sys.modules.pop(module.__name__, None)
