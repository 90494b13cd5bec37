"""Static guards on how a candidate reaches PyTorch: names resolved at run time, hidden torch calls, swallowed
exceptions, and a ``forward`` whose result never passes through the candidate's kernel.

A small flow-insensitive dataflow over the module: every expression gets a set of *flags* saying what its
value may be or come from (``TORCH_OBJ`` a torch module/function/class, ``TORCH`` computed by one, ``EXT`` a
compiled extension, ``KERNEL`` returned or written by one, ``CAND`` an instance of a candidate class,
``UNKNOWN`` something the analysis cannot see through, ``fn:``/``meth:``/``cls:`` a candidate definition).
Names are bound through imports, assignments (module, class body, ``self.x = ...``), ``getattr`` with a
constant name and ``torch.ops``. Unknown values count as possibly the kernel, so the check only fires when
the returned value is seen to come from torch alone.

Pure functions over the parsed tree; :mod:`dice.validator.guards` turns the hits into ``GuardHit``.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable

KERNEL, EXT, TORCH, TORCH_OBJ, CAND, UNKNOWN = "kernel", "ext", "torch", "torch_obj", "cand", "unknown"
OPS = "torch_ops"  # the torch.ops namespace object
_BUILTINS = frozenset(dir(builtins))
TORCH_ROOTS = frozenset({"torch", "functorch", "torchvision", "torchaudio"})
BUILD_CALLS = frozenset(
    {"load_inline", "load", "RawKernel", "RawModule", "ElementwiseKernel", "compile_kernel"}
)
# builtins that run code or look names up from a string.
DYNAMIC_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "globals", "vars", "__builtins__"})
DYNAMIC_MODULES = frozenset({"importlib", "builtins", "runpy", "marshal", "pickle", "code", "codeop"})
DYNAMIC_ATTRS = frozenset({"attrgetter", "methodcaller", "modules", "__dict__", "__getattribute__"})
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

Hit = tuple[str, str, int | None]  # guard, message, line


def flow_guards(tree: ast.Module, is_setup: Callable[[ast.stmt], bool]) -> list[Hit]:
    """The hits of the ``dynamic_code``, ``torch_fallback`` and ``kernel_result_unused`` guards, in order."""
    flow = ModuleFlow(tree)
    found = _dynamic_code(tree, flow) + flow.hits + _suppressed(tree, flow, is_setup) + _result_unused(flow)
    hits: list[Hit] = []
    for guard in ("dynamic_code", "torch_fallback", "kernel_result_unused"):  # the first hit of each
        hits += [h for h in found if h[0] == guard][:1]
    return hits


# ------------------------------------------------------------------------------------------ the dataflow
class ModuleFlow:
    """Flags of the module's names, class attributes and functions' locals (computed on demand)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.hits: list[Hit] = []
        self.imports: dict[str, str] = {}  # local name -> dotted module or object it is bound to
        self.funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.env: dict[str, set[str]] = {}
        self.attrs: dict[str, dict[str, set[str]]] = {}
        self.ext_names: set[str] = set()
        self._summaries: dict[tuple[str | None, str], set[str]] = {}
        self._seen_hits: set[tuple[str, int | None]] = set()
        self._collect()
        for _ in range(3):  # until the bindings stop growing (three passes reach every chain seen so far)
            before = self._size()
            self._module_pass()
            for cls in self.classes.values():
                for fn in _methods(cls).values():
                    FnFlow(self, fn, cls.name).run()
            for fn in self.funcs.values():
                FnFlow(self, fn, None).run()
            if self._size() == before:
                break

    def _size(self) -> int:
        return sum(map(len, self.env.values())) + sum(len(v) for a in self.attrs.values() for v in a.values())

    def _collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    self.imports[local] = alias.name if alias.asname else alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Call) and call_name(node) == "load_inline":
                for kw in node.keywords:
                    if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                        self.ext_names.add(str(kw.value.value))
                if node.args and isinstance(node.args[0], ast.Constant):
                    self.ext_names.add(str(node.args[0].value))
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.funcs[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
                self.attrs.setdefault(node.name, {})

    def _module_pass(self) -> None:
        flow = FnFlow(self, None, None)
        for stmt in self.tree.body:
            if not isinstance(stmt, _DEFS):
                flow.statement_walk(stmt)
        for cls in self.classes.values():
            body_flow = FnFlow(self, None, cls.name)
            for stmt in cls.body:
                if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    for target in targets:
                        if isinstance(target, ast.Name):
                            bucket = self.attrs[cls.name].setdefault(target.id, set())
                            bucket |= body_flow.flags(stmt.value)

    def name_flags(self, name: str) -> set[str]:
        """Flags of a module-level name (a binding, a definition or an import), or none for a builtin."""
        out = set(self.env.get(name, ()))
        if name in self.funcs:
            out.add(f"fn:{name}")
        if name in self.classes:
            out.add(f"cls:{name}")
        target = self.imports.get(name)
        if target is not None:
            if target.split(".")[-1] in BUILD_CALLS:
                out.add(f"build:{name}")
            else:
                out.add(TORCH_OBJ if target.split(".")[0] in TORCH_ROOTS else UNKNOWN)
        if not out and name not in self.env and name not in _BUILTINS:
            out.add(UNKNOWN)
        return out

    def attr_flags(self, cls: str | None, attr: str) -> set[str]:
        """Flags of ``self.<attr>`` inside class ``cls`` (its bases in the candidate included)."""
        for name in self.mro(cls):
            if attr in self.attrs.get(name, {}):
                return self.attrs[name][attr]
            if attr in _methods(self.classes[name]):
                return {f"meth:{name}.{attr}"}
        return {UNKNOWN}

    def mro(self, cls: str | None) -> list[str]:
        out: list[str] = []
        todo = [cls] if cls else []
        while todo:
            name = todo.pop(0)
            if name in self.classes and name not in out:
                out.append(name)
                todo += [b.id for b in self.classes[name].bases if isinstance(b, ast.Name)]
        return out

    def store_attr(self, cls: str | None, attr: str, flags: set[str]) -> None:
        if cls in self.attrs:
            self.attrs[cls].setdefault(attr, set()).update(flags)

    def summary(self, cls: str | None, name: str) -> set[str]:
        """Flags of what a candidate function or method returns (its arguments count as plain values)."""
        key = (cls, name)
        if key in self._summaries:
            return self._summaries[key]
        self._summaries[key] = {UNKNOWN}  # recursion
        fn = _methods(self.classes[cls]).get(name) if cls in self.classes else self.funcs.get(name)
        out = {UNKNOWN}
        if fn is not None:
            flow = FnFlow(self, fn, cls)
            flow.run()
            out = set().union(*(flow.flags(r.value) for r in flow.returns if r.value is not None))
        self._summaries[key] = out
        return out

    def hit(self, guard: str, message: str, line: int | None) -> None:
        if (message, line) not in self._seen_hits:
            self._seen_hits.add((message, line))
            self.hits.append((guard, message, line))


class FnFlow:
    """The locals of one function (or the module body when ``fn`` is None), flow-insensitively."""

    def __init__(self, mod: ModuleFlow, fn: ast.FunctionDef | ast.AsyncFunctionDef | None, cls: str | None):
        self.mod, self.fn, self.cls = mod, fn, cls
        self.env: dict[str, set[str]] = {}
        self.returns: list[ast.Return] = []
        self.globals: set[str] = set()
        self.self_name = fn.args.args[0].arg if fn is not None and cls and fn.args.args else None

    def run(self) -> None:
        assert self.fn is not None  # module-level flows are never run
        args = self.fn.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        for param in params:
            if param is not None and param.arg != self.self_name:
                self.env[param.arg] = set()
        for param, default in zip(reversed(args.args), reversed(args.defaults), strict=False):
            self.env[param.arg] = self.flags(default)
        for node in _walk_local(self.fn):
            if isinstance(node, ast.Global):
                self.globals.update(node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node is not self.fn:
                self.env.setdefault(node.id, set())
        for _ in range(4):
            before = sum(map(len, self.env.values()))
            self.returns = []
            for stmt in self.fn.body:
                self.statement_walk(stmt)
            if sum(map(len, self.env.values())) == before:
                break

    def statement_walk(self, stmt: ast.stmt) -> None:
        for node in _walk_local(stmt):
            if isinstance(node, (ast.Return, ast.Expr, ast.If, ast.While, ast.Assert)):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.expr):
                        self.flags(child)  # (the hits of what they evaluate)
            if isinstance(node, ast.Global):
                self.globals.update(node.names)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    self.bind(target, self.flags(node.value))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
                extra = self.flags(node.target) if isinstance(node, ast.AugAssign) else set()
                self.bind(node.target, self.flags(node.value) | extra)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self.bind(node.target, self.flags(node.iter))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                self.bind(node.optional_vars, self.flags(node.context_expr))
            elif isinstance(node, ast.Return):
                self.returns.append(node)
            elif isinstance(node, ast.Call):
                self._effects(node, isinstance(getattr(node, "_dice_parent", None), ast.Expr))

    def _effects(self, call: ast.Call, discarded: bool) -> None:
        """What a call may write: a method's receiver takes its arguments' flags; a call whose result is
        dropped (``ext.relu_into(x, out)``, ``out.copy_(y)``) may write into every argument."""
        args = [*call.args, *(kw.value for kw in call.keywords)]
        if isinstance(call.func, ast.Attribute):  # outs.append(y), out.copy_(y)
            self.bind(call.func.value, set().union(*(_data(self.flags(a)) for a in args)))
        if discarded:
            result = self.flags(call)
            written = _data(result) | ({UNKNOWN} if _callable_flags(self.flags(call.func)) else set())
            for arg in args:  # out, (out.data_ptr(), n), [self.buf] ...
                for node in ast.walk(arg):
                    if isinstance(node, ast.Name) or (
                        isinstance(node, ast.Attribute) and dotted_name(node.value) == self.self_name
                    ):
                        self.bind(node, written)

    def bind(self, target: ast.AST, flags: set[str]) -> None:
        if isinstance(target, ast.Name):
            if self.fn is not None and target.id in self.env and target.id not in self.globals:
                self.env[target.id].update(flags)
            elif self.fn is None or target.id in self.globals or target.id in self.mod.env:
                self.mod.env.setdefault(target.id, set()).update(flags)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.bind(elt, flags)
        elif isinstance(target, (ast.Starred, ast.Subscript)):
            self.bind(target.value, flags)
        elif isinstance(target, ast.Attribute):
            if isinstance(target.value, ast.Name) and target.value.id == self.self_name:
                self.mod.store_attr(self.cls, target.attr, flags)
            else:
                self.bind(target.value, _data(flags))

    def flags(self, node: ast.AST | None) -> set[str]:
        """What the value of an expression may be or come from."""
        if node is None or isinstance(node, ast.Constant):
            return set()
        if isinstance(node, ast.Name):
            if node.id in self.env and node.id not in self.globals:
                return self.env[node.id]
            return self.mod.name_flags(node.id)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Subscript):
            base = self.flags(node.value)
            if TORCH_OBJ in base and not isinstance(node.slice, ast.Constant):
                self.mod.hit("dynamic_code", "torch looked up by a computed key", node.lineno)
            return _attr_of(base) | _data(self.flags(node.slice))
        if isinstance(node, (ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom)):
            return {UNKNOWN}
        out: set[str] = set()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.comprehension):
                out |= _data(self.flags(child.iter))
            elif isinstance(child, ast.expr):
                out |= self.flags(child)
        return out

    def _attribute(self, node: ast.Attribute) -> set[str]:
        if isinstance(node.value, ast.Name) and node.value.id == self.self_name and self.cls:
            return self.mod.attr_flags(self.cls, node.attr)
        base = self.flags(node.value)
        if OPS in base:
            if node.attr in self.mod.ext_names:
                return {EXT}
            self.mod.hit("torch_fallback", f"calls PyTorch through torch.ops.{node.attr}", node.lineno)
            return {TORCH_OBJ}
        if TORCH_OBJ in base and node.attr == "ops":
            return {TORCH_OBJ, OPS}
        return _attr_of(base)

    def _call(self, node: ast.Call) -> set[str]:
        func = node.func
        if call_name(node) in BUILD_CALLS or any(f.startswith("build:") for f in self.flags(func)):
            return {EXT}
        args = set().union(*(_data(self.flags(a)) for a in [*node.args, *(k.value for k in node.keywords)]))
        if isinstance(func, ast.Name) and func.id == "getattr" and "getattr" not in self.mod.env:
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                attr = ast.Attribute(value=node.args[0], attr=str(node.args[1].value), ctx=ast.Load())
                return self._attribute(ast.copy_location(attr, node))
            base = self.flags(node.args[0]) if node.args else set()
            if TORCH_OBJ in base:
                self.mod.hit("dynamic_code", "getattr() on torch with a computed name", node.lineno)
            return _attr_of(base) | {UNKNOWN}
        callee = self.flags(func)
        out = args | {f for f in callee if ":" not in f and f != TORCH_OBJ}
        if EXT in callee:
            out.add(KERNEL)
        if TORCH_OBJ in callee:
            out |= {TORCH, TORCH_OBJ}
        if CAND in callee:
            out.add(UNKNOWN)
        for flag in _callable_flags(callee):
            kind, _, name = flag.partition(":")
            if kind == "cls":
                out.add(CAND)
            elif kind == "fn":
                out |= _data(self.mod.summary(None, name))
            else:
                cls, _, meth = name.partition(".")
                out |= _data(self.mod.summary(cls, meth)) if meth != "forward" else {UNKNOWN}
        if not callee and isinstance(func, ast.Attribute):
            out.add(TORCH)  # a method of a tensor (or of a plain value)
        return out


# ---------------------------------------------------------------------------------------------- the guards
def _dynamic_code(tree: ast.Module, flow: ModuleFlow) -> list[Hit]:
    hits: list[Hit] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", None)
        if isinstance(node, ast.Name) and node.id in DYNAMIC_BUILTINS and isinstance(node.ctx, ast.Load):
            if node.id not in flow.env and node.id not in flow.imports and node.id not in flow.funcs:
                hits.append(
                    ("dynamic_code", f"uses {node.id}: names must resolve without running code", line)
                )
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = [] if isinstance(node, ast.Import) else [a.name for a in node.names]
            for mod in mods:
                if mod.split(".")[0] in DYNAMIC_MODULES or (mod == "operator" and set(names) & DYNAMIC_ATTRS):
                    hits.append(("dynamic_code", f"imports {mod}: loads code or names at run time", line))
        elif isinstance(node, ast.Attribute) and node.attr in DYNAMIC_ATTRS:
            module = flow.imports.get(dotted_name(node.value).split(".")[0], "").split(".")[0]
            if node.attr.startswith("__") or module == ("sys" if node.attr == "modules" else "operator"):
                hits.append(("dynamic_code", f"uses {dotted_name(node)}: a name looked up at run time", line))
    return hits


def _suppressed(tree: ast.Module, flow: ModuleFlow, is_setup: Callable[[ast.stmt], bool]) -> list[Hit]:
    """``with contextlib.suppress(...)`` (or a candidate context manager whose ``__exit__`` returns a value)
    around computation: the same fallback path as a ``try``/``except``."""
    swallowing = {
        name
        for name, cls in flow.classes.items()
        if any(
            isinstance(r, ast.Return) and r.value is not None and not _is_false(r.value)
            for r in ast.walk(_methods(cls).get("__exit__", ast.Pass()))
        )
    }
    allowed: set[int] = set()  # suppress(...) around set-up only (an import, a build)
    hits: list[Hit] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            setup = all(is_setup(s) for s in node.body)
            for item in node.items:
                expr = item.context_expr
                if setup:
                    allowed.add(id(expr))
                elif dotted_name(expr.func if isinstance(expr, ast.Call) else expr) in swallowing:
                    msg = "swallows exceptions around the computation (a fallback path)"
                    hits.append(("torch_fallback", f"`with {dotted_name(expr)}`: {msg}", node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) not in allowed:
            dotted = dotted_name(node.func)
            resolved = f"{flow.imports.get(dotted.split('.')[0], '')}.{dotted}".split(".")
            if "suppress" in resolved and "contextlib" in resolved:
                msg = f"{dotted}(...) swallows exceptions around the computation (a fallback path)"
                hits.append(("torch_fallback", msg, node.lineno))
    return sorted(hits, key=lambda h: h[2] or 0)


def _result_unused(flow: ModuleFlow) -> list[Hit]:
    """``ModelNew.forward`` returns a value that PyTorch computed and no kernel call fed (a kernel called for
    show, its result dropped, or the kernel run somewhere else)."""
    for cls in flow.mro("ModelNew"):
        fn = _methods(flow.classes[cls]).get("forward")
        if fn is None:
            continue
        forward = FnFlow(flow, fn, cls)
        forward.run()
        values = [r.value for r in forward.returns if r.value is not None]
        found = [forward.flags(v) for v in values]
        if values and all(TORCH in f and not f & {KERNEL, EXT, UNKNOWN, CAND} for f in found):
            return [
                (
                    "kernel_result_unused",
                    "forward returns a value computed by PyTorch alone: no call into the candidate's "
                    "kernel feeds it (a kernel result dropped, or the kernel run elsewhere)",
                    values[-1].lineno,
                )
            ]
        return []
    return []


# ----------------------------------------------------------------------------------------------- helpers
def _walk_local(node: ast.AST) -> list[ast.AST]:
    """The nodes of a statement, not descending into nested definitions."""
    out: list[ast.AST] = []
    todo = [node]
    while todo:
        cur = todo.pop()
        out.append(cur)
        if cur is not node and isinstance(cur, _DEFS):
            continue
        children = list(ast.iter_child_nodes(cur))
        for child in children:
            if isinstance(cur, ast.Expr) and child is cur.value:
                child._dice_parent = cur  # type: ignore[attr-defined]
        todo += reversed(children)
    return out


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _callable_flags(flags: set[str]) -> set[str]:
    return {f for f in flags if f.startswith(("fn:", "cls:", "meth:"))}


def _data(flags: set[str]) -> set[str]:
    """The flags a value keeps when it flows on (a candidate function passed along becomes unknown)."""
    out = {f for f in flags if ":" not in f}
    return out | {UNKNOWN} if len(out) != len(flags) else out


def _attr_of(flags: set[str]) -> set[str]:
    return _data(flags) | ({UNKNOWN} if CAND in flags else set())


def _is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not node.value


def call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def dotted_name(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))
