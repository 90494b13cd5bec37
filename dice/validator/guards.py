"""Static honesty guards on KernelBench candidates: pure functions over the source text (no execution).

Each guard that fires gives a :class:`GuardHit` whose ``guard`` names it; the verdict's status is then
``rejected`` and its message quotes the hit (:data:`STATIC_GUARDS` lists them; the name resolution and
dataflow ones are in :mod:`dice.validator.guards_flow`). The dynamic guards (inputs mutated, outputs cached
or aliased, lazy tensors, patched timers, work on side streams, kernels never launched) run in the worker
(:mod:`dice.validator.runtime_guards`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from dice.validator.guards_flow import BUILD_CALLS, call_name, dotted_name, flow_guards
from dice.validator.reference import top_level_names

PATCHABLE_MODULES = frozenset(
    {"torch", "time", "numpy", "math", "builtins", "triton", "cupy", "timeit", "functools", "sys", "gc"}
)
THREAD_MODULES = frozenset({"threading", "concurrent", "multiprocessing", "asyncio", "_thread"})
# torch attributes that move work off the timed (current) stream.
SIDE_STREAM_ATTRS = frozenset({"Stream", "stream", "set_stream", "ExternalStream", "StreamContext"})
CUDA_SIDE_STREAM = re.compile(
    r"\b(cudaStreamCreate\w*|getStreamFromPool|cudaStreamBeginCapture|std::thread|pthread_create)\b"
)
CUDA_LAUNCH = re.compile(r"<<<|\bcudaLaunch(Cooperative)?Kernel(Ex)?\b|\bcuLaunchKernel\b")
FAKE_TENSOR_NAMES = frozenset(
    {
        "FakeTensor",
        "FakeTensorMode",
        "_make_subclass",
        "_make_wrapper_subclass",
        "__torch_function__",
        "__torch_dispatch__",
        "LazyTensor",
    }
)


# The names of the static guards :func:`static_guards` runs (the verdict names the set it ran).
STATIC_GUARDS = (
    "no_custom_kernel",
    "torch_fallback",
    "dynamic_code",
    "kernel_result_unused",
    "kernel_never_called",
    "side_thread",
    "side_stream",
    "monkey_patch",
    "validator_access",
    "fake_tensor",
)

# What reaches into the process a candidate runs in: the validator's own package, the module table, the
# garbage collector's object lists, stack frames. A KernelBench candidate has no use for any of it (none of
# the 932 kernels of the agreement data touches one); a candidate that does could rewrite the runner that
# reports its guards. Their computed forms (getattr, __import__, importlib) are dynamic_code's.
INTROSPECTION = {
    "sys": {"modules", "_getframe", "_current_frames"},
    "gc": {"get_objects", "get_referrers", "get_referents"},
    "inspect": {"currentframe", "stack", "getouterframes", "getinnerframes", "trace"},
}
FRAME_ATTRIBUTES = frozenset(
    {"tb_frame", "f_back", "f_locals", "f_globals", "gi_frame", "cr_frame", "ag_frame"}
)


@dataclass(frozen=True)
class GuardHit:
    guard: str
    message: str
    line: int | None = None  # 1-based line in the candidate

    @property
    def where(self) -> str:
        """`` (line N)``, or nothing when the line is unknown."""
        return f" (line {self.line})" if self.line else ""

    def describe(self) -> str:
        return f"{self.guard}: {self.message}{self.where}"


@dataclass
class ExtensionSource:
    """A ``load_inline`` call whose source strings could be resolved without running anything."""

    name: str | None
    cpp_sources: list[str]
    cuda_sources: list[str]
    functions: list[str]
    line: int
    resolved: bool  # False when a source was built at run time (f-string, function call ...)


@dataclass
class CandidateInfo:
    tree: ast.Module
    has_model_new: bool
    extensions: list[ExtensionSource] = field(default_factory=list)
    extension_vars: list[str] = field(default_factory=list)

    @property
    def cuda_text(self) -> str:
        return "\n".join(s for ext in self.extensions for s in ext.cuda_sources)


def analyze_candidate(src: str) -> CandidateInfo:
    """Parse a candidate (raises ``SyntaxError``) and resolve its ``load_inline`` sources statically."""
    tree = ast.parse(src)
    names = top_level_names(tree)
    consts = _string_constants(tree)
    info = CandidateInfo(tree=tree, has_model_new="ModelNew" in names)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and call_name(node.value) == "load_inline"
        ):
            info.extension_vars += [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.Call) and call_name(node) == "load_inline":
            info.extensions.append(_extension_from_call(node, consts))
    return info


def static_guards(src: str, info: CandidateInfo) -> list[GuardHit]:
    """Every static guard that fires on a parsed candidate, in a fixed order."""
    hits: list[GuardHit] = []
    tree = info.tree
    module_names = _imported_module_names(tree)

    builds = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and call_name(n) in BUILD_CALLS]
    if "__global__" not in src:
        hits.append(
            GuardHit("no_custom_kernel", "the candidate defines no __global__ CUDA kernel (pure PyTorch)")
        )
    elif not builds:
        hits.append(GuardHit("no_custom_kernel", "CUDA source is never compiled (no load_inline/load call)"))

    builders = _builder_functions(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Try, ast.TryStar)) and not all(
            _setup_statement(s, builders) for s in node.body
        ):
            hits.append(
                GuardHit("torch_fallback", "try/except around the computation (a fallback path)", node.lineno)
            )
            break
    hits += [GuardHit(*hit) for hit in flow_guards(tree, lambda s: _setup_statement(s, builders))]

    resolved_cuda = [ext for ext in info.extensions if ext.resolved]
    if resolved_cuda and info.cuda_text and not CUDA_LAUNCH.search(info.cuda_text):
        hits.append(
            GuardHit(
                "kernel_never_called", "__global__ kernels are defined but never launched (no <<<...>>>)"
            )
        )
    for var in info.extension_vars:
        uses = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Name) and n.id == var and isinstance(n.ctx, ast.Load)
        ]
        if not uses:
            hits.append(GuardHit("kernel_never_called", f"extension `{var}` is built but never called"))

    for node in ast.walk(tree):
        hit = _thread_or_stream(node, module_names)
        if hit:
            hits.append(hit)
            break
    match = CUDA_SIDE_STREAM.search(info.cuda_text or src)
    if match:
        hits.append(GuardHit("side_stream", f"CUDA code creates its own stream or thread ({match.group(0)})"))

    for node in ast.walk(tree):
        hit = _monkey_patch(node, module_names)
        if hit:
            hits.append(hit)
            break

    for node in ast.walk(tree):
        hit = _validator_access(node, module_names)
        if hit:
            hits.append(hit)
            break

    for node in ast.walk(tree):
        hit = _fake_tensor(node)
        if hit:
            hits.append(hit)
            break
    return hits


def _validator_access(node: ast.AST, modules: dict[str, str]) -> GuardHit | None:
    """An import of the validator's package, or a reach into the process (:data:`INTROSPECTION`, a frame
    attribute)."""
    line = getattr(node, "lineno", None)
    if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "dice" for a in node.names):
        return GuardHit("validator_access", "imports the validator's own package (dice)", line)
    if isinstance(node, ast.ImportFrom) and node.module:
        root = node.module.split(".")[0]
        if root == "dice":
            return GuardHit("validator_access", "imports the validator's own package (dice)", line)
        reached = [a.name for a in node.names if a.name in INTROSPECTION.get(root, ())]
        if reached:
            return GuardHit(
                "validator_access", f"imports {root}.{reached[0]} (reaches into the process)", line
            )
    if isinstance(node, ast.Attribute):
        if node.attr in FRAME_ATTRIBUTES:
            return GuardHit("validator_access", f"reads a stack frame (.{node.attr})", line)
        root = node.value.id if isinstance(node.value, ast.Name) else None
        module = modules.get(root) if root else None
        if module and node.attr in INTROSPECTION.get(module, ()):
            return GuardHit("validator_access", f"uses {module}.{node.attr} (reaches into the process)", line)
    return None


# ----------------------------------------------------------------------------------------------- helpers
def _builder_functions(tree: ast.Module) -> set[str]:
    """Names of the candidate's functions and methods that build an extension (``_load_cuda_kernel``)."""
    return {
        fn.name
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(isinstance(n, ast.Call) and call_name(n) in BUILD_CALLS for n in ast.walk(fn))
    }


def _setup_statement(stmt: ast.stmt, builders: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    """A statement of a ``try`` body that is set-up, not computation: an import, a definition, a build of
    the extension (``ext = load_inline(...)``, ``self.ext = load(...)``, ``self.k = self._load_kernel()``
    where that method builds), or a constant or name assigned beside it (``self.use_cuda = True``,
    ``cuda_source = "..."``).

    A try around the *build* alone is not a fallback path the guard has to refuse: in the validator the build
    either succeeds (and the except never runs) or fails and is swallowed, and then no custom kernel runs,
    which the dynamic ``kernel_never_called`` guard rejects. A ``try`` around the forward computation (or
    around a build together with anything else) stays a ``torch_fallback``.
    """
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass, ast.FunctionDef, ast.ClassDef)):
        return True
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr)):
        value = stmt.value
        if value is None or isinstance(value, (ast.Constant, ast.Name)):
            return not isinstance(stmt, ast.Expr)
        while isinstance(value, ast.Attribute):  # load_inline(...).forward
            value = value.value
        return isinstance(value, ast.Call) and (call_name(value) in BUILD_CALLS | builders)
    return False


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _imported_module_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> top-level module (``import torch.nn as nn``: nn -> torch; ``from torch import cuda``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = node.module.split(".")[0]
    return names


def _string_constants(tree: ast.Module) -> dict[str, ast.AST]:
    """Module-level ``NAME = <expr>`` assignments (the usual home of CUDA source strings)."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _resolve_strings(node: ast.AST | None, consts: dict[str, ast.AST], depth: int = 0) -> list[str] | None:
    """The string(s) an expression denotes without running it, or None when it is computed."""
    if node is None or depth > 20:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in consts:
        return _resolve_strings(consts[node.id], consts, depth + 1)
    if isinstance(node, (ast.List, ast.Tuple)):
        out: list[str] = []
        for elt in node.elts:
            part = _resolve_strings(elt, consts, depth + 1)
            if part is None:
                return None
            out += part
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = (
            _resolve_strings(node.left, consts, depth + 1),
            _resolve_strings(node.right, consts, depth + 1),
        )
        if left is None or right is None or len(left) != 1 or len(right) != 1:
            return None
        return [left[0] + right[0]]
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return ["".join(str(v.value) for v in node.values)]  # type: ignore[attr-defined]
    return None


def _extension_from_call(call: ast.Call, consts: dict[str, ast.AST]) -> ExtensionSource:
    args = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    positional = ["name", "cpp_sources", "cuda_sources"]
    for key, value in zip(positional, call.args[:3], strict=False):
        args.setdefault(key, value)
    name = _resolve_strings(args.get("name"), consts)
    cpp = _resolve_strings(args.get("cpp_sources"), consts)
    cuda = _resolve_strings(args.get("cuda_sources"), consts) if "cuda_sources" in args else []
    functions = _resolve_strings(args.get("functions"), consts) if "functions" in args else []
    return ExtensionSource(
        name=name[0] if name else None,
        cpp_sources=cpp or [],
        cuda_sources=cuda or [],
        functions=functions or [],
        line=call.lineno,
        resolved=cpp is not None and cuda is not None,
    )


def _thread_or_stream(node: ast.AST, modules: dict[str, str]) -> GuardHit | None:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for mod in mods:
            if mod.split(".")[0] in THREAD_MODULES:
                return GuardHit(
                    "side_thread",
                    f"imports {mod}: results must be computed on the calling thread",
                    node.lineno,
                )
    if isinstance(node, ast.Attribute) and node.attr in SIDE_STREAM_ATTRS:
        dotted = dotted_name(node)
        if "cuda" in dotted.split(".") and modules.get(dotted.split(".")[0]) == "torch":
            return GuardHit(
                "side_stream", f"uses {dotted}: work must run on the current CUDA stream", node.lineno
            )
    return None


def _monkey_patch(node: ast.AST, modules: dict[str, str]) -> GuardHit | None:
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.Call) and call_name(node) in ("setattr", "delattr") and node.args:
        root = _root_name(node.args[0])
        if root and modules.get(root) in PATCHABLE_MODULES:
            return GuardHit(
                "monkey_patch", f"{call_name(node)}() on {dotted_name(node.args[0]) or root}", node.lineno
            )
    for target in targets:
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            root = _root_name(target)
            if root and modules.get(root) in PATCHABLE_MODULES:
                what = dotted_name(target) or root
                return GuardHit("monkey_patch", f"assigns to {what} (patches a library)", node.lineno)
    return None


def _fake_tensor(node: ast.AST) -> GuardHit | None:
    if isinstance(node, ast.ClassDef):
        for base in node.bases:
            if dotted_name(base).endswith("Tensor"):
                what = f"class {node.name} subclasses {dotted_name(base)}"
                return GuardHit("fake_tensor", what, node.lineno)
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        names = [a.name for a in node.names]
        if "_subclasses" in module or "fake_tensor" in module or any(n in FAKE_TENSOR_NAMES for n in names):
            return GuardHit(
                "fake_tensor",
                f"imports {', '.join(names)} from {module}: outputs must be real tensors",
                node.lineno,
            )
    name = None
    if isinstance(node, ast.Attribute):
        name = node.attr
    elif isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.FunctionDef):
        name = node.name
    if name in FAKE_TENSOR_NAMES:
        return GuardHit(
            "fake_tensor",
            f"uses {name}: outputs must be real, materialised tensors",
            getattr(node, "lineno", None),
        )
    return None
