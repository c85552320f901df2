"""schemathesis against a live ``sluice serve`` on the example repository: every operation
of the gateway's own OpenAPI description (``/openapi.json``, the infer fast path
included) is called with generated requests, and every answer must have a status the
description lists, with its content type and body schema, and be no 5xx but those Triton
answers by design (:data:`TRITON_5XX`).

8 examples per operation keep it under a minute; a longer run (about 70 s on 2 vCPUs):
``SLUICE_FUZZ_EXAMPLES=100 .venv/bin/python -m pytest -q tests/e2e/test_openapi_fuzz.py``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from e2e_support import ROOT, Server, start_server, stop_server
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sluice.api.app import create_app
from sluice.api.dashboard.routes import mount_dashboard
from sluice.api.http.openapi import openapi_document
from sluice.api.settings import GatewaySettings

pytestmark = pytest.mark.e2e

EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "8"))
#: the 5xx answers Triton gives by design, by operation: (status, error text prefix);
#: any other 5xx is a crash (Triton ``model_repository_manager.cc``, ``http_server.cc``)
TRITON_5XX = {
    # UNSUPPORTED: a named repository
    "/v2/repository/{repository_name}/index": (501, "'repository_name' specification"),
    # INTERNAL: a model that is not in the repository or does not load
    "/v2/repository/models/{model_name}/load": (500, "failed to load '"),
}


@pytest.fixture(scope="module")
def fuzz_server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``sluice serve`` on examples/model_repository (built by scripts/setup.sh), every
    model loaded."""
    repo = ROOT / "examples/model_repository"
    if not (repo / "add_sub/1/model.onnx").exists():
        pytest.skip("examples/model_repository is not built (bash scripts/setup.sh)")
    log_path: Path = tmp_path_factory.mktemp("openapi") / "serve.log"
    # explicit model control: load and unload run (in the default mode they are refused
    # with 503, as Triton's UNAVAILABLE)
    srv = start_server(
        repo, redis_url, log_path, "--model-control-mode", "explicit", "--load-model", "*"
    )
    yield srv
    code = stop_server(srv)
    assert code == 0, srv.log()


def _description() -> dict:
    """The description every gateway serves, built as the gateway builds it (the test
    below checks that the live server serves this very document)."""
    app = create_app(GatewaySettings(), None)  # type: ignore[arg-type]
    mount_dashboard(app, None)  # type: ignore[arg-type]
    return openapi_document(app)


#: the example repository's models
MODELS = ["add_sub", "digits"]


def _fuzzed(description: dict) -> dict:
    """``description`` whose model names are the served models or any string, and whose
    versions 1 or any, so that bodies reach the parsers and the models; load and unload
    keep any name (a served one would change what the other operations find)."""
    fuzzed = copy.deepcopy(description)
    for path, item in fuzzed["paths"].items():
        if "/repository/" in path:
            continue
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "model_name":
                    parameter["schema"] = {"anyOf": [{"enum": MODELS}, parameter["schema"]]}
                elif parameter["name"] == "model_version":
                    parameter["schema"] = {"anyOf": [{"enum": [1]}, parameter["schema"]]}
    return fuzzed


DESCRIPTION = _description()
schema = schemathesis.openapi.from_dict(_fuzzed(DESCRIPTION))


def test_the_server_serves_this_description(fuzz_server: Server) -> None:
    answer = requests.get(f"http://{fuzz_server.http_url}/openapi.json", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == DESCRIPTION


def test_the_description_covers_the_infer_routes(fuzz_server: Server) -> None:
    answer = requests.get(f"http://{fuzz_server.http_url}/openapi.json", timeout=10)
    assert answer.status_code == 200
    paths = answer.json()["paths"]
    infer = paths["/v2/models/{model_name}/infer"]["post"]
    assert set(infer["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    assert "/v2/models/{model_name}/versions/{model_version}/infer" in paths
    assert "422" not in paths["/v2/repository/index"]["post"]["responses"]


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_operation_conforms(fuzz_server: Server, case: schemathesis.Case) -> None:
    response = case.call(base_url=f"http://{fuzz_server.http_url}", timeout=10)
    case.validate_response(
        response,
        checks=[status_code_conformance, content_type_conformance, response_schema_conformance],
    )
    if response.status_code >= 500:
        expected = TRITON_5XX.get(case.operation.path)
        message = response.json()["error"] if expected else response.text
        what = f"{case.method} {case.formatted_path} answered {response.status_code}: {message}"
        assert expected is not None, what
        assert (response.status_code, message[: len(expected[1])]) == expected, what
