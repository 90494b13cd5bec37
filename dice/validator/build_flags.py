"""The flags that compile a ``.cu``/``.cuh`` file as its project compiles it, reduced to what a check needs.

:func:`resolve_build_flags` finds the file's command the way clangd does (:mod:`dice.validator.compdb`): an
explicit ``compile_commands.json``, else one in the file's folder, an ancestor, or a ``build*/`` folder of an
ancestor. A header, or a file without an entry, borrows the command of a translation unit that includes it,
else of one in the same folder, else of the nearest one. With no database at all, the file's folder, the
workspace root and the caller's include paths and defines make the command.

From a command only what changes what a check sees is kept (:func:`filter_command`): ``-I``, ``-isystem``,
``-iquote``, ``-D``, ``-U``, ``-std``, ``-include``, ``-x cu``, ``--expt-*``/``--extended-lambda``,
``-rdc``, ``-ccbin`` (when it exists here) and the architectures (reduced to one by
:meth:`BuildFlags.arch_for`); outputs, dependency files, optimisation, debug, warnings and
``-Xcompiler``/``-Xptxas`` options are dropped. Relative paths are resolved against the entry's
``directory``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dice.validator import compdb
from dice.validator.paths import default_arch

Origin = Literal["entry", "borrowed", "none"]
NO_COMMAND = "no compile command: folder + workspace on the include path"
ENTRY = "compile_commands.json entry"


@dataclass(frozen=True)
class BuildOptions:
    """What the caller knows about building the user's file (JSON-serialisable; travels with the task).

    ``compile_commands``: a ``compile_commands.json`` (or a folder holding one) to use instead of looking
    for one; ``include_paths``/``defines`` (``NAME`` or ``NAME=VALUE``) and ``workspace_root`` make the
    command of a file no database knows. Relative include paths are taken from the workspace root, else
    from the file's folder."""

    compile_commands: str | None = None
    include_paths: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    workspace_root: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "include_paths", tuple(str(p) for p in self.include_paths or ()))
        object.__setattr__(self, "defines", tuple(str(d) for d in self.defines or ()))

    def to_json(self) -> dict[str, Any]:
        return {
            "compile_commands": self.compile_commands,
            "include_paths": list(self.include_paths),
            "defines": list(self.defines),
            "workspace_root": self.workspace_root,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> BuildOptions:
        obj = obj or {}
        return cls(
            compile_commands=obj.get("compile_commands") or None,
            include_paths=tuple(obj.get("include_paths") or ()),
            defines=tuple(obj.get("defines") or ()),
            workspace_root=obj.get("workspace_root") or None,
        )


IncludeKind = Literal["-I", "-isystem", "-iquote"]


@dataclass(frozen=True)
class BuildFlags:
    """A command reduced for a check.

    ``includes``: (kind, folder) in command order; ``macros``: ``-DNAME[=V]`` / ``-UNAME`` in order;
    ``std``: ``c++17`` or None (the compiler's default); ``extra``: other kept nvcc flags (``-x cu`` is
    always added by the compile step); ``archs``: the command's architectures in order (``90``, ``90a``);
    ``directory``: where the command runs; ``description``: where the flags came from, for messages.
    """

    includes: tuple[tuple[IncludeKind, str], ...] = ()
    macros: tuple[str, ...] = ()
    std: str | None = None
    extra: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    directory: str | None = None
    origin: Origin = "none"
    description: str = NO_COMMAND
    database: str | None = None
    source_file: str | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)

    def arch_for(self, gpu_arch: str | None) -> str:
        """One architecture: the GPU's (the command's own spelling of it, ``90a``, when it has one), else
        the command's first, else :func:`dice.validator.paths.default_arch`."""
        if gpu_arch:
            same = [a for a in self.archs if re.match(rf"{re.escape(gpu_arch)}[a-z]?$", a)]
            return same[0] if same else gpu_arch
        return self.archs[0] if self.archs else default_arch()

    def include_dirs(self) -> list[str]:
        return [path for _, path in self.includes]

    def nvcc_args(self) -> list[str]:
        """The kept flags for nvcc (no architecture, source or output)."""
        args: list[str] = []
        for kind, path in self.includes:
            if kind == "-I":
                args.append(f"-I{path}")
            elif kind == "-isystem":
                args += ["-isystem", path]
            elif "," in path:  # -Xcompiler splits on commas: fall back to an include folder
                args.append(f"-I{path}")
            else:
                args.append(f"-Xcompiler=-iquote,{path}")
        args += self.macros
        if self.std:
            args.append(f"-std={self.std}")
        return args + list(self.extra)

    def nvrtc_options(self) -> list[str]:
        """The same for NVRTC: every include folder as ``-I`` (NVRTC has no system or quote folders) in
        the order a quoted include searches them, macros, the standard, ``-rdc`` and ``--pre-include``."""
        order = {"-iquote": 0, "-I": 1, "-isystem": 2}
        dirs = [p for _, p in sorted(self.includes, key=lambda kp: order[kp[0]])]
        options = [f"-I{d}" for d in dirs] + list(self.macros)
        if self.std:
            options.append(f"-std={self.std}")
        # NVRTC knows neither --expt-relaxed-constexpr nor --extended-lambda (it rejects them)
        options += [f for f in self.extra if f == "-rdc=true" or f.startswith("--pre-include=")]
        return options

    def to_json(self) -> dict[str, Any]:
        return {
            "includes": [list(i) for i in self.includes],
            "macros": list(self.macros),
            "std": self.std,
            "extra": list(self.extra),
            "archs": list(self.archs),
            "directory": self.directory,
            "origin": self.origin,
            "description": self.description,
            "database": self.database,
            "source_file": self.source_file,
        }


# nvcc / gcc / clang options whose value is the next argument when written without "=" (dropped options
# must drop their value too, or it would be read as a source file).
_VALUE_OPTIONS = frozenset(
    [
        "-o",
        "--output-file",
        "-MF",
        "-MT",
        "-MQ",
        "-MJ",
        "--dependency-output",
        "-Xcompiler",
        "--compiler-options",
        "-Xptxas",
        "--ptxas-options",
        "-Xlinker",
        "--linker-options",
        "-Xnvlink",
        "--nvlink-options",
        "-Xfatbin",
        "--fatbin-options",
        "-Xcudafe",
        "-Xarchive",
        "--archive-options",
        "-L",
        "--library-path",
        "-l",
        "--library",
        "-odir",
        "--output-directory",
        "-maxrregcount",
        "--maxrregcount",
        "-cudart",
        "--cudart",
        "-cudadevrt",
        "--cudadevrt",
        "-Werror",
        "-diag-suppress",
        "--diag-suppress",
        "-diag-error",
        "--diag-error",
        "-diag-warn",
        "--diag-warn",
        "-default-stream",
        "--default-stream",
        "-t",
        "--threads",
        "-split-compile",
        "--split-compile",
        "-time",
        "--time",
        "-keep-dir",
        "--keep-dir",
        "-m",
        "--machine",
        "-ftz",
        "--ftz",
        "-prec-div",
        "--prec-div",
        "-prec-sqrt",
        "--prec-sqrt",
        "-fmad",
        "--fmad",
        "-target-dir",
        "--target-directory",
        "-compress-mode",
        "--compress-mode",
        "-dopt",
        "--dopt",
        "-idirafter",
        "-imacros",
        "-isysroot",
        "--sysroot",
        "-target",
        "-Xclang",
        "-Xarch_device",
        "-Xarch_host",
        "-arch-ls",
        "--run-args",
        "-run-args",
        "-Xcicc",
        "-Xnvvm",
        "-code",
        "--gpu-code",
        "-ptxas-options",
        "-compiler-options",
        "-linker-options",
    ]
)
_INCLUDE_OPTIONS: dict[str, IncludeKind] = {
    "-I": "-I",
    "--include-path": "-I",
    "-isystem": "-isystem",
    "--system-include": "-isystem",
    "-iquote": "-iquote",
}
_ARCH = re.compile(r"(?:sm|compute|lto)_(\d+[a-z]?)")
_LAUNCHERS = frozenset({"ccache", "sccache", "distcc", "icecc", "buildcache"})
_EXPT = {
    "--expt-relaxed-constexpr": "--expt-relaxed-constexpr",
    "-expt-relaxed-constexpr": "--expt-relaxed-constexpr",
    "--expt-extended-lambda": "--extended-lambda",
    "-expt-extended-lambda": "--extended-lambda",
    "--extended-lambda": "--extended-lambda",
    "-extended-lambda": "--extended-lambda",
}


def _expand(argv: Sequence[str], directory: str, depth: int = 0) -> Iterator[str]:
    """The arguments with ``--options-file F`` / ``-optf F`` / ``@F`` response files read in."""
    it = iter(argv)
    for arg in it:
        path = None
        if arg in ("--options-file", "-optf"):
            path = next(it, None)
        elif arg.startswith(("--options-file=", "-optf=")):
            path = arg.split("=", 1)[1]
        elif arg.startswith("@") and len(arg) > 1:
            path = arg[1:]
        if path is None:
            yield arg
            continue
        if depth > 4:
            continue
        try:
            text = Path(directory, path).read_text(encoding="utf-8", errors="replace")
            yield from _expand(shlex.split(text), directory, depth + 1)
        except (OSError, ValueError):
            continue


def _split_value(arg: str, names: Sequence[str], it: Iterator[str]) -> str | None:
    """The value of ``arg`` if it is one of the options ``names``: ``-Ix``, ``-I x``, ``-I=x``,
    ``--name=x``."""
    for name in names:
        if arg == name:
            return next(it, None)
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
        if len(name) == 2 and arg.startswith(name) and len(arg) > 2:
            return arg[2:]
        if name in ("-isystem", "-iquote") and arg.startswith(name) and len(arg) > len(name):
            return arg[len(name) :]
    return None


def _resolve(path: str, directory: str) -> str:
    return path if os.path.isabs(path) else os.path.join(directory, path)


class _Filter:
    """One pass over a command line, one method per family of options; each returns True when it took
    ``arg`` (and any value after it)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.includes: list[tuple[IncludeKind, str]] = []
        self.macros: list[str] = []
        self.extra: list[str] = []
        self.archs: list[str] = []
        self.std: str | None = None

    def take(self, arg: str, it: Iterator[str]) -> None:
        for step in (self._include, self._macro, self._std, self._arch, self._language, self._feature):
            if step(arg, it):
                return
        if arg in _VALUE_OPTIONS:
            next(it, None)
        # anything else (positional sources and objects, -c, -O3, -g, -G, -lineinfo, -W..., -M..., -f...,
        # --use_fast_math, -Xcompiler=...) is dropped

    def _include(self, arg: str, it: Iterator[str]) -> bool:
        for name, kind in _INCLUDE_OPTIONS.items():
            value = _split_value(arg, (name,), it)
            if value is not None:
                self.includes.append((kind, _resolve(value, self.directory)))
                return True
        value = _split_value(arg, ("-include", "--pre-include"), it)
        if value is not None:
            self.extra.append(f"--pre-include={_resolve(value, self.directory)}")
            return True
        return False

    def _macro(self, arg: str, it: Iterator[str]) -> bool:
        for names, prefix in ((("-D", "--define-macro"), "-D"), (("-U", "--undefine-macro"), "-U")):
            value = _split_value(arg, names, it)
            if value is not None:
                self.macros.append(prefix + value)
                return True
        return False

    def _std(self, arg: str, it: Iterator[str]) -> bool:
        if arg in ("-std", "--std"):
            self.std = next(it, None) or self.std
        elif arg.startswith(("-std=", "--std=")):
            self.std = arg.split("=", 1)[1] or self.std
        else:
            return False
        return True

    def _arch(self, arg: str, it: Iterator[str]) -> bool:
        name, eq, value = arg.partition("=")
        if name not in _ARCH_OPTIONS:
            return False
        if not eq:
            value = next(it, "")
        for found in _ARCH.findall(value):
            if found not in self.archs:
                self.archs.append(found)
        return True

    def _language(self, arg: str, it: Iterator[str]) -> bool:
        if arg in ("-x", "--x", "-x=cu", "--x=cu") or arg.startswith(("-x=", "--x=")):
            if "=" not in arg:
                next(it, None)
            return True  # the compile step always passes -x cu
        return False

    def _feature(self, arg: str, it: Iterator[str]) -> bool:
        flag: str | None = None
        if arg in _EXPT:
            flag = _EXPT[arg]
        elif arg in ("-dc", "--device-c") or re.fullmatch(r"(-rdc|--relocatable-device-code)=true", arg):
            flag = "-rdc=true"
        elif arg in ("-rdc", "--relocatable-device-code"):
            flag = "-rdc=true" if next(it, "") == "true" else ""
        elif arg.startswith(("-ccbin", "--compiler-bindir")):
            value = _split_value(arg, ("-ccbin", "--compiler-bindir"), it)
            if value and (shutil.which(value) or os.path.isdir(value)):
                self.extra += ["-ccbin", value]
            return True
        if flag is None:
            return False
        if flag and flag not in self.extra:
            self.extra.append(flag)
        return True


_ARCH_OPTIONS = frozenset(
    {"-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code", "--cuda-gpu-arch"}
    | {"--offload-arch"}
)


def filter_command(argv: Sequence[str], directory: str) -> BuildFlags:
    """Keep what matters for a check from one command line (``argv[0]`` the compiler, perhaps behind a
    launcher such as ccache; ``--options-file``/``@file`` read in); relative paths against ``directory``."""
    args = list(_expand(argv, directory))
    while args and os.path.basename(args[0]) in _LAUNCHERS:
        args = args[1:]
    state = _Filter(directory)
    it = iter(args[1:])
    for arg in it:
        state.take(arg, it)
    return BuildFlags(
        tuple(state.includes),
        tuple(state.macros),
        state.std,
        tuple(state.extra),
        tuple(state.archs),
        directory,
    )


def _fallback(path: str, options: BuildOptions, note: str | None) -> BuildFlags:
    folder = os.path.dirname(path)
    base = options.workspace_root or folder
    includes: list[tuple[IncludeKind, str]] = [("-I", folder)]
    if options.workspace_root and _norm(options.workspace_root) != _norm(folder):
        includes.append(("-I", options.workspace_root))
    includes += [("-I", _resolve(os.path.expanduser(p), base)) for p in options.include_paths]
    macros = tuple(f"-D{d}" for d in options.defines if d)
    return BuildFlags(
        tuple(includes),
        macros,
        "c++17",
        directory=folder,
        origin="none",
        description=NO_COMMAND,
        notes=(note,) if note else (),
    )


def _norm(path: str) -> str:
    return os.path.normcase(os.path.normpath(os.path.abspath(path)))


_RESOLVED: dict[str, BuildFlags] = {}


def resolve_build_flags(path: str | os.PathLike[str], options: BuildOptions | None = None) -> BuildFlags:
    """The flags that compile ``path`` (a ``.cu``/``.cuh`` file; it need not exist) and where they came
    from (:attr:`BuildFlags.description`): ``compile_commands.json entry``, ``borrowed from foo.cu
    (includes it)`` / ``(same folder)`` / ``(nearest compile command)``, or the fallback without any."""
    options = options or BuildOptions()
    target = os.path.abspath(os.fspath(path))
    databases: list[str] = []
    note = None
    if options.compile_commands:
        chosen = compdb.explicit_database(options.compile_commands)
        if chosen is None:
            note = f"compile commands {options.compile_commands} not found; looked beside the file instead"
        else:
            databases = [chosen]
    if not databases:
        databases = compdb.database_candidates(os.path.dirname(target))
    stamps = [compdb.database_stamps(None, d) for d in databases]
    key = json.dumps([target, options.to_json(), stamps])
    cached = _RESOLVED.get(key)
    if cached is not None:
        return cached
    errors = [err for err in (compdb.load_database(d)[1] for d in databases) if err]
    note = "; ".join(n for n in [note, *errors] if n) or None
    flags = _from_databases(target, databases, note) or _fallback(target, options, note)
    if len(_RESOLVED) > 256:
        _RESOLVED.clear()
    _RESOLVED[key] = flags
    return flags


def _from_databases(target: str, databases: Sequence[str], note: str | None) -> BuildFlags | None:
    loaded = [(db, *compdb.load_database(db)) for db in databases]
    notes = (note,) if note else ()
    for _db, entries, _ in loaded:
        entry = compdb.find_entry(entries, target)
        if entry is not None:
            return _with_origin(entry, "entry", ENTRY, notes)
    for _db, entries, _ in loaded:
        if not entries:
            continue
        including = compdb.includers(
            entries, target, lambda e: filter_command(e.argv, e.directory).include_dirs()
        )
        if including:
            return _with_origin(including[0], "borrowed", _borrowed(including[0], "includes it"), notes)
        same, ranked = compdb.nearest_entries(entries, target)
        if same:
            return _with_origin(same[0], "borrowed", _borrowed(same[0], "same folder"), notes)
        if ranked:
            return _with_origin(ranked[0], "borrowed", _borrowed(ranked[0], "nearest compile command"), notes)
    return None


def _borrowed(entry: compdb.CompileEntry, why: str) -> str:
    return f"borrowed from {os.path.basename(entry.file)} ({why})"


def _with_origin(
    entry: compdb.CompileEntry, origin: Origin, description: str, notes: tuple[str, ...]
) -> BuildFlags:
    flags = filter_command(entry.argv, entry.directory)
    return BuildFlags(
        flags.includes,
        flags.macros,
        flags.std,
        flags.extra,
        flags.archs,
        entry.directory,
        origin,
        description,
        entry.database,
        entry.file,
        notes,
    )
