"""The local Python files of a dice-spec: which ones it depends on, and importing them fresh in a worker."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from dice.validator.spec_files import spec_folder_imports, spec_reference_files


def test_spec_reference_files(tmp_path: Path) -> None:
    (tmp_path / "ref_mod.py").write_text("")
    (tmp_path / "data.py").write_text("")
    spec = "import torch\nimport numpy as np\nfrom ref_mod import reference\nX = open('data.py')\n"
    cu = tmp_path / "k.cu"
    found = spec_reference_files(spec, cu)
    # torch/numpy are not files beside k.cu; the KernelBench sibling k.py is watched even before it exists
    assert found == {
        (tmp_path / "ref_mod.py").resolve(),
        (tmp_path / "data.py").resolve(),
        (tmp_path / "k.py").resolve(),
    }
    assert spec_reference_files("def broken(:\n", cu) == {(tmp_path / "k.py").resolve()}


def run_spec(spec: str) -> dict:
    namespace: dict = {"__name__": "dice_spec"}
    exec(compile(textwrap.dedent(spec), "k.cu (dice-spec)", "exec"), namespace)
    return namespace


def test_sibling_module_is_imported_fresh_every_time(tmp_path: Path) -> None:
    helper = tmp_path / "dice_test_sibling_ref.py"
    package = tmp_path / "dice_test_sibling_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scale.py").write_text("FACTOR = 2\n")
    helper.write_text("VALUE = 1\n")
    path_before = list(sys.path)
    spec = """
        import dice_test_sibling_ref
        from dice_test_sibling_pkg.scale import FACTOR

        def reference():
            import dice_test_sibling_ref as again  # a call made later, inside the same block
            return again.VALUE * FACTOR
    """
    with spec_folder_imports(tmp_path):
        assert sys.path[0] == str(tmp_path)
        assert run_spec(spec)["reference"]() == 2
    assert sys.path == path_before
    assert not any(n.startswith("dice_test_sibling") for n in sys.modules)
    assert not (tmp_path / "__pycache__").exists() and not (package / "__pycache__").exists()

    helper.write_text("VALUE = 10\n")  # same second, same size for the package file: no stale copy
    (package / "scale.py").write_text("FACTOR = 3\n")
    with spec_folder_imports(str(tmp_path)):
        assert run_spec(spec)["reference"]() == 30
    assert sys.path == path_before
    assert not any(n.startswith("dice_test_sibling") for n in sys.modules)


def test_folder_is_removed_when_the_spec_fails(tmp_path: Path) -> None:
    (tmp_path / "dice_test_sibling_bad.py").write_text("X = 1\nraise RuntimeError('broken helper')\n")
    path_before = list(sys.path)
    try:
        with spec_folder_imports(tmp_path):
            run_spec("import dice_test_sibling_bad\n")
    except RuntimeError as exc:
        assert "broken helper" in str(exc)
    else:
        raise AssertionError("the helper's error must propagate")
    assert sys.path == path_before and "dice_test_sibling_bad" not in sys.modules


def test_modules_imported_before_stay_and_none_changes_nothing(tmp_path: Path) -> None:
    import json

    (tmp_path / "json.py").write_text("SHADOW = True\n")  # shadows the standard library inside the block
    path_before = list(sys.path)
    with spec_folder_imports(tmp_path):
        assert run_spec("import json\n")["json"] is json  # already imported: sys.modules wins
    assert sys.modules["json"] is json
    with spec_folder_imports(None):
        assert sys.path == path_before
    assert sys.path == path_before
