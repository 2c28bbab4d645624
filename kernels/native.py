"""The CPU kernels in ``kernels/csrc``: compiled on first use with the system C compiler.

Plain C files with no Python or torch headers, built where they run (as FlashInfer and
Triton JIT-compile theirs) rather than at install time, into one shared library loaded with
``ctypes``: once per machine and source version, the sources compiled side by side on
every core (45-49 s on the 2-core development machine, 69-80 s one file at a time; nearly
all of it the GGUF linears' three instruction-set copies, ``gguf_portable.c``,
``gguf_avx2.c``, ``gguf_avx512.c``; the Docker image builds it at build time). It is cached under
``$SPECDEC_CACHE_DIR`` (default ``~/.cache/specdec``), keyed by a hash of the sources, the
compiler and the flags; ``CC`` picks the compiler (default ``cc``). Function
multiversioning in the sources selects AVX-512, AVX2 or baseline code for the CPU; a small
thread pool (``csrc/threads.c``, ``dense_ops.set_num_threads``) splits the linears.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
# Reassociation lets the dot products and the softmax sums vectorise; the kernels keep
# every value finite (no infinities, no NaN tests). Compiling and linking apart keeps
# -ffast-math's start-up object, which would flush denormals process-wide, out of the
# library.
CFLAGS = (
    "-O3",
    "-std=c11",
    "-fPIC",
    "-fopenmp-simd",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fno-signed-zeros",
    "-fassociative-math",
    "-freciprocal-math",
    "-ffinite-math-only",
    "-ffp-contract=fast",
)

# Per file, after CFLAGS: the GGUF linears keep float32's order of operations (a
# reassociated dequantisation or sum would differ between row counts: no batch invariance).
GGUF_CFLAGS = ("-fno-associative-math", "-fno-reciprocal-math")
SOURCE_CFLAGS = {
    name: GGUF_CFLAGS for name in ("gguf_ops.c", "gguf_portable.c", "gguf_avx2.c", "gguf_avx512.c")
}

_P, _I32, _I64, _F32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
# The exported functions: name -> argument types (all return int or nothing).
SIGNATURES: dict[str, list[type]] = {
    "specdec_paged_attention": [_P, _I64, _P, _I32, _P, *[_P] * 4, *[_I32] * 5, _F32, _F32, _P],
    "specdec_rms_norm": [_P, _I64, _P, _F32, _P, _I64, _I64, _I32],
    "specdec_qk_norm_rope": [_P, _I64, _I64, _I32, _I32, _P, _F32, _P, _P, _P],
    "specdec_silu_and_mul": [_P, _I64, _I32, _P],
    "specdec_write_kv": [_P, _P, _P, _I64, _P, _I64, _I64, _I32],
    **{
        name: [_P, _I64, _P, _P, _P, _I64, _P, _I64, _I32, _I32]
        for name in (
            "specdec_linear",
            "specdec_linear_bf16",
            "specdec_linear_f16",
            "specdec_linear_i8",
            "specdec_linear_gguf",
        )
    },
    "specdec_gguf_rows": [_P, _P, _I64, _I32, _P],
    "specdec_gguf_set_isa": [_I32],
    "specdec_decoder_layers": [_P, _I32, _P, _P, _P],
    "specdec_greedy_decode": [_P, _I32, *[_P] * 7],
    "specdec_set_num_threads": [_I32],
    "specdec_num_threads": [],
}
RETURNS_STATUS = {
    "specdec_paged_attention",
    "specdec_decoder_layers",
    "specdec_greedy_decode",
    "specdec_set_num_threads",
    "specdec_num_threads",
    "specdec_gguf_set_isa",
}


class NativeBuildError(RuntimeError):
    """The C kernels could not be compiled or loaded here (no compiler, or it failed)."""


def cache_root() -> Path:
    """``$SPECDEC_CACHE_DIR``, default ``~/.cache/specdec``: what specdec builds, kept."""
    return Path(os.environ.get("SPECDEC_CACHE_DIR") or Path.home() / ".cache" / "specdec")


def cache_dir() -> Path:
    return cache_root() / "native"


def compile_step(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NativeBuildError(
            f"building the CPU kernels failed: {' '.join(command)}\n{result.stderr.strip()}"
        )


def build_library(compiler: str, folder: Path = CSRC) -> Path:
    """Compile ``folder/*.c`` into one library in the cache (unless an identical build is
    there); return its path."""
    sources = sorted(folder.glob("*.c"))
    inputs = sorted([*sources, *folder.glob("*.h")])
    parts = [p.name.encode() + p.read_bytes() for p in inputs]
    parts += [compiler.encode(), *map(str.encode, CFLAGS), platform.machine().encode()]
    parts += [f"{name}:{' '.join(flags)}".encode() for name, flags in SOURCE_CFLAGS.items()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    target = cache_dir() / f"specdec_kernels-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a scratch folder beside the target, then rename: concurrent builders never
    # see a partial file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        objects = [str(Path(scratch) / f"{src.stem}.o") for src in sources]
        partial = str(Path(scratch) / target.name)
        commands = [
            [compiler, *CFLAGS, *SOURCE_CFLAGS.get(src.name, ()), "-c", str(src), "-o", obj]
            for src, obj in zip(sources, objects, strict=True)
        ]
        # The sources side by side on every core (the GGUF linears' three copies take most
        # of the time), then the link.
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(compile_step, commands))
        compile_step([compiler, "-shared", "-pthread", *objects, "-o", partial, "-lm"])
        os.replace(partial, target)
    return target


@functools.cache
def load_library() -> ctypes.CDLL:
    """The compiled kernels, built on first call. NativeBuildError if that is impossible."""
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise NativeBuildError(
            f"no C compiler {compiler!r} on PATH to build the CPU kernels; install one "
            f"(e.g. apt-get install gcc), set CC, or use the 'reference' attention backend"
        )
    try:
        lib = ctypes.CDLL(str(build_library(compiler)))
    except OSError as exc:  # unwritable cache, unloadable library
        raise NativeBuildError(
            f"cannot build or load the CPU kernels in {cache_dir()}: {exc}; set "
            f"SPECDEC_CACHE_DIR to a writable folder or use the 'reference' attention backend"
        ) from exc
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int if name in RETURNS_STATUS else None
    return lib
