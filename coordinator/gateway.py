"""The SGLang Model Gateway (``smg``, the ``[gateway]`` extra) in front of a stack's
coordinators: the OpenAI API, routing across replicas, and its own metrics.

The gateway speaks ``vllm.grpc.engine.VllmEngine`` to each coordinator
(``coordinator/vllm_worker.py``), reads the tokenizer and chat template from the target's
folder (or, on another machine, from the coordinator's GetTokenizer), and stops routing to
a coordinator whose health check fails until it passes again.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator.launcher import ServiceProcess, Stack, StackConfig

# smg's start-up banner ends with "listening  HOST:PORT".
GATEWAY_BANNER = re.compile(r"listening\s+(\S+):(\d+)\s*$")
# How often the gateway checks each coordinator's health (smg's default is 60 s).
HEALTH_CHECK_INTERVAL_SECONDS = 2


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768 and up), so no service a stack
    starts with port 0 can take it before the process it is meant for binds it."""
    rng = random.Random()
    while True:
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def gateway_argv(
    worker_addresses: list[str], host: str, port: int, policy: str, metrics_port: int
) -> list[str]:
    return [
        sys.executable, "-m", "smg", "launch", "--backend", "vllm",
        "--worker-urls", *(f"grpc://{a}" for a in worker_addresses),
        "--host", host, "--port", str(port), "--policy", policy,
        "--prometheus-host", host, "--prometheus-port", str(metrics_port),
        "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_SECONDS),
        "--log-level", "warn",
    ]  # fmt: skip


def check_gateway_config(config: StackConfig) -> None:
    """Refuses, before anything starts, what the gateway cannot do."""
    if importlib.util.find_spec("smg") is None:
        raise RuntimeError(
            "--gateway-port needs the SGLang Model Gateway: pip install 'specdec[gateway]'"
        )
    if config.api_key:
        raise RuntimeError(
            "--api-key with --gateway-port: smg sends no key to its gRPC workers, so the "
            "coordinators would refuse it; run the gateway with its own --api-key in front of "
            "coordinators on a private network instead"
        )


def start_gateway(stack: Stack, port: int) -> str:
    """Starts smg for ``stack``'s coordinators and returns its OpenAI base URL once every
    coordinator is registered as a worker."""
    c = stack.config
    metrics_port = c.gateway_metrics_port or free_port()
    argv = gateway_argv(stack.addresses, c.host, port, c.gateway_policy, metrics_port)
    process = stack.spawn("gateway", argv, banner=GATEWAY_BANNER)
    url = f"http://{process.wait_ready(stack.timeout)}/v1"
    wait_for_workers(url, len(stack.addresses), stack.timeout, process)
    return url


def wait_for_workers(url: str, count: int, timeout: float, process: ServiceProcess) -> None:
    """Blocks until the gateway at ``url`` lists ``count`` healthy workers."""
    deadline = time.monotonic() + timeout
    base = url.removesuffix("/v1")
    while process.proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/workers", timeout=2) as reply:
                workers = json.load(reply).get("workers", [])
            if sum(1 for w in workers if w.get("is_healthy", True)) >= count:
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway at {url} did not register {count} worker(s)")
        time.sleep(0.2)
    raise RuntimeError(f"the gateway exited with code {process.proc.poll()}{process.tail()}")
