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
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from auth import API_KEY_ENV, INTERNAL_TOKEN_ENV, bearer, coordinator_credential
from auth.tls import TLSFiles
from coordinator.chat import ChatTemplate
from coordinator.client import Prompt
from coordinator.gateway import check_gateway_config, start_gateway

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
# Hand-written chat prompts, ten per category, for evaluation only (never trained on).
GENERAL_CHAT = MODELS_DIR.parent / "bench" / "prompts" / "general_chat.json"
# The real pair, the default: SmolLM2-135M-Instruct as its Q4_1 GGUF (a folder holding the
# file, its tokenizer and KV scales, fetched by scripts/fetch_models.py) and the draft
# trained for it (completed by the same script); and the bundled tiny pair, which the tests
# and the llama.cpp comparison select explicitly.
REAL_TARGET = MODELS_DIR / "smollm2-135m-instruct-q4_1"
REAL_DRAFT = MODELS_DIR / "smollm2-draft"
TINY_TARGET = MODELS_DIR / "target"
TINY_DRAFT = MODELS_DIR / "draft"
BANNER = re.compile(r"listening on (\S+):(\d+)\s*$")
# What a draft runs with when its folder says nothing (see `draft_speculation`): one row
# per batch-size range (vLLM's format), K = 6 for a request alone, 4 for two, none from
# three on, and prompt lookup first (vLLM's ngram keys).
DEFAULT_SPECULATIVE_CONFIG = (
    '{"num_speculative_tokens_per_batch_size": [[1, 1, 6], [2, 2, 4], [3, 1024, 0]], '
    '"prompt_lookup_min": 3, "prompt_lookup_max": 4}'
)
DEFAULT_DRAFT_P_MIN = 0.0
# The key of a draft's config.json that holds the settings tuned for it (vLLM's
# speculators checkpoints keep theirs under the same name): {"speculative_config": {...},
# "draft_p_min": P}.
SPECULATORS_CONFIG = "speculators_config"


# The default KV pools hold max_num_seqs sequences (at least MIN_DEFAULT_SEQUENCES, so
# one request of a long context fits too) of this many tokens (a chat with its history),
# in pages of BLOCK_SIZE tokens (the services' default --block-size).
TYPICAL_SEQUENCE_TOKENS = 2048
MIN_DEFAULT_SEQUENCES = 16
BLOCK_SIZE = 16


@dataclass(frozen=True)
class StackConfig:
    """The flags of `specdec up` (vLLM's names where vLLM has one)."""

    # A Hugging Face folder, a .gguf file, or a folder holding one.
    target_model: str = str(REAL_TARGET)
    draft_model: str = str(REAL_DRAFT)
    # The tokenizer and chat template (a folder with tokenizer.json): "" = the target's
    # folder (for a .gguf file, the folder it is in), as vLLM's --tokenizer.
    tokenizer: str = ""
    kv_cache_dtype: str = "auto"
    dtype: str = "float32"
    # The draft's weights: "auto" keeps a 16-bit checkpoint in its own dtype (a draft's
    # precision never changes the output, and 16 bits halve its cost per token), else --dtype.
    draft_dtype: str = "auto"
    # The draft's linears as int8 (--quantization of the draft service): a quarter of
    # float32's bytes per draft token; "none" keeps --draft-dtype's.
    draft_quantization: str = "int8"
    # vLLM's --speculative-config JSON; "" = the draft's own (`draft_speculation`).
    speculative_config: str = ""
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 16
    # Each service's KV pool in bytes ("512MiB", "2GiB", ...; vLLM's --kv-cache-memory);
    # "" = room for max_num_seqs (at least 16) sequences of TYPICAL_SEQUENCE_TOKENS (the
    # draft's for every replica's). Each service logs its capacity in tokens at start.
    kv_cache_memory: str = ""
    draft_kv_cache_memory: str = ""
    # Automatic prefix caching on both services (vLLM V1's default): full blocks of a prompt
    # another request computed are reused, not recomputed.
    enable_prefix_caching: bool = True
    max_queue_len: int = 256  # waiting requests; more is RESOURCE_EXHAUSTED
    num_scheduler_steps: int = 8  # target forwards per round trip where every decode has K = 0
    pipeline: str = "auto"  # the draft proposes for the next step during verify; or "off"
    # Pipelined at batch 1: outcomes of the verify the draft prepares proposals for (all
    # accepted, first proposal rejected, second, ...); 1 = all accepted only.
    pipeline_branches: int = 3
    # The draft stops proposing at a token after its first it gives less than this
    # (llama.cpp's --draft-p-min); < 0 = the draft's own (`draft_speculation`).
    draft_p_min: float = -1.0
    host: str = "127.0.0.1"
    port: int = 50050
    target_port: int = 0  # 0 = any free port
    draft_port: int = 0
    # torch threads per model service (0: all cores). On a CPU host one core each keeps
    # the two services apart, as two GPUs would: a K = 0 step's draft ingest then runs
    # beside the target's verify instead of stealing its cores. See the README.
    target_num_threads: int = 1
    draft_num_threads: int = 1
    no_draft: bool = False  # target-only serving: no draft service, K = 0 throughout
    draft_rebuild_every_step: bool = False
    with_baseline: bool = False  # also a target-only coordinator on the same target service
    metrics_port: int = 0
    api_key: str = ""  # clients must send "authorization: Bearer KEY"; "" = open
    tls_cert: str = ""  # PEM certificate: the coordinator's public port serves TLS
    tls_key: str = ""  # PEM private key of tls_cert
    tls_ca: str = ""  # PEM CA that signed tls_cert: mutual TLS on the internal hops too
    replicas: int = 1  # coordinator + target pairs, all sharing the one draft service
    gateway_port: int = 0  # the SGLang Model Gateway's OpenAI API on this port; 0 = none
    gateway_policy: str = "round_robin"  # smg's --policy across the replicas
    gateway_metrics_port: int = 0  # the gateway's Prometheus /metrics; 0 = any free port
    served_model_name: str = ""  # the model name the gateway's clients send; "" = folder name
    # The gateway's control-plane (admin) key; "" = a fresh one per start, kept by this
    # process (its supervisor re-registers a worker the gateway lost).
    gateway_admin_key: str = ""


def model_folder(model: str) -> Path:
    """The folder of a model path: itself, or for a file (a .gguf) the folder it is in."""
    path = Path(model)
    return path.parent if path.is_file() else path


def has_model_files(model: str) -> bool:
    """A .gguf file, or a folder with a config.json or a .gguf in it."""
    path = Path(model)
    if path.is_file():
        return path.suffix == ".gguf"
    return (path / "config.json").is_file() or any(path.glob("*.gguf"))


def draft_dtype(draft_model: str, requested: str, dtype: str) -> str:
    """The dtype the draft service loads ``draft_model`` in: ``requested``, or for "auto"
    the checkpoint's own (``config.json`` ``torch_dtype``) when it is 16-bit, else ``dtype``
    (a GGUF's blocks are widened to float32 as they are read whatever it is)."""
    config_file = Path(draft_model) / "config.json"
    if requested != "auto" or not config_file.is_file():
        return requested if requested != "auto" else dtype
    config = json.loads(config_file.read_text())
    stored = config.get("torch_dtype") or config.get("dtype")
    return stored if stored in ("bfloat16", "float16") else dtype


def tuned_speculation(folder: Path) -> dict:
    """The ``speculators_config`` of the draft in ``folder`` ({} when it has none)."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        return {}
    return json.loads(config_file.read_text()).get(SPECULATORS_CONFIG) or {}


def draft_speculation(config: StackConfig) -> StackConfig:
    """``config`` with its speculative settings filled in where the flags left them unset:
    from the draft folder's config.json (``speculators_config``: the settings measured
    best for that draft, so each draft runs with its own), else the defaults above."""
    tuned = {} if config.no_draft else tuned_speculation(model_folder(config.draft_model))
    spec = tuned.get("speculative_config")
    return replace(
        config,
        speculative_config=config.speculative_config
        or (json.dumps(spec) if spec is not None else DEFAULT_SPECULATIVE_CONFIG),
        draft_p_min=config.draft_p_min
        if config.draft_p_min >= 0
        else float(tuned.get("draft_p_min", DEFAULT_DRAFT_P_MIN)),
    )


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
        c = self.config
        if service == "target":
            threads, dtype, quantization = c.target_num_threads, c.dtype, "none"
            memory, sequences = c.kv_cache_memory, max(c.max_num_seqs, MIN_DEFAULT_SEQUENCES)
        else:
            threads, dtype = c.draft_num_threads, draft_dtype(model, c.draft_dtype, c.dtype)
            quantization = c.draft_quantization
            memory = c.draft_kv_cache_memory
            sequences = max(c.max_num_seqs, MIN_DEFAULT_SEQUENCES) * c.replicas
        argv = [
            sys.executable, "-m", f"{service}_service", "--model", model, "--host", c.host,
            "--port", str(port), "--kv-cache-dtype", c.kv_cache_dtype, "--dtype", dtype,
            "--quantization", quantization, "--num-threads", str(threads),
            "--block-size", str(BLOCK_SIZE),
            "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching",
        ]  # fmt: skip
        if memory:
            argv += ["--kv-cache-memory", memory]
        else:
            pages = -(-sequences * TYPICAL_SEQUENCE_TOKENS // BLOCK_SIZE)
            argv += ["--num-gpu-blocks-override", str(pages)]
        if c.tls_ca:  # mutual TLS on the internal hops
            argv += ["--tls-cert", c.tls_cert, "--tls-key", c.tls_key, "--tls-ca", c.tls_ca]
        return argv

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
        argv = [
            sys.executable, "-m", "coordinator", "--host", c.host, "--port", str(port),
            "--target", target_address, "--draft", draft_address, "--coordinator-id", name,
            "--tokenizer", c.tokenizer or str(model_folder(c.target_model)),
            "--speculative-config", c.speculative_config,
            "--max-num-batched-tokens", str(c.max_num_batched_tokens),
            "--max-num-seqs", str(c.max_num_seqs), "--max-queue-len", str(c.max_queue_len),
            "--num-scheduler-steps", str(c.num_scheduler_steps), "--pipeline", c.pipeline,
            "--pipeline-branches", str(c.pipeline_branches),
            "--draft-p-min", str(c.draft_p_min), "--metrics-port", str(metrics_port),
            *(["--served-model-name", c.served_model_name] if c.served_model_name else []),
            *(["--draft-rebuild-every-step"] if c.draft_rebuild_every_step else []),
            *(["--worker-api-without-key"] if c.gateway_port and c.api_key else []),
            *(["--tls-cert", c.tls_cert, "--tls-key", c.tls_key] if c.tls_cert else []),
            *(["--tls-ca", c.tls_ca] if c.tls_ca else []),
        ]  # fmt: skip
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
