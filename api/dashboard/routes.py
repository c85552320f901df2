"""``GET /dashboard`` (a self-contained HTML page) and ``GET /dashboard/data`` (its JSON)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from sluice.api.dashboard.history import DashboardHistory
from sluice.api.http.routes import json_response

__all__ = ["mount_dashboard", "router"]

router = APIRouter(tags=["dashboard"])


@cache
def _page() -> str:
    return (Path(__file__).with_name("page.html")).read_text(encoding="utf-8")


@router.get("/dashboard")
async def dashboard() -> Response:
    """The live status page (no external resources; it polls ``/dashboard/data``)."""
    return HTMLResponse(_page(), headers={"Cache-Control": "no-store"})


@router.get("/dashboard/data")
async def dashboard_data(request: Request) -> Response:
    """Models, versions, instances, queues and the plotted history, as JSON."""
    history: DashboardHistory = request.app.state.dashboard
    return json_response(history.data())


def mount_dashboard(app: FastAPI, history: DashboardHistory) -> None:
    """Serve the dashboard of ``history`` from ``app``."""
    app.state.dashboard = history
    app.include_router(router)
