"""TargetService RPCs: proto -> domain -> proto, model work on the executor."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import torch

from specdec.kernels.sampling import SparseProbs, TokenLogprobs
from specdec.model_service.executor import at_most_threads
from specdec.model_service.proto import features_to_bytes, model_info
from specdec.model_service.servicer import ModelServicer
from specdec.model_service.status import status_code_for
from specdec.runtime.errors import InvalidRequestError
from specdec.runtime.sampling import Sampling
from specdec.target_service.steps import PrefillChunk, VerifyEntry, VerifyResult
from specdec.target_service.verifier import Verifier
from specdec.telemetry.tracing import rpc_span
from specdec.v1 import common_pb2, target_pb2, target_pb2_grpc


def prefill_from_proto(msg: target_pb2.PrefillChunk) -> PrefillChunk:
    sampling = Sampling.from_proto(msg.sampling, msg.request_id)
    return PrefillChunk(
        msg.request_id,
        msg.start_position,
        tuple(msg.token_ids),
        msg.is_last,
        sampling,
        msg.resumes,
    )


def entry_from_proto(msg: target_pb2.VerifyEntry) -> VerifyEntry:
    return VerifyEntry(
        msg.request_id,
        msg.start_position,
        msg.last_token_id,
        tuple(msg.proposal_ids),
        tuple(probs_from_proto(q) for q in msg.draft_probs) or None,
        Sampling.from_proto(msg.sampling, msg.request_id),
        msg.max_new_tokens,
        frozenset(msg.stop_token_ids),
    )


def probs_from_proto(msg: common_pb2.SparseProbs) -> SparseProbs:
    """As sent; ``Verifier`` checks the values against its vocabulary."""
    token_ids = torch.tensor(msg.token_ids, dtype=torch.int64)
    return SparseProbs(token_ids, torch.tensor(msg.probs, dtype=torch.float32))


def _convert(messages, from_proto, failed: dict[str, Exception]) -> list:
    """Domain objects of the messages that convert; the others go to ``failed``."""
    out = []
    for msg in messages:
        try:
            out.append(from_proto(msg))
        except InvalidRequestError as e:
            failed[msg.request_id] = e
    return out


def _verify_span(request: target_pb2.VerifyRequest, context, carrier=None):
    return rpc_span(
        "specdec.target.verify",
        context,
        carrier,
        **{
            "specdec.step_id": request.step_id,
            "specdec.num_prefill_chunks": len(request.prefill),
            "specdec.batch_size": len(request.decode),
            "specdec.num_steps": max(request.num_steps, 1),
        },
    )


def result_to_proto(r: VerifyResult) -> target_pb2.VerifyResult:
    result = target_pb2.VerifyResult(
        request_id=r.request_id,
        token_ids=r.token_ids,
        num_accepted=r.num_accepted,
        num_cached_tokens=r.num_cached_tokens,
        num_prefix_cached_tokens=r.num_prefix_cached_tokens,
        features=features_to_bytes(r.features),
        feature_start=r.feature_start,
        logprobs=_logprobs_pb(r.logprobs),
        prompt_logprobs=_logprobs_pb(r.prompt_logprobs),
        prompt_logprobs_start=r.prompt_logprobs_start,
    )
    if r.error is not None:
        result.error_code = status_code_for(r.error).name
        result.error_message = str(r.error) or type(r.error).__name__
    return result


def _logprobs_pb(logprobs: list[TokenLogprobs] | None) -> list[common_pb2.TokenLogprobs]:
    return [
        common_pb2.TokenLogprobs(
            logprob=t.logprob, top_token_ids=t.top_ids, top_logprobs=t.top_logprobs
        )
        for t in logprobs or ()
    ]


class TargetServicer(ModelServicer, target_pb2_grpc.TargetServiceServicer):
    model: Verifier

    async def Verify(
        self, request: target_pb2.VerifyRequest, context: grpc.aio.ServicerContext
    ) -> target_pb2.VerifyResponse:
        with _verify_span(request, context):
            return await self.executor.call(context, self._verify, request, self.caller(context))

    async def VerifyStream(
        self,
        requests: AsyncIterator[target_pb2.VerifyRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[target_pb2.VerifyReply]:
        async def answer(request: target_pb2.VerifyRequest, owner: str):
            with _verify_span(request, context, request.trace_context):
                return await self.executor.run(self._verify, request, owner)

        async for reply in self.stream_replies(requests, context, answer, target_pb2.VerifyReply):
            yield reply

    # Run on the executor thread, as ModelServicer's.

    def _verify(self, request: target_pb2.VerifyRequest, owner: str) -> target_pb2.VerifyResponse:
        failed: dict[str, Exception] = {}
        ids = [c.request_id for c in request.prefill] + [e.request_id for e in request.decode]
        mine = set(self.claim(ids, owner, failed))
        prefill = _convert(
            [c for c in request.prefill if c.request_id in mine], prefill_from_proto, failed
        )
        decode = _convert(
            [e for e in request.decode if e.request_id in mine], entry_from_proto, failed
        )
        burst = (owner, request.step_id)
        with at_most_threads(request.num_threads):
            results = self.model.verify(
                prefill, decode, failed, request.num_steps, burst, request.return_features
            )
        return target_pb2.VerifyResponse(
            results=[result_to_proto(r) for r in results],
            num_free_pages=self.model.runner.num_free_pages,
        )

    async def EndBurst(
        self, request: target_pb2.EndBurstRequest, context: grpc.aio.ServicerContext
    ) -> target_pb2.EndBurstResponse:
        """On the serving thread, beside the burst the model thread runs."""
        ended = self.model.end_burst((self.caller(context), request.step_id))
        return target_pb2.EndBurstResponse(ended=ended)

    def _info(self) -> common_pb2.ModelInfo:
        v = self.model
        return model_info(v.runner, num_steps=v.num_steps, num_sequences=v.num_sequences)
