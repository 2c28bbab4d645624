"""``create_attention_backend``: which backend each name and device gets, and its errors."""

from __future__ import annotations

import logging

import pytest
import torch

from specdec.kernels import native
from specdec.kernels.attention import ReferenceAttentionBackend, create_attention_backend
from specdec.kernels.attention.cpu_backend import CpuAttentionBackend
from specdec.kernels.native import NativeBuildError


@pytest.fixture
def no_compiler(monkeypatch):
    """The C kernel cannot be built: CC names no program, and nothing is loaded yet."""
    monkeypatch.setenv("CC", "/nonexistent/cc")
    native.load_library.cache_clear()
    yield
    native.load_library.cache_clear()


def test_auto_on_cpu_picks_the_c_kernel_backend():
    assert isinstance(create_attention_backend("auto", "cpu"), CpuAttentionBackend)
    assert isinstance(create_attention_backend("cpu"), CpuAttentionBackend)
    assert isinstance(create_attention_backend("reference"), ReferenceAttentionBackend)


def test_auto_falls_back_to_reference_with_a_warning_when_the_kernel_cannot_build(
    no_compiler, caplog
):
    with caplog.at_level(logging.WARNING, logger="specdec.kernels.attention"):
        backend = create_attention_backend("auto", "cpu")
    assert isinstance(backend, ReferenceAttentionBackend)
    assert "/nonexistent/cc" in caplog.text


def test_asking_for_cpu_without_a_compiler_says_what_to_do(no_compiler):
    with pytest.raises(NativeBuildError, match="'reference' attention backend"):
        create_attention_backend("cpu")


def test_unknown_names_and_wrong_devices_are_refused():
    with pytest.raises(ValueError, match="flashinfer"):
        create_attention_backend("flash")
    with pytest.raises(ValueError, match="runs on the CPU"):
        create_attention_backend("cpu", "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_factory_explains_why_flashinfer_cannot_run_without_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        create_attention_backend("flashinfer", "cpu")
