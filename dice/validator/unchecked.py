"""Which code of a file no compiler type-checked, for the verdict's ``unchecked`` list.

NVRTC sees only the device code, and parses a template's body only when something instantiates it: a use in
kept device code, an explicit instantiation, or a name expression (:func:`launch_name_expressions` takes
those from the host code's own ``k<float, 8><<<...>>>`` launches). nvcc compiles the whole file, host code
included, but a template nothing in the file instantiates is still checked for syntax only.

So, conservatively (a use is a reference to the template's name from code that is itself checked; uses
through a macro count where the macro is used):

- only NVRTC ran: every host function, and every template NVRTC did not instantiate;
- nvcc compiled the whole file: every template that nothing in the file instantiates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tree_sitter

from dice.cuda_source import CudaDocument, DeviceCode, Position, parse_bytes

# "<short>: <detail>": labels show the short part (``not checked (host code)``), messages the whole.
REASON_HOST_NO_NVCC = "host code: nvcc was not found, and NVRTC compiles device code only"
REASON_TEMPLATE_NVRTC = (
    "template never instantiated: only NVRTC ran (nvcc was not found), and no device code or host launch "
    "uses it"
)
REASON_INACTIVE = (
    "preprocessor branch not compiled: its #if condition is false for this command and architecture"
)
REASON_TEMPLATE_NVCC = (
    "template never instantiated: nothing in this file uses it, so nvcc checked its syntax only"
)

_NAME_NODES = {"identifier", "type_identifier", "field_identifier", "namespace_identifier"}
_IDENT = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class _Function:
    name: str  # the last name of the declarator (``get`` of ``S<T>::get``)
    kind: str
    start: int
    end: int
    templated: bool
    owner: str | None  # the class template it belongs to


@dataclass
class _Tree:
    functions: list[_Function]
    references: list[tuple[str, int]]  # every name used, with its byte offset
    macros: dict[str, set[str]]  # macro -> the names in its body
    namespaces: list[tuple[int, int, str]]
    launches: list[tuple[str, str, int]]  # (kernel name, "k<float, 8>", byte) of <<<>>> launches


def _text(data: bytes, node: tree_sitter.Node) -> str:
    return data[node.start_byte : node.end_byte].decode("utf-8", "replace")


def _last_name(name: str) -> str:
    base = name
    while re.search(r"<[^<>]*>", base):
        base = re.sub(r"<[^<>]*>", "", base)
    last = base.split("::")[-1].strip()
    return last.split()[-1] if last.split() else last


def _owner_of(name: str) -> str | None:
    base = re.sub(r"<[^<>]*>", "", name)
    parts = [p.strip() for p in base.split("::")]
    return parts[-2] if len(parts) > 1 else None


def _walk(doc: CudaDocument) -> _Tree:
    data = doc.data
    root = parse_bytes(data).root_node
    templates: list[tuple[int, int, str | None]] = []  # non-empty template<...>: range, class name
    references: list[tuple[str, int]] = []
    macros: dict[str, set[str]] = {}
    namespaces: list[tuple[int, int, str]] = []
    launches: list[tuple[str, str, int]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        kind = node.type
        if kind in _NAME_NODES:
            references.append((_text(data, node), node.start_byte))
        elif kind == "template_declaration":
            params = node.child_by_field_name("parameters")
            if params is not None and params.named_child_count > 0:
                klass = next(
                    (c for c in node.named_children if c.type in ("struct_specifier", "class_specifier")),
                    None,
                )
                name = klass.child_by_field_name("name") if klass is not None else None
                templates.append(
                    (node.start_byte, node.end_byte, _text(data, name) if name is not None else None)
                )
        elif kind in ("preproc_def", "preproc_function_def"):
            name, body = node.child_by_field_name("name"), node.child_by_field_name("value")
            if name is not None:
                macros[_text(data, name)] = (
                    set(_IDENT.findall(_text(data, body))) if body is not None else set()
                )
            continue  # the macro's own name is no use of anything
        elif kind == "namespace_definition":
            name = node.child_by_field_name("name")
            if name is not None:
                namespaces.append((node.start_byte, node.end_byte, _text(data, name)))
        elif kind == "call_expression":
            _launch(data, node, launches)
        stack.extend(reversed(node.children))
    functions = []
    for f in doc.functions:
        own = any(start == f.start_byte for start, _, _ in templates)
        owners = [c for start, end, c in templates if start < f.start_byte and f.end_byte <= end and c]
        owner = owners[-1] if owners else (_owner_of(f.name) if own else None)
        enclosed = own or any(start < f.start_byte and f.end_byte <= end for start, end, _ in templates)
        functions.append(_Function(_last_name(f.name), f.kind, f.start_byte, f.end_byte, enclosed, owner))
    return _Tree(functions, references, macros, namespaces, launches)


def _launch(data: bytes, node: tree_sitter.Node, launches: list[tuple[str, str, int]]) -> None:
    callee = node.child_by_field_name("function")
    if callee is None or callee.type != "template_function":
        return
    if not any(c.type == "kernel_call_syntax" for c in node.children):
        return
    name = callee.child_by_field_name("name")
    if name is not None:
        expression = " ".join(_text(data, callee).split())
        launches.append((_text(data, name), expression, node.start_byte))


def _expanded_refs(tree: _Tree, checked: Callable[[int], bool]) -> list[tuple[str, int]]:
    """The references at checked offsets, with the names in the bodies of the macros used there."""
    out: list[tuple[str, int]] = []
    for name, at in tree.references:
        if not checked(at):
            continue
        out.append((name, at))
        pending, seen = [name], set()
        while pending:
            macro = pending.pop()
            if macro in seen or macro not in tree.macros:
                continue
            seen.add(macro)
            for inner in tree.macros[macro]:
                out.append((inner, at))
                pending.append(inner)
    return out


def _instantiated(tree: _Tree, is_root: Callable[[int], bool], extra: set[str]) -> set[int]:
    """Indexes of the templated functions something checked uses (a fixpoint through templates)."""
    templated = [i for i, f in enumerate(tree.functions) if f.templated]
    inside = lambda at, f: f.start <= at < f.end  # noqa: E731
    names = {n for n, _ in _expanded_refs(tree, is_root)} | extra
    done: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i in templated:
            f = tree.functions[i]
            if i in done or f.name not in names or (f.owner and f.owner not in names):
                continue
            done.add(i)
            changed = True
            names |= {n for n, _ in _expanded_refs(tree, lambda at, f=f: inside(at, f))}
    return done


def _entry(doc: CudaDocument, f: _Function, reason: str, name: str) -> dict[str, object]:
    return {
        "line": doc.index.line_of_byte(f.start),
        "end_line": doc.index.line_of_byte(max(f.start, f.end - 1)),
        "function": name,
        "reason": reason,
    }


def unchecked_ranges(
    doc: CudaDocument,
    *,
    nvcc_compiled: bool,
    device: DeviceCode | None = None,
    nvrtc_names: Sequence[str] = (),
    active: Sequence[int] | None = None,
) -> list[dict[str, object]]:
    """The verdict's ``unchecked`` list: ``{"line", "end_line", "function", "reason"}``, 0-based lines of
    ``doc``, in file order. ``nvcc_compiled``: nvcc compiled the whole text; otherwise only NVRTC ran, on
    ``device`` (the extraction of ``doc.text``), with the name expressions ``nvrtc_names`` compiled.
    ``active``: after nvcc, the lines that reached the compiler; the code of ``#if`` branches that did not
    is added (:func:`inactive_ranges`)."""
    tree = _walk(doc)
    if nvcc_compiled:
        in_template = [f for f in tree.functions if f.templated]
        is_root = lambda at: not any(f.start <= at < f.end for f in in_template)  # noqa: E731
        done = _instantiated(tree, is_root, set())
        reasons = {
            i: REASON_TEMPLATE_NVCC for i, f in enumerate(tree.functions) if f.templated and i not in done
        }
    else:
        kept = set(device.line_map) if device is not None else set()
        host = [f for f in tree.functions if f.kind == "host"]
        in_template = [f for f in tree.functions if f.templated]

        def is_root(at: int) -> bool:
            if doc.index.line_of_byte(at) not in kept:
                return False
            return not any(f.start <= at < f.end for f in host + in_template)

        done = _instantiated(tree, is_root, {_last_name(n.split("<", 1)[0]) for n in nvrtc_names})
        reasons = {}
        for i, f in enumerate(tree.functions):
            if f.kind == "host":
                reasons[i] = REASON_HOST_NO_NVCC
            elif f.templated and i not in done:
                reasons[i] = REASON_TEMPLATE_NVRTC
    extra = inactive_ranges(doc, active) if nvcc_compiled and active is not None else []
    out = extra + [_entry(doc, f, reasons[i], f.name) for i, f in enumerate(tree.functions) if i in reasons]
    return _outermost(out)


def merge_unchecked(*lists: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """Several ``unchecked`` lists as one, in file order, entries inside another one dropped."""
    return _outermost([dict(e) for entries in lists for e in entries])


def _outermost(entries: list[dict[str, object]]) -> list[dict[str, object]]:
    """Drop entries inside another one (a method inside an unchecked class template's method...)."""
    entries.sort(key=lambda e: (e["line"], -int(e["end_line"])))  # type: ignore[arg-type]
    out: list[dict[str, object]] = []
    for e in entries:
        if out and int(out[-1]["line"]) <= int(e["line"]) and int(e["end_line"]) <= int(out[-1]["end_line"]):  # type: ignore[arg-type]
            continue
        out.append(e)
    return out


_CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|elifdef|elifndef|else|endif)\b")


def _code_lines(lines: Sequence[str]) -> list[bool | None]:
    """Per line: True for code, None for a conditional directive, False for anything else (blank,
    comment, other directive, a directive's continuation)."""
    out: list[bool | None] = []
    in_comment = continued = False
    for text in lines:
        s = text.strip()
        was_continued, continued = continued, s.endswith("\\")
        if in_comment:
            in_comment = "*/" not in s
            out.append(False)
            continue
        if s.startswith("/*") and "*/" not in s:
            in_comment = True
            out.append(False)
        elif was_continued or s.startswith("#"):
            continued = continued and (was_continued or s.startswith("#"))
            out.append(None if not was_continued and _CONDITIONAL.match(s) else False)
        else:
            out.append(bool(s) and not s.startswith("//") and not (s.startswith("/*") and s.endswith("*/")))
    return out


def inactive_ranges(doc: CudaDocument, active: Sequence[int]) -> list[dict[str, object]]:
    """``unchecked`` entries for the ``#if``/``#else`` branches of ``doc`` whose code never reached the
    compiler: a stretch between two conditional directives with code lines, none of them in ``active``
    (the 0-based lines nvcc's preprocessed output holds)."""
    seen = set(active)
    kinds = _code_lines(doc.text.splitlines())
    if None not in kinds:
        return []
    out: list[dict[str, object]] = []
    region: list[int] = []
    for n, kind in enumerate([*kinds, None]):
        if kind is None:
            if region and not any(line in seen for line in region):
                name = _enclosing_name(doc, region[0])
                out.append(
                    {"line": region[0], "end_line": region[-1], "function": name, "reason": REASON_INACTIVE}
                )
            region = []
        elif kind:
            region.append(n)
    return out


REASON_INACTIVE_NVRTC = (
    "preprocessor branch not compiled: its #if condition is false for NVRTC's compile of the device code"
)
_PROBE = "dice_active_branch_"
_PROBE_SEEN = re.compile(r"#warning directive: " + _PROBE + r"(\d+)")


@dataclass(frozen=True)
class BranchProbe:
    """The device code with a ``#warning`` before the first code line of every ``#if``/``#else`` branch
    (``source``, ``line_map`` into the original file as :class:`DeviceCode`'s), and each probe's branch:
    ``regions[k]`` = the 0-based device-source lines of code branch ``k`` holds. NVRTC prints a
    ``#warning`` only from a branch it compiles, so the probes missing from its log name the branches it
    skipped (:meth:`inactive`)."""

    source: str
    line_map: list[int]
    regions: list[list[int]]

    def inactive(self, log: str, device: DeviceCode, doc: CudaDocument) -> list[dict[str, object]]:
        """``unchecked`` entries (original lines) for the branches whose probe ``log`` does not show: not
        compiled, or not known to be (a compile that stopped early, a suppressed warning)."""
        seen = {int(m) for m in _PROBE_SEEN.findall(log)}
        out: list[dict[str, object]] = []
        for k, region in enumerate(self.regions):
            if k in seen:
                continue
            first, last = device.line_map[region[0]], device.line_map[region[-1]]
            name = _enclosing_name(doc, first)
            out.append({"line": first, "end_line": last, "function": name, "reason": REASON_INACTIVE_NVRTC})
        return out


def branch_probe(device: DeviceCode) -> BranchProbe | None:
    """The probe of ``device``'s conditional branches that hold code (nested in at least one ``#if``), or
    None when there is none (then every line NVRTC was given was compiled, and no probe is needed)."""
    lines = device.source.splitlines(keepends=True)
    kinds = _code_lines([line.rstrip("\r\n") for line in lines])
    regions: list[list[int]] = []
    depth = 0
    current: list[int] = []
    for n, kind in enumerate([*kinds, None]):
        if kind is None:
            if current and depth > 0:
                regions.append(current)
            current = []
            if n < len(kinds):
                word = _CONDITIONAL.match(lines[n].strip()).group(1)  # type: ignore[union-attr]
                depth += 1 if word in ("if", "ifdef", "ifndef") else -1 if word == "endif" else 0
        elif kind:
            current.append(n)
    if not regions:
        return None
    starts = {region[0]: k for k, region in enumerate(regions)}
    out: list[str] = []
    line_map: list[int] = []
    for n, line in enumerate(lines):
        if n in starts:
            out.append(f"#warning {_PROBE}{starts[n]}\n")
            line_map.append(device.line_map[n])
        out.append(line if line.endswith("\n") else line + "\n")
        line_map.append(device.line_map[n])
    return BranchProbe("".join(out), line_map, regions)


def _enclosing_name(doc: CudaDocument, line: int) -> str:
    """The last name of the innermost function around 0-based ``line`` ("" outside functions)."""
    start = doc.index.position_to_byte(Position(line, 0))
    enclosing = [f for f in doc.functions if f.start_byte <= start < f.end_byte]
    return _last_name(min(enclosing, key=lambda f: f.end_byte - f.start_byte).name) if enclosing else ""


def launch_name_expressions(doc: CudaDocument) -> list[str]:
    """NVRTC name expressions for the template kernels the host code launches with explicit arguments
    (``k<float, 8><<<...>>>`` in a host function that is not itself a template), qualified with the
    kernel's namespaces. Names NVRTC cannot resolve are dropped by the compile step."""
    tree = _walk(doc)
    kernels = {f.name: f for f in tree.functions if f.kind == "global" and f.templated}
    hosts = [f for f in tree.functions if f.kind == "host" and not f.templated]
    names: list[str] = []
    for kernel, expression, at in tree.launches:
        target = kernels.get(_last_name(kernel))
        if target is None or not any(h.start <= at < h.end for h in hosts) or "::" in kernel:
            continue
        scope = [n for start, end, n in tree.namespaces if start < target.start and target.end <= end]
        qualified = "::".join([*scope, expression]) if scope else expression
        if qualified not in names:
            names.append(qualified)
    return names


def describe_unchecked(entries: Sequence[dict[str, object]]) -> str:
    """One phrase for a message: ``not type-checked: host code (main, launch); template never instantiated
    (scale)`` (empty for no entries)."""
    groups: dict[str, list[str]] = {}
    for e in entries:
        short = str(e["reason"]).split(":", 1)[0]
        groups.setdefault(short, []).append(str(e["function"]) or "file scope")
    parts = []
    for short, names in groups.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        parts.append(f"{short} ({shown})")
    return "not type-checked: " + "; ".join(parts) if parts else ""
