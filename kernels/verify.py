"""Verification of draft proposals against the target: greedy and chain rejection sampling.

Both return ``(emitted tokens, number of proposals accepted)``; the emitted tokens are the
accepted proposals followed by exactly one token of the target's own (the correction at
the first mismatch, or the bonus token when every proposal was accepted).
"""

from __future__ import annotations

import torch

from specdec.kernels.random_stream import ACCEPT_DRAW, SAMPLE_DRAW, RandomStream
from specdec.kernels.sampling import sample_token


def verify_greedy(target_logits: torch.Tensor, proposals: list[int]) -> tuple[list[int], int]:
    """Accept the longest prefix of ``proposals`` equal to the target's argmax.

    ``target_logits`` is ``[K + 1, V]``: row ``i`` is the target's prediction for the
    position of proposal ``i``, row ``K`` the bonus position. K = 0 emits one token.
    """
    k = len(proposals)
    if target_logits.shape[0] != k + 1:
        raise ValueError(
            f"target_logits has {target_logits.shape[0]} rows; expected K + 1 = {k + 1}"
        )
    # argmax of bf16 and float32 logits agree; one host copy for all positions.
    best = target_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < k and proposals[accepted] == best[accepted]:
        accepted += 1
    return list(proposals[:accepted]) + [best[accepted]], accepted


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    proposals: list[int],
    target_probs: torch.Tensor,
    stream: RandomStream,
    first_position: int,
    use_flashinfer: bool | None = None,
) -> tuple[list[int], int]:
    """Lossless chain rejection sampling, FlashInfer's ``chain_speculative_sampling`` rule.

    ``draft_probs`` ``[K, V]`` are the distributions the proposals were drawn from,
    ``target_probs`` ``[K + 1, V]`` the target's; row ``i`` decides the token at absolute
    position ``first_position + i``. For each i, with ``u`` the stream's accept draw at that
    position, accept ``x_i`` when ``u * q_i(x_i) < p_i(x_i)``; at the first rejection emit a
    sample of ``normalize(relu(p_i - q_i))`` and stop; if all K are accepted emit a sample
    of ``p_K`` (both with the position's sample draw). The emitted tokens are distributed
    exactly as sampling from the target as long as ``stream`` is independent of the draws
    that picked the proposals. A pure function of its arguments.

    On CUDA with ``flashinfer`` importable (``use_flashinfer=None``) FlashInfer's fused
    kernel runs instead, its generator seeded from the stream at ``first_position``; the
    two paths agree in distribution, not sample by sample.
    """
    k = len(proposals)
    if draft_probs.shape[0] != k or target_probs.shape[0] != k + 1:
        raise ValueError(
            f"expected draft_probs [K={k}, V] and target_probs [K+1={k + 1}, V], got "
            f"{tuple(draft_probs.shape)} and {tuple(target_probs.shape)}"
        )
    if use_flashinfer is None:
        use_flashinfer = k > 0 and target_probs.is_cuda and _flashinfer_sampling() is not None
    if use_flashinfer:
        return _flashinfer_chain(draft_probs, proposals, target_probs, stream, first_position)
    p = target_probs.to(torch.float32)
    q = draft_probs.to(torch.float32)
    idx = torch.tensor(proposals, dtype=torch.int64, device=p.device)
    rows = torch.arange(k, device=p.device)
    u = stream.uniforms(range(first_position, first_position + k), ACCEPT_DRAW)
    # One vectorised test for all positions, one host sync to find the first rejection.
    ok = (u * q[rows, idx].double().cpu() < p[rows, idx].double().cpu()).tolist()
    accepted = 0
    while accepted < k and ok[accepted]:
        accepted += 1
    if accepted < k:
        dist = torch.clamp(p[accepted] - q[accepted], min=0.0)
        if float(dist.sum()) <= 0.0:  # p == q up to rounding: rejection had ~0 probability
            dist = p[accepted]
    else:
        dist = p[k]
    token = sample_token(dist, stream.uniform(first_position + accepted, SAMPLE_DRAW))
    return list(proposals[:accepted]) + [token], accepted


def _flashinfer_chain(
    draft_probs: torch.Tensor,
    proposals: list[int],
    target_probs: torch.Tensor,
    stream: RandomStream,
    first_position: int,
) -> tuple[list[int], int]:
    sampling = _flashinfer_sampling()
    if sampling is None:
        raise RuntimeError("flashinfer is not installed (pip install flashinfer-python)")
    device = target_probs.device
    accepted_any = torch.zeros(1, dtype=torch.int32, device=device)
    emitted = torch.zeros(1, dtype=torch.int32, device=device)
    out = sampling.chain_speculative_sampling(
        draft_probs=draft_probs[None].to(torch.float32).contiguous(),
        draft_token_ids=torch.tensor([proposals], dtype=torch.int32, device=device),
        target_probs=target_probs[None].to(torch.float32).contiguous(),
        maybe_output_accepted_token_num=accepted_any,
        maybe_output_emitted_draft_token_num=emitted,
        generator=stream.torch_generator(first_position, device),
    )
    if isinstance(out, tuple):  # older releases returned (tokens, accepted, emitted)
        out = out[0]
    accepted = int(emitted[0])
    return out[0, : accepted + 1].tolist(), accepted


def _flashinfer_sampling():
    try:
        import flashinfer.sampling as sampling
    except ImportError:
        return None
    return sampling
