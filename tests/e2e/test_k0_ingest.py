"""The vllm-metal #716 scenario: K = 0 steps must still feed the draft.

Two 384-token prompts run together with max_num_batched_tokens 128 and the schedule
[[1,1,3],[2,2,0]]: K = 0 while both run, K = 3 once the short one has finished.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from e2e_stack import running_stack, service_info

from specdec.client import (
    Completion,
    CoordinatorClient,
    GenerateParams,
    generate_concurrently,
)
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

SCHEDULE = '{"num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 2, 0]]}'
PROMPT_LEN = 384
MAX_TOKENS = [24, 96]  # the first finishes early, the second goes on alone with K = 3


@pytest.fixture(scope="module")
def long_prompts(tokenizer, heldout) -> list[list[int]]:
    ids = [tokenizer.encode(t).ids for t in heldout["texts"]]
    long = [x[:PROMPT_LEN] for x in ids if len(x) >= PROMPT_LEN]
    assert len(long) >= 2, "need two held-out texts of 384+ tokens"
    return long[:2]


def run_in_order(address: str, prompts: list, params: list) -> list[Completion]:
    """The first request, then the second once the first has been scheduled.

    Arrival order decides which prompt is prefilled first, and with it the whole schedule;
    a fixed order makes two runs (here: the incremental and the rebuilt draft) comparable.
    The second arrives while the first is still prefilling (3 steps of 128 tokens), so the
    two run together from the second's first chunk on.
    """
    outs: list[Completion | None] = [None, None]

    def run(i: int) -> None:
        with CoordinatorClient(address) as client:
            outs[i] = client.generate(prompts[i], params[i], timeout=300)

    with CoordinatorClient(address) as client:
        steps = client.totals().num_steps
        first = threading.Thread(target=run, args=(0,))
        first.start()
        while client.totals().num_steps == steps and first.is_alive():
            time.sleep(0.002)
        second = threading.Thread(target=run, args=(1,))
        second.start()
    first.join()
    second.join()
    assert all(outs), "a request failed"
    return outs


def run_pair(long_prompts, **stack_overrides):
    params = [GenerateParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    with running_stack(
        speculative_config=SCHEDULE, max_num_batched_tokens=128, **stack_overrides
    ) as stack:
        before = service_info(stack, draft=True).num_ingest_plans
        outs = run_in_order(stack.address, long_prompts, params)
        plans_seen_by_draft = service_info(stack, draft=True).num_ingest_plans
        baseline = None
        if stack.baseline_address:
            _, baseline = generate_concurrently(stack.baseline_address, long_prompts, params)
    return outs, plans_seen_by_draft - before, baseline


def test_k0_steps_still_ingest_and_acceptance_matches_a_rebuilt_draft(long_prompts):
    outs, plans_seen_by_draft, target_only = run_pair(long_prompts, with_baseline=True)
    control, _, _ = run_pair(long_prompts, draft_rebuild_every_step=True)

    short, long = outs
    assert short.stats["num_k0_steps"] > 0 and long.stats["num_k0_steps"] > 0
    assert short.stats["num_drafts"] == 0  # it never ran alone
    assert long.stats["num_drafts"] > 0  # K = 3 once alone
    for out in outs:
        # Every step of every request carried an ingest plan: prefill chunks, K = 0 steps
        # (the #716 bug) and K > 0 steps alike, as the draft itself counted.
        assert out.stats["num_ingest_plans"] == out.stats["num_steps"]
    assert plans_seen_by_draft == sum(o.stats["num_ingest_plans"] for o in outs)

    # Acceptance after K > 0 resumes equals a draft rebuilt from the log before every
    # proposal: the incrementally kept cache was not stale.
    assert long.stats["accepted_per_position"] == control[1].stats["accepted_per_position"]
    assert long.stats["num_accepted_tokens"] == control[1].stats["num_accepted_tokens"]
    assert [o.token_ids for o in outs] == [o.token_ids for o in target_only]
    assert [o.token_ids for o in control] == [o.token_ids for o in target_only]


def test_a_coordinator_that_skips_ingest_at_k0_is_refused(long_prompts):
    prompt = long_prompts[0][:64]
    with running_stack() as stack, grpc.insecure_channel(stack.draft_address) as channel:
        draft = draft_pb2_grpc.DraftServiceStub(channel)
        table = service_info(stack, draft=True).kv_scales
        first = draft.Step(
            draft_pb2.DraftStepRequest(
                kv_scales_version=table.version,
                kv_scales=table,
                ingest=[draft_pb2.IngestPlan(request_id="r", start_position=0, token_ids=prompt)],
                propose=[draft_pb2.ProposeEntry(request_id="r", num_tokens=3)],
            ),
            timeout=30,
            metadata=stack.internal_metadata,
        )
        assert first.cached[0].num_cached_tokens == len(prompt)
        # The target accepted one proposal plus a bonus; then a K = 0 step committed one
        # more token, and this coordinator did not tell the draft. Its next ingest starts
        # past what the draft holds.
        skipped_start = len(prompt) + 2
        response = draft.Step(
            draft_pb2.DraftStepRequest(
                kv_scales_version=table.version,
                ingest=[
                    draft_pb2.IngestPlan(
                        request_id="r", start_position=skipped_start, token_ids=[5, 6]
                    )
                ],
                propose=[draft_pb2.ProposeEntry(request_id="r", num_tokens=3)],
            ),
            timeout=30,
            metadata=stack.internal_metadata,
        )
        (refused,) = response.failed
        assert (refused.request_id, refused.code) == ("r", "FAILED_PRECONDITION")
        assert str(skipped_start) in refused.message and str(len(prompt)) in refused.message
        assert not response.proposals
        release = common_pb2.ReleaseRequest(request_ids=["r"])
        draft.Release(release, timeout=10, metadata=stack.internal_metadata)
