"""kubernetes/: every manifest validates against the Kubernetes schemas (the ones
kubernetes-validate ships, offline), every container has readiness and liveness probes on
Sluice's own checks, and the KEDA ScaledObject scales an instance Deployment on its
model's stream and consumer group as the key schema names them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.broker.keys import WORKER_GROUP, KeySchema

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "kubernetes"
#: the Kubernetes release validated against
VERSION = "1.30.0"


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


DOCUMENTS = _documents()
BUILT_IN = [(name, doc) for name, doc in DOCUMENTS if "keda.sh" not in doc["apiVersion"]]


def test_the_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    files = sorted(p.name for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == files


@pytest.mark.parametrize(("name", "doc"), BUILT_IN, ids=[n for n, _ in BUILT_IN])
def test_a_manifest_validates_against_the_schema(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, VERSION, strict=True)


def _containers() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{name}:{c['name']}", c)
        for name, doc in DOCUMENTS
        if doc["kind"] == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    ]


@pytest.mark.parametrize(("name", "container"), _containers(), ids=[n for n, _ in _containers()])
def test_every_container_has_probes(name: str, container: dict[str, Any]) -> None:
    assert "readinessProbe" in container and "livenessProbe" in container
    if container["image"] == "sluice" and container["args"][0] == "gateway":
        assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_a_service_per_front_end() -> None:
    ports = {
        doc["metadata"]["name"]: [p["port"] for p in doc["spec"]["ports"]]
        for _, doc in DOCUMENTS
        if doc["kind"] == "Service"
    }
    assert ports["sluice-http"] == [8000]
    assert ports["sluice-grpc"] == [8001]
    assert ports["sluice-metrics"] == [8002]


def test_keda_scales_the_instances_on_their_queue() -> None:
    deployments = {d["metadata"]["name"]: d for _, d in DOCUMENTS if d["kind"] == "Deployment"}
    scaled = [d for _, d in DOCUMENTS if d["kind"] == "ScaledObject"]
    assert scaled
    for obj in scaled:
        target = deployments[obj["spec"]["scaleTargetRef"]["name"]]
        args = target["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[0] == "worker"
        model, version = args[args.index("--model") + 1], int(args[args.index("--version") + 1])
        (trigger,) = obj["spec"]["triggers"]
        assert trigger["type"] == "redis-streams"
        meta = trigger["metadata"]
        assert meta["stream"] == KeySchema("sluice:").queue(model, version)
        assert meta["consumerGroup"] == WORKER_GROUP
        assert int(meta["lagCount"]) > 0
        assert 1 <= obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"]
        config = next(d for _, d in DOCUMENTS if d["kind"] == "ConfigMap")
        assert meta["addressFromEnv"] in config["data"]


def test_the_validation_finds_a_mistake() -> None:
    doc = next(d for _, d in BUILT_IN if d["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)
