"""GPU check: run the `gpu` kernel tests, then time FlashInfer paged decode, FP8 vs bf16 KV.

Usage: python scripts/gpu_check.py [--contexts 4096 32768] [--batch 32]
Without CUDA it says so and exits 0 (nothing heavy runs).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16


def time_decode(kv_dtype: torch.dtype, batch: int, context: int, iters: int = 50) -> float:
    """Microseconds per paged decode-attention call (one layer) through our backend."""
    from specdec.kernels.attention import create_attention_backend
    from specdec.kernels.attention.base import AttentionMetadata

    pages_per_seq = math.ceil(context / PAGE_SIZE)
    num_pages = batch * pages_per_seq
    kv = torch.randn(
        num_pages, 2, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16
    ).to(kv_dtype)
    perm = torch.randperm(num_pages, device="cuda").to(torch.int32)  # scattered pages
    last = context - (pages_per_seq - 1) * PAGE_SIZE
    arange = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
    meta = AttentionMetadata(
        seq_ids=tuple(str(i) for i in range(batch)),
        query_lens=(1,) * batch,
        kv_lens=(context,) * batch,
        page_size=PAGE_SIZE,
        qo_indptr=arange,
        kv_indptr=arange * pages_per_seq,
        kv_indices=perm,
        kv_last_page_len=torch.full((batch,), last, dtype=torch.int32, device="cuda"),
        positions=torch.full((batch,), context - 1, dtype=torch.int64, device="cuda"),
        slot_mapping=torch.zeros(batch, dtype=torch.int64, device="cuda"),
        page_tables=(),
    )
    backend = create_attention_backend("flashinfer", "cuda")
    backend.plan(meta, NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, torch.bfloat16, kv_dtype)
    q = torch.randn(batch, NUM_QO_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    sm_scale = 1.0 / math.sqrt(HEAD_DIM)
    for _ in range(5):
        backend.forward(0, q, kv, 1.0, 1.0, sm_scale)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        backend.forward(0, q, kv, 1.0, 1.0, sm_scale)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to run.")
        return 0
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        print(
            "gpu_check: CUDA is available but flashinfer is not installed "
            "(pip install flashinfer-python); nothing to run."
        )
        return 0

    rc = 0
    if not args.skip_tests:
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/kernels"]
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        print(f"gpu tests: {'passed' if rc == 0 else f'FAILED (rc={rc})'}")

    print(
        f"\npaged decode attention, batch {args.batch}, {NUM_QO_HEADS} q heads, "
        f"{NUM_KV_HEADS} kv heads, head_dim {HEAD_DIM}, page {PAGE_SIZE}, "
        f"{torch.cuda.get_device_name()}"
    )
    print(f"{'backend':<11}{'kv dtype':<16}{'context':>8}{'us/call':>11}{'GB/s':>9}")
    for context in args.contexts:
        for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
            us = time_decode(kv_dtype, args.batch, context)
            elem = torch.empty((), dtype=kv_dtype).element_size()
            kv_bytes = args.batch * context * 2 * NUM_KV_HEADS * HEAD_DIM * elem
            print(
                f"{'flashinfer':<11}{str(kv_dtype).removeprefix('torch.'):<16}"
                f"{context:>8}{us:>11.1f}{kv_bytes / us / 1e3:>9.0f}"
            )
    return rc


if __name__ == "__main__":
    sys.exit(main())
