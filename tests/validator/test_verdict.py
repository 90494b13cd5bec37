from __future__ import annotations

import json

import pytest

from dice.validator import STATUSES, Verdict

DESIGN_KEYS = [
    "status",
    "compiled",
    "correct",
    "speedup",
    "ref_ms",
    "new_ms",
    "max_abs_err",
    "message",
    "log",
]


def test_to_json_has_the_design_fields_then_flags_diagnostics_and_unchecked() -> None:
    v = Verdict(
        "correct",
        True,
        True,
        speedup=2.5,
        ref_ms=1.0,
        new_ms=0.4,
        max_abs_err=1e-6,
        message="m",
        log="l",
        flags=["speedup_over_10x"],
        diagnostics=[{"line": 3, "severity": "error", "message": "x"}],
    )
    obj = v.to_json()
    assert list(obj) == [*DESIGN_KEYS, "flags", "diagnostics", "unchecked"]
    assert json.loads(json.dumps(obj)) == obj
    assert Verdict.from_json(obj) == v


@pytest.mark.parametrize("status", STATUSES)
def test_every_status_round_trips(status: str) -> None:
    v = Verdict(status, status in ("correct", "incorrect", "compiled"))  # type: ignore[arg-type]
    back = Verdict.from_json(json.loads(json.dumps(v.to_json())))
    assert back.status == status
    assert back.ok == (status in ("correct", "compiled"))


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown verdict status"):
        Verdict("passed", True)  # type: ignore[arg-type]


def test_long_logs_keep_head_and_tail() -> None:
    log = "FIRST ERROR\n" + "x" * 50_000 + "\nFINAL EXCEPTION"
    v = Verdict("compile_error", False, log=log)
    assert len(v.log) < 21_000
    assert v.log.startswith("FIRST ERROR") and v.log.endswith("FINAL EXCEPTION")


def test_summary_labels() -> None:
    assert (
        Verdict("correct", True, True, speedup=2.345).summary() == "compiled ✓ · correct ✓ · 2.35× vs PyTorch"
    )
    assert (
        Verdict("incorrect", True, False, max_abs_err=0.5).summary()
        == "compiled ✓ · correct ✗ (max abs err 0.5)"
    )
    assert Verdict("compiled", True).summary() == "compiled ✓ · not run"
    assert Verdict("rejected", False, flags=["x"]).summary() == "rejected · flags: x"
