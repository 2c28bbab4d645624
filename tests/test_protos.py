"""The committed gRPC stubs are exactly what scripts/gen_protos.sh generates now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUBS = ROOT / "protos" / "specdec" / "v1"


def test_committed_stubs_match_a_fresh_generation(tmp_path):
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "specdec" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in STUBS.glob("*_pb2*")}
    assert sorted(fresh) == sorted(committed)
    stale = [name for name, data in fresh.items() if committed[name] != data]
    assert not stale, f"stale stubs {stale}: run scripts/gen_protos.sh and commit the result"


def test_every_proto_has_its_stubs():
    protos = {p.stem for p in STUBS.glob("*.proto")}
    assert protos == {"common", "coordinator", "draft", "target"}
    for stem in protos:
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            assert (STUBS / f"{stem}{suffix}").is_file()
