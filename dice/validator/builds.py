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
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from dice.validator.paths import source_hash


@contextlib.contextmanager
def cached_extension_builds(
    cache_root: Path,
    records: list[dict[str, Any]],
    builder: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    private_root: Path | None = None,
) -> Iterator[None]:
    """Route ``load_inline`` to a build folder keyed by the hash of its sources and flags.

    Each call appends a record ``{"name", "key", "cached", "sources", "seconds"}`` to ``records`` (plus
    ``"batched": True`` when a combined build served it, ``"build"``: the fast build's steps).
    ``builder`` set (a runner, whose cache is read-only): a call the cache cannot serve is sent to it as
    plain data (:func:`call_payload`) and built by the builder process (:mod:`dice.validator.builder`);
    a call that is not plain data is built in ``private_root``, for this process alone. Without one, this
    process builds into the cache itself (the builder, tests).
    """
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline

    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        return cached_load_inline(
            cache_root,
            records,
            original,
            name,
            cpp_sources,
            cuda_sources,
            args,
            kwargs,
            builder,
            private_root,
        )

    cpp_extension.load_inline = load_inline
    try:
        yield
    finally:
        cpp_extension.load_inline = original


def _flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k not in ("verbose", "build_directory")}


def extension_key(
    name: str, cpp_sources: Any, cuda_sources: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
) -> str:
    """The cache key of one ``load_inline`` call: its sources, arguments and flags, torch, CUDA, archs.
    Computed on the JSON form (a tuple and a list are the same), so that the builder, which gets the call
    as JSON, computes the key the runner looks up."""
    import torch

    try:
        flags = json.dumps(_flags(kwargs), sort_keys=True, default=repr)
    except TypeError:  # keys that do not sort
        flags = json.dumps(sorted((str(k), repr(v)) for k, v in _flags(kwargs).items()))
    return source_hash(
        name,
        json.dumps([cpp_sources, cuda_sources, list(args)], default=repr),
        flags,
        torch.__version__,
        torch.version.cuda or "",
        _arch_list(),
    )


MAX_CALL = 16 << 20


def call_payload(
    name: str, cpp_sources: Any, cuda_sources: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """The call as plain data for the builder, or None when it is not plain data (or too large)."""
    payload = {
        "name": name,
        "cpp_sources": cpp_sources,
        "cuda_sources": cuda_sources,
        "args": list(args),
        "kwargs": _flags(kwargs),
    }
    try:
        text = json.dumps(payload)
    except (TypeError, ValueError):
        return None
    return json.loads(text) if len(text) <= MAX_CALL else None


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
    builder: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    private_root: Path | None = None,
) -> Any:
    """One intercepted ``load_inline`` call: the build folder's ``.so`` (its content hash checked against
    the builder's manifest), a combined build's functions, the error recorded for these sources, or a
    build (:func:`build_into_cache` here or in the builder), then the cache again."""
    key = extension_key(name, cpp_sources, cuda_sources, args, kwargs)
    build_dir = cache_root / "torch_ext" / key
    ext_name = extension_name(name, key, cpp_sources, cuda_sources)
    python_module = bool(kwargs.get("is_python_module", True))
    start = time.perf_counter()
    record: dict[str, Any] = {
        "name": name,
        "key": key,
        "cached": True,
        "sources": cuda_sources or cpp_sources,
    }
    records.append(record)
    try:
        served = _from_cache(build_dir, ext_name, record, python_module)
        if served is not None:
            return served
        record["cached"] = False
        if builder is None:
            outcome = build_into_cache(cache_root, original, name, cpp_sources, cuda_sources, args, kwargs)
        else:
            payload = call_payload(name, cpp_sources, cuda_sources, args, kwargs)
            if payload is None:  # not plain data: built for this process alone, outside the shared cache
                record["fallback"] = "arguments that are not plain data: a private build"
                folder = (private_root or cache_root / "private") / key
                folder.mkdir(parents=True, exist_ok=True)
                private = dict(kwargs, build_directory=str(folder), verbose=False)
                return original(ext_name, cpp_sources, cuda_sources, *args, **private)
            outcome = builder(payload)
        for field in ("build", "fallback"):
            if outcome.get(field):
                record[field] = outcome[field]
        if not outcome.get("ok"):
            raise RuntimeError(str(outcome.get("message") or "the extension build failed"))
        served = _from_cache(build_dir, ext_name, record, python_module)
        if served is None:
            raise RuntimeError(
                f"the extension built for {name!r} is missing or fails its content-hash check (build cache "
                f"{build_dir})"
            )
        return served
    finally:
        record["seconds"] = time.perf_counter() - start


def _from_cache(build_dir: Path, ext_name: str, record: dict[str, Any], python_module: bool) -> Any:
    """The module the cache holds for this key (hash-checked), or raises its recorded compile error; None
    when it has neither."""
    from dice.validator import fastbuild

    so = fastbuild.verified_so(build_dir, ext_name)
    if so is not None:
        return fastbuild.import_extension(ext_name, so, python_module)
    served = fastbuild.load_from_batch(build_dir, ext_name)
    if served is not None:
        record["batched"] = True
        return served
    failure = fastbuild.recorded_failure(build_dir)
    if failure is not None:
        raise RuntimeError(failure)
    return None


def build_into_cache(
    cache_root: Path,
    original: Any,
    name: str,
    cpp_sources: Any,
    cuda_sources: Any,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """Build one call into ``<cache>/torch_ext/<key>`` (nothing imported) and write its manifest, under
    the key's lock: ``{"ok", "message", "build" (the steps), "fallback" (why torch's own build)}``. The
    key is computed here, from the call itself, never taken from whoever asked."""
    from dice.validator import fastbuild

    key = extension_key(name, cpp_sources, cuda_sources, tuple(args), kwargs)
    build_dir = cache_root / "torch_ext" / key
    ext_name = extension_name(name, key, cpp_sources, cuda_sources)
    outcome: dict[str, Any] = {"ok": True, "message": "", "key": key}
    with fastbuild.key_lock(build_dir):
        if fastbuild.verified_so(build_dir, ext_name) is not None:
            return outcome
        if fastbuild.load_from_batch_record(build_dir) is not None:
            return outcome
        failure = fastbuild.recorded_failure(build_dir)
        if failure is not None:
            return dict(outcome, ok=False, message=failure)
        for stale in (build_dir / f"{ext_name}.so", build_dir / fastbuild.MANIFEST_FILE):
            stale.unlink(missing_ok=True)  # a .so without a valid manifest is not trusted: built again
        full = dict(kwargs, build_directory=str(build_dir), verbose=False)
        call = _bound_arguments(original, cpp_sources, cuda_sources, tuple(args), full)
        if call is None:
            return dict(
                outcome, ok=False, message="load_inline() got arguments that do not fit its signature"
            )
        reason = fastbuild.fallback_reason(call)
        if reason is not None:
            outcome["fallback"] = reason
        outcome["build"] = info = {}
        call.pop("cpp_sources")
        try:
            cuda = call.pop("cuda_sources")
            fastbuild.build(
                original, ext_name, cpp_sources, cuda, call, cache_root, info, fast=reason is None
            )
        except Exception as exc:  # noqa: BLE001 - the candidate's compile error, told to the runner
            return dict(outcome, ok=False, message=str(exc)[:20000])
        so = build_dir / f"{ext_name}.so"
        if not so.is_file():
            return dict(outcome, ok=False, message=f"the build of {name!r} produced no {so.name}")
        fastbuild.write_manifest(build_dir, so)
    return outcome


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
