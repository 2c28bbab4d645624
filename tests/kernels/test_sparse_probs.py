"""Compact draft distributions: small on the wire, and verification stays exact with them."""

from __future__ import annotations

import numpy as np
import torch
from sampling_stats import categorical_fit_pvalue

from specdec.kernels.random_stream import DRAFT_DOMAIN, PROPOSE_DRAW, TARGET_DOMAIN, RandomStream
from specdec.kernels.sampling import MAX_DRAFT_SUPPORT, SparseProbs
from specdec.kernels.verify import chain_speculative_sampling
from specdec.v1 import common_pb2

P_MIN = 1e-4  # seeded trials: each p-value is a fixed number


def test_a_49k_vocabulary_distribution_travels_in_under_16_kb():
    vocab = 49152
    q = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(0)), -1)
    sparse = SparseProbs.of(q)
    assert sparse.token_ids.numel() == MAX_DRAFT_SUPPORT
    message = common_pb2.SparseProbs(
        token_ids=sparse.token_ids.tolist(), probs=sparse.probs.tolist()
    )
    assert message.ByteSize() <= 16 * 1024 < q.numel() * 4
    # The most likely tokens, in ascending id order, renormalised.
    kept = sparse.token_ids
    assert bool((kept[1:] > kept[:-1]).all())
    dropped = torch.ones(vocab, dtype=torch.bool).index_fill_(0, kept, False)
    assert float(q[kept].min()) >= float(q[dropped].max())
    assert abs(float(sparse.probs.sum(dtype=torch.float64)) - 1.0) < 1e-6
    torch.testing.assert_close(sparse.probs, q[kept] / q[kept].sum())
    # A distribution with a small support keeps all of it, exactly.
    small = torch.zeros(vocab).index_fill_(0, torch.tensor([3, 70, 49151]), 1 / 3)
    assert SparseProbs.of(small).token_ids.tolist() == [3, 70, 49151]


def verified_tokens(send_what_was_sampled: bool, trials: int = 8000) -> list[int]:
    """K = 1 verification of a draft that samples from its q cut to 4 tokens and sends
    that q (or, as a planted defect, its uncut q)."""
    g = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(16, generator=g), -1)
    p = torch.softmax(torch.randn(2, 16, generator=g), -1)
    cut = SparseProbs.of(q, max_support=4)
    sent = cut.dense(16) if send_what_was_sampled else q
    first = []
    for t in range(trials):
        proposal = cut.sample(RandomStream(t, DRAFT_DOMAIN).uniform(10, PROPOSE_DRAW))
        tokens, _ = chain_speculative_sampling(
            sent[None], [proposal], p, RandomStream(t, TARGET_DOMAIN), 10
        )
        first.append(tokens[0])
    expected = p[0].double().expand(trials, -1).numpy()
    return categorical_fit_pvalue(expected, np.array(first))


def test_verifying_against_the_cut_distribution_gives_the_target_distribution():
    assert verified_tokens(send_what_was_sampled=True) > P_MIN


def test_sending_a_distribution_other_than_the_one_sampled_is_caught():
    assert verified_tokens(send_what_was_sampled=False) < 1e-12
