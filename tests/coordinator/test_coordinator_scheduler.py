"""Scheduler: budgets, chunked prefill, K selection, and the draft's ingest plans."""

from __future__ import annotations

import pytest

from specdec.coordinator.engine.config import SpeculativeConfig
from specdec.coordinator.engine.errors import ResourceExhausted
from specdec.coordinator.engine.request import Request, SamplingParams
from specdec.coordinator.engine.scheduler import Scheduler, StepPlan

EOS = frozenset({999})


def make_request(rid: str, prompt_len: int, max_tokens: int = 100, **kw) -> Request:
    return Request(rid, list(range(1, prompt_len + 1)), SamplingParams(), max_tokens, **kw)


def make_scheduler(spec: str = '{"num_speculative_tokens": 3}', **kw) -> Scheduler:
    args = dict(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=1000)
    args.update(kw)
    return Scheduler(SpeculativeConfig.from_json(spec), **args)


def apply(plan: StepPlan, accept_all: bool = False) -> None:
    """Plays the services: the draft ingests everything, the target verifies."""
    for ingest in plan.ingest:
        ingest.request.num_draft_cached = ingest.start + len(ingest.token_ids)
    for chunk in plan.prefills:
        chunk.request.num_target_cached = chunk.start + len(chunk.token_ids)
        if chunk.is_last and not chunk.resumes:
            chunk.request.commit([500], EOS, 1000)
    for entry in plan.decodes:
        r = entry.request
        n = 1 + (entry.k if accept_all else 0)
        r.commit([500] * n, EOS, 1000)
        r.num_target_cached = r.num_tokens - 1


def test_long_prompt_is_prefilled_in_chunks_within_the_token_budget():
    s = make_scheduler(max_num_batched_tokens=4)
    r = make_request("a", 10)
    s.add(r)
    chunks = []
    for _ in range(3):
        plan = s.schedule()
        assert plan.num_target_tokens <= 4
        assert not plan.decodes
        chunks += [(c.start, c.token_ids, c.is_last) for c in plan.prefills]
        apply(plan)
    assert chunks == [
        (0, [1, 2, 3, 4], False),
        (4, [5, 6, 7, 8], False),
        (8, [9, 10], True),
    ]
    assert r.num_output_tokens == 1 and not r.is_prefilling


def test_prefill_chunks_are_ingested_by_the_draft_with_the_same_tokens():
    s = make_scheduler(max_num_batched_tokens=4)
    r = make_request("a", 6)
    s.add(r)
    plan = s.schedule()
    assert [(p.start, p.token_ids) for p in plan.ingest] == [(0, [1, 2, 3, 4])]
    apply(plan)
    plan = s.schedule()
    assert [(p.start, p.token_ids) for p in plan.ingest] == [(4, [5, 6])]
    assert plan.propose == []


def test_max_num_seqs_caps_running_requests():
    s = make_scheduler(max_num_seqs=2)
    for i in range(3):
        s.add(make_request(str(i), 4))
    plan = s.schedule()
    assert [c.request.request_id for c in plan.prefills] == ["0", "1"]
    assert len(s.running) == 2 and len(s.waiting) == 1


def test_requests_join_between_steps_and_decodes_go_first():
    s = make_scheduler(max_num_batched_tokens=8)
    a = make_request("a", 4)
    s.add(a)
    apply(s.schedule())
    s.add(make_request("b", 20))
    plan = s.schedule()
    assert [d.request.request_id for d in plan.decodes] == ["a"]
    # a costs 1 + K = 4; b's chunk takes the rest of the budget.
    assert plan.decodes[0].k == 3
    assert [len(c.token_ids) for c in plan.prefills] == [4]


def test_per_batch_size_table_picks_k_from_the_number_of_running_requests():
    s = make_scheduler('{"num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 2, 0]]}')
    a = make_request("a", 4)
    s.add(a)
    apply(s.schedule())
    plan = s.schedule()
    assert plan.k == 3 and plan.decodes[0].k == 3
    apply(plan)
    s.add(make_request("b", 4))
    plan = s.schedule()
    assert plan.batch_size == 2 and plan.k == 0
    assert plan.decodes[0].k == 0 and plan.propose == []


def test_a_seeded_sampled_request_keeps_the_batch_size_1_k_whatever_runs_beside_it():
    s = make_scheduler('{"num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 8, 1]]}')
    seeded = SamplingParams(temperature=0.8, seed=7)
    a = Request("seeded", [1, 2, 3, 4], seeded, 100)
    b, c = make_request("b", 4), make_request("c", 4)
    for r in (a, b, c):
        s.add(r)
    apply(s.schedule())  # prefills
    s.max_num_batched_tokens = 7
    plan = s.schedule()
    ks = {d.request.request_id: d.k for d in plan.decodes}
    assert plan.batch_size == 3 and ks == {"seeded": 4, "b": 1}  # c waits: no budget left
    apply(plan)
    # An unseeded sampled request follows the batch's K.
    unseeded = Request("u", [1, 2], SamplingParams(temperature=0.8), 100)
    assert s.k_for(unseeded, plan.k) == 1


def test_k0_step_still_ingests_committed_tokens():
    s = make_scheduler('{"num_speculative_tokens": 0}')
    r = make_request("a", 4)
    s.add(r)
    apply(s.schedule())  # prefill: draft holds 4, output has one token
    for _ in range(3):
        plan = s.schedule()
        assert plan.decodes[0].k == 0 and plan.propose == []
        assert [(p.start, p.token_ids) for p in plan.ingest] == [
            (r.num_tokens - 1, [r.token_ids[-1]])
        ]
        apply(plan)
        assert r.num_draft_cached == r.num_tokens - 1  # behind by the token just committed


def test_ingest_is_eager_only_for_requests_the_batch_size_drafts_for():
    # The draft computes a prefill beside the target's only where the request will be
    # proposed for; at K = 0 batch sizes, or capped at K = 0, its tokens wait (lazy).
    s = make_scheduler('{"num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 2, 0]]}')
    a = make_request("a", 4)
    s.add(a)
    plan = s.schedule()
    assert [(p.request.request_id, p.eager) for p in plan.ingest] == [("a", True)]
    apply(plan)
    s.add(make_request("b", 4))
    s.add(make_request("c", 4, k_cap=0))
    plan = s.schedule()
    assert plan.batch_size == 3 and plan.k == 0
    assert [p.eager for p in plan.ingest] == [False, False, False]
    one = make_scheduler('{"num_speculative_tokens": 3}')
    one.add(make_request("d", 4, k_cap=0))
    assert [p.eager for p in one.schedule().ingest] == [False]


def test_request_cap_lowers_k():
    s = make_scheduler('{"num_speculative_tokens": 4}')
    r = make_request("a", 4, k_cap=1)
    s.add(r)
    apply(s.schedule())
    plan = s.schedule()
    assert plan.k == 4 and plan.decodes[0].k == 1
    assert [d.k for d in plan.propose] == [1]


def test_k_is_lowered_near_max_tokens_and_max_model_len():
    s = make_scheduler('{"num_speculative_tokens": 4}')
    r = make_request("a", 4, max_tokens=3)
    s.add(r)
    apply(s.schedule())  # one output token; two left, so at most K = 1
    assert s.schedule().decodes[0].k == 1
    s2 = make_scheduler('{"num_speculative_tokens": 4}', max_model_len=7)
    r2 = make_request("b", 4)
    s2.add(r2)
    apply(s2.schedule())  # committed 5 of 7: room for 2 tokens, K = 1
    assert s2.schedule().decodes[0].k == 1


def test_k_is_lowered_to_fit_the_token_budget():
    s = make_scheduler('{"num_speculative_tokens": 4}', max_num_batched_tokens=3)
    s.add(make_request("a", 3))
    apply(s.schedule())
    assert s.schedule().decodes[0].k == 2


def test_unknown_draft_state_releases_and_reingests_the_whole_log():
    s = make_scheduler()
    r = make_request("a", 4)
    s.add(r)
    apply(s.schedule())
    r.num_draft_cached = None
    plan = s.schedule()
    assert plan.draft_release == [r]
    assert [(p.start, p.token_ids) for p in plan.ingest] == [(0, r.token_ids)]
    assert [d.request for d in plan.propose] == [r]


def test_draft_unavailable_plans_k0_and_no_draft_work():
    s = make_scheduler()
    r = make_request("a", 4)
    s.add(r)
    apply(s.schedule())
    plan = s.schedule(draft_available=False)
    assert plan.k == 0 and plan.ingest == [] and plan.decodes[0].k == 0


def test_full_queue_refuses_new_requests():
    s = make_scheduler(max_queue_len=1)
    s.add(make_request("a", 4))
    with pytest.raises(ResourceExhausted):
        s.add(make_request("b", 4))


def decode_all(s: Scheduler, *requests: Request) -> None:
    """Admits and prefills the requests (one step each is enough at this budget)."""
    for r in requests:
        s.add(r)
    while any(r.is_prefilling for r in requests):
        apply(s.schedule())


def test_k0_decodes_run_several_target_forwards_capped_by_each_requests_room():
    s = make_scheduler('{"num_speculative_tokens": 0}', num_scheduler_steps=8)
    roomy, short = make_request("a", 5), make_request("b", 5, max_tokens=4)
    decode_all(s, roomy, short)
    plan = s.schedule()
    assert plan.num_steps == 8
    # "b" committed one token at its prefill: three more reach max_tokens.
    assert [(d.request.request_id, d.k, d.max_new_tokens) for d in plan.decodes] == [
        ("a", 0, 8),
        ("b", 0, 3),
    ]
    # The draft still gets every committed token, this step as in any other.
    ingest = [(p.request.request_id, p.start, p.token_ids) for p in plan.ingest]
    assert ingest == [("a", 5, [500]), ("b", 5, [500])]


@pytest.mark.parametrize("blocker", ["proposals", "prefill", "waiting"])
def test_multi_step_waits_for_steps_where_nothing_else_must_happen(blocker):
    k = 3 if blocker == "proposals" else 0
    spec = f'{{"num_speculative_tokens": {k}}}'
    s = make_scheduler(spec, num_scheduler_steps=8, max_num_seqs=1 if blocker == "waiting" else 2)
    decode_all(s, make_request("a", 5))
    if blocker != "proposals":
        s.add(make_request("b", 5))
    plan = s.schedule()
    assert plan.num_steps == 1
    assert all(d.max_new_tokens == 1 for d in plan.decodes)


def test_one_scheduler_step_is_the_default():
    s = make_scheduler('{"num_speculative_tokens": 0}')
    decode_all(s, make_request("a", 5))
    assert s.schedule().num_steps == 1
