"""Prometheus metrics, named after vLLM's spec-decode metrics; all instruments are here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from specdec.coordinator.engine.speculation_gate import SpeculationGate


@dataclass(frozen=True)
class Metrics:
    num_drafts: Counter
    num_draft_tokens: Counter
    num_accepted_tokens: Counter
    num_accepted_tokens_per_pos: Counter
    num_k0_steps: Counter
    num_ingest_plans: Counter
    num_steps: Counter
    num_draft_failures: Counter
    num_prompt_tokens: Counter
    num_generation_tokens: Counter
    num_requests: Counter
    num_requests_running: Gauge
    num_requests_waiting: Gauge
    num_preemptions: Counter
    prefix_cache_queries: Counter
    prefix_cache_hits: Counter
    time_to_first_token: Histogram
    e2e_request_latency: Histogram
    step_duration: Histogram
    registry: CollectorRegistry

    def observe_draft(
        self, num_draft_tokens: int, num_accepted: int, num_k0_steps: int = 1
    ) -> None:
        """One verified entry; `num_k0_steps`: the K = 0 forwards it covers (multi-step)."""
        if num_draft_tokens == 0:
            self.num_k0_steps.inc(num_k0_steps)
            return
        self.num_drafts.inc()
        self.num_draft_tokens.inc(num_draft_tokens)
        self.num_accepted_tokens.inc(num_accepted)
        for position in range(num_accepted):
            self.num_accepted_tokens_per_pos.labels(position=str(position)).inc()


def create_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    """Defines every instrument on `registry` (a fresh one by default, so tests can repeat)."""
    r = registry if registry is not None else CollectorRegistry()
    latency_buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
    return Metrics(
        num_drafts=Counter("spec_decode_num_drafts", "Verified drafts (K > 0)", registry=r),
        num_draft_tokens=Counter(
            "spec_decode_num_draft_tokens", "Proposed tokens verified", registry=r
        ),
        num_accepted_tokens=Counter(
            "spec_decode_num_accepted_tokens", "Proposed tokens accepted", registry=r
        ),
        num_accepted_tokens_per_pos=Counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted proposals by position in the draft",
            ["position"],
            registry=r,
        ),
        num_k0_steps=Counter(
            "specdec_num_k0_steps", "Decode entries verified without proposals", registry=r
        ),
        num_ingest_plans=Counter(
            "specdec_num_ingest_plans", "Ingest plans the draft acknowledged", registry=r
        ),
        num_steps=Counter("specdec_num_steps", "Scheduler steps", registry=r),
        num_draft_failures=Counter(
            "specdec_num_draft_failures",
            "Draft RPCs that failed or missed the deadline",
            registry=r,
        ),
        num_prompt_tokens=Counter("prompt_tokens", "Prefilled prompt tokens", registry=r),
        num_generation_tokens=Counter("generation_tokens", "Committed output tokens", registry=r),
        num_requests=Counter(
            "request_success", "Finished requests by reason", ["finished_reason"], registry=r
        ),
        num_requests_running=Gauge("num_requests_running", "Requests running", registry=r),
        num_requests_waiting=Gauge("num_requests_waiting", "Requests waiting", registry=r),
        num_preemptions=Counter(
            "num_preemptions", "Requests preempted for KV pages (recomputed)", registry=r
        ),
        prefix_cache_queries=Counter(
            "prefix_cache_queries", "Prompt tokens the target was asked to prefill", registry=r
        ),
        prefix_cache_hits=Counter(
            "prefix_cache_hits", "Of those, tokens the target's prefix cache held", registry=r
        ),
        time_to_first_token=Histogram(
            "time_to_first_token_seconds",
            "Time to first token",
            buckets=latency_buckets,
            registry=r,
        ),
        e2e_request_latency=Histogram(
            "e2e_request_latency_seconds", "Request latency", buckets=latency_buckets, registry=r
        ),
        step_duration=Histogram(
            "specdec_step_duration_seconds",
            "One scheduler step (draft + target)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        ),
        registry=r,
    )


class GateCollector(Collector):
    """The speculation gate's own counts, read at each scrape."""

    def __init__(self, gate: SpeculationGate) -> None:
        self.gate = gate

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "specdec_num_gate_held_back",
            "Decode entries the speculation gate ran without proposals (plain decoding "
            "measured faster for them)",
            value=self.gate.num_held_back,
        )
        yield CounterMetricFamily(
            "specdec_num_gate_probes",
            "Probes the speculation gate started (a held-back request's speculative steps)",
            value=self.gate.num_probes,
        )


def serve_metrics(metrics: Metrics, port: int, host: str = "0.0.0.0") -> None:
    """Serves /metrics on a background thread."""
    start_http_server(port, addr=host, registry=metrics.registry)
