"""A draft that reads the target's features (EAGLE-style) through the stack: the features
travel from the target's verify to the draft's ingest, and the output stays the target's."""

from __future__ import annotations

import sys

from e2e_stack import running_stack, service_info, wait_until

from specdec.auth import INTERNAL_TOKEN_ENV
from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently
from specdec.launcher import ServiceProcess

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
        by_k = {}
        for k in (1, 3, 5):
            capped = GenerateParams(
                max_tokens=NEW_TOKENS, ignore_eos=True, num_speculative_tokens=k
            )
            _, by_k[k] = generate_concurrently(stack.address, prompts, capped)
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
        draft = next(p for p in stack.processes if p.name == "draft")
        with CoordinatorClient(stack.address) as client:
            stream = client.stream(prompt_ids[0], params, timeout=120)
            token_ids = list(next(stream).token_ids)
            draft.proc.kill()
            draft.proc.wait()
            token_ids += [t for out in stream for t in out.token_ids]
        assert token_ids == expected[0].token_ids
        port = stack.draft_address.rsplit(":", 1)[1]
        argv = [sys.executable, "-m", "specdec.draft_service", "--model", bundled_feature_draft,
                "--port", port]  # fmt: skip
        restarted = ServiceProcess(
            "draft", argv, echo=False, env={INTERNAL_TOKEN_ENV: stack.internal_token}
        )
        stack.processes.append(restarted)
        restarted.wait_ready(120)

        def drafts() -> int:
            return generate_concurrently(stack.address, prompt_ids[1:2], params)[1][0].stats[
                "num_drafts"
            ]

        assert wait_until(lambda: drafts() > 0, timeout=60)
        _, outs = generate_concurrently(stack.address, prompt_ids[1:2], params)
    assert outs[0].token_ids == expected[1].token_ids
