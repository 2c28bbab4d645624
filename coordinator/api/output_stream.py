"""What every public Generate shares: domain errors as status codes, and one request's run
through the engine as a stream of outputs, traced, and aborted if the caller leaves."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from specdec.auth import key_scope
from specdec.coordinator.engine.core import Engine
from specdec.coordinator.engine.errors import (
    Cancelled,
    InvalidRequest,
    NotReady,
    ResourceExhausted,
    ServiceError,
    SpecDecError,
)
from specdec.coordinator.engine.request import Request, RequestOutput
from specdec.telemetry.tracing import context_from_metadata

tracer = trace.get_tracer("specdec.coordinator")

_STATUS_BY_ERROR: dict[type[SpecDecError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    Cancelled: grpc.StatusCode.CANCELLED,
}


def caller_scope(api: str, context: grpc.aio.ServicerContext) -> str:
    """Where a caller's request ids live: per public API, and per API key when keys are
    on, so no client can abort, or collide with, another's request."""
    key = key_scope(context.invocation_metadata())
    return f"{api}:{key}" if key else api


def status_code(error: BaseException) -> grpc.StatusCode:
    """The gRPC status for a domain error (a failed service call keeps its own code)."""
    if isinstance(error, ServiceError):
        return getattr(grpc.StatusCode, error.code, grpc.StatusCode.INTERNAL)
    for cls in type(error).__mro__:
        if cls in _STATUS_BY_ERROR:
            return _STATUS_BY_ERROR[cls]
    return grpc.StatusCode.INTERNAL


async def run_request(
    engine: Engine, req: Request, context: grpc.aio.ServicerContext
) -> AsyncIterator[RequestOutput]:
    """Adds ``req`` to the engine and yields its outputs until it finishes. An error aborts
    the RPC with its status; leaving early (the caller cancelled, a stop string matched)
    aborts the request, which frees its KV on both services."""
    try:
        engine.add_request(req)
    except SpecDecError as e:
        await context.abort(status_code(e), str(e))
    span = tracer.start_span(
        "specdec.request",
        context=context_from_metadata(context.invocation_metadata()),
        attributes={
            "specdec.request_id": req.request_id,
            "specdec.num_prompt_tokens": req.num_prompt_tokens,
            "specdec.max_tokens": req.max_tokens,
        },
    )
    req.span_context = span.get_span_context()
    try:
        while True:
            out = await req.outputs.get()
            if out.error is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(out.error)))
                await context.abort(status_code(out.error), str(out.error))
            yield out
            if out.finished:
                break
    finally:
        engine.abort(req.request_id)  # a no-op when it finished
        span.set_attribute("specdec.num_output_tokens", req.num_output_tokens)
        span.set_attribute("specdec.accepted", req.stats.num_accepted_tokens)
        span.set_attribute("specdec.drafted", req.stats.num_draft_tokens)
        span.set_attribute("specdec.finish_reason", req.finish_reason or req.status.value)
        span.end()
