"""Prompt lookup: where the log's last n tokens occurred before, a greedy proposal copies
what followed them, with no forward; the model's later proposals are those of a draft
that never looked anything up, and of one rebuilt from the log."""

from __future__ import annotations

import numpy as np
import pytest
from test_drafter_lazy_ingest import PROMPT, SAMPLED, CountingRunner

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.prompt_lookup import TokenHistory, check_ngram
from specdec.draft_service.steps import DraftStep, IngestPlan, ProposeEntry

LOOKUP = (3, 4)


def history(ids: list[int]) -> TokenHistory:
    h = TokenHistory()
    h.extend(ids)
    return h


def test_lookup_copies_what_followed_the_most_recent_longest_match():
    ids = [1, 2, 3, 4, 9, 9, 2, 3, 4, 7, 8, 5, 1, 2, 3, 4]
    # "1 2 3 4" (n = 4) occurred once, at the start: what followed it is copied.
    assert history(ids).propose((), (3, 4), 3) == [9, 9, 2]
    # Without n = 4, "2 3 4" matches twice: the most recent occurrence wins.
    assert history(ids).propose((), (3, 3), 5) == [7, 8, 5, 1, 2]
    # The tail itself never counts, nor a match with nothing after it.
    assert history([5, 6, 7]).propose((), (1, 3), 4) == []
    assert history([5, 6, 5]).propose((), (1, 1), 4) == [6, 5]
    # ``extra`` tokens count as part of the log, and are gone afterwards.
    h = history([1, 2, 3, 9, 4])
    assert h.propose((1, 2), (2, 2), 4) == [3, 9, 4, 1] and len(h) == 5
    assert history([1, 2, 3, 9]).propose((), (2, 4), 4) == []


def test_history_grows_past_its_buffer():
    h = TokenHistory()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, 1000).tolist()
    for i in range(0, 1000, 7):
        h.extend(ids[i : i + 7])
    assert len(h) == 1000
    tail = ids[-3:]
    starts = [s for s in range(997) if ids[s : s + 3] == tail and s + 3 < 1000]
    want = ids[starts[-1] + 3 : starts[-1] + 8] if starts else []
    assert h.propose((), (3, 3), 5) == want


@pytest.mark.parametrize(
    "ngram, ok", [((0, 0), True), ((1, 1), True), ((3, 40), True), ((0, 2), False), ((4, 3), False)]
)
def test_check_ngram(ngram, ok):
    assert (check_ngram(ngram) is None) == ok


REPEAT = [*PROMPT, *PROMPT[:5]]  # the prompt, then its first five tokens again


def test_a_looked_up_proposal_runs_no_forward_and_later_ones_match_a_plain_draft(make_runner):
    looking = Drafter(CountingRunner(make_runner()))
    result = looking.step(
        DraftStep(
            ingest=(IngestPlan("r", 0, tuple(REPEAT)),),
            propose=(ProposeEntry("r", 4, prompt_lookup=LOOKUP),),
        )
    )
    (proposal,) = result.proposals
    assert proposal.looked_up and proposal.token_ids == PROMPT[5:9]
    assert looking.runner.forward_tokens == 0  # the whole prompt waits, like a K = 0 ingest
    assert result.cached == {"r": len(REPEAT)}

    # Three accepted (and the target's next token): the repeat goes on, found in what
    # earlier steps committed.
    steps = [(*PROMPT[5:8], PROMPT[8]), (PROMPT[9], 250)]
    (again,) = looking.step(
        DraftStep(
            ingest=(IngestPlan("r", len(REPEAT), steps[0]),),
            propose=(ProposeEntry("r", 4, prompt_lookup=LOOKUP),),
        )
    ).proposals
    assert again.looked_up and again.token_ids == [*PROMPT[9:], *PROMPT[:2]]
    assert looking.runner.forward_tokens == 0
    # One accepted, then a target token that breaks the repeat: no n-gram matches, so the
    # model proposes, after one catch-up forward over the whole log.
    log = [*REPEAT, *steps[0], *steps[1]]
    (model,) = looking.step(
        DraftStep(
            ingest=(IngestPlan("r", len(log) - 2, steps[1]),),
            propose=(ProposeEntry("r", 4, prompt_lookup=LOOKUP),),
        )
    ).proposals
    assert not model.looked_up and len(model.token_ids) == 4
    assert looking.runner.forward_tokens >= len(log)
    assert looking.num_looked_up == 2

    plain = Drafter(make_runner())
    plain.step(DraftStep(ingest=(IngestPlan("r", 0, tuple(REPEAT)),)))
    for tokens in steps:
        start = plain.num_committed("r")
        (want,) = plain.step(
            DraftStep(ingest=(IngestPlan("r", start, tokens),), propose=(ProposeEntry("r", 4),))
        ).proposals
    rebuilt = Drafter(make_runner())
    (fresh,) = rebuilt.step(
        DraftStep(
            ingest=(IngestPlan("r", 0, tuple(log)),),
            propose=(ProposeEntry("r", 4, prompt_lookup=LOOKUP),),
        )
    ).proposals
    assert model.token_ids == want.token_ids == fresh.token_ids


@pytest.mark.parametrize("entry", ["sampled", "off"])
def test_sampled_and_unset_proposals_come_from_the_model(make_runner, entry):
    # The log ends in a repeat that a greedy lookup finds (the test above).
    drafter = Drafter(make_runner())
    drafter.step(DraftStep(ingest=(IngestPlan("r", 0, tuple(REPEAT)),)))
    propose = {
        "sampled": ProposeEntry("r", 4, SAMPLED, prompt_lookup=LOOKUP),
        "off": ProposeEntry("r", 4),
    }[entry]
    (proposal,) = drafter.step(DraftStep(propose=(propose,))).proposals
    assert not proposal.looked_up and len(proposal.token_ids) == 4
    assert drafter.num_looked_up == 0


def test_a_bad_lookup_setting_fails_only_its_request(make_runner):
    drafter = Drafter(make_runner())
    result = drafter.step(
        DraftStep(
            ingest=(IngestPlan("a", 0, tuple(REPEAT)), IngestPlan("b", 0, tuple(REPEAT))),
            propose=(
                ProposeEntry("a", 4, prompt_lookup=(4, 2)),
                ProposeEntry("b", 4, prompt_lookup=LOOKUP),
            ),
        )
    )
    assert set(result.failed) == {"a"} and "prompt_lookup_min" in str(result.failed["a"])
    assert [p.request_id for p in result.proposals] == ["b"] and drafter.num_committed("a") == 0
