"""Building and importing a KernelBench candidate inside a worker: the on-disk extension cache, module import
from source text, and the kernel names its sources define.

Extensions built with ``load_inline`` are cached on disk by the hash of their sources and flags
(``<cache>/torch_ext/<hash>``): identical sources in any later candidate, worker or process load in well under
a second instead of a full nvcc + C++ build. A cold build is :mod:`dice.validator.fastbuild`'s (torch's own
``load_inline`` for what it does not handle); a key that a batched build (:mod:`dice.validator.batchbuild`)
recorded is served from the combined extension; a key whose build failed fails again with the same message.
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

    Each call appends a record ``{"name", "key", "cached", "sources", "seconds"}`` to ``records`` (plus
    ``"batched": True`` when a combined build served it, ``"build"``: the fast build's steps).
    """
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline

    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        return cached_load_inline(
            cache_root, records, original, name, cpp_sources, cuda_sources, args, kwargs
        )

    cpp_extension.load_inline = load_inline
    try:
        yield
    finally:
        cpp_extension.load_inline = original


def extension_key(
    name: str, cpp_sources: Any, cuda_sources: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    """The cache key of one ``load_inline`` call: its sources, arguments and flags, torch, CUDA, archs."""
    import torch

    flags = {k: v for k, v in kwargs.items() if k not in ("verbose", "build_directory")}
    return source_hash(
        name,
        json.dumps([cpp_sources, cuda_sources, [repr(a) for a in args]], default=repr),
        json.dumps(sorted((k, repr(v)) for k, v in flags.items())),
        torch.__version__,
        torch.version.cuda or "",
        _arch_list(),
    )


def extension_name(name: str, key: str, cpp_sources: Any, cuda_sources: Any) -> str:
    """The module name the call is built under: tied to the hash, so two candidates that both say "my_ext"
    stay apart in one process, unless the source hard-codes its own PYBIND11_MODULE name."""
    text = json.dumps([cpp_sources, cuda_sources])
    unique = "PYBIND11_MODULE(" not in text or "TORCH_EXTENSION_NAME" in text
    return f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{key[:12]}" if unique else name


def cached_load_inline(
    cache_root: Path,
    records: list[dict[str, Any]],
    original: Any,
    name: str,
    cpp_sources: Any,
    cuda_sources: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """One intercepted ``load_inline`` call: the build folder's ``.so``, a combined build's functions, the
    error recorded for these sources, or a build (:mod:`dice.validator.fastbuild`, else torch's own)."""
    from dice.validator import fastbuild

    key = extension_key(name, cpp_sources, cuda_sources, args, kwargs)
    build_dir = cache_root / "torch_ext" / key
    ext_name = extension_name(name, key, cpp_sources, cuda_sources)
    start = time.perf_counter()
    record: dict[str, Any] = {
        "name": name,
        "key": key,
        "cached": False,
        "sources": cuda_sources or cpp_sources,
    }
    records.append(record)
    try:
        with fastbuild.key_lock(build_dir):
            record["cached"] = (build_dir / f"{ext_name}.so").is_file()
            if record["cached"]:
                return fastbuild.import_extension(ext_name, build_dir / f"{ext_name}.so")
            served = fastbuild.load_from_batch(build_dir, ext_name)
            if served is not None:
                record.update(cached=True, batched=True)
                return served
            failure = fastbuild.recorded_failure(build_dir)
            if failure is not None:
                record["cached"] = True
                raise RuntimeError(failure)
            kwargs = dict(kwargs, build_directory=str(build_dir), verbose=False)
            call = _bound_arguments(original, cpp_sources, cuda_sources, args, kwargs)
            reason = "unusual arguments" if call is None else fastbuild.fallback_reason(call)
            if reason is not None or call is None:
                record["fallback"] = reason
                return original(ext_name, cpp_sources, cuda_sources, *args, **kwargs)
            record["build"] = info = {}
            call.pop("cpp_sources")
            return fastbuild.load(
                original, ext_name, cpp_sources, call.pop("cuda_sources"), call, cache_root, info
            )
    finally:
        record["seconds"] = time.perf_counter() - start


def _bound_arguments(
    original: Any, cpp_sources: Any, cuda_sources: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """The call's arguments by name (positional ones after ``cuda_sources`` too), None if they do not fit
    ``load_inline``'s signature."""
    import inspect

    try:
        bound = inspect.signature(original).bind("name", cpp_sources, cuda_sources, *args, **kwargs)
    except (TypeError, ValueError):
        return None
    call = dict(bound.arguments)
    call.pop("name", None)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(original).parameters.values()):
        return None
    return call


def _arch_list() -> str:
    return os.environ.get("TORCH_CUDA_ARCH_LIST", "")


def describe_builds(records: list[dict[str, Any]]) -> str:
    """The log line for the builds of one candidate: ``builds: my_ext (cached 0.3 s)`` (``my_ext [batched]
    (cached 0.0 s)`` when a combined build served it) or ``builds: none``."""
    if not records:
        return "builds: none"

    def item(r: dict[str, Any]) -> str:  # "(cached|built N s)" is what BatchStats counts: keep its form
        where = " [batched]" if r.get("batched") else ""
        return f"{r['name']}{where} ({'cached' if r['cached'] else 'built'} {r.get('seconds', 0):.1f} s)"

    return "builds: " + ", ".join(item(r) for r in records)


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
