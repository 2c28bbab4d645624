"""A model service's gRPC server: built over its servicer, run until a signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from specdec.auth import INTERNAL_TOKEN_ENV, BearerTokenServerInterceptor
from specdec.auth.tls import TLSFiles
from specdec.model_service.config import ServiceConfig, message_limits
from specdec.model_service.executor import ModelExecutor, hand_over_the_gil_quickly, load_runner
from specdec.model_service.servicer import ModelServicer, ServedModel
from specdec.runtime.model_runner import ModelRunner
from specdec.telemetry.tracing import configure_tracing, shutdown_tracing

log = logging.getLogger(__name__)
INTERNAL_CALLER = (
    f"only the coordinator of this stack may call a model service (it sends "
    f"{INTERNAL_TOKEN_ENV}, which `specdec up` makes)"
)


@dataclass(frozen=True)
class ModelService:
    """One model service: its name ("draft", "target"), its proto service's full name,
    its servicer (made over its model, made over the loaded runner) and the generated
    ``add_*_to_server``.

    The name names the executor thread, the banner ``<name> service listening on
    HOST:PORT`` the launcher waits for, the traces (``specdec-<name>``) and the program
    (``python -m specdec.<name>_service``).
    """

    name: str
    service_name: str
    servicer: Callable[[Any, ModelExecutor], ModelServicer]
    model: Callable[[ModelRunner], ServedModel]
    add_to_server: Callable[[Any, grpc.aio.Server], None]

    async def create_server(
        self,
        config: ServiceConfig,
        runner: ModelRunner | None = None,
        executor: ModelExecutor | None = None,
    ) -> tuple[grpc.aio.Server, int]:
        """An unstarted server bound to ``config.host:config.port``, with the app
        servicer, health SERVING and reflection.

        Loads and warms up the model on the executor first, unless ``runner`` is given:
        health reports SERVING from the start.
        """
        executor = executor or ModelExecutor(f"{self.name}-model")
        if runner is None:
            runner = await executor.run(load_runner, config)
        token = os.environ.get(INTERNAL_TOKEN_ENV, "")
        interceptors = (
            [BearerTokenServerInterceptor(token, INTERNAL_CALLER, credentials_of=token)]
            if token
            else []
        )
        options = message_limits(runner.vocab_size)
        server = grpc.aio.server(options=options, interceptors=interceptors)
        servicer = self.servicer(self.model(runner), executor)
        self.add_to_server(servicer, server)
        servicer.start_reclaiming(config.sequence_idle_timeout)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        names = (self.service_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection((*names, reflection.SERVICE_NAME), server)
        tls = TLSFiles(config.tls_cert, config.tls_key, config.tls_ca)
        address = f"{config.host}:{config.port}"
        if tls.serves_tls:
            credentials = tls.server_credentials(require_client_cert=bool(tls.ca))
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"could not bind {config.host}:{config.port}")
        for name in ("", self.service_name):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return server, port

    async def serve(self, config: ServiceConfig) -> None:
        executor = ModelExecutor(f"{self.name}-model")
        server, port = await self.create_server(config, executor=executor)
        banner = f"{self.name} service listening on {config.host}:{port}"
        configure_tracing(f"specdec-{self.name}")
        await run_until_signal(server, banner, config.grace_s)
        shutdown_tracing()
        executor.shutdown()

    def main(self, argv: Sequence[str] | None = None) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        hand_over_the_gil_quickly()
        asyncio.run(
            self.serve(ServiceConfig.from_args(f"python -m specdec.{self.name}_service", argv))
        )


async def run_until_signal(server: grpc.aio.Server, banner: str, grace_s: float) -> None:
    """Start, print ``banner`` (the launcher waits for it), and drain on SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(banner, flush=True)
    await stop.wait()
    log.info("draining for up to %.1f s", grace_s)
    await server.stop(grace_s)
