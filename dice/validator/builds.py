"""Building and importing a KernelBench candidate inside a worker: the on-disk extension cache, module import
from source text, and the kernel names its sources define.

Extensions built with ``load_inline`` are cached on disk by the hash of their sources and flags
(``<cache>/torch_ext/<hash>``): identical sources in any later candidate, worker or process load in well under
a second instead of a full nvcc + C++ build.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from dice.validator.paths import source_hash


@contextlib.contextmanager
def cached_extension_builds(cache_root: Path, records: list[dict[str, Any]]) -> Iterator[None]:
    """Route ``load_inline`` to a build folder keyed by the hash of its sources and flags.

    Each call appends a record ``{"name", "key", "cached", "sources", "seconds"}`` to ``records``.
    """
    import torch
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline

    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        flags = {k: v for k, v in kwargs.items() if k not in ("verbose", "build_directory")}
        key = source_hash(
            name,
            json.dumps([cpp_sources, cuda_sources, [repr(a) for a in args]], default=repr),
            json.dumps(sorted((k, repr(v)) for k, v in flags.items())),
            torch.__version__,
            torch.version.cuda or "",
            _arch_list(),
        )
        build_dir = cache_root / "torch_ext" / key
        build_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps([cpp_sources, cuda_sources])
        # A module name tied to the hash keeps two candidates that both say "my_ext" apart in one process,
        # unless the source hard-codes its own PYBIND11_MODULE name.
        unique = "PYBIND11_MODULE(" not in text or "TORCH_EXTENSION_NAME" in text
        ext_name = f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{key[:12]}" if unique else name
        cached = any(build_dir.glob("*.so"))
        kwargs.update(build_directory=str(build_dir), verbose=False)
        start = time.perf_counter()
        record: dict[str, Any] = {
            "name": name,
            "key": key,
            "cached": cached,
            "sources": cuda_sources or cpp_sources,
        }
        records.append(record)
        try:
            return original(ext_name, cpp_sources, cuda_sources, *args, **kwargs)
        finally:
            record["seconds"] = time.perf_counter() - start

    cpp_extension.load_inline = load_inline
    try:
        yield
    finally:
        cpp_extension.load_inline = original


def _arch_list() -> str:
    return os.environ.get("TORCH_CUDA_ARCH_LIST", "")


def describe_builds(records: list[dict[str, Any]]) -> str:
    """The log line for the builds of one candidate: ``builds: my_ext (cached 0.3 s)`` or ``builds: none``."""
    if not records:
        return "builds: none"
    return "builds: " + ", ".join(
        f"{r['name']} ({'cached' if r['cached'] else 'built'} {r.get('seconds', 0):.1f} s)" for r in records
    )


def import_source(src: str, path: Path, module_name: str) -> ModuleType:
    """Write ``src`` to ``path`` and import it as ``module_name`` (left out of ``sys.modules`` on failure)."""
    path.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def built_kernel_names(records: list[dict[str, Any]], cand_src: str) -> list[str]:
    """Kernel names for the launch check: from the sources ``load_inline`` really received, plus every string
    constant of the candidate holding a kernel (CuPy RawKernel sources; ``cpp_extension.load`` files
    excepted)."""
    sources = [str(s) for r in records for s in _as_list(r["sources"])] + kernel_strings(cand_src)
    return kernel_names(sources)


def kernel_strings(src: str) -> list[str]:
    """String constants of a Python source that hold CUDA kernels (contain ``__global__``)."""
    return [
        node.value
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value
    ]


def kernel_names(sources: list[str]) -> list[str]:
    """Names of the ``__global__`` functions defined in CUDA sources, each once, in order."""
    from dice.cuda_source import parse_document

    names: list[str] = []
    for src in sources:
        for fn in parse_document(src).functions:
            if fn.kind == "global" and fn.name and fn.name not in names:
                names.append(fn.name)
    return names


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]
