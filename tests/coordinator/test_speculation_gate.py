"""The speculation gate's rule on given step times (the engine's tests run it on timed fakes)."""

from __future__ import annotations

from specdec.coordinator.engine.speculation_gate import GateRecord, SpeculationGate

K = 6  # a step with every proposal accepted commits 7 tokens: probes may pay


def warmed(gate: SpeculationGate, tokens_per_step: int, spec_s: float, plain_s: float):
    """A request through its warm-up steps, each committing ``tokens_per_step`` in
    ``spec_s``, then one timed plain token of ``plain_s``."""
    record = GateRecord()
    for _ in range(gate.warmup_steps):
        assert gate.allows(record, 1, K)
        gate.observe_speculative([(record, tokens_per_step)], 1, spec_s)
    assert not gate.allows(record, 1, K)  # plain decoding not timed yet: it is, next
    gate.observe_plain([(record, 8)], 1, 8 * plain_s)
    return record


def test_a_request_speculates_while_its_tokens_per_step_beat_plain_decoding():
    gate = SpeculationGate()
    # 3 tokens a 20 ms step (150/s) against a 10 ms token (100/s): speculate.
    fast = warmed(gate, 3, 0.020, 0.010)
    assert all(gate.allows(fast, 1, K) for _ in range(10))
    # 1.5 a step (75/s): plain.
    slow = GateRecord(tokens_per_step=1.5)
    assert not gate.allows(slow, 1, K)


def test_a_new_request_starts_from_what_every_request_committed_a_step():
    gate = SpeculationGate()
    warmed(gate, 1, 0.020, 0.010)  # 50/s against 100/s
    assert not gate.allows(GateRecord(), 1, K)  # no warm-up of its own: plain from the start
    gate = SpeculationGate()
    warmed(gate, 3, 0.020, 0.010)
    assert gate.allows(GateRecord(), 1, K)


def test_a_gated_request_probes_after_probe_interval_plain_tokens_and_comes_back():
    gate = SpeculationGate(probe_interval=64, probe_steps=2)
    record = warmed(gate, 1, 0.020, 0.010)  # 50/s against 100/s
    assert not gate.allows(record, 1, K)
    gate.observe_plain([(record, 48)], 1, 48 * 0.010)
    assert not gate.allows(record, 1, K)  # 56 plain tokens, warm-up's burst included
    gate.observe_plain([(record, 8)], 1, 8 * 0.010)
    assert gate.allows(record, 1, K)  # the probe: two speculative steps
    gate.observe_speculative([(record, 6)], 1, None)  # the draft caught up: not timed
    assert gate.allows(record, 1, K)
    gate.observe_speculative([(record, 6)], 1, 0.020)
    assert record.tokens_per_step > 2.0  # the text turned predictable
    assert all(gate.allows(record, 1, K) for _ in range(5))  # and it speculates again


def test_each_probe_that_loses_doubles_the_wait_before_the_next():
    gate = SpeculationGate(probe_interval=16, max_probe_interval=64, probe_steps=2)
    record = warmed(gate, 1, 0.020, 0.010)  # 50/s against 100/s
    waits = []
    for _ in range(5):
        plain = 0
        while not gate.allows(record, 1, K):
            gate.observe_plain([(record, 1)], 1, 0.010)
            plain += 1
        waits.append(plain)
        for _ in range(2):  # the probe, which loses again
            assert gate.allows(record, 1, K)
            gate.observe_speculative([(record, 1)], 1, 0.020)
    assert waits == [8, 32, 64, 64, 64]  # 16 less warm-up's 8, then doubling to the cap
    # A probe that pays puts the next wait back at probe_interval.
    gate.observe_plain([(record, 64)], 1, None)
    assert gate.allows(record, 1, K)
    for _ in range(2):
        gate.observe_speculative([(record, 8)], 1, 0.020)
    assert gate.allows(record, 1, K) and record.probe_after == 16


def test_each_batch_size_has_its_own_step_times():
    gate = SpeculationGate()
    record = warmed(gate, 2, 0.015, 0.010)  # 133/s against 100/s at batch 1
    assert gate.allows(record, 1, K)
    gate.observe_speculative([(GateRecord(), 2)] * 4, 4, 0.040)  # four 3-row verifies
    gate.observe_plain([(GateRecord(), 8)] * 4, 4, 8 * 0.012)
    assert not gate.allows(record, 4, K)  # 50/s against 83/s


def test_untimed_steps_and_one_slow_step_move_no_decision():
    gate = SpeculationGate()
    record = warmed(gate, 3, 0.020, 0.010)  # 150/s against 100/s
    for _ in range(20):  # untimed: the draft catching up, or prefill chunks in the step
        gate.observe_speculative([(record, 3)], 1, None)
        gate.observe_plain([(record, 8)], 1, None)
    gate.observe_plain([(record, 8)], 1, 8 * 0.030)  # and a plain burst 3x slower
    assert gate.allows(record, 1, K)
    gate = SpeculationGate()
    record = warmed(gate, 3, 0.020, 0.010)
    gate.observe_speculative([(record, 3)], 1, 0.5)  # one step held up 25 times over
    assert gate.allows(record, 1, K)


def test_no_probes_where_even_every_proposal_accepted_would_barely_pay():
    # K = 3: four tokens a 18 ms step at best, against 5 ms a token (1.11x): a probe could
    # find nothing worth its cost. At K = 6 (7 tokens, 1.94x) it probes.
    for k, probes in [(3, False), (6, True)]:
        gate = SpeculationGate(probe_interval=16)
        record = warmed(gate, 1, 0.018, 0.005)
        gate.observe_plain([(record, 1000)], 1, None)
        assert gate.allows(record, 1, k) is probes


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_figure_nothing_timed_for_refresh_s_is_measured_afresh_by_one_probe():
    # Warmed up on slow steps (3 tokens a 60 ms step against 8 ms a token), the request is
    # gated off, and a step with every proposal accepted (7 tokens at 8 ms) would not clear
    # the probe margin against that figure; only a speculative step times a speculative
    # step, so without the refresh speculation would stay off for good.
    clock = FakeClock()
    gate = SpeculationGate(probe_interval=16, refresh_s=60.0, clock=clock)
    record = warmed(gate, 3, 0.060, 0.008)
    other = GateRecord(tokens_per_step=3.0, plain_tokens=1000)
    for _ in range(8):
        gate.observe_plain([(record, 8), (other, 8)], 1, 8 * 0.008)
    clock.now = 59.0
    assert not gate.allows(record, 1, K)  # the margin rule stands within refresh_s
    clock.now = 61.0
    assert gate.allows(record, 1, K)  # a probe, whatever the margin
    assert not gate.allows(other, 1, K)  # one re-measuring probe at a time
    gate.observe_speculative([(record, 7)], 1, None)  # the draft caught up: not timed
    gate.observe_speculative([(record, 7)], 1, 0.020)  # the first timed step: afresh
    assert gate.spec_step_seconds.get(1) == 0.020
    assert all(gate.allows(record, 1, K) for _ in range(5))
    assert gate.allows(other, 1, K)  # 3 tokens a 20 ms step beat 8 ms a token
