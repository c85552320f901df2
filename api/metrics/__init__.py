"""Prometheus metrics with Triton's names, aggregated over every process through Redis."""

from __future__ import annotations

from sluice.api.metrics.exposition import CONTENT_TYPE, Family, render
from sluice.api.metrics.server import create_metrics_app
from sluice.api.metrics.service import MetricsService

__all__ = ["CONTENT_TYPE", "Family", "MetricsService", "create_metrics_app", "render"]
