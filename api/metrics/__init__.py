"""Prometheus metrics with Triton's names, aggregated over every process through Redis."""

from __future__ import annotations

from api.metrics.exposition import CONTENT_TYPE, Family, render
from api.metrics.server import create_metrics_app
from api.metrics.service import MetricsService

__all__ = ["CONTENT_TYPE", "Family", "MetricsService", "create_metrics_app", "render"]
