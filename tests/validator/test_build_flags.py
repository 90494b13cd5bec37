"""Finding a file's compile command (clangd's way), borrowing one for a header, and the flags kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dice.validator.build_flags import (
    ENTRY,
    NO_COMMAND,
    BuildFlags,
    BuildOptions,
    filter_command,
    resolve_build_flags,
)
from dice.validator.compdb import database_candidates, database_stamps, load_database

NVCC = "/usr/local/cuda/bin/nvcc"


def _project(root: Path, *, db_at: str = "build", command_form: bool = False) -> Path:
    """src/{kern.cu, other.cu, util.cuh, lone.cuh}, include/common.h, and a database at ``db_at``."""
    (root / "src").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "common.h").write_text("#define COMMON 1\n")
    (root / "src" / "util.cuh").write_text("#pragma once\n__device__ inline int util() { return 1; }\n")
    (root / "src" / "lone.cuh").write_text("#pragma once\n")
    (root / "src" / "kern.cu").write_text(
        '#include "util.cuh"\n#include <common.h>\n__global__ void k() {}\n'
    )
    (root / "src" / "other.cu").write_text("__global__ void other() {}\n")
    db = root / db_at
    db.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, extra in (("kern.cu", ["-DKERN=1"]), ("other.cu", ["-DOTHER=1"])):
        rel = os.path.relpath(root / "src" / name, db)
        args = [
            NVCC,
            f"-I{os.path.relpath(root / 'include', db)}",
            *extra,
            "-std=c++14",
            "-arch=sm_80",
            "-O3",
        ]
        args += ["-c", rel, "-o", f"{name}.o"]
        entry = {"directory": str(db), "file": rel}
        if command_form:
            entry["command"] = " ".join(args)
        else:
            entry["arguments"] = args
        entries.append(entry)
    (db / "compile_commands.json").write_text(json.dumps(entries))
    return db


def test_entry_from_a_build_folder_of_an_ancestor(tmp_path: Path) -> None:
    db = _project(tmp_path)
    flags = resolve_build_flags(tmp_path / "src" / "kern.cu")
    assert flags.origin == "entry" and flags.description == ENTRY
    assert flags.database == str(db / "compile_commands.json")
    assert flags.directory == str(db)
    assert ("-I", str(db / "../include")) in flags.includes  # resolved against the entry's directory
    assert flags.macros == ("-DKERN=1",) and flags.std == "c++14" and flags.archs == ("80",)


def test_entry_from_the_files_folder_or_an_ancestor_and_command_strings(tmp_path: Path) -> None:
    _project(tmp_path, db_at=".", command_form=True)
    flags = resolve_build_flags(tmp_path / "src" / "other.cu")
    assert flags.origin == "entry" and flags.macros == ("-DOTHER=1",)
    assert database_candidates(tmp_path / "src") == [str(tmp_path / "compile_commands.json")]


def test_an_explicit_database_wins_and_a_missing_one_is_noted(tmp_path: Path) -> None:
    _project(tmp_path / "p")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    entry = {"directory": str(elsewhere), "file": str(tmp_path / "p/src/kern.cu"), "arguments": [NVCC, "-DX"]}
    (elsewhere / "compile_commands.json").write_text(json.dumps([entry]))
    explicit = resolve_build_flags(tmp_path / "p/src/kern.cu", BuildOptions(compile_commands=str(elsewhere)))
    assert explicit.macros == ("-DX",) and explicit.database == str(elsewhere / "compile_commands.json")
    missing = resolve_build_flags(tmp_path / "p/src/kern.cu", BuildOptions(compile_commands="/nope.json"))
    assert missing.macros == ("-DKERN=1",) and "not found" in missing.notes[0]


def test_a_header_borrows_the_command_of_a_file_that_includes_it(tmp_path: Path) -> None:
    _project(tmp_path)
    flags = resolve_build_flags(tmp_path / "src" / "util.cuh")
    assert flags.origin == "borrowed"
    assert flags.description == "borrowed from kern.cu (includes it)"
    assert flags.macros == ("-DKERN=1",)


def test_a_file_nothing_includes_borrows_from_its_folder(tmp_path: Path) -> None:
    _project(tmp_path)
    flags = resolve_build_flags(tmp_path / "src" / "lone.cuh")
    assert flags.description == "borrowed from kern.cu (same folder)"  # nearest by name order
    (tmp_path / "src" / "sub").mkdir()
    deeper = resolve_build_flags(tmp_path / "src" / "sub" / "new.cu")
    assert deeper.description.endswith("(nearest compile command)")


def test_no_command_at_all_uses_folder_workspace_and_the_callers_paths(tmp_path: Path) -> None:
    (tmp_path / "ws" / "a").mkdir(parents=True)
    options = BuildOptions(
        include_paths=("inc", "/abs/inc"), defines=("N=4", "FAST"), workspace_root=str(tmp_path / "ws")
    )
    flags = resolve_build_flags(tmp_path / "ws" / "a" / "k.cu", options)
    assert flags.origin == "none" and flags.description == NO_COMMAND
    assert flags.include_dirs() == [
        str(tmp_path / "ws/a"),
        str(tmp_path / "ws"),
        str(tmp_path / "ws/inc"),
        "/abs/inc",
    ]
    assert flags.macros == ("-DN=4", "-DFAST")


def test_build_options_round_trip_through_json() -> None:
    options = BuildOptions("/x/compile_commands.json", ["a", "b"], ("N=1",), "/ws")  # type: ignore[arg-type]
    assert options.include_paths == ("a", "b")
    assert BuildOptions.from_json(json.loads(json.dumps(options.to_json()))) == options
    assert BuildOptions.from_json(None) == BuildOptions()


def test_flag_filter_keeps_what_a_check_needs_and_drops_the_rest(tmp_path: Path) -> None:
    rsp = tmp_path / "includes.rsp"
    rsp.write_text("-I rsp/inc -DFROM_RSP")
    argv = [
        "ccache", NVCC, "-forward-unknown-to-host-compiler", "-DA=1", "-D", "B", "--define-macro=C", "-UD",
        "-Irel", "-I", "/abs", "--include-path=/abs2", "-isystem=/sys", "-isystem", "/sys2", "-iquote", "q",
        "-std=c++17", "-O3", "-g", "-G", "-lineinfo", "-Xcompiler", "-fPIC -Wall", "-Xcompiler=-fopenmp",
        "--generate-code=arch=compute_90,code=[compute_90,sm_90]", "-gencode", "arch=compute_75,code=sm_75",
        "-x", "cu", "-include", "pre.h", "--expt-relaxed-constexpr", "-extended-lambda", "-rdc=true",
        "-MD", "-MF", "deps.d", "-MT", "obj", "-c", "k.cu", "-o", "k.o", "--options-file", str(rsp),
        "-use_fast_math", "-compress-mode=size", "--ptxas-options", "-v", "-Werror", "all-warnings",
    ]  # fmt: skip
    flags = filter_command(argv, "/dir")
    assert flags.macros == ("-DA=1", "-DB", "-DC", "-UD", "-DFROM_RSP")
    assert flags.includes == (
        ("-I", "/dir/rel"),
        ("-I", "/abs"),
        ("-I", "/abs2"),
        ("-isystem", "/sys"),
        ("-isystem", "/sys2"),
        ("-iquote", "/dir/q"),
        ("-I", "/dir/rsp/inc"),
    )
    assert flags.std == "c++17"
    assert flags.archs == ("90", "75")
    assert flags.extra == (
        "--pre-include=/dir/pre.h",
        "--expt-relaxed-constexpr",
        "--extended-lambda",
        "-rdc=true",
    )
    args = flags.nvcc_args()
    for dropped in (
        "-O3",
        "-g",
        "-G",
        "-c",
        "k.cu",
        "-o",
        "k.o",
        "-MD",
        "deps.d",
        "-v",
        "all-warnings",
        "-fPIC -Wall",
    ):
        assert dropped not in args
    assert "-Xcompiler=-iquote,/dir/q" in args and args[args.index("-isystem") + 1] == "/sys"


def test_one_architecture_the_gpus_else_the_commands_first_else_the_default(monkeypatch) -> None:
    flags = BuildFlags(archs=("75", "90a"))
    assert flags.arch_for("90") == "90a"  # the command's own spelling of the GPU's arch
    assert flags.arch_for("80") == "80"
    assert flags.arch_for(None) == "75"
    monkeypatch.setenv("DICE_CUDA_ARCH", "86")
    assert BuildFlags().arch_for(None) == "86"


def test_nvrtc_options_put_every_folder_on_the_include_path_and_skip_what_nvrtc_rejects() -> None:
    flags = BuildFlags(
        includes=(("-isystem", "/s"), ("-I", "/i"), ("-iquote", "/q")),
        macros=("-DX",),
        std="c++17",
        extra=(
            "--expt-relaxed-constexpr",
            "--extended-lambda",
            "-rdc=true",
            "--pre-include=/p.h",
            "-ccbin",
            "g++",
        ),
    )
    assert flags.nvrtc_options() == [
        "-I/q",
        "-I/i",
        "-I/s",
        "-DX",
        "-std=c++17",
        "-rdc=true",
        "--pre-include=/p.h",
    ]


def test_databases_are_stamped_for_the_verdict_cache_and_bad_ones_are_reported(tmp_path: Path) -> None:
    db = _project(tmp_path)
    stamps = database_stamps(tmp_path / "src")
    assert stamps and stamps[0][0] == str(db / "compile_commands.json")
    (db / "compile_commands.json").write_text("{not json")
    os.utime(db / "compile_commands.json", ns=(1, 1))
    assert database_stamps(tmp_path / "src") != stamps
    entries, error = load_database(str(db / "compile_commands.json"))
    assert entries == [] and error is not None
    flags = resolve_build_flags(tmp_path / "src" / "kern.cu")
    assert flags.origin == "none" and any("compile_commands.json" in n for n in flags.notes)
