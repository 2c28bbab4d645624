"""Proto messages to and from the services, built from a `StepPlan` (one place per RPC)."""

from __future__ import annotations

import logging

from specdec.coordinator.engine.request import Request
from specdec.coordinator.engine.scheduler import DecodeEntry, IngestPlan, StepPlan
from specdec.v1 import common_pb2, draft_pb2, target_pb2

logger = logging.getLogger(__name__)

# request id -> (proposed token ids, the draft distribution of each; [] when greedy)
Proposals = dict[str, tuple[list[int], list[common_pb2.SparseProbs]]]


def sampling_pb(request: Request, eos_token_ids: frozenset[int]) -> common_pb2.SamplingParams:
    """The services' message for ``request``; ValueError for a value out of its range. The
    engine converts each request once, when it arrives, so a bad value fails that request
    alone."""
    s = request.sampling
    pb = common_pb2.SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        logit_bias=dict(s.logit_bias),
        min_tokens=s.min_tokens,
        num_prompt_tokens=request.num_prompt_tokens,
    )
    if s.min_tokens:
        stops = request.stop_token_ids | (frozenset() if request.ignore_eos else eos_token_ids)
        pb.min_tokens_stop_ids.extend(sorted(stops))
    if s.seed is not None:
        pb.seed = s.seed
    if s.logprobs is not None:
        pb.logprobs = s.logprobs
    if s.prompt_logprobs is not None:
        pb.prompt_logprobs = s.prompt_logprobs
    if s.structured_output is not None:
        pb.structured_output.CopyFrom(s.structured_output)
    return pb


def draft_step_request(
    step_id: int,
    ingest: list[IngestPlan],
    propose: list[DecodeEntry],
    kv_scales: common_pb2.KVScaleTable,
    ahead_of: Proposals | None = None,
    min_prob: float = 0.0,
    prompt_lookup: tuple[int, int] = (0, 0),
    branches: int = 1,
    branch_budget_s: float = 0.0,
) -> draft_pb2.DraftStepRequest:
    """Ingest plans then proposals (each ending early below ``min_prob``; found by prompt
    lookup first where ``prompt_lookup`` (n_min, n_max) is set); the full KV-scale table
    when a sequence opens. With ``ahead_of`` (pipelining), each proposal comes after the
    proposals the target is verifying for that request; a greedy one for ``branches``
    outcomes of that verify, as many as fit in ``branch_budget_s``."""
    message = draft_pb2.DraftStepRequest(
        step_id=step_id,
        kv_scales_version=kv_scales.version,
        ingest=[
            draft_pb2.IngestPlan(
                request_id=p.request.request_id,
                start_position=p.start,
                token_ids=p.token_ids,
                eager=p.eager,
                features=_features_for(p),
            )
            for p in ingest
        ],
        propose=[
            draft_pb2.ProposeEntry(
                request_id=d.request.request_id,
                num_tokens=d.k,
                sampling=d.request.sampling_message,
                ahead_of=(ahead_of or {}).get(d.request.request_id, ((), ()))[0],
                min_prob=min_prob,
                prompt_lookup_min=prompt_lookup[0],
                prompt_lookup_max=prompt_lookup[1],
                num_branches=branches if ahead_of and d.request.sampling.greedy else 1,
                branch_budget_s=branch_budget_s,
            )
            for d in propose
        ],
    )
    if any(p.start == 0 for p in ingest):
        message.kv_scales.CopyFrom(kv_scales)
    return message


def _features_for(plan: IngestPlan) -> bytes:
    features = plan.request.features
    if features is None:
        return b""
    return features.for_tokens(plan.start, plan.start + len(plan.token_ids))


def valid_proposals(
    propose: list[DecodeEntry], response: draft_pb2.DraftStepResponse, vocab_size: int
) -> Proposals:
    """Keeps well-formed proposals, cut to each request's K; drops (logs) the rest."""
    entries = {d.request.request_id: d for d in propose}
    out: Proposals = {}
    for proposal in response.proposals:
        entry = entries.get(proposal.request_id)
        checked = None if entry is None else checked_proposal(entry, proposal, vocab_size)
        if checked is not None:
            out[proposal.request_id] = checked
    return out


def checked_proposal(
    entry: DecodeEntry, proposal: draft_pb2.Proposal, vocab_size: int
) -> tuple[list[int], list[common_pb2.SparseProbs]] | None:
    """One proposal's ids cut to the entry's K and, when sampling, their draft probs;
    None (logged) when it is malformed."""
    ids = list(proposal.token_ids)[: entry.k]
    if any(t >= vocab_size for t in ids):
        logger.error("draft proposed a token id >= vocab for %s", proposal.request_id)
        return None
    probs: list[common_pb2.SparseProbs] = []
    if not entry.request.sampling.greedy and ids:
        if len(proposal.draft_probs) < len(ids):
            logger.error("draft sent no probs for sampled %s", proposal.request_id)
            return None
        probs = list(proposal.draft_probs[: len(ids)])
    return ids, probs


def verify_request(
    plan: StepPlan,
    proposals: Proposals,
    eos_token_ids: frozenset[int],
    return_features: bool = False,
) -> target_pb2.VerifyRequest:
    """Prefill chunks and decode entries; a decode entry starts at the last committed token.
    A multi-step plan also tells each entry its token budget and stop tokens.
    ``return_features``: the draft reads the target's features; ask for them."""
    message = target_pb2.VerifyRequest(
        step_id=plan.step_id, num_steps=plan.num_steps, return_features=return_features
    )
    for chunk in plan.prefills:
        message.prefill.append(
            target_pb2.PrefillChunk(
                request_id=chunk.request.request_id,
                start_position=chunk.start,
                token_ids=chunk.token_ids,
                is_last=chunk.is_last,
                resumes=chunk.resumes,
                sampling=chunk.request.sampling_message,
            )
        )
    for entry in plan.decodes:
        request = entry.request
        ids, probs = proposals.get(request.request_id, ([], []))
        message.decode.append(
            target_pb2.VerifyEntry(
                request_id=request.request_id,
                start_position=request.num_tokens - 1,
                last_token_id=request.token_ids[-1],
                proposal_ids=ids,
                draft_probs=probs,
                sampling=request.sampling_message,
            )
        )
        if plan.num_steps > 1:
            stops = request.stop_token_ids | (frozenset() if request.ignore_eos else eos_token_ids)
            message.decode[-1].max_new_tokens = entry.max_new_tokens
            message.decode[-1].stop_token_ids.extend(sorted(stops))
    return message
