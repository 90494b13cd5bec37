"""Where the validator keeps its persistent build caches, and the toolchain it finds on this machine."""

from __future__ import annotations

import hashlib
import os
import shutil
from functools import lru_cache
from pathlib import Path


def cache_dir() -> Path:
    """``$DICE_CACHE_DIR`` or ``$XDG_CACHE_HOME/dice`` or ``~/.cache/dice``: builds here survive restarts."""
    env = os.environ.get("DICE_CACHE_DIR")
    if env:
        root = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "dice"
    path = root / "validator"
    path.mkdir(parents=True, exist_ok=True)
    return path


def source_hash(*parts: str | bytes | None, length: int = 20) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = b"\x00<none>" if part is None else (part.encode() if isinstance(part, str) else part)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:length]


@lru_cache(maxsize=1)
def nvcc_path() -> str | None:
    """nvcc from $CUDA_HOME, /usr/local/cuda or PATH, or None."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


@lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[str, ...]:
    """Folders NVRTC needs for CUDA headers (``cuda_fp16.h``) and libcu++/CUB (``<cuda/std/cmath>``): it
    searches none by itself. From CuPy's CUDA (pip wheels or a toolkit), CuPy's bundled CCCL, then nvcc's."""
    candidates: list[str] = []
    try:
        import cupy
        import cupy.cuda

        cupy_cuda = cupy.cuda.get_cuda_path()
        if cupy_cuda:
            candidates.append(os.path.join(cupy_cuda, "include"))
        core = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
        candidates += [
            core,
            os.path.join(core, "cupy", "_cccl", "libcudacxx"),
            os.path.join(core, "cupy", "_cccl", "cub"),
        ]
    except Exception:  # noqa: BLE001 - a broken CuPy install only costs these include folders
        pass
    nvcc = nvcc_path()
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1] / "include"))
    candidates.append("/usr/local/cuda/include")
    dirs: list[str] = []
    have_cuda_headers = False
    for d in candidates:
        if d in dirs or not os.path.isdir(d):
            continue
        is_cuda = os.path.isfile(os.path.join(d, "cuda_fp16.h"))
        if is_cuda and have_cuda_headers:
            continue  # one CUDA header folder: two versions would clash
        have_cuda_headers |= is_cuda
        dirs.append(d)
    return tuple(dirs)


def default_arch() -> str:
    """Target for compile-only checks without a GPU: $DICE_CUDA_ARCH (e.g. ``90``) or 90 (Hopper)."""
    return os.environ.get("DICE_CUDA_ARCH", "90").replace("sm_", "").replace("compute_", "").replace(".", "")
