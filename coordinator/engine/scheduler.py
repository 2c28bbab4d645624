"""The scheduler: which requests run this step, with what K, and what each service gets.

Plain Python (no gRPC, no torch) so its tests run anywhere. The engine owns the I/O; the
scheduler only reads request state and returns a `StepPlan`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from specdec.coordinator.engine.config import SpeculativeConfig
from specdec.coordinator.engine.errors import ResourceExhausted
from specdec.coordinator.engine.kv_pool import KVPool
from specdec.coordinator.engine.request import Request, RequestStatus
from specdec.coordinator.engine.speculation_gate import SpeculationGate


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens [start, start + len(token_ids)) for the target; is_last emits a token,
    unless the chunk `resumes` a preempted request (its log recomputed but the last token)."""

    request: Request
    start: int
    token_ids: list[int]
    is_last: bool
    resumes: bool = False


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
    # Requests preempted to make room: the engine releases them on both services and
    # plans again instead of running this plan.
    preempted: list[Request] = field(default_factory=list)

    @property
    def propose(self) -> list[DecodeEntry]:
        return [d for d in self.decodes if d.k > 0]

    @property
    def requests(self) -> list[Request]:
        return [c.request for c in self.prefills] + [d.request for d in self.decodes]

    @property
    def num_target_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.prefills) + sum(1 + d.k for d in self.decodes)


@dataclass
class _Room:
    """What is left of this step: target tokens, and new pages on each service (None: not
    counted). ``taken`` remembers each planned request's share, to give it back."""

    tokens: int
    target: int | None
    draft: int | None
    taken: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def fits(self, target: int, draft: int) -> bool:
        return (self.target is None or target <= self.target) and (
            self.draft is None or draft <= self.draft
        )

    def take(self, request: Request, tokens: int, target: int, draft: int) -> None:
        self._add(-tokens, -target, -draft)
        had = self.taken.get(request.request_id, (0, 0, 0))
        self.taken[request.request_id] = (had[0] + tokens, had[1] + target, had[2] + draft)

    def give_back(self, request: Request, target_pages: int, draft_pages: int) -> None:
        """A preempted request: what it took this step, and the pages it held."""
        tokens, target, draft = self.taken.pop(request.request_id, (0, 0, 0))
        self._add(tokens, target + target_pages, draft + draft_pages)

    def _add(self, tokens: int, target: int, draft: int) -> None:
        self.tokens += tokens
        if self.target is not None:
            self.target += target
        if self.draft is not None:
            self.draft += draft


class Scheduler:
    """FCFS continuous batching with chunked prefill, batch-size-dependent K, and KV pages.

    Invariants of a plan: at most `max_num_seqs` requests run; the target gets at most
    `max_num_batched_tokens` tokens (a decode entry costs 1 + K, a prefill chunk its
    length); every scheduled request the draft is behind on gets an ingest plan (prefill
    chunks and K = 0 steps included), so the draft never goes stale.

    KV pages (`target_pool`, `draft_pool`; None: not counted): a plan needs at most the
    free pages each service last reported. A decode costs the pages of its 1 + K tokens on
    the target and, on the draft, of the committed tokens it ingests plus 2K + 1 (its
    proposals, and the next step's made ahead); a prefill chunk its tokens on both. A
    running request that cannot get its pages preempts the most recently admitted running
    request (vLLM V1's policy: recompute), itself if it is the newest; the plan then names
    the preempted requests and nothing else, and the engine releases them and plans
    again. A waiting request is admitted (FCFS) only when its first chunk fits with a
    watermark of pages to spare; a running prefill takes what fits.

    A `gate` (SpeculationGate) holds back, each step, the requests whose speculation it
    measured slower than plain decoding: they run K = 0 (and the draft ingests their
    tokens lazily) as a request of a batch size with no K would.

    Multi-step decoding (vLLM's `--num-scheduler-steps`): when every scheduled request
    decodes at K = 0 and none waits, the plan asks the target for up to
    `num_scheduler_steps` forwards in one round trip (as many as its pages hold), each
    request capped by the room before its end; the draft ingests what they committed in
    the next step, as always.
    """

    def __init__(
        self,
        speculative: SpeculativeConfig,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        max_queue_len: int = 1 << 30,
        num_scheduler_steps: int = 1,
        target_pool: KVPool | None = None,
        draft_pool: KVPool | None = None,
        gate: SpeculationGate | None = None,
    ) -> None:
        self.speculative = speculative
        self.gate = gate
        self._held_back: set[str] = set()  # request ids the gate runs at K = 0 this step
        self.num_scheduler_steps = num_scheduler_steps
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_queue_len = max_queue_len
        self.target_pool = target_pool
        self.draft_pool = draft_pool
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._next_step_id = 0

    def add(self, request: Request) -> None:
        if len(self.waiting) >= self.max_queue_len:
            raise ResourceExhausted(
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
        if request.request_id in self._held_back:
            return 0
        k = batch_k if request.k_cap is None else min(batch_k, request.k_cap)
        return max(min(k, self.room(request) - 1), 0)

    def room(self, request: Request) -> int:
        """Tokens the request may still commit: before max_tokens and max_model_len."""
        return min(
            request.max_tokens - request.num_output_tokens,
            self.max_model_len - request.num_tokens,
        )

    def max_lookahead(self) -> int:
        """Tokens past the committed log a request may hold on the draft (2K + 1 at the
        largest K) and on the target (K + 1)."""
        return 2 * self.speculative.max_k + 1

    def schedule(self, draft_available: bool = True) -> StepPlan | None:
        """Plans one step, or returns None when nothing can run.

        `draft_available` False (the draft failed recently) plans K = 0 and no draft work.
        """
        seats = max(self.max_num_seqs - len(self.running), 0)
        batch_size = len(self.running) + min(len(self.waiting), seats)
        if batch_size == 0:
            return None
        batch_k = self.speculative.k_for_batch_size(batch_size) if draft_available else 0
        plan = StepPlan(step_id=self._next_step_id, batch_size=batch_size, k=batch_k)
        self._held_back = set()  # last step's, which k_for must not see here
        if draft_available:
            self._held_back = self._gated(batch_size)
        room = _Room(
            self.max_num_batched_tokens,
            self.target_pool.num_free if self.target_pool else None,
            self.draft_pool.num_free if self.draft_pool and draft_available else None,
        )
        self._plan_decodes(plan, room, batch_k, draft_available)
        for request in list(self.running):
            if request in self.running and request.is_prefilling and room.tokens >= 1:
                self._plan_prefill(plan, room, request, batch_k, admit=False)
        if plan.preempted:
            return plan
        while self.waiting and len(self.running) < self.max_num_seqs and room.tokens >= 1:
            if not self._plan_prefill(plan, room, self.waiting[0], batch_k, admit=True):
                break
        if not plan.prefills and not plan.decodes:
            return None
        if self.num_scheduler_steps > 1 and not plan.prefills and not self.waiting:
            self._plan_multi_step(plan, room)
        if draft_available:
            for chunk in plan.prefills:
                end = chunk.start + len(chunk.token_ids)
                self._plan_ingest(plan, chunk.request, end, self.k_for(chunk.request, batch_k) > 0)
            for n, entry in enumerate(plan.decodes):
                eager = self.k_for(entry.request, batch_k) > 0
                self._plan_ingest(plan, entry.request, entry.request.num_tokens, eager)
                features = entry.request.features
                if features is not None and features.num_ingestible < entry.request.num_tokens:
                    # The draft cannot catch up before the target's features arrive (a
                    # target that returns none stays target-only): no proposals after a
                    # log it does not hold.
                    plan.decodes[n] = replace(entry, k=0)
        self._spend(room)
        self._next_step_id += 1
        return plan

    def _gated(self, batch_size: int) -> set[str]:
        """The running decodes the gate holds back this step (asked once each). A seeded
        sampled request keeps its fixed K: its tokens depend on which positions are
        drafted."""
        batch_k = self.speculative.k_for_batch_size(batch_size)
        if self.gate is None or not batch_k:
            return set()
        return {
            r.request_id
            for r in self.running
            if not r.is_prefilling
            and (r.sampling.seed is None or r.sampling.greedy)
            and not self.gate.allows(r.gate, batch_size, self.k_for(r, batch_k))
        }

    # ---- planning ----------------------------------------------------------------------

    def _plan_decodes(
        self, plan: StepPlan, room: _Room, batch_k: int, draft_available: bool
    ) -> None:
        """Decodes first: they hold KV already and each costs little. A seeded sampled
        request's tokens depend on its K (which positions are drafted), so its K never
        depends on the batch: it runs the batch-size-1 K, or waits a step when the token
        budget cannot fit it."""
        seeded_k = self.speculative.k_for_batch_size(1) if draft_available else 0
        for request in list(self.running):
            if request not in self.running or request.is_prefilling or room.tokens < 1:
                continue
            if request.sampling.seed is not None and not request.sampling.greedy:
                k = self.k_for(request, seeded_k)
                if 1 + k > room.tokens:
                    continue
            else:
                k = min(self.k_for(request, batch_k), room.tokens - 1)
            held = request.num_target_cached
            target = self._growth(self.target_pool, held, held + 1 + k)
            draft = self._draft_growth(request, request.num_tokens, k, room)
            if self._make_room(plan, room, request, target, draft):
                room.take(request, 1 + k, target, draft)
                plan.decodes.append(DecodeEntry(request, k))

    def _plan_prefill(
        self, plan: StepPlan, room: _Room, request: Request, batch_k: int, admit: bool
    ) -> bool:
        """The request's next prompt chunk within the token budget. A running request's
        chunk is cut to the pages free, and one that fits not a token preempts to make room;
        a waiting one (``admit``) is admitted only when its whole chunk fits with a
        watermark of pages to spare, else False (it keeps waiting)."""
        start = request.num_target_cached
        end = budget_end = min(request.prefill_end, start + room.tokens)
        spare = self._watermark() if admit else 0
        if self.target_pool is not None and room.target is not None:
            fit = self.target_pool.tokens_fitting(start, max(room.target - spare, 0))
            end = min(end, start + fit)
        if self.draft_pool is not None and room.draft is not None:
            held = request.num_draft_cached or 0
            fit = self.draft_pool.tokens_fitting(held, max(room.draft - spare, 0))
            end = min(end, held + fit)
        if end < budget_end and admit:
            return False  # FCFS: admitted with its whole chunk, or it waits
        if start < end < request.prefill_end and self.target_pool is not None:
            # A cut chunk ends on a page, so that the next starts on a block the services'
            # prefix caches can match; one the budget cuts short of a page waits a step.
            page = self.target_pool.page_size
            if end - end % page > start:
                end -= end % page
            elif self.max_num_batched_tokens >= page:
                return False
        if end <= start:
            end = min(budget_end, start + 1)
        target = self._growth(self.target_pool, start, end)
        draft = self._draft_growth(request, end, 0, room)
        if admit:
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
        elif not self._make_room(plan, room, request, target, draft):
            return False
        room.take(request, end - start, target, draft)
        is_last, resumes = end == request.prefill_end, request.num_output_tokens > 0
        chunk = PrefillChunk(request, start, request.token_ids[start:end], is_last, resumes)
        plan.prefills.append(chunk)
        return True

    def _plan_multi_step(self, plan: StepPlan, room: _Room) -> None:
        """Several K = 0 forwards in one round trip, as many as the target's pages hold."""
        if not plan.decodes or any(d.k for d in plan.decodes):
            return
        decodes = plan.decodes
        free = room.target
        if free is not None:
            free += sum(room.taken[d.request.request_id][1] for d in decodes)
        for steps in range(self.num_scheduler_steps, 1, -1):
            entries = [DecodeEntry(d.request, 0, min(steps, self.room(d.request))) for d in decodes]
            pages = sum(
                self._growth(self.target_pool, held, held + e.max_new_tokens)
                for e in entries
                for held in (e.request.num_target_cached,)
            )
            if free is None or pages <= free:
                plan.num_steps, plan.decodes = steps, entries
                if free is not None:
                    room.target = free - pages
                return

    def _make_room(
        self, plan: StepPlan, room: _Room, request: Request, target: int, draft: int
    ) -> bool:
        """Preempts the most recently admitted running requests until ``request``'s pages
        fit; False when that preempted ``request`` itself."""
        while not room.fits(target, draft):
            victim = self.running[-1]
            self._preempt(plan, room, victim)
            if victim is request:
                return False
        return True

    def _preempt(self, plan: StepPlan, room: _Room, victim: Request) -> None:
        target_held = self.target_pool.pages(victim.num_target_cached) if self.target_pool else 0
        draft_held = self.draft_pool.pages(victim.num_draft_cached or 0) if self.draft_pool else 0
        room.give_back(victim, target_held, draft_held)
        plan.decodes = [d for d in plan.decodes if d.request is not victim]
        plan.prefills = [c for c in plan.prefills if c.request is not victim]
        self.running.remove(victim)
        victim.preempt()
        self.waiting.appendleft(victim)
        plan.preempted.append(victim)

    def _growth(self, pool: KVPool | None, held: int, new_len: int) -> int:
        return pool.growth(held, new_len) if pool is not None else 0

    def _draft_growth(self, request: Request, end: int, k: int, room: _Room) -> int:
        """New draft pages to hold the committed tokens [0, end), plus 2K + 1 past them when
        it proposes K (its proposals, then the next step's made ahead after a guess)."""
        if self.draft_pool is None or room.draft is None:
            return 0
        return self.draft_pool.growth(request.num_draft_cached or 0, end + (2 * k + 1 if k else 0))

    def _watermark(self) -> int:
        """Pages an admission leaves free on each service, for the running requests'
        growth: 1 % of the smaller pool, at least one."""
        pools = [p for p in (self.target_pool, self.draft_pool) if p is not None]
        return max(1, min(p.num_pages for p in pools) // 100) if pools else 0

    def _spend(self, room: _Room) -> None:
        """The pools' free counts after this plan, until the services report theirs."""
        if self.target_pool is not None and room.target is not None:
            self.target_pool.num_free = max(room.target, 0)
        if self.draft_pool is not None and room.draft is not None:
            self.draft_pool.num_free = max(room.draft, 0)

    @staticmethod
    def _plan_ingest(plan: StepPlan, request: Request, end: int, eager: bool) -> None:
        """Brings the draft to the committed tokens [0, end) of `request`, those whose
        features the target has returned where the draft reads them."""
        if request.features is not None:
            end = min(end, request.features.num_ingestible)
        held = request.num_draft_cached
        if held is None or held > end:
            # Unknown (or impossible) state: drop what the draft holds, rebuild from the log.
            plan.draft_release.append(request)
            held = 0
        if held < end:
            plan.ingest.append(IngestPlan(request, held, request.token_ids[held:end], eager))
