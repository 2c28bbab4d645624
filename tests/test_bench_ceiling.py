"""bench/ceiling.py: its figures follow from the forward times it measures, the bench's
acceptance and its target-only rate (the arithmetic is checked, not the timings)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[1]
ACCEPTANCE = [0.9, 0.7, 0.5]
BENCH = {
    "batch": {
        "1": {"acceptance_per_position": ACCEPTANCE, "target_only_decode_tok_s": 400.0},
        "2": {"acceptance_per_position": [], "target_only_decode_tok_s": 700.0},
    }
}


@pytest.fixture(scope="module")
def report(tiny_model_path, tmp_path_factory) -> dict:
    bench = tmp_path_factory.mktemp("ceiling") / "bench.json"
    bench.write_text(json.dumps(BENCH))
    argv = [
        sys.executable, "bench/ceiling.py", "--bench-json", str(bench), "--target-model",
        str(tiny_model_path), "--repeats", "3", "--context", "40", "--bars", "1=3.0", "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_batch_size_and_k_up_to_the_measured_positions(report):
    assert report["acceptance"] == ACCEPTANCE
    assert sorted(report["batch"]) == ["1", "2"]
    for row in report["batch"].values():
        assert sorted(row["by_k"], key=int) == ["1", "2", "3"]


def test_figures_follow_from_the_timed_forwards(report):
    for batch, row in report["batch"].items():
        base_tok_s = BENCH["batch"][batch]["target_only_decode_tok_s"]
        for k, r in row["by_k"].items():
            tokens = 1 + sum(ACCEPTANCE[: int(k)])  # the target's token and the accepted
            assert r["expected_tokens"] == pytest.approx(tokens, abs=1e-3)
            verify, base = r["verify_ms"] / 1e3, r["target_only_forward_ms"] / 1e3
            assert verify > 0 and base > 0
            assert r["forward_ceiling"] == pytest.approx(tokens * base / verify, rel=5e-3)
            spec_tok_s = int(batch) * tokens / verify
            assert r["bench_ceiling"] == pytest.approx(spec_tok_s / base_tok_s, rel=5e-3)
            if batch == "1":  # slack: what a step may add to its verify and still reach 3.0x
                slack = r["slack_ms"] / 1e3
                assert spec_tok_s * verify / (verify + slack) == pytest.approx(
                    3.0 * base_tok_s, rel=5e-3
                )
            else:
                assert r["slack_ms"] is None  # no bar given for batch 2
        best = max(row["by_k"].values(), key=lambda r: r["bench_ceiling"])
        assert row["bench_ceiling"] == best["bench_ceiling"]
        assert row["by_k"][str(row["best_k"])]["bench_ceiling"] == best["bench_ceiling"]


def test_a_bench_that_measured_no_drafts_is_refused(tiny_model_path, tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"batch": {"4": BENCH["batch"]["2"]}}))
    argv = [sys.executable, "bench/ceiling.py", "--bench-json", str(bench)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "measured no drafts" in done.stderr
