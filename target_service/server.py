"""Build and run the target gRPC server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from protos.specdec.v1 import target_pb2, target_pb2_grpc
from runtime.model_runner import ModelRunner
from runtime.serving import (
    ModelExecutor,
    ServiceConfig,
    build_server,
    load_runner,
    run_until_signal,
)
from target_service.servicer import TargetServicer
from target_service.verifier import Verifier
from telemetry.tracing import configure_tracing, shutdown_tracing

SERVICE_NAME = target_pb2.DESCRIPTOR.services_by_name["TargetService"].full_name


async def create_server(
    config: ServiceConfig,
    runner: ModelRunner | None = None,
    executor: ModelExecutor | None = None,
) -> tuple[grpc.aio.Server, int]:
    """An unstarted server bound to ``config.host:config.port``, health SERVING.

    Loads and warms up the model on the executor first, unless ``runner`` is given.
    """
    executor = executor or ModelExecutor("target-model")
    if runner is None:
        runner = await executor.run(load_runner, config)
    servicer = TargetServicer(Verifier(runner), executor)
    return await build_server(
        config,
        SERVICE_NAME,
        lambda s: target_pb2_grpc.add_TargetServiceServicer_to_server(servicer, s),
    )


async def serve(config: ServiceConfig) -> None:
    executor = ModelExecutor("target-model")
    server, port = await create_server(config, executor=executor)
    banner = f"target service listening on {config.host}:{port}"
    configure_tracing("specdec-target")
    await run_until_signal(server, banner, config.grace_s)
    shutdown_tracing()
    executor.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(ServiceConfig.from_args("python -m target_service", argv)))
