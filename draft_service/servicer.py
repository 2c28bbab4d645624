"""DraftService RPCs: proto -> domain -> proto, model work on the executor."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.steps import DraftStep, DraftStepResult, IngestPlan, ProposeEntry
from specdec.model_service.batcher import Batcher
from specdec.model_service.proto import features_from_bytes, kv_table_from_proto, model_info
from specdec.model_service.servicer import ModelServicer
from specdec.model_service.status import refusal, status_code_for
from specdec.runtime.errors import InvalidRequestError
from specdec.runtime.sampling import Sampling
from specdec.telemetry.tracing import rpc_span
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc


def step_from_proto(
    msg: draft_pb2.DraftStepRequest, failed: dict[str, Exception], hidden_size: int
) -> DraftStep:
    """The step; requests whose sampling parameters or features are bad go to ``failed``."""
    ingest = []
    for p in msg.ingest:
        try:
            features = features_from_bytes(p.features, len(p.token_ids), hidden_size)
        except InvalidRequestError as error:
            failed[p.request_id] = InvalidRequestError(f"request {p.request_id}: {error}")
            continue
        ingest.append(
            IngestPlan(p.request_id, p.start_position, tuple(p.token_ids), p.eager, features)
        )
    propose = []
    for e in msg.propose:
        try:
            sampling = Sampling.from_proto(e.sampling, e.request_id)
        except InvalidRequestError as error:
            failed[e.request_id] = error
            continue
        propose.append(
            ProposeEntry(
                e.request_id,
                e.num_tokens,
                sampling,
                tuple(e.ahead_of),
                e.min_prob,
                (e.prompt_lookup_min, e.prompt_lookup_max),
                e.num_branches,
                e.branch_budget_s,
            )
        )
    return DraftStep(
        kv_scales_version=msg.kv_scales_version,
        kv_scales=kv_table_from_proto(msg.kv_scales) if msg.HasField("kv_scales") else None,
        ingest=tuple(p for p in ingest if p.request_id not in failed),
        propose=tuple(propose),
    )


def result_to_proto(result: DraftStepResult) -> draft_pb2.DraftStepResponse:
    return draft_pb2.DraftStepResponse(
        proposals=[
            draft_pb2.Proposal(
                request_id=p.request_id,
                token_ids=p.token_ids,
                draft_probs=[
                    common_pb2.SparseProbs(token_ids=q.token_ids.tolist(), probs=q.probs.tolist())
                    for q in p.draft_probs or ()
                ],
                guessed_token_id=p.guessed_token_id,
                looked_up=p.looked_up,
                ahead_accepted=p.ahead_accepted,
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
        num_free_pages=result.num_free_pages,
    )


def _step_span(request: draft_pb2.DraftStepRequest, context, carrier=None):
    return rpc_span(
        "specdec.draft.step",
        context,
        carrier,
        **{
            "specdec.step_id": request.step_id,
            "specdec.num_ingest_plans": len(request.ingest),
            "specdec.num_proposing": len(request.propose),
        },
    )


def request_ids(request: draft_pb2.DraftStepRequest) -> set[str]:
    return {p.request_id for p in (*request.ingest, *request.propose)}


def table_key(request: draft_pb2.DraftStepRequest) -> tuple[int, bytes]:
    """Steps with equal keys name the same KV-scale table and can run as one."""
    table = request.kv_scales.SerializeToString() if request.HasField("kv_scales") else b""
    return request.kv_scales_version, table


def split_result(
    result: DraftStepResult, request: draft_pb2.DraftStepRequest
) -> draft_pb2.DraftStepResponse:
    """The part of a merged step's result that answers ``request``."""
    ids = request_ids(request)
    return result_to_proto(
        DraftStepResult(
            proposals=[p for p in result.proposals if p.request_id in ids],
            cached={rid: n for rid, n in result.cached.items() if rid in ids},
            failed={rid: e for rid, e in result.failed.items() if rid in ids},
            num_free_pages=result.num_free_pages,
        )
    )


class DraftServicer(ModelServicer, draft_pb2_grpc.DraftServiceServicer):
    """Steps that arrive while the draft is busy (from the coordinators sharing it) wait
    and then run together as one step, one batched forward (`_step_many`)."""

    model: Drafter

    def __init__(self, model: Drafter, executor) -> None:
        super().__init__(model, executor)
        self._batcher = Batcher(lambda items: executor.run(self._step_many, items))

    async def Step(
        self, request: draft_pb2.DraftStepRequest, context: grpc.aio.ServicerContext
    ) -> draft_pb2.DraftStepResponse:
        with _step_span(request, context):
            try:
                return await self._batcher.submit((request, self.caller(context)))
            except Exception as exc:
                await context.abort(*refusal(exc, "a draft step"))
                raise  # unreachable: abort raises

    async def StepStream(
        self,
        requests: AsyncIterator[draft_pb2.DraftStepRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[draft_pb2.DraftStepReply]:
        async def answer(request: draft_pb2.DraftStepRequest, owner: str):
            with _step_span(request, context, request.trace_context):
                return await self._batcher.submit((request, owner))

        async for reply in self.stream_replies(requests, context, answer, draft_pb2.DraftStepReply):
            yield reply

    # Run on the executor thread, as ModelServicer's.

    def _step(self, request: draft_pb2.DraftStepRequest, owner: str) -> draft_pb2.DraftStepResponse:
        failed: dict[str, Exception] = {}
        self.claim(request_ids(request), owner, failed)
        step = step_from_proto(request, failed, self._hidden_size)
        return result_to_proto(self.model.step(step, failed))

    def _step_many(
        self, items: list[tuple[draft_pb2.DraftStepRequest, str]]
    ) -> list[draft_pb2.DraftStepResponse | Exception]:
        """Each (request, caller)'s response, or the error that refuses it whole. Requests
        under one KV-scale table and for distinct request ids run as one step; if that step
        is refused whole (a bad table, out of pages), each runs alone, so an error reaches
        only its own caller."""
        ids = [request_ids(r) for r, _ in items]
        disjoint = len(set().union(*ids)) == sum(len(i) for i in ids)
        if len(items) > 1 and disjoint and len({table_key(r) for r, _ in items}) == 1:
            merged = draft_pb2.DraftStepRequest(
                kv_scales_version=items[0][0].kv_scales_version,
                ingest=[p for r, _ in items for p in r.ingest],
                propose=[e for r, _ in items for e in r.propose],
            )
            if items[0][0].HasField("kv_scales"):
                merged.kv_scales.CopyFrom(items[0][0].kv_scales)
            failed: dict[str, Exception] = {}
            for (_, owner), mine in zip(items, ids, strict=True):
                self.claim(mine, owner, failed)
            try:
                step = step_from_proto(merged, failed, self._hidden_size)
                result = self.model.step(step, failed)
            except Exception:
                pass  # a whole-step refusal: find whose, below
            else:
                return [split_result(result, request) for request, _ in items]
        out: list[draft_pb2.DraftStepResponse | Exception] = []
        for request, owner in items:
            try:
                out.append(self._step(request, owner))
            except Exception as exc:
                out.append(exc)
        return out

    @property
    def _hidden_size(self) -> int:
        return self.model.runner.model_config.hidden_size

    def _info(self) -> common_pb2.ModelInfo:
        d = self.model
        return model_info(
            d.runner,
            num_steps=d.num_steps,
            num_ingest_plans=d.num_ingest_plans,
            num_ingested_tokens=d.num_ingested_tokens,
            num_sequences=d.num_sequences,
            ahead_forward_seconds=d.ahead_forward_seconds,
        )
