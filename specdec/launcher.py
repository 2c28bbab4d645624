"""Start the three services as separate processes on loopback and stop them together.

`Stack` is what `specdec up`, `specdec demo`, `specdec bench` and the end-to-end tests use:
it starts the target and the draft (in parallel: both load weights), waits for their
`... listening on HOST:PORT` lines, starts the coordinator against them, and then checks
that all three report SERVING on `grpc.health.v1` before it returns.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.auth import API_KEY_ENV, INTERNAL_TOKEN_ENV, bearer, coordinator_credential
from specdec.auth.tls import TLSFiles
from specdec.client import Prompt
from specdec.config import (
    MODELS_DIR,
    REAL_DRAFT,
    REAL_TARGET,
    TINY_DRAFT,
    TINY_TARGET,
    StackConfig,
    command_line,
    draft_speculation,
    has_model_files,
    model_folder,
)
from specdec.coordinator.api.chat import ChatTemplate
from specdec.gateway import check_gateway_config, start_gateway

BANNER = re.compile(r"listening on (\S+):(\d+)\s*$")


def held_out_prompts(target_model: str, n: int) -> list[Prompt]:
    """The first `n` prompts no draft was trained on, in the target's form: chat messages
    for a target with a chat template (the real pair's held-out questions), else the
    tiny pair's held-out code prompts."""
    if ChatTemplate.from_pretrained(str(model_folder(target_model))) is not None:
        questions = json.loads((REAL_DRAFT / "heldout.json").read_text())["prompts"]
        return [[{"role": "user", "content": q}] for q in questions[:n]]
    return json.loads((MODELS_DIR / "heldout.json").read_text())["prompts"][:n]


class ServiceProcess:
    """A child process whose output is kept (last lines) and optionally echoed."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        echo: bool,
        env: dict[str, str] | None = None,
        banner: re.Pattern = BANNER,
    ) -> None:
        self.name = name
        self.argv = argv
        self.echo = echo
        self.env = env or {}
        self.banner = banner
        self.lines: deque[str] = deque(maxlen=200)
        self.address: str | None = None
        self._ready = threading.Event()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the launcher, which stops us in order
        )
        threading.Thread(target=self._pump, name=f"{name}-output", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if self.echo:
                print(f"[{self.name}] {line}", file=sys.stderr, flush=True)
            match = self.banner.search(line)
            if match and self.address is None:
                self.address = f"{match.group(1)}:{match.group(2)}"
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start within {timeout:g}s{self.tail()}")
        if self.address is None:
            raise RuntimeError(
                f"{self.name} exited with code {self.proc.poll()} before serving{self.tail()}"
            )
        return self.address

    def respawned(self) -> ServiceProcess:
        """The same command again, bound to the port this process had (it may have been
        started with ``--port 0``), so whoever holds its address reaches the new one."""
        argv = list(self.argv)
        if self.address is not None and "--port" in argv:
            argv[argv.index("--port") + 1] = self.address.rsplit(":", 1)[1]
        return ServiceProcess(self.name, argv, self.echo, self.env, self.banner)

    def tail(self) -> str:
        return "; its last output:\n  " + "\n  ".join(list(self.lines)[-15:])

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_serving(
    address: str, timeout: float, credentials: grpc.ChannelCredentials | None = None
) -> None:
    """Blocks until `address` answers grpc.health.v1 Check with SERVING."""
    deadline = time.monotonic() + timeout
    channel = grpc.secure_channel(address, credentials) if credentials else None
    with channel or grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{address} did not report SERVING within {timeout:g}s")
            time.sleep(0.1)


class Stack:
    """target + draft + coordinator as three processes; use as a context manager."""

    def __init__(self, config: StackConfig, echo: bool = False, timeout: float = 300.0) -> None:
        self.config = draft_speculation(config)
        self.echo = echo
        self.timeout = timeout
        self.processes: list[ServiceProcess] = []
        self.address = ""  # the first replica's coordinator
        self.addresses: list[str] = []  # every replica's coordinator
        self.baseline_address = ""  # target-only coordinator, when config.with_baseline
        self.target_address = ""  # the first replica's target
        self.target_addresses: list[str] = []
        self.draft_address = ""
        self.gateway_url = ""  # http://HOST:PORT/v1 when config.gateway_port
        # Only this stack's coordinators may call its model services: a fresh secret per
        # start, passed through the environment (never the command line).
        self.internal_token = secrets.token_urlsafe(32)
        self.gateway_admin_key = config.gateway_admin_key or secrets.token_urlsafe(32)

    def _spawn_model(self, service: str, name: str, model: str, port: int) -> ServiceProcess:
        """The ``service`` ("target" or "draft") as a process named ``name``."""
        return self.spawn(name, self.model_argv(service, model, port))

    def model_argv(self, service: str, model: str, port: int) -> list[str]:
        """The command line of the ``service`` ("target" or "draft") serving ``model``."""
        config = self.config.service_config(service, model, port)
        return command_line(f"specdec.{service}_service", config)

    def start(self) -> Stack:
        c = self.config
        if c.replicas < 1:
            raise RuntimeError(f"--replicas must be >= 1, got {c.replicas}")
        if c.gateway_port:
            check_gateway_config(c)
        for path in (c.target_model, *(() if c.no_draft else (c.draft_model,))):
            if not has_model_files(path):
                hint = (
                    "; fetch the default pair with `python scripts/fetch_models.py`, or select "
                    f"the bundled one: --target-model {TINY_TARGET} --draft-model {TINY_DRAFT}"
                    if Path(path) in (REAL_TARGET, REAL_DRAFT)
                    else ""
                )
                raise RuntimeError(
                    f"{path} is neither a Hugging Face model folder (config.json) nor a GGUF "
                    f"file or a folder holding one{hint}"
                )
        try:
            targets = [
                self._spawn_model(
                    "target",
                    self._replica("target", i),
                    c.target_model,
                    c.target_port if i == 0 else 0,
                )
                for i in range(c.replicas)
            ]
            draft = (
                None
                if c.no_draft
                else self._spawn_model("draft", "draft", c.draft_model, c.draft_port)
            )
            self.target_addresses = [t.wait_ready(self.timeout) for t in targets]
            self.target_address = self.target_addresses[0]
            self.draft_address = draft.wait_ready(self.timeout) if draft else ""
            coordinators = [
                self.spawn_coordinator(
                    self._replica("coordinator", i),
                    c.port if i == 0 else 0,
                    self.target_addresses[i],
                    self.draft_address,
                    c.metrics_port if i == 0 else 0,
                )
                for i in range(c.replicas)
            ]
            self.addresses = [p.wait_ready(self.timeout) for p in coordinators]
            self.address = self.addresses[0]
            if c.with_baseline:
                self.baseline_address = self.spawn_coordinator(
                    "baseline-coordinator", 0, self.target_address, "", 0
                ).wait_ready(self.timeout)
            tls = TLSFiles(c.tls_cert, c.tls_key, c.tls_ca)
            internal = tls.channel_credentials() if tls.ca else None
            for address in filter(None, (*self.target_addresses, self.draft_address)):
                wait_serving(address, self.timeout, internal)
            public = None
            if tls.serves_tls:
                with open(tls.ca or tls.cert, "rb") as f:
                    public = grpc.ssl_channel_credentials(root_certificates=f.read())
            for address in filter(None, (*self.addresses, self.baseline_address)):
                wait_serving(address, self.timeout, public)
            if c.gateway_port:
                self.gateway_url = start_gateway(self, c.gateway_port)
        except BaseException:
            self.stop()
            raise
        return self

    def _replica(self, name: str, index: int) -> str:
        """A process's name: "target", or "target-1" when there are replicas."""
        return name if self.config.replicas == 1 else f"{name}-{index}"

    def spawn_coordinator(
        self, name: str, port: int, target_address: str, draft_address: str, metrics_port: int
    ) -> ServiceProcess:
        """A coordinator named ``name``: the name is also its identity on the model services,
        so after a restart it releases what it held before."""
        c = self.config
        config = c.coordinator_config(
            port=port,
            target=target_address,
            draft=draft_address,
            coordinator_id=name,
            metrics_port=metrics_port,
            worker_api_without_key=bool(c.gateway_port and c.api_key),
            api_key="",  # in the environment below, never on the command line
        )
        argv = command_line("specdec.coordinator", config)
        # Its own credential, which proves only its own name to the model services.
        env = {INTERNAL_TOKEN_ENV: coordinator_credential(self.internal_token, name)}
        if c.api_key:
            env[API_KEY_ENV] = c.api_key
        return self.spawn(name, argv, env=env)

    @property
    def internal_metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata that lets a tool (a benchmark, a test) call the model services."""
        return (bearer(self.internal_token),)

    def spawn(
        self,
        name: str,
        argv: list[str],
        banner: re.Pattern = BANNER,
        env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        """Starts a child of this stack (stopped with it, restarted by the supervisor);
        ``env`` None gives it the stack's internal secret, as the model services need."""
        env = {INTERNAL_TOKEN_ENV: self.internal_token} if env is None else env
        process = ServiceProcess(name, argv, self.echo, env, banner)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        """Gateway, then coordinators (they drain and release), then the model services."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
