"""Sluice's ``triton_python_backend_utils``: the API a Triton Python-backend ``model.py`` imports.

User code does ``import triton_python_backend_utils as pb_utils`` exactly as it does
under Triton (the python backend registers this package under that name). The names,
signatures and behaviours follow Triton's python_backend
(``src/resources/triton_python_backend_utils.py`` for the helpers and
:class:`ModelConfig`, the ``src/pb_stub.cc`` bindings and the python_backend README for
``Tensor``, ``InferenceRequest``, ``InferenceResponse``, ``TritonError`` and ``Logger``);
docs/reference/python-backend.md lists what Sluice provides. The worker-side adapter
is :mod:`sluice.gpu_workers.backends.python.backend`.

One module per job: :mod:`.datatypes` (type names, values and BYTES serialization),
:mod:`.errors`, :mod:`.tensor`, :mod:`.inference` (requests, responses, flags),
:mod:`.bls`, :mod:`.model_config` and :mod:`.logger`. They import only the standard
library and numpy, because they are what user model code imports.

Left out for now: decoupled models (``get_response_sender`` raises), GPU tensors
(every tensor is a CPU numpy array), request cancellation (``is_cancelled`` is always
False) and the metrics API.
"""

from __future__ import annotations

from sluice.gpu_workers.backends.python.pb_utils.datatypes import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from sluice.gpu_workers.backends.python.pb_utils.errors import TritonError, TritonModelException
from sluice.gpu_workers.backends.python.pb_utils.inference import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    get_input_tensor_by_name,
    get_output_tensor_by_name,
)
from sluice.gpu_workers.backends.python.pb_utils.logger import Logger, LogLevel
from sluice.gpu_workers.backends.python.pb_utils.model_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from sluice.gpu_workers.backends.python.pb_utils.tensor import Tensor

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "LogLevel",
    "Logger",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]
