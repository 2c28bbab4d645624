"""DraftService RPCs: proto -> domain -> proto, model work on the executor."""

from __future__ import annotations

import grpc

from draft_service.drafter import Drafter, DraftStep, DraftStepResult, IngestPlan, ProposeEntry
from protos.specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from runtime.sampling import Sampling
from runtime.serving import (
    InvalidRequestError,
    ModelServicer,
    kv_table_from_proto,
    model_info,
    status_code_for,
)
from telemetry.tracing import rpc_span


def step_from_proto(msg: draft_pb2.DraftStepRequest, failed: dict[str, Exception]) -> DraftStep:
    """The step; proposals whose sampling parameters are bad go to ``failed``."""
    propose = []
    for e in msg.propose:
        try:
            sampling = Sampling.from_proto(e.sampling, e.request_id)
        except InvalidRequestError as error:
            failed[e.request_id] = error
            continue
        propose.append(ProposeEntry(e.request_id, e.num_tokens, sampling))
    return DraftStep(
        kv_scales_version=msg.kv_scales_version,
        kv_scales=kv_table_from_proto(msg.kv_scales) if msg.HasField("kv_scales") else None,
        ingest=tuple(
            IngestPlan(p.request_id, p.start_position, tuple(p.token_ids))
            for p in msg.ingest
            if p.request_id not in failed
        ),
        propose=tuple(propose),
    )


def result_to_proto(result: DraftStepResult) -> draft_pb2.DraftStepResponse:
    return draft_pb2.DraftStepResponse(
        proposals=[
            draft_pb2.Proposal(
                request_id=p.request_id,
                token_ids=p.token_ids,
                # float32 little-endian, row-major [K, vocab]
                draft_probs=b""
                if p.draft_probs is None
                else p.draft_probs.to("cpu").contiguous().numpy().astype("<f4").tobytes(),
            )
            for p in result.proposals
        ],
        cached=[
            common_pb2.CachedLength(request_id=rid, num_cached_tokens=n)
            for rid, n in result.cached.items()
        ],
        failed=[
            draft_pb2.RequestError(
                request_id=rid, code=status_code_for(e).name, message=str(e) or type(e).__name__
            )
            for rid, e in result.failed.items()
        ],
    )


class DraftServicer(ModelServicer, draft_pb2_grpc.DraftServiceServicer):
    model: Drafter

    async def Step(
        self, request: draft_pb2.DraftStepRequest, context: grpc.aio.ServicerContext
    ) -> draft_pb2.DraftStepResponse:
        with rpc_span(
            "specdec.draft.step",
            context,
            **{
                "specdec.step_id": request.step_id,
                "specdec.num_ingest_plans": len(request.ingest),
                "specdec.num_proposing": len(request.propose),
            },
        ):
            return await self.executor.call(context, self._step, request, self.caller(context))

    # Run on the executor thread, as ModelServicer's.

    def _step(self, request: draft_pb2.DraftStepRequest, owner: str) -> draft_pb2.DraftStepResponse:
        failed: dict[str, Exception] = {}
        self.claim([p.request_id for p in (*request.ingest, *request.propose)], owner, failed)
        step = step_from_proto(request, failed)
        return result_to_proto(self.model.step(step, failed))

    def _info(self) -> common_pb2.ModelInfo:
        d = self.model
        return model_info(
            d.runner,
            num_steps=d.num_steps,
            num_ingest_plans=d.num_ingest_plans,
            num_ingested_tokens=d.num_ingested_tokens,
            num_sequences=d.num_sequences,
        )
