"""The SGLang Model Gateway (``smg``, the ``[gateway]`` extra) in front of a stack's
coordinators: the OpenAI API, routing across replicas, and its own metrics.

The gateway speaks ``vllm.grpc.engine.VllmEngine`` to each coordinator
(``coordinator/vllm_worker.py``), reads the tokenizer and chat template from the target's
folder (or, on another machine, from the coordinator's GetTokenizer), and stops routing to
a coordinator whose health check fails until it passes again.

Its control plane (``/workers`` and the other admin endpoints) always requires an admin
key (smg's ``--control-plane-api-keys``): ``--gateway-admin-key``, or a fresh one per
start that only ``specdec up`` knows (its supervisor uses it to put back a worker the
gateway lost). With ``--api-key`` the gateway checks the key on the OpenAI API; smg sends
no key to its gRPC workers, so the coordinators then serve ``VllmEngine`` without one
and keep requiring it on ``specdec.v1.Coordinator``.
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
    from specdec.config import StackConfig
    from specdec.launcher import ServiceProcess, Stack

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
    worker_addresses: list[str],
    host: str,
    port: int,
    policy: str,
    metrics_port: int,
    admin_key: str,
    api_key: str = "",
) -> list[str]:
    return [
        sys.executable, "-m", "smg", "launch", "--backend", "vllm",
        "--worker-urls", *(worker_url(a) for a in worker_addresses),
        "--host", host, "--port", str(port), "--policy", policy,
        "--prometheus-host", host, "--prometheus-port", str(metrics_port),
        "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_SECONDS),
        "--control-plane-api-keys", f"specdec:specdec up:admin:{admin_key}",
        *(["--api-key", api_key] if api_key else []),
        "--log-level", "warn",
    ]  # fmt: skip


def worker_url(address: str) -> str:
    return f"grpc://{address}"


def check_gateway_config(config: StackConfig) -> None:
    """Refuses, before anything starts, what the gateway cannot do."""
    if importlib.util.find_spec("smg") is None:
        raise RuntimeError(
            "--gateway-port needs the SGLang Model Gateway: pip install 'specdec[gateway]'"
        )
    if "," in config.api_key:
        raise RuntimeError("--gateway-port takes one --api-key (smg checks a single key)")


def start_gateway(stack: Stack, port: int) -> str:
    """Starts smg for ``stack``'s coordinators and returns its OpenAI base URL once every
    coordinator is registered as a worker."""
    c = stack.config
    metrics_port = c.gateway_metrics_port or free_port()
    argv = gateway_argv(
        stack.addresses,
        c.host,
        port,
        c.gateway_policy,
        metrics_port,
        stack.gateway_admin_key,
        c.api_key,
    )
    process = stack.spawn("gateway", argv, banner=GATEWAY_BANNER, env={})  # no secret
    url = f"http://{process.wait_ready(stack.timeout)}/v1"
    wait_for_workers(url, stack.gateway_admin_key, len(stack.addresses), stack.timeout, process)
    return url


def _admin_call(
    url: str, admin_key: str, method: str = "GET", body: dict | None = None, path: str = "/workers"
):
    """A control-plane call to the gateway at ``url`` (its OpenAI base); the JSON reply."""
    request = urllib.request.Request(
        url.removesuffix("/v1") + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {admin_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=2) as reply:
        return json.load(reply)


def registered_workers(url: str, admin_key: str) -> list[dict]:
    """The workers the gateway at ``url`` lists."""
    return _admin_call(url, admin_key).get("workers", [])


def register_worker(url: str, admin_key: str, address: str) -> None:
    """Asks the gateway at ``url`` to route to the coordinator at ``address`` again."""
    _admin_call(url, admin_key, "POST", {"url": worker_url(address), "runtime": "vllm"})


def wait_for_workers(
    url: str, admin_key: str, count: int, timeout: float, process: ServiceProcess
) -> None:
    """Blocks until the gateway at ``url`` lists ``count`` healthy workers and is ready
    (``/readiness``: it has also registered the model's tokenizer)."""
    deadline = time.monotonic() + timeout
    while process.proc.poll() is None:
        try:
            workers = registered_workers(url, admin_key)
            if sum(1 for w in workers if w.get("is_healthy", True)) >= count:
                _admin_call(url, admin_key, path="/readiness")  # 503 (HTTPError) until ready
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway at {url} did not register {count} worker(s)")
        time.sleep(0.2)
    raise RuntimeError(f"the gateway exited with code {process.proc.poll()}{process.tail()}")
