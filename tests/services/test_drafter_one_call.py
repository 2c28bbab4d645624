"""A greedy draft step feeds and picks in one path: every fed token but a proposer's last
through ``extend``, then the picks from that last token in one ``greedy_picks`` call. The
usual step of a decoding request feeds one token (the target's own after a rejection, or
the last proposal under verification when drafting ahead), so it runs no ``extend`` at
all. The C loop and the runner's forward-by-forward fallback give the same proposals,
guesses and KV."""

from __future__ import annotations

from test_drafter_lazy_ingest import PROMPT, CountingRunner

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.steps import DraftStep, IngestPlan, ProposeEntry

K = 4
OTHER = PROMPT[3:]


def make_drafter(make_runner, c_loop: bool) -> Drafter:
    runner = CountingRunner(make_runner(kv_cache_dtype="auto"))  # the C loop's float32 cache
    if not c_loop:
        runner.decode_greedy = lambda *args: None  # greedy_picks goes forward by forward
    return Drafter(runner)


def run(drafter: Drafter, make_runner) -> list[tuple]:
    """A decoding life of two requests; per step the proposals, guesses, cached lengths
    and the tokens ``extend`` fed."""
    held = {"r": 0, "s": 0}
    seen = []

    def step(ingest=(), propose=()):
        before = drafter.runner.forward_tokens
        result = drafter.step(DraftStep(ingest=tuple(ingest), propose=tuple(propose)))
        assert not result.failed
        for plan in ingest:
            held[plan.request_id] += len(plan.token_ids)
        lengths = [drafter.runner.seq_len(rid) for rid in "rs"]
        proposals = [(p.token_ids, p.guessed_token_id) for p in result.proposals]
        seen.append((proposals, lengths, drafter.runner.forward_tokens - before))
        return result.proposals

    def ingest(rid, tokens):
        return IngestPlan(rid, held[rid], tuple(tokens))

    prompts = [IngestPlan("r", 0, tuple(PROMPT)), IngestPlan("s", 0, tuple(OTHER))]
    first = step(prompts, [ProposeEntry("r", K), ProposeEntry("s", K)])
    # The target took two proposals of each, then a token of its own.
    fixes = {p.request_id: (*p.token_ids[:2], (p.token_ids[2] + 1) % 256) for p in first}
    second = step(
        [ingest(rid, tokens) for rid, tokens in fixes.items()],
        [ProposeEntry(rid, K) for rid in fixes],
    )
    # Drafting ahead of `second` while the target verifies it, then the guess holds.
    ahead = step(
        propose=[ProposeEntry(p.request_id, K, ahead_of=tuple(p.token_ids)) for p in second]
    )
    commits = {
        a.request_id: (*p.token_ids, a.guessed_token_id) for p, a in zip(second, ahead, strict=True)
    }
    # Ahead again, unsure: min_prob spares the guess and the first proposal only.
    cut = step(
        [ingest(rid, tokens) for rid, tokens in commits.items()],
        [ProposeEntry(a.request_id, K, ahead_of=tuple(a.token_ids), min_prob=0.999) for a in ahead],
    )
    assert [len(p.token_ids) for p in cut] == [1, 1]
    # A first pick below min_prob is proposed all the same, and alone.
    (unsure,) = step([ingest("r", (5,))], [ProposeEntry("r", K, min_prob=0.999)])
    assert len(unsure.token_ids) == 1
    (before_last,) = step([ingest("r", (6,))], [ProposeEntry("r", K)])
    # Every proposal taken, and a token of the target's: the last proposal is fed now.
    accepted = (*before_last.token_ids, 7)
    (last,) = step([ingest("r", accepted)], [ProposeEntry("r", K)])
    log = (*PROMPT, *fixes["r"], *commits["r"], 5, 6, *accepted)
    rebuilt = DraftStep(ingest=(IngestPlan("r", 0, log),), propose=(ProposeEntry("r", K),))
    (fresh,) = Drafter(make_runner(kv_cache_dtype="auto")).step(rebuilt).proposals
    assert last.token_ids == fresh.token_ids
    return seen


def test_one_token_steps_feed_and_pick_in_one_call_as_extend_and_the_c_loop_do(make_runner):
    one_call = run(make_drafter(make_runner, c_loop=True), make_runner)
    stepwise = run(make_drafter(make_runner, c_loop=False), make_runner)
    assert [s[:2] for s in one_call] == [s[:2] for s in stepwise]
    fed = [s[2] for s in one_call]
    # Only the prompts and a step feeding two tokens go through extend, all but the last.
    assert fed == [len(PROMPT) + len(OTHER) - 2, 0, 0, 0, 0, 0, 1]
    assert all(s[2] > 0 for s in stepwise)
