"""The text of a combined extension: many ``load_inline`` calls in one CUDA TU and few binding TUs.

Pure text, no compiler: :mod:`dice.validator.batchbuild` builds what :func:`compose` writes. Call ``i`` of a
batch goes into ``namespace dice_b<i>`` of each TU (its ``#line`` file is ``dice_b<i>/main.cpp`` or
``dice_b<i>/cuda.cu``, so every compiler message names its call), the macros it ``#define``s or
``#undef``s are ``#undef``'d after its section and given back their state from before it (``#pragma
push_macro`` / ``pop_macro``: a header's macro it redefined is the header's again), its ``#include``
lines are hoisted above all sections (blank lines keep its line numbers), and its functions are bound in a
pybind11 submodule ``b<i>`` under their own names. Calls whose ``extra_cflags`` differ share the CUDA TU
but each flag set gets its own binding TU (compiled with those flags, linked into the same ``.so``).

A call is batched only when that gives the extension its own build would give (:func:`prepare` says why
not, and it then builds alone):

* the same build flags but ``extra_cflags`` (as torch uses them: see ``batchbuild._normalized``);
* its ``#include`` lines are unconditional and come before any ``#define`` (hoisting moves them), and only
  calls with the same include lines, headers the first lines of load_inline already include left out, share
  a batch (same headers, same macros around every section);
* it binds through ``functions=``, or else through one ``PYBIND11_MODULE(TORCH_EXTENSION_NAME or its name,
  m)`` of its own, which becomes its bind function ``void dice_bind_(pybind11::module_ m)``; no
  ``TORCH_LIBRARY``, no other use of ``TORCH_EXTENSION_NAME``, no ``extern "C"`` (a C name ignores
  namespaces), no raw string literal (a ``#`` line inside one is text), no free operator; it parses cleanly;
* a name it declares at namespace scope must not also be declared at global scope by the headers: inside
  ``dice_b<i>`` it would hide the global one instead of clashing or overloading. Names C and CUDA declare
  are refused here; for the rest each TU starts with a probe ``namespace <name> {}`` per name, which fails
  to compile (blamed on that call, under ``dice_b<i>/probe``) exactly when the headers declare it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from dice.validator.buildtext import needs_umbrella
from dice.validator.paths import source_hash


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(\w+)(.*)$")
_WORD = re.compile(r"\s*(\w+)")
_OWN_BINDINGS = re.compile(r"\bPYBIND11_MODULE\b|\bTORCH_LIBRARY\w*|\bTORCH_EXTENSION_NAME\b")
_MODULE_MACRO = re.compile(r"\bPYBIND11_MODULE\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")
_EXTERN_C = re.compile(r'\bextern\s*"C')
_RAW = re.compile(r'(?:\bu8|\bu|\bU|\bL|\b)R"')
_SHARED_NAMESPACES = _words(
    "std at c10 torch caffe2 cub thrust cuda nvcuda cooperative_groups pybind11 py cutlass cute "
    "detail __gnu_cxx __cxxabiv1 half_float"
)
_C_MATH = sorted(
    _words(
        "abs fabs exp exp2 exp10 expm1 log log2 log10 log1p logb ilogb sqrt rsqrt cbrt rcbrt pow sin cos "
        "tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc erfinv erfcinv erfcx lgamma "
        "tgamma floor ceil round rint lrint llrint lround llround trunc nearbyint fmod remainder remquo "
        "modf frexp ldexp scalbn scalbln nextafter copysign fdim fma fmax fmin hypot rhypot norm rnorm "
        "norm3d rnorm3d norm4d rnorm4d sincos sincospi sinpi cospi nan isnan isinf isfinite signbit "
        "normcdf normcdfinv j0 j1 jn y0 y1 yn cyl_bessel_i0 cyl_bessel_i1 saturate min max umin umax "
        "llmin llmax ullmin ullmax mul24 umul24 mulhi umulhi mul64hi umul64hi clz clzll ffs ffsll popc "
        "popcll brev brevll byte_perm sad usad div ldiv labs llabs rand srand malloc free calloc realloc "
        "memcpy memset memcmp strlen printf fprintf sprintf assert exit abort qsort bsearch atoi atof "
        "clock time fminf fmaxf"
    )
)
_C_NAMES = frozenset(_C_MATH + [n + "f" for n in _C_MATH] + [n + "l" for n in _C_MATH] + ["dim3", "size_t"])
_C_PREFIX = re.compile(
    r"^(?:_|cuda[A-Z]|cu[A-Z]|nv[A-Z]|atomic|make_(?:u?(?:char|short|int|long|longlong|float|double)\d|"
    r"half|bfloat|nv)|tex\d|surf\d|warpSize$|Py[A-Z]|float\d|double\d|u?(?:char|short|int|long|longlong)\d)"
)
# Headers the first lines load_inline writes already include (checked with ``g++ -M`` / ``nvcc -M`` on
# torch 2.13): another ``#include`` of one changes nothing, so calls that differ only in these share a batch.
# <cassert> / <assert.h> are not here: they are read again at every include.
_STD_SEEN = _words(
    "vector string memory algorithm cmath cstdint cstddef limits type_traits utility tuple functional "
    "optional array unordered_map map iostream sstream stdexcept atomic mutex initializer_list iterator "
    "numeric cstring cstdlib cstdio climits ostream complex chrono thread variant string_view set list "
    "deque unordered_set math.h stdint.h stdio.h stdlib.h string.h torch/types.h ATen/ATen.h"
)
_CPP_PRELUDE = _STD_SEEN | {"torch/extension.h"}
_CUDA_PRELUDE = _STD_SEEN | _words(
    "cuda.h cuda_runtime.h cuda_runtime_api.h cuda_fp16.h cuda_bf16.h cuda_fp8.h vector_types.h "
    "device_launch_parameters.h"
)
_UMBRELLAS = _words("torch/extension.h torch/torch.h torch/all.h")
_INCLUDE = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')
_TAG_PLAIN = re.compile(r"\bdice_b(\d+)(?![\w])")
_TAG_MANGLED = re.compile(r"([789])dice_b(\d+)")
_ERROR = re.compile(r"\berror\b|undefined reference|multiple definition|undefined symbol", re.I)
_SUMMARY = re.compile(r"errors? detected in the compilation|^Error building extension|ld returned \d+ exit")


@dataclass
class Unit:
    """One ``load_inline`` call to batch: its key, the texts its own build compiles, its bindings."""

    key: str
    name: str
    cpp: str
    cuda: str | None
    functions: dict[str, str] | None  # None: its own PYBIND11_MODULE binds them
    error_handling: bool = True
    flags: str = "{}"  # the build flags but extra_cflags, as JSON: only calls with the same share a batch
    cflags: str = "[]"  # its extra_cflags, as JSON: calls that differ here get their own binding TU


@dataclass
class TU:
    """One TU of a call, ready to combine: its text with ``#include`` lines blanked, the includes, the
    macros it defines, and the names it declares at namespace scope."""

    body: str
    includes: tuple[str, ...]
    macros: tuple[str, ...]
    names: tuple[str, ...]
    binds: bool = False  # its PYBIND11_MODULE became ``void dice_bind_(pybind11::module_ m)``


@dataclass
class Prepared:
    unit: Unit
    cpp: TU
    cuda: TU | None
    group: str = field(default="")


def prepare(unit: Unit) -> Prepared | str:
    """The call ready to batch, or why it must build alone."""
    if unit.functions is not None and not unit.functions:
        return "an empty functions= list"
    module = None if unit.functions is not None else unit.name
    cpp = scan_tu(unit.cpp, module)
    if isinstance(cpp, str):
        return f"cpp_sources: {cpp}"
    cuda = None
    if unit.cuda is not None:
        cuda = scan_tu(unit.cuda, module)
        if isinstance(cuda, str):
            return f"cuda_sources: {cuda}"
    if unit.functions is None and cpp.binds + bool(cuda and cuda.binds) != 1:
        return "no functions= list and no PYBIND11_MODULE of its own"
    for fn in unit.functions or {}:
        if not re.fullmatch(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*", fn):
            return f"function name {fn!r} is not a C++ name"
    full = unit.cuda is not None and needs_umbrella(unit.cuda)
    cuda_key = (
        None
        if cuda is None
        else _own_includes(cuda.includes, _CUDA_PRELUDE | (set() if full else _UMBRELLAS))
    )
    group = source_hash(unit.flags, json.dumps([_own_includes(cpp.includes, _CPP_PRELUDE), cuda_key, full]))
    return Prepared(unit, cpp, cuda, group)


def _own_includes(includes: tuple[str, ...], seen: set[str] | frozenset[str]) -> list[str]:
    """The include lines that may change what the TU sees (those of the prelude left out), sorted."""
    own = []
    for line in includes:
        m = _INCLUDE.match(line)
        if m is None or m.group(1) not in seen:
            own.append(re.sub(r"\s+", " ", line))
    return sorted(set(own))


def scan_tu(text: str, module: str | None = None) -> TU | str:
    """``text`` ready to combine, or why it cannot be (see the module's rules). With ``module`` (the call's
    name; it has no ``functions=``), one ``PYBIND11_MODULE(TORCH_EXTENSION_NAME or that name, m)`` becomes
    its bind function."""
    binds = False
    if module is not None and len(_MODULE_MACRO.findall(text)) == 1:
        m = _MODULE_MACRO.search(text)
        assert m is not None
        if m.group(1) in ("TORCH_EXTENSION_NAME", module) and text.count("TORCH_EXTENSION_NAME") <= 1:
            text = f"{text[: m.start()]}void dice_bind_(pybind11::module_ {m.group(2)}){text[m.end() :]}"
            binds = True
    if _OWN_BINDINGS.search(text):
        return "defines its own module or op registration"
    masked = mask_literals(text)
    if masked is None:
        return "has a raw string literal"
    if _EXTERN_C.search(text):
        return 'has extern "C" (C names ignore namespaces)'
    lines = text.split("\n")
    body, includes, macros = list(lines), [], []
    depth, i = 0, 0
    mlines = masked.split("\n")
    while i < len(mlines):
        start = i
        while mlines[i].endswith("\\") and i + 1 < len(mlines):
            i += 1
        m = _DIRECTIVE.match(mlines[start])
        i += 1
        if m is None:
            continue
        word, rest = m.group(1), m.group(2)
        name = _WORD.match(rest)
        if word in ("if", "ifdef", "ifndef"):
            depth += 1
        elif word == "endif":
            depth -= 1
        elif word in ("include", "include_next", "import"):
            if word != "include" or depth:
                return "an #include inside #if/#ifdef" if depth else f"#{word}"
            if macros:
                return "a #define before an #include (hoisting would move the include above it)"
            includes.append(lines[start].strip())
            body[start] = ""
        elif word in ("define", "undef") and name:
            macros.append(name.group(1))
    names = namespace_scope_names(text)
    if isinstance(names, str):
        return names
    clash = sorted(n for n in names if n in _C_NAMES or n in _SHARED_NAMESPACES or _C_PREFIX.match(n))
    if clash:
        return f"declares {', '.join(clash[:3])} at namespace scope, as C/CUDA/torch headers may"
    names.discard("dice_bind_")
    return TU(
        "\n".join(body),
        tuple(dict.fromkeys(includes)),
        tuple(dict.fromkeys(macros)),
        tuple(sorted(names)),
        binds,
    )


def mask_literals(text: str) -> str | None:
    """``text`` with comments and the insides of string and character literals blanked (line breaks kept),
    so that directives and words can be found by pattern; None if it holds a raw string literal."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            if c == '"' and _RAW.search(text, max(0, i - 3), i + 1):
                return None
            j = i + 1
            while j < n and text[j] not in (c, "\n"):
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1 : j - 1]) + (text[j - 1] if j - i > 1 else ""))
            i = j
            continue
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def namespace_scope_names(text: str) -> set[str] | str:
    """Names ``text`` declares at namespace scope (functions, variables, types, enumerators of plain enums,
    namespaces, aliases; through anonymous namespaces, templates and ``#if`` blocks), or a reason."""
    from dice.cuda_source import parse_bytes

    root = parse_bytes(text.encode("utf-8")).root_node
    if root.has_error:
        return "does not parse cleanly"
    names: set[str] = set()
    problems: list[str] = []
    _collect(root, names, problems)
    return problems[0] if problems else names


_CONTAINERS = _words(
    "translation_unit template_declaration preproc_if preproc_ifdef preproc_else preproc_elif "
    "preproc_elifdef linkage_specification declaration_list"
)
_TYPES = ("struct_specifier", "class_specifier", "union_specifier", "enum_specifier")


def _collect(node: object, names: set[str], problems: list[str]) -> None:
    for child in node.children:  # type: ignore[attr-defined]
        kind = child.type
        if kind in _CONTAINERS:
            _collect(child, names, problems)
        elif kind == "namespace_definition":
            name = child.child_by_field_name("name")
            if name is None:  # anonymous: its names are found from the enclosing scope
                body = child.child_by_field_name("body")
                if body is not None:
                    _collect(body, names, problems)
            else:
                names.add(name.text.decode())
        elif kind == "namespace_alias_definition":
            name = child.child_by_field_name("name")
            if name is not None:
                names.add(name.text.decode())
        elif kind in ("function_definition", "declaration", "type_definition", "alias_declaration", *_TYPES):
            _declared(child, names, problems)


def _declared(node: object, names: set[str], problems: list[str]) -> None:
    """Names one declaration introduces at namespace scope."""
    n = node  # type: Any
    if n.type == "alias_declaration":
        name = n.child_by_field_name("name")
        if name is not None:
            names.add(name.text.decode())
        return
    spec = n if n.type in _TYPES else n.child_by_field_name("type")
    if spec is not None and spec.type in _TYPES:
        name = spec.child_by_field_name("name")
        if name is not None and name.type != "qualified_type_identifier":
            names.add(name.text.decode())
        body = spec.child_by_field_name("body")
        if spec.type == "enum_specifier" and body is not None and b"class" not in spec.text.split(b"{")[0]:
            for item in body.children:
                if item.type == "enumerator" and item.child_by_field_name("name") is not None:
                    names.add(item.child_by_field_name("name").text.decode())
    for decl in n.children_by_field_name("declarator"):
        while decl.child_by_field_name("declarator") is not None:
            decl = decl.child_by_field_name("declarator")
        if decl.type == "operator_name":
            problems.append("defines a free operator (found by ADL in the global namespace only)")
        elif decl.type in ("identifier", "type_identifier"):
            names.add(decl.text.decode())
        elif decl.type == "template_function":
            name = decl.child_by_field_name("name")
            if name is not None:
                names.add(name.text.decode())


# --------------------------------------------------------------------------------------------- composing
def compose(items: list[Prepared], parts: list[int] | None = None) -> tuple[list[str], str | None]:
    """(binding TUs, CUDA TU or None) of a batch; ``load_inline`` puts its own first lines above each.
    ``parts[i]``: the binding TU of call ``i`` (calls whose ``extra_cflags`` differ need their own, the CUDA
    TU is shared); TU 0 holds the module, which calls every call's bind function."""
    parts = parts or [0] * len(items)
    mains = []
    for k in range(max(parts) + 1):
        mine = [(i, p.cpp) for i, p in enumerate(items) if parts[i] == k]
        main = _combined(mine, "main.cpp", {i: _bindings(items[i].unit) for i, _ in mine})
        if k == 0:
            main += "".join(
                f"namespace dice_b{i} {{ void dice_bind_(pybind11::module_ m); }}\n"
                for i in range(len(items))
                if parts[i] != 0
            )
            main += "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
            for i in range(len(items)):
                main += f'#line 1 "dice_b{i}/module.cpp"\ndice_b{i}::dice_bind_(m.def_submodule("b{i}"));\n'
            main += "}\n"
        mains.append(main)
    if all(p.cuda is None for p in items):
        return mains, None
    empty = TU("", (), (), ())
    return mains, _combined([(i, p.cuda or empty) for i, p in enumerate(items)], "cuda.cu", None)


def _combined(tus: list[tuple[int, TU]], filename: str, bindings: dict[int, list[str]] | None) -> str:
    lines: list[str] = list(dict.fromkeys(inc for _, tu in tus for inc in tu.includes))
    for i, tu in tus:
        if tu.names:
            lines.append(f'#line 1 "dice_b{i}/probe"')
            lines += [f"namespace {name} {{}}" for name in tu.names]
    for i, tu in tus:
        lines += [f'#pragma push_macro("{m}")' for m in tu.macros]
        lines += [f"namespace dice_b{i} {{", f'#line 1 "dice_b{i}/{filename}"', tu.body]
        if bindings is not None:
            lines += [f'#line 1 "dice_b{i}/bindings.cpp"', *bindings[i]]
        lines.append("}")
        lines += [line for m in tu.macros for line in (f"#undef {m}", f'#pragma pop_macro("{m}")')]
    return "\n".join(lines) + "\n"


def _bindings(unit: Unit) -> list[str]:
    """The call's ``m.def`` lines as torch writes them, in its own namespace after its own text (so its names
    resolve as in its own TU), in a function the module calls with the call's submodule; a call with its
    own ``PYBIND11_MODULE`` (now that function, in either TU) gets its declaration."""
    if unit.functions is None:
        return ["void dice_bind_(pybind11::module_ m);"]
    lines = ["void dice_bind_(pybind11::module_ m) {"]
    for fn, doc in unit.functions.items():
        bound = f"torch::wrap_pybind_function({fn})" if unit.error_handling else fn
        lines.append(f'm.def("{fn}", {bound}, "{doc}");')
    return [*lines, "}"]


def attribute(output: str, count: int) -> set[int] | None:
    """The calls a failed combined build's messages blame (``dice_b<i>`` in a message, its context lines, or
    a mangled symbol), or None when one error names none of them (then the batch is split in halves)."""
    lines = output.splitlines()
    blamed: set[int] = set()
    for k, line in enumerate(lines):
        if not _ERROR.search(line) or _SUMMARY.search(line.strip()):
            continue
        tags = _tags(line)
        if not tags:  # gcc puts "In file included from" / "required from" before, EDG "detected during" after
            for near in lines[max(0, k - 12) : k + 8]:
                tags |= _tags(near)
        if not tags:
            return None
        blamed |= tags
    blamed = {t for t in blamed if t < count}
    return blamed or None


def _tags(line: str) -> set[int]:
    tags = {int(m.group(1)) for m in _TAG_PLAIN.finditer(line)}
    for m in _TAG_MANGLED.finditer(line):  # _ZN7dice_b312relu_kernel...: the length says where i ends
        width = int(m.group(1)) - len("dice_b")
        if width <= len(m.group(2)):
            tags.add(int(m.group(2)[:width]))
    return tags
