"""What one draft step asks and answers, as the drafter takes and gives them (no gRPC: the
servicer converts the messages)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.kernels.sampling import SparseProbs
from specdec.runtime.kv_scales import KVScaleTable
from specdec.runtime.sampling import Sampling


@dataclass(frozen=True)
class IngestPlan:
    """Committed tokens ``[start_position, start_position + len(token_ids))``; ``eager``:
    fed this step even with no proposal for the request (it is proposed for next).
    ``features``: for a draft that reads the target's features, ``[len(token_ids), hidden]``,
    the target's final hidden state at the position before each token (None: zeros)."""

    request_id: str
    start_position: int
    token_ids: tuple[int, ...]
    eager: bool = False
    features: torch.Tensor | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ProposeEntry:
    """K proposals after the committed log; with ``ahead_of`` (pipelining), after the log
    followed by ``ahead_of`` and the draft's own guess of the token the target adds next.
    ``min_prob`` > 0: the proposals end before the first after the first whose probability
    under the draft (its distribution after the request's sampling parameters) is below it.
    The first is always proposed: its forward is paid already, and the target verifies one
    more token at almost no cost.
    ``prompt_lookup`` (n_min, n_max), not (0, 0): a greedy proposal without ``ahead_of``
    first copies what followed the last earlier occurrence of the log's last n tokens
    (``prompt_lookup.TokenHistory.propose``), with no forward; the model proposes where
    no such n-gram occurred. ``num_branches`` > 1 with ``ahead_of``, greedy: also the
    proposals for ``ahead_of[a]`` rejected, a = 0, 1, ... (``Drafter._branches``)."""

    request_id: str
    num_tokens: int
    sampling: Sampling = Sampling()
    ahead_of: tuple[int, ...] = ()
    min_prob: float = 0.0
    prompt_lookup: tuple[int, int] = (0, 0)
    num_branches: int = 1
    branch_budget_s: float = 0.0  # > 0: the branches stop where the next would end later


@dataclass(frozen=True)
class DraftStep:
    """``kv_scales_version`` 0 means "the draft's current table"."""

    kv_scales_version: int = 0
    kv_scales: KVScaleTable | None = None
    ingest: tuple[IngestPlan, ...] = ()
    propose: tuple[ProposeEntry, ...] = ()


@dataclass(frozen=True)
class Proposal:
    request_id: str
    token_ids: list[int]
    draft_probs: list[SparseProbs] | None  # q of each proposed token when sampling
    guessed_token_id: int | None = None  # ahead proposals: the token guessed after ahead_of
    looked_up: bool = False  # copied from the log by prompt lookup, not drafted
    ahead_accepted: int | None = None  # a branch: ahead_of[:this] accepted, then the guess


@dataclass(frozen=True)
class DraftStepResult:
    proposals: list[Proposal]
    cached: dict[str, int]  # committed length held, per request ingested or proposed for
    failed: dict[str, Exception] = field(default_factory=dict)  # refused alone, unchanged
    num_free_pages: int = 0  # after the step: ``Drafter.num_free_pages``
