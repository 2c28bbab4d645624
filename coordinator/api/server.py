"""The public gRPC API: Generate (streaming) and GetStats, with health and reflection.

Servicers are thin: proto -> `Request` -> engine -> `RequestOutput` -> proto. Domain errors
become status codes in `streaming.status_code()`, the one place that maps them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specdec.auth import (
    API_KEY_ENV,
    INTERNAL_TOKEN_ENV,
    OWNER_KEY,
    BearerTokenServerInterceptor,
    CallMetadataInterceptor,
    bearer,
    split_keys,
)
from specdec.auth.tls import TLSFiles
from specdec.coordinator.api.admission import (
    checked_request,
    compile_constraint,
    sampling_params,
)
from specdec.coordinator.api.chat import ChatTemplate
from specdec.coordinator.api.detokenizer import IncrementalDetokenizer, load_tokenizer
from specdec.coordinator.api.output_stream import caller_scope, status_code
from specdec.coordinator.api.prompts import PromptEncoder
from specdec.coordinator.api.samples import run_samples, sample_requests
from specdec.coordinator.api.undecodable import UndecodableRequestInterceptor
from specdec.coordinator.api.vllm_worker import SERVICE_NAME as VLLM_SERVICE_NAME
from specdec.coordinator.api.vllm_worker import ServedModel, VllmEngineServicer, add_to_server
from specdec.coordinator.engine.config import CoordinatorConfig
from specdec.coordinator.engine.core import Engine, ModelLimits
from specdec.coordinator.engine.errors import InvalidRequest, SpecDecError
from specdec.coordinator.engine.kv_pool import KVPool
from specdec.coordinator.engine.metrics import Metrics, create_metrics, serve_metrics
from specdec.coordinator.engine.request import Request
from specdec.coordinator.engine.stats import SpecStats
from specdec.coordinator.engine.step_streams import StreamedStub
from specdec.flags import from_args, parser_for
from specdec.telemetry.tracing import configure_tracing, shutdown_tracing
from specdec.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    draft_pb2_grpc,
    target_pb2_grpc,
)

logger = logging.getLogger(__name__)

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name
# Sampled draft probs are K * vocab float32 per request; gRPC's 4 MiB default is too small.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 512 * 1024 * 1024),
    ("grpc.max_receive_message_length", 512 * 1024 * 1024),
]


def stats_pb(stats: SpecStats) -> coordinator_pb2.SpecDecodeStats:
    """The proto's fields are ``SpecStats``'s, name for name."""
    return coordinator_pb2.SpecDecodeStats(**dataclasses.asdict(stats))


async def prompt_ids_of(
    message: coordinator_pb2.GenerateRequest, encoder: PromptEncoder | None
) -> list[int]:
    kind = message.WhichOneof("prompt")
    if kind is None:
        raise InvalidRequest("no prompt: set text, token_ids or messages")
    if kind == "token_ids":
        return list(message.token_ids.ids)
    if encoder is None:
        raise InvalidRequest(
            f"a {kind} prompt needs a tokenizer: start the coordinator with --tokenizer, "
            "or send token_ids"
        )
    if kind == "text":
        return await encoder.encode(message.text)
    chat = [{"role": m.role, "content": m.content} for m in message.messages.messages]
    return await encoder.encode_chat(chat)


async def build_request(
    message: coordinator_pb2.GenerateRequest,
    encoder: PromptEncoder | None,
    limits: ModelLimits,
    scope: str = "",
) -> Request:
    """Validates a GenerateRequest and turns it into a `Request`; raises InvalidRequest.
    ``scope`` keeps the client's request id apart from other callers' (`caller_scope`)."""
    s = message.sampling
    has_cap = message.HasField("num_speculative_tokens")
    await compile_constraint(s.structured_output)
    return checked_request(
        message.request_id or uuid.uuid4().hex,
        await prompt_ids_of(message, encoder),
        limits,
        scope=scope,
        sampling=sampling_params(
            s,
            temperature=s.temperature,
            logprobs=s.logprobs if s.HasField("logprobs") else None,
            prompt_logprobs=s.prompt_logprobs if s.HasField("prompt_logprobs") else None,
            structured_output=s.structured_output,
        ),
        max_tokens=message.max_tokens,
        stop_token_ids=message.stop_token_ids,
        ignore_eos=message.ignore_eos,
        k_cap=message.num_speculative_tokens if has_cap else None,
    )


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, engine: Engine, encoder: PromptEncoder | None) -> None:
        self.engine = engine
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer if encoder else None

    async def Generate(
        self, request: coordinator_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[coordinator_pb2.GenerateResponse]:
        try:
            scope = caller_scope("coordinator", context)
            req = await build_request(request, self.encoder, self.engine.limits, scope)
            samples = sample_requests(req, request.n)
        except SpecDecError as e:
            await context.abort(status_code(e), str(e))
        detokenizers = [
            IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None for _ in samples
        ]
        async for index, out in run_samples(self.engine, samples, context):
            text = ""
            if detokenizers[index] is not None:
                # A stop token ends the text but stays in token_ids.
                ids = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
                text = detokenizers[index].update(ids, final=out.finished)
            response = coordinator_pb2.GenerateResponse(
                request_id=req.client_request_id,
                token_ids=out.token_ids,
                text=text,
                num_prompt_tokens=req.num_prompt_tokens,
                logprobs=out.logprobs or (),
                index=index,
                prompt_logprobs=out.prompt_logprobs or (),
            )
            if out.finished:
                response.finish_reason = out.finish_reason or ""
                response.stats.CopyFrom(stats_pb(samples[index].stats))
            yield response

    async def GetStats(
        self, request: coordinator_pb2.StatsRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.SpecDecodeStats:
        return stats_pb(self.engine.totals)


class CoordinatorServer:
    """The gRPC server plus what lives beside it (engine, channels); stop() ends them all."""

    def __init__(
        self,
        server: grpc.aio.Server,
        engine: Engine,
        health_servicer: health.aio.HealthServicer,
        channels: list[grpc.aio.Channel],
    ) -> None:
        """``channels[0]`` is the target's (the engine watches its gRPC health)."""
        self.server = server
        self.engine = engine
        self.health = health_servicer
        self.channels = channels
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        await self.server.start()
        self.engine.start()
        await self._set_health(True)
        self._watch = asyncio.get_running_loop().create_task(
            self.engine.watch_target(
                health_pb2_grpc.HealthStub(self.channels[0]), self._on_target_change
            )
        )

    async def _set_health(self, serving: bool) -> None:
        states = health_pb2.HealthCheckResponse
        status = states.SERVING if serving else states.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _on_target_change(self, available: bool) -> None:
        # NOT_SERVING while the target is away, so a balancer sends requests elsewhere.
        if not self.engine.draining:
            await self._set_health(available)

    async def stop(self, grace: float | None = None) -> None:
        """Drains: new requests get UNAVAILABLE, running ones get `grace` seconds."""
        self.engine.draining = True
        if self._watch is not None:
            self._watch.cancel()
        await self._set_health(False)
        deadline = time.monotonic() + (grace or 0)
        while self.engine.num_unfinished and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.engine.stop()
        await self.server.stop(grace)
        for channel in self.channels:
            await channel.close()

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


def _kv_table(override: dict | None, reported: common_pb2.KVScaleTable, service: str, info):
    if override is None:
        return reported
    table = json_format.ParseDict(override, common_pb2.KVScaleTable())
    if info.num_layers and len(table.k_scale) not in (0, info.num_layers):
        raise ValueError(
            f"kv-scales file: {service} table has {len(table.k_scale)} k_scales, the {service} "
            f"has {info.num_layers} layers"
        )
    if len(table.k_scale) != len(table.v_scale):
        raise ValueError(f"kv-scales file: {service} table has unequal k_scale/v_scale lengths")
    return table


def model_limits(
    config: CoordinatorConfig,
    draft_info: common_pb2.ModelInfo | None,
    target_info: common_pb2.ModelInfo,
) -> ModelLimits:
    """Pins what the services reported; a draft/target vocab mismatch is a startup error.

    `draft_info` None: target-only serving.
    """
    draft_info = draft_info or common_pb2.ModelInfo(vocab_size=target_info.vocab_size)
    if draft_info.vocab_size != target_info.vocab_size:
        raise RuntimeError(
            f"draft vocab size {draft_info.vocab_size} != target vocab size "
            f"{target_info.vocab_size}: the draft must share the target's tokenizer"
        )
    if draft_info.reads_target_features and draft_info.hidden_size != target_info.hidden_size:
        raise RuntimeError(
            f"the draft reads the target's features of size {draft_info.hidden_size}, but the "
            f"target's hidden size is {target_info.hidden_size}: it was trained for another target"
        )
    max_model_len = target_info.max_model_len
    if draft_info.max_model_len:
        max_model_len = min(max_model_len, draft_info.max_model_len)
    override = config.kv_scales_override
    return ModelLimits(
        vocab_size=target_info.vocab_size,
        max_model_len=max_model_len,
        eos_token_ids=frozenset(target_info.eos_token_ids or draft_info.eos_token_ids),
        draft_kv_scales=_kv_table(override.get("draft"), draft_info.kv_scales, "draft", draft_info),
        target_kv_scales=_kv_table(
            override.get("target"), target_info.kv_scales, "target", target_info
        ),
        target_kv=kv_pool("target", target_info, max_model_len),
        draft_kv=kv_pool("draft", draft_info, max_model_len),
        feature_row_bytes=2 * draft_info.hidden_size if draft_info.reads_target_features else 0,
    )


def kv_pool(name: str, info: common_pb2.ModelInfo, max_model_len: int) -> KVPool | None:
    """The service's KV pool as it reported it (None where it reported none); warns when
    one sequence of max_model_len tokens would not fit it."""
    if not info.num_total_pages:
        return None
    pool = KVPool(name, info.page_size, info.num_total_pages, info.num_free_pages)
    if pool.num_tokens < max_model_len:
        logger.warning(
            "the %s's KV cache holds %d tokens, fewer than max_model_len=%d: a request whose "
            "prompt + max_tokens exceed it is refused (RESOURCE_EXHAUSTED); give the %s more "
            "--kv-cache-memory or lower --max-model-len",
            name, pool.num_tokens, max_model_len, name,
        )  # fmt: skip
    return pool


def add_vllm_worker(server, engine, encoder, config, target, target_info) -> str:
    """Serves ``vllm.grpc.engine.VllmEngine`` (what the SGLang Model Gateway speaks to its
    workers) on ``server``; returns its service name."""
    name = config.served_model_name or os.path.basename(target_info.model.rstrip("/"))
    model = ServedModel.from_folder(name, config.tokenizer)

    async def target_pages() -> common_pb2.ModelInfo:
        return await target.GetInfo(common_pb2.InfoRequest(), timeout=1.0)

    return add_to_server(VllmEngineServicer(engine, encoder, model, target_pages), server)


async def _none() -> None:
    return None


def public_message_limits(limits: ModelLimits) -> list[tuple[str, int]]:
    """The public API's message size limits, from the model: a request is at most a prompt
    of max_model_len tokens (as ids or text, budgeted at 64 bytes a token) or its chat
    messages, a response one step's tokens and text. Larger is RESOURCE_EXHAUSTED."""
    size = 1024 * 1024 + 64 * limits.max_model_len
    return [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)]


async def release_all_of_caller(stub) -> None:
    reply = await stub.Release(common_pb2.ReleaseRequest(all_of_caller=True), timeout=10.0)
    if reply.num_released:
        logger.info("released %d sequences held before this start", reply.num_released)


async def _get_info(stub, name: str, address: str, timeout: float) -> common_pb2.ModelInfo:
    try:
        return await stub.GetInfo(common_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True)
    except grpc.aio.AioRpcError as e:
        raise RuntimeError(
            f"cannot reach the {name} service at {address} within {timeout:g}s "
            f"({e.code().name}: {e.details()}); is it running?"
        ) from None


async def create_server(
    config: CoordinatorConfig, metrics: Metrics | None = None
) -> tuple[CoordinatorServer, int]:
    """Connects to both services, pins their ModelInfo, and starts serving on config.port
    (0 = any free port). Returns the started server and the bound port."""
    # Every hop names this coordinator (the services keep each sequence for the one that
    # opened it) and, under `specdec up`, carries the stack's internal token.
    token = os.environ.get(INTERNAL_TOKEN_ENV, "")
    owner = config.coordinator_id or uuid.uuid4().hex
    identity = ((OWNER_KEY, owner),) + ((bearer(token),) if token else ())
    internal = [CallMetadataInterceptor(identity)]

    tls = TLSFiles(config.tls_cert, config.tls_key, config.tls_ca)

    def channel(address: str) -> grpc.aio.Channel:
        if tls.ca:
            return grpc.aio.secure_channel(
                address, tls.channel_credentials(), options=CHANNEL_OPTIONS, interceptors=internal
            )
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=internal)

    channels = [channel(config.target)]
    target = target_pb2_grpc.TargetServiceStub(channels[0])
    draft = None
    if config.draft:  # else target-only serving
        channels.append(channel(config.draft))
        draft = draft_pb2_grpc.DraftServiceStub(channels[1])
    try:
        target_info, draft_info = await asyncio.gather(
            _get_info(target, "target", config.target, config.connect_timeout),
            _get_info(draft, "draft", config.draft, config.connect_timeout) if draft else _none(),
        )
        limits = model_limits(config, draft_info, target_info)
        if config.coordinator_id:  # a restart under the same name: free what it held before
            await asyncio.gather(*(release_all_of_caller(stub) for stub in (target, draft) if stub))
        encoder = None
        if config.tokenizer:
            encoder = PromptEncoder(
                load_tokenizer(config.tokenizer),
                ChatTemplate.from_pretrained(config.tokenizer),
                limits.max_model_len,
            )
    except BaseException:
        for channel in channels:
            await channel.close()
        raise
    logger.info(
        "connected: target %s (%s), draft %s (%s); vocab %d, max_model_len %d",
        config.target,
        target_info.model,
        config.draft or "none",
        draft_info.model if draft_info else "target-only",
        limits.vocab_size,
        limits.max_model_len,
    )
    metrics = metrics or create_metrics()
    if config.metrics_port:
        serve_metrics(metrics, config.metrics_port, host=config.host)
    # The per-step calls run over one stream each; the rest stay unary.
    engine = Engine(
        config,
        draft and StreamedStub(draft, "Step", "StepStream", identity),
        StreamedStub(target, "Verify", "VerifyStream", identity),
        limits,
        metrics,
    )

    api_keys = split_keys(config.api_key or os.environ.get(API_KEY_ENV, ""))
    who = f"this coordinator needs one of its API keys (--api-key / {API_KEY_ENV})"
    interceptors = [UndecodableRequestInterceptor()]
    if api_keys:
        keyless = (f"/{VLLM_SERVICE_NAME}/",) if config.worker_api_without_key else ()
        interceptors.insert(0, BearerTokenServerInterceptor(api_keys, who, keyless))
    server = grpc.aio.server(interceptors=interceptors, options=public_message_limits(limits))
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(
        CoordinatorServicer(engine, encoder), server
    )
    services = [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME]
    services.append(add_vllm_worker(server, engine, encoder, config, target, target_info))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(services, server)
    address = f"{config.host}:{config.port}"
    if tls.serves_tls:
        port = server.add_secure_port(address, tls.server_credentials(require_client_cert=False))
    else:
        port = server.add_insecure_port(address)
    wrapper = CoordinatorServer(server, engine, health_servicer, channels)
    await wrapper.start()
    return wrapper, port


async def serve(config: CoordinatorConfig) -> None:
    configure_tracing("specdec-coordinator")
    server, port = await create_server(config)
    print(f"coordinator listening on {config.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("draining")
    await server.stop(grace=5.0)
    shutdown_tracing()


def main(argv: list[str] | None = None) -> None:
    parser = parser_for(
        CoordinatorConfig, "python -m specdec.coordinator", "specdec coordinator (the public API)"
    )
    parser.add_argument("--log-level", default="INFO", help="logging level")
    args = parser.parse_args(argv)
    # model_service.executor.GIL_SWITCH_INTERVAL_S says why; not imported: it brings torch.
    sys.setswitchinterval(0.0005)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = from_args(CoordinatorConfig, args)
    except ValueError as e:
        parser.error(str(e))
    try:
        asyncio.run(serve(config))
    except RuntimeError as e:  # startup errors: unreachable service, vocab mismatch
        logger.error("%s", e)
        raise SystemExit(1) from None
