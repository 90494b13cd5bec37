"""CuKe's task files from validated pairs: SFT records, DICE's kernel-infilling split, end-to-end tasks, and
the CUDA of each program as ``.cu`` texts for the editor's infill tasks (:mod:`training.cuke.cu_tasks`).

The formats are DICE's own, so its recipes (and ``dice train sft`` / ``dice train rl``) read them unchanged:

- SFT (LLaMA-Factory ``{prompt, response}``): the prompt is the KernelBench one-shot prompt's *user text*
  (the chat template is the trainer's to apply, as LLaMA-Factory's qwen3 template does); the response is the
  program in one python block, exactly what :func:`training.corpus.render.render_kernelbench` trains on.
- Infilling (``kernel_infilling_*.json``): prefix = the program up to the line of the assignment holding the
  CUDA source, middle = that whole ``source = \"\"\"...\"\"\"`` statement, suffix = the rest. Checked against
  DICE's ``rl_data/kernel_infilling_evaluation.json`` (99 records): the middle starts at its line start and
  ends right after the closing quotes (the line break goes to the suffix), always the string passed to
  ``load_inline(cuda_sources=...)`` (two of the 99 hold no ``__global__``: cuBLASLt and cuDNN wrappers).
- End-to-end (``end_to_end_*.json``): the reference alone; the reward compiles, checks and times the answer.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from training.cuke.cu_tasks import CuSource, CuTaskStats, cu_infill_tasks, nvrtc_compiles
from training.cuke.records import Pair

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the line ends of Python's tokenizer (not str.splitlines's)


def kernelbench_user_prompt(ref_src: str) -> str:
    """The user text of the KernelBench one-shot prompt DICE evaluates with: ``engine.prompts.chat`` of it
    is :func:`engine.prompts.kernelbench_prompt` (``variant="eval"``), byte for byte."""
    from engine.prompts import load_template, render

    return render(
        load_template("kernelbench_eval.txt"),
        example_arch_src=load_template("model_ex_add.py.txt"),
        example_new_arch_src=load_template("model_new_ex_add.py.txt"),
        ref_arch_src=ref_src,
    )


def _candidate(pair: Pair) -> str:
    if not pair.cuda_code:
        raise ValueError(f"{pair.id}: no candidate program (a reference-only pair makes no such task)")
    return pair.cuda_code


def sft_record(pair: Pair, *, level: int | None, speedup: float | None) -> dict[str, Any]:
    """``{id, prompt, response, level, source, speedup, group}``: one SFT sample in DICE's prompt/response
    form. ``group`` is the split unit (:attr:`Pair.problem_ref`, ``"v0:L1P19"``, else the pair's id), so a
    trainer can hold out by problem without re-reading the sources."""
    from training.corpus.render import render_kernelbench

    _, response = render_kernelbench(pair.pytorch_code, _candidate(pair))
    return {
        "id": pair.id,
        "prompt": kernelbench_user_prompt(pair.pytorch_code),
        "response": response,
        "level": level,
        "source": pair.source,
        "speedup": speedup,
        "group": pair.problem_ref or pair.id,
    }


def infill_split(program: str) -> tuple[str, str, str] | None:
    """DICE's infilling split of ``program``: (prefix, middle, suffix) with ``prefix + middle + suffix ==
    program``, or None when the CUDA source is not one literal assignment (built by concatenation or at
    run time, or no kernel at all).

    The middle is the whole statement assigning the CUDA source string, from its line start to the end of
    its last line (line break excluded). Which string: the first one ``load_inline(cuda_sources=NAME)`` (or
    ``[NAME, ...]``) names, else the first assignment of a string holding ``__global__`` (CuPy ``RawKernel``
    sources, assignments inside methods). A ``load_inline`` call given the literal itself makes the middle
    the statement holding the call. The statement must start its line (``x = 1; source = ...`` is None).
    """
    try:
        tree = ast.parse(program)
    except SyntaxError:
        return None
    stmt = _source_statement(tree)
    if stmt is None or stmt.end_lineno is None:
        return None
    starts = [0] + [m.end() for m in _LINE_BREAK.finditer(program)]
    start = starts[stmt.lineno - 1]
    line = program[start : starts[stmt.lineno]] if stmt.lineno < len(starts) else program[start:]
    if line.encode("utf-8")[: stmt.col_offset].strip():
        return None
    last = starts[stmt.end_lineno - 1]
    brk = _LINE_BREAK.search(program, last)
    end = brk.start() if brk else len(program)
    prefix, middle, suffix = program[:start], program[start:end], program[end:]
    assert prefix + middle + suffix == program
    return prefix, middle, suffix


def _source_statement(tree: ast.Module) -> ast.stmt | None:
    """The statement whose middle DICE's split hides (see :func:`infill_split`)."""
    assigns: dict[str, ast.stmt] = {}
    kernels: list[ast.stmt] = []
    for stmt in _statements(tree):
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _is_str(stmt.value):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                assigns.setdefault(_target_name(t), stmt)
            if "__global__" in stmt.value.value:  # type: ignore[union-attr]
                kernels.append(stmt)
    for stmt, call in _load_inline_calls(tree):
        arg = _cuda_sources_arg(call)
        if _is_str(arg):
            return stmt
        names = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
        for n in names:
            if isinstance(n, (ast.Name, ast.Attribute)) and _target_name(n) in assigns:
                return assigns[_target_name(n)]
    return kernels[0] if kernels else None


def _statements(tree: ast.Module) -> list[ast.stmt]:
    """Every statement, in source order (nested bodies included)."""
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
    return sorted(stmts, key=lambda s: (s.lineno, s.col_offset))


def _is_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _target_name(node: ast.AST) -> str:
    """``source`` for ``source``, ``self.source`` for the attribute (what a later read of it spells)."""
    return ast.unparse(node)


def _load_inline_calls(tree: ast.Module) -> list[tuple[ast.stmt, ast.Call]]:
    """(innermost simple statement, call) of every ``load_inline(...)``, in source order."""
    out = []
    for stmt in _statements(tree):
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return, ast.AugAssign)):
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and _call_name(node) == "load_inline":
                    out.append((stmt, node))
    return out


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _cuda_sources_arg(call: ast.Call) -> ast.AST | None:
    """``cuda_sources`` of a ``load_inline`` call: keyword, else the third positional argument."""
    for kw in call.keywords:
        if kw.arg == "cuda_sources":
            return kw.value
    return call.args[2] if len(call.args) > 2 else None


def infill_record(pair: Pair, *, level: int | None) -> dict[str, Any] | None:
    """``{id, pytorch_code, cuda_code, prefix, middle, suffix, level}`` (DICE's ``kernel_infilling``
    schema plus the level), or None when the program has no such split (:func:`infill_split`)."""
    program = _candidate(pair)
    split = infill_split(program)
    if split is None:
        return None
    prefix, middle, suffix = split
    return {
        "id": pair.id,
        "pytorch_code": pair.pytorch_code,
        "cuda_code": program,
        "prefix": prefix,
        "middle": middle,
        "suffix": suffix,
        "level": level,
    }


def e2e_record(pair: Pair, *, level: int | None) -> dict[str, Any]:
    """``{id, pytorch_code, level}``: an end-to-end generation task (the reward validates the answer)."""
    return {"id": pair.id, "pytorch_code": pair.pytorch_code, "level": level}


def kernels_as_cu_files(pair: Pair) -> list[CuSource]:
    """The CUDA source strings of ``pair``'s program as ``.cu`` texts, for :func:`cu_infill_tasks`.

    The strings are the ones the validator compiles: each ``load_inline`` call's ``cuda_sources`` resolved
    statically (:func:`dice.validator.guards.analyze_candidate`: names, lists, concatenations); a program
    with none (CuPy ``RawKernel``/``RawModule``) gives its string constants holding ``__global__``. Their
    values, not their program text: escapes are what the compiler sees. Duplicates come once; the id is the
    pair's (``<pair id>#<k>`` when there are several).

    ``has_spec`` is always False: a dice-spec needs ``launch(module, *inputs)``, which calls the file's
    kernels with their grid and arguments from Python, and that is what the program's C++ host wrapper
    does; nothing in the repository derives it from a KernelBench reference, so these tasks are
    compile-checked only.

    Each text keeps its device part only (:func:`device_part`: the host functions, the torch wrapper
    among them, taken out). The reward compiles a file with host code whole with nvcc, and a torch
    extension's wrapper needs torch's headers there: with them a compile takes 14-17 s
    (``benchmarks/results/validator_build_bench_h200.md``), without them every fill fails
    (``torch/extension.h: No such file``); the device part is checked by NVRTC, torch headers stubbed, in
    about 0.1 s, and holes are cut in device code only anyway.
    """
    from dice.validator.guards import analyze_candidate

    program = _candidate(pair)
    try:
        info = analyze_candidate(program)
    except (SyntaxError, ValueError):
        return []
    texts = [s for ext in info.extensions if ext.resolved for s in ext.cuda_sources if "__global__" in s]
    if not texts:
        texts = [
            n.value
            for n in _nodes_in_order(info.tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and "__global__" in n.value
        ]
    texts = list(dict.fromkeys(device_part(t) for t in texts))
    if len(texts) == 1:
        return [CuSource(pair.id, texts[0], False)]
    return [CuSource(f"{pair.id}#{k}", text, False) for k, text in enumerate(texts)]


def device_part(text: str) -> str:
    """``text`` without its host functions (``__global__`` and ``__device__`` ones, including
    ``__host__ __device__``, stay, with everything outside functions: includes, macros, types)."""
    from dice.cuda_source import parse_document

    data = text.encode("utf-8")
    spans = sorted(
        ((f.start_byte, f.end_byte) for f in parse_document(text).functions if f.kind == "host"), reverse=True
    )
    for start, end in spans:
        data = data[:start] + data[end:]
    return re.sub(r"\n{3,}", "\n\n", data.decode("utf-8")).rstrip() + "\n"


def _nodes_in_order(tree: ast.Module) -> list[ast.AST]:
    """Every node, in source order (``ast.walk`` is breadth-first)."""
    nodes = [n for n in ast.walk(tree) if hasattr(n, "lineno")]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


__all__ = [
    "CuSource",
    "CuTaskStats",
    "cu_infill_tasks",
    "e2e_record",
    "infill_record",
    "infill_split",
    "kernelbench_user_prompt",
    "kernels_as_cu_files",
    "nvrtc_compiles",
    "sft_record",
]
