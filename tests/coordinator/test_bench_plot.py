"""``specdec bench --plot``: the picture holds the bench's figures."""

from __future__ import annotations

from specdec.bench_plot import plot_bench

BATCH = {
    "1": {"k": 6, "target_only_tok_s": 140.0, "spec_tok_s": 240.0,
          "acceptance_per_position": [0.95, 0.9, 0.85, 0.8, 0.75, 0.7]},
    "4": {"k": 3, "target_only_tok_s": 300.0, "spec_tok_s": 420.0,
          "acceptance_per_position": [0.9, 0.8, 0.7]},
    "16": {"k": 0, "target_only_tok_s": 500.0, "spec_tok_s": 495.0,
           "acceptance_per_position": []},
}  # fmt: skip


def test_plot_draws_throughput_by_batch_and_acceptance_by_position(tmp_path):
    path = tmp_path / "bench.png"
    fig = plot_bench(BATCH, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    speed, accept = fig.axes
    lines = {line.get_label(): line for line in speed.lines}
    assert list(lines["target-only"].get_xdata()) == [1, 4, 16]
    assert list(lines["target-only"].get_ydata()) == [140.0, 300.0, 500.0]
    assert list(lines["speculative"].get_ydata()) == [240.0, 420.0, 495.0]
    # K = 0 drafts nothing: only batch 1 and 4 have acceptance curves.
    curves = {line.get_label(): list(line.get_ydata()) for line in accept.lines}
    assert curves == {
        "batch 1 (K = 6)": [0.95, 0.9, 0.85, 0.8, 0.75, 0.7],
        "batch 4 (K = 3)": [0.9, 0.8, 0.7],
    }
