"""The ``.cu`` spec run's runner: the one process a fill's device code runs in, forked from the zygote for it.

The judge (the worker, :mod:`dice.validator.cu`) executes the user's dice-spec for ``inputs()`` and
``reference()``, keeps the reference's outputs and compares; it never loads the fill's module. This process
compiles the device code with CuPy (NVRTC), executes the same spec for its ``launch(module, *inputs)``, and
then only does what the judge asks, with :mod:`dice.validator.runner`'s protocol: ``inputs`` / ``values`` /
``outputs`` (the judge's shared buffers), ``trial`` (one launch, its outputs copied into the slots),
``run`` / ``noop`` (the timed launch and the empty round trip), ``exit``.

What runs here on the host is the user's spec and this module; the model wrote only device code, which can
reach nothing but this process's own GPU memory: the judge's reference outputs live in another CUDA context,
and an illegal address or a fault ends this process, not the worker. CuPy's cache (the one folder besides
the task folder its Landlock layer leaves writable) is written by NVRTC's output only.

With ``emulated`` set (the CPU tests, ``DICE_VALIDATOR_EMULATE=cpu``) the module is a Python file of
stand-ins, one function per kernel name, called as CuPy calls a kernel: ``(grid, block, args)``.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

from dice.validator.runner import (
    Channel,
    KernelBenchRunner,
    confine,
    error_reply,
    load_standins,
    open_channel,
    short,
    use_cupy_cache,
)


def serve(fd: int, mode: str, args: dict[str, Any]) -> int:
    """The runner's main for ``mode`` "cu"."""
    channel = open_channel(fd)
    try:
        confine(args)
        use_cupy_cache(Path(args["cupy_cache"]))
        return CuRunner(channel, args).serve()
    except Exception as exc:  # noqa: BLE001 - reported, then this process ends
        channel.send(error_reply(0, "runtime_error", f"runner failed: {short(exc)}"))
    return 1


class _Emulated:
    """The module in the emulated path: ``get_function(name)`` or ``module.name`` from the stand-ins."""

    def __init__(self, path: str) -> None:
        self._module = load_standins(path, "dice_cu_standins")

    def get_function(self, name: str) -> Any:
        return getattr(self._module, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.get_function(name)


class CuRunner(KernelBenchRunner):
    """``launch(module, *inputs)`` where the KernelBench runner calls ``ModelNew``."""

    def __init__(self, channel: Channel, args: dict[str, Any]) -> None:
        super().__init__(channel, args)
        self.stage = "starting"

    def handlers(self) -> dict[str, Any]:
        ops = ("inputs", "values", "outputs", "trial", "run", "noop")
        return {op: handler for op, handler in super().handlers().items() if op in ops}

    def _start(self) -> bool:
        """CUDA, the sandbox, the module compiled, the spec executed; the ``ready`` reply (request 0)."""
        phases = self.start_confined()
        try:
            self.stage = "compiling the module with CuPy"
            module = self._module()
            phases.lap("compile")
            self.stage = "executing the dice-spec block"
            launch = self._spec_launch()
            phases.lap("spec")
        except Exception as exc:  # noqa: BLE001 - the device code or the spec failed: the verdict says which
            message = f"{self.stage}: {short(exc)}"
            self.channel.send(error_reply(0, "runtime_error", message, traceback.format_exc()))
            return False
        self.model = lambda *inputs: launch(module, *inputs)
        self.channel.send({"id": 0, "event": "ready", "phases": phases.times})
        return True

    def _module(self) -> Any:
        if self.args.get("emulated"):
            return _Emulated(str(self.args["emulated"]))
        import cupy

        from dice.validator.gpu import TorchModule

        kernels = list(self.args.get("kernels") or [])
        raw = cupy.RawModule(
            code=str(self.args["source"]),
            options=tuple(self.args.get("options") or ()),
            backend="nvrtc",
            name_expressions=kernels or None,
        )
        raw.compile()  # here, not at the first launch: a compile error is this stage's
        return TorchModule(raw)

    def _spec_launch(self) -> Any:
        """The spec's ``launch``; the ``.cu`` file's folder stays first on ``sys.path`` for this process's
        life (one task), so imports inside ``launch`` find its modules too; no bytecode is written there."""
        namespace: dict[str, Any] = {"__name__": "dice_spec"}
        source, filename = str(self.args["spec_source"]), str(self.args.get("filename") or "kernel.cu")
        folder = self.args.get("folder") or None
        if folder:
            sys.dont_write_bytecode = True
            sys.path.insert(0, os.fspath(Path(folder)))
        exec(compile(source, f"{filename} (dice-spec)", "exec"), namespace)  # noqa: S102 - the user's spec
        launch = namespace.get("launch")
        if not callable(launch):
            raise ValueError("the dice-spec defines no launch(module, *inputs)")
        return launch

    def _trial(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        out = self.model(*self.inputs)
        self.sync()
        if out is None:
            return {"event": "trial", "none": True}
        return {"event": "trial", **self._deliver(out)}
