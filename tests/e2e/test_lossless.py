"""Greedy speculative output equals target-only output, token for token."""

from __future__ import annotations

import pytest
import torch
from e2e_stack import TARGET, running_stack
from transformers import AutoModelForCausalLM

from coordinator.client import GenerateParams, generate_concurrently

NUM_PROMPTS = 8
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def hf_greedy(prompt_ids) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(TARGET, local_files_only=True).eval()
    outs = []
    with torch.no_grad():
        for ids in prompt_ids[:NUM_PROMPTS]:
            x = torch.tensor([ids])
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_greedy_spec_output_equals_target_only_for_k_1_3_5(kv_cache_dtype, prompt_ids, hf_greedy):
    prompts = prompt_ids[:NUM_PROMPTS]
    params = GenerateParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    with running_stack(
        kv_cache_dtype=kv_cache_dtype,
        speculative_config='{"num_speculative_tokens": 5}',
        with_baseline=True,
    ) as stack:
        _, target_only = generate_concurrently(stack.baseline_address, prompts, params)
        by_k = {}
        for k in (1, 3, 5):
            capped = GenerateParams(
                max_tokens=NEW_TOKENS, ignore_eos=True, num_speculative_tokens=k
            )
            _, by_k[k] = generate_concurrently(stack.address, prompts, capped)

    expected = [o.token_ids for o in target_only]
    assert all(len(ids) == NEW_TOKENS for ids in expected)
    for k, outs in by_k.items():
        assert [o.token_ids for o in outs] == expected, f"K={k} changed the output"
        drafted = sum(o.stats["num_draft_tokens"] for o in outs)
        accepted = sum(o.stats["num_accepted_tokens"] for o in outs)
        assert drafted > 0 and 0 < accepted <= drafted
        # No draft is ever longer than the K asked for.
        assert all(len(o.stats["accepted_per_position"]) <= k for o in outs)
    if kv_cache_dtype == "auto":
        assert expected == hf_greedy
