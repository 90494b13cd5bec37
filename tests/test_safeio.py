"""dice.safeio: reading only regular files with a cap, writing the user's files without breaking links,
owner or mode, and the strict JSON clients parse (NaN/inf -> null + ``non_finite``)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dice import safeio
from dice.validator.verdict import Verdict, verdict_label

posix_only = pytest.mark.skipif(os.name != "posix", reason="FIFOs, devices, modes and owners are POSIX")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def strict_loads(text: str) -> Any:
    """What JSON.parse accepts: NaN, Infinity and -Infinity are refused."""
    return json.loads(text, parse_constant=_reject_constant)


def refusal_within(seconds: float, call: Callable[[], object], *, fifo: Path | None = None) -> str:
    """The UserFileError message ``call`` raises, which it must raise within ``seconds``; a call still
    blocked then (on ``fifo``) is released by opening the FIFO for writing, and the test fails."""
    outcome: dict[str, BaseException | object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # the refusal, or whatever else: reported below
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        if fifo is not None:  # unblock the reader (it then reads an empty file) so the thread ends
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
        pytest.fail(f"still blocked after {seconds} s")
    error = outcome.get("error")
    assert isinstance(error, safeio.UserFileError), outcome
    return str(error)


# ------------------------------------------------------------------------------------------------ reading


def test_a_regular_file_is_read_with_its_stat(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_bytes(b"__global__ void k() {}\r\n")
    read = safeio.read_user_file(path, max_bytes=1024, what="CUDA source")
    assert read.data == b"__global__ void k() {}\r\n" and read.text() == "__global__ void k() {}\r\n"
    assert safeio.same_file_state(read.stat, os.stat(path))


@posix_only
def test_a_fifo_is_refused_at_once_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.cu"
    os.mkfifo(fifo)  # no writer ever comes: opening it for reading would block forever
    message = refusal_within(
        5, lambda: safeio.read_user_file(fifo, max_bytes=1024, what="CUDA source"), fifo=fifo
    )
    assert message == f"{fifo}: is a named pipe (FIFO), not a regular file (DICE reads regular files only)"


@posix_only
@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    link = tmp_path / "zero.cu"
    link.symlink_to("/dev/zero")  # the name looks like a source; the file is an endless device
    for path in (Path("/dev/zero"), link):
        message = refusal_within(5, lambda p=path: safeio.read_user_file(p, max_bytes=1024, what="source"))
        assert message == f"{path}: is a character device, not a regular file (DICE reads regular files only)"


def test_missing_files_and_folders_are_named(tmp_path: Path) -> None:
    with pytest.raises(safeio.UserFileError, match=r"missing\.cu: no such file$"):
        safeio.read_user_file(tmp_path / "missing.cu", max_bytes=10, what="source")
    with pytest.raises(safeio.UserFileError, match=r": is a folder, not a file$"):
        safeio.read_user_file(tmp_path, max_bytes=10, what="source")


def test_a_file_over_the_cap_is_refused_by_its_size_with_both_numbers(tmp_path: Path) -> None:
    big = tmp_path / "big.cu"
    with big.open("wb") as f:
        f.truncate(3 * safeio.GIB)  # sparse: takes no disk, and reading it would take 3 GiB of memory
    with pytest.raises(safeio.UserFileError) as caught:
        safeio.read_user_file(big, max_bytes=safeio.SOURCE_LIMIT, what="CUDA source")
    assert str(caught.value) == (
        f"{big}: the CUDA source is too large: 3 GiB (3221225472 bytes), over the 32 MiB limit"
    )


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no procfs")
def test_the_read_itself_is_bounded_for_files_that_report_no_size() -> None:
    assert os.stat("/proc/self/maps").st_size == 0  # a regular file whose size says nothing
    with pytest.raises(safeio.UserFileError, match=r"over the 64 bytes limit \(it grew while DICE read it\)"):
        safeio.read_user_file("/proc/self/maps", max_bytes=64, what="map")


def test_text_that_is_not_utf8_says_which_byte(tmp_path: Path) -> None:
    path = tmp_path / "bin.cu"
    path.write_bytes(b"ok\xff\xfe")
    with pytest.raises(safeio.UserFileError, match=r"bin\.cu: not UTF-8 text \(byte 2 is invalid\)"):
        safeio.read_user_text(path, max_bytes=100, what="source")
    assert safeio.read_user_text(path, max_bytes=100, what="source", errors="replace") == "ok\ufffd\ufffd"


def test_format_size() -> None:
    assert [safeio.format_size(n) for n in (1, 512, 1536, 32 * safeio.MIB, 16 * safeio.GIB)] == [
        "1 byte",
        "512 bytes",
        "1.5 KiB",
        "32 MiB",
        "16 GiB",
    ]


# ------------------------------------------------------------------------------------------------ writing


def _no_temporary_files(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".dice-tmp")]


@posix_only
def test_a_symlink_stays_a_link_and_its_target_is_written(tmp_path: Path) -> None:
    real = tmp_path / "src" / "kernel.cu"
    real.parent.mkdir()
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "kernel.cu"
    link.symlink_to(real)
    written = safeio.write_user_file(link, "new")
    assert written == real.resolve()
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new" and stat.S_IMODE(real.stat().st_mode) == 0o640
    assert _no_temporary_files(real.parent)


@posix_only
def test_hard_links_are_kept(tmp_path: Path) -> None:
    first = tmp_path / "a.cu"
    first.write_text("a much longer old text than the new one")
    second = tmp_path / "b.cu"
    os.link(first, second)
    inode = first.stat().st_ino
    safeio.write_user_file(first, "short")
    assert first.stat().st_nlink == 2 and first.stat().st_ino == second.stat().st_ino == inode
    assert second.read_text() == "short"  # truncated to the new length, seen through both names


@posix_only
def test_the_mode_is_kept_and_the_file_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("old")
    path.chmod(0o604)
    inode = path.stat().st_ino
    safeio.write_user_file(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o604
    assert path.stat().st_ino != inode  # a rename of a new file: never half written
    assert _no_temporary_files(tmp_path)


@posix_only
@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="only root can give a file away")
def test_the_owner_and_group_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("old")
    os.chown(path, 12345, 23456)
    safeio.write_user_file(path, "new")
    st = path.stat()
    assert (st.st_uid, st.st_gid) == (12345, 23456) and path.read_text() == "new"


@posix_only
def test_a_read_only_file_is_refused_with_a_message(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("old")
    path.chmod(0o444)
    with pytest.raises(safeio.UserFileError) as caught:
        safeio.write_user_file(path, "new")
    assert str(caught.value) == f"{path}: is read-only (mode 0444); not writing it (make it writable first)"
    assert path.read_text() == "old" and stat.S_IMODE(path.stat().st_mode) == 0o444
    with pytest.raises(safeio.UserFileError, match="is read-only"):
        safeio.check_writable(path)


@posix_only
def test_a_folder_it_cannot_write_in_is_refused_with_a_message(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    path = folder / "k.cu"
    path.write_text("old")
    folder.chmod(0o555)
    try:
        for target in (path, folder / "new.cu"):
            with pytest.raises(safeio.UserFileError) as caught:
                safeio.write_user_file(target, "new")
            assert str(caught.value).startswith(
                f"{target}: cannot write in its folder {folder}: the folder is read-only (mode 0555); "
            )
            with pytest.raises(safeio.UserFileError, match="cannot write in its folder"):
                safeio.check_writable(target)
        assert path.read_text() == "old" and sorted(p.name for p in folder.iterdir()) == ["k.cu"]
    finally:
        folder.chmod(0o755)


def test_a_file_changed_since_it_was_read_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("old")
    read = safeio.read_user_file(path, max_bytes=100, what="source")
    path.write_text("the user's edit")
    with pytest.raises(safeio.FileChangedError, match="changed on disk since DICE read it"):
        safeio.write_user_file(path, "new", expected_stat=read.stat)
    assert path.read_text() == "the user's edit"
    fresh = safeio.read_user_file(path, max_bytes=100, what="source")
    safeio.write_user_file(path, "new", expected_stat=fresh.stat)
    assert path.read_text() == "new"


@posix_only
def test_exclusive_creation_never_clobbers_and_uses_no_fixed_temporary_name(tmp_path: Path) -> None:
    out = tmp_path / "ref_dice.py"
    bystander = tmp_path / "ref_dice.py.tmp"  # a user's file with the name a fixed temporary would take
    bystander.write_text("mine")
    safeio.write_user_file(out, "program", exclusive=True)
    assert out.read_text() == "program" and bystander.read_text() == "mine"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    with pytest.raises(safeio.UserFileError, match=r"ref_dice\.py: exists; not overwriting it"):
        safeio.write_user_file(out, "other", exclusive=True)
    assert out.read_text() == "program" and _no_temporary_files(tmp_path)


@posix_only
def test_the_file_and_its_folder_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        synced.append("folder" if stat.S_ISDIR(mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    path = tmp_path / "k.cu"
    path.write_text("old")
    safeio.write_user_file(path, "new")
    assert synced == ["file", "folder"]
    synced.clear()
    os.link(path, tmp_path / "twin.cu")
    safeio.write_user_file(path, "in place")
    assert synced == ["file"]


def test_a_non_regular_target_is_refused(tmp_path: Path) -> None:
    with pytest.raises(safeio.UserFileError, match="is a folder, not a file"):
        safeio.write_user_file(tmp_path, "x")


# -------------------------------------------------------------------------------------------- strict JSON


def test_non_finite_numbers_become_null_and_are_named() -> None:
    value = {
        "a": math.nan,
        "b": [1.0, math.inf, [2.0, -math.inf]],
        "c": {"d": -math.inf, "e": 0.5},
        "f": (1, 2),
        "ok": 3,
    }
    text = safeio.dumps_strict(value)
    assert strict_loads(text) == {
        "a": None,
        "b": [1.0, None, [2.0, None]],
        "c": {"d": None, "e": 0.5, "non_finite": {"d": "-Infinity"}},
        "f": [1, 2],
        "ok": 3,
        "non_finite": {"a": "NaN", "b[1]": "Infinity", "b[2][1]": "-Infinity"},
    }
    once = safeio.strict_json(value)
    assert safeio.strict_json(once) == once  # idempotent: a strict value is left as it is
    assert safeio.strict_json({"x": 1.5, "y": "NaN"}) == {"x": 1.5, "y": "NaN"}  # no flag when none


def test_numpy_floats_are_made_strict_too() -> None:
    np = pytest.importorskip("numpy")
    assert strict_loads(safeio.dumps_strict({"x": np.float32("nan"), "n": np.int64(3)})) == {
        "x": None,
        "n": 3,
        "non_finite": {"x": "NaN"},
    }


def test_a_value_the_cleaning_missed_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    class Ratio(float):  # a float subclass is cleaned like a float
        pass

    assert strict_loads(safeio.dumps_strict([Ratio("inf")])) == [None]
    monkeypatch.setattr(safeio, "strict_json", lambda value: value)  # a regression of the cleaning
    with pytest.raises(ValueError, match="not JSON compliant"):
        safeio.dumps_strict({"max_abs_err": math.inf})  # allow_nan=False: never a silent Infinity


def test_verdict_json_is_strict_and_round_trips() -> None:
    verdict = Verdict(
        "incorrect", True, correct=False, speedup=math.nan, ref_ms=0.1, new_ms=math.inf, max_abs_err=math.inf
    )
    payload = verdict.to_json()
    assert payload["max_abs_err"] is None and payload["speedup"] is None and payload["new_ms"] is None
    assert payload["non_finite"] == {"speedup": "NaN", "new_ms": "Infinity", "max_abs_err": "Infinity"}
    parsed = strict_loads(safeio.dumps_strict(payload))  # what JSON.parse (VS Code) accepts
    assert parsed == payload
    back = Verdict.from_json(parsed)
    assert back.max_abs_err == math.inf and back.new_ms == math.inf and math.isnan(back.speedup or 0.0)
    assert verdict_label(parsed) == verdict_label(verdict) == "compiled ✓ · correct ✗ (max abs err inf)"
    assert "non_finite" not in Verdict("compiled", True, max_abs_err=0.0).to_json()
