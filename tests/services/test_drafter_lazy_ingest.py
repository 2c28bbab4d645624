"""K = 0 steps cost the draft no forward (lazy ingest), and its proposals after a long
K = 0 stretch are those of eager ingest and of a draft rebuilt from the log; an ingest plan
marked eager (a prefill the coordinator drafts after) is computed in its own step."""

from __future__ import annotations

import random

import pytest

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.steps import DraftStep, IngestPlan, ProposeEntry
from specdec.runtime.model_runner import ModelRunner
from specdec.runtime.sampling import Sampling

PROMPT = [17, 203, 5, 88, 140, 61, 9, 230, 44, 101, 12]
SAMPLED = Sampling(temperature=1.2, top_p=0.95, seed=7)


class CountingRunner:
    """The runner, counting the tokens its forwards process (``forward_tokens``) and the
    tokens fed from outside, by a forward or as ``decode_greedy``'s first (``fed_tokens``)."""

    def __init__(self, runner) -> None:
        self._runner = runner
        self.forward_tokens = 0
        self.fed_tokens = 0

    def forward_chunks(self, chunks):
        self.forward_tokens += sum(len(c.token_ids) for c in chunks)
        self.fed_tokens += sum(len(c.token_ids) for c in chunks)
        return self._runner.forward_chunks(chunks)

    def extend(self, chunks):
        # The runner's own method over this wrapper, so its forwards are counted.
        return ModelRunner.extend(self, chunks)

    def decode_greedy(self, seq_ids, tokens, steps, min_prob=0.0, min_prob_from=0):
        picks = self._runner.decode_greedy(seq_ids, tokens, steps, min_prob, min_prob_from)
        self.fed_tokens += 0 if picks is None else len(tokens)
        return picks

    def greedy_picks(self, *args):
        # The runner's own method over this wrapper, so its calls are counted.
        return ModelRunner.greedy_picks(self, *args)

    def __getattr__(self, name):
        return getattr(self._runner, name)


def schedule(seed: int = 0) -> list[tuple[list[int], int]]:
    """(tokens committed this step, K): the prompt in three K = 0 chunks, 40 K = 0 decode
    steps, then rounds that propose 4 separated by K = 0 stretches of 1 to 12 steps."""
    rng = random.Random(seed)
    steps = [(PROMPT[:4], 0), (PROMPT[4:8], 0), (PROMPT[8:], 0)]
    steps += [([rng.randrange(256)], 0) for _ in range(40)]
    for _ in range(6):
        steps.append(([rng.randrange(256), rng.randrange(256)], 4))
        steps += [([rng.randrange(256)], 0) for _ in range(rng.randint(1, 12))]
    steps.append(([rng.randrange(256)], 4))
    return steps


def run(drafter: Drafter, sampling: Sampling, rebuild: bool = False) -> list[list[int]]:
    """Every proposal the drafter makes over ``schedule()``; with ``rebuild`` the request
    is released and ingested from its whole log before each proposal."""
    log: list[int] = []
    proposals = []
    for tokens, k in schedule():
        start = len(log)
        log += tokens
        if rebuild and k:
            drafter.release(["r"])
            plan = IngestPlan("r", 0, tuple(log))
        else:
            plan = IngestPlan("r", start, tuple(tokens))
        propose = (ProposeEntry("r", k, sampling),) if k else ()
        result = drafter.step(DraftStep(ingest=(plan,), propose=propose))
        assert not result.failed and result.cached == {"r": len(log)}
        proposals += [p.token_ids for p in result.proposals]
    return proposals


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_lazy_ingest_proposes_as_eager_ingest_and_a_rebuilt_draft(
    make_runner, kv_cache_dtype, sampling
):
    def drafter(lazy: bool) -> Drafter:
        return Drafter(CountingRunner(make_runner(kv_cache_dtype=kv_cache_dtype)), lazy)

    lazy, eager = drafter(True), drafter(False)
    got = run(lazy, sampling)
    assert len(got) == 7 and all(len(p) == 4 for p in got)
    assert got == run(eager, sampling) == run(drafter(True), sampling, rebuild=True)
    # Eager ingest ran a forward for every committed token; lazy ingest only for what the
    # proposals needed: the same tokens, in 7 catch-up forwards instead of 100-odd steps.
    committed = sum(len(tokens) for tokens, _ in schedule())
    assert eager.runner.fed_tokens >= committed
    assert lazy.runner.fed_tokens <= committed + 7 * 3


def test_a_request_finished_during_k0_never_costs_a_forward(make_runner):
    drafter = Drafter(CountingRunner(make_runner()))
    log = []
    for tokens, _ in schedule()[:43]:  # prompt and the K = 0 stretch, then it finishes
        drafter.step(DraftStep(ingest=(IngestPlan("r", len(log), tuple(tokens)),)))
        log += tokens
    assert drafter.num_committed("r") == len(log) and drafter.runner.seq_len("r") == 0
    assert drafter.release(["r"]) == 1
    assert drafter.runner.fed_tokens == 0


def test_an_eager_plan_is_computed_in_its_step_and_changes_no_proposal(make_runner):
    # A prefill at a batch size that drafts: the draft computes the prompt beside the
    # target's prefill, so the first proposal feeds one token, not the whole prompt.
    def first_proposal(eager: bool) -> tuple[list[int], CountingRunner]:
        runner = CountingRunner(make_runner())
        drafter = Drafter(runner)
        drafter.step(DraftStep(ingest=(IngestPlan("r", 0, tuple(PROMPT), eager),)))
        fed_in_prefill = runner.fed_tokens
        assert drafter.runner.seq_len("r") == (len(PROMPT) if eager else 0)
        step = DraftStep(
            ingest=(IngestPlan("r", len(PROMPT), (42,)),), propose=(ProposeEntry("r", 4),)
        )
        (proposal,) = drafter.step(step).proposals
        return proposal.token_ids, runner.fed_tokens - fed_in_prefill

    eager, fed_after_eager = first_proposal(True)
    lazy, fed_after_lazy = first_proposal(False)
    assert eager == lazy and len(eager) == 4
    assert fed_after_lazy - fed_after_eager == len(PROMPT)  # the prompt, fed earlier
