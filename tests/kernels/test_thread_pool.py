"""The kernels' thread pool while its thread count changes between parallel regions."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # starts processes


# Alternates 2 and 4 threads around small linears. A worker left out of a 2-thread region
# must never run a share of it late, after the count went up again: that read a returned
# caller's context (a pool that let it crashed in 6 of 6 runs of this loop, in 3-13 s).
SWITCHING = textwrap.dedent(
    """
    import torch
    from specdec.kernels import dense_ops

    torch.manual_seed(0)
    packed = dense_ops.pack_linear_weight(torch.randn(64, 512))
    x = torch.randn(1, 64)
    want = dense_ops.linear(x, packed)
    wrong = 0
    for i in range(4000):
        dense_ops.set_num_threads(4 if i % 2 else 2)
        for _ in range(3):
            wrong += not torch.equal(dense_ops.linear(x, packed), want)
    print("wrong results:", wrong)
    """
)


def test_changing_the_thread_count_between_regions_is_safe():
    # In a child process: the defect this guards against is a segfault.
    done = subprocess.run(
        [sys.executable, "-c", SWITCHING],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() == "wrong results: 0"
