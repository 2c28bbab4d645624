"""Goodness of fit of sampled tokens against exact, per-sample distributions.

Each sample j has its own exact distribution (the target's, given that sample's prefix),
so the observed category counts are a sum of independent, non-identical categorical
draws. Their mean is ``sum_j P_j`` and their covariance ``sum_j diag(P_j) - P_j P_j^T``;
the Mahalanobis distance of the counts from that mean is chi-square with (categories - 1)
degrees of freedom for large samples. Categories are ranks under the exact distribution
(rank 0 = its most likely token), (previous token, token) pairs, or whether the sample
repeats its previous token: each keeps a 49k vocabulary to a few testable bins and sees
biases the others blur.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chi2, poisson

# Chi-square's tail is far too thin for a category expected only a few times (4 draws where
# 0.43 are expected scores 6e-8, where their chance is 1e-3): such categories are pooled
# and their count gets the Poisson tail of a sum of rare independent draws.
SPARSE_COUNT = 5.0


def rank_categories(
    probs: torch.Tensor, tokens: torch.Tensor, num_bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """``probs`` ``[N, V]``, ``tokens`` ``[N]`` -> (expected ``[N, num_bins]``, observed ``[N]``).

    Bin ``b < num_bins - 1`` is "the sample is the exact distribution's rank-b token"; the
    last bin pools every lower rank.
    """
    probs = probs.double()
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    expected = torch.cat(
        [ordered[:, : num_bins - 1], ordered[:, num_bins - 1 :].sum(-1, keepdim=True)], dim=-1
    )
    rank = (order == tokens[:, None]).double().argmax(-1)
    return expected.numpy(), rank.clamp(max=num_bins - 1).numpy()


def token_categories(
    probs: torch.Tensor, tokens: torch.Tensor, context: torch.Tensor, num_bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """Like :func:`rank_categories`, with bin ``b < num_bins - 1`` one (context, token) pair
    and the last bin every other pair. ``context`` ``[N]`` (e.g. the previous token) keeps
    a bias that only shows after particular prefixes from averaging out; the pairs are the
    ones with the largest expected counts over all samples."""
    probs = probs.double()
    contexts, which = torch.unique(context, return_inverse=True)
    mass = torch.zeros(len(contexts), probs.shape[1], dtype=torch.float64)
    mass.index_add_(0, which, probs)
    top = torch.topk(mass.flatten(), num_bins - 1).indices
    top_context, top_token = top // probs.shape[1], top % probs.shape[1]
    in_context = which[:, None] == top_context[None]
    picked = torch.where(in_context, probs[:, top_token], 0.0)
    expected = torch.cat([picked, (1.0 - picked.sum(-1, keepdim=True)).clamp(min=0.0)], dim=-1)
    hit = in_context & (tokens[:, None] == top_token[None])
    observed = torch.where(hit.any(-1), hit.double().argmax(-1), num_bins - 1)
    return expected.numpy(), observed.numpy()


def repeat_categories(
    probs: torch.Tensor, tokens: torch.Tensor, previous: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """Two bins: the sample repeats ``previous`` (its prefix's last token), or not. Draws
    that share a uniform with the previous token's draw show up here first."""
    repeat = probs.double().gather(-1, previous[:, None])
    expected = torch.cat([repeat, 1.0 - repeat], dim=-1)
    return expected.numpy(), (tokens != previous).long().numpy()


def categorical_fit_pvalue(expected: np.ndarray, observed: np.ndarray) -> float:
    """p-value of observed categories ``[N]`` under per-sample probabilities ``[N, B]``.

    Categories no sample can fall in are dropped. Those expected fewer than
    ``SPARSE_COUNT`` times are pooled; if the pool is still sparse, its count is tested
    against the Poisson upper tail, the rest (the pool merged into the likeliest
    category) by chi-square, and the smaller p-value doubled (Bonferroni).
    """
    expected = expected / expected.sum(-1, keepdims=True)
    num_bins = expected.shape[1]
    counts = np.bincount(observed, minlength=num_bins).astype(np.float64)
    live = expected.sum(0) > 1e-12
    if counts[~live].any():
        return 0.0  # a sample fell where the exact distribution has no mass
    expected, counts = expected[:, live], counts[live]
    sparse = expected.sum(0) < SPARSE_COUNT
    if not sparse.any():
        return chi_square_pvalue(expected, counts)
    pool, pool_count = expected[:, sparse].sum(-1, keepdims=True), counts[sparse].sum()
    expected = np.concatenate([expected[:, ~sparse], pool], axis=-1)
    counts = np.append(counts[~sparse], pool_count)
    if pool.sum() >= SPARSE_COUNT:
        return chi_square_pvalue(expected, counts)
    tail = float(poisson.sf(pool_count - 1, pool.sum()))
    dense = expected[:, :-1]
    if dense.shape[1] == 0:
        return tail
    likeliest = int(dense.sum(0).argmax())
    dense[:, likeliest] += pool[:, 0]
    dense_counts = counts[:-1].copy()
    dense_counts[likeliest] += pool_count
    return min(1.0, 2.0 * min(tail, chi_square_pvalue(dense, dense_counts)))


def chi_square_pvalue(expected: np.ndarray, counts: np.ndarray) -> float:
    """Mahalanobis distance of ``counts`` ``[B]`` from their mean under ``expected``
    ``[N, B]`` (rows summing to 1), chi-square with B - 1 degrees of freedom (the last
    category is dropped: the counts sum to N)."""
    expected, counts = expected[:, :-1], counts[:-1]
    if expected.shape[1] == 0:
        return 1.0
    mean = expected.sum(0)
    cov = np.diag(mean) - expected.T @ expected
    delta = counts - mean
    stat = float(delta @ np.linalg.pinv(cov) @ delta)
    return float(chi2.sf(stat, df=expected.shape[1]))
