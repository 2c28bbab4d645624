"""``specdec bench --plot FILE.png``: the bench's figures as one picture (matplotlib)."""

from __future__ import annotations

from pathlib import Path


def plot_bench(batch: dict[str, dict], path: str | Path):
    """Tokens/s against batch size (target-only and spec) and, per batch size with K > 0,
    the acceptance rate at each draft position; saved to ``path``. Returns the figure.
    ``batch`` is ``specdec bench --json``'s ``"batch"``."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'specdec[plot]' (or matplotlib)"
        ) from exc
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    sizes = sorted(batch, key=int)
    fig, (speed, accept) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for key, label in (("target_only_tok_s", "target-only"), ("spec_tok_s", "speculative")):
        speed.plot([int(b) for b in sizes], [batch[b][key] for b in sizes], "o-", label=label)
    speed.set(xscale="log", xlabel="batch size", ylabel="generated tokens/s", ylim=(0, None))
    speed.set_xticks([int(b) for b in sizes], sizes)
    speed.legend()
    speed.set_title("throughput")
    for b in sizes:
        rates = batch[b].get("acceptance_per_position") or []
        if rates:
            positions = range(1, len(rates) + 1)
            accept.plot(positions, rates, "o-", label=f"batch {b} (K = {batch[b]['k']})")
    accept.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1.05))
    accept.set_title("acceptance per draft position")
    if accept.lines:
        accept.legend()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig
