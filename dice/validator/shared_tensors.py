"""Tensors the judge owns and a runner process reads and writes: CUDA IPC on the GPU, ``memfd`` on the CPU.

The judge (:mod:`dice.validator.judge`) allocates every buffer a candidate sees -- its forward's inputs and
the slots its outputs are copied into -- so what it compares is memory it owns, read after the runner said
"done", and what the candidate got is exactly what it handed over.

- On a GPU each buffer is its own ``cudaMalloc`` (CuPy's runtime binding, outside torch's caching allocator,
  so an IPC handle covers exactly one buffer) viewed as a torch tensor through DLPack; the runner opens its
  ``cudaIpcMemHandle``. Why raw CUDA IPC rather than ``torch.multiprocessing``: torch's CUDA sharing adds a
  reference-counting file in ``/dev/shm`` and a producer that must outlive every consumer, and it unpickles
  on the receiving side; here the descriptors are plain JSON the judge writes and the runner only reads.
- On the CPU (the tests, ``DICE_VALIDATOR_EMULATE=cpu``) each buffer is a ``memfd`` mapped on both sides;
  its file descriptor travels with the request that creates the runner's view (``SCM_RIGHTS``).

A buffer keeps the layout of the tensor it was made like (shape, strides, storage offset), so a
non-contiguous input stays non-contiguous for the candidate.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import Any

DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "complex64",
    "complex128",
)


def dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"tensors of dtype {name} cannot be shared with the candidate's process")
    return name


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}")
    return getattr(torch, name)


class SharedBuffers:
    """Judge side: one shared buffer per tensor of ``like`` (same dtype and layout), on ``device``.

    ``tensors`` are the judge's views; ``descriptors()`` and ``fds`` are what a runner needs to open them
    (:func:`open_buffers`). ``close()`` frees them (CUDA) or unmaps them (CPU)."""

    def __init__(self, like: list[Any], device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.tensors: list[Any] = []
        self.fds: list[int] = []
        self._descriptors: list[dict[str, Any]] = []
        self._release: list[Any] = []
        try:
            for x in like:
                self._add(x)
        except BaseException:
            self.close()
            raise

    def _add(self, x: Any) -> None:
        nbytes = max(int(x.untyped_storage().nbytes()), x.element_size(), 1)
        layout = {
            "dtype": dtype_name(x.dtype),
            "shape": list(x.shape),
            "stride": list(x.stride()),
            "offset": int(x.storage_offset()),
            "nbytes": nbytes,
        }
        if self.device.type == "cuda":
            raw, handle, release = _cuda_alloc(nbytes, self.device)
            layout["handle"] = handle.hex()
        else:
            fd = os.memfd_create("dice-shared", os.MFD_CLOEXEC)
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes)
            raw = _from_mmap(mm)
            layout["fd_index"] = len(self.fds)
            self.fds.append(fd)
            release = mm
        self._release.append(release)
        self.tensors.append(_view(raw, layout))
        self._descriptors.append(layout)

    def descriptors(self) -> list[dict[str, Any]]:
        return [dict(d) for d in self._descriptors]

    def close(self) -> None:
        self.tensors = []
        for item in self._release:
            # a view still alive keeps a CPU mapping: the process's end releases it
            with contextlib.suppress(BufferError, OSError, RuntimeError, ValueError):
                item.close()
        self._release = []
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def open_buffers(descriptors: list[dict[str, Any]], fds: list[int], device: Any) -> list[Any]:
    """Runner side: torch views of the judge's buffers (CUDA IPC handles, or the passed memfds)."""
    import torch

    device = torch.device(device)
    out = []
    for d in descriptors:
        nbytes = int(d["nbytes"])
        if "handle" in d:
            raw = _cuda_open(bytes.fromhex(str(d["handle"])), nbytes, device)
        else:
            mm = mmap.mmap(fds[int(d["fd_index"])], nbytes)
            raw = _from_mmap(mm)
        out.append(_view(raw, d))
    return out


def _view(raw: Any, layout: dict[str, Any]) -> Any:
    """The typed, strided view of a raw uint8 buffer."""
    import torch

    dtype = torch_dtype(str(layout["dtype"]))
    size = torch.empty((), dtype=dtype).element_size()
    typed = raw[: raw.numel() // size * size].view(dtype)
    shape = [int(s) for s in layout["shape"]]
    stride = [int(s) for s in layout["stride"]]
    return typed.as_strided(shape, stride, int(layout["offset"]))


def _from_mmap(mm: mmap.mmap) -> Any:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": it is (a shared mapping)
        return torch.frombuffer(mm, dtype=torch.uint8)


class _CudaBuffer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def close(self) -> None:
        import cupy

        if self.ptr:
            cupy.cuda.runtime.free(self.ptr)
            self.ptr = 0


def _cuda_alloc(nbytes: int, device: Any) -> tuple[Any, bytes, _CudaBuffer]:
    import cupy

    with cupy.cuda.Device(device.index or 0):
        ptr = cupy.cuda.runtime.malloc(nbytes)
        handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr))
    buffer = _CudaBuffer(ptr)
    return _torch_bytes(ptr, nbytes, device, buffer), handle, buffer


def _cuda_open(handle: bytes, nbytes: int, device: Any) -> Any:
    import cupy

    with cupy.cuda.Device(device.index or 0):
        # cudaIpcMemLazyEnablePeerAccess (1); the mapping lives as long as the runner (one task)
        ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle, 1)
    return _torch_bytes(ptr, nbytes, device, None)


def _torch_bytes(ptr: int, nbytes: int, device: Any, owner: Any) -> Any:
    """A torch uint8 CUDA tensor over ``nbytes`` at ``ptr`` (no copy), through CuPy and DLPack."""
    import cupy
    import torch

    memory = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device.index or 0)
    array = cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))
    return torch.from_dlpack(array)
