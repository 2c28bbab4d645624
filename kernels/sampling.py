"""Logits to sampling probabilities (temperature, top-k, top-p), always in float32; a draft's
compact distribution (``SparseProbs``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def logits_to_probs(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Float32 probabilities ``[N, V]`` from logits ``[N, V]`` of any float dtype.

    ``temperature`` must be > 0 (greedy is handled by the caller with argmax). Then, in
    vLLM's order: ``min_p`` drops the tokens less likely than ``min_p`` times the likeliest,
    ``top_k`` keeps the k likeliest, ``top_p`` the smallest set reaching that mass.
    ``min_p = 0``, ``top_k = 0`` and ``top_p = 1.0`` switch them off; filtered tokens get
    probability exactly 0 and the rest are renormalised. At least one token always stays.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    scores = logits.to(torch.float32) / temperature
    vocab = scores.shape[-1]
    if min_p > 0:
        # p < min_p * p_max  <=>  score < max score + log(min_p)
        floor = scores.max(dim=-1, keepdim=True).values + math.log(min_p)
        scores = scores.masked_fill(scores < floor, float("-inf"))
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the tokens strictly before it already reach top_p.
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.softmax(scores, dim=-1)


def sample_token(probs: torch.Tensor, u: float) -> int:
    """The token whose CDF interval ``[F(x-1), F(x))`` holds ``u * sum(probs)``.

    ``probs`` ``[V]`` is any non-negative vector (it need not be normalised); ``u`` is in
    (0, 1). Inverse-CDF sampling turns one uniform into one token, so the token is a pure
    function of the draw (see ``kernels.random_stream``); tokens of probability 0 are never
    picked. The CDF is accumulated in float64 so a 150k vocabulary loses no mass.
    """
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
    total = float(cdf[-1])
    if not total > 0.0:
        raise ValueError("cannot sample from a distribution with no mass")
    target = torch.tensor([u * total], dtype=torch.float64, device=cdf.device)
    index = int(torch.searchsorted(cdf, target, right=True))
    if index >= probs.shape[-1]:  # u * total rounded up to total: the last token with mass
        index = int(torch.nonzero(probs > 0)[-1])
    return index


# Tokens a draft distribution keeps (its most likely ones): at a 49k vocabulary an entry
# takes at most 7 bytes on the wire (a 3-byte id varint, a float32), so a proposed token's
# q stays under 16 KB where the dense row takes 196 KB.
MAX_DRAFT_SUPPORT = 2048


@dataclass(frozen=True)
class SparseProbs:
    """A distribution over part of the vocabulary: ``probs[i]`` at ``token_ids[i]`` (int64,
    ascending), 0 elsewhere; ``probs`` float32, summing to 1."""

    token_ids: torch.Tensor
    probs: torch.Tensor

    @classmethod
    def of(cls, q: torch.Tensor, max_support: int = MAX_DRAFT_SUPPORT) -> SparseProbs:
        """``q [V]`` cut to its ``max_support`` most likely tokens (all with mass when
        fewer), renormalised."""
        support = torch.nonzero(q > 0).flatten()
        if support.numel() > max_support:
            support = torch.sort(torch.topk(q, max_support).indices).values
        kept = q[support].to(torch.float64)
        return cls(support, (kept / kept.sum()).to(torch.float32))

    def sample(self, u: float) -> int:
        """The token ``sample_token`` draws with ``u`` from this distribution."""
        return int(self.token_ids[sample_token(self.probs, u)])

    def dense(self, vocab_size: int) -> torch.Tensor:
        """float32 ``[vocab_size]``."""
        return torch.zeros(vocab_size, dtype=torch.float32).index_copy_(
            0, self.token_ids, self.probs
        )


@dataclass(frozen=True)
class TokenLogprobs:
    """One emitted token's logprob and the ``top`` most likely tokens' (ids, logprobs)."""

    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


def token_logprobs(logits: torch.Tensor, tokens: list[int], num_top: int) -> list[TokenLogprobs]:
    """Row ``i`` of ``logits`` ``[len(tokens), V]`` scores ``tokens[i]``: its log-softmax
    (float32) at that token, and the ``num_top`` largest with their ids."""
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    index = torch.tensor(tokens, dtype=torch.int64, device=logits.device)
    picked = logprobs[torch.arange(len(tokens), device=logits.device), index].tolist()
    top_values, top_ids = logprobs.topk(num_top, dim=-1) if num_top else (None, None)
    return [
        TokenLogprobs(
            lp,
            tuple(top_ids[i].tolist()) if num_top else (),
            tuple(top_values[i].tolist()) if num_top else (),
        )
        for i, lp in enumerate(picked)
    ]
