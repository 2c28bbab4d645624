"""Building the C kernels: cached by content, never rebuilt, failures explained."""

from __future__ import annotations

import shutil

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


@pytest.mark.parametrize("edited", ["paged_attention.c", "common.h"])
def test_an_edited_source_or_header_gets_its_own_library(tmp_path, monkeypatch, edited):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "csrc"
    shutil.copytree(native.CSRC, folder)
    with open(folder / edited, "a") as f:
        f.write("\n/* edited */\n")
    assert native.build_library("cc", folder) != native.build_library("cc")


def test_every_exported_function_is_in_the_library():
    lib = native.load_library()
    for name in native.SIGNATURES:
        assert getattr(lib, name).argtypes == native.SIGNATURES[name]


def test_compiler_errors_reach_the_caller(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    with pytest.raises(NativeBuildError, match="building the CPU kernels failed"):
        native.build_library("false")
    assert list((tmp_path / "native").iterdir()) == []  # the scratch files are gone
