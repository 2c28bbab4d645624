"""Pipelining (--pipeline auto) changes when the draft works, never the output: greedy
output equals target-only output, and seeded sampled output equals the unpipelined
stack's token for token (the prepared proposals are the ones the draft would make)."""

from __future__ import annotations

from e2e_stack import running_stack

from specdec.client import GenerateParams, generate_concurrently

SPEC_CONFIG = '{"num_speculative_tokens": 4}'


def outputs(prompts: list, pipeline: str, **config) -> tuple[list[list[int]], list[dict]]:
    params = [GenerateParams(max_tokens=48, ignore_eos=True)] * 2 + [
        GenerateParams(max_tokens=48, temperature=0.8, top_k=30, seed=s, ignore_eos=True)
        for s in (5, 6)
    ]
    # Drafts that run to their K: work ahead follows only those, and --draft-p-min's
    # default cuts many of the tiny draft's.
    config = {"draft_p_min": 0.0, **config}
    with running_stack(speculative_config=SPEC_CONFIG, pipeline=pipeline, **config) as stack:
        # One at a time, so each runs at batch 1, where pipelining pays most.
        outs = [
            generate_concurrently(stack.address, [p], [q])[1][0]
            for p, q in zip(prompts, params, strict=True)
        ]
    return [o.token_ids for o in outs], [o.stats for o in outs]


def test_pipelined_output_equals_unpipelined_and_target_only_output(prompt_ids):
    prompts = prompt_ids[:4]
    piped, stats = outputs(prompts, "auto")
    # A target on threads of its own: the draft prepares branches (beside every verify).
    branched, _ = outputs(prompts, "auto", target_num_threads=1)
    plain, plain_stats = outputs(prompts, "off")
    assert piped == branched == plain
    with running_stack(no_draft=True) as stack:
        _, alone = generate_concurrently(
            stack.address, prompts[:2], GenerateParams(max_tokens=48, ignore_eos=True)
        )
    assert piped[:2] == [o.token_ids for o in alone]
    assert sum(s["num_ahead_used"] for s in stats) > 0
    assert all(s["num_ahead_proposals"] == 0 for s in plain_stats)
