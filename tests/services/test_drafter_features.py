"""A draft that reads the target's features (EAGLE-style): each ingested token comes with
the target's feature of the position before; its own proposals read its own output.
Proposals do not depend on how the log arrived (in pieces, lazily, or rebuilt from 0), a
proposal's tail fed with the draft's own features is fed again with the target's, and the
features reach the model (zeros propose otherwise)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_drafter_lazy_ingest import SAMPLED, schedule

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.servicer import step_from_proto
from specdec.draft_service.steps import DraftStep, IngestPlan, ProposeEntry
from specdec.model_service.proto import features_to_bytes
from specdec.runtime.errors import InvalidRequestError
from specdec.runtime.model_runner import ModelRunner
from specdec.runtime.sampling import Sampling
from specdec.v1 import draft_pb2

HIDDEN = 64


@pytest.fixture
def make_feature_runner(service_config, tiny_feature_draft_path):
    config = dataclasses.replace(service_config, model=str(tiny_feature_draft_path))

    def make(**overrides) -> ModelRunner:
        return ModelRunner(dataclasses.replace(config.runtime_config(), **overrides))

    return make


def features_of(log_len: int, start: int, n: int) -> torch.Tensor:
    """Stand-in target features: a fixed random row per position (token p reads p - 1's)."""
    rows = torch.randn(log_len + 1, HIDDEN, generator=torch.Generator().manual_seed(3))
    rows[0] = 0
    return rows[start : start + n]  # rows[p] = the feature token p reads


def run(drafter: Drafter, sampling: Sampling, rebuild=False, zeros=False) -> list[list[int]]:
    log: list[int] = []
    total = sum(len(t) for t, _ in schedule())
    proposals = []
    for tokens, k in schedule():
        start = len(log)
        log += tokens
        first, count = (0, len(log)) if rebuild and k else (start, len(tokens))
        feats = None if zeros else features_of(total, first, count)
        if rebuild and k:
            drafter.release(["r"])
        plan = IngestPlan("r", first, tuple(log[first:]), features=feats)
        propose = (ProposeEntry("r", k, sampling),) if k else ()
        result = drafter.step(DraftStep(ingest=(plan,), propose=propose))
        assert not result.failed and result.cached == {"r": len(log)}
        proposals += [p.token_ids for p in result.proposals]
    return proposals


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_feature_draft_proposes_alike_however_the_log_arrived(make_feature_runner, sampling):
    lazy = run(Drafter(make_feature_runner(), lazy_ingest=True), sampling)
    assert len(lazy) == 7 and all(len(p) == 4 for p in lazy)
    assert lazy == run(Drafter(make_feature_runner(), lazy_ingest=False), sampling)
    assert lazy == run(Drafter(make_feature_runner()), sampling, rebuild=True)
    # The features reach the model: without them it proposes otherwise.
    assert lazy != run(Drafter(make_feature_runner()), sampling, zeros=True)


def test_accepted_proposals_are_fed_again_with_the_targets_features(make_feature_runner):
    prompt = [5, 17, 99, 3, 250, 61, 7]
    feats = features_of(64, 0, 64)
    drafter = Drafter(make_feature_runner())
    step = DraftStep(
        ingest=(IngestPlan("r", 0, tuple(prompt), features=feats[: len(prompt)]),),
        propose=(ProposeEntry("r", 4),),
    )
    (first,) = drafter.step(step).proposals
    committed = [*first.token_ids[:2], 123]  # two accepted, then the target's token
    n = len(prompt)
    step = DraftStep(
        ingest=(IngestPlan("r", n, tuple(committed), features=feats[n : n + 3]),),
        propose=(ProposeEntry("r", 4),),
    )
    (after,) = drafter.step(step).proposals
    rebuilt = Drafter(make_feature_runner())
    log = [*prompt, *committed]
    step = DraftStep(
        ingest=(IngestPlan("r", 0, tuple(log), features=feats[: len(log)]),),
        propose=(ProposeEntry("r", 4),),
    )
    assert rebuilt.step(step).proposals[0].token_ids == after.token_ids


def test_a_feature_draft_refuses_to_work_ahead(make_feature_runner):
    drafter = Drafter(make_feature_runner())
    step = DraftStep(
        ingest=(IngestPlan("r", 0, (5, 6, 7)),),
        propose=(ProposeEntry("r", 3, ahead_of=(8, 9)),),
    )
    result = drafter.step(step)
    assert isinstance(result.failed["r"], InvalidRequestError)
    assert "ahead_of" in str(result.failed["r"]) and drafter.num_committed("r") == 0


def test_features_of_the_wrong_size_fail_their_request_alone():
    good = features_to_bytes(torch.ones(2, HIDDEN))
    msg = draft_pb2.DraftStepRequest(
        ingest=[
            draft_pb2.IngestPlan(request_id="a", token_ids=[1, 2], features=good),
            draft_pb2.IngestPlan(request_id="b", token_ids=[1, 2], features=good[:-2]),
        ]
    )
    failed: dict[str, Exception] = {}
    step = step_from_proto(msg, failed, HIDDEN)
    assert [p.request_id for p in step.ingest] == ["a"]
    assert torch.equal(step.ingest[0].features, torch.ones(2, HIDDEN))
    assert "254 bytes" in str(failed["b"]) and "256" in str(failed["b"])
