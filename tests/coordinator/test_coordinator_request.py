"""Commit and stop conditions of a request."""

from __future__ import annotations

from specdec.coordinator.engine.request import Request, SamplingParams

EOS = frozenset({9})


def make(max_tokens: int = 10, **kw) -> Request:
    return Request("r", [1, 2, 3], SamplingParams(), max_tokens, **kw)


def test_eos_stops_and_drops_the_tokens_after_it():
    r = make()
    assert r.commit([5, 9, 6, 7], EOS, 100) == [5, 9]
    assert r.finish_reason == "stop" and r.output_ids == [5, 9]


def test_ignore_eos_keeps_going():
    r = make(ignore_eos=True)
    assert r.commit([5, 9, 6], EOS, 100) == [5, 9, 6]
    assert r.finish_reason is None


def test_stop_token_ids_stop_even_with_ignore_eos():
    r = make(ignore_eos=True, stop_token_ids=frozenset({6}))
    assert r.commit([9, 6, 7], EOS, 100) == [9, 6]
    assert r.finish_reason == "stop"


def test_max_tokens_truncates_a_step_and_ends_with_length():
    r = make(max_tokens=2)
    assert r.commit([5, 6, 7, 8], EOS, 100) == [5, 6]
    assert r.finish_reason == "length"


def test_max_model_len_ends_with_length():
    r = make()
    assert r.commit([5, 6, 7], EOS, 5) == [5, 6]
    assert r.finish_reason == "length" and r.num_tokens == 5
