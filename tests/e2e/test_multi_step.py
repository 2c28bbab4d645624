"""Multi-step decoding (--num-scheduler-steps) changes how many forwards one Verify runs,
never the output: greedy, seeded sampling, stop tokens and max_tokens end the same."""

from __future__ import annotations

from e2e_stack import running_stack

from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently


def outputs(prompts: list, num_scheduler_steps: int) -> list[list[int]]:
    """Target-only (every step K = 0). First one greedy request alone, then four at once:
    greedy with a max_tokens that is no multiple of the step count, seeded sampling with
    and without eos, and greedy stopping at a token the first request emitted."""
    with running_stack(no_draft=True, num_scheduler_steps=num_scheduler_steps) as stack:
        with CoordinatorClient(stack.address) as client:
            alone = client.generate(prompts[3], GenerateParams(max_tokens=40, ignore_eos=True))
        params = [
            GenerateParams(max_tokens=29, ignore_eos=True),
            GenerateParams(max_tokens=40, temperature=0.9, top_k=20, seed=3, ignore_eos=True),
            GenerateParams(max_tokens=40, temperature=1.2, seed=4),
            GenerateParams(max_tokens=40, stop_token_ids=(alone.token_ids[13],)),
        ]
        _, completions = generate_concurrently(stack.address, prompts, params)
    return [alone.token_ids] + [c.token_ids for c in completions]


def test_multi_step_output_equals_one_step_output(prompt_ids):
    one = outputs(prompt_ids[:4], num_scheduler_steps=1)
    many = outputs(prompt_ids[:4], num_scheduler_steps=8)
    assert many == one
    alone, greedy, sampled, _, stopped = one
    assert len(greedy) == 29 and len(sampled) == 40
    stop = alone[13]
    assert stopped == alone[: alone.index(stop) + 1]


def test_a_request_arriving_during_a_burst_starts_before_the_burst_would_have_ended(
    prompt_ids,
):
    """Bursts of 64 forwards: a request sent while one runs ends it (EndBurst), so the
    running request streams only a few more tokens before the newcomer's first token,
    not the rest of a 64-token burst."""
    long = GenerateParams(max_tokens=1500, ignore_eos=True)
    with (
        running_stack(no_draft=True, num_scheduler_steps=64) as stack,
        CoordinatorClient(stack.address) as first,
        CoordinatorClient(stack.address) as second,
    ):
        running = first.stream(prompt_ids[0], long)
        seen = 0
        for response in running:  # wait for a burst's tokens: the next burst is running
            seen += len(response.token_ids)
            if seen > 64:
                break
        late = second.stream(prompt_ids[1], GenerateParams(max_tokens=4))
        next(r for r in late if r.token_ids)
        gained = 0
        for response in running:  # what the running request streamed meanwhile
            gained += len(response.token_ids)
            break
        running.cancel()
    assert gained < 32, gained
