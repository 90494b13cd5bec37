"""The builder: the one process that writes the shared extension cache, forked from the zygote per build.

A runner (:mod:`dice.validator.runner`) runs candidate code and so may not write anything a later
candidate loads: its Landlock layer leaves it only its task folder, and the cache (``<cache>/torch_ext``,
the PCH and ccache folders) is read-only to it. When a candidate's ``load_inline`` misses the cache, the
runner sends the call as plain data to the judge, which forks a builder for it (mode ``build``); a batched
prebuild's discovered calls go to a builder too (mode ``prebuild``). A builder:

- computes each key again from the call it got (a runner cannot have sources built under another call's
  key), builds under the key's lock with :mod:`dice.validator.fastbuild` (torch's own build for what that
  does not handle), never imports what it built (a candidate's static initialisers would run in the one
  process that writes the cache; a combined build's import check runs in a confined child,
  :func:`dice.validator.batchbuild._import_check`), and writes the ``.so``'s SHA-256 into the build folder's
  manifest (``dice_manifest.json``; combined builds: in each ``dice_batch.json``);
- runs the compilers on candidate sources (compiling is not running them), confined by Landlock to the
  cache folders and its own task folder, and answers once: ``{"id": 0, "event": "built", "ok", "message",
  "build"}`` or ``{"id": 0, "event": "prebuilt", "report"}``.

A runner loads a cached ``.so`` only when the manifest names it and its content hash matches
(:func:`dice.validator.fastbuild.verified_so`); a ``.so`` without one (an older cache, or a file put there
by anything else) is built again.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any


def serve(fd: int, mode: str, args: dict[str, Any]) -> int:
    """The builder's main: one ``build`` or ``prebuild`` job, one reply on the socket ``fd``."""
    sock = socket.socket(fileno=fd)
    os.closerange(3, fd)
    os.closerange(fd + 1, 1 << 16)

    def send(obj: dict[str, Any]) -> None:
        sock.sendall((json.dumps(obj) + "\n").encode())

    try:
        _confine(args)
        cache = Path(args["cache_dir"])
        if mode == "build":
            send({"id": 0, "event": "built", **build_call(cache, args.get("call"))})
            return 0
        if mode == "prebuild":
            send({"id": 0, "event": "prebuilt", "report": prebuild_calls(cache, args)})
            return 0
        send(
            {"id": 0, "event": "error", "status": "runtime_error", "message": f"unknown builder mode {mode}"}
        )
    except Exception as exc:  # noqa: BLE001 - reported, then this process ends
        with contextlib.suppress(OSError):
            send({"id": 0, "event": "error", "status": "runtime_error", "message": f"builder failed: {exc}"})
    return 1


def _confine(args: dict[str, Any]) -> None:
    """Its own HOME, TMPDIR and cwd; Landlock: writes only to the cache folders and the task folder."""
    from dice.validator.sandbox import apply_landlock, enter_task_dir, landlock_abi

    task_dir = Path(args["task_dir"])
    enter_task_dir(task_dir)
    if args.get("landlock") and landlock_abi() > 0:
        apply_landlock([Path(p) for p in args.get("writable") or []] + [task_dir])


def build_call(cache_root: Path, call: Any) -> dict[str, Any]:
    """One runner's ``load_inline`` call built into the cache: ``{"ok", "message", "key", "build"}``."""
    import torch.utils.cpp_extension as cpp_extension

    from dice.validator.builds import build_into_cache

    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return {"ok": False, "message": "a build request without a load_inline call"}
    kwargs = call.get("kwargs") if isinstance(call.get("kwargs"), dict) else {}
    args = call.get("args") if isinstance(call.get("args"), list) else []
    return build_into_cache(
        cache_root,
        cpp_extension.load_inline,
        call["name"],
        call.get("cpp_sources"),
        call.get("cuda_sources"),
        args,
        kwargs,
    )


def prebuild_calls(cache_root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """A batched prebuild of the calls a discovery runner sent (:mod:`dice.validator.batchbuild`)."""
    from dice.validator.batchbuild import build_discovered, call_from_json

    calls = []
    for data in args.get("calls") or []:
        try:
            calls.append(call_from_json(data))
        except (KeyError, TypeError, ValueError):
            continue
    problems = {int(k): str(v) for k, v in (args.get("problems") or {}).items() if str(k).isdigit()}
    candidates = int(args.get("candidates") or 0)
    return build_discovered(cache_root, calls, problems, candidates)
