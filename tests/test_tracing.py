"""Tracing records spans only where they are exported (an OTLP endpoint is set), and a
caller's trace context passes through a service either way. Each case runs in a fresh
interpreter: a process installs its tracer provider once."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes
ROOT = Path(__file__).resolve().parents[1]
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PROBE = f"""
import json
from opentelemetry import trace
from specdec.telemetry.tracing import configure_tracing, context_from_metadata, grpc_metadata

configure_tracing("specdec-test")
tracer = trace.get_tracer("probe")
parent = context_from_metadata([("traceparent", "{PARENT}")])
with tracer.start_as_current_span("step", context=parent) as span:
    recording, sent = span.is_recording(), dict(grpc_metadata())
print(json.dumps({{"recording": recording, "traceparent": sent["traceparent"]}}))
"""


def probe(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "env",
    [{}, {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}],
    ids=["no-endpoint", "sdk-disabled"],
)
def test_without_an_exporter_spans_are_not_recorded_and_the_callers_context_passes(env):
    out = probe(env)
    assert out == {"recording": False, "traceparent": PARENT}


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
)
def test_an_otlp_endpoint_records_child_spans_of_the_callers_trace(variable):
    out = probe({variable: "http://127.0.0.1:9"})  # nothing listens: exports fail quietly
    assert out["recording"] is True
    version, trace_id, span_id, flags = out["traceparent"].split("-")
    _, parent_trace, parent_span, _ = PARENT.split("-")
    assert (trace_id, flags) == (parent_trace, "01")
    assert span_id != parent_span  # our span, child of the caller's
