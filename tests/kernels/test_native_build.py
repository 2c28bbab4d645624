"""Building the C kernels: cached by content, never rebuilt, failures explained."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from specdec.kernels import native
from specdec.kernels.native import NativeBuildError

pytestmark = pytest.mark.slow  # starts processes


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


def test_the_wheel_carries_everything_the_kernels_compile_from(tmp_path, monkeypatch):
    # An installed wheel compiles the kernels from its own copy of csrc/: every source and
    # every header they include must be in it, or the services fall back to PyTorch.
    # Built from a copy without the checkout's build leftovers (an old egg-info's file list
    # would add files the package data forgets), as CI builds from a fresh clone.
    source = tmp_path / "source"
    leftovers = ("*.egg-info", "build", ".venv", ".git", "models", "runs", "__pycache__")
    shutil.copytree(native.CSRC.parent.parent, source, ignore=shutil.ignore_patterns(*leftovers))
    wheel_dir = tmp_path / "dist"
    argv = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation"]
    subprocess.run([*argv, "-q", "-w", str(wheel_dir)], check=True, capture_output=True)
    (wheel,) = wheel_dir.glob("specdec-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = [n for n in archive.namelist() if n.startswith("specdec/kernels/csrc/")]
        archive.extractall(tmp_path / "installed", members=shipped)
    installed = tmp_path / "installed" / "specdec" / "kernels" / "csrc"
    assert sorted(p.name for p in installed.iterdir()) == sorted(
        p.name for p in native.CSRC.iterdir() if p.suffix in (".c", ".h")
    )
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    assert native.build_library("cc", installed).is_file()
