"""The scheduler within KV pages: admission, chunk sizes, preemption and bursts."""

from __future__ import annotations

from test_coordinator_scheduler import apply, make_request, make_scheduler

from specdec.coordinator.engine.kv_pool import KVPool
from specdec.coordinator.engine.request import RequestStatus


def pool(num_free: int, num_pages: int = 1000, page_size: int = 4, name="target") -> KVPool:
    return KVPool(name, page_size, num_pages, num_free)


def test_growth_counts_new_pages_only():
    p = pool(10)
    assert (p.growth(0, 1), p.growth(4, 5), p.growth(5, 8), p.growth(8, 8)) == (1, 1, 0, 0)
    assert p.tokens_fitting(5, 2) == 11  # the rest of page 2, then two more pages


def test_a_waiting_request_is_admitted_only_when_its_first_chunk_and_a_watermark_fit():
    s = make_scheduler(target_pool=pool(num_free=6, num_pages=100))
    s.add(make_request("a", 40))  # 10 pages
    plan = s.schedule()
    assert plan is None and s.waiting[0].request_id == "a"  # not even partly: FCFS waits
    s.target_pool.num_free = 11  # 10 pages + the watermark of 1
    plan = s.schedule()
    assert [len(c.token_ids) for c in plan.prefills] == [40]
    assert s.target_pool.num_free == 1  # what the plan spent, until the target reports


def test_a_running_prefill_takes_the_pages_that_are_free():
    s = make_scheduler(target_pool=pool(num_free=11, num_pages=100))
    s.add(make_request("a", 20))
    apply(s.schedule())  # 20 tokens: 5 pages
    s.target_pool.num_free = 3
    request = s.running[0]
    request.num_target_cached, request.token_ids = 10, request.token_ids  # mid-prompt
    request.num_target_cached = 10
    plan = s.schedule()
    (chunk,) = plan.prefills
    assert (chunk.start, len(chunk.token_ids)) == (10, 10)  # pages 3..5: 10 tokens fit


def test_the_newest_request_is_preempted_for_an_older_ones_decode_and_resumes_unchanged():
    s = make_scheduler(target_pool=pool(num_free=100, num_pages=100))
    for rid in ("old", "new"):
        s.add(make_request(rid, 8))  # 2 pages each, exactly full
    apply(s.schedule())
    old, new = s.running
    s.target_pool.num_free = 0  # the next decode of each needs a third page
    plan = s.schedule()
    assert plan.preempted == [new] and not plan.prefills
    assert new.status is RequestStatus.WAITING and s.waiting[0] is new
    assert (new.num_target_cached, new.num_draft_cached, new.stats.num_preemptions) == (0, None, 1)
    # The engine releases it (2 pages back) and plans again: the old one decodes.
    s.target_pool.num_free = 2
    plan = s.schedule()
    assert [d.request for d in plan.decodes] == [old] and not plan.preempted
    apply(plan)
    # With room again, the preempted request prefills its whole log but its last token,
    # emitting nothing (it emitted its token before), then decodes on.
    s.target_pool.num_free = 100
    plan = s.schedule()
    (chunk,) = plan.prefills
    assert chunk.request is new and chunk.token_ids == new.token_ids[:-1]
    assert chunk.is_last and chunk.resumes
    apply(plan)
    assert not new.is_prefilling


def test_a_request_that_cannot_fit_beside_older_ones_preempts_itself():
    s = make_scheduler(target_pool=pool(num_free=100, num_pages=100))
    s.add(make_request("only", 8))
    apply(s.schedule())
    s.target_pool.num_free = 0
    plan = s.schedule()
    assert [r.request_id for r in plan.preempted] == ["only"]


def test_a_prefill_preempts_a_younger_decode_already_planned_and_gets_its_pages_back():
    s = make_scheduler(target_pool=pool(num_free=100, num_pages=100))
    s.add(make_request("old", 4))
    s.add(make_request("young", 4))
    apply(s.schedule())  # both prefilled: "young" decodes from now on
    old = s.running[0]
    old.token_ids, old.num_prompt_tokens = list(range(1, 17)), 16  # "old" mid-prompt
    s.target_pool.num_free = 0
    plan = s.schedule()
    assert [r.request_id for r in plan.preempted] == ["young"]
    assert not plan.decodes  # the younger decode left the plan, its pages given back


def test_the_draft_pool_counts_proposals_and_work_ahead():
    s = make_scheduler(target_pool=pool(num_free=100), draft_pool=pool(num_free=100, name="draft"))
    s.add(make_request("a", 8))
    apply(s.schedule())
    apply(s.schedule())
    request = s.running[0]
    # K = 3: the draft holds the committed tokens, then 2K + 1 more at most.
    need = s.draft_pool.growth(request.num_draft_cached, request.num_tokens + 7)
    s.draft_pool.num_free = need - 1
    plan = s.schedule()
    assert plan.preempted == [request]


def test_a_burst_is_as_long_as_the_target_pages_hold():
    s = make_scheduler(
        spec='{"num_speculative_tokens": 0}',
        num_scheduler_steps=8,
        target_pool=pool(num_free=100, num_pages=100),
    )
    s.add(make_request("a", 8))
    apply(s.schedule())  # holds 8 tokens (2 full pages), committed 9
    s.target_pool.num_free = 1  # 4 more tokens
    plan = s.schedule()
    assert plan.num_steps == 4 and plan.decodes[0].max_new_tokens == 4


def test_a_chunk_cut_by_the_budget_ends_on_a_page_so_the_next_can_hit_the_prefix_cache():
    s = make_scheduler(target_pool=pool(num_free=100, page_size=16), max_num_batched_tokens=50)
    s.add(make_request("a", 100))
    plan = s.schedule()
    assert [len(c.token_ids) for c in plan.prefills] == [48]
    apply(plan)
    assert [len(c.token_ids) for c in s.schedule().prefills] == [48]
