"""Packed weights are copied onto transparent huge pages: equal, aligned, and backed by
2 MiB pages where the kernel's transparent huge pages are on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from specdec.kernels.huge_pages import HUGE_PAGE, into_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """ "always", "madvise", "never", or None where the system has no such setting."""
    if not THP.is_file():
        return None
    found = re.search(r"\[(\w+)\]", THP.read_text())
    return found.group(1) if found else None


def huge_page_bytes_at(address: int) -> int:
    """The bytes of huge pages backing the mapping that holds ``address`` (smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span.group(1), 16) <= address < int(span.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


needs_thp = pytest.mark.skipif(
    thp_mode() not in ("always", "madvise"),
    reason=f"transparent huge pages are {thp_mode() or 'not available'} here",
)


def test_copies_equal_the_tensors_each_aligned_to_a_cache_line():
    tensors = [
        torch.randn(300, 7),
        torch.randn(5).to(torch.float16),
        torch.arange(10),
        torch.empty(0),
        torch.randn(3, 4).to(torch.bfloat16),
    ]
    copies = into_huge_pages(tensors)
    for tensor, copy in zip(tensors, copies, strict=True):
        assert copy.dtype == tensor.dtype and torch.equal(copy, tensor)
        assert copy.data_ptr() % 64 == 0 and copy.is_contiguous()
    copies[0].zero_()  # copies, not views of the originals
    assert tensors[0].abs().sum() > 0


@needs_thp
def test_a_large_copy_is_backed_by_huge_pages():
    (copy,) = into_huge_pages([torch.ones(4 * HUGE_PAGE // 4)])  # 8 MiB of float32
    assert copy.data_ptr() % HUGE_PAGE == 0
    assert huge_page_bytes_at(copy.data_ptr()) >= HUGE_PAGE


@needs_thp
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_runtime_streams_its_packed_weights_from_huge_pages(dtype):
    from specdec.config import TINY_TARGET
    from specdec.runtime import ModelRunner
    from specdec.runtime.model import Linear

    runner = ModelRunner.from_pretrained(TINY_TARGET, num_pages=8, dtype=dtype)
    packed = [m.packed_weight for m in runner.model.modules() if isinstance(m, Linear)]
    assert packed and all(w is not None and w.data_ptr() % 64 == 0 for w in packed)
    assert huge_page_bytes_at(packed[0].data_ptr()) >= HUGE_PAGE
