"""Prometheus text exposition 0.0.4 with Triton's metric names, rendered here.

prometheus-client's ``Counter`` renames ``x`` to ``x_total`` and adds ``x_created``
(docs/reference/metrics.md); Triton's counters carry neither, and dashboards built for Triton
query the bare names. So families are plain data and this module writes them,
using prometheus-client only for its content type and float formatting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.utils import floatToGoString

__all__ = ["CONTENT_TYPE", "Family", "render"]

#: ``text/plain; version=0.0.4; charset=utf-8``.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


@dataclass(slots=True)
class Family:
    """One metric family: name, type, help text and its samples.

    Attributes:
        name: the metric name, exactly as exposed (no suffix is added).
        type: ``counter``, ``gauge``, ``summary``, ``histogram`` or ``untyped``.
        help: the ``# HELP`` text.
        samples: (labels, value) pairs, in the order written; (labels, value, suffix)
            for a sample named ``name + suffix`` (a summary's ``_count`` and ``_sum``).
    """

    name: str
    type: str
    help: str
    samples: list[tuple[Any, ...]] = field(default_factory=list)

    def add(self, labels: Mapping[str, str], value: float, suffix: str = "") -> None:
        """Append one sample (named ``name + suffix``)."""
        self.samples.append((dict(labels), value, suffix) if suffix else (dict(labels), value))


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 2**63):
        return str(int(value))
    return floatToGoString(value)


def _label_order(item: tuple[str, str]) -> tuple[bool, str]:
    return item[0] == "quantile", item[0]


def render(families: Iterable[Family]) -> bytes:
    """The text exposition of ``families`` (labels sorted by name, a summary's
    ``quantile`` last, as Triton writes them).

    A family with no samples is left out (no model loaded: no ``nv_inference_*`` lines).
    """
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        help_text = family.help.replace("\\", r"\\").replace("\n", r"\n")
        lines.append(f"# HELP {family.name} {help_text}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for labels, value, *suffix in family.samples:
            name = family.name + (suffix[0] if suffix else "")
            if labels:
                pairs = ",".join(
                    f'{k}="{_escape(v)}"' for k, v in sorted(labels.items(), key=_label_order)
                )
                lines.append(f"{name}{{{pairs}}} {_number(value)}")
            else:
                lines.append(f"{name} {_number(value)}")
    return ("\n".join(lines) + "\n").encode() if lines else b""
