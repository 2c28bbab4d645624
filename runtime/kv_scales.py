"""Per-layer FP8 KV scales: the table the coordinator pins, and where its values come from.

A table is immutable; a new calibration or an outside table is a new object (and, by
convention, a new ``version``). Pages are not tagged with scales, so a sequence whose
pages were written under one table may not be extended under another.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class KVScalesMismatchError(RuntimeError):
    """A sequence's cached pages were written under a different KV-scale table.

    The caller must release the sequence and rebuild it from its tokens.
    """


@dataclass(frozen=True)
class KVScaleTable:
    """``{version, dtype, per-layer k_scale, v_scale}``; ``dtype`` is the kv_cache_dtype flag.

    Invariants (checked on construction): ``version >= 1``, one k and one v scale per
    layer, every scale finite and > 0.
    """

    version: int
    dtype: str
    k_scale: tuple[float, ...]
    v_scale: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "k_scale", tuple(float(s) for s in self.k_scale))
        object.__setattr__(self, "v_scale", tuple(float(s) for s in self.v_scale))
        if self.version < 1:
            raise ValueError(f"KV-scale table version must be >= 1, got {self.version}")
        if len(self.k_scale) != len(self.v_scale):
            raise ValueError(
                f"k_scale has {len(self.k_scale)} layers but v_scale has {len(self.v_scale)}"
            )
        bad = [s for s in self.k_scale + self.v_scale if not (math.isfinite(s) and s > 0)]
        if bad:
            raise ValueError(f"KV scales must be finite and positive, got {bad[:4]}")

    @property
    def num_layers(self) -> int:
        return len(self.k_scale)

    @classmethod
    def ones(cls, num_layers: int, dtype: str, version: int = 1) -> KVScaleTable:
        return cls(version, dtype, (1.0,) * num_layers, (1.0,) * num_layers)

    @classmethod
    def from_checkpoint(
        cls, found: dict[tuple[int, str], float], num_layers: int, dtype: str
    ) -> KVScaleTable | None:
        """Table from ``model.layers.{i}.self_attn.{k,v}_scale`` tensors (missing ones = 1.0).

        None when the checkpoint has no scales at all.
        """
        if not found:
            return None
        out_of_range = sorted({layer for layer, _ in found if layer >= num_layers})
        if out_of_range:
            raise ValueError(f"checkpoint has KV scales for missing layers {out_of_range}")
        k = tuple(found.get((i, "k"), 1.0) for i in range(num_layers))
        v = tuple(found.get((i, "v"), 1.0) for i in range(num_layers))
        return cls(1, dtype, k, v)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "k_scale": list(self.k_scale), "v_scale": list(self.v_scale)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVScaleTable:
        try:
            return cls(
                version=int(data["version"]),
                dtype=str(data["dtype"]),
                k_scale=tuple(data["k_scale"]),
                v_scale=tuple(data["v_scale"]),
            )
        except KeyError as e:
            raise ValueError(f"KV-scale table is missing the field {e.args[0]!r}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> KVScaleTable:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> KVScaleTable:
        return cls.from_json(Path(path).read_text())
