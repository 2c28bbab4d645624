"""The scheduler: which requests run this step, with what K, and what each service gets.

Plain Python (no gRPC, no torch) so its tests run anywhere. The engine owns the I/O; the
scheduler only reads request state and returns a `StepPlan`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from coordinator.config import SpeculativeConfig
from coordinator.errors import QueueFull
from coordinator.request import Request, RequestStatus


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens [start, start + len(token_ids)) for the target; is_last emits a token."""

    request: Request
    start: int
    token_ids: list[int]
    is_last: bool


@dataclass(frozen=True)
class DecodeEntry:
    """Verify [last committed token, K proposals] of a decoding request; in a multi-step
    plan (K = 0), emit at most `max_new_tokens` tokens."""

    request: Request
    k: int
    max_new_tokens: int = 1


@dataclass(frozen=True)
class IngestPlan:
    """Committed tokens [start, start + len(token_ids)) the draft is behind on; `eager`:
    the request drafts at this batch size, so the draft computes them now even where this
    step proposes nothing for it (a prefill) rather than at its first proposal."""

    request: Request
    start: int
    token_ids: list[int]
    eager: bool = False


@dataclass
class StepPlan:
    step_id: int
    batch_size: int  # running requests, the key of the per-batch-size K table
    k: int  # the batch's K before per-request caps
    num_steps: int = 1  # target forwards in a row (multi-step decoding: decodes at K = 0)
    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[DecodeEntry] = field(default_factory=list)
    # The draft's work, in order: release (state unknown), ingest, then propose.
    draft_release: list[Request] = field(default_factory=list)
    ingest: list[IngestPlan] = field(default_factory=list)

    @property
    def propose(self) -> list[DecodeEntry]:
        return [d for d in self.decodes if d.k > 0]

    @property
    def requests(self) -> list[Request]:
        return [c.request for c in self.prefills] + [d.request for d in self.decodes]

    @property
    def num_target_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.prefills) + sum(1 + d.k for d in self.decodes)


class Scheduler:
    """FCFS continuous batching with chunked prefill and batch-size-dependent K.

    Invariants of a plan: at most `max_num_seqs` requests run; the target gets at most
    `max_num_batched_tokens` tokens (a decode entry costs 1 + K, a prefill chunk its
    length); every scheduled request the draft is behind on gets an ingest plan (prefill
    chunks and K = 0 steps included), so the draft never goes stale.

    Multi-step decoding (vLLM's `--num-scheduler-steps`): when every scheduled request
    decodes at K = 0 and none waits, the plan asks the target for up to
    `num_scheduler_steps` forwards in one round trip, each request capped by the room
    before its end; the draft ingests what they committed in the next step, as always.
    """

    def __init__(
        self,
        speculative: SpeculativeConfig,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        max_queue_len: int = 1 << 30,
        num_scheduler_steps: int = 1,
    ) -> None:
        self.speculative = speculative
        self.num_scheduler_steps = num_scheduler_steps
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_queue_len = max_queue_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._next_step_id = 0

    def add(self, request: Request) -> None:
        if len(self.waiting) >= self.max_queue_len:
            raise QueueFull(
                f"{len(self.waiting)} requests are waiting (max_queue_len={self.max_queue_len});"
                " retry later"
            )
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def k_for(self, request: Request, batch_k: int) -> int:
        """The batch's K lowered by the request's cap and the room before its end.

        A step commits at most K + 1 tokens, so K + 1 must fit both before max_tokens and
        before max_model_len.
        """
        k = batch_k if request.k_cap is None else min(batch_k, request.k_cap)
        return max(min(k, self.room(request) - 1), 0)

    def room(self, request: Request) -> int:
        """Tokens the request may still commit: before max_tokens and max_model_len."""
        return min(
            request.max_tokens - request.num_output_tokens,
            self.max_model_len - request.num_tokens,
        )

    def schedule(self, draft_available: bool = True) -> StepPlan | None:
        """Plans one step, or returns None when nothing can run.

        `draft_available` False (the draft failed recently) plans K = 0 and no draft work.
        """
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
        if not self.running:
            return None
        batch_size = len(self.running)
        batch_k = self.speculative.k_for_batch_size(batch_size) if draft_available else 0
        # A seeded sampled request's tokens depend on its K (which positions are drafted),
        # so its K never depends on the batch: it runs the batch-size-1 K, or waits a step
        # when the token budget cannot fit it.
        seeded_k = self.speculative.k_for_batch_size(1) if draft_available else 0
        plan = StepPlan(step_id=self._next_step_id, batch_size=batch_size, k=batch_k)
        budget = self.max_num_batched_tokens

        # Decodes first: they hold KV already and each costs little.
        for request in self.running:
            if request.is_prefilling or budget < 1:
                continue
            if request.sampling.seed is not None and not request.sampling.greedy:
                k = self.k_for(request, seeded_k)
                if 1 + k > budget:
                    continue
            else:
                k = min(self.k_for(request, batch_k), budget - 1)
            plan.decodes.append(DecodeEntry(request, k))
            budget -= 1 + k
        for request in self.running:
            if not request.is_prefilling or budget < 1:
                continue
            start = request.num_target_cached
            end = min(request.num_prompt_tokens, start + budget)
            chunk = PrefillChunk(
                request, start, request.token_ids[start:end], end == request.num_prompt_tokens
            )
            plan.prefills.append(chunk)
            budget -= end - start

        if not plan.prefills and not plan.decodes:
            return None
        if (
            self.num_scheduler_steps > 1
            and not plan.prefills
            and not self.waiting
            and all(d.k == 0 for d in plan.decodes)
        ):
            plan.num_steps = self.num_scheduler_steps
            plan.decodes = [
                DecodeEntry(d.request, 0, min(plan.num_steps, self.room(d.request)))
                for d in plan.decodes
            ]
        if draft_available:
            for chunk in plan.prefills:
                end = chunk.start + len(chunk.token_ids)
                self._plan_ingest(plan, chunk.request, end, self.k_for(chunk.request, batch_k) > 0)
            for entry in plan.decodes:
                eager = self.k_for(entry.request, batch_k) > 0
                self._plan_ingest(plan, entry.request, entry.request.num_tokens, eager)
        self._next_step_id += 1
        return plan

    @staticmethod
    def _plan_ingest(plan: StepPlan, request: Request, end: int, eager: bool) -> None:
        """Brings the draft to the committed tokens [0, end) of `request`."""
        held = request.num_draft_cached
        if held is None or held > end:
            # Unknown (or impossible) state: drop what the draft holds, rebuild from the log.
            plan.draft_release.append(request)
            held = 0
        if held < end:
            plan.ingest.append(IngestPlan(request, held, request.token_ids[held:end], eager))
