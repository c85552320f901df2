"""The model configuration as python_backend hands it to a model: the helpers over the
config's JSON dict, and :class:`ModelConfig`, what ``auto_complete_config`` receives
(python_backend ``src/resources/triton_python_backend_utils.py``; the config's shape is
that of the config endpoint, docs/reference/http-protocol.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The config dict's ``input`` entry named ``name``, or None (python_backend utils)."""
    for properties in model_config.get("input", []):
        if properties["name"] == name:
            return properties
    return None


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The config dict's ``output`` entry named ``name``, or None (python_backend utils)."""
    for properties in model_config.get("output", []):
        if properties["name"] == name:
            return properties
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether ``model_transaction_policy.decoupled`` is set (python_backend utils)."""
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


class ModelConfig:
    """The config handed to ``auto_complete_config`` (python_backend ``pb_utils.ModelConfig``).

    Wraps the config's JSON dict (the shape of the config endpoint,
    docs/reference/http-protocol.md). Only
    ``max_batch_size``, inputs, outputs, the dynamic-batching scheduler and
    the transaction policy can be changed, with Triton's checks.

    Args:
        model_config: The config as a JSON string or an already decoded dict.
    """

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._model_config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str) else model_config
        )
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)
        self._model_config.setdefault("name", "")

    def _name(self) -> str:
        return str(self._model_config["name"])

    def as_dict(self) -> dict[str, Any]:
        """The config dict (read it; change it through the setters)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``.

        Raises:
            ValueError: the config already specifies a larger non-zero value.
        """
        current = int(self._model_config["max_batch_size"])
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name()}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher unless another scheduler is set (no-op if already set).

        Raises:
            ValueError: ``sequence_batching`` or ``ensemble_scheduling`` is set.
        """
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _check_tensor(self, kind: str, tensor: Mapping[str, Any], valid: Sequence[str]) -> None:
        name = tensor.get("name", "")
        for key in tensor:
            if key not in valid:
                allowed = ", ".join(f"'{v}'" for v in valid)
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than {allowed}."
                )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{self._name()}' "
                "is missing 'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model "
                    f"'{self._name()}' is missing '{key}' property."
                )

    def _add_tensor(self, kind: str, tensor: Mapping[str, Any], valid: Sequence[str]) -> None:
        self._check_tensor(kind, tensor, valid)
        name = tensor["name"]
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype "
                    f"{current_type} for {kind} '{name}', model provides {tensor['data_type']}"
                )
            current_dims = [int(d) for d in current.get("dims", [])]
            if current_dims and current_dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{current_dims}"
                )
            if (
                "optional" in tensor
                and "optional" in current
                and bool(current["optional"]) != bool(tensor["optional"])
            ):
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))

    def add_input(self, input: Mapping[str, Any]) -> None:
        """Add an input ``{name, data_type, dims, optional?}`` (merged if present).

        Raises:
            ValueError: an unknown or missing property, or an input of that name
                with a different data_type, dims or optional.
        """
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: Mapping[str, Any]) -> None:
        """Add an output ``{name, data_type, dims}`` (merged if present).

        Raises:
            ValueError: an unknown or missing property, or an output of that
                name with a different data_type or dims.
        """
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        """Set ``model_transaction_policy`` (only ``decoupled``).

        Raises:
            ValueError: a property other than ``decoupled``, or ``decoupled``
                already set to a different value.
        """
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
