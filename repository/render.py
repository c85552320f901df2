"""``ModelConfig`` <-> the JSON Triton serves at ``GET /v2/models/{m}/config``.

docs/reference/http-protocol.md (model configuration): protobuf JSON mapping with
proto field names, every field without presence printed, unset sub-messages omitted,
and the 64-bit integer fields Triton converts written as JSON numbers instead of strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.errors import ConfigError

__all__ = ["config_from_json", "config_to_json"]


def _int_list(node: dict[str, Any], key: str) -> None:
    if key in node:
        node[key] = [int(value) for value in node[key]]


def _int_fields(node: dict[str, Any] | None, keys: Iterable[str]) -> None:
    if node is None:
        return
    for key in keys:
        if key in node:
            node[key] = int(node[key])


def _fix_tensors(data: dict[str, Any]) -> None:
    """input[].dims, input[].reshape.shape, output[].dims, output[].reshape.shape."""
    for key in ("input", "output"):
        for tensor in data.get(key, []):
            _int_list(tensor, "dims")
            if "reshape" in tensor:
                _int_list(tensor["reshape"], "shape")


def _fix_dynamic_batching(data: dict[str, Any]) -> None:
    """dynamic_batching scalars and queue-policy timeouts."""
    batching = data.get("dynamic_batching")
    if batching is None:
        return
    _int_fields(
        batching,
        ("max_queue_delay_microseconds", "priority_levels", "default_priority_level"),
    )
    _int_fields(batching.get("default_queue_policy"), ("default_timeout_microseconds",))
    for policy in batching.get("priority_queue_policy", {}).values():
        _int_fields(policy, ("default_timeout_microseconds",))


def _fix_sequence_batching(data: dict[str, Any]) -> None:
    """sequence_batching scalars and state[].dims."""
    batching = data.get("sequence_batching")
    if batching is None:
        return
    _int_fields(batching, ("max_sequence_idle_microseconds",))
    _int_fields(batching.get("oldest"), ("max_queue_delay_microseconds",))
    _int_fields(batching.get("direct"), ("max_queue_delay_microseconds",))
    for state in batching.get("state", []):
        _int_list(state, "dims")


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """Render a config as Triton's model configuration JSON (docs/reference/http-protocol.md).

    Converts exactly the 64-bit fields Triton converts to numbers: tensor
    dims and reshape shapes, ``version_policy.specific.versions``,
    dynamic/sequence batching scalars and queue-policy timeouts,
    ``sequence_batching.state[].dims``, ``ensemble_scheduling.step[].model_version``
    and ``model_warmup[].inputs.<name>.dims``. Map keys stay strings.

    Args:
        config: The completed model config.

    Returns:
        A JSON-ready dict. (An all-default config is served by Triton as an
        empty body; that is the HTTP layer's concern.)
    """
    data: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _fix_tensors(data)
    specific = data.get("version_policy", {}).get("specific")
    if specific is not None:
        _int_list(specific, "versions")
    _fix_dynamic_batching(data)
    _fix_sequence_batching(data)
    for step in data.get("ensemble_scheduling", {}).get("step", []):
        _int_fields(step, ("model_version",))
    for warmup in data.get("model_warmup", []):
        for warmup_input in warmup.get("inputs", {}).values():
            _int_list(warmup_input, "dims")
    return data


def config_from_json(data: str | dict[str, Any]) -> ModelConfig:
    """Parse Triton's JSON config mapping (e.g. a load request's ``config`` parameter).

    Triton model_config.proto, protobuf JSON mapping; unknown fields are errors.

    Args:
        data: A JSON document or an already decoded object.

    Returns:
        The parsed config.

    Raises:
        ConfigError: Invalid JSON, an unknown field or a wrongly typed value.
    """
    config = ModelConfig()
    try:
        if isinstance(data, str):
            json_format.Parse(data, config, ignore_unknown_fields=False)
        else:
            json_format.ParseDict(data, config, ignore_unknown_fields=False)
    except (json_format.ParseError, json.JSONDecodeError, TypeError) as exc:
        raise ConfigError(f"invalid model configuration JSON: {exc}", field="config") from exc
    return config
