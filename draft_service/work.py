"""What the draft holds for each request (``HeldSequence``) and one request's part of a
step (``RequestWork``), shared by ``Drafter`` and its ``Proposing`` part."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.draft_service.prompt_lookup import TokenHistory
from specdec.kernels.random_stream import RandomStream
from specdec.runtime.sampling import Sampling


@dataclass
class HeldSequence:
    """What the draft holds for one request: KV = committed tokens - ``pending`` + ``tail``.

    ``tail`` are tokens past the committed length whose KV is cached: the draft's own
    proposals it fed itself, and when pipelining the ahead_of tokens and its guess; the
    next ingest keeps the part of it the coordinator committed. ``pending``
    are the last committed tokens whose KV is not computed yet (ingested at K = 0 steps:
    the next proposal computes them first; never both a tail and pending tokens).
    """

    kv_version: int
    num_committed: int = 0
    last_token: int = -1
    tail: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    # A feature-reading draft: the features of the pending tokens, and of the last
    # committed one (what feeding it again needs).
    pending_features: torch.Tensor | None = None
    last_feature: torch.Tensor | None = None
    stream: RandomStream | None = None  # the draft's own draws, made on the first sampled step
    history: TokenHistory = field(default_factory=TokenHistory)  # the committed ids


@dataclass
class RequestWork:
    """One request's part of this step, decided before any state changes."""

    request_id: str
    committed: tuple[int, ...] = ()  # tokens the plan adds to the committed log
    keep: int = 0  # KV length to truncate to before the ingest forward
    feed: list[int] = field(default_factory=list)  # tokens of the ingest forward
    pending: list[int] = field(default_factory=list)  # committed, KV left for later
    # A feature-reading draft: rows for committed, feed and pending (None elsewhere).
    committed_features: torch.Tensor | None = None
    feed_features: torch.Tensor | None = None
    pending_features: torch.Tensor | None = None
    num_tokens: int = 0  # K (0: ingest only)
    sampling: Sampling = Sampling()
    ahead_of: tuple[int, ...] = ()  # fed after the committed tokens, kept as tail
    min_prob: float = 0.0
    prompt_lookup: tuple[int, int] = (0, 0)
    looked_up: list[int] = field(default_factory=list)  # proposals found by prompt lookup
    num_branches: int = 1
    branch_budget_s: float = 0.0
    opens: bool = False
    eager: bool = False  # feed the ingested tokens now even with no picks

    @property
    def num_picks(self) -> int:
        """Tokens the propose loop picks: the K proposals, after a guess when ahead; none
        where prompt lookup found them."""
        if self.looked_up:
            return 0
        return self.num_tokens + (1 if self.ahead_of else 0)

    @property
    def uncut_picks(self) -> int:
        """Leading picks ``min_prob`` never cuts: the guess when ahead, and the first
        proposal."""
        return 2 if self.ahead_of else 1

    @property
    def argmax_picks(self) -> bool:
        """The proposals are the draft's argmax picks (``ModelRunner.greedy_picks``)."""
        return self.sampling.greedy and not self.sampling.reads_history
