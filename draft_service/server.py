"""Build and run the draft gRPC server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from draft_service.drafter import Drafter
from draft_service.servicer import DraftServicer
from protos.specdec.v1 import draft_pb2, draft_pb2_grpc
from runtime.model_runner import ModelRunner
from runtime.serving import (
    ModelExecutor,
    ServiceConfig,
    build_server,
    load_runner,
    run_until_signal,
)
from telemetry.tracing import configure_tracing, shutdown_tracing

SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name


async def create_server(
    config: ServiceConfig,
    runner: ModelRunner | None = None,
    executor: ModelExecutor | None = None,
) -> tuple[grpc.aio.Server, int]:
    """An unstarted server bound to ``config.host:config.port``, health SERVING.

    Loads and warms up the model on the executor first, unless ``runner`` is given.
    """
    executor = executor or ModelExecutor("draft-model")
    if runner is None:
        runner = await executor.run(load_runner, config)
    servicer = DraftServicer(Drafter(runner), executor)
    return await build_server(
        config,
        SERVICE_NAME,
        lambda s: draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, s),
    )


async def serve(config: ServiceConfig) -> None:
    executor = ModelExecutor("draft-model")
    server, port = await create_server(config, executor=executor)
    banner = f"draft service listening on {config.host}:{port}"
    configure_tracing("specdec-draft")
    await run_until_signal(server, banner, config.grace_s)
    shutdown_tracing()
    executor.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(ServiceConfig.from_args("python -m draft_service", argv)))
