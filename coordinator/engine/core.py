"""The step loop: schedule, draft Step (ingest + propose), target Verify, commit, stream.

The engine owns the committed logs and talks to the services through their async stubs
(`Step`/`Verify`/`Release` taking `timeout=` and `metadata=`), so tests can pass fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2
from opentelemetry import trace

from specdec.coordinator.engine.config import CoordinatorConfig
from specdec.coordinator.engine.draft_breaker import DraftBreaker
from specdec.coordinator.engine.drafting import DraftSteps, status_of
from specdec.coordinator.engine.errors import (
    Cancelled,
    InvalidRequest,
    NotReady,
    ResourceExhausted,
    ServiceError,
    SpecDecError,
)
from specdec.coordinator.engine.features import FeatureLog
from specdec.coordinator.engine.kv_pool import KVPool
from specdec.coordinator.engine.messages import (
    Proposals,
    sampling_pb,
    verify_request,
)
from specdec.coordinator.engine.metrics import GateCollector, Metrics
from specdec.coordinator.engine.releases import Releases
from specdec.coordinator.engine.request import Request, RequestOutput, RequestStatus
from specdec.coordinator.engine.scheduler import Scheduler, StepPlan
from specdec.coordinator.engine.speculation_gate import SpeculationGate
from specdec.coordinator.engine.stats import SpecStats
from specdec.telemetry.tracing import grpc_metadata
from specdec.v1 import common_pb2, target_pb2

logger = logging.getLogger(__name__)
tracer = trace.get_tracer("specdec.coordinator")


@dataclass(frozen=True)
class ModelLimits:
    """What the services reported at startup, pinned for the coordinator's lifetime."""

    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    draft_kv_scales: common_pb2.KVScaleTable
    target_kv_scales: common_pb2.KVScaleTable | None = None
    # Each service's KV pool as it reported it at start (None: not reported, not counted).
    target_kv: KVPool | None = None
    draft_kv: KVPool | None = None
    # > 0: the draft reads the target's features, rows of this many bytes (FeatureLog).
    feature_row_bytes: int = 0


T = TypeVar("T")


async def _await(call: Awaitable[Any]) -> Any:
    return await call


class Engine(DraftSteps, Releases):
    """Runs steps while there is work. Requests enter with `add_request` and leave by
    finishing, failing (their queue gets the error) or `abort`; every departed request is
    released on both services before the next step. `draft` None serves target-only.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        draft: Any | None,
        target: Any,
        limits: ModelLimits,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.draft = draft
        self.target = target
        self.limits = limits
        self.metrics = metrics
        gated = draft is not None and config.speculative_gate == "goodput"
        self.scheduler = Scheduler(
            config.speculative,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=limits.max_model_len,
            max_queue_len=config.max_queue_len,
            num_scheduler_steps=config.num_scheduler_steps,
            target_pool=copy.copy(limits.target_kv),
            draft_pool=copy.copy(limits.draft_kv) if draft is not None else None,
            gate=SpeculationGate() if gated else None,
        )
        if metrics is not None and self.scheduler.gate is not None:
            metrics.registry.register(GateCollector(self.scheduler.gate))
        self._pools_checked = 0.0  # when the pools were last asked for their free pages
        self._burst: int | None = None  # the multi-step burst the target runs now (step id)
        self.requests: dict[str, Request] = {}
        self.totals = SpecStats()
        self._verify_seconds: float | None = None  # batch-1 verify wall time, smoothed
        self.draining = False
        self.target_available = True  # kept by `watch_target`; False refuses new requests
        self._pending_release: list[str] = []
        self._draft_orphans: list[str] = []  # departed while the draft was down
        self.draft_breaker = DraftBreaker(
            self._probe_draft, config.draft_retry_interval, config.draft_max_retry_interval
        )
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine")

    async def stop(self) -> None:
        """Fails what is left, then releases everything departed on both services before
        returning (each release bounded by its timeout): a stopping coordinator leaves no
        KV held, even of requests that finished just before."""
        await self.draft_breaker.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for request in list(self.requests.values()):
            self._finish(request, error=NotReady("coordinator is shutting down"))
        await self._flush_releases()
        if self.draft is not None and self._draft_orphans:
            # Released while the draft was down: one last try, in case it is back.
            ids, self._draft_orphans = self._draft_orphans, []
            await self._release(self.draft, ids, self.config.draft_timeout)

    def add_request(self, request: Request) -> None:
        if self.draining:
            raise NotReady("coordinator is draining; send the request to another replica")
        if not self.target_available:
            raise NotReady(
                "the target service is not answering; retry once the coordinator's health "
                "reports SERVING"
            )
        if request.request_id in self.requests:
            raise InvalidRequest(f"request_id {request.client_request_id!r} is already in flight")
        try:
            request.sampling_message = sampling_pb(request, self.limits.eos_token_ids)
        except (ValueError, TypeError) as e:
            raise InvalidRequest(f"sampling parameters: {e}") from None
        self._check_fits(request)
        if self.limits.feature_row_bytes and self.draft is not None:
            request.features = FeatureLog(self.limits.feature_row_bytes)
        request.arrival_time = time.monotonic()
        self.scheduler.add(request)
        self.requests[request.request_id] = request
        self._wakeup.set()
        if self._burst is not None:
            asyncio.get_running_loop().create_task(self._end_burst(self._burst))
            self._burst = None  # once per burst

    def _check_fits(self, request: Request) -> None:
        """ResourceExhausted for a request that alone could never fit a service's KV pool:
        its prompt and max_tokens (and on the draft, the tokens it proposes past them)."""
        most = request.num_prompt_tokens + request.max_tokens
        lookahead = self.scheduler.max_lookahead()
        for pool, extra in (
            (self.scheduler.target_pool, 0),
            (self.scheduler.draft_pool, lookahead),
        ):
            if pool is None or pool.pages(most + extra) <= pool.num_pages:
                continue
            raise ResourceExhausted(
                f"the request needs up to {most + extra} tokens of KV cache on the {pool.name} "
                f"(a {request.num_prompt_tokens}-token prompt + max_tokens "
                f"{request.max_tokens}{f' + {extra} drafted ahead' if extra else ''}) but that "
                f"service's whole KV cache holds {pool.num_tokens} tokens; lower max_tokens "
                f"or the prompt, or give the {pool.name} service more KV memory "
                f"(--kv-cache-memory)"
            )

    def abort(
        self, request_id: str, reason: str = "the client cancelled it", with_samples: bool = False
    ) -> bool:
        """Drops a request (``with_samples``: and its other samples, n > 1); their KV is
        released on both sides, and their streams (if they still listen) end with CANCELLED
        saying ``reason``. False when no such request runs."""
        request = self.requests.get(request_id)
        aborted = [] if request is None or request.is_done else [request]
        if with_samples:
            aborted += [
                r for r in self.requests.values() if r.sample_of == request_id and not r.is_done
            ]
        for request in aborted:
            self._finish(
                request,
                error=Cancelled(f"request {request.client_request_id!r} was aborted: {reason}"),
                status=RequestStatus.ABORTED,
            )
        return bool(aborted)

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # ---- the loop --------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await self._flush_releases()
            if not self.scheduler.has_work():
                self._wakeup.clear()
                if not self._pending_release:
                    await self._wakeup.wait()
                continue
            start = time.monotonic()
            try:
                ran = await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug: fail what was running, keep serving
                logger.exception("step failed")
                for request in list(self.scheduler.running):
                    self._finish(request, error=SpecDecError(f"internal error in step: {e!r}"))
                ran = True
            self.totals.step_seconds += time.monotonic() - start
            if self.metrics is not None:
                self.metrics.step_duration.observe(time.monotonic() - start)
                self.metrics.num_requests_running.set(len(self.scheduler.running))
                self.metrics.num_requests_waiting.set(len(self.scheduler.waiting))
            # Let Generate handlers run between steps even when the stubs answer at once.
            await asyncio.sleep(0 if ran else 0.001)

    async def step(self) -> bool:
        """Runs one step; False when nothing could be scheduled."""
        if self.config.draft_rebuild_every_step:
            for request in self.scheduler.running:
                request.num_draft_cached = None
        draft_available = self.draft is not None and self.draft_breaker.closed
        plan = self.scheduler.schedule(draft_available=draft_available)
        while plan is not None and plan.preempted:
            await self._release_preempted(plan.preempted)
            plan = self.scheduler.schedule(draft_available=draft_available)
        if plan is None:
            if self.scheduler.waiting:
                await self._refresh_pools()  # waiting for pages other callers may free
            return False
        self.totals.num_steps += 1
        if self.metrics is not None:
            self.metrics.num_steps.inc()
        links = [
            trace.Link(r.span_context)
            for r in plan.requests
            if isinstance(r.span_context, trace.SpanContext)
        ]
        with tracer.start_as_current_span("specdec.step", links=links) as span:
            span.set_attribute("specdec.step_id", plan.step_id)
            span.set_attribute("specdec.batch_size", plan.batch_size)
            span.set_attribute("specdec.k", plan.k)
            span.set_attribute("specdec.num_steps", plan.num_steps)
            span.set_attribute("specdec.num_prefill_chunks", len(plan.prefills))
            span.set_attribute("specdec.num_ingest_plans", len(plan.ingest))
            metadata = grpc_metadata()
            start = time.monotonic()
            if plan.propose:
                proposals, results = await self._propose_and_verify(plan, metadata)
            else:
                # Nothing to propose (K = 0): the draft only ingests, which the target does
                # not wait for, so both run at once and K = 0 costs no draft latency.
                proposals = {}
                beside_draft = any(p.eager for p in plan.ingest)
                _, results = await asyncio.gather(
                    self._draft_step(plan, metadata, plan.ingest, []),
                    self._verify(plan, proposals, metadata, beside_draft),
                )
            span.set_attribute("specdec.num_proposed", sum(len(p) for p in proposals.values()))
            if results is not None:
                span.set_attribute("specdec.accepted", self._commit(plan, proposals, results))
                self._observe_gate(plan, results, time.monotonic() - start)
        return True

    def _observe_gate(
        self, plan: StepPlan, results: dict[str, target_pb2.VerifyResult], seconds: float
    ) -> None:
        """Tells the speculation gate what the step's decodes committed and, where the step
        says what a step of its kind costs (no prefill chunk, no draft catching up on a log
        it ingested lazily), how long it took."""
        gate = self.scheduler.gate
        if gate is None:
            return
        speculative, plain = [], []
        for entry in plan.decodes:
            result = results.get(entry.request.request_id)
            if result is not None and not result.error_code:
                kind = speculative if entry.k else plain
                kind.append((entry.request.gate, len(result.token_ids)))
        catch_up = any(p.eager and len(p.token_ids) > plan.k + 1 for p in plan.ingest)
        timed = None if plan.prefills or catch_up else seconds
        if speculative:
            gate.observe_speculative(speculative, plan.batch_size, timed)
            gate.observe_plain(plain, plan.batch_size, None)
        else:
            gate.observe_plain(plain, plan.batch_size, timed)

    # ---- target ----------------------------------------------------------------------

    async def _verify(
        self,
        plan: StepPlan,
        proposals: Proposals,
        metadata: tuple[tuple[str, str], ...],
        beside_draft: bool,
    ) -> dict[str, target_pb2.VerifyResult] | None:
        """``beside_draft``: the draft computes while the target verifies, so the target
        keeps off the cores it uses (--target-threads-beside-draft)."""
        message = verify_request(
            plan, proposals, self.limits.eos_token_ids, self.limits.feature_row_bytes > 0
        )
        if beside_draft:
            message.num_threads = self.config.target_threads_beside_draft
        if plan.num_steps > 1:
            self._burst = plan.step_id  # a request arriving meanwhile ends it early
        try:
            response = await self._call(
                self.target.Verify, message, self.config.target_timeout, metadata
            )
        except (grpc.RpcError, asyncio.TimeoutError) as e:
            code, details = status_of(e)
            logger.warning("target failed step %d (%s: %s)", plan.step_id, code, details)
            if code == "RESOURCE_EXHAUSTED" and self.scheduler.target_pool is not None:
                # Out of pages (another caller took them): the step changed nothing on the
                # target; the next plan preempts to fit in what is free.
                self.scheduler.target_pool.num_free = 0
                return None
            if code == "UNAVAILABLE":
                self.target_available = False  # until watch_target hears from it again
            error = ServiceError(code, f"target service failed ({code}): {details}")
            for request in plan.requests:
                self._finish(request, error=error)
            return None
        finally:
            self._burst = None
        if response.HasField("num_free_pages"):
            self._free_pages_reported(self.target, response.num_free_pages)
        return {r.request_id: r for r in response.results}

    async def _end_burst(self, step_id: int) -> None:
        """Asks the target to end the burst before its next forward: a new arrival's prefill
        then starts at the next step instead of after every forward of the burst."""
        with contextlib.suppress(grpc.RpcError, asyncio.TimeoutError):
            request = target_pb2.EndBurstRequest(step_id=step_id)
            await self._call(self.target.EndBurst, request, 1.0, grpc_metadata())

    async def watch_target(
        self, target_health: Any, on_change: Callable[[bool], Awaitable[None]]
    ) -> None:
        """Checks the target's gRPC health (``target_health``, a ``grpc.health.v1`` stub)
        every ``target_probe_interval`` seconds and keeps ``target_available``; calls
        ``on_change`` when it flips. Health answers beside the model's work, so a long step
        (a big prefill, a target shared by replicas) does not read as an outage. Runs until
        cancelled."""
        request = health_pb2.HealthCheckRequest()  # the server as a whole
        interval = self.config.target_probe_interval
        reported = True
        while True:
            await asyncio.sleep(interval)
            try:
                reply = await self._call(target_health.Check, request, interval, ())
                available = reply.status == health_pb2.HealthCheckResponse.SERVING
            except (grpc.RpcError, asyncio.TimeoutError):
                available = False
            self.target_available = available
            if available != reported:
                logger.warning("target service %s", "is back" if available else "is down")
                reported = available
                await on_change(available)

    # ---- commit ----------------------------------------------------------------------

    def _commit(
        self,
        plan: StepPlan,
        proposals: Proposals,
        results: dict[str, target_pb2.VerifyResult],
    ) -> int:
        """Appends what the target emitted, streams it, counts it; returns accepted total."""
        total_accepted = 0
        for chunk in plan.prefills:
            request = chunk.request
            result = self._result_for(request, results)
            if result is None:
                continue
            request.stats.num_steps += 1
            _keep_features(request, result)
            end = chunk.start + len(chunk.token_ids)
            if result.num_cached_tokens != end:
                self._out_of_sync(request, result.num_cached_tokens, end)
                continue
            request.num_target_cached = end
            _keep_prompt_logprobs(request, result)
            cached = result.num_prefix_cached_tokens
            request.stats.num_cached_tokens += cached
            self.totals.num_cached_tokens += cached
            if self.metrics is not None:
                self.metrics.num_prompt_tokens.inc(len(chunk.token_ids))
                self.metrics.prefix_cache_queries.inc(len(chunk.token_ids))
                self.metrics.prefix_cache_hits.inc(cached)
            if chunk.is_last and not chunk.resumes:
                self._emit(request, result)
        for entry in plan.decodes:
            request = entry.request
            result = self._result_for(request, results)
            if result is None:
                continue
            request.stats.num_steps += 1
            _keep_features(request, result)
            num_proposed = len(proposals.get(request.request_id, ((), ()))[0])
            num_accepted = min(result.num_accepted, num_proposed)
            forwards = max(len(result.token_ids), 1)  # K = 0 forwards of a multi-step result
            request.stats.observe_draft(num_proposed, num_accepted, forwards)
            self.totals.observe_draft(num_proposed, num_accepted, forwards)
            if self.metrics is not None:
                self.metrics.observe_draft(num_proposed, num_accepted, forwards)
            total_accepted += num_accepted
            request.accepted_all = num_proposed > 0 and num_accepted == num_proposed
            self._emit(request, result)
        return total_accepted

    def _result_for(
        self, request: Request, results: dict[str, target_pb2.VerifyResult]
    ) -> target_pb2.VerifyResult | None:
        if request.is_done:  # aborted while the step was in flight
            return None
        result = results.get(request.request_id)
        if result is None:
            self._finish(
                request, error=ServiceError("INTERNAL", "target returned no result for request")
            )
        elif result.error_code:  # this request failed alone; the step's others go on
            message = f"the target refused request {request.request_id}: {result.error_message}"
            self._finish(request, error=ServiceError(result.error_code, message))
            return None
        return result

    def _emit(self, request: Request, result: target_pb2.VerifyResult) -> None:
        token_ids, num_target_cached = list(result.token_ids), result.num_cached_tokens
        first = request.num_output_tokens == 0
        committed = request.commit(token_ids, self.limits.eos_token_ids, self.limits.max_model_len)
        prompt = (
            request.prompt_logprobs
            if first and request.sampling.prompt_logprobs is not None
            else None
        )
        logprobs = None
        if request.sampling.logprobs is not None:
            logprobs = list(result.logprobs[: len(committed)])
        if committed and request.first_token_time is None:
            request.first_token_time = time.monotonic()
            if self.metrics is not None:
                self.metrics.time_to_first_token.observe(
                    request.first_token_time - request.arrival_time
                )
        if self.metrics is not None:
            self.metrics.num_generation_tokens.inc(len(committed))
        if request.finish_reason is not None:
            # The target may hold KV past the stop; the request is released anyway.
            self._finish(
                request,
                tokens=committed,
                reason=request.finish_reason,
                logprobs=logprobs,
                prompt_logprobs=prompt,
            )
            return
        # Target holds every committed token but the last, which the next Verify feeds in.
        if num_target_cached != request.num_tokens - 1:
            self._out_of_sync(request, num_target_cached, request.num_tokens - 1)
            return
        request.num_target_cached = num_target_cached
        request.outputs.put_nowait(
            RequestOutput(committed, logprobs=logprobs, prompt_logprobs=prompt)
        )

    def _out_of_sync(self, request: Request, held: int, expected: int) -> None:
        logger.error(
            "invariant: target holds %d tokens of %s, expected %d (committed %d)",
            held,
            request.request_id,
            expected,
            request.num_tokens,
        )
        self._finish(
            request,
            error=ServiceError(
                "FAILED_PRECONDITION",
                f"target cache out of sync: holds {held} tokens, expected {expected}",
            ),
        )

    def _finish(
        self,
        request: Request,
        *,
        tokens: list[int] | None = None,
        reason: str | None = None,
        error: Exception | None = None,
        status: RequestStatus | None = None,
        logprobs: list | None = None,
        prompt_logprobs: list | None = None,
    ) -> None:
        """Ends a request: tells its stream, unschedules it, queues its release."""
        if request.is_done:
            return
        if status is None:
            status = RequestStatus.FAILED if error is not None else RequestStatus.FINISHED
        request.status = status
        request.finish_reason = reason
        self.scheduler.remove(request)
        self.requests.pop(request.request_id, None)
        self._pending_release.append(request.request_id)
        self._wakeup.set()
        request.outputs.put_nowait(
            RequestOutput(tokens or [], reason, error, logprobs, prompt_logprobs)
        )
        if self.metrics is not None:
            label = reason or ("abort" if status is RequestStatus.ABORTED else "error")
            self.metrics.num_requests.labels(finished_reason=label).inc()
            self.metrics.e2e_request_latency.observe(time.monotonic() - request.arrival_time)

    @staticmethod
    async def _call(method: Any, message: Any, timeout: float, metadata: Any) -> Any:
        # gRPC's deadline reaches the server; wait_for bounds a stub that ignores it.
        return await asyncio.wait_for(
            _await(method(message, timeout=timeout, metadata=metadata)), timeout + 0.5
        )


def _keep_features(request: Request, result: target_pb2.VerifyResult) -> None:
    if request.features is not None and result.features:
        request.features.add(result.feature_start, result.features)


def _keep_prompt_logprobs(request: Request, result: target_pb2.VerifyResult) -> None:
    """The prompt positions a prefill chunk scored that the request lacks. Once it has
    them all, it stops asking: a request resumed after a preemption prefills from the
    prefix cache like any other."""
    known = 1 + len(request.prompt_logprobs)  # position 0 has none
    position = result.prompt_logprobs_start
    for lp in result.prompt_logprobs:
        if known <= position < request.num_prompt_tokens:
            request.prompt_logprobs.append(lp)
            known += 1
        position += 1
    if known >= request.num_prompt_tokens and request.sampling_message.HasField("prompt_logprobs"):
        message = common_pb2.SamplingParams()
        message.CopyFrom(request.sampling_message)
        message.ClearField("prompt_logprobs")
        request.sampling_message = message
