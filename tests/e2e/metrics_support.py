"""Reading a ``/metrics`` exposition in e2e tests.

Parsed here rather than with prometheus-client's parser, which renames every counter
sample ``x`` to ``x_total`` — the very rename Triton's names must not have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import requests

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


@dataclass(frozen=True)
class Scrape:
    """One scrape: family name -> type, and (sample name, sorted labels) -> value."""

    types: dict[str, str]
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    text: str

    def get(self, name: str, **labels: str) -> float | None:
        """The value of sample ``name`` with exactly ``labels`` (None if absent)."""
        return self.values.get((name, tuple(sorted(labels.items()))))

    def model(self, name: str, model: str, version: str = "1", **labels: str) -> float:
        """A per-model sample that must exist."""
        value = self.get(name, model=model, version=version, **labels)
        assert value is not None, f"{name}{{model={model},version={version},{labels}}} absent"
        return value

    def labelsets(self, name: str) -> list[dict[str, str]]:
        """Every label set sample ``name`` has."""
        return [dict(labels) for (sample, labels) in self.values if sample == name]


def scrape(url: str) -> Scrape:
    """GET ``url`` and parse it; asserts Prometheus text 0.0.4."""
    response = requests.get(url, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    types: dict[str, str] = {}
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    family = ""
    for line in response.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ")
            types[family] = kind
            continue
        if line.startswith("#") or not line:
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, raw_labels, value = match.groups()
        suffixes = ("", "_count", "_sum") if types.get(family) == "summary" else ("",)
        assert name in {family + suffix for suffix in suffixes}, (
            f"sample {name} outside its family {family}"
        )
        labels = tuple(sorted(_LABEL.findall(raw_labels or "")))
        assert (name, labels) not in values, f"duplicate series {line!r}"
        values[(name, labels)] = float(value)
    return Scrape(types, values, response.text)
