"""The engine's draft side: a step's draft call (ingest, propose), the proposals prepared
during the previous verify (work ahead, branches at batch 1), and the breaker's probe.

``DraftSteps`` is a part of ``Engine`` (its base class), kept in its own file; it reads the
engine's config, scheduler, stubs, breaker and stats."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from specdec.coordinator.engine.messages import (
    Proposals,
    checked_proposal,
    draft_step_request,
    valid_proposals,
)
from specdec.coordinator.engine.request import AheadProposal
from specdec.coordinator.engine.scheduler import DecodeEntry, IngestPlan, StepPlan
from specdec.telemetry.tracing import grpc_metadata
from specdec.v1 import common_pb2, target_pb2

logger = logging.getLogger(__name__)
T = TypeVar("T")


async def timed(call: Awaitable[T]) -> tuple[T, float]:
    """The call's result and its wall time in seconds."""
    start = time.monotonic()
    result = await call
    return result, time.monotonic() - start


def status_of(e: BaseException) -> tuple[str, str]:
    """(status code name, details) of a failed RPC."""
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        code = e.code()
        details = e.details() if hasattr(e, "details") else str(e)
        return (code.name if code is not None else "UNKNOWN"), details or ""
    if isinstance(e, asyncio.TimeoutError):
        return "DEADLINE_EXCEEDED", "deadline exceeded"
    return "INTERNAL", repr(e)


class DraftSteps:
    async def _propose_and_verify(
        self, plan: StepPlan, metadata: tuple[tuple[str, str], ...]
    ) -> tuple[Proposals, dict[str, target_pb2.VerifyResult] | None]:
        """Draft, then verify. Pipelined, a request whose proposals the draft prepared
        during the previous verify (and whose commit matched what they assumed) skips the
        draft call; the others draft first; then, while the target verifies, the draft
        ingests the rest and proposes for the next step, assuming this one's proposals are
        all accepted. It does so only for requests whose last verify accepted everything
        and whose proposals now run to their K: on a 2-core host the two models slow each
        other when they run at once, so work ahead pays only where it is likely to be used,
        and a draft cut short by --draft-p-min ended where it was unsure of the next token,
        the very token work ahead would have to guess. A draft that reads the target's
        features never works ahead: it would read its own guesses of them."""
        if self.config.pipeline == "off" or self.limits.feature_row_bytes:
            proposals = await self._draft_step(plan, metadata, plan.ingest, plan.propose)
            return proposals, await self._verify(plan, proposals, metadata, beside_draft=False)
        proposals = self._take_ahead(plan)
        fresh = [d for d in plan.propose if d.request.request_id not in proposals]
        fresh_ids = {d.request.request_id for d in fresh}
        if fresh:
            first = [p for p in plan.ingest if p.request.request_id in fresh_ids]
            proposals.update(await self._draft_step(plan, metadata, first, fresh))
        if not self.draft_breaker.closed:
            return proposals, await self._verify(plan, proposals, metadata, beside_draft=False)
        rest = [p for p in plan.ingest if p.request.request_id not in fresh_ids]
        # Branches at batch 1, once a verify was timed: within 80 % of its time, so work
        # ahead never holds up the step. Not where the target gives the draft cores for
        # its work ahead (--target-threads-beside-draft): branches would make every
        # verify run beside the draft, where the all-accepted branch alone lets a verify
        # after a rejection keep every core (the tiny pair on 2 cores, 16 prompts, gate
        # off: 1.05x / 1.04x target-only with three branches, 1.17x / 1.17x with one).
        budget = 0.8 * self._verify_seconds if self._verify_seconds else 0.0
        branching = plan.batch_size == 1 and budget and not self.config.target_threads_beside_draft
        branches = self.config.pipeline_branches if branching else 1
        ahead = [
            d
            for d in plan.propose
            if proposals.get(d.request.request_id, ((),))[0]
            and (
                (branches > 1 and d.request.sampling.greedy)
                or (d.request.accepted_all and len(proposals[d.request.request_id][0]) == d.k)
            )
        ]
        draft = self._draft_step(
            plan, metadata, rest, ahead, proposals, not fresh, branches, budget
        )
        beside_draft = bool(ahead) or any(p.eager for p in rest)
        verify = self._verify(plan, proposals, metadata, beside_draft)
        _, (results, seconds) = await asyncio.gather(draft, timed(verify))
        if plan.batch_size == 1 and proposals:
            last = self._verify_seconds or seconds
            self._verify_seconds = 0.7 * last + 0.3 * seconds
        return proposals, results

    def _take_ahead(self, plan: StepPlan) -> Proposals:
        """The prepared proposals that hold for this step (of one request's branches, the
        one whose assumed outcome the commit followed), cut to its K."""
        out: Proposals = {}
        for d in plan.propose:
            request = d.request
            prepared, request.ahead = request.ahead, []
            ahead = next((a for a in prepared if a.holds_for(request.token_ids)), None)
            if ahead is None:
                continue
            ids = ahead.token_ids[: d.k]
            out[request.request_id] = (ids, ahead.draft_probs[: len(ids)])
            request.stats.num_ahead_used += 1
            self.totals.num_ahead_used += 1
            request.stats.num_lookup_drafts += ahead.looked_up
            self.totals.num_lookup_drafts += ahead.looked_up
        return out

    def _keep_ahead(self, propose: list[DecodeEntry], response: Any, ahead_of: Proposals) -> None:
        """Keeps each branch's proposals on its request, with the outcome it assumed: the
        first ``ahead_accepted`` proposals under verification (all when unset), then the
        draft's guess of the target's token."""
        entries, vocab = {d.request.request_id: d for d in propose}, self.limits.vocab_size
        for p in response.proposals:
            entry, request = entries.get(p.request_id), self.requests.get(p.request_id)
            if entry is None or request is None or not p.HasField("guessed_token_id"):
                continue
            checked, verified = checked_proposal(entry, p, vocab), ahead_of[p.request_id][0]
            accepted = p.ahead_accepted if p.HasField("ahead_accepted") else len(verified)
            if not checked or not checked[0] or p.guessed_token_id >= vocab:
                continue  # malformed, or nothing to keep
            if accepted > len(verified):  # a branch past the proposals it was sent
                continue
            ids, probs = checked
            assumed = (*verified[:accepted], p.guessed_token_id)
            ahead = AheadProposal(request.num_tokens, assumed, ids, probs, p.looked_up)
            request.ahead.append(ahead)
            request.stats.num_ahead_proposals += 1
            self.totals.num_ahead_proposals += 1

    async def _draft_step(
        self,
        plan: StepPlan,
        metadata: tuple[tuple[str, str], ...],
        ingest: list[IngestPlan],
        propose: list[DecodeEntry],
        ahead_of: Proposals | None = None,
        release: bool = True,
        branches: int = 1,
        branch_budget_s: float = 0.0,
    ) -> Proposals:
        """Ingests and proposes; returns request id -> (proposal ids, draft probs). With
        ``ahead_of`` the proposals are for the next step and kept on the requests instead
        (for ``branches`` outcomes of the verify, greedy requests, as many as fit in
        ``branch_budget_s``).
        ``release``: this is the step's first draft call, which releases what the plan
        (or an earlier failure) says the draft must drop.

        Any failure gives no proposals (K = 0 this step) and marks draft state unknown.
        """
        if not ingest and not propose:
            return {}
        timeout = self.config.draft_timeout
        step_requests = {p.request.request_id: p.request for p in ingest}
        step_requests.update({d.request.request_id: d.request for d in propose})
        try:
            release_ids = [r.request_id for r in plan.draft_release] + self._draft_orphans
            if release and release_ids:
                await self._call(
                    self.draft.Release,
                    common_pb2.ReleaseRequest(request_ids=release_ids),
                    timeout,
                    metadata,
                )
                self._draft_orphans.clear()
                for request in plan.draft_release:
                    request.num_draft_cached = 0
            message = draft_step_request(
                plan.step_id,
                ingest,
                propose,
                self.limits.draft_kv_scales,
                ahead_of,
                self.config.draft_p_min,
                self.config.speculative.prompt_lookup,
                branches,
                branch_budget_s,
            )
            response = await self._call(self.draft.Step, message, timeout, metadata)
        except (grpc.RpcError, asyncio.TimeoutError) as e:
            code, details = status_of(e)
            if self.metrics is not None:
                self.metrics.num_draft_failures.inc()
            if code == "RESOURCE_EXHAUSTED" and self.scheduler.draft_pool is not None:
                # Out of pages, refused before anything changed: no proposals this step,
                # and the next plan preempts to fit in what is free.
                logger.warning("draft out of KV pages in step %d: %s", plan.step_id, details)
                self.scheduler.draft_pool.num_free = 0
            elif code == "FAILED_PRECONDITION":
                # Alive but out of sync (wrong start or KV-scale version): rebuild these.
                logger.warning("draft refused step %d: %s; rebuilding", plan.step_id, details)
                for request in step_requests.values():
                    request.num_draft_cached = None
            else:
                logger.warning(
                    "draft failed step %d (%s: %s); running K=0 and re-syncing later",
                    plan.step_id,
                    code,
                    details,
                )
                self._mark_draft_down()
            return {}

        if response.HasField("num_free_pages"):
            self._free_pages_reported(self.draft, response.num_free_pages)
        for p in ingest:
            p.request.stats.num_ingest_plans += 1
        self.totals.num_ingest_plans += len(ingest)
        if self.metrics is not None:
            self.metrics.num_ingest_plans.inc(len(ingest))
        for refused in response.failed:  # alone: no proposals for it, rebuilt from the log
            logger.warning(
                "draft refused request %s in step %d (%s: %s); rebuilding it",
                refused.request_id,
                plan.step_id,
                refused.code,
                refused.message,
            )
        reported = {c.request_id: c.num_cached_tokens for c in response.cached}
        for request_id, request in step_requests.items():
            held = reported.get(request_id)
            if held is None or held > request.num_tokens:
                if held is not None:
                    logger.error(
                        "invariant: draft holds %d tokens of %s, committed %d; rebuilding",
                        held,
                        request_id,
                        request.num_tokens,
                    )
                request.num_draft_cached = None
            else:
                request.num_draft_cached = held
        if ahead_of is not None:
            self._keep_ahead(propose, response, ahead_of)
            return {}
        proposals = valid_proposals(propose, response, self.limits.vocab_size)
        for p in response.proposals:
            if p.looked_up and p.request_id in proposals:
                self.requests[p.request_id].stats.num_lookup_drafts += 1
                self.totals.num_lookup_drafts += 1
        return proposals

    def _mark_draft_down(self) -> None:
        """Runs K = 0 until the draft answers a probe; what it held is unknown from now on."""
        self.draft_breaker.trip()
        for request in self.scheduler.running:
            request.num_draft_cached = None

    async def _probe_draft(self) -> None:
        timeout = self.config.draft_timeout
        await self._call(self.draft.GetInfo, common_pb2.InfoRequest(), timeout, grpc_metadata())
