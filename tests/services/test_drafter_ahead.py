"""Pipelining at the draft: proposals made ahead (ProposeEntry.ahead_of) are the ones the
draft makes once the coordinator commits what they assumed, and a draft rebuilt from the
log makes; the KV they leave behind is reused as far as the commit agrees with it."""

from __future__ import annotations

import pytest
from test_drafter_lazy_ingest import PROMPT, SAMPLED, CountingRunner

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.steps import DraftStep, IngestPlan, ProposeEntry
from specdec.runtime.sampling import Sampling

K = 4


def step(drafter: Drafter, ingest=(), propose=()):
    result = drafter.step(DraftStep(ingest=tuple(ingest), propose=tuple(propose)))
    assert not result.failed
    return result


def probs(proposal) -> list[tuple[list[int], list[float]]]:
    return [(q.token_ids.tolist(), q.probs.tolist()) for q in proposal.draft_probs or ()]


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_ahead_proposals_are_those_made_after_the_commit_and_by_a_rebuilt_draft(
    make_runner, sampling
):
    piped = Drafter(make_runner())
    (first,) = step(
        piped, [IngestPlan("r", 0, tuple(PROMPT))], [ProposeEntry("r", K, sampling)]
    ).proposals
    # While the target verifies `first`, the draft proposes for the step after it.
    ahead_entry = ProposeEntry("r", K, sampling, tuple(first.token_ids))
    (ahead,) = step(piped, propose=[ahead_entry]).proposals
    assert ahead.guessed_token_id is not None and len(ahead.token_ids) == K
    committed = [*first.token_ids, ahead.guessed_token_id]  # all accepted, bonus as guessed

    plain = Drafter(make_runner())
    step(plain, [IngestPlan("r", 0, tuple(PROMPT))], [ProposeEntry("r", K, sampling)])
    (after,) = step(
        plain, [IngestPlan("r", len(PROMPT), tuple(committed))], [ProposeEntry("r", K, sampling)]
    ).proposals
    rebuilt = Drafter(make_runner())
    log = (*PROMPT, *committed)
    (fresh,) = step(rebuilt, [IngestPlan("r", 0, log)], [ProposeEntry("r", K, sampling)]).proposals
    assert ahead.token_ids == after.token_ids == fresh.token_ids
    assert probs(ahead) == probs(after) == probs(fresh)
    assert bool(ahead.draft_probs) == (not sampling.greedy)


def test_an_ahead_guess_that_holds_is_committed_without_a_forward(make_runner):
    drafter = Drafter(CountingRunner(make_runner()))
    first_step = step(drafter, [IngestPlan("r", 0, tuple(PROMPT))], [ProposeEntry("r", K)])
    (first,) = first_step.proposals
    ahead_entry = ProposeEntry("r", K, ahead_of=tuple(first.token_ids))
    (ahead,) = step(drafter, propose=[ahead_entry]).proposals
    committed = (*first.token_ids, ahead.guessed_token_id)
    # The guess held: the next step commits it and proposes ahead of `ahead` in one call.
    # Only the last ahead proposal lacks KV; then the guess and K - 1 proposals are fed.
    before = drafter.runner.forward_tokens
    result = step(
        drafter,
        [IngestPlan("r", len(PROMPT), committed)],
        [ProposeEntry("r", K, ahead_of=tuple(ahead.token_ids))],
    )
    assert result.cached == {"r": len(PROMPT) + K + 1}
    assert drafter.runner.forward_tokens - before == 1 + 1 + (K - 1)


def test_a_missed_guess_keeps_the_agreeing_kv_and_proposes_as_a_rebuilt_draft(make_runner):
    drafter = Drafter(make_runner())
    (first,) = step(drafter, [IngestPlan("r", 0, tuple(PROMPT))], [ProposeEntry("r", K)]).proposals
    step(drafter, propose=[ProposeEntry("r", K, ahead_of=tuple(first.token_ids))])
    # The target accepted two proposals and then chose another token than the third.
    other = (first.token_ids[2] + 1) % drafter.runner.vocab_size
    committed = (*first.token_ids[:2], other)
    (again,) = step(
        drafter, [IngestPlan("r", len(PROMPT), committed)], [ProposeEntry("r", K)]
    ).proposals
    assert drafter.runner.seq_len("r") == len(PROMPT) + len(committed) + K - 1
    rebuilt = Drafter(make_runner())
    (fresh,) = step(
        rebuilt, [IngestPlan("r", 0, (*PROMPT, *committed))], [ProposeEntry("r", K)]
    ).proposals
    assert again.token_ids == fresh.token_ids


def test_ahead_of_past_max_model_len_is_refused_alone(make_runner):
    drafter = Drafter(make_runner(max_model_len=len(PROMPT) + 6))
    step(drafter, [IngestPlan("r", 0, tuple(PROMPT))])
    result = drafter.step(DraftStep(propose=(ProposeEntry("r", K, ahead_of=(1, 2)),)))
    assert "max_model_len" in str(result.failed["r"])
    assert drafter.num_committed("r") == len(PROMPT)


def test_greedy_proposals_from_one_c_call_equal_those_made_forward_by_forward(make_runner):
    def drafter(c_loop: bool) -> Drafter:
        runner = CountingRunner(make_runner(kv_cache_dtype="auto"))  # C loop: float32 cache
        if not c_loop:
            runner.decodes_greedy_in_c = False
            runner.decode_greedy = lambda *args: None
        return Drafter(runner)

    def proposals(d: Drafter) -> list[list[int]]:
        other = PROMPT[3:]
        plans = [IngestPlan("r", 0, tuple(PROMPT)), IngestPlan("s", 0, tuple(other))]
        first = step(d, plans, [ProposeEntry("r", K), ProposeEntry("s", K)]).proposals
        ahead = [ProposeEntry(p.request_id, K, ahead_of=tuple(p.token_ids)) for p in first]
        second = step(d, propose=ahead).proposals
        assert [d.runner.seq_len(rid) for rid in "rs"] == [len(PROMPT) + 2 * K, len(other) + 2 * K]
        return [p.token_ids for p in first + second] + [[p.guessed_token_id for p in second]]

    native, stepwise = drafter(True), drafter(False)
    assert proposals(native) == proposals(stepwise)
    # Forward by forward: one extend per pick after the first; one C call does the rest.
    assert native.runner.forward_tokens < stepwise.runner.forward_tokens


def branch_outcomes(branches, ahead_of) -> list[tuple[int, ...]]:
    """What each branch assumes the commit is: ahead_of[:accepted], then its guess."""
    return [
        (*ahead_of[: len(ahead_of) if b.ahead_accepted is None else b.ahead_accepted],
         b.guessed_token_id)
        for b in branches
    ]  # fmt: skip


def proposes_after(make_runner, log, committed, entry: ProposeEntry, **runner) -> list[int]:
    """What a draft that ingests ``log`` then ``committed`` proposes for ``entry``."""
    plain = Drafter(make_runner(num_pages=256, **runner))
    step(plain, [IngestPlan("r", 0, tuple(log))])
    (after,) = step(plain, [IngestPlan("r", len(log), committed)], [entry]).proposals
    return after.token_ids


@pytest.mark.parametrize("min_prob", [0.0, 0.3])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"], ids=["c-loop", "forwards"])
def test_each_branch_proposes_as_a_draft_that_saw_its_commit(make_runner, min_prob, kv_cache_dtype):
    runner = {"kv_cache_dtype": kv_cache_dtype}  # float32 KV: branches run in the C loop
    piped = Drafter(make_runner(**runner))
    (first,) = step(
        piped, [IngestPlan("r", 0, tuple(PROMPT))], [ProposeEntry("r", K, min_prob=min_prob)]
    ).proposals
    ahead_of = tuple(first.token_ids) if len(first.token_ids) >= 3 else (7, 99, 31, 5)
    entry = ProposeEntry("r", K, ahead_of=ahead_of, min_prob=min_prob, num_branches=4)
    branches = step(piped, propose=[entry]).proposals
    assert [b.ahead_accepted for b in branches] == [None, 0, 1, 2]
    plain_entry = ProposeEntry("r", K, min_prob=min_prob)
    for branch, committed in zip(branches, branch_outcomes(branches, ahead_of), strict=True):
        if branch.ahead_accepted is not None:  # a rejection's correction
            assert branch.guessed_token_id != ahead_of[branch.ahead_accepted]
        want = proposes_after(make_runner, PROMPT, committed, plain_entry, **runner)
        assert branch.token_ids == want
    # The draft goes on from whichever branch the commit follows, as a rebuilt draft does.
    for branch, committed in zip(branches, branch_outcomes(branches, ahead_of), strict=True):
        ahead_entry = ProposeEntry("r", K, ahead_of=tuple(branch.token_ids), min_prob=min_prob)
        kept = Drafter(make_runner(**runner))
        step(kept, [IngestPlan("r", 0, tuple(PROMPT))])
        step(kept, propose=[entry])
        result = step(kept, [IngestPlan("r", len(PROMPT), committed)], [ahead_entry])
        rebuilt = Drafter(make_runner(**runner))
        want = step(rebuilt, [IngestPlan("r", 0, (*PROMPT, *committed))], [ahead_entry])
        assert [(p.token_ids, p.guessed_token_id) for p in result.proposals] == [
            (p.token_ids, p.guessed_token_id) for p in want.proposals
        ]


def test_ahead_proposals_and_branches_look_up_as_a_fresh_proposal_does(make_runner):
    # Every token id occurs in the log, so prompt lookup (n = 1) finds each guess.
    log = [*PROMPT, *range(make_runner().vocab_size)]
    piped = Drafter(make_runner(num_pages=256))
    step(piped, [IngestPlan("r", 0, tuple(log))])
    lookup = {"prompt_lookup": (1, 1)}
    ahead_of = (7, 99, 31)
    entry = ProposeEntry("r", K, ahead_of=ahead_of, num_branches=4, **lookup)
    branches = step(piped, propose=[entry]).proposals
    assert [b.ahead_accepted for b in branches] == [None, 0, 1, 2]
    assert sum(b.looked_up for b in branches) >= 3
    plain_entry = ProposeEntry("r", K, **lookup)
    for branch, committed in zip(branches, branch_outcomes(branches, ahead_of), strict=True):
        assert branch.token_ids == proposes_after(make_runner, log, committed, plain_entry)


def test_branches_are_for_greedy_ahead_proposals_only(make_runner):
    drafter = Drafter(make_runner())
    step(drafter, [IngestPlan("r", 0, tuple(PROMPT))])
    sampled = ProposeEntry("r", K, SAMPLED, ahead_of=(7, 99), num_branches=3)
    assert len(step(drafter, propose=[sampled]).proposals) == 1
    plain = ProposeEntry("r", K, num_branches=3)
    assert len(step(drafter, propose=[plain]).proposals) == 1
    # At most one branch per ahead_of token, beside the all-accepted one.
    many = ProposeEntry("r", K, ahead_of=(7, 99), num_branches=9)
    assert [p.ahead_accepted for p in step(drafter, propose=[many]).proposals] == [None, 0, 1]


def test_branches_that_would_outlast_the_budget_are_dropped(make_runner):
    drafter = Drafter(make_runner())
    step(drafter, [IngestPlan("r", 0, tuple(PROMPT))])

    def branches(budget: float) -> list:
        entry = ProposeEntry("r", K, ahead_of=(7, 99, 31), num_branches=4, branch_budget_s=budget)
        return [p.ahead_accepted for p in step(drafter, propose=[entry]).proposals]

    assert branches(1e-9) == [None]  # only the all-accepted proposal
    assert branches(60.0) == [None, 0, 1, 2]
