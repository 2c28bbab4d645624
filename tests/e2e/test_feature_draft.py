"""A draft that reads the target's features (EAGLE-style) through the stack: the features
travel from the target's verify to the draft's ingest, and the output stays the target's."""

from __future__ import annotations

from e2e_stack import (
    greedy_by_k,
    restart_draft,
    running_stack,
    service_info,
    stream_while_the_draft_dies,
    wait_until,
)

from specdec.client import GenerateParams, generate_concurrently

NEW_TOKENS = 40


def test_greedy_output_equals_target_only_with_features(bundled_feature_draft, prompt_ids):
    prompts = prompt_ids[:6]
    params = GenerateParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    with running_stack(
        draft_model=bundled_feature_draft,
        speculative_config='{"num_speculative_tokens": 5}',
        with_baseline=True,
    ) as stack:
        info = service_info(stack, draft=True)
        _, target_only = generate_concurrently(stack.baseline_address, prompts, params)
        by_k = greedy_by_k(stack, prompts, NEW_TOKENS, (1, 3, 5))
    assert info.reads_target_features and info.hidden_size == 256
    expected = [o.token_ids for o in target_only]
    for k, outs in by_k.items():
        assert [o.token_ids for o in outs] == expected, f"K={k} changed the output"
        # Untrained, it proposes what the target rarely accepts; it proposes every step.
        assert sum(o.stats["num_draft_tokens"] for o in outs) >= k * NEW_TOKENS // 2


def test_a_restarted_feature_draft_is_rebuilt_from_the_coordinators_features(
    bundled_feature_draft, prompt_ids
):
    params = GenerateParams(max_tokens=64, ignore_eos=True)
    with running_stack(
        draft_model=bundled_feature_draft,
        speculative_config='{"num_speculative_tokens": 3}',
        with_baseline=True,
    ) as stack:
        _, expected = generate_concurrently(stack.baseline_address, prompt_ids[:2], params)
        outputs = stream_while_the_draft_dies(stack, prompt_ids[0], params)
        assert [t for out in outputs for t in out.token_ids] == expected[0].token_ids
        restart_draft(stack, bundled_feature_draft)

        def drafts() -> int:
            return generate_concurrently(stack.address, prompt_ids[1:2], params)[1][0].stats[
                "num_drafts"
            ]

        assert wait_until(lambda: drafts() > 0, timeout=60)
        _, outs = generate_concurrently(stack.address, prompt_ids[1:2], params)
    assert outs[0].token_ids == expected[1].token_ids
