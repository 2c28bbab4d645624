"""The CPU kernels in ``kernels/csrc``: compiled on first use with the system C compiler.

A single C file with no Python or torch headers compiles in about a second, so it is built
where it runs (as FlashInfer and Triton JIT-compile theirs) rather than at install time,
and loaded with ``ctypes``. The shared library is cached under ``$SPECDEC_CACHE_DIR``
(default ``~/.cache/specdec``), keyed by a hash of the source, the compiler and the flags;
``CC`` picks the compiler (default ``cc``). Function multiversioning inside the source
selects AVX-512, AVX2 or baseline code for the CPU it runs on.
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
from pathlib import Path

SOURCE = Path(__file__).with_name("csrc") / "paged_attention.c"
# Reassociation lets the dot products and the softmax sums vectorise; the kernel keeps
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
)


class NativeBuildError(RuntimeError):
    """The C kernels could not be compiled or loaded here (no compiler, or it failed)."""


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "specdec"
    return Path(os.environ.get("SPECDEC_CACHE_DIR") or default) / "native"


def build_library(compiler: str, source: Path = SOURCE) -> Path:
    """Compile ``source`` into the cache (unless an identical build is there); its path."""
    parts = [source.read_bytes(), compiler.encode(), *map(str.encode, CFLAGS)]
    key = hashlib.sha256(b"\0".join([*parts, platform.machine().encode()])).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compile beside the target and rename: concurrent builders never see a partial file.
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        obj = partial[: -len(".so")] + ".o"
        for command in (
            [compiler, *CFLAGS, "-c", str(source), "-o", obj],
            [compiler, "-shared", obj, "-o", partial, "-lm"],
        ):
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise NativeBuildError(
                    f"building {source.name} failed: {' '.join(command)}\n{result.stderr.strip()}"
                )
        os.replace(partial, target)
    finally:
        for leftover in (partial, partial[: -len(".so")] + ".o"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return target


@functools.cache
def load_library() -> ctypes.CDLL:
    """The compiled kernels, built on first call. NativeBuildError if that is impossible."""
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise NativeBuildError(
            f"no C compiler {compiler!r} on PATH to build the CPU attention kernel; install "
            f"one (e.g. apt-get install gcc), set CC, or use the 'reference' attention backend"
        )
    try:
        lib = ctypes.CDLL(str(build_library(compiler)))
    except OSError as exc:  # unwritable cache, unloadable library
        raise NativeBuildError(
            f"cannot build or load the CPU attention kernel in {cache_dir()}: {exc}; set "
            f"SPECDEC_CACHE_DIR to a writable folder or use the 'reference' attention backend"
        ) from exc
    fn = lib.specdec_paged_attention
    pointer, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    fn.argtypes = [
        pointer,
        pointer,
        i32,
        pointer,
        *([pointer] * 4),
        *([i32] * 5),
        f32,
        f32,
        pointer,
    ]
    fn.restype = i32
    return lib
