"""The size rules of docs/INTERNALS.md ("Layers"): no Python file of the project over ~600 lines, no function
over ~80 without a reason in its docstring ("Long on purpose: ..."). The import layers themselves are
import-linter's contracts (pyproject.toml), run by scripts/test.sh."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dice", "engine", "lsp_server", "training", "benchmarks", "scripts")
MAX_FILE_LINES = 620
MAX_FUNCTION_LINES = 85


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_file_over_the_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in _files() if (n := p.read_text().count("\n")) > MAX_FILE_LINES
    }
    assert long == {}


def test_no_long_function_without_a_reason() -> None:
    long = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES and "Long on purpose" not in (ast.get_docstring(node) or ""):
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({size} lines)")
    assert long == []


def test_the_layer_contracts_name_modules_that_exist() -> None:
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (floors,) = [c for c in config["contracts"] if c["type"] == "layers"]
    for layer in floors["layers"]:
        for module in layer.split("|"):
            parts = module.strip().split(".")
            path = ROOT.joinpath(*parts)
            assert path.is_dir() or path.with_suffix(".py").is_file(), module
