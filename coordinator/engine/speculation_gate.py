"""Speculation only where it pays: a request proposes while its measured speculative rate
beats plain decoding at the same batch size (SmartSpec's goodput rule, on step times the
coordinator measures rather than a cost model).

A speculative step costs what the draft and a verify of 1 + K rows take; whether that
beats plain decoding depends on the host (on a CPU a verify row costs a third of a decode,
on a GPU almost nothing), on the pair, and on the request (a draft accepted five times in
six on one prompt may be accepted once in two on another). So the gate measures what the
choice needs and compares, per request:

- its committed tokens per speculative step (smoothed over its own steps; before it has
  any, those of every request so far);
- the seconds of a speculative step at this batch size (the median of the last
  ``window`` steps of every request: one step held up by a collection or a page fault
  must not turn speculation off for everyone);
- the seconds per token of a plain step at this batch size (the median of the last
  ``window`` decode-only steps without proposals, multi-step bursts included).

Until the gate has seen ``warmup_steps`` speculative steps every request speculates. A
request gated off probes again (``probe_steps`` speculative steps) after
``probe_interval`` plain tokens, so one whose text turns predictable (code, a list, a
quote of the prompt) gets the draft back; each probe that does not pay doubles the wait
before the next, up to ``max_probe_interval`` (a probe costs the draft's catch-up and two
steps that lose). It probes only where a step with every proposal accepted (K + 1 tokens)
would beat plain decoding by ``probe_margin``: on a host where even that barely pays, no
text can make speculation worth its probes. Only speculative steps time a speculative step,
so once every request is gated off that figure would stand for the life of the process,
though it may have been taken while the host ran slowly (a shared VM) or on a warm-up's
steps that paid the draft's catch-up: where no speculative step has been timed at the batch
size for ``refresh_s`` seconds, the next request whose wait is over probes whatever the
margin, and the probe's first timed step starts the figure afresh (at most one such probe
per ``refresh_s``, where probes lose). Steps with prefill chunks, and those in which the
draft catches up on a log it ingested lazily, time neither rate. What a request commits
never depends on its K except for a seeded sampled one, whose K the scheduler keeps fixed;
the gate leaves those alone.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# A gated request's first wait before it probes, and the most a run of losing probes
# doubles it to (plain tokens).
PROBE_INTERVAL = 32
MAX_PROBE_INTERVAL = 512
# Seconds without a timed speculative step after which the gate measures one afresh.
REFRESH_S = 60.0


@dataclass
class GateRecord:
    """One request's part of the gate's state (kept on the request)."""

    tokens_per_step: float | None = None  # committed per speculative step, smoothed
    plain_tokens: int = 0  # committed without proposals since its last speculative step
    probe_left: int = 0  # speculative steps left in the current probe
    probe_after: int = 0  # plain tokens before its next probe (0: the gate's first wait)


class RecentMedians:
    """Per batch size, the median of the last ``window`` values, worked out as each value
    arrives (once a step) rather than where it is read (for every running request)."""

    def __init__(self, window: int) -> None:
        self._values: dict[int, deque[float]] = {}
        self._medians: dict[int, float] = {}
        self.window = window

    def add(self, batch_size: int, value: float) -> None:
        values = self._values.setdefault(batch_size, deque(maxlen=self.window))
        values.append(value)
        self._medians[batch_size] = statistics.median(values)

    def get(self, batch_size: int) -> float | None:
        return self._medians.get(batch_size)

    def clear(self, batch_size: int) -> None:
        self._values.pop(batch_size, None)
        self._medians.pop(batch_size, None)


@dataclass
class SpeculationGate:
    warmup_steps: int = 4
    probe_interval: int = PROBE_INTERVAL
    max_probe_interval: int = MAX_PROBE_INTERVAL
    probe_steps: int = 2
    probe_margin: float = 1.25
    refresh_s: float = REFRESH_S
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    smoothing: float = 0.25
    window: int = 16
    tokens_per_step: float | None = field(default=None, init=False)  # every request's
    spec_steps: int = field(default=0, init=False)  # speculative request-steps, all requests'
    num_held_back: int = field(default=0, init=False)  # request-steps it ran at K = 0
    num_probes: int = field(default=0, init=False)  # probes it started
    spec_step_seconds: RecentMedians = field(init=False)
    plain_token_seconds: RecentMedians = field(init=False)
    # Per batch size: when a speculative step was last timed (or a re-measuring probe
    # started), and whether the next timed one starts the figure afresh.
    _spec_timed_at: dict[int, float] = field(default_factory=dict, init=False)
    _fresh_figure: set[int] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.spec_step_seconds = RecentMedians(self.window)
        self.plain_token_seconds = RecentMedians(self.window)

    def allows(self, record: GateRecord, batch_size: int, k: int) -> bool:
        """Whether a request with ``record`` proposes (up to ``k`` tokens) this step;
        called once a step."""
        if record.probe_left > 0 or self.spec_steps < self.warmup_steps:
            return True
        tokens = record.tokens_per_step
        tokens = self.tokens_per_step if tokens is None else tokens
        plain = self.plain_token_seconds.get(batch_size)
        spec = self.spec_step_seconds.get(batch_size)
        if plain is None:
            self.num_held_back += 1
            return False  # plain decoding not timed at this batch size yet: time it
        if spec is None or tokens * plain > spec:
            record.probe_after = self.probe_interval
            return True
        wait = record.probe_after or self.probe_interval
        if record.plain_tokens < wait:
            self.num_held_back += 1
            return False
        if self._stale(batch_size):
            self._fresh_figure.add(batch_size)
            self._spec_timed_at[batch_size] = self.clock()  # one re-measuring probe at a time
        elif (k + 1) * plain <= self.probe_margin * spec:
            self.num_held_back += 1
            return False
        record.probe_left, record.plain_tokens = self.probe_steps, 0
        record.probe_after = min(2 * wait, self.max_probe_interval)
        self.num_probes += 1
        return True

    def _stale(self, batch_size: int) -> bool:
        """No speculative step was timed at this batch size for ``refresh_s`` seconds."""
        timed = self._spec_timed_at.get(batch_size)
        return timed is not None and self.clock() - timed > self.refresh_s

    def observe_speculative(
        self, records: list[tuple[GateRecord, int]], batch_size: int, seconds: float | None
    ) -> None:
        """A step in which ``records``' requests proposed, each committing its count;
        ``seconds`` None: the step is not timed (prefill chunks, or the draft caught up)."""
        for record, committed in records:
            record.tokens_per_step = self._smooth(record.tokens_per_step, committed)
            self.tokens_per_step = self._smooth(self.tokens_per_step, committed)
            self.spec_steps += 1
            record.plain_tokens = 0
            record.probe_left = max(record.probe_left - 1, 0)
        if seconds is not None:
            if batch_size in self._fresh_figure:
                self._fresh_figure.discard(batch_size)
                self.spec_step_seconds.clear(batch_size)
            self.spec_step_seconds.add(batch_size, seconds)
            self._spec_timed_at[batch_size] = self.clock()

    def observe_plain(
        self, records: list[tuple[GateRecord, int]], batch_size: int, seconds: float | None
    ) -> None:
        """A step without proposals: ``records``' requests each committed their count (a
        multi-step burst commits several); ``seconds`` None: not timed."""
        for record, committed in records:
            record.plain_tokens += committed
        forwards = max((committed for _, committed in records), default=0)
        if seconds is not None and forwards:
            self.plain_token_seconds.add(batch_size, seconds / forwards)

    def _smooth(self, last: float | None, value: float) -> float:
        """The running average: the first value as it is, then each moving it a share."""
        return value if last is None else (1.0 - self.smoothing) * last + self.smoothing * value
