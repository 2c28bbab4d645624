"""Fixtures for service tests: real gRPC servers on loopback port 0 over the tiny model."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest
from service_testing import NUM_PAGES, PAGE_SIZE, ServerThread

from specdec.model_service.config import ServiceConfig
from specdec.runtime.model_runner import ModelRunner
from specdec.target_service.server import create_server as create_target_server
from specdec.v1 import target_pb2_grpc


@pytest.fixture
def service_config(tiny_model_path) -> ServiceConfig:
    return ServiceConfig(
        model=str(tiny_model_path),
        kv_cache_dtype="fp8",
        block_size=PAGE_SIZE,
        num_gpu_blocks_override=NUM_PAGES,
    )


@pytest.fixture
def make_runner(service_config) -> Callable[..., ModelRunner]:
    """A fresh runner over the tiny checkpoint, configured as the services' are."""

    def make(**overrides) -> ModelRunner:
        return ModelRunner(dataclasses.replace(service_config.runtime_config(), **overrides))

    return make


@pytest.fixture
def start_server(service_config, make_runner) -> Iterator[Callable[..., ServerThread]]:
    """``start_server(create_server, **runner_overrides)``; every server stops at teardown."""
    servers: list[ServerThread] = []

    def start(create_server: Callable, **overrides) -> ServerThread:
        servers.append(ServerThread(create_server, service_config, make_runner(**overrides)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def target(start_server):
    """A target service over the tiny model: (its ServerThread, a TargetService stub)."""
    server = start_server(create_target_server)
    return server, target_pb2_grpc.TargetServiceStub(server.channel)
