"""The static ``validator_access`` guard: a candidate that reaches into the process it runs in (the
validator's own package, the module table, the garbage collector's object lists, stack frames) could rewrite
the runner that reports its guards (the launch profile, the dependence check); none of the 932 kernels of
the agreement data does any of it. Honest uses of the same modules pass."""

from __future__ import annotations

import pytest

from .test_guards_obfuscated import KERNEL, hits_of, model

HONEST_BODY = f"x = x.contiguous()\nreturn {KERNEL}"

REACHES = {
    "import_runner": "import dice.validator.runner as r\nr.KernelBenchRunner._launch = lambda *a: None",
    "from_validator": "from dice.validator import runner",
    "from_dice": "from dice import validator",
    "sys_modules": "import sys\nR = sys.modules['dice.validator.runner']",
    "sys_modules_alias": "import sys as _s\nM = _s.modules",
    "from_sys_modules": "from sys import modules",
    "gc_objects": "import gc\nFOUND = [o for o in gc.get_objects() if type(o).__name__ == 'Runner']",
    "gc_referrers": "import gc\nR = gc.get_referrers(torch)",
    "getframe": "import sys\nF = sys._getframe(1)",
    "from_inspect": "from inspect import currentframe",
    "inspect_stack": "import inspect\nS = inspect.stack()",
    "frame_walk": "def _frame():\n    return (lambda: None).__code__\nF = _frame.__globals__ and None\n"
    "G = (x for x in [1]).gi_frame",
}


@pytest.mark.parametrize("name", sorted(REACHES))
def test_a_reach_into_the_process_is_rejected(name: str) -> None:
    hits = hits_of(model(HONEST_BODY, extra=REACHES[name]))
    assert "validator_access" in hits, (name, hits)  # sys.modules is dynamic_code's too, which comes first


def test_a_traceback_walk_is_caught_too() -> None:
    src = model(
        HONEST_BODY,
        extra="try:\n    raise RuntimeError\nexcept RuntimeError as e:\n"
        "    F = e.__traceback__.tb_frame.f_back",
    )
    assert "validator_access" in hits_of(src)


HONEST = {
    "gc_collect": "import gc\ngc.collect()",
    "sys_version": "import sys\nV = sys.version_info >= (3, 10)",
    "inspect_signature": "import inspect\nS = inspect.signature(torch.relu)",
    "os_environ": "import os\nDEBUG = os.environ.get('DEBUG')",
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_uses_of_the_same_modules_pass(name: str) -> None:
    assert hits_of(model(HONEST_BODY, extra=HONEST[name])) == []
