"""What serving a target costs in memory: the target service's resident memory, and the
weight bytes one decode step reads, for each model given.

    python bench/memory.py [--json] [MODEL ...]

Default: the real target as the float32 folder and as its Q4_1 GGUF (both fetched by
scripts/fetch_models.py). Each model's target service runs as ``specdec up`` starts it
(its default KV pool, one thread); its resident memory (VmRSS) and peak (VmHWM) are read
from /proc once it serves. Bytes a step reads: every linear's weight as the kernels hold
it (the head included) plus one embedding row, from the runtime loaded in this process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.config import REAL_TARGET, StackConfig
from specdec.launcher import ServiceProcess, Stack

FLOAT32_TARGET = REAL_TARGET.with_name("smollm2-135m-instruct")
MIB = 1 << 20


def service_memory(model: Path) -> dict[str, float]:
    """The target service's VmRSS and VmHWM (MiB) once it serves ``model``."""
    argv = Stack(StackConfig()).model_argv("target", str(model), 0)
    process = ServiceProcess("target", argv, echo=False)
    try:
        process.wait_ready(timeout=300)
        status = Path(f"/proc/{process.proc.pid}/status").read_text()
    finally:
        process.stop()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def step_bytes(model: Path) -> int:
    """Weight bytes one batch-1 decode step reads, as the kernels hold the weights."""
    import torch

    from specdec.runtime import ModelRunner
    from specdec.runtime.model import GGUFEmbedding, Linear

    runner = ModelRunner.from_pretrained(model, num_pages=4)
    total = 0
    for module in runner.model.modules():
        if isinstance(module, Linear):
            weight = module.kernel_weight
            if weight is None:
                weight = module.weight
            total += (
                weight.nbytes
                if not isinstance(weight, torch.Tensor)
                else (weight.numel() * weight.element_size())
            )
    embed = runner.model.model.embed_tokens
    if isinstance(embed, GGUFEmbedding):
        total += embed.gguf_weight.nbytes // embed.gguf_weight.out_features
    else:
        total += embed.weight.shape[1] * embed.weight.element_size()
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=[FLOAT32_TARGET, REAL_TARGET])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    figures = {}
    for model in args.models:
        figures[str(model)] = {
            **service_memory(model),
            "step_weight_mib": round(step_bytes(model) / MIB, 1),
        }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{'model':48} {'RSS MiB':>8} {'peak MiB':>9} {'weights a step, MiB':>20}")
    for model, row in figures.items():
        print(
            f"{Path(model).name:48} {row['VmRSS']:>8.0f} {row['VmHWM']:>9.0f} "
            f"{row['step_weight_mib']:>20.1f}"
        )


if __name__ == "__main__":
    main()
