"""What one target step asks and answers, as the verifier takes and gives them (no gRPC:
the servicer converts the messages)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.kernels.sampling import SparseProbs, TokenLogprobs
from specdec.runtime.errors import InvalidRequestError
from specdec.runtime.sampling import Sampling


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens from ``start_position``; ``is_last`` ends the prefill and emits the
    first generated token, unless the chunk ``resumes`` a preempted request (its committed
    log recomputed but the last token, whose token was emitted before)."""

    request_id: str
    start_position: int
    token_ids: tuple[int, ...]
    is_last: bool = False
    sampling: Sampling = Sampling()
    resumes: bool = False

    @property
    def emits(self) -> bool:
        return self.is_last and not self.resumes

    @property
    def num_logits(self) -> int:
        """Logits rows the chunk asks for: every token's for prompt logprobs, else the last
        one's when it emits."""
        if self.sampling.prompt_logprobs is not None:
            return len(self.token_ids)
        return int(self.emits)


@dataclass(frozen=True)
class VerifyEntry:
    """Verify ``[last_token_id, *proposal_ids]``; ``start_position`` is the last token's."""

    request_id: str
    start_position: int
    last_token_id: int
    proposal_ids: tuple[int, ...] = ()
    draft_probs: tuple[SparseProbs, ...] | None = None  # one per proposal; needed when sampling
    sampling: Sampling = Sampling()
    # Multi-step decoding (``Verifier.verify``'s num_steps > 1): at most this many tokens
    # (0 = num_steps), none after a stop token.
    max_new_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class VerifyResult:
    request_id: str
    token_ids: list[int]  # accepted proposals + the target's own token; [] mid-prefill
    num_accepted: int
    num_cached_tokens: int
    error: Exception | None = None  # this entry failed (nothing of it kept); others went on
    num_prefix_cached_tokens: int = 0  # of a prefill chunk: tokens taken from the prefix cache
    # With return_features: final hidden states [rows, hidden] of the positions computed and
    # kept, from feature_start (a verify: the last token's and the accepted proposals').
    features: torch.Tensor | None = None
    feature_start: int = 0
    # With sampling.logprobs set: one per token_ids entry, from the raw logits.
    logprobs: list[TokenLogprobs] | None = None
    # A prefill chunk with sampling.prompt_logprobs: its tokens' from prompt_logprobs_start.
    prompt_logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs_start: int = 0


def check_draft_probs(
    rid: str, rows: tuple[SparseProbs, ...], proposals: tuple[int, ...], vocab: int
) -> None:
    """Rejection sampling is exact only for the distributions the proposals were drawn
    from: each a probability vector over distinct in-vocabulary ids that gives its proposal
    a positive probability."""
    for i, row in enumerate(rows):
        ids = row.token_ids
        if ids.shape != row.probs.shape:
            raise InvalidRequestError(
                f"request {rid}: draft_probs {i} has {ids.numel()} token ids and "
                f"{row.probs.numel()} probs"
            )
        if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < vocab):
            raise InvalidRequestError(
                f"request {rid}: draft_probs {i} names a token id outside [0, {vocab})"
            )
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise InvalidRequestError(f"request {rid}: draft_probs {i} token ids must ascend")
    q = torch.stack([row.dense(vocab) for row in rows])
    if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
        raise InvalidRequestError(f"request {rid}: draft_probs must be finite and >= 0")
    sums = q.sum(-1, dtype=torch.float64)
    bad = torch.nonzero((sums - 1.0).abs() > 1e-3).flatten().tolist()
    if bad:
        raise InvalidRequestError(
            f"request {rid}: draft_probs row {bad[0]} sums to {float(sums[bad[0]]):.6g}, not 1"
        )
    picked = q[torch.arange(len(proposals)), torch.tensor(proposals)]
    zero = torch.nonzero(picked <= 0).flatten().tolist()
    if zero:
        raise InvalidRequestError(
            f"request {rid}: draft_probs gives proposal {zero[0]} (token "
            f"{proposals[zero[0]]}) probability 0; it cannot have been drawn from it"
        )
