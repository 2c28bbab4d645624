"""gRPC scaffolding shared by the draft and target services.

The service config and its flags, the domain errors and the ONE place that maps them to
status codes, the one-thread model executor, the Release/GetInfo RPCs, health +
reflection, ModelInfo and KV-scale conversion, warm-up, and the
create-server / serve-until-signal / main of a model service.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import re
import signal
import sys
import time
import typing
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from auth import INTERNAL_TOKEN_ENV, OWNER_KEY, BearerTokenServerInterceptor, proven_name
from auth.tls import TLSFiles
from kernels import dense_ops
from kernels.attention import ATTENTION_BACKENDS
from kernels.fp8 import KV_CACHE_DTYPES
from kernels.paged_kv_cache import OutOfPagesError
from protos.specdec.v1 import common_pb2
from runtime.config import (
    COMPUTE_DTYPES,
    DEFAULT_KV_CACHE_TOKENS,
    QUANTIZATIONS,
    RuntimeConfig,
)
from runtime.kv_scales import KVScalesMismatchError, KVScaleTable
from runtime.model_runner import ModelRunner
from runtime.sequence import SequenceChunk
from telemetry.tracing import configure_tracing, shutdown_tracing

log = logging.getLogger(__name__)
INTERNAL_CALLER = (
    f"only the coordinator of this stack may call a model service (it sends "
    f"{INTERNAL_TOKEN_ENV}, which `specdec up` makes)"
)
T = TypeVar("T")

# Draft probabilities are K x vocab float32 per proposed token (8 x 152k x 4 B is ~5 MB):
# above gRPC's 4 MB. A step carries at most this many proposed tokens' probabilities.
MAX_SAMPLED_TOKENS_PER_STEP = 512


def message_limits(vocab_size: int) -> list[tuple[str, int]]:
    """Explicit message size limits, from the model: one step's draft probabilities
    (``MAX_SAMPLED_TOKENS_PER_STEP`` x vocab float32) plus 16 MiB for the rest."""
    size = 16 * 1024 * 1024 + MAX_SAMPLED_TOKENS_PER_STEP * vocab_size * 4
    return [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)]


# ---- config -------------------------------------------------------------------------------

_SIZE_UNITS = {
    "": 1,
    **{unit: 1000 ** (i + 1) for i, unit in enumerate("KMGT")},
    **{f"{unit}I": 1024 ** (i + 1) for i, unit in enumerate("KMGT")},
}


def parse_size(text: str) -> int:
    """Bytes from ``1073741824``, ``512MiB``, ``2GiB``, ``1G`` (K/M/G/T: powers of 1000,
    KiB/MiB/GiB/TiB: of 1024; a trailing B is optional, case is ignored)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?)?B?\s*", text.upper())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give bytes (1073741824) or a number with a unit "
            f"(512MiB, 2GiB, 1G)"
        )
    return int(float(match[1]) * _SIZE_UNITS[match[2] or ""])


@dataclass(frozen=True)
class ServiceConfig:
    """How a model service runs; flags are vLLM's names (``--block-size``, ...)."""

    model: str = field(metadata={"help": "Hugging Face checkpoint folder"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=0, metadata={"help": "port to bind (0 = any free port)"})
    kv_cache_dtype: str = field(default="auto", metadata={"choices": KV_CACHE_DTYPES})
    dtype: str = field(default="float32", metadata={"choices": COMPUTE_DTYPES})
    quantization: str = field(
        default="none",
        metadata={
            "choices": QUANTIZATIONS,
            "help": "int8: the linears' weights as int8 with a scale per output channel "
            "(weight-only), a quarter of float32's bytes per token",
        },
    )
    block_size: int = field(default=16, metadata={"help": "tokens per KV page"})
    num_gpu_blocks_override: int | None = field(
        default=None, metadata={"help": "number of KV pages (default: from the memory budget)"}
    )
    kv_cache_memory_bytes: int | None = field(
        default=None,
        metadata={
            "flags": ("--kv-cache-memory", "--kv-cache-memory-bytes"),
            "type": parse_size,
            "help": "KV cache size in bytes, or with a unit: 512MiB, 2GiB, 1G (default: "
            f"pages for {DEFAULT_KV_CACHE_TOKENS} tokens)",
        },
    )
    enable_prefix_caching: bool = field(
        default=True,
        metadata={"help": "keep full KV blocks and share them between requests by content"},
    )
    max_model_len: int | None = field(default=None, metadata={"help": "default: checkpoint's"})
    device: str = field(default="cpu", metadata={"help": "cpu, cuda, cuda:1, ..."})
    attention_backend: str = field(
        default="auto",
        metadata={
            "choices": ATTENTION_BACKENDS,
            "help": "auto: flashinfer on CUDA, the C kernel (cpu) on the CPU, else reference",
        },
    )
    grace_s: float = field(default=5.0, metadata={"help": "drain time on SIGTERM"})
    num_threads: int = field(
        default=0,
        metadata={"help": "threads for model work, torch's and the C kernels' (0: all cores)"},
    )
    tls_cert: str = field(default="", metadata={"help": "PEM certificate: serve TLS"})
    tls_key: str = field(default="", metadata={"help": "PEM private key of --tls-cert"})
    tls_ca: str = field(
        default="", metadata={"help": "PEM CA: mutual TLS, only clients it signed get in"}
    )
    sequence_idle_timeout: float = field(
        default=600.0,
        metadata={"help": "seconds after which a sequence no call has touched is released"},
    )

    def runtime_config(self) -> RuntimeConfig:
        return RuntimeConfig(
            model=self.model,
            dtype=self.dtype,
            quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype,
            page_size=self.block_size,
            num_pages=self.num_gpu_blocks_override,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            max_model_len=self.max_model_len,
            device=self.device,
            attention_backend=self.attention_backend,
            enable_prefix_caching=self.enable_prefix_caching,
        )

    @classmethod
    def from_args(cls, prog: str, argv: Sequence[str] | None = None) -> ServiceConfig:
        """Parse flags whose names, types, defaults and choices come from the fields; a
        bool field is a ``--name / --no-name`` pair."""
        parser = argparse.ArgumentParser(prog=prog)
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            flags = f.metadata.get("flags", ("--" + f.name.replace("_", "-"),))
            parser.add_argument(*flags, dest=f.name, **_argument(f, hints[f.name]))
        return cls(**vars(parser.parse_args(argv)))


def _argument(f: Any, hint: Any) -> dict[str, Any]:
    """``add_argument``'s keywords for a field, other than its flags."""
    required = f.name == "model"
    common = {"default": None if required else f.default, "help": f.metadata.get("help")}
    if hint is bool:
        return {**common, "action": argparse.BooleanOptionalAction}
    kind = f.metadata.get("type") or next(
        t for t in (int, float, str) if t in (hint, *typing.get_args(hint))
    )
    return {**common, "type": kind, "required": required, "choices": f.metadata.get("choices")}


# ---- domain errors and their status codes (the one place) ---------------------------------


class InvalidRequestError(ValueError):
    """The message is malformed or asks for the impossible (INVALID_ARGUMENT)."""


class UnknownRequestError(KeyError):
    """The service holds no sequence for the request (NOT_FOUND)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class OutOfSyncError(RuntimeError):
    """The service's cache disagrees with the caller's log (FAILED_PRECONDITION)."""


STATUS_CODES: dict[type[BaseException], grpc.StatusCode] = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownRequestError: grpc.StatusCode.NOT_FOUND,
    OutOfSyncError: grpc.StatusCode.FAILED_PRECONDITION,
    KVScalesMismatchError: grpc.StatusCode.FAILED_PRECONDITION,
    OutOfPagesError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    for kind, code in STATUS_CODES.items():
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def refusal(exc: BaseException, where: object) -> tuple[grpc.StatusCode, str]:
    """The status code and message that refuse a call ``exc`` ended; an unexpected error
    (INTERNAL) is logged with its traceback, naming ``where`` it happened."""
    code = status_code_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.error("unexpected error in %s", where, exc_info=exc)
    return code, str(exc) or type(exc).__name__


# ---- the model executor ------------------------------------------------------------------


class ModelExecutor:
    """One worker thread that owns the runner: model work never runs on the event loop,
    and the (not thread-safe) runner sees one caller at a time."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    async def call(self, context: grpc.aio.ServicerContext, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the worker; a domain error aborts the RPC with its status code."""
        try:
            return await self.run(fn, *args)
        except Exception as exc:
            await context.abort(*refusal(exc, getattr(fn, "__name__", fn)))
            raise  # unreachable: abort raises

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def load_runner(config: ServiceConfig) -> ModelRunner:
    """Load the weights and run one prefill and one decode step (FP8 paths included).

    Runs on the executor thread, the one that does all model work, so the thread count set
    here is the one the forwards use.
    """
    threads = config.num_threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    dense_ops.set_num_threads(threads)
    runner = ModelRunner(config.runtime_config())
    log.info("%s", kv_capacity(runner))
    seq = "\x00warmup"
    runner.open(seq)
    try:
        runner.extend([SequenceChunk(seq, [0, 1, 2, 3])])
        runner.extend([SequenceChunk(seq, [4])])
    finally:
        runner.release(seq)
    return runner


def kv_capacity(runner: ModelRunner) -> str:
    """The KV pool in vLLM's terms: pages, tokens, bytes, and how many requests of
    ``max_model_len`` tokens fit at once."""
    config, num_pages = runner.config, runner.cache.num_pages
    tokens = num_pages * config.page_size
    mib = num_pages * config.page_bytes / (1 << 20)
    dtype = str(runner.kv_torch_dtype).removeprefix("torch.")
    caching = "on" if config.enable_prefix_caching else "off"
    return (
        f"KV cache: {num_pages} pages of {config.page_size} tokens = {tokens} tokens "
        f"({mib:.1f} MiB, {dtype}); maximum concurrency for {runner.max_model_len} tokens "
        f"per request: {tokens / runner.max_model_len:.2f}x; prefix caching {caching}"
    )


# ---- the RPCs both services share ------------------------------------------------------


class ServedModel(Protocol):
    """What a service serves: the drafter or the verifier, over one runner."""

    runner: ModelRunner

    def release(self, request_ids: list[str]) -> int: ...


class ModelServicer(ABC):
    """Release and GetInfo, model work on the executor. List it before the generated
    servicer base class, whose UNIMPLEMENTED methods it overrides; subclasses give
    ``_info``, the ModelInfo with their counters."""

    def __init__(self, model: ServedModel, executor: ModelExecutor) -> None:
        self.model = model
        self.executor = executor
        self._last_touched: dict[str, float] = {}  # request id -> monotonic time
        self._owners: dict[str, str] = {}  # request id -> the coordinator that opened it
        self._secret = os.environ.get(INTERNAL_TOKEN_ENV, "")

    def caller(self, context: grpc.aio.ServicerContext) -> str:
        """The calling coordinator's identity: the name its credential proves, else the
        name it claims ("" when it sends none)."""
        metadata = context.invocation_metadata() or ()
        proven = proven_name(metadata, self._secret)
        return proven if proven is not None else dict(metadata).get(OWNER_KEY, "")

    def claim(
        self, request_ids: Iterable[str], owner: str, failed: dict[str, Exception]
    ) -> list[str]:
        """Marks sequences as in use by ``owner`` (on the executor thread, from each RPC) and
        returns them; a sequence another coordinator holds goes to ``failed`` instead."""
        now, mine = time.monotonic(), []
        for rid in request_ids:
            holder = self._owners.get(rid)
            if holder not in (None, owner) and self.model.runner.has(rid):
                failed[rid] = UnknownRequestError(
                    f"request {rid}: this service holds it for another coordinator"
                )
                continue
            self._owners[rid] = owner
            self._last_touched[rid] = now
            mine.append(rid)
        return mine

    def start_reclaiming(self, idle_timeout: float) -> None:
        """Releases, every ``idle_timeout / 4`` seconds, the sequences nobody has touched
        for ``idle_timeout``: a caller that vanished cannot pin the KV pool. Runs as long
        as the event loop that serves."""
        loop = asyncio.get_running_loop()
        self._reclaiming = loop.create_task(self._reclaim_idle(idle_timeout))

    async def _reclaim_idle(self, idle_timeout: float) -> None:
        while True:
            await asyncio.sleep(idle_timeout / 4)
            released = await self.executor.run(self._release_idle, idle_timeout)
            if released:
                log.warning("released %d sequences idle for over %gs", released, idle_timeout)

    def _release_idle(self, idle_timeout: float) -> int:
        cutoff = time.monotonic() - idle_timeout
        idle = [rid for rid, t in self._last_touched.items() if t < cutoff]
        for rid in idle:
            del self._last_touched[rid]
            self._owners.pop(rid, None)
        return self.model.release(idle)

    async def Release(
        self, request: common_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ReleaseResponse:
        return await self.executor.call(context, self._release, request, self.caller(context))

    async def GetInfo(
        self, request: common_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ModelInfo:
        return await self.executor.call(context, self._info)

    # Run on the executor thread: the model and its runner have one caller at a time.

    def _release(
        self, request: common_pb2.ReleaseRequest, owner: str
    ) -> common_pb2.ReleaseResponse:
        """Releases the caller's sequences; ids another coordinator holds are ignored."""
        mine = [rid for rid in request.request_ids if self._owners.get(rid, owner) == owner]
        if request.all_of_caller:
            mine = list(dict.fromkeys(mine + [r for r, o in self._owners.items() if o == owner]))
        for rid in mine:
            self._last_touched.pop(rid, None)
            self._owners.pop(rid, None)
        num_released = self.model.release(mine)
        return common_pb2.ReleaseResponse(
            num_released=num_released, num_free_pages=self.model.runner.num_free_pages
        )

    async def stream_replies(
        self,
        requests: AsyncIterator[Any],
        context: grpc.aio.ServicerContext,
        answer: Callable[[Any, str], Awaitable[Any]],
        reply_type: type,
    ) -> AsyncIterator[Any]:
        """The replies of a per-step stream (``StepStream``, ``VerifyStream``): for each
        request in order, ``reply_type(response=await answer(request, caller))``, or
        ``reply_type(error=...)`` with the status a unary call would have ended with; one
        refused step leaves the stream open for the next."""
        owner = self.caller(context)
        async for request in requests:
            try:
                response = await answer(request, owner)
            except Exception as exc:
                code, message = refusal(exc, type(request).__name__)
                yield reply_type(error=common_pb2.StepError(code=code.name, message=message))
            else:
                yield reply_type(response=response)

    @abstractmethod
    def _info(self) -> common_pb2.ModelInfo:
        """ModelInfo with the model's counters."""


# ---- server building and running ---------------------------------------------------------


@dataclass(frozen=True)
class ModelService:
    """One model service: its name ("draft", "target"), its proto service's full name,
    its servicer (made over its model, made over the loaded runner) and the generated
    ``add_*_to_server``.

    The name names the executor thread, the banner ``<name> service listening on
    HOST:PORT`` the launcher waits for, the traces (``specdec-<name>``) and the program
    (``python -m <name>_service``).
    """

    name: str
    service_name: str
    servicer: Callable[[Any, ModelExecutor], ModelServicer]
    model: Callable[[ModelRunner], ServedModel]
    add_to_server: Callable[[Any, grpc.aio.Server], None]

    async def create_server(
        self,
        config: ServiceConfig,
        runner: ModelRunner | None = None,
        executor: ModelExecutor | None = None,
    ) -> tuple[grpc.aio.Server, int]:
        """An unstarted server bound to ``config.host:config.port``, with the app
        servicer, health SERVING and reflection.

        Loads and warms up the model on the executor first, unless ``runner`` is given:
        health reports SERVING from the start.
        """
        executor = executor or ModelExecutor(f"{self.name}-model")
        if runner is None:
            runner = await executor.run(load_runner, config)
        token = os.environ.get(INTERNAL_TOKEN_ENV, "")
        interceptors = (
            [BearerTokenServerInterceptor(token, INTERNAL_CALLER, credentials_of=token)]
            if token
            else []
        )
        options = message_limits(runner.vocab_size)
        server = grpc.aio.server(options=options, interceptors=interceptors)
        servicer = self.servicer(self.model(runner), executor)
        self.add_to_server(servicer, server)
        servicer.start_reclaiming(config.sequence_idle_timeout)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        names = (self.service_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection((*names, reflection.SERVICE_NAME), server)
        tls = TLSFiles(config.tls_cert, config.tls_key, config.tls_ca)
        address = f"{config.host}:{config.port}"
        if tls.serves_tls:
            credentials = tls.server_credentials(require_client_cert=bool(tls.ca))
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"could not bind {config.host}:{config.port}")
        for name in ("", self.service_name):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return server, port

    async def serve(self, config: ServiceConfig) -> None:
        executor = ModelExecutor(f"{self.name}-model")
        server, port = await self.create_server(config, executor=executor)
        banner = f"{self.name} service listening on {config.host}:{port}"
        configure_tracing(f"specdec-{self.name}")
        await run_until_signal(server, banner, config.grace_s)
        shutdown_tracing()
        executor.shutdown()

    def main(self, argv: Sequence[str] | None = None) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        hand_over_the_gil_quickly()
        asyncio.run(self.serve(ServiceConfig.from_args(f"python -m {self.name}_service", argv)))


# Every step a service's gRPC loop thread and its model thread (and, in the coordinator,
# which sets the same, its loop and its clients' streams) hand the GIL to each other; at Python's
# default 5 ms switch interval a thread asking for it can wait that long behind one
# running bytecode. 0.5 ms took batch-1 target-only generation through the stack from
# 140-151 to 163-177 tokens/s on the tiny pair here.
GIL_SWITCH_INTERVAL_S = 0.0005


def hand_over_the_gil_quickly() -> None:
    """Set this process's GIL switch interval to GIL_SWITCH_INTERVAL_S (a service's main)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


async def run_until_signal(server: grpc.aio.Server, banner: str, grace_s: float) -> None:
    """Start, print ``banner`` (the launcher waits for it), and drain on SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(banner, flush=True)
    await stop.wait()
    log.info("draining for up to %.1f s", grace_s)
    await server.stop(grace_s)


# ---- messages shared by both services ----------------------------------------------------


def kv_table_to_proto(table: KVScaleTable) -> common_pb2.KVScaleTable:
    return common_pb2.KVScaleTable(
        version=table.version, dtype=table.dtype, k_scale=table.k_scale, v_scale=table.v_scale
    )


def kv_table_from_proto(msg: common_pb2.KVScaleTable) -> KVScaleTable:
    try:
        return KVScaleTable(msg.version, msg.dtype, tuple(msg.k_scale), tuple(msg.v_scale))
    except ValueError as e:
        raise InvalidRequestError(f"bad kv_scales table: {e}") from None


def model_info(runner: ModelRunner, **counters: float) -> common_pb2.ModelInfo:
    return common_pb2.ModelInfo(
        model=runner.model_name,
        vocab_size=runner.vocab_size,
        max_model_len=runner.max_model_len,
        kv_cache_dtype=runner.kv_cache_dtype,
        num_free_pages=runner.num_free_pages,
        num_total_pages=runner.cache.num_pages,
        page_size=runner.config.page_size,
        eos_token_ids=runner.eos_token_ids,
        kv_scales=kv_table_to_proto(runner.kv_scales),
        num_layers=runner.num_layers,
        forward_seconds=runner.forward_seconds,
        prefix_cache_queries=runner.prefix_cache_queries,
        prefix_cache_hits=runner.prefix_cache_hits,
        num_computed_tokens=runner.num_computed_tokens,
        prefix_caching=runner.config.enable_prefix_caching,
        **counters,
    )
