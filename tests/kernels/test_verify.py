"""Greedy verification and lossless chain rejection sampling."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from kernels.sampling import logits_to_probs
from kernels.verify import chain_speculative_sampling, verify_greedy


def logits_with_argmax(tokens: list[int], vocab: int = 12, dtype=torch.float32) -> torch.Tensor:
    logits = torch.randn(len(tokens), vocab, generator=torch.Generator().manual_seed(1))
    logits[torch.arange(len(tokens)), tokens] = 10.0
    return logits.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_accepts_all_and_appends_bonus(dtype):
    assert verify_greedy(logits_with_argmax([7, 8, 9], dtype=dtype), [7, 8]) == ([7, 8, 9], 2)


def test_greedy_stops_at_first_mismatch_with_target_token():
    assert verify_greedy(logits_with_argmax([7, 5, 9]), [7, 8]) == ([7, 5], 1)
    assert verify_greedy(logits_with_argmax([3, 8, 9]), [7, 8]) == ([3], 0)


def test_greedy_with_k0_emits_one_target_token():
    assert verify_greedy(logits_with_argmax([4]), []) == ([4], 0)


def test_greedy_rejects_logits_of_wrong_length():
    with pytest.raises(ValueError, match="K \\+ 1"):
        verify_greedy(logits_with_argmax([1, 2]), [1, 2])


# Target p and a deliberately wrong draft q on an 8-token vocabulary.
P = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02])
Q = torch.tensor([0.02, 0.05, 0.08, 0.10, 0.10, 0.15, 0.20, 0.30])
K = 2
TRIALS = 20_000


def run_trials(seed: int) -> tuple[list[list[int]], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    proposals = torch.multinomial(Q, TRIALS * K, replacement=True, generator=gen)
    proposals = proposals.view(TRIALS, K).tolist()
    draft, target = Q.expand(K, -1), P.expand(K + 1, -1)
    results = [chain_speculative_sampling(draft, x, target, gen) for x in proposals]
    return [r[0] for r in results], [r[1] for r in results]


def expected_counts(n: int):
    p = P.double()
    return (p / p.sum() * n).numpy()


@pytest.fixture(scope="module")
def trials():
    return run_trials(seed=1234)


def test_chain_sampling_first_token_follows_target_distribution(trials):
    emitted, _ = trials
    counts = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=8)
    assert chisquare(counts.numpy(), expected_counts(TRIALS)).pvalue > 1e-3


def test_chain_sampling_token_after_accepted_one_follows_target(trials):
    emitted, accepted = trials
    second = [e[1] for e, n in zip(emitted, accepted, strict=True) if n >= 1]
    counts = torch.bincount(torch.tensor(second), minlength=8)
    assert chisquare(counts.numpy(), expected_counts(len(second))).pvalue > 1e-3


def test_chain_sampling_mean_accepted_matches_analytic_expectation(trials):
    _, accepted = trials
    alpha = float(torch.minimum(P, Q).sum())  # per-position acceptance probability = 0.53
    pmf = [1 - alpha, alpha * (1 - alpha), alpha**2]  # N = leading accepts out of K = 2
    mean = sum(n * pn for n, pn in enumerate(pmf))
    std = math.sqrt(sum((n - mean) ** 2 * pn for n, pn in enumerate(pmf)))
    observed = sum(accepted) / TRIALS
    assert abs(observed - mean) < 4 * std / math.sqrt(TRIALS)
    assert all(len(e) == n + 1 for e, n in zip(trials[0], accepted, strict=True))


def test_chain_sampling_is_reproducible_for_a_seed():
    draft = Q.expand(3, -1)
    target = P.expand(4, -1)
    runs = [
        [chain_speculative_sampling(draft, [7, 6, 5], target, g) for _ in range(50)]
        for g in (torch.Generator().manual_seed(9), torch.Generator().manual_seed(9))
    ]
    assert runs[0] == runs[1]


def test_chain_sampling_accepts_everything_when_draft_equals_target():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.1, 0.8]])
    tokens, n = chain_speculative_sampling(p[:1], [1], p, torch.Generator().manual_seed(0))
    assert n == 1 and tokens[0] == 1 and len(tokens) == 2


def test_logits_to_probs_applies_temperature_top_k_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.bfloat16)
    probs = logits_to_probs(logits, temperature=1.0)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.softmax(logits.float(), -1))
    top2 = logits_to_probs(logits, temperature=0.5, top_k=2)
    expected = torch.softmax(torch.tensor([4.0, 2.0]), -1)
    torch.testing.assert_close(top2[0, :2], expected)
    assert top2[0, 2:].tolist() == [0.0, 0.0]
    # softmax = [0.64, 0.24, 0.09, 0.03]: the first two reach 0.8, so top_p=0.8 keeps 2.
    nucleus = logits_to_probs(logits, temperature=1.0, top_p=0.8)
    assert (nucleus[0] > 0).tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match="temperature"):
        logits_to_probs(logits, temperature=0.0)
