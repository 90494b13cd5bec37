"""What a KernelBench reference is: the one rule the validator, ``dice generate`` and the editor's
"Generate CUDA kernel" action share (so the action is never offered for a file generation then refuses).

A reference is a Python module that defines, at top level, ``Model`` (the PyTorch module to implement),
``get_inputs()`` (the forward arguments) and ``get_init_inputs()`` (the constructor arguments). Only the
syntax tree is read; nothing is executed.
"""

from __future__ import annotations

import ast

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class InvalidReference(ValueError):
    """The reference program is not a KernelBench problem (syntax error, no Model / get_inputs ...)."""


def top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level: classes, functions, assignments and imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def check_reference(src: str) -> ast.Module:
    """Parse a KernelBench reference; ``InvalidReference`` saying what is wrong when it is not one."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes in the source
        line = getattr(exc, "lineno", None)
        where = f" at line {line}" if line else ""
        raise InvalidReference(f"reference has a syntax error{where}: {getattr(exc, 'msg', exc)}") from exc
    missing = [n for n in REQUIRED_NAMES if n not in top_level_names(tree)]
    if missing:
        what = ", ".join(missing)
        raise InvalidReference(f"not a KernelBench-format reference: it does not define {what}")
    return tree


def is_kernelbench_reference(src: str) -> bool:
    """Whether ``src`` passes :func:`check_reference`."""
    try:
        check_reference(src)
    except InvalidReference:
        return False
    return True


def defines_model_new(src: str) -> bool:
    """Whether ``src`` already defines ``ModelNew`` at top level (a candidate, or a reference with its
    solution); False for text that does not parse."""
    try:
        return "ModelNew" in top_level_names(ast.parse(src))
    except (SyntaxError, ValueError):
        return False
