"""All decoder layers of a step in one C call (``csrc/decoder_layers.c``).

At decode and verify sizes the per-op path spends as long in Python (module calls, shape
checks, tensor allocation; about ten ops a layer) as in the kernels. This runs the same
kernels in the same order from one C loop over preallocated buffers, so its hidden states
equal the per-op path's bit for bit (tested). It covers CPU models computing in float32
whose linears are packed (in 32 or 16 bits), float32 KV caches and steps the C attention
kernel takes; the model falls back to the per-op path for everything else.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from specdec.kernels.gguf_ops import GGUFWeight
from specdec.kernels.native import load_library

_P, _I32, _I64, _F32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
LAYER_TENSORS = (
    "input_norm", "qkv", "qkv_bias", "qk_norm", "o_proj", "o_bias",
    "post_norm", "gate_up", "gate_up_bias", "down", "down_bias",
)  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [(name, _P) for name in LAYER_TENSORS]


class _Step(ctypes.Structure):
    _fields_ = [
        ("tokens", _I64),
        *[(n, _I32) for n in ("hidden", "num_heads", "num_kv_heads", "head_dim", "inter")],
        *[(n, _F32) for n in ("eps", "qk_eps", "sm_scale")],
        ("cos", _P),
        ("sin_signed", _P),
        ("positions", _P),
        ("kv_layers", _P),
        ("kv_rows", _P),
        *[(n, _P) for n in ("qo_indptr", "kv_lens", "page_indptr", "page_indices")],
        ("batch", _I32),
        ("page_size", _I32),
        ("weight_kind", _I32),
    ]


class _Greedy(ctypes.Structure):
    _fields_ = [
        ("steps", _I32),
        ("embed", _P),
        ("final_norm", _P),
        ("final_eps", _F32),
        ("head", _P),
        ("head_rows", _I32),
        ("head_ids", _P),
        ("positions", _P),
        ("kv_rows", _P),
        ("kv_lens", _P),
        ("min_prob", _F32),
        ("min_prob_from", _I32),
        ("num_picks", _P),
        ("stop", _P),
    ]


@dataclass(frozen=True)
class GreedyHead:
    """What turns the last layer's output into a token: the final RMSNorm and the head
    (packed like the layers' linears; ``token_ids`` maps its rows to vocabulary ids when
    it covers part of the vocabulary), after the embedding table that feeds the layers."""

    embed: torch.Tensor | GGUFWeight  # float32 [vocab, hidden], or GGUF blocks
    norm: torch.Tensor  # float32 [hidden]
    eps: float
    head: torch.Tensor | GGUFWeight  # packed [rows / 32, hidden, 32], or GGUF blocks
    token_ids: torch.Tensor | None  # int64 [rows]


# The packed linears' dtype -> csrc/decoder_layers.c's weight_kind; GGUF_KIND: every linear
# (and the embedding) a GGUFWeight.
WEIGHT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}
GGUF_KIND = 4
LINEARS = ("qkv", "o_proj", "gate_up", "down")


@dataclass(frozen=True)
class Shape:
    """The model's widths and norms' epsilons."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    qk_eps: float  # Qwen3's q/k norm (unused without one)

    @property
    def scratch_floats_per_token(self) -> int:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return 2 * self.hidden + (q + 2 * kv) + q + 3 * self.intermediate


@dataclass(frozen=True)
class NativeStep:
    """One step's paging for the C loop (``PagedContext.native_step``): the cache's
    layers, the K/V write rows (``PagedKVCache.slot_rows``), the attention plan's ragged
    tables (int64) and the softmax scale."""

    kv_layers: ctypes.Array  # void* per layer, float32 [pages, 2, page_size, Hkv, D]
    kv_rows: torch.Tensor  # int64 [2 * tokens]
    qo_indptr: torch.Tensor
    kv_lens: torch.Tensor
    page_indptr: torch.Tensor
    page_indices: torch.Tensor
    page_size: int
    sm_scale: float


class DecoderLayers:
    """The C loop over a model's layers. ``layers``: per layer a dict of
    :data:`LAYER_TENSORS` (contiguous on the CPU; linears packed by
    ``dense_ops.pack_linear_weight``, all in one of :data:`WEIGHT_KINDS`; everything else
    float32; the biases and ``qk_norm`` may be None). Holds references to the tensors it
    points at."""

    def __init__(self, shape: Shape, layers: list[dict[str, torch.Tensor | None]]) -> None:
        gguf = bool(layers) and isinstance(layers[0]["qkv"], GGUFWeight)
        weight_dtype = "gguf" if gguf else layers[0]["qkv"].dtype if layers else torch.float32
        if not gguf and weight_dtype not in WEIGHT_KINDS:
            raise ValueError(f"no C loop for {weight_dtype} linears")
        for i, layer in enumerate(layers):
            for name in LAYER_TENSORS:
                tensor = layer[name]
                if name in LINEARS and gguf:
                    if not isinstance(tensor, GGUFWeight):
                        raise ValueError(f"layer {i} {name} must be a GGUFWeight like the rest")
                    continue
                dtype = weight_dtype if name in LINEARS else torch.float32
                if tensor is not None and (
                    tensor.dtype != dtype or not tensor.is_cpu or not tensor.is_contiguous()
                ):
                    raise ValueError(f"layer {i} {name} must be a contiguous {dtype} CPU tensor")
            for name in ("input_norm", "qkv", "o_proj", "post_norm", "gate_up", "down"):
                if layer[name] is None:
                    raise ValueError(f"layer {i} has no {name}")
        self.shape = shape
        self.weight_kind = GGUF_KIND if gguf else WEIGHT_KINDS[weight_dtype]
        self.num_layers = len(layers)
        self._tensors = layers
        table = (_Layer * len(layers))()
        for entry, layer in zip(table, layers, strict=True):
            for name in LAYER_TENSORS:
                tensor = layer[name]
                setattr(entry, name, None if tensor is None else _address(tensor))
        self._table = table
        self._kernel = load_library().specdec_decoder_layers
        self._greedy = load_library().specdec_greedy_decode

    def __call__(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        step: NativeStep,
    ) -> torch.Tensor:
        """Run every layer on ``hidden [T, hidden]`` (float32); returns the new hidden
        states (a new tensor). ``cos`` / ``sin_signed`` are the whole RoPE tables and
        ``positions`` int64 ``[T]`` already range-checked (``RotaryEmbedding.for_step``)."""
        s = self.shape
        tokens = hidden.shape[0]
        if hidden.dtype != torch.float32 or hidden.shape[1:] != (s.hidden,):
            raise ValueError(f"hidden must be float32 [T, {s.hidden}]")
        if positions.dtype != torch.int64 or positions.shape != (tokens,):
            raise ValueError(f"positions must be int64 [{tokens}]")
        if step.kv_rows.shape != (2 * tokens,) or len(step.kv_layers) != self.num_layers:
            raise ValueError("the step's KV rows or layers do not match the batch and model")
        out = hidden.contiguous().clone()
        positions = positions.contiguous()
        scratch = torch.empty(tokens * s.scratch_floats_per_token, dtype=torch.float32)
        spec = self._step(tokens, positions, cos, sin_signed, step)
        status = self._kernel(self._table, self.num_layers, ctypes.byref(spec), out.data_ptr(),
                              scratch.data_ptr())  # fmt: skip
        _check(status)
        return out

    def greedy(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        step: NativeStep,
        head: GreedyHead,
        min_prob: float = 0.0,
        min_prob_from: int = 0,
        stop: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding in one C call: each of the batch's sequences feeds its token of
        ``tokens [B]`` (int64), picks the argmax of the head's logits, and feeds that next,
        ``steps`` times; returns the picks ``[steps, B]`` and how many each kept ``[B]``:
        a sequence stops before its first pick whose probability is below ``min_prob``,
        the first ``min_prob_from`` picks excepted (its later rows are not picks).
        ``positions``, ``step.kv_rows`` and ``step.kv_lens`` hold one row per forward
        (``[steps, B]``, ``[steps, 2 B]``, ``[steps, B]``); the page tables cover every
        forward's tokens. ``stop``: None, or an int32 [1] flag another thread may set to end
        the loop before its next forward, each sequence keeping the picks made so far."""
        s = self.shape
        steps, batch = positions.shape
        if tokens.dtype != torch.int64 or tokens.shape != (batch,):
            raise ValueError(f"tokens must be int64 [{batch}]")
        if step.kv_rows.shape != (steps, 2 * batch) or step.kv_lens.shape != (steps, batch):
            raise ValueError("the step's KV rows or lengths do not match [steps, batch]")
        if self.weight_kind == GGUF_KIND:
            if not isinstance(head.head, GGUFWeight) or not isinstance(head.embed, GGUFWeight):
                raise ValueError("the head and the embedding must be GGUF blocks like the layers")
            rows = head.head.out_features
        elif head.head.dtype != next(d for d, k in WEIGHT_KINDS.items() if k == self.weight_kind):
            raise ValueError("the head must be packed in the layers' dtype")
        else:
            rows = head.head.shape[0] * head.head.shape[2]
        out = torch.empty(steps, batch, dtype=torch.int64)
        hidden = torch.empty(batch, s.hidden, dtype=torch.float32)
        scratch = torch.empty(batch * s.scratch_floats_per_token, dtype=torch.float32)
        logits = torch.empty(batch, rows, dtype=torch.float32)
        num_picks = torch.empty(batch, dtype=torch.int64)
        spec = self._step(batch, positions[0], cos, sin_signed, step)
        greedy = _Greedy(
            steps, _address(head.embed), head.norm.data_ptr(), head.eps, _address(head.head),
            rows, None if head.token_ids is None else head.token_ids.data_ptr(),
            positions.data_ptr(), step.kv_rows.data_ptr(), step.kv_lens.data_ptr(),
            min_prob, min_prob_from, num_picks.data_ptr(),
            None if stop is None else _int32_flag(stop),
        )  # fmt: skip
        status = self._greedy(
            self._table, self.num_layers, ctypes.byref(spec), ctypes.byref(greedy),
            tokens.data_ptr(), out.data_ptr(), hidden.data_ptr(), scratch.data_ptr(),
            logits.data_ptr(),
        )  # fmt: skip
        _check(status)
        return out, num_picks

    def _step(self, tokens, positions, cos, sin_signed, step: NativeStep) -> _Step:
        s = self.shape
        return _Step(
            tokens, s.hidden, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate,
            s.eps, s.qk_eps, step.sm_scale, cos.data_ptr(), sin_signed.data_ptr(),
            positions.data_ptr(), ctypes.addressof(step.kv_layers), step.kv_rows.data_ptr(),
            step.qo_indptr.data_ptr(), step.kv_lens.data_ptr(), step.page_indptr.data_ptr(),
            step.page_indices.data_ptr(), step.qo_indptr.shape[0] - 1, step.page_size,
            self.weight_kind,
        )  # fmt: skip


def _address(weight: torch.Tensor | GGUFWeight) -> int:
    return weight.address if isinstance(weight, GGUFWeight) else weight.data_ptr()


def _int32_flag(flag: torch.Tensor) -> int:
    if flag.dtype != torch.int32 or flag.numel() != 1 or not flag.is_cpu:
        raise ValueError("stop must be a CPU int32 tensor of one element")
    return flag.data_ptr()


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("the decoder layers could not allocate attention scratch memory")
