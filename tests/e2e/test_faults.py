"""Failures: a dying draft, client deadlines and cancellation, bad input."""

from __future__ import annotations

import os
import signal

import grpc
import pytest
from e2e_stack import (
    DRAFT,
    restart_draft,
    running_stack,
    service_info,
    stream_while_the_draft_dies,
    wait_until,
)

from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently


@pytest.fixture(scope="module")
def stack():
    with running_stack(speculative_config='{"num_speculative_tokens": 3}', with_baseline=True) as s:
        yield s


def test_a_killed_draft_means_k0_steps_then_a_restarted_draft_is_resynced(stack, prompt_ids):
    params = GenerateParams(max_tokens=96, ignore_eos=True)
    _, expected = generate_concurrently(stack.baseline_address, prompt_ids[:1], params)
    outputs = stream_while_the_draft_dies(stack, prompt_ids[0], params)
    token_ids = [t for out in outputs for t in out.token_ids]
    last = outputs[-1]
    assert token_ids == expected[0].token_ids
    assert last.stats.num_k0_steps > 0

    restart_draft(stack, DRAFT)
    # The coordinator re-ingests from its log once the draft answers: drafts resume.
    assert wait_until(
        lambda: generate_concurrently(stack.address, prompt_ids[1:2], params)[1][0].stats[
            "num_drafts"
        ]
        > 0,
        timeout=60,
    )
    _, outs = generate_concurrently(stack.address, prompt_ids[1:2], params)
    _, base = generate_concurrently(stack.baseline_address, prompt_ids[1:2], params)
    assert outs[0].token_ids == base[0].token_ids


def held_sequences(stack) -> tuple[int, int]:
    return (
        service_info(stack, draft=False).num_sequences,
        service_info(stack, draft=True).num_sequences,
    )


def test_deadline_and_cancellation_release_kv_on_both_services(stack, prompt_ids):
    params = GenerateParams(max_tokens=400, ignore_eos=True)
    with CoordinatorClient(stack.address) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.generate(prompt_ids[2], params, timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert wait_until(lambda: held_sequences(stack) == (0, 0))

        stream = client.stream(prompt_ids[3], params, timeout=60)
        next(stream)
        next(stream)
        assert held_sequences(stack)[0] == 1
        stream.cancel()
        assert wait_until(lambda: held_sequences(stack) == (0, 0))


@pytest.mark.parametrize(
    ("prompt", "params", "needle"),
    [
        ([1, 2, 10**6], GenerateParams(), "out of range"),
        ([], GenerateParams(), "empty prompt"),
        ([1, 2, 3], GenerateParams(max_tokens=10**6), "max_model_len"),
        ([1, 2, 3], GenerateParams(temperature=-1.0), "temperature"),
    ],
)
def test_bad_input_is_invalid_argument_and_the_stack_keeps_serving(stack, prompt, params, needle):
    with CoordinatorClient(stack.address) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.generate(prompt, params, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in err.value.details()
        ok = client.generate([1, 2, 3], GenerateParams(max_tokens=4, ignore_eos=True))
        assert len(ok.token_ids) == 4


def test_a_tiny_temperature_is_greedy_and_its_batch_neighbours_finish_unchanged(stack, prompt_ids):
    greedy = GenerateParams(max_tokens=24, ignore_eos=True)
    _, expected = generate_concurrently(stack.baseline_address, prompt_ids[:5], greedy)
    for temperature in (1e-38, 1e-45):
        tiny = GenerateParams(max_tokens=24, ignore_eos=True, temperature=temperature, top_k=3)
        _, outs = generate_concurrently(stack.address, prompt_ids[:5], [tiny] + [greedy] * 4)
        assert [o.token_ids for o in outs] == [e.token_ids for e in expected]


def test_a_stopped_draft_costs_one_deadline_not_one_per_step(stack, prompt_ids):
    """SIGSTOP: the draft neither answers nor closes its connections. The step that meets it
    waits one deadline; then the coordinator stops calling it until a probe answers."""
    draft = [p for p in stack.processes if p.name == "draft"][-1]  # restarted above
    coordinator = next(p for p in stack.processes if p.name == "coordinator")
    params = GenerateParams(max_tokens=64, ignore_eos=True)
    _, expected = generate_concurrently(stack.baseline_address, prompt_ids[4:5], params)
    failures_before = sum("draft failed step" in line for line in coordinator.lines)
    os.kill(draft.proc.pid, signal.SIGSTOP)
    try:
        _, outs = generate_concurrently(stack.address, prompt_ids[4:5], params)
        failures = sum("draft failed step" in line for line in coordinator.lines)
    finally:
        os.kill(draft.proc.pid, signal.SIGCONT)
    assert outs[0].token_ids == expected[0].token_ids
    assert failures - failures_before == 1  # one deadline, not one per step
    assert outs[0].stats["num_k0_steps"] > 10
    # Continued, the draft answers a probe and drafting resumes.
    assert wait_until(
        lambda: generate_concurrently(stack.address, prompt_ids[5:6], params)[1][0].stats[
            "num_drafts"
        ]
        > 0,
        timeout=60,
    )
