"""Building the C kernels: cached by content, never rebuilt, failures explained."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import zipfile

import pytest

from specdec.kernels import native
from specdec.kernels.native import NativeBuildError

pytestmark = pytest.mark.slow  # starts processes


@pytest.fixture
def sources(tmp_path):
    """A kernel source folder of one file and one header: the cache's rules hold for any
    sources, and these build in a second where the kernels themselves take a minute."""
    folder = tmp_path / "csrc"
    folder.mkdir()
    (folder / "answer.h").write_text("#define ANSWER 42\n")
    (folder / "answer.c").write_text('#include "answer.h"\nint answer(void) { return ANSWER; }\n')
    return folder


def test_library_is_built_once_into_the_cache_dir(tmp_path, monkeypatch, sources):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    first = native.build_library("cc", sources)
    assert first.parent == tmp_path / "cache" / "native" and first.suffix == ".so"
    assert ctypes.CDLL(str(first)).answer() == 42
    built_at = first.stat().st_mtime_ns
    assert native.build_library("cc", sources) == first
    assert first.stat().st_mtime_ns == built_at
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no leftovers


@pytest.mark.parametrize("edited", ["answer.c", "answer.h"])
def test_an_edited_source_or_header_gets_its_own_library(tmp_path, monkeypatch, sources, edited):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    before = native.build_library("cc", sources)
    with open(sources / edited, "a") as f:
        f.write("\n/* edited */\n")
    after = native.build_library("cc", sources)
    assert after != before and before.is_file() and after.is_file()


def test_every_exported_function_is_in_the_library():
    lib = native.load_library()
    for name in native.SIGNATURES:
        assert getattr(lib, name).argtypes == native.SIGNATURES[name]


def test_compiler_errors_reach_the_caller(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    with pytest.raises(NativeBuildError, match="building the CPU kernels failed"):
        native.build_library("false")
    assert list((tmp_path / "native").iterdir()) == []  # the scratch files are gone


def test_the_wheel_carries_everything_the_kernels_compile_from(tmp_path):
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
    # The same bytes under the same names: the checkout's library (one cache key), built
    # once for the whole suite rather than again from the copy.
    assert native.build_library("cc", installed) == native.build_library("cc")
