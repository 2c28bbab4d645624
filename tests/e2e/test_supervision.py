"""`specdec up` restarts a model service that dies; clients see a clean status, then service.

Real processes: `specdec up` on the tiny pair, services killed with SIGKILL mid-stream.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from e2e_stack import DRAFT, TARGET, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently
from specdec.gateway import free_port

SPECDEC = str(Path(sys.executable).parent / "specdec")
PARAMS = GenerateParams(max_tokens=160, ignore_eos=True)


def pid_of(module: str, address: str) -> int:
    """The pid of `python -m <module> ... --port <port>` serving `address`."""
    port = address.rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode() for w in argv if w]
        if module in words and "--port" in words and words[words.index("--port") + 1] == port:
            return int(entry.name)
    raise LookupError(f"no {module} on port {port}")


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        try:
            request = health_pb2.HealthCheckRequest()
            return health_pb2_grpc.HealthStub(channel).Check(request, timeout=2).status
        except grpc.RpcError:
            return -1


@pytest.fixture(scope="module")
def up():
    # Fixed model ports, so the tests can find each service's process by its command line.
    argv = [
        SPECDEC, "up", "--port", "0", "--target-model", TARGET, "--draft-model", DRAFT,
        "--target-port", str(free_port()), "--draft-port", str(free_port()),
        "--speculative-config", '{"num_speculative_tokens": 3}',
        "--speculative-gate", "off",  # every step drafts, so a kill lands mid-draft
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
    line = ""
    while "coordinator listening on" not in line:
        line = proc.stdout.readline()
        assert line, "specdec up exited before serving"
    address = line.split()[-1]
    services = proc.stdout.readline().split()  # "target HOST:PORT, draft HOST:PORT"
    yield address, services[1].rstrip(","), services[3], log
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def test_a_killed_draft_is_restarted_and_four_streams_finish_unchanged(up, prompt_ids):
    address, _, draft_address, log = up
    prompts = prompt_ids[:4]
    _, undisturbed = generate_concurrently(address, prompts, PARAMS)

    outs: list = []
    runner = threading.Thread(
        target=lambda: outs.extend(generate_concurrently(address, prompts, PARAMS)[1])
    )
    with CoordinatorClient(address) as client:
        drafted = client.totals().num_draft_tokens
        runner.start()
        # The kill lands mid-stream: once the draft has proposed for these requests.
        assert wait_until(lambda: client.totals().num_draft_tokens > drafted, timeout=60)
    os.kill(pid_of("specdec.draft_service", draft_address), signal.SIGKILL)
    runner.join(120)
    assert [o.token_ids for o in outs] == [o.token_ids for o in undisturbed]
    assert sum(o.stats["num_k0_steps"] for o in outs) > 0

    assert wait_until(lambda: any("draft restarted on" in line for line in log))
    assert any("draft exited with status -9" in line for line in log)
    # Once the new draft answers the coordinator re-syncs it and drafting resumes.
    assert wait_until(
        lambda: generate_concurrently(address, prompts[:1], PARAMS)[1][0].stats["num_drafts"] > 0
    )


def test_a_killed_target_fails_in_flight_requests_with_unavailable_then_serves_again(
    up, prompt_ids
):
    address, target_address, _, log = up
    with CoordinatorClient(address) as client:
        before = client.generate(prompt_ids[0], PARAMS)
        stream = client.stream(prompt_ids[1], PARAMS, timeout=120)
        next(stream)
        os.kill(pid_of("specdec.target_service", target_address), signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as err:
            for _ in stream:
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert wait_until(lambda: health(address) == health_pb2.HealthCheckResponse.NOT_SERVING)
        assert wait_until(lambda: health(address) == health_pb2.HealthCheckResponse.SERVING)
        assert any("target exited with status -9" in line for line in log)
        after = client.generate(prompt_ids[0], PARAMS)
    assert after.token_ids == before.token_ids
