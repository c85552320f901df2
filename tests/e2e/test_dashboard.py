"""The ``/dashboard`` live status page, rendered by a real headless chromium.

Skipped where ``/usr/bin/chromium`` is missing (Debian: ``apt-get install chromium``;
``.ci/run`` installs it when it can).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _chromium(args: list[str], profile: Path, timeout_s: float = 60.0) -> str:
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode(errors="replace")


def _load(server, stop: threading.Event) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        while not stop.is_set():
            tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((2, 4), np.float32))
            client.infer("batch_scale", [tensor])
            time.sleep(0.01)
    finally:
        client.close()


def test_dashboard_renders_live_plots(server, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    page = requests.get(f"{server.base}/dashboard", timeout=5)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text.replace("http://www.w3.org/2000/svg", "")  # no CDN

    stop = threading.Event()
    load = threading.Thread(target=_load, args=(server, stop))
    load.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # three samples of batch_scale under load
            data = requests.get(f"{server.base}/dashboard/data", timeout=5).json()
            entry = next(m for m in data["models"] if m["name"] == "batch_scale")
            if sum(1 for p in entry["series"][-4:] if p["throughput"] > 0) >= 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no throughput sampled: {entry}")
        url = f"{server.base}/dashboard"
        dom = _chromium(["--virtual-time-budget=4000", "--dump-dom", url], tmp_path / "p1")
        screenshot = tmp_path / "dashboard.png"
        _chromium(
            ["--virtual-time-budget=4000", f"--screenshot={screenshot}", url], tmp_path / "p2"
        )
    finally:
        stop.set()
        load.join(30)

    assert entry["state"] == "READY" and entry["instances_live"] == 2
    assert 'data-model="batch_scale"' in dom and "model-row" in dom
    assert '<table id="jobs">' in dom  # the jobs panel (its rows: tests/e2e/test_jobs.py)
    series = {}
    # points: throughput and queue depth at every sample, latency where requests finished
    for plot, least in (("plot-throughput", 3), ("plot-latency", 2), ("plot-queue", 3)):
        svg = re.search(rf'<svg id="{plot}".*?</svg>', dom, re.S)
        assert svg, plot
        paths = re.findall(r'<path d="([^"]+)"[^>]*data-model="batch_scale"', svg.group(0))
        assert paths, f"no batch_scale series in {plot}"
        assert paths[0].count("L") >= least - 1, (plot, paths[0])
        series[plot] = paths[0]
    ys = [float(y) for y in re.findall(r"[ML][\d.]+ ([\d.]+)", series["plot-throughput"])]
    assert min(ys) < 190, ys  # above the zero line (y=200): real throughput is plotted
    assert screenshot.stat().st_size > 10_000
    print(f"dashboard screenshot: {screenshot}")
