"""Speculative-decoding counters, per request and in total (vLLM's definitions)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    """Counts of one request, or the totals over all requests.

    A "draft" is one verified proposal of K > 0 tokens; `accepted_per_position[i]` counts
    drafts whose token i was accepted. `num_k0_steps` counts decode steps verified without
    proposals. Totals are the sums of the per-request counts, except `num_steps`, which in
    the totals counts engine steps.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    num_k0_steps: int = 0
    num_ingest_plans: int = 0
    num_steps: int = 0
    step_seconds: float = 0.0  # totals only: wall time in engine steps
    num_ahead_proposals: int = 0  # prepared during the previous verify (pipelining)
    num_ahead_used: int = 0  # of those, used: the commit matched what they assumed
    num_lookup_drafts: int = 0  # proposals the draft found by prompt lookup (no forward)
    num_preemptions: int = 0  # KV released when the pools ran short, recomputed on resume
    num_cached_tokens: int = 0  # prompt tokens the target took from its prefix cache

    def observe_draft(
        self, num_draft_tokens: int, num_accepted: int, num_k0_steps: int = 1
    ) -> None:
        """One verified entry; `num_k0_steps`: the K = 0 forwards it covers (multi-step)."""
        if num_draft_tokens == 0:
            self.num_k0_steps += num_k0_steps
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_draft_tokens:
            self.accepted_per_position.extend(
                [0] * (num_draft_tokens - len(self.accepted_per_position))
            )
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts: tokens committed per verified draft, bonus included."""
        return 1.0 + (self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0)
