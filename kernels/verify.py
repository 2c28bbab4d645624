"""Verification of draft proposals against the target: greedy and chain rejection sampling.

Both return ``(emitted tokens, number of proposals accepted)``; the emitted tokens are the
accepted proposals followed by exactly one token of the target's own (the correction at
the first mismatch, or the bonus token when every proposal was accepted).
"""

from __future__ import annotations

import torch


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
    generator: torch.Generator | None = None,
) -> tuple[list[int], int]:
    """Lossless chain rejection sampling, FlashInfer's ``chain_speculative_sampling`` rule.

    ``draft_probs`` ``[K, V]`` are the distributions the proposals were drawn from,
    ``target_probs`` ``[K + 1, V]`` the target's. For each i, draw ``u ~ U(0, 1)`` and
    accept ``x_i`` when ``u * q_i(x_i) < p_i(x_i)``; at the first rejection emit a sample
    of ``normalize(relu(p_i - q_i))`` and stop; if all K are accepted emit a sample of
    ``p_K``. The emitted tokens are distributed exactly as sampling from the target.
    Deterministic for a given ``generator`` state.
    """
    k = len(proposals)
    if draft_probs.shape[0] != k or target_probs.shape[0] != k + 1:
        raise ValueError(
            f"expected draft_probs [K={k}, V] and target_probs [K+1={k + 1}, V], got "
            f"{tuple(draft_probs.shape)} and {tuple(target_probs.shape)}"
        )
    p = target_probs.to(torch.float32)
    q = draft_probs.to(torch.float32)
    device = p.device
    idx = torch.tensor(proposals, dtype=torch.int64, device=device)
    rows = torch.arange(k, device=device)
    u = torch.rand(k, generator=generator, device=device)
    # One vectorised test for all positions, one host sync to find the first rejection.
    ok = (u * q[rows, idx] < p[rows, idx]).tolist()
    accepted = 0
    while accepted < k and ok[accepted]:
        accepted += 1
    if accepted < k:
        dist = torch.clamp(p[accepted] - q[accepted], min=0.0)
        if float(dist.sum()) <= 0.0:  # p == q up to rounding: rejection had ~0 probability
            dist = p[accepted]
    else:
        dist = p[k]
    token = int(torch.multinomial(dist, 1, generator=generator))
    return list(proposals[:accepted]) + [token], accepted


def chain_speculative_sampling_batch(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    use_flashinfer: bool | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Batched :func:`chain_speculative_sampling`: ``[B, K, V]``, ``[B, K]``, ``[B, K+1, V]``.

    Uses FlashInfer's fused kernel when the tensors are on CUDA and ``flashinfer`` imports
    (``use_flashinfer=None``), else the PyTorch rule row by row. Returns per-request emitted
    tokens and accepted counts. The two paths agree in distribution, not sample by sample.
    """
    if use_flashinfer is None:
        use_flashinfer = target_probs.is_cuda and _flashinfer_sampling() is not None
    if not use_flashinfer:
        results = [
            chain_speculative_sampling(
                draft_probs[b], draft_token_ids[b].tolist(), target_probs[b], generator
            )
            for b in range(target_probs.shape[0])
        ]
        return [r[0] for r in results], [r[1] for r in results]

    sampling = _flashinfer_sampling()
    if sampling is None:
        raise RuntimeError("flashinfer is not installed (pip install flashinfer-python)")
    batch = target_probs.shape[0]
    accepted_any = torch.zeros(batch, dtype=torch.int32, device=target_probs.device)
    emitted = torch.zeros(batch, dtype=torch.int32, device=target_probs.device)
    out = sampling.chain_speculative_sampling(
        draft_probs=draft_probs.to(torch.float32).contiguous(),
        draft_token_ids=draft_token_ids.to(torch.int32).contiguous(),
        target_probs=target_probs.to(torch.float32).contiguous(),
        maybe_output_accepted_token_num=accepted_any,
        maybe_output_emitted_draft_token_num=emitted,
        generator=generator,
    )
    if isinstance(out, tuple):  # older releases returned (tokens, accepted, emitted)
        out = out[0]
    tokens = out.tolist()
    counts = emitted.tolist()
    return [row[: n + 1] for row, n in zip(tokens, counts, strict=True)], counts


def _flashinfer_sampling():
    try:
        import flashinfer.sampling as sampling
    except ImportError:
        return None
    return sampling
