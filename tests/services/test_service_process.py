"""``python -m target_service`` as a process: listening line, health, drain on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_target_service_process_prints_listening_line_serves_health_and_stops_on_sigterm(
    tiny_model_path,
):
    command = [
        sys.executable, "-m", "specdec.target_service", "--model", str(tiny_model_path),
        "--port", "0", "--kv-cache-dtype", "fp8", "--num-gpu-blocks-override", "32",
        "--grace-s", "1",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()  # blocks until SERVING (or exit: "")
        match = re.fullmatch(r"target service listening on 127\.0\.0\.1:(\d+)\n", line)
        assert match, f"unexpected first line {line!r}; stderr: {process.stderr.read()[-2000:]}"
        with grpc.insecure_channel(f"127.0.0.1:{match[1]}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            response = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
