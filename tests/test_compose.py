"""docker-compose.yml against the real CLIs, health protocol and Dockerfile stages.

No Docker engine is needed: commands are parsed with the services' own argparse, the
health-check snippet runs against an in-process gRPC health server, and `config -q` runs
only where a compose client is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from urllib.parse import urlparse

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
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
COMPOSE_FILE = ROOT / "docker-compose.yml"
MODEL_SERVICES = ("target", "draft")


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def module_argv(service: dict, module: str) -> list[str]:
    """The flags after `python -m <module>`; fails when the command runs something else."""
    command = [str(arg) for arg in service["command"]]
    assert command[:3] == ["python", "-m", module]
    return command[3:]


def health_check(service: dict) -> tuple[str, str]:
    """(python source, address) of a `["CMD", "python", "-c", source, address]` check."""
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and len(test) == 5
    return test[3], test[4]


def coordinator_config(service: dict) -> CoordinatorConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser, CoordinatorConfig)
    return from_args(
        CoordinatorConfig, parser.parse_args(module_argv(service, "specdec.coordinator"))
    )


def test_stack_has_target_draft_coordinator_and_trace_backend(services):
    assert {"target", "draft", "coordinator", "jaeger"} <= set(services)
    assert services["jaeger"]["image"].startswith("jaegertracing/all-in-one:")


@pytest.mark.parametrize("name", MODEL_SERVICES)
def test_model_service_command_parses_with_the_service_cli(services, name):
    service = services[name]
    config = ServiceConfig.from_args(name, module_argv(service, f"specdec.{name}_service"))
    assert config.model == f"models/{name}"
    assert (ROOT / config.model / "config.json").is_file()  # the Dockerfile copies it
    assert config.host == "0.0.0.0"
    assert config.device == "cpu"
    assert str(config.port) in [str(p) for p in service["expose"]]
    assert health_check(service)[1] == f"localhost:{config.port}"
    # Weights as `specdec up` holds them: the draft's linears int8, the target's never.
    quantization = StackConfig.draft_quantization if name == "draft" else "none"
    assert config.quantization == quantization


def test_coordinator_command_parses_and_points_at_the_model_services(services):
    config = coordinator_config(services["coordinator"])
    target = ServiceConfig.from_args("t", module_argv(services["target"], "specdec.target_service"))
    draft = ServiceConfig.from_args("d", module_argv(services["draft"], "specdec.draft_service"))
    assert config.target == f"target:{target.port}"
    assert config.draft == f"draft:{draft.port}"
    assert config.host == "0.0.0.0"
    assert (config.port, config.metrics_port) == (50050, 9090)
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (512, 16)
    assert (ROOT / config.tokenizer / "tokenizer.json").is_file()
    assert health_check(services["coordinator"])[1] == f"localhost:{config.port}"


def test_coordinator_publishes_api_and_metrics_ports(services):
    published = {str(p).split(":")[-1] for p in services["coordinator"]["ports"]}
    assert {"50050", "9090"} <= published


def test_speculative_config_is_the_dynamic_k_table(services):
    argv = module_argv(services["coordinator"], "specdec.coordinator")
    spec = SpeculativeConfig.from_json(argv[argv.index("--speculative-config") + 1])
    default = SpeculativeConfig.from_json(DEFAULT_SPECULATIVE_CONFIG)
    rows = spec.num_speculative_tokens_per_batch_size
    assert rows == default.num_speculative_tokens_per_batch_size  # one schedule
    assert spec.prompt_lookup == (0, 0)  # the tiny pair's draft beats prompt lookup
    assert [spec.k_for_batch_size(bs) for bs in (1, 2, 3, 16, 2000)] == [6, 4, 0, 0, 0]


def test_coordinator_starts_only_after_target_and_draft_are_healthy(services):
    depends_on = services["coordinator"]["depends_on"]
    for name in MODEL_SERVICES:
        assert depends_on[name] == {"condition": "service_healthy"}
        assert "healthcheck" in services[name]


@pytest.mark.parametrize("name", ("target", "draft", "coordinator"))
def test_service_exports_traces_to_the_jaeger_otlp_port(services, name):
    env = environment(services[name])
    endpoint = urlparse(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "jaeger", 4317)
    assert env["OTEL_SERVICE_NAME"] == f"specdec-{name}"
    jaeger = services["jaeger"]
    assert environment(jaeger)["COLLECTOR_OTLP_ENABLED"] == "true"
    assert "4317" in [str(p).split(":")[-1] for p in jaeger.get("expose", []) + jaeger["ports"]]


def test_compose_build_targets_are_dockerfile_stages(services):
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    targets = {name: s["build"]["target"] for name, s in services.items() if "build" in s}
    assert targets == {
        "target": "model", "draft": "model", "coordinator": "coordinator", "gateway": "gateway"
    }  # fmt: skip
    assert set(targets.values()) <= set(stages)


@pytest.fixture
def health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.slow
@pytest.mark.parametrize("name", ("target", "draft", "coordinator"))
def test_health_check_passes_only_while_serving(services, health_server, name):
    source, _ = health_check(services[name])
    servicer, address = health_server

    def run_check() -> int:
        return subprocess.run([sys.executable, "-c", source, address], timeout=30).returncode

    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert run_check() == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert run_check() != 0


def compose_client() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


@pytest.mark.slow
def test_compose_file_validates_with_the_compose_client():
    client = compose_client()
    if client is None:
        pytest.skip("neither docker-compose nor `docker compose` is installed")
    argv = [*client, "-f", str(COMPOSE_FILE), "config", "-q"]
    env = dict(os.environ, SPECDEC_INTERNAL_TOKEN="a-test-secret")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    # Without the internal token the file refuses to start the stack open.
    env.pop("SPECDEC_INTERNAL_TOKEN")
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode != 0 and "SPECDEC_INTERNAL_TOKEN" in refused.stderr


@pytest.mark.parametrize("name", ["target", "draft", "coordinator"])
def test_services_require_the_internal_token_and_only_the_coordinator_publishes(services, name):
    assert environment(services[name])["SPECDEC_INTERNAL_TOKEN"].startswith(
        "${SPECDEC_INTERNAL_TOKEN:?"
    )
    assert ("ports" in services[name]) == (name == "coordinator")


def gateway_args(service: dict) -> RouterArgs:
    command = [str(arg) for arg in service["command"]]
    assert command[:2] == ["smg", "launch"]
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    return RouterArgs.from_cli_args(parser.parse_args(command[2:]))


def test_gateway_serves_the_openai_api_over_the_coordinator(services):
    gateway = services["gateway"]
    args = gateway_args(gateway)
    coordinator = coordinator_config(services["coordinator"])
    assert args.backend == "vllm"
    assert args.worker_urls == [f"grpc://coordinator:{coordinator.port}"]
    assert f"{args.port}:{args.port}" in gateway["ports"]
    assert gateway["depends_on"]["coordinator"]["condition"] == "service_healthy"


def test_prometheus_scrapes_the_coordinator_and_the_gateway(services):
    prometheus = services["prometheus"]
    config_file = prometheus["volumes"][0].split(":")[0]
    config = yaml.safe_load((ROOT / config_file).read_text())
    targets = {t for job in config["scrape_configs"] for s in job["static_configs"]
               for t in s["targets"]}  # fmt: skip
    coordinator = coordinator_config(services["coordinator"])
    assert targets == {
        f"coordinator:{coordinator.metrics_port}",
        f"gateway:{gateway_args(services['gateway']).prometheus_port}",
    }
