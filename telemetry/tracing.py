"""OpenTelemetry setup, the one place that touches the SDK.

Configured by the standard environment variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns on the OTLP/gRPC exporter, without it spans
are not exported; `OTEL_SERVICE_NAME` names the service (default "specdec-coordinator");
`OTEL_SDK_DISABLED=true` leaves the no-op API in place. Business code imports only
`opentelemetry.trace` and `grpc_metadata()` below.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import propagate, trace

logger = logging.getLogger(__name__)
_configured = False
_tracer = trace.get_tracer("specdec")  # follows the provider configure_tracing installs


def configure_tracing(default_service_name: str = "specdec-coordinator") -> None:
    """Installs a tracer provider once per process; a no-op when tracing is disabled."""
    global _configured
    if _configured or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider

    # Resource.create() reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES; without either
    # the name is "unknown_service...", which the default replaces.
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    provider = TracerProvider(resource=resource)
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        logger.info("tracing: exporting spans over OTLP")
    trace.set_tracer_provider(provider)
    _configured = True


@contextmanager
def rpc_span(
    name: str, context: object, carrier: Mapping[str, str] | None = None, **attributes: object
) -> Iterator[trace.Span]:
    """A server span for one RPC, or one step of a stream, child of the caller's trace
    context: from ``carrier`` (a stream message's ``trace_context``) when given, else from
    the call's metadata."""
    pairs = context.invocation_metadata() if carrier is None else carrier.items()  # type: ignore[attr-defined]
    parent = context_from_metadata(pairs)
    with _tracer.start_as_current_span(name, context=parent, attributes=attributes) as span:
        yield span


def shutdown_tracing() -> None:
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


def grpc_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC call metadata (W3C traceparent by default)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple((k.lower(), v) for k, v in carrier.items())


def context_from_metadata(metadata: object) -> object | None:
    """The caller's trace context from incoming gRPC metadata (None when absent)."""
    if not metadata:
        return None
    carrier = {k: v for k, v in metadata if isinstance(v, str)}  # type: ignore[attr-defined]
    return propagate.extract(carrier) if carrier else None
