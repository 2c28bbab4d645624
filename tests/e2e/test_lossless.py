"""Greedy speculative output equals target-only output, token for token, and transformers'.

Both pairs: the bundled tiny pair on held-out code prompts, and the real pair
(SmolLM2-135M-Instruct served from its Q4_1 GGUF, and its draft) on held-out chat prompts
sent as messages.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from e2e_stack import DRAFT, TARGET, greedy_by_k, running_stack

from specdec.client import GenerateParams, generate_concurrently
from specdec.config import REAL_DRAFT, REAL_TARGET
from specdec.launcher import held_out_prompts
from specdec.runtime.loader import load_hf_model

NEW_TOKENS = 40


def hf_greedy(target: str, prompt_ids: list[list[int]]) -> list[list[int]]:
    """transformers' greedy output (a GGUF target: transformers' own GGUF loader)."""
    model = load_hf_model(target)
    outs = []
    with torch.no_grad():
        for ids in prompt_ids:
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


def real_pair_prompts() -> tuple[list, list[list[int]]]:
    """Four held-out chat prompts as messages, and as the ids transformers renders."""
    if not (
        Path(REAL_TARGET, "config.json").is_file() and Path(REAL_DRAFT, "config.json").is_file()
    ):
        pytest.skip("the real pair is not here: run scripts/fetch_models.py")
    from transformers import AutoTokenizer

    chats = held_out_prompts(str(REAL_TARGET), 4)
    tokenizer = AutoTokenizer.from_pretrained(str(REAL_TARGET))
    ids = [
        list(tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=False))
        for c in chats
    ]
    return chats, ids


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def pair(request, prompt_ids):
    """(target, draft, prompts as sent, transformers' greedy output for them)."""
    if request.param == "tiny":
        prompts = ids = prompt_ids[:8]
        return TARGET, DRAFT, prompts, hf_greedy(TARGET, ids)
    chats, ids = real_pair_prompts()
    return str(REAL_TARGET), str(REAL_DRAFT), chats, hf_greedy(str(REAL_TARGET), ids)


@pytest.mark.parametrize(
    "kv_cache_dtype, dtype", [("auto", "float32"), ("fp8", "float32"), ("auto", "float16")]
)
def test_greedy_spec_output_equals_target_only_for_k_1_3_5(kv_cache_dtype, dtype, pair):
    target, draft, prompts, hf_outputs = pair
    params = GenerateParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    with running_stack(
        target_model=target,
        draft_model=draft,
        kv_cache_dtype=kv_cache_dtype,
        dtype=dtype,
        # Prompt lookup on: a step's proposals come from the log where its tail repeats,
        # from the draft model elsewhere; both must leave the output unchanged.
        speculative_config=(
            '{"num_speculative_tokens": 5, "prompt_lookup_min": 3, "prompt_lookup_max": 4}'
        ),
        with_baseline=True,
    ) as stack:
        _, target_only = generate_concurrently(stack.baseline_address, prompts, params)
        by_k = greedy_by_k(stack, prompts, NEW_TOKENS, (1, 3, 5))

    expected = [o.token_ids for o in target_only]
    assert all(len(ids) == NEW_TOKENS for ids in expected)
    for k, outs in by_k.items():
        assert [o.token_ids for o in outs] == expected, f"K={k} changed the output"
        drafted = sum(o.stats["num_draft_tokens"] for o in outs)
        accepted = sum(o.stats["num_accepted_tokens"] for o in outs)
        assert drafted > 0 and 0 < accepted <= drafted
        # No draft is ever longer than the K asked for.
        assert all(len(o.stats["accepted_per_position"]) <= k for o in outs)
    lookups = sum(o.stats["num_lookup_drafts"] for outs in by_k.values() for o in outs)
    drafts = sum(o.stats["num_drafts"] for outs in by_k.values() for o in outs)
    assert 0 < lookups < drafts
    if (kv_cache_dtype, dtype) == ("auto", "float32"):
        assert expected == hf_outputs


def test_greedy_output_is_unchanged_while_the_gate_turns_speculation_off_and_on(pair):
    """The stack's default gate: speculative steps, plain multi-step bursts on every core,
    the draft catching up on what it ingested lazily, and back."""
    target, draft, prompts, _ = pair
    params = GenerateParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    with running_stack(
        target_model=target,
        draft_model=draft,
        speculative_config='{"num_speculative_tokens": 5}',
        speculative_gate="goodput",
        with_baseline=True,
    ) as stack:
        _, target_only = generate_concurrently(stack.baseline_address, prompts, params)
        _, outs = generate_concurrently(stack.address, prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in target_only]
    # The warm-up's speculative steps, then at least the plain burst that times plain
    # decoding.
    assert sum(o.stats["num_drafts"] for o in outs) > 0
    assert sum(o.stats["num_k0_steps"] for o in outs) > 0
