"""The coordinator as a worker of the SGLang Model Gateway (``smg``).

The gateway speaks ``vllm.grpc.engine.VllmEngine`` (from the ``smg-grpc-proto`` package)
to vLLM workers; the coordinator serves it on its own port, beside
``specdec.v1.Coordinator``, so the gateway's OpenAI API, routing and metrics work over
specdec unchanged. n > 1 streams each choice with its index; logprobs, prompt logprobs,
the penalties, min_p, min_tokens, logit_bias and the constraints map onto specdec's
sampling parameters. What the protocol can ask and specdec cannot honour (structural tags,
multimodal input, KV transfer, prompt truncation) is refused with INVALID_ARGUMENT naming
the field, never ignored; RPCs not implemented here answer UNIMPLEMENTED. Acceptance
statistics ride on every GenerateComplete (``spec_accepted_tokens`` / ``spec_draft_tokens``).
"""

from __future__ import annotations

import hashlib
import io
import json
import time
import uuid
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

from specdec.coordinator.api.admission import (
    checked_request,
    compile_constraint,
    sampling_params,
)
from specdec.coordinator.api.output_stream import caller_scope, status_code
from specdec.coordinator.api.prompts import PromptEncoder
from specdec.coordinator.api.samples import run_samples, sample_requests
from specdec.coordinator.api.vllm_outputs import (
    InIndexOrder,
    SampleOutput,
    StopStrings,
    input_logprobs,
    output_logprobs,
)
from specdec.coordinator.engine.core import Engine
from specdec.coordinator.engine.errors import InvalidRequest, SpecDecError
from specdec.coordinator.engine.request import Request
from specdec.runtime.sampling_limits import MAX_LOGPROBS
from specdec.v1 import common_pb2 as common

SERVICE_NAME = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"].full_name
API_SCOPE = "vllm"  # this API's request ids, apart from specdec.v1.Coordinator's
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
)
_CHUNK_BYTES = 64 * 1024  # GetTokenizer's chunks, as the gateway's client reads them


@dataclass(frozen=True)
class ServedModel:
    """What GetModelInfo says about the target."""

    name: str  # the model name clients send (--served-model-name)
    tokenizer_dir: str  # the folder GetTokenizer zips; "" when the coordinator has none
    model_type: str = ""
    architectures: tuple[str, ...] = ()
    bos_token_id: int = 0
    pad_token_id: int = 0

    @classmethod
    def from_folder(cls, name: str, tokenizer_dir: str) -> ServedModel:
        """Reads the HF ``config.json`` beside the tokenizer, when there is one."""
        path = Path(tokenizer_dir) / "config.json"
        config = json.loads(path.read_text()) if tokenizer_dir and path.is_file() else {}
        return cls(
            name=name,
            tokenizer_dir=str(Path(tokenizer_dir).resolve()) if tokenizer_dir else "",
            model_type=config.get("model_type", ""),
            architectures=tuple(config.get("architectures", ())),
            bos_token_id=config.get("bos_token_id") or 0,
            pad_token_id=config.get("pad_token_id") or 0,
        )


def unsupported_fields(message: vllm_engine_pb2.GenerateRequest) -> list[str]:
    """The fields of a Generate request that ask for something specdec does not do."""
    p = message.sampling_params
    asked = {
        "sampling_params.truncate_prompt_tokens": p.HasField("truncate_prompt_tokens"),
        "sampling_params.structural_tag": p.WhichOneof("constraint") == "structural_tag",
        "mm_inputs": message.HasField("mm_inputs") or bool(message.extra_mm_inputs),
        "media_refs": message.HasField("media_refs"),
        "kv_transfer_params": message.HasField("kv_transfer_params")
        or message.HasField("kv_transfer_params_json"),
        "data_parallel_rank": message.HasField("data_parallel_rank")
        and message.data_parallel_rank != 0,
    }
    return [name for name, is_asked in asked.items() if is_asked]


async def request_from_proto(
    message: vllm_engine_pb2.GenerateRequest,
    engine: Engine,
    encoder: PromptEncoder | None,
    scope: str = "",
) -> Request:
    """A `Request`, or InvalidRequest naming what is wrong or not supported."""
    refused = unsupported_fields(message)
    if refused:
        raise InvalidRequest(
            f"specdec does not support {', '.join(refused)}; leave "
            f"{'it' if len(refused) == 1 else 'them'} unset"
        )
    kind = message.WhichOneof("input")
    if kind == "tokenized":
        prompt_ids = list(message.tokenized.input_ids)
    elif kind == "text" and encoder is not None:
        prompt_ids = await encoder.encode(message.text)
    elif kind == "text":
        raise InvalidRequest("a text prompt needs the coordinator's --tokenizer; send token ids")
    else:
        raise InvalidRequest("no prompt: set tokenized or text")
    p = message.sampling_params
    structured = _structured_output(p)
    if structured is not None:
        await compile_constraint(structured)
    return checked_request(
        message.request_id or uuid.uuid4().hex,
        prompt_ids,
        engine.limits,
        scope=scope,
        sampling=sampling_params(
            p,
            temperature=p.temperature if p.HasField("temperature") else 1.0,  # vLLM's default
            logprobs=_logprobs(p, "logprobs"),
            prompt_logprobs=_logprobs(p, "prompt_logprobs"),
            structured_output=structured,
        ),
        max_tokens=p.max_tokens if p.HasField("max_tokens") else None,
        stop_token_ids=p.stop_token_ids,
        ignore_eos=p.ignore_eos,
    )


def _logprobs(p: vllm_engine_pb2.SamplingParams, name: str) -> int | None:
    if not p.HasField(name):
        return None
    if getattr(p, name) < 0:
        raise InvalidRequest(
            f"sampling_params.{name} {getattr(p, name)} (every token's) is not supported; "
            f"ask for at most {MAX_LOGPROBS}"
        )
    return getattr(p, name)


def _structured_output(p: vllm_engine_pb2.SamplingParams) -> common.StructuredOutput | None:
    """The worker protocol's constraint as specdec's (structural_tag is refused before)."""
    kind = p.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "choice":
        return common.StructuredOutput(choice=common.ChoiceList(choices=p.choice.choices))
    return common.StructuredOutput(**{kind: getattr(p, kind)})


def tokenizer_archive(folder: str) -> bytes:
    """The tokenizer files of ``folder`` as a zip, what GetTokenizer streams."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in TOKENIZER_FILES:
            path = Path(folder) / name
            if path.is_file():
                archive.write(path, name)
    return buffer.getvalue()


class VllmEngineServicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    def __init__(
        self,
        engine: Engine,
        encoder: PromptEncoder | None,
        model: ServedModel,
        target_info,  # async () -> specdec.v1.ModelInfo of the target, for its KV pages
    ) -> None:
        self.engine = engine
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer if encoder else None
        self.model = model
        self.target_info = target_info
        self.started = time.time()
        self._archive: tuple[bytes, str] | None = None

    async def Generate(
        self, request: vllm_engine_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[vllm_engine_pb2.GenerateResponse]:
        try:
            scope = caller_scope(API_SCOPE, context)
            req = await request_from_proto(request, self.engine, self.encoder, scope)
            samples = sample_requests(req, request.sampling_params.n)
            stop_strings = list(request.sampling_params.stop)
            min_tokens = req.sampling.min_tokens
            stops = [StopStrings(stop_strings, self.tokenizer, min_tokens) for _ in samples]
        except SpecDecError as e:
            await context.abort(status_code(e), str(e))
        outputs: list[SampleOutput] = [SampleOutput() for _ in samples]
        in_order = InIndexOrder()
        ended: set[int] = set()
        async for index, out in run_samples(self.engine, samples, context, ended):
            sample, output, stop = samples[index], outputs[index], stops[index]
            keep = stop.update(out.token_ids)
            logprobs = None if out.logprobs is None else out.logprobs[:keep]
            delta = SampleOutput(out.token_ids[:keep], logprobs)
            output.extend(delta)
            if out.prompt_logprobs is not None:
                output.prompt_logprobs = out.prompt_logprobs
            finish = "stop" if stop.matched is not None else out.finish_reason
            if request.stream:
                yield vllm_engine_pb2.GenerateResponse(
                    chunk=vllm_engine_pb2.GenerateStreamChunk(
                        token_ids=delta.token_ids,
                        prompt_tokens=sample.num_prompt_tokens,
                        completion_tokens=len(output.token_ids),
                        cached_tokens=sample.stats.num_cached_tokens,
                        output_logprobs=output_logprobs(delta.token_ids, delta.logprobs),
                        input_logprobs=input_logprobs(sample.prompt_ids, out.prompt_logprobs),
                        index=index,
                    )
                )
            if finish is not None:
                # Streamed, the last chunk's tokens come again here, as vLLM's servicer
                # sends them; the gateway keeps the streamed ones.
                # Streamed, the prompt's logprobs went with the first chunk.
                last = SampleOutput(delta.token_ids, delta.logprobs) if request.stream else output
                complete = self._complete(sample, index, last, finish, stop)
                for message in [complete] if request.stream else in_order.release(index, complete):
                    yield message
                ended.add(index)  # a stop string: that frees its KV
                if len(ended) == len(samples):
                    break

    def _complete(
        self, req: Request, index: int, output: SampleOutput, finish: str, stops: StopStrings
    ) -> vllm_engine_pb2.GenerateResponse:
        output_ids = output.token_ids
        complete = vllm_engine_pb2.GenerateComplete(
            output_ids=output_ids,
            finish_reason=finish,
            prompt_tokens=req.num_prompt_tokens,
            completion_tokens=len(output_ids),
            cached_tokens=req.stats.num_cached_tokens,
            spec_accepted_tokens=req.stats.num_accepted_tokens,
            spec_draft_tokens=req.stats.num_draft_tokens,
            output_logprobs=output_logprobs(output_ids, output.logprobs),
            input_logprobs=input_logprobs(req.prompt_ids, output.prompt_logprobs),
            index=index,
        )
        if stops.matched is not None:
            complete.matched_stop_str = stops.matched
        elif output_ids and output_ids[-1] in req.stop_token_ids:
            complete.matched_token_id = output_ids[-1]
        return vllm_engine_pb2.GenerateResponse(complete=complete)

    async def Abort(
        self, request: vllm_engine_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.AbortResponse:
        scope = caller_scope(API_SCOPE, context)
        for request_id in request.request_ids:
            self.engine.abort(f"{scope}/{request_id}", "VllmEngine.Abort", with_samples=True)
        return vllm_engine_pb2.AbortResponse()

    async def HealthCheck(
        self, request: vllm_engine_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.HealthCheckResponse:
        if self.engine.draining:
            return vllm_engine_pb2.HealthCheckResponse(healthy=False, message="draining")
        if not self.engine.target_available:
            return vllm_engine_pb2.HealthCheckResponse(
                healthy=False, message="the target service is not answering"
            )
        return vllm_engine_pb2.HealthCheckResponse(healthy=True, message="serving")

    async def GetModelInfo(
        self, request: vllm_engine_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetModelInfoResponse:
        limits = self.engine.limits
        return vllm_engine_pb2.GetModelInfoResponse(
            # The gateway reads the tokenizer from here when it shares this machine's
            # files, else it asks GetTokenizer.
            model_path=self.model.tokenizer_dir,
            tokenizer_path=self.model.tokenizer_dir,
            is_generation=True,
            max_context_length=limits.max_model_len,
            vocab_size=limits.vocab_size,
            served_model_name=self.model.name,
            model_type=self.model.model_type,
            architectures=self.model.architectures,
            eos_token_ids=sorted(limits.eos_token_ids),
            pad_token_id=self.model.pad_token_id,
            bos_token_id=self.model.bos_token_id,
            max_req_input_len=limits.max_model_len - 1,
        )

    async def GetServerInfo(
        self, request: vllm_engine_pb2.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetServerInfoResponse:
        return vllm_engine_pb2.GetServerInfoResponse(
            active_requests=self.engine.num_unfinished,
            is_paused=self.engine.draining,
            uptime_seconds=time.time() - self.started,
            server_type="specdec-grpc",
            data_parallel_size=1,
            max_num_seqs=self.engine.config.max_num_seqs,
        )

    async def GetLoads(
        self, request: vllm_engine_pb2.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetLoadsResponse:
        scheduler = self.engine.scheduler
        load = vllm_engine_pb2.SchedulerLoad(
            num_running_reqs=len(scheduler.running),
            num_waiting_reqs=len(scheduler.waiting),
            num_total_reqs=len(scheduler.running) + len(scheduler.waiting),
            max_running_requests=scheduler.max_num_seqs,
        )
        try:
            info = await self.target_info()
        except grpc.aio.AioRpcError:
            info = None  # the target is away: the counts above still hold
        if info is not None and info.num_total_pages:
            total = info.num_total_pages * info.page_size
            used = (info.num_total_pages - info.num_free_pages) * info.page_size
            load.max_total_num_tokens = total
            load.num_used_tokens = used
            load.token_usage = used / total
        return vllm_engine_pb2.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            version="specdec",
            dp_rank_count=1,
            loads=[load],
        )

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        if not self.model.tokenizer_dir:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this coordinator has no tokenizer: start it with --tokenizer FOLDER",
            )
        if self._archive is None:
            data = tokenizer_archive(self.model.tokenizer_dir)
            self._archive = data, hashlib.sha256(data).hexdigest()
        data, digest = self._archive
        for start in range(0, len(data), _CHUNK_BYTES):
            end = min(start + _CHUNK_BYTES, len(data))
            yield common_pb2.GetTokenizerChunk(
                data=data[start:end], sha256=digest if end == len(data) else ""
            )


def add_to_server(servicer: VllmEngineServicer, server: grpc.aio.Server) -> str:
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)
    return SERVICE_NAME
