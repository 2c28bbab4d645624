"""deploy/k8s: every manifest validates offline against the newest Kubernetes schema that
``kubernetes-validate`` carries, the base and the gpu overlay render with kustomize, and the
containers' commands parse with the CLIs they run."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from smg.router_args import RouterArgs

from specdec.config import StackConfig
from specdec.coordinator.engine.config import (
    DEFAULT_SPECULATIVE_CONFIG,
    CoordinatorConfig,
    SpeculativeConfig,
)
from specdec.flags import add_flags, from_args
from specdec.model_service.config import ServiceConfig

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = kubernetes_validate.latest_version()
needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (for `kubectl kustomize`) is not installed"
)


def base_documents() -> list[dict]:
    docs = []
    for path in sorted((K8S / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def render(folder: Path) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_name(docs: list[dict], kind: str, name: str) -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def container(docs: list[dict], deployment: str, name: str) -> dict:
    spec = by_name(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def argv(c: dict, config: dict[str, str]) -> list[str]:
    """The container's arguments with $(VAR) expanded as the kubelet does."""
    env = {e["name"]: config.get(e["valueFrom"]["configMapKeyRef"]["key"], "")
           for e in c.get("env", []) if "configMapKeyRef" in e.get("valueFrom", {})}  # fmt: skip
    env.update(
        {e["name"]: "pod-0" for e in c.get("env", []) if "fieldRef" in e.get("valueFrom", {})}
    )
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], str(a)) for a in c["args"]]


def test_every_base_manifest_validates():
    docs = base_documents()
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "ConfigMap", "Role"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@needs_kubectl
@pytest.mark.slow
@pytest.mark.parametrize("folder", ["base", "overlays/gpu"])
def test_kustomize_renders_valid_manifests(folder):
    docs = render(K8S / folder)
    assert len(docs) == len(base_documents())
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "specdec"


@needs_kubectl
@pytest.mark.slow
def test_gpu_overlay_puts_the_models_on_gpus():
    docs = render(K8S / "overlays" / "gpu")
    config = by_name(docs, "ConfigMap", "specdec-config")["data"]
    assert config["DEVICE"] == "cuda"
    for deployment, name in (("specdec-replica", "target"), ("specdec-draft", "draft")):
        c = container(docs, deployment, name)
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert c["image"] == "specdec/model:gpu"
        assert (
            "--device" in c["args"]
            and ServiceConfig.from_args(name, argv(c, config)).device == "cuda"
        )
    assert (
        container(docs, "specdec-replica", "coordinator")["image"] == "specdec/coordinator:latest"
    )


@pytest.mark.slow
def test_commands_parse_with_the_services_clis():
    docs = base_documents()
    config = by_name(docs, "ConfigMap", "specdec-config")["data"]
    for deployment, name in (("specdec-replica", "target"), ("specdec-draft", "draft")):
        c = container(docs, deployment, name)
        assert c["command"] == ["python", "-m", f"specdec.{name}_service"]
        service = ServiceConfig.from_args(name, argv(c, config))
        assert (ROOT / service.model / "config.json").is_file()
        # Weights as `specdec up` holds them: the draft's linears int8, the target's never.
        quantization = StackConfig.draft_quantization if name == "draft" else "none"
        assert service.quantization == quantization
        # Native gRPC probes on the port the service listens on.
        assert c["livenessProbe"]["grpc"]["port"] == service.port
    coordinator = container(docs, "specdec-replica", "coordinator")
    parser = argparse.ArgumentParser()
    add_flags(parser, CoordinatorConfig)
    cc = from_args(CoordinatorConfig, parser.parse_args(argv(coordinator, config)))
    assert cc.target == "localhost:50052" and cc.draft == "specdec-draft:50051"
    assert cc.coordinator_id == "pod-0" and cc.metrics_port == 9090
    default = SpeculativeConfig.from_json(DEFAULT_SPECULATIVE_CONFIG)
    rows = cc.speculative.num_speculative_tokens_per_batch_size
    assert rows == default.num_speculative_tokens_per_batch_size  # one schedule
    assert cc.speculative.prompt_lookup == (0, 0)  # the tiny pair's draft beats lookup
    assert cc.speculative.k_for_batch_size(1) == 6
    assert coordinator["readinessProbe"]["grpc"]["port"] == cc.port
    gateway = container(docs, "specdec-gateway", "gateway")
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    router = RouterArgs.from_cli_args(parser.parse_args(argv(gateway, config)))
    assert router.service_discovery and router.service_discovery_port == cc.port
    assert router.selector == {"app.kubernetes.io/name": "specdec-replica"}
    template = by_name(docs, "Deployment", "specdec-replica")["spec"]["template"]
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "specdec-replica"
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(cc.metrics_port)
