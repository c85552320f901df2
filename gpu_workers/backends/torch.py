"""PyTorch backend (Triton ``platform: pytorch_libtorch``, ``backend: pytorch``, ``model.pt``).

Serves a TorchScript file (``torch.jit.save``) behind the tensor adapter, so the
dynamic batcher's concatenated batches reach one ``forward`` call. ``torch`` is
imported only when a model of this backend loads (the gateway never needs it).

TorchScript carries no tensor names, so Triton's naming conventions bind the
config to ``forward`` (Triton model_configuration.md, "Special Conventions for
PyTorch Backend"; pytorch_backend ``NamingConvention``):

* inputs: a single ``Dict[str, Tensor]`` argument gets every input keyed by its
  config name; else ``FORWARD_ARGUMENT`` when every config input name is an
  argument name of ``forward``; else ``NAMED_INDEX`` when every name is
  ``<name>__<index>`` (position ``index``); else the config's order
  (``STRICT_CONFIG_ORDERING``);
* outputs: ``NAMED_INDEX`` (``OUTPUT__<i>`` picks item ``i`` of a tuple/list
  result, or the single tensor for ``i`` = 0), else the config's order; a dict
  result is read by the config names (a Sluice extension).

``KIND_GPU`` instances run on ``cuda:<device_id>`` (without CUDA the load fails
with the reason); ``KIND_CPU`` on the CPU. Arrays enter with
``torch.from_numpy`` (no copy on the CPU) and leave with ``.numpy()``; execution
is under ``torch.inference_mode()`` (config parameter ``INFERENCE_MODE`` =
``false`` selects ``torch.no_grad()``). Parameters ``DISABLE_OPTIMIZED_EXECUTION``,
``INTRA_OP_THREAD_COUNT`` and ``INTER_OP_THREAD_COUNT`` are Triton's
pytorch_backend parameters of the same names.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from sluice.gpu_workers.backends.base import BackendInputError, InstanceContext
from sluice.gpu_workers.backends.tensor_adapter import TensorBackendAdapter

__all__ = [
    "InputBinding",
    "TorchBackend",
    "TorchModule",
    "bind_inputs",
    "bind_outputs",
    "pick_outputs",
]

logger = logging.getLogger(__name__)

_NAMED_INDEX = re.compile(r"^.*__(\d+)$")

#: Config types the pytorch backend cannot hand to TorchScript as tensors here.
_UNSUPPORTED_TYPES = frozenset({"TYPE_STRING", "TYPE_BF16"})


@dataclass(frozen=True, slots=True)
class InputBinding:
    """How the config's inputs reach ``forward``.

    Attributes:
        convention: ``DICT``, ``FORWARD_ARGUMENT``, ``NAMED_INDEX`` or ``STRICT_CONFIG_ORDERING``.
        order: config input names in ``forward``'s positional order (``DICT``:
            config order; ``FORWARD_ARGUMENT``: passed by keyword instead).
    """

    convention: str
    order: tuple[str, ...]


def _named_indices(names: Sequence[str]) -> dict[str, int] | None:
    """``<name>__<index>`` for every name with distinct indices in ``[0, len)``; else None."""
    indices: dict[str, int] = {}
    for name in names:
        match = _NAMED_INDEX.match(name)
        if match is None:
            return None
        indices[name] = int(match.group(1))
    if sorted(indices.values()) != list(range(len(names))):
        return None
    return indices


def bind_inputs(
    config_names: Sequence[str], forward_args: Sequence[str], dict_input: bool = False
) -> InputBinding:
    """Triton's input naming convention for a TorchScript ``forward``.

    Args:
        config_names: the config's input names, in config order.
        forward_args: ``forward``'s argument names without ``self``.
        dict_input: ``forward`` takes one ``Dict[str, Tensor]`` argument.

    Returns:
        The binding; see the module docstring for the rule order.
    """
    names = tuple(config_names)
    if dict_input:
        return InputBinding("DICT", names)
    if names and all(name in forward_args for name in names):
        ordered = tuple(arg for arg in forward_args if arg in names)
        return InputBinding("FORWARD_ARGUMENT", ordered)
    indices = _named_indices(names)
    if indices is not None:
        return InputBinding("NAMED_INDEX", tuple(sorted(names, key=indices.__getitem__)))
    return InputBinding("STRICT_CONFIG_ORDERING", names)


def bind_outputs(config_names: Sequence[str]) -> dict[str, int]:
    """Output name -> position in ``forward``'s result (``NAMED_INDEX`` or config order)."""
    indices = _named_indices(config_names)
    if indices is not None:
        return indices
    return {name: position for position, name in enumerate(config_names)}


def pick_outputs(
    result: Any, positions: Mapping[str, int], wanted: Sequence[str]
) -> dict[str, Any]:
    """The ``wanted`` outputs out of ``forward``'s ``result``.

    Args:
        result: a tensor, a tuple/list of tensors, or a dict keyed by output name.
        positions: from :func:`bind_outputs`.
        wanted: the output names to return.

    Raises:
        ValueError: the result has no item for an output, naming it.
    """
    picked: dict[str, Any] = {}
    for name in wanted:
        if isinstance(result, Mapping):
            if name not in result:
                raise ValueError(
                    f"output '{name}' is not a key of the model's dict result "
                    f"(keys: {', '.join(map(str, result))})"
                )
            picked[name] = result[name]
            continue
        position = positions[name]
        if isinstance(result, tuple | list):
            if position >= len(result):
                raise ValueError(
                    f"output '{name}' is item {position} but the model returned "
                    f"{len(result)} item(s)"
                )
            picked[name] = result[position]
        elif position == 0:
            picked[name] = result
        else:
            raise ValueError(
                f"output '{name}' is item {position} but the model returned a single tensor"
            )
    return picked


def _bool_parameter(config: ModelConfig, key: str, default: bool) -> bool:
    if key not in config.parameters:
        return default
    return config.parameters[key].string_value.strip().lower() in ("1", "true", "yes", "on")


def _int_parameter(config: ModelConfig, key: str) -> int | None:
    if key not in config.parameters:
        return None
    text = config.parameters[key].string_value.strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"model '{config.name}': parameter '{key}' must be an integer, got '{text}'"
        ) from None


def _forward_signature(module: Any) -> tuple[list[str], bool]:
    """``forward``'s argument names (without ``self``) and whether it takes one dict."""
    try:
        arguments = list(module.forward.schema.arguments)[1:]
    except AttributeError:  # not a scripted method: nothing to match by name
        return [], False
    names = [arg.name for arg in arguments]
    dict_input = len(arguments) == 1 and str(arguments[0].type).startswith("Dict[str, Tensor]")
    return names, dict_input


def _device(torch: Any, ctx: InstanceContext) -> Any:
    """``cuda:<device_id>`` for KIND_GPU, else the CPU.

    Raises:
        RuntimeError: KIND_GPU but this torch has no CUDA device ``device_id``.
    """
    if ctx.kind != "GPU":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"model '{ctx.model_name}' instance '{ctx.instance_name}' is KIND_GPU but torch "
            f"{torch.__version__} has no CUDA device available"
        )
    if ctx.device_id >= torch.cuda.device_count():
        raise RuntimeError(
            f"model '{ctx.model_name}' instance '{ctx.instance_name}' asks for GPU "
            f"{ctx.device_id} but torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device(f"cuda:{ctx.device_id}")


class TorchModule:
    """One TorchScript module on one device (a :class:`TensorBackend`)."""

    def __init__(self) -> None:
        self._torch: Any = None
        self._module: Any = None
        self._device: Any = None
        self._binding = InputBinding("STRICT_CONFIG_ORDERING", ())
        self._outputs: dict[str, int] = {}
        self._inference_mode = True
        self._model = ""

    def load(self, ctx: InstanceContext) -> None:
        """Load ``ctx.model_file`` with ``torch.jit.load`` onto the instance's device.

        Raises:
            RuntimeError: torch is not installed, no CUDA for a KIND_GPU instance, or a
                config type TorchScript tensors cannot carry (BYTES, BF16).
            FileNotFoundError: the model file is missing.
        """
        config = ctx.config
        self._model = ctx.model_name
        for tensor in [*config.input, *config.output]:
            type_name = DataType.Name(tensor.data_type)
            if type_name in _UNSUPPORTED_TYPES:
                raise RuntimeError(
                    f"model '{ctx.model_name}': tensor '{tensor.name}' is {type_name}, which "
                    "Sluice's pytorch backend does not support"
                )
        try:
            import torch
        except ImportError as exc:
            raise RuntimeError(
                f"model '{ctx.model_name}': PyTorch is not installed here ({exc}); "
                "install the 'torch' extra"
            ) from exc
        self._torch = torch
        self._device = _device(torch, ctx)
        if not ctx.model_file.is_file():
            raise FileNotFoundError(
                f"model '{ctx.model_name}': TorchScript file '{ctx.model_file}' does not exist"
            )
        intra = _int_parameter(config, "INTRA_OP_THREAD_COUNT")
        if intra is not None and intra > 0:
            torch.set_num_threads(intra)
        inter = _int_parameter(config, "INTER_OP_THREAD_COUNT")
        if inter is not None and inter > 0:
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError:  # only settable before the first parallel work
                logger.warning("model '%s': INTER_OP_THREAD_COUNT not applied", ctx.model_name)
        if _bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION", False):
            torch._C._set_graph_executor_optimize(False)
        self._inference_mode = _bool_parameter(config, "INFERENCE_MODE", True)
        module = torch.jit.load(str(ctx.model_file), map_location=self._device)
        module.eval()
        self._module = module
        forward_args, dict_input = _forward_signature(module)
        self._binding = bind_inputs([t.name for t in config.input], forward_args, dict_input)
        self._outputs = bind_outputs([t.name for t in config.output])
        logger.info(
            "model '%s' instance '%s' loaded on %s (inputs by %s)",
            ctx.model_name,
            ctx.instance_name,
            self._device,
            self._binding.convention,
        )

    def _tensor(self, name: str, array: np.ndarray) -> Any:
        if array.dtype == object:
            raise BackendInputError(f"input '{name}': BYTES tensors cannot enter TorchScript")
        with warnings.catch_warnings():
            # Wire buffers are read-only; the model gets a view under inference mode.
            warnings.simplefilter("ignore", UserWarning)
            tensor = self._torch.from_numpy(array)
        return tensor.to(self._device)

    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run ``forward`` once on the (already concatenated) inputs.

        Args:
            inputs: config input name -> array (shape ``[b] + dims`` when batching).
            outputs: the output names to produce.

        Returns:
            Output name -> array, copied to the CPU.
        """
        torch = self._torch
        tensors = {name: self._tensor(name, array) for name, array in inputs.items()}
        context = torch.inference_mode() if self._inference_mode else torch.no_grad()
        with context:
            convention = self._binding.convention
            if convention == "DICT":
                result = self._module(tensors)
            elif convention == "FORWARD_ARGUMENT":
                result = self._module(**tensors)
            else:
                missing = [n for n in self._binding.order if n not in tensors]
                if missing:
                    raise BackendInputError(
                        f"input '{missing[0]}' is required by the TorchScript forward()"
                    )
                result = self._module(*(tensors[n] for n in self._binding.order))
            picked = pick_outputs(result, self._outputs, outputs)
            return {name: value.detach().cpu().numpy() for name, value in picked.items()}

    def close(self) -> None:
        """Drop the module (and its device memory)."""
        self._module = None


class TorchBackend(TensorBackendAdapter):
    """The ``pytorch`` backend: :class:`TorchModule` behind the tensor adapter."""

    def __init__(self) -> None:
        super().__init__(TorchModule())

    @staticmethod
    def gpu_available() -> bool:
        """Whether torch is installed with CUDA and sees a CUDA device (a CPU wheel does not)."""
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())
