"""Greedy verification and lossless chain rejection sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sampling_stats import categorical_fit_pvalue

from specdec.kernels.random_stream import (
    ACCEPT_DRAW,
    DRAFT_DOMAIN,
    PROPOSE_DRAW,
    TARGET_DOMAIN,
    RandomStream,
)
from specdec.kernels.sampling import logits_to_probs, sample_token
from specdec.kernels.verify import chain_speculative_sampling, verify_greedy


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


# Per-position target p and a deliberately different draft q on an 8-token vocabulary.
P = torch.tensor(
    [
        [0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02],
        [0.05, 0.05, 0.40, 0.20, 0.10, 0.10, 0.05, 0.05],
        [0.125] * 8,
        [0.02, 0.03, 0.05, 0.10, 0.10, 0.15, 0.25, 0.30],
    ]
)
Q = torch.tensor(
    [
        [0.02, 0.05, 0.08, 0.10, 0.10, 0.15, 0.20, 0.30],
        [0.30, 0.30, 0.10, 0.10, 0.05, 0.05, 0.05, 0.05],
        [0.50, 0.20, 0.10, 0.05, 0.05, 0.04, 0.03, 0.03],
    ]
)
K = 3
TRIALS = 20_000
FIRST = 100  # absolute position of the first proposal
P_MIN = 1e-4  # the trials are seeded, so each p-value is a fixed number, not a coin toss


def draft_tokens(stream: RandomStream, draw: int) -> list[int]:
    return [sample_token(Q[i], stream.uniform(FIRST + i, draw)) for i in range(K)]


def run_trials(device: str = "cpu", shared_stream: bool = False) -> tuple[list, list]:
    """Trial t: the draft proposes from its own stream with seed t (or, as a planted
    defect, from the target's acceptance draws), the target verifies."""
    draft, target = Q.to(device), P.to(device)
    emitted, accepted = [], []
    for t in range(TRIALS):
        target_stream = RandomStream(t, TARGET_DOMAIN)
        if shared_stream:
            proposals = draft_tokens(target_stream, ACCEPT_DRAW)
        else:
            proposals = draft_tokens(RandomStream(t, DRAFT_DOMAIN), PROPOSE_DRAW)
        tokens, n = chain_speculative_sampling(draft, proposals, target, target_stream, FIRST)
        emitted.append(tokens)
        accepted.append(n)
    return emitted, accepted


def fit(dist: torch.Tensor, tokens: list[int]) -> float:
    expected = dist.double().expand(len(tokens), -1).numpy()
    return categorical_fit_pvalue(expected, np.array(tokens))


def position_pvalues(emitted: list[list[int]]) -> list[float]:
    """Fit of the token emitted at each position (where the chain reached it) to p_i."""
    return [fit(P[i], [e[i] for e in emitted if len(e) > i]) for i in range(K + 1)]


@pytest.fixture(scope="module")
def trials():
    return run_trials()


def test_chain_sampling_emits_the_target_distribution_at_every_position(trials):
    emitted, _ = trials
    assert min(position_pvalues(emitted)) > P_MIN


def test_chain_sampling_resamples_the_residual_after_a_rejection(trials):
    emitted, accepted = trials
    for i in range(K):
        residual = torch.clamp(P[i] - Q[i], min=0.0)
        corrections = [e[i] for e, n in zip(emitted, accepted, strict=True) if n == i]
        assert len(corrections) > 500
        assert fit(residual, corrections) > P_MIN


def test_chain_sampling_bonus_token_follows_the_last_target_row(trials):
    emitted, accepted = trials
    bonus = [e[K] for e, n in zip(emitted, accepted, strict=True) if n == K]
    assert len(bonus) > 500
    assert fit(P[K], bonus) > P_MIN


def test_chain_sampling_acceptance_matches_the_analytic_rate(trials):
    emitted, accepted = trials
    assert all(len(e) == n + 1 for e, n in zip(emitted, accepted, strict=True))
    for i in range(K):
        alpha = float(torch.minimum(P[i], Q[i]).sum())
        reached = [n for n in accepted if n >= i]
        observed = sum(n > i for n in reached) / len(reached)
        assert abs(observed - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / len(reached))


def test_a_shared_draft_and_target_stream_is_caught_by_the_distribution_check():
    emitted, _ = run_trials(shared_stream=True)
    assert min(position_pvalues(emitted)) < 1e-12


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flashinfer_chain_sampling_emits_the_target_distribution_at_every_position():
    pytest.importorskip("flashinfer")
    emitted, accepted = run_trials(device="cuda")
    assert all(len(e) == n + 1 for e, n in zip(emitted, accepted, strict=True))
    assert min(position_pvalues(emitted)) > P_MIN


def test_chain_sampling_is_a_pure_function_of_the_stream_and_position():
    stream = RandomStream(9, TARGET_DOMAIN)
    again = [chain_speculative_sampling(Q, [7, 6, 5], P, stream, FIRST) for _ in range(2)]
    assert again[0] == again[1]
    by_position = [chain_speculative_sampling(Q, [7, 6, 5], P, stream, x) for x in range(40)]
    assert len({(tuple(tokens), n) for tokens, n in by_position}) > 3


def test_chain_sampling_accepts_everything_when_draft_equals_target():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.1, 0.8]])
    tokens, n = chain_speculative_sampling(p[:1], [1], p, RandomStream(0, TARGET_DOMAIN), 0)
    assert n == 1 and tokens[0] == 1 and len(tokens) == 2


def test_sample_token_inverts_the_cdf_and_never_picks_a_token_without_mass():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    assert [sample_token(probs, u) for u in (1e-9, 0.2499, 0.2501, 1 - 1e-16)] == [1, 1, 3, 3]
    assert sample_token(probs * 3, 0.5) == 3  # unnormalised weights are fine
    with pytest.raises(ValueError, match="no mass"):
        sample_token(torch.zeros(4), 0.5)


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
