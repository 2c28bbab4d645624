"""The wheel, installed in a fresh venv outside the checkout, serves: `specdec up` on the tiny
pair and one `specdec generate`, on the C kernels of the installed package's sources (that
they compile from the wheel alone is tests/kernels/test_native_build.py's; here they come
from the build cache, keyed by the sources' content, to save a minute of compiling)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from specdec.launcher import TINY_DRAFT, TINY_TARGET

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LEFTOVERS = ("*.egg-info", "build", ".venv", ".git", "models", "runs", "__pycache__")


def build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the checkout without its build leftovers, as CI has it."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LEFTOVERS))
    argv = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation"]
    subprocess.run([*argv, "-q", "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("specdec-*.whl")
    return wheel


def fresh_venv(tmp_path: Path) -> Path:
    """A new venv whose third-party packages are this one's (a path in a .pth file: no
    download, and none of this venv's own .pth files, so not the checkout's editable
    install), with the wheel installed by pip, which checks its declared dependencies."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv)}))
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def test_the_installed_wheel_serves_the_tiny_pair_with_its_own_kernels(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = fresh_venv(tmp_path)
    python, specdec = venv / "bin" / "python", venv / "bin" / "specdec"
    pip = [python, "-m", "pip", "install", "-q", "--no-index", str(wheel)]
    subprocess.run(pip, check=True, capture_output=True, text=True, cwd=tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run(
        [python, "-c", "import specdec.kernels.native as n; print(n.CSRC)"],
        check=True, capture_output=True, text=True, cwd=work,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(venv), where
    env = dict(os.environ, PYTHONPATH="")
    up = subprocess.Popen(
        [specdec, "up", "--target-model", str(TINY_TARGET), "--draft-model", str(TINY_DRAFT),
         "--port", "0", "--verbose"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        address = None
        deadline = time.monotonic() + 240
        while address is None and time.monotonic() < deadline:
            line = up.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.match(r"coordinator listening on (\S+)", line)
            address = match and match.group(1)
        assert address, "specdec up did not start:\n" + "".join(lines[-30:])
        out = subprocess.run(
            [specdec, "generate", "--address", address, "--prompt-ids", "1,2,3,4",
             "--max-tokens", "8", "--json"],
            cwd=work, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert len(json.loads(out.stdout)["token_ids"]) == 8
    finally:
        up.terminate()
        rest, _ = up.communicate(timeout=60)
        lines.append(rest)
    log = "".join(lines)
    assert "kernel unavailable" not in log, log[-3000:]
