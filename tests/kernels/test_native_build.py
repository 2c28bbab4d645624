"""Building the C kernels: cached by content, rebuilt never, failures explained."""

from __future__ import annotations

import pytest

from kernels import native
from kernels.native import NativeBuildError


def test_library_is_built_once_into_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    first = native.build_library("cc")
    assert first.parent == tmp_path / "native" and first.suffix == ".so"
    built_at = first.stat().st_mtime_ns
    assert native.build_library("cc") == first
    assert first.stat().st_mtime_ns == built_at
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no leftovers


def test_a_changed_source_gets_its_own_library(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    edited = tmp_path / native.SOURCE.name
    edited.write_text(native.SOURCE.read_text() + "\n/* edited */\n")
    assert native.build_library("cc", edited) != native.build_library("cc")


def test_compiler_errors_reach_the_caller(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    with pytest.raises(NativeBuildError, match="building paged_attention.c failed"):
        native.build_library("false")
    assert list((tmp_path / "native").iterdir()) == []  # the partial files are gone
