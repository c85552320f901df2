"""End-to-end fixtures: a model repository built here and a real ``sluice serve`` on free ports."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import (
    ROOT,
    Server,
    build_autocomplete,
    build_batch_scale,
    build_identity_types,
    build_nobatch,
    build_slow_variants,
    build_versioned,
    load_examples,
    start_server,
    stop_server,
)


@pytest.fixture(autouse=True)
def _collect_left_clients() -> Iterator[None]:
    """Collect what a test left behind while still in its own thread: a
    ``tritonclient.http`` client (gevent) finalized later, inside another test's worker
    thread, raises gevent's LoopExit from ``__del__`` and fails that test."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def examples() -> object:
    """``examples/build_models.py`` as a module (digits split, model builders)."""
    return load_examples()


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with every e2e test model."""
    repo = tmp_path_factory.mktemp("models")
    examples = load_examples()
    examples.build_digits(repo)  # type: ignore[attr-defined]
    examples.build_add_sub(repo)  # type: ignore[attr-defined]
    build_identity_types(repo)
    build_versioned(repo)
    build_nobatch(repo)
    build_autocomplete(repo)
    build_batch_scale(repo)
    build_slow_variants(repo)
    python_models = ROOT / "tests/assets/python_models"
    if python_models.is_dir():
        for model in python_models.iterdir():
            if (model / "config.pbtxt").exists() or (model / "1").exists():
                shutil.copytree(model, repo / model.name)
    return repo


@pytest.fixture(scope="session")
def server(
    model_repository: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One ``sluice serve`` on the e2e repository for the whole session."""
    log_path = tmp_path_factory.mktemp("logs") / "serve.log"
    srv = start_server(
        model_repository,
        redis_url,
        log_path,
        env={"SLUICE_HTTP__MAX_BODY_BYTES": str(8 * 1024 * 1024)},
    )
    yield srv
    code = stop_server(srv)
    assert code == 0, srv.log()


@pytest.fixture
def http_client(server: Server) -> Iterator[object]:
    """An unmodified ``tritonclient.http`` client on the session server."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        server.http_url, network_timeout=30, connection_timeout=10
    )
    yield client
    client.close()


@pytest.fixture
def grpc_client(server: Server) -> Iterator[object]:
    """An unmodified ``tritonclient.grpc`` client on the session server."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()
