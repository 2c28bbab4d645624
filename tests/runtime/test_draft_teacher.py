"""The draft's teacher (``scripts/draft_teacher.py``): a batched Llama forward of its own.

Run in float32 on a tiny random Llama it must give what the project's runtime gives: the
same greedy answers token for token and the same top-k log-probs at every prompt and
answer position, across a ragged batch (padding, per-sequence positions and KV slots);
its sampled answers must follow the runtime's distribution at the temperature asked.
"""

from __future__ import annotations

import pytest
import torch
from draft_teacher import Teacher, TeacherSequence, cached_answers, generate, top_k
from runtime_helpers import greedy, prefill
from sampling_stats import categorical_fit_pvalue, rank_categories

from specdec.runtime import ModelRunner

PROMPTS = [[5, 17, 42, 99, 3], [7, 8], [200, 11, 12, 13, 14, 15, 16, 30, 31]]


@pytest.fixture(scope="module")
def models(llama_path) -> tuple[Teacher, ModelRunner]:
    return Teacher(llama_path, dtype=torch.float32), ModelRunner.from_pretrained(
        llama_path, num_pages=64
    )


def test_greedy_answers_and_log_probs_equal_the_runtime_on_a_ragged_batch(models):
    teacher, runner = models
    seqs = generate(teacher, PROMPTS, [False] * 3, 12, 1.0, 8, torch.Generator())
    for n, (prompt, seq) in enumerate(zip(PROMPTS, seqs, strict=True)):
        answer = greedy(runner, f"greedy-{n}", prompt, 12)
        runner.release(f"greedy-{n}")
        assert seq.prompt_len == len(prompt) and seq.token_ids == prompt + answer
        logits = prefill(runner, f"scores-{n}", seq.token_ids[:-1])
        runner.release(f"scores-{n}")
        ids, logprobs = top_k(logits, 8)
        assert seq.top_ids.shape == (len(seq.token_ids) - 1, 8)
        assert torch.equal(seq.top_ids[:, 0], ids[:, 0])
        torch.testing.assert_close(seq.top_logprobs.float(), logprobs.float(), atol=2e-3, rtol=0)
        # A greedy answer's every token is the argmax kept before it.
        assert seq.top_ids[len(prompt) - 1 :, 0].tolist() == answer


def test_sampled_first_tokens_follow_the_tempered_distribution(models):
    teacher, runner = models
    prompt, temperature, num = PROMPTS[0], 0.7, 3000
    logits = prefill(runner, "dist", prompt)[-1]
    runner.release("dist")
    probs = torch.softmax(logits / temperature, dim=-1)
    gen = torch.Generator().manual_seed(1)
    seqs = generate(teacher, [prompt] * num, [True] * num, 1, temperature, 4, gen)
    tokens = torch.tensor([s.token_ids[len(prompt)] for s in seqs])
    expected, observed = rank_categories(probs.expand(num, -1), tokens, num_bins=12)
    assert categorical_fit_pvalue(expected, observed) > 1e-3


def test_a_resumed_run_reuses_the_answers_to_the_prompts_it_still_asks(tmp_path):
    path = tmp_path / "teacher.pt"
    assert cached_answers(path) == {}
    top = torch.zeros(len(PROMPTS[1]) + 1, 1, dtype=torch.int32)
    answer = TeacherSequence(PROMPTS[1] + [4, 9], len(PROMPTS[1]), False, top, top.half())
    torch.save([answer], path)
    cache = cached_answers(path)
    assert list(cache) == [tuple(PROMPTS[1])]
    assert cache[tuple(PROMPTS[1])].token_ids == answer.token_ids
    assert tuple(PROMPTS[0]) not in cache
