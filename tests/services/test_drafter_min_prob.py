"""``ProposeEntry.min_prob`` (llama.cpp's --draft-p-min): the draft's proposals end before
the first one after the first it gives a probability below the threshold (the first is
always proposed). They are then exactly the first proposals of an uncut draft, and the
draft's cache stays in step with the log: the next step proposes what a draft rebuilt from
the log proposes."""

from __future__ import annotations

import pytest
import torch
from test_drafter_lazy_ingest import PROMPT, SAMPLED

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.steps import DraftStep, IngestPlan, ProposeEntry
from specdec.runtime.sampling import Sampling
from specdec.runtime.sequence import SequenceChunk

K = 8
# (KV cache dtype, sampling): the greedy picks after the first run in one C call with an
# auto cache and one forward at a time with an fp8 one; sampled picks always the latter.
CASES = [("auto", Sampling()), ("fp8", Sampling()), ("auto", SAMPLED)]
IDS = ["greedy-c-loop", "greedy-python", "sampled"]


def propose(drafter: Drafter, ingest: tuple[int, ...], start: int, sampling, min_prob=0.0):
    result = drafter.step(
        DraftStep(
            ingest=(IngestPlan("r", start, ingest),),
            propose=(ProposeEntry("r", K, sampling, min_prob=min_prob),),
        )
    )
    assert not result.failed
    return result.proposals[0]


def pick_probs(make_runner, kv, sampling, proposal) -> list[float]:
    """The draft's probability of each uncut proposal's likeliest token, from a fresh runner."""
    if not sampling.greedy:
        return [float(q.probs.max()) for q in proposal.draft_probs]
    runner = make_runner(kv_cache_dtype=kv)
    runner.open("p")
    ids = [*PROMPT, *proposal.token_ids[:-1]]
    logits = runner.extend([SequenceChunk("p", ids, len(proposal.token_ids))])[0]
    return torch.softmax(logits.float(), -1).max(-1).values.tolist()


@pytest.mark.parametrize(("kv", "sampling"), CASES, ids=IDS)
def test_cut_proposals_are_a_prefix_and_the_next_step_matches_a_rebuilt_draft(
    make_runner, kv, sampling
):
    uncut = propose(Drafter(make_runner(kv_cache_dtype=kv)), tuple(PROMPT), 0, sampling)
    assert len(uncut.token_ids) == K
    probs = pick_probs(make_runner, kv, sampling, uncut)
    # Thresholds halfway between two of the probabilities, one per cut inside the K.
    ranked = sorted(set(probs))
    cuts = {}
    for low, high in zip(ranked, ranked[1:], strict=False):
        threshold = (low + high) / 2
        cut = next(i for i, p in enumerate([*probs, 0.0]) if i and p < threshold)
        if cut < K and high - low > 1e-4:
            cuts.setdefault(cut, threshold)
    assert 1 in cuts, f"no threshold leaves one proposal: {probs}"
    for cut, threshold in cuts.items():
        check_cut(make_runner, kv, sampling, uncut, threshold, cut)


def check_cut(make_runner, kv, sampling, uncut, threshold, cut) -> None:
    drafter = Drafter(make_runner(kv_cache_dtype=kv))
    cut_proposal = propose(drafter, tuple(PROMPT), 0, sampling, threshold)
    assert cut_proposal.token_ids == uncut.token_ids[:cut]
    if not sampling.greedy:
        assert len(cut_proposal.draft_probs) == cut
    # The target accepts them all and adds a token; the next (uncut) proposals are a
    # rebuilt draft's.
    committed = (*cut_proposal.token_ids, (cut_proposal.token_ids[-1] + 1) % 256)
    after = propose(drafter, committed, len(PROMPT), sampling)
    rebuilt = Drafter(make_runner(kv_cache_dtype=kv))
    fresh = propose(rebuilt, (*PROMPT, *committed), 0, sampling)
    assert after.token_ids == fresh.token_ids
    assert drafter.runner.seq_len("r") == rebuilt.runner.seq_len("r")


@pytest.mark.parametrize(("kv", "sampling"), CASES, ids=IDS)
def test_a_first_proposal_below_the_threshold_is_proposed_alone(make_runner, kv, sampling):
    # Its forward is paid already and the target verifies one more token almost for free.
    uncut = propose(Drafter(make_runner(kv_cache_dtype=kv)), tuple(PROMPT), 0, sampling)
    threshold = 0.999
    assert pick_probs(make_runner, kv, sampling, uncut)[0] < threshold
    check_cut(make_runner, kv, sampling, uncut, threshold, 1)


def test_min_prob_must_be_below_one(make_runner):
    drafter = Drafter(make_runner(kv_cache_dtype="auto"))
    propose(drafter, tuple(PROMPT), 0, Sampling())
    result = drafter.step(DraftStep(propose=(ProposeEntry("r", K, min_prob=1.0),)))
    assert "min_prob" in str(result.failed["r"])
