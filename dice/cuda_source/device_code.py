"""The device-side part of a ``.cu`` file, ready for NVRTC, with a map back to the user's lines.

NVRTC compiles device code only: a function without ``__device__``/``__global__`` is a host function and
"host functions are not allowed in JIT mode", and it cannot open host headers (``<vector>``, ``<cstdio>``,
``<torch/extension.h>``). So the extractor walks the namespace-scope items of the tree-sitter tree and

- keeps kernels, ``__device__`` (and ``__host__ __device__``) functions and prototypes, macros, typedefs,
  ``using`` aliases, structs/classes/enums, templates of these, ``__constant__``/``__device__``/
  ``__managed__`` variables, ``const``/``constexpr`` constants of plain types, comments, and everything inside
  ``#if``/``namespace``/``extern "C"`` blocks by the same rules;
- drops host functions (``main``, launchers with ``<<<>>>``, anything calling ``cudaMalloc``), host
  prototypes and host variables; ``constexpr`` host functions are kept as ``__host__ __device__`` instead,
  because kernels use them in constant expressions (``cdiv``);
- keeps includes NVRTC resolves (CUDA device headers, quoted user headers) and drops the others
  (``<cuda_runtime.h>`` is implicit in NVRTC; ``<vector>``, ``<torch/extension.h>``... are host-only);
- gives C/C++ standard names the kept code uses their libcu++ twin: ``INFINITY`` -> ``<cuda/std/cmath>``,
  ``int64_t`` -> ``<cuda/std/cstdint>``, ``FLT_MAX`` -> ``<cuda/std/cfloat>``, ``std::`` -> ``namespace std``
  aliased to ``cuda::std`` (plus CUDA's global ``max``/``min``), ``M_PI`` -> a ``#define``. This happens
  whether the file included the header or relied on nvcc/torch making it visible, and only for names the
  device code uses: ``#include <cmath>`` for host code costs nothing. The twins need libcu++ on the
  include path (CuPy ships it in ``cupy/_core/include/cupy/_cccl/libcudacxx``).

The output keeps the original line structure: a line that held only dropped code disappears, a line that
shares kept and dropped code keeps its kept part, and added lines stand where the include they replace
stood (or at the top). ``line_map[i]`` is the 0-based original line of output line ``i``.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import tree_sitter

from dice.cuda_source._headers import (
    BY_USAGE,
    DEVICE_HEADER_PREFIXES,
    DEVICE_HEADERS,
    GLOBAL_INT_TYPES,
    LIBCUXX_TWINS,
    MATH_MACROS,
    STD_ALIAS,
    STD_MINMAX,
    TRIGGER_WORDS,
    twins_needed,
)
from dice.cuda_source._syntax import (
    LANGUAGE,
    function_declarator,
    kind_from_specifiers,
    node_text,
    parse_bytes,
    qualifier_macros,
    scan_scopes,
)
from dice.cuda_source.positions import _LINE_BREAK, PositionIndex, decode_bytes, encode_text


@dataclass(frozen=True)
class DeviceCode:
    """``source`` for NVRTC; ``line_map[i]`` = 0-based original line of ``source`` line ``i``;
    ``has_host_code`` = host functions or variables were removed; ``dropped_includes`` = system headers
    removed because NVRTC cannot (or need not) open them."""

    source: str
    line_map: list[int]
    has_host_code: bool
    dropped_includes: tuple[str, ...] = ()

    def original_line(self, source_line: int) -> int | None:
        """Original 0-based line of 0-based ``source_line``, or None when out of range."""
        if 0 <= source_line < len(self.line_map):
            return self.line_map[source_line]
        return None


_NAME_QUERY = tree_sitter.Query(
    LANGUAGE, "[(identifier) (type_identifier) (namespace_identifier) (primitive_type)] @name"
)
_MACRO_QUERY = tree_sitter.Query(
    LANGUAGE,
    """
[(preproc_def name: (identifier) @name value: (preproc_arg)? @body)
 (preproc_function_def name: (identifier) @name value: (preproc_arg)? @body)]""",
)
# Splits the raw text of a macro body (which tree-sitter does not parse) into identifier-like words.
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_DEVICE_VARIABLE_QUALIFIERS = frozenset({"__constant__", "__device__", "__shared__", "__managed__"})
_HOST_NAMESPACES = frozenset({"std", "torch", "at", "c10", "pybind11", "py", "thrust", "chrono"})
_HOST_ONLY_NAMESPACES = frozenset({"torch", "at", "c10", "pybind11", "py"})
_HOST_STD_TYPES = frozenset(
    {
        "vector",
        "string",
        "map",
        "unordered_map",
        "set",
        "unordered_set",
        "list",
        "deque",
        "shared_ptr",
        "unique_ptr",
        "function",
        "thread",
        "mutex",
        "ostream",
        "istream",
        "ofstream",
        "ifstream",
        "stringstream",
        "queue",
        "stack",
        "basic_string",
    }
)
_CLASS_TYPES = ("struct_specifier", "class_specifier", "union_specifier")
_CONTAINERS = frozenset({"preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "preproc_elifdef"})
_PLAIN_TYPES = frozenset(
    {"primitive_type", "sized_type_specifier", "type_identifier", "placeholder_type_specifier"}
)


def extract_device_code(text: str) -> DeviceCode:
    """Device code of ``text`` for NVRTC (see the module docstring for what is kept)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    data = encode_text(text)
    root = parse_bytes(data).root_node
    extractor = _Extractor(data, qualifier_macros(scan_scopes(root).macros, data))
    extractor.run(root)
    extractor.finish(root)
    source, line_map = _apply(data, sorted(extractor.edits, key=lambda e: (e[0], e[1])))
    return DeviceCode(
        source=source,
        line_map=line_map,
        has_host_code=extractor.has_host_code,
        dropped_includes=tuple(extractor.dropped_includes),
    )


class _Extractor:
    def __init__(self, data: bytes, macros: dict[str, frozenset[str]]) -> None:
        self.data = data
        self.macros = macros
        # (start, end, replacement) over the original bytes; non-overlapping.
        self.edits: list[tuple[int, int, bytes]] = []
        self.has_host_code = False
        self.dropped_includes: list[str] = []
        self._twins: list[tuple[int, int, str, str]] = []
        self._include_drops: list[tuple[int, int, bytes]] = []

    def run(self, root: tree_sitter.Node) -> None:
        # An explicit stack, not recursion: `#if` blocks nest as deep as the user likes.
        stack = list(root.children)
        while stack:
            stack.extend(self.visit(stack.pop()))

    def visit(self, node: tree_sitter.Node) -> list[tree_sitter.Node]:
        """Decide about one namespace-scope item; returns the items nested in it to visit next."""
        kind = node.type
        if kind == "preproc_include":
            self._include(node)
        elif kind == "function_definition":
            self._function(node, node)
        elif kind == "template_declaration":
            self._template(node)
        elif kind == "declaration":
            if not self._class(node.child_by_field_name("type"), node):
                self._declaration(node, node)
        elif kind in _CLASS_TYPES or kind == "type_definition":
            self._class(node if kind in _CLASS_TYPES else node.child_by_field_name("type"), node)
        elif kind in _CONTAINERS:
            return node.named_children
        elif kind == "namespace_definition":
            body = node.child_by_field_name("body")
            return body.named_children if body is not None else []
        elif kind == "linkage_specification":
            body = node.child_by_field_name("body")
            if body is not None and body.type == "declaration_list":
                return body.named_children
            return [body] if body is not None else []
        elif kind == "using_declaration":
            words = node_text(self.data, node).replace(";", " ").replace("::", " ").split()
            if len(words) >= 3 and words[1] == "namespace" and words[2] in _HOST_NAMESPACES:
                self._drop(node)
        # Everything else (macros, enums, aliases, comments, ERROR nodes of half-typed code) stays:
        # NVRTC's own diagnostics are the right answer for broken code.
        return []

    def _class(self, spec: tree_sitter.Node | None, top: tree_sitter.Node) -> bool:
        """Host member functions of a class go like free host functions ("host functions are not allowed
        in JIT mode" holds for constructors and methods too); data members and device methods stay. A class
        holding host-only data (``std::vector``, ``torch::Tensor``...) cannot reach the GPU: all of ``top``
        goes. Returns whether ``top`` was dropped."""
        if spec is None or spec.type not in _CLASS_TYPES:
            return False
        if self._has_host_data(spec):
            self._drop(top)
            return True
        stack = [spec]
        while stack:
            node = stack.pop()
            if node is None or node.type not in _CLASS_TYPES:
                continue
            body = node.child_by_field_name("body")
            for member in body.named_children if body is not None else ():
                inner, member_top = member, member
                if member.type == "template_declaration":
                    inner = next(
                        (
                            c
                            for c in reversed(member.named_children)
                            if c.type in ("function_definition", "field_declaration", "declaration")
                        ),
                        member,
                    )
                if inner.type == "function_definition":
                    if inner.child_by_field_name("body") is not None:  # `= default` / `= delete` have none
                        self._function(inner, member_top)
                elif inner.type in ("field_declaration", "declaration"):
                    if any(
                        function_declarator(d) is not None for d in inner.children_by_field_name("declarator")
                    ):
                        specifiers = [
                            c
                            for c in inner.children
                            if c.type != ";" and c not in inner.children_by_field_name("declarator")
                        ]
                        if kind_from_specifiers(specifiers, self.data, self.macros) == "host":
                            self._drop(member_top)
                    else:
                        stack.append(inner.child_by_field_name("type"))  # a nested class
                elif inner.type in _CLASS_TYPES:
                    stack.append(inner)
        return False

    def _has_host_data(self, spec: tree_sitter.Node) -> bool:
        body = spec.child_by_field_name("body")
        for member in body.named_children if body is not None else ():
            if member.type != "field_declaration" or any(
                function_declarator(d) is not None for d in member.children_by_field_name("declarator")
            ):
                continue
            type_node = member.child_by_field_name("type")
            if type_node is None or type_node.type not in ("qualified_identifier", "template_type"):
                continue
            parts = node_text(self.data, type_node).split("<", 1)[0].replace(" ", "").split("::")
            if parts[0] in _HOST_ONLY_NAMESPACES or (parts[0] == "std" and parts[-1] in _HOST_STD_TYPES):
                return True
        return False

    def _drop(self, node: tree_sitter.Node, *, host: bool = True) -> None:
        self.edits.append((node.start_byte, node.end_byte, b""))
        self.has_host_code |= host

    def _include(self, node: tree_sitter.Node) -> None:
        path = node.child_by_field_name("path")
        if path is None or path.type != "system_lib_string":
            return  # "user.cuh": the caller's include path decides
        header = node_text(self.data, path)[1:-1].strip()
        if header in DEVICE_HEADERS or header.startswith(DEVICE_HEADER_PREFIXES):
            return
        end = node.end_byte
        while end > node.start_byte and self.data[end - 1 : end] in (b"\n", b"\r"):
            end -= 1
        twin = LIBCUXX_TWINS.get(header)
        if twin is None:
            self.dropped_includes.append(header)
            drop = (node.start_byte, end, b"")
            self.edits.append(drop)
            self._include_drops.append(drop)
        else:
            self._twins.append((node.start_byte, end, header, twin))

    def finish(self, root: tree_sitter.Node) -> None:
        """Standard headers: a libcu++ twin where the kept device code uses what the header declares.

        Files often include <cstdio> or <cmath> for their host code only; rewriting those would make the
        compile depend on libcu++ for nothing. The other way round, nvcc makes <math.h> and friends visible
        without an include (and torch/extension.h brings <cstdint>, <limits>...), so a kernel may use
        ``INFINITY`` or ``int64_t`` with no include of its own: those twins are added where the first
        dropped include was, or at the top of the file.
        """
        if not self._twins and not any(word in self.data for word in TRIGGER_WORDS):
            return
        used = _names_used(root, self.data, self.edits)
        needed = twins_needed(used)
        blocks: list[tuple[int, int, list[str]]] = []
        explicit: set[str] = set()
        for start, end, header, twin in self._twins:
            wanted = twin in needed or ("std" in used and twin not in BY_USAGE)
            if wanted and twin not in explicit:
                explicit.add(twin)
                blocks.append((start, end, [twin]))
            else:
                self.dropped_includes.append(header)
                self.edits.append((start, end, b""))
        implicit = sorted(needed - explicit)
        fallbacks = [
            f"#ifndef {name}\n#define {name} {value}\n#endif"
            for name, value in MATH_MACROS.items()
            if name in used
        ]
        if implicit or fallbacks:
            anchor = next((e for e in sorted(self.edits) if e[2] == b"" and e in self._include_drops), None)
            if anchor is not None:
                self.edits.remove(anchor)
                blocks.append((anchor[0], anchor[1], implicit + fallbacks))
            else:
                blocks.append((0, 0, implicit + fallbacks))
        std_alias_pending = "std" in used
        for start, end, items in sorted(blocks):
            lines = []
            for item in items:
                if item.startswith("#"):
                    lines.append(item)
                    continue
                lines.append(f"#include <cuda/std/{item}>")
                if item == "cstdint":
                    lines.append(GLOBAL_INT_TYPES)
            if std_alias_pending:
                lines.append(STD_ALIAS)
                if used & {"max", "min"}:
                    lines.append(STD_MINMAX)
                std_alias_pending = False
            text = "\n".join(lines)
            self.edits.append((start, end, (text + "\n" if start == end else text).encode()))

    def _template(self, node: tree_sitter.Node) -> None:
        inner = next(
            (
                c
                for c in reversed(node.named_children)
                if c.type in ("function_definition", "declaration", "template_declaration", *_CLASS_TYPES)
            ),
            None,
        )
        if inner is None:
            return
        if inner.type in _CLASS_TYPES:
            self._class(inner, node)
        elif inner.type == "function_definition":
            self._function(inner, node)
        elif inner.type == "declaration":
            if not self._class(inner.child_by_field_name("type"), node):
                self._declaration(inner, node)
        else:
            # template<...> template<...>: member templates defined out of class
            nested = next(
                (c for c in reversed(inner.named_children) if c.type == "function_definition"), None
            )
            if nested is not None:
                self._function(nested, node)

    def _function(self, fn: tree_sitter.Node, top: tree_sitter.Node) -> None:
        declarator = function_declarator(fn.child_by_field_name("declarator"))
        if declarator is None:
            return
        specifiers = [c for c in fn.children if c.end_byte <= declarator.start_byte]
        if kind_from_specifiers(specifiers, self.data, self.macros) != "host":
            return
        constexpr = any(
            node_text(self.data, c) == "constexpr"
            for c in specifiers
            if c.type in ("type_qualifier", "storage_class_specifier")
        )
        if constexpr and b"<<<" not in self.data[fn.start_byte : fn.end_byte]:
            self.edits.append((fn.start_byte, fn.start_byte, b"__host__ __device__ "))
        else:
            self._drop(top)

    def _declaration(self, decl: tree_sitter.Node, top: tree_sitter.Node) -> None:
        declarators = decl.children_by_field_name("declarator")
        specifiers = [c for c in decl.children if c not in declarators and c.type != ";"]
        if any(function_declarator(d) is not None or d.type == "function_declarator" for d in declarators):
            if kind_from_specifiers(specifiers, self.data, self.macros) == "host":
                self._drop(top)
            return
        words = {
            node_text(self.data, c)
            for c in specifiers
            if c.type in ("type_qualifier", "storage_class_specifier") or c.type.startswith("__")
        }
        if words & _DEVICE_VARIABLE_QUALIFIERS:
            return
        if any(
            kind_from_specifiers([c], self.data, self.macros) != "host"
            for c in specifiers
            if c.type in ("type_identifier", "identifier")
        ):
            return  # a qualifier macro such as `#define DEV __device__`
        type_node = decl.child_by_field_name("type")
        if words & {"const", "constexpr"} and type_node is not None and type_node.type in _PLAIN_TYPES:
            return
        if (
            type_node is not None
            and type_node.type in ("struct_specifier", "class_specifier", "enum_specifier", "union_specifier")
            and type_node.child_by_field_name("body") is not None
        ):
            return  # `struct S {...} s;`: the type is needed even if the variable is not
        self._drop(top)


def _names_used(root: tree_sitter.Node, data: bytes, edits: list[tuple[int, int, bytes]]) -> set[str]:
    """Identifier names used by the code that survives ``edits``, expanding the macros it uses.

    A macro body counts only when the macro is used: ``CUDA_CHECK`` bodies calling ``std::fprintf`` make
    nothing needed unless device code calls ``CUDA_CHECK``.
    """
    dropped = sorted((start, end) for start, end, replacement in edits if end > start and not replacement)
    starts = [start for start, _ in dropped]

    def kept(node: tree_sitter.Node) -> bool:
        i = bisect.bisect_right(starts, node.start_byte) - 1
        return i < 0 or node.start_byte >= dropped[i][1]

    macros: dict[str, set[str]] = {}
    for _, captures in tree_sitter.QueryCursor(_MACRO_QUERY).matches(root):
        names, bodies = captures.get("name", []), captures.get("body", [])
        if names and kept(names[0]):
            words = macros.setdefault(node_text(data, names[0]), set())
            if bodies:
                words.update(_WORD.findall(node_text(data, bodies[0])))
    used: set[str] = set()
    for node in tree_sitter.QueryCursor(_NAME_QUERY).captures(root).get("name", []):
        parent = node.parent
        if parent is not None and parent.type in (
            "preproc_def",
            "preproc_function_def",
            "preproc_params",
            "preproc_ifdef",
            "preproc_defined",
        ):
            continue
        if kept(node):
            used.add(node_text(data, node))
    pending = [name for name in used if name in macros]
    while pending:
        for word in macros.pop(pending.pop(), ()):
            if word not in used:
                used.add(word)
                if word in macros:
                    pending.append(word)
    return used


def _apply(data: bytes, edits: list[tuple[int, int, bytes]]) -> tuple[str, list[int]]:
    """Apply ``edits`` and split the result into lines, each tagged with the original line it comes from.

    A line that loses all its non-blank text to an edit disappears; untouched blank lines stay.
    """
    index = PositionIndex(data)
    lines: list[bytearray] = [bytearray()]
    origins: list[int] = [0]
    touched: list[bool] = [False]

    def add_original(start: int, end: int) -> None:
        cursor = start
        for match in _LINE_BREAK.finditer(data, start, end):
            lines[-1] += data[cursor : match.start()]
            lines.append(bytearray())
            origins.append(index.line_of_byte(match.end()))
            touched.append(False)
            cursor = match.end()
        lines[-1] += data[cursor:end]

    cursor = 0
    for start, end, replacement in edits:
        if start < cursor:
            continue  # overlaps an earlier edit (nested items): the outer edit wins
        add_original(cursor, start)
        touched[-1] = True
        if replacement:
            origin = index.line_of_byte(start)
            first, *rest = replacement.split(b"\n")
            lines[-1] += first
            for extra in rest:
                lines.append(bytearray(extra))
                origins.append(origin)
                touched.append(True)
        # Line breaks inside dropped code end lines that are dropped unless kept text shares them.
        for match in _LINE_BREAK.finditer(data, start, end):
            lines.append(bytearray())
            origins.append(index.line_of_byte(match.end()))
            touched.append(True)
        cursor = max(cursor, end)
    add_original(cursor, len(data))

    out_lines: list[str] = []
    line_map: list[int] = []
    for content, origin, was_touched in zip(lines, origins, touched, strict=True):
        if was_touched and not content.strip():
            continue
        text = decode_bytes(bytes(content))
        out_lines.append(text.rstrip() if was_touched else text)
        line_map.append(origin)
    while out_lines and not out_lines[-1].strip():
        out_lines.pop()
        line_map.pop()
    return "\n".join(out_lines) + ("\n" if out_lines else ""), line_map
