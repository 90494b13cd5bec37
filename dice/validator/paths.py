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
    """nvcc from $DICE_NVCC (a path; ``0``/``none``: no nvcc, NVRTC checks alone), $CUDA_HOME,
    /usr/local/cuda or PATH, or None."""
    chosen = os.environ.get("DICE_NVCC", "").strip()
    if chosen.lower() in ("0", "none", "off", "false"):
        return None
    if chosen:
        return chosen if os.path.isfile(chosen) else shutil.which(chosen)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


@lru_cache(maxsize=1)
def toolkit_include_dir() -> str | None:
    """The CUDA toolkit's own include folder (the one nvcc searches: it has ``crt/``, ``mma.h``), or None."""
    candidates: list[str] = []
    nvcc = nvcc_path()
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1] / "include"))
    candidates.append("/usr/local/cuda/include")
    for d in candidates:
        if os.path.isfile(os.path.join(d, "cuda_runtime.h")) and os.path.isdir(os.path.join(d, "crt")):
            return d
    return None


@lru_cache(maxsize=1)
def pip_cuda_include_dir() -> str | None:
    """The CUDA headers of the pip wheels (``nvidia/cu13/include`` of ``cupy-cuda13x[ctk]``), or None.

    They may be a newer CUDA than the toolkit's (13.5 beside 13.0) but hold what the toolkit may lack
    (``cublas_v2.h``, ``curand_kernel.h``): search them after the toolkit's, never before."""
    try:
        import cupy.cuda

        root = cupy.cuda.get_cuda_path()
    except Exception:  # noqa: BLE001 - no CuPy: no pip headers
        return None
    if not root:
        return None
    d = os.path.join(root, "include")
    if not os.path.isfile(os.path.join(d, "cuda_runtime.h")):
        return None
    toolkit = toolkit_include_dir()
    if toolkit is not None and os.path.realpath(d) == os.path.realpath(toolkit):
        return None  # CuPy uses the toolkit itself
    return d


@lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[str, ...]:
    """Folders NVRTC needs for CUDA headers (``cuda_fp16.h``, ``mma.h``) and libcu++/CUB
    (``<cuda/std/cmath>``): it searches none by itself.

    In this order: the toolkit's include folder (it has ``crt/``, which ``mma.h`` needs; the pip folder does
    not), CuPy's bundled headers and CCCL, then the pip CUDA headers, searched last so that a newer runtime
    there never shadows the toolkit's and only what the toolkit lacks comes from it. Without a toolkit the
    pip folder comes first, as the one CUDA header folder."""
    toolkit = toolkit_include_dir()
    pip = pip_cuda_include_dir()
    candidates: list[str] = [toolkit] if toolkit else ([pip] if pip else [])
    try:
        import cupy

        core = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
        candidates += [
            core,
            os.path.join(core, "cupy", "_cccl", "libcudacxx"),
            os.path.join(core, "cupy", "_cccl", "cub"),
        ]
    except Exception:  # noqa: BLE001 - a broken CuPy install only costs these include folders
        pass
    if toolkit and pip:
        candidates.append(pip)
    dirs: list[str] = []
    for d in candidates:
        if d not in dirs and os.path.isdir(d):
            dirs.append(d)
    return tuple(dirs)


def default_arch() -> str:
    """Target for compile-only checks without a GPU: $DICE_CUDA_ARCH (e.g. ``90``) or 90 (Hopper)."""
    return os.environ.get("DICE_CUDA_ARCH", "90").replace("sm_", "").replace("compute_", "").replace(".", "")
