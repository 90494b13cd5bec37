"""The device-side part of a ``.cu`` file, ready for NVRTC, with a map back to the user's lines.

NVRTC compiles device code only: a function without ``__device__``/``__global__`` is a host function and
"host functions are not allowed in JIT mode", and it cannot open host headers (``<vector>``, ``<cstdio>``,
``<torch/extension.h>``). So the extractor walks the namespace-scope items of the tree-sitter tree and

- keeps kernels, ``__device__`` (and ``__host__ __device__``) functions and prototypes, macros, typedefs,
  ``using`` aliases, structs/classes/enums, templates of these and their explicit instantiations and
  specialisations, ``__constant__``/``__device__``/``__managed__`` variables, ``const``/``constexpr``
  constants of plain types (not pointers or references), comments, and everything inside
  ``#if``/``namespace``/``extern "C"`` blocks by the same rules;
- drops host functions (``main``, launchers with ``<<<>>>``, anything calling ``cudaMalloc``), host
  prototypes, host variables (``const char* names[]`` included), classes holding host data (``std::vector``,
  ``cublasHandle_t``, a ``std::exception`` base), and the explicit instantiations and specialisations of the
  templates it dropped; ``constexpr`` host functions are kept as ``__host__ __device__`` instead, because
  kernels use them in constant expressions (``cdiv``);
- reads through unexpanded macros: attribute macros left as an ERROR before a dropped prototype go with it,
  a qualifier or launch-bounds macro that tree-sitter splits from its function (``__global__ LB(256)``)
  decides with it, a macro call wrapping a host prototype (``DEPRECATED(int f(void), "msg");``) goes, and
  the decisions are made on a parse where namespace macros, ``extern "C" {`` inside ``#ifdef
  __cplusplus``, class-head attribute macros and lambda qualifier macros are blanked (the output keeps
  them);
- keeps includes NVRTC resolves (CUDA device headers, quoted user headers, ``<...>`` project headers the
  caller names) and drops the others (``<cuda_runtime.h>`` is implicit in NVRTC; ``<vector>``,
  ``<torch/extension.h>``... are host-only);
- gives C/C++ standard names the kept code uses their libcu++ twin: ``INFINITY`` -> ``<cuda/std/cmath>``,
  ``int64_t`` -> ``<cuda/std/cstdint>``, ``FLT_MAX`` -> ``<cuda/std/cfloat>``, ``std::`` -> ``namespace std``
  aliased to ``cuda::std`` (plus CUDA's global ``max``/``min``), ``M_PI`` -> a ``#define``, ``uint``/
  ``ushort``/``ulong`` (``<sys/types.h>``) -> a ``typedef`` unless the file defines them. This happens
  whether the file included the header or relied on nvcc/torch making it visible, and only for names the
  device code uses: ``#include <cmath>`` for host code costs nothing. The twins need libcu++ on the
  include path (CuPy ships it in ``cupy/_core/include/cupy/_cccl/libcudacxx``).

The output keeps the original line structure: a line that held only dropped code disappears, a line that
shares kept and dropped code keeps its kept part, and added lines stand where the include they replace
stood (or at the top). ``line_map[i]`` is the 0-based original line of output line ``i``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

import tree_sitter

from dice.cuda_source._edits import Edit, apply_edits
from dice.cuda_source._includes import Includes
from dice.cuda_source._preprocessor import (
    brace_only_conditionals,
    group_end,
    namespace_macro_uses,
    scan_directives,
)
from dice.cuda_source._syntax import (
    function_declarator,
    has_template_parameters,
    kind_from_specifiers,
    node_text,
    parse_bytes,
    qualifier_macros,
    scan_scopes,
)
from dice.cuda_source.positions import encode_text


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
_HOST_STD_BASES = _HOST_STD_TYPES | {
    "exception",
    "runtime_error",
    "logic_error",
    "invalid_argument",
    "out_of_range",
    "bad_alloc",
    "enable_shared_from_this",
}
# Handles and descriptors of host libraries (`cublasHandle_t`, `cublasLtMatmulAlgo_t`): data that never
# reaches the GPU.
_HOST_LIBRARY_PREFIXES = ("cublas", "cusparse", "cusolver", "cufft", "cudnn", "nccl", "cutensor", "nvjpeg")
_CLASS_TYPES = ("struct_specifier", "class_specifier", "union_specifier")
_CLASS_HEAD_MACRO = re.compile(
    rb"\b(?:struct|class|union)[ \t]+((?:[A-Z][A-Z0-9_]+|__\w+__)[ \t]*\([^()\r\n]*\))"
    rb"[ \t]+(?=[A-Za-z_]\w*[ \t\r\n]*[:{])"
)
# `[=] MGPU_DEVICE(int i) {...}`: a qualifier macro after a lambda's capture.
_LAMBDA_MACRO = re.compile(rb"\][ \t]*([A-Z][A-Z0-9_]+)[ \t]*(?=\()")
# An ERROR node of attribute macros right before a dropped item goes with it when it is small and holds no
# statement or block of its own.
_PREFIX_LIMIT = 400
_PREFIX_STOPS = frozenset({";", "{", "}"})
_CONTAINERS = frozenset({"preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "preproc_elifdef"})
_PLAIN_TYPES = frozenset(
    {"primitive_type", "sized_type_specifier", "type_identifier", "placeholder_type_specifier"}
)


def extract_device_code(text: str, *, project_headers: Collection[str] = ()) -> DeviceCode:
    """Device code of ``text`` for NVRTC (see the module docstring for what is kept). ``project_headers``:
    ``<...>`` includes that name the project's own headers (the caller found them on its ``-I`` path, e.g.
    ``moderngpu/transform.hxx``); they stay, as quoted includes do."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    data = encode_text(text)
    root = parse_bytes(_decision_text(data)).root_node
    extractor = _Extractor(data, qualifier_macros(scan_scopes(root).macros, data), project_headers)
    extractor.run(root)
    extractor.includes.finish(root, extractor.edits)
    # Outer edits first where two start together: the outer one wins.
    source, line_map = apply_edits(data, sorted(extractor.edits, key=lambda e: (e[0], -e[1])))
    return DeviceCode(
        source=source,
        line_map=line_map,
        has_host_code=extractor.has_host_code,
        dropped_includes=tuple(extractor.includes.dropped),
    )


class _Extractor:
    def __init__(
        self, data: bytes, macros: dict[str, frozenset[str]], project_headers: Collection[str] = ()
    ) -> None:
        self.data = data
        self.macros = macros
        # (start, end, replacement) over the original bytes; an edit inside an earlier one is skipped.
        self.edits: list[Edit] = []
        self.has_host_code = False
        self.includes = Includes(data, project_headers)
        # Templates by name, and the explicit instantiations/specialisations that depend on them.
        self._dropped_templates: set[str] = set()
        self._kept_templates: set[str] = set()
        self._dependents: list[tuple[tree_sitter.Node, str]] = []

    def run(self, root: tree_sitter.Node) -> None:
        # An explicit stack, not recursion: `#if` blocks nest as deep as the user likes.
        stack = list(root.children)
        while stack:
            stack.extend(self.visit(stack.pop()))
        # Instantiations and specialisations of a template that went (a host template) go too: NVRTC
        # would say "f is not a template". Those of kept templates, or of templates from a header, stay.
        for node, name in self._dependents:
            if name in self._dropped_templates and name not in self._kept_templates:
                self._drop(node)

    def visit(self, node: tree_sitter.Node) -> list[tree_sitter.Node]:
        """Decide about one namespace-scope item; returns the items nested in it to visit next."""
        kind = node.type
        if kind == "preproc_include":
            self.includes.visit(node, self.edits)
        elif kind == "function_definition":
            self._function(node, node)
        elif kind == "template_declaration":
            self._template(node)
        elif kind == "template_instantiation":
            name = _instantiated_name(node, self.data)
            if name:
                self._dependents.append((node, name))
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
        elif kind == "ERROR":
            self._wrapped_declaration(node)
            if not any(child.type == "{" for child in node.children):
                # Prototypes an unexpanded macro pulled into an ERROR (`GGML_API int f(void)`); only those:
                # anything else in an ERROR may be code the user is typing.
                for child in node.named_children:
                    if child.type in ("declaration", "parameter_declaration") and _function_name(
                        child, self.data
                    ):
                        self._declaration(child, child)
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

    def _wrapped_declaration(self, error: tree_sitter.Node) -> None:
        """``GGML_DEPRECATED(GGML_API double f(int t), "use g");``: a macro call around a host prototype is
        an ERROR node (the macro and the prototype) and the rest up to the ``;``; all of it goes."""
        children = error.children
        if len(children) < 3 or children[0].type != "identifier" or children[1].type != "(":
            return
        inner = next((c for c in children[2:] if _function_name(c, self.data)), None)
        if inner is None:
            return
        declarators = inner.children_by_field_name("declarator")
        specifiers = [c for c in inner.children if c not in declarators]
        if kind_from_specifiers(specifiers, self.data, self.macros) != "host":
            return
        close = group_end(self.data, children[1].start_byte)
        semicolon = self.data.find(b";", close) if close is not None else -1
        parent = error.parent
        if close is None or semicolon == -1 or self.data[close:semicolon].strip():
            return
        if parent is not None and semicolon >= parent.end_byte:
            return
        self.edits.append((error.start_byte, semicolon + 1, b""))
        self.has_host_code = True

    def _has_host_data(self, spec: tree_sitter.Node) -> bool:
        """Whether a class holds data that never reaches the GPU: ``std::vector``, ``torch::Tensor``, a
        ``cublasHandle_t``, or derives from a host class such as ``std::exception``."""
        for base in _base_classes(spec):
            parts = node_text(self.data, base).split("<", 1)[0].replace(" ", "").split("::")
            if parts[0] in _HOST_ONLY_NAMESPACES or (parts[0] == "std" and parts[-1] in _HOST_STD_BASES):
                return True
        body = spec.child_by_field_name("body")
        for member in body.named_children if body is not None else ():
            if member.type != "field_declaration" or any(
                function_declarator(d) is not None for d in member.children_by_field_name("declarator")
            ):
                continue
            type_node = member.child_by_field_name("type")
            if type_node is None:
                continue
            if type_node.type == "type_identifier":
                if node_text(self.data, type_node).startswith(_HOST_LIBRARY_PREFIXES):
                    return True
                continue
            if type_node.type not in ("qualified_identifier", "template_type"):
                continue
            parts = node_text(self.data, type_node).split("<", 1)[0].replace(" ", "").split("::")
            if parts[0] in _HOST_ONLY_NAMESPACES or (parts[0] == "std" and parts[-1] in _HOST_STD_TYPES):
                return True
        return False

    def _drop(self, node: tree_sitter.Node, *, host: bool = True, start: int | None = None) -> None:
        """Remove ``node`` (from ``start`` when given), with the attribute macros tree-sitter left as an
        ERROR node right before it (``GGML_NORETURN GGML_ATTRIBUTE_FORMAT(3, 4)``)."""
        start = node.start_byte if start is None else start
        prefix = node.prev_sibling
        if (
            prefix is not None
            and prefix.type == "ERROR"
            and prefix.end_byte - prefix.start_byte <= _PREFIX_LIMIT
            and not self.data[prefix.end_byte : start].strip()
            and not any(leaf in _PREFIX_STOPS for leaf in _leaf_types(prefix))
        ):
            start = min(start, prefix.start_byte)
        self.edits.append((start, node.end_byte, b""))
        self.has_host_code |= host

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
        dropped = False
        if inner.type in _CLASS_TYPES:
            dropped = self._class(inner, node)
            name = _base_name(inner.child_by_field_name("name"), self.data)
        elif inner.type == "function_definition":
            dropped = self._function(inner, node)
            name = _function_name(inner, self.data)
        elif inner.type == "declaration":
            dropped = self._class(inner.child_by_field_name("type"), node) or self._declaration(inner, node)
            name = _function_name(inner, self.data)
        else:
            # template<...> template<...>: member templates defined out of class
            nested = next(
                (c for c in reversed(inner.named_children) if c.type == "function_definition"), None
            )
            if nested is not None:
                self._function(nested, node)
            return
        if not name:
            return
        if has_template_parameters(node):
            (self._dropped_templates if dropped else self._kept_templates).add(name)
        elif not dropped:
            self._dependents.append((node, name))  # `template <> struct S<int> {...}`

    def _function(self, fn: tree_sitter.Node, top: tree_sitter.Node) -> bool:
        """Keep a device function, make a constexpr host one ``__host__ __device__``, drop the others;
        returns whether it was dropped."""
        declarator = function_declarator(fn.child_by_field_name("declarator"))
        if declarator is None:
            return False
        specifiers = [c for c in fn.children if c.end_byte <= declarator.start_byte]
        split = _split_specifiers(top, self.data)
        if split is not None:
            specifiers = [c for c in split.children if not c.is_missing] + specifiers
        if kind_from_specifiers(specifiers, self.data, self.macros) != "host":
            return False
        constexpr = any(
            node_text(self.data, c) == "constexpr"
            for c in specifiers
            if c.type in ("type_qualifier", "storage_class_specifier")
        )
        if constexpr and b"<<<" not in self.data[fn.start_byte : fn.end_byte]:
            self.edits.append((fn.start_byte, fn.start_byte, b"__host__ __device__ "))
            return False
        self._drop(top, start=min(top.start_byte, _item_start(split)) if split is not None else None)
        return True

    def _declaration(self, decl: tree_sitter.Node, top: tree_sitter.Node) -> bool:
        """Drop host prototypes and host variables; returns whether ``top`` was dropped."""
        if decl.has_error and b"{" in self.data[decl.start_byte : decl.end_byte]:
            return False  # a class or body tree-sitter could not read (`struct S<i> : A<i + 1> {...}`): stays
        declarators = decl.children_by_field_name("declarator")
        specifiers = [c for c in decl.children if c not in declarators and c.type != ";"]
        if any(function_declarator(d) is not None or d.type == "function_declarator" for d in declarators):
            if kind_from_specifiers(specifiers, self.data, self.macros) == "host":
                self._drop(top)
                return True
            return False
        if decl.has_error:
            return False  # not a variable tree-sitter could read: NVRTC's diagnostics are the answer
        words = {
            node_text(self.data, c)
            for c in specifiers
            if c.type in ("type_qualifier", "storage_class_specifier") or c.type.startswith("__")
        }
        if words & _DEVICE_VARIABLE_QUALIFIERS:
            return False
        if any(
            kind_from_specifiers([c], self.data, self.macros) != "host"
            for c in specifiers
            if c.type in ("type_identifier", "identifier")
        ):
            return False  # a qualifier macro such as `#define DEV __device__`
        type_node = decl.child_by_field_name("type")
        if (
            words & {"const", "constexpr"}
            and type_node is not None
            and type_node.type in _PLAIN_TYPES
            and all(_plain_declarator(d) for d in declarators)
        ):
            return False  # a constant of a plain type: `const float kScale = 2.0f;`, `constexpr int kN[2]`
        if (
            type_node is not None
            and type_node.type in ("struct_specifier", "class_specifier", "enum_specifier", "union_specifier")
            and type_node.child_by_field_name("body") is not None
        ):
            return False  # `struct S {...} s;`: the type is needed even if the variable is not
        self._drop(top)
        return True


def _decision_text(data: bytes) -> bytes:
    """The bytes the extractor parses: ``data`` with macro uses that wreck tree-sitter's reading of the
    items around them blanked (same offsets): namespace macros (``BEGIN_NS``/``END_NS``), ``extern "C" {``
    and its ``}`` inside ``#ifdef __cplusplus`` blocks, attribute
    macros in a class head (``struct MGPU_ALIGN(8) dim_t {``) and qualifier macros of lambdas
    (``[=] MGPU_DEVICE(int i) {...}``, which hide the host function around them). Edits apply to
    ``data`` itself, which keeps the macros."""
    spans = [m.span(1) for m in _CLASS_HEAD_MACRO.finditer(data)]
    spans += [m.span(1) for m in _LAMBDA_MACRO.finditer(data)]
    if b"NAMESPACE" in data or b"namespace" in data or b"__cplusplus" in data:
        directives = scan_directives(data)
        spans += namespace_macro_uses(data, directives) + brace_only_conditionals(data, directives)
    if not spans:
        return data
    blanked = bytearray(data)
    for start, end in spans:
        blanked[start:end] = b" " * (end - start)
    return bytes(blanked)


def _base_classes(spec: tree_sitter.Node) -> list[tree_sitter.Node]:
    clause = next((c for c in spec.children if c.type == "base_class_clause"), None)
    if clause is None:
        return []
    return [c for c in clause.named_children if c.type in ("qualified_identifier", "template_type")]


def _leaf_types(node: tree_sitter.Node) -> list[str]:
    types: list[str] = []
    stack = [node]
    while stack and len(types) < 256:
        current = stack.pop()
        if current.child_count:
            stack.extend(current.children)
        else:
            types.append(current.type)
    return types


def _plain_declarator(node: tree_sitter.Node) -> bool:
    """A variable (or array) declarator, not a pointer, reference or function pointer: ``const char* s`` is
    a host pointer variable NVRTC refuses and device code cannot use."""
    while node is not None and node.type in ("init_declarator", "array_declarator"):
        node = node.child_by_field_name("declarator")
    return node is not None and node.type in ("identifier", "field_identifier")


def _split_specifiers(fn: tree_sitter.Node, data: bytes) -> tree_sitter.Node | None:
    """The declaration that holds ``fn``'s specifiers when a macro split them off: tree-sitter reads
    ``MGPU_HOST_DEVICE value_type operator[](int i) {...}`` as a declaration ``MGPU_HOST_DEVICE value_type``
    missing its ``;`` and a definition without a type, and ``template <...> __global__ LB(256) void k()``
    as a template of a declaration ``__global__ LB(256)`` then a definition ``void k()``."""
    previous = fn.prev_sibling
    if previous is not None and previous.type == "template_declaration" and previous.named_child_count:
        previous = previous.named_children[-1]
    if (
        previous is not None
        and previous.type in ("declaration", "field_declaration")
        and previous.child_count
        and previous.children[-1].is_missing
        and not data[previous.end_byte : fn.start_byte].strip()
    ):
        return previous
    return None


def _item_start(node: tree_sitter.Node) -> int:
    """Where the namespace-scope item holding ``node`` starts (a template header included)."""
    parent = node.parent
    return (
        parent.start_byte if parent is not None and parent.type == "template_declaration" else node.start_byte
    )


def _base_name(node: tree_sitter.Node | None, data: bytes) -> str:
    """``ns::S<int>`` -> ``S``: the name a template is known by."""
    if node is None:
        return ""
    return node_text(data, node).split("<", 1)[0].replace(" ", "").rsplit("::", 1)[-1]


def _function_name(node: tree_sitter.Node, data: bytes) -> str:
    for declarator in node.children_by_field_name("declarator"):
        function = function_declarator(declarator) or (
            declarator if declarator.type == "function_declarator" else None
        )
        if function is not None:
            return _base_name(function.child_by_field_name("declarator"), data)
    return ""


def _instantiated_name(node: tree_sitter.Node, data: bytes) -> str:
    """The template an explicit instantiation names: ``template void f<float>(float*);`` -> ``f``,
    ``template struct ns::S<int>;`` -> ``S``."""
    for child in node.children:
        if child.type in _CLASS_TYPES:
            return _base_name(child.child_by_field_name("name"), data)
    return _function_name(node, data)
