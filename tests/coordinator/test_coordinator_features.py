"""The target's features on the coordinator, for a draft that reads them: kept per request
from position 0 (FeatureLog), ingested only where known, sent with their tokens."""

from __future__ import annotations

import pytest
from test_coordinator_scheduler import EOS, make_request, make_scheduler

from specdec.coordinator.engine.features import FeatureLog
from specdec.coordinator.engine.messages import draft_step_request, verify_request
from specdec.v1 import common_pb2

ROW = 4  # bytes per feature row


def rows(*values: int) -> bytes:
    return b"".join(bytes([v]) * ROW for v in values)


def test_feature_log_pairs_each_token_with_the_feature_before_it():
    log = FeatureLog(ROW)
    assert log.num_ingestible == 1 and log.for_tokens(0, 1) == rows(0)
    log.add(0, rows(1, 2, 3))
    assert log.num_positions == 3 and log.num_ingestible == 4
    assert log.for_tokens(0, 4) == rows(0, 1, 2, 3)
    assert log.for_tokens(2, 4) == rows(2, 3) and log.for_tokens(4, 4) == b""
    log.add(5, rows(6))  # positions 3 and 4 came from a prefix cache: zeros
    assert log.for_tokens(3, 7) == rows(3, 0, 0, 6)
    log.add(1, rows(7, 8))  # recomputed (a resumed request): replaced from there on
    assert log.num_positions == 3 and log.for_tokens(0, 4) == rows(0, 1, 7, 8)
    with pytest.raises(ValueError, match="not returned"):
        log.for_tokens(2, 5)
    with pytest.raises(ValueError, match="whole rows"):
        log.add(3, b"abc")


def test_the_draft_ingests_only_tokens_whose_features_the_target_returned():
    s = make_scheduler(max_num_batched_tokens=4)
    r = make_request("a", 6)
    r.features = FeatureLog(ROW)
    s.add(r)
    plan = s.schedule()  # the first chunk: the target computes it, the draft waits
    assert [(c.start, c.token_ids) for c in plan.prefills] == [(0, [1, 2, 3, 4])]
    assert [(p.start, p.token_ids) for p in plan.ingest] == [(0, [1])]
    r.num_draft_cached, r.num_target_cached = 1, 4
    r.features.add(0, rows(1, 2, 3, 4))
    plan = s.schedule()
    assert [(p.start, p.token_ids) for p in plan.ingest] == [(1, [2, 3, 4, 5])]
    r.num_draft_cached, r.num_target_cached = 5, 6
    r.commit([500], EOS, 1000)
    r.features.add(4, rows(5, 6))
    plan = s.schedule()  # decoding: every committed token's feature is known
    assert [(p.start, p.token_ids) for p in plan.ingest] == [(5, [6, 500])]
    message = draft_step_request(plan.step_id, plan.ingest, plan.propose, KV)
    assert message.ingest[0].features == rows(5, 6)


KV = common_pb2.KVScaleTable(version=1)


def test_no_proposals_while_the_targets_features_are_missing():
    # A target that returns no features (an older build): the draft cannot be brought to
    # the log, so the request decodes target-only instead of drafting after the wrong token.
    s = make_scheduler()
    r = make_request("a", 3)
    r.features = FeatureLog(ROW)
    s.add(r)
    plan = s.schedule()
    r.num_draft_cached, r.num_target_cached = 1, 3
    r.commit([500], EOS, 1000)
    plan = s.schedule()
    assert [(d.request, d.k) for d in plan.decodes] == [(r, 0)] and plan.propose == []
    r.features.add(0, rows(1, 2, 3))
    plan = s.schedule()
    assert [(d.request, d.k) for d in plan.decodes] == [(r, 3)]
    assert [(p.start, p.token_ids) for p in plan.ingest] == [(1, [2, 3, 500])]


def test_features_are_asked_of_the_target_only_for_a_draft_that_reads_them():
    s = make_scheduler()
    s.add(make_request("a", 3))
    plan = s.schedule()
    assert verify_request(plan, {}, EOS, return_features=True).return_features
    assert not verify_request(plan, {}, EOS).return_features
    message = draft_step_request(plan.step_id, plan.ingest, plan.propose, KV)
    assert message.ingest[0].features == b""  # the request keeps no features


def test_a_draft_that_lost_the_request_is_rebuilt_with_every_feature():
    # A restarted draft (or another replica): released, then the whole log from 0, each
    # token with the feature of the position before, from the coordinator's copy.
    s = make_scheduler()
    r = make_request("a", 3)
    r.features = FeatureLog(ROW)
    s.add(r)
    s.schedule()
    r.num_target_cached = 4  # the prompt and the first token: the second is next to verify
    r.commit([500, 501], EOS, 1000)
    r.features.add(0, rows(1, 2, 3, 4))
    r.num_draft_cached = None
    plan = s.schedule()
    assert plan.draft_release == [r]
    assert [(p.start, p.token_ids) for p in plan.ingest] == [(0, [1, 2, 3, 500, 501])]
    message = draft_step_request(plan.step_id, plan.ingest, plan.propose, KV)
    assert message.ingest[0].features == rows(0, 1, 2, 3, 4)
