"""The level of a KernelBench-form reference, from static analysis of its ``class Model`` (no import, no run).

BiC-RL schedules its data by level (easy before hard), and most sources say nothing about levels, so every
task gets one from its reference alone:

- **1, single op**: one operator in ``forward`` (ReLU, a matmul, a convolution, a softmax, a reduction, a
  loss), with any number of reshapes/views around it; also one operator written as a short formula
  (``x / (1 + x.abs())``, an RMSNorm in two lines), since KernelBench counts those as one operator.
- **2, fused ops**: a short chain: one contraction (conv, GEMM, matmul) with other ops around it, or,
  without a contraction, at least three named ops or three statements of ops (``x = x * s; x = tanh(x);
  x = x + b``).
- **3, whole model**: structure (``nn.Sequential`` / ``ModuleList``, layers built in loops, loops in
  ``forward``, sub-blocks of the file's own module classes, recurrent or attention layers), or several
  contractions (a stack of layers is a network, not an operator with an epilogue), or many ops.

The analysis counts what runs: ``forward`` and every ``self.method`` / module-level function it calls, with
each ``self.<attr>(...)`` replaced by what ``__init__`` built for ``attr`` (a layer, a container of layers,
one of the file's own modules analysed in turn). Shape/view/indexing/creation calls and scalar arithmetic are
not ops. The vocabulary is by category (contractions, layout, composite layers), not by problem name.
Agreement with KernelBench's own levels (tests/training/cuke/test_levels.py): 248 of its 250 level 1-3
problems; the two others have two contractions (a depthwise-separable conv, level 1; a GEMM chain, level 2)
and are called 3. Its level-4 problems (pretrained Hugging Face models) come out 3.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

# Contractions: the "heavy" op of a fused chain; two or more make a network.
_HEAVY = {
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear",
    "bilinear", "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "mv", "einsum", "tensordot",
    "scaled_dot_product_attention", "conv", "conv_tbc",
}  # fmt: skip
_HEAVY_LAYER_PREFIXES = ("Conv", "LazyConv", "Linear", "LazyLinear", "Bilinear")
# Layers that are several contractions each (gates, heads, stacked layers): a whole model by themselves.
_COMPOSITE_LAYERS = {
    "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell", "MultiheadAttention", "Transformer",
    "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer", "TransformerDecoderLayer",
}  # fmt: skip
_CONTAINERS = {"Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"}
_NOT_OPS_LAYERS = {"Identity", "Flatten", "Unflatten", "Parameter", "Buffer"}
# Moving, viewing, selecting or creating data: not an operator of the problem.
_LAYOUT = {
    "view", "reshape", "permute", "transpose", "contiguous", "squeeze", "unsqueeze", "flatten", "unflatten",
    "size", "dim", "numel", "expand", "expand_as", "repeat", "split", "chunk", "to", "float", "half",
    "double", "bfloat16", "int", "long", "bool", "type", "type_as", "cuda", "cpu", "clone", "detach", "t",
    "narrow", "select", "flip", "roll", "cat", "concat", "stack", "tril", "triu", "diag", "diagonal",
    "diag_embed", "gather", "index_select", "masked_select", "movedim", "swapaxes", "item", "tolist",
    "zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like", "rand", "randn",
    "randint", "rand_like", "randn_like", "arange", "linspace", "tensor", "as_tensor", "from_numpy",
    "new_zeros", "new_ones", "new_empty", "new_full", "copy_", "fill_", "zero_", "append", "extend",
    "register_buffer", "unbind", "split_with_sizes", "tile", "broadcast_to", "view_as", "reshape_as",
    "is_contiguous", "get_device", "data_ptr", "requires_grad_", "__getitem__", "pad",
}  # fmt: skip
_LAYOUT_FUNCTIONS = {
    "rearrange", "repeat", "reduce", "len", "range", "int", "float", "min", "max", "abs", "isinstance",
    "list", "tuple", "zip", "enumerate", "print", "getattr", "setattr", "super",
}  # fmt: skip
_TORCH_ROOTS = {"torch", "th", "F", "nn", "functional", "fn"}
_SCALAR_ATTRS = {"shape", "device", "dtype", "ndim", "is_cuda", "training"}
# When the op count alone says "a whole model" (KernelBench's level-2 chains stay under it).
_MANY_OPS = 12


@dataclass
class LevelGuess:
    level: int
    reasons: list[str]


@dataclass
class _Counts:
    """What a piece of code runs: contractions, other named ops, tensor arithmetic, and structure signals."""

    heavy: int = 0
    named: int = 0
    arith: int = 0
    statements: int = 0
    structure: list[str] = field(default_factory=list)

    def note(self, signal: str) -> None:
        if signal not in self.structure:
            self.structure.append(signal)

    def add(self, other: _Counts, times: int = 1) -> None:
        self.heavy += other.heavy * times
        self.named += other.named * times
        self.arith += other.arith * times
        self.statements += other.statements * times
        for signal in other.structure:
            self.note(signal)

    @property
    def ops(self) -> int:
        return self.heavy + self.named + self.arith


def _dotted(node: ast.AST) -> list[str]:
    """``torch.nn.functional.relu`` -> ["torch", "nn", "functional", "relu"]; [] for other expressions."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return []


def _is_self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


class _Module:
    """One ``nn.Module`` class of the file: what ``__init__`` builds for each attribute, and its methods."""

    def __init__(self, cls: ast.ClassDef, analyzer: _Analyzer) -> None:
        self.cls, self.analyzer = cls, analyzer
        self.methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.attrs: dict[str, _Counts] = {}
        self.init = _Counts()
        init = self.methods.get("__init__")
        if init is not None:
            self._read_init(init)

    def _read_init(self, init: ast.FunctionDef) -> None:
        """Attributes assigned a layer, container or module of the file; layer-building loops count too."""
        for node in ast.walk(init):
            if isinstance(node, ast.Call) and _dotted(node.func)[-1:] == ["from_pretrained"]:
                self.init.note("a pretrained model")
            loop = isinstance(node, (ast.For, ast.While, ast.ListComp, ast.GeneratorExp))
            calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)] if loop else []
            if any(self.analyzer.layer_of(c) is not None for c in calls):
                self.init.note("layers built in a loop")
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                built = self.analyzer.layer_of(node.value)
                if built is None:
                    continue
                for target in node.targets:
                    attr = _is_self_attr(target)
                    if attr is not None:
                        self.attrs[attr] = built
            elif isinstance(node, ast.Call) and _dotted(node.func)[-1:] == ["add_module"] and node.args[1:]:
                built = self.analyzer.layer_of(node.args[1]) if isinstance(node.args[1], ast.Call) else None
                if built is not None:
                    self.init.note("layers added with add_module")

    def counts(self) -> _Counts:
        out = _Counts()
        out.add(self.init)
        forward = self.methods.get("forward")
        if forward is not None:
            out.add(self.analyzer.body_counts(forward, self, set()))
        return out


class _Analyzer:
    """Walks the file's module classes and functions, memoising each class's counts (recursion-safe)."""

    def __init__(self, tree: ast.Module) -> None:
        self.classes = _module_classes(tree)
        # ``from torch.nn import Conv2d`` (and ``from torch import nn as tnn``): bare names that are layers.
        self.nn_names: set[str] = set()
        self.nn_aliases = {"nn"}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("torch.nn", "torch.nn.modules"):
                self.nn_names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module == "torch":
                self.nn_aliases.update(a.asname or a.name for a in node.names if a.name == "nn")
            elif isinstance(node, ast.Import):
                self.nn_aliases.update(a.asname for a in node.names if a.name == "torch.nn" and a.asname)
        self.functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        self.modules: dict[str, _Module] = {}
        self.memo: dict[str, _Counts] = {}
        self.active: set[str] = set()

    def module(self, name: str) -> _Module:
        if name not in self.modules:
            self.modules[name] = _Module(self.classes[name], self)
        return self.modules[name]

    def class_counts(self, name: str) -> _Counts:
        if name in self.memo:
            return self.memo[name]
        if name in self.active:
            return _Counts()
        self.active.add(name)
        counts = self.module(name).counts()
        self.active.discard(name)
        self.memo[name] = counts
        return counts

    def layer_of(self, call: ast.Call) -> _Counts | None:
        """What calling a constructor builds, or None when it is not a module (a tensor, a number...)."""
        parts = _dotted(call.func)
        if not parts:
            return None
        name = parts[-1]
        if name in self.classes and len(parts) == 1:
            sub = _Counts()
            sub.add(self.class_counts(name))
            sub.note(f"sub-block {name}")
            return sub
        if not self.is_nn(parts):
            return None
        out = _Counts()
        if name in _CONTAINERS:
            out.note(f"nn.{name}")
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                for inner in ast.walk(arg):
                    if isinstance(inner, ast.Call) and inner is not arg:
                        built = self.layer_of(inner)
                        if built is not None:
                            out.add(built)
        elif name in _COMPOSITE_LAYERS:
            out.note(f"composite layer nn.{name}")
            out.heavy += 1
        elif name.startswith(_HEAVY_LAYER_PREFIXES):
            out.heavy += 1
        elif name not in _NOT_OPS_LAYERS and name[:1].isupper():
            out.named += 1
        return out

    def is_nn(self, parts: list[str]) -> bool:
        """``nn.X`` / ``torch.nn.X`` / an alias of ``torch.nn`` / a name imported from it."""
        if len(parts) <= 1:
            return bool(parts) and parts[0] in self.nn_names
        return parts[-2] in self.nn_aliases

    def body_counts(self, func: ast.FunctionDef, owner: _Module | None, seen: set[str]) -> _Counts:
        """Ops of one function body, following ``self.method(...)`` and module-level function calls once."""
        walker = _BodyWalker(self, owner, seen | {func.name})
        for stmt in func.body:
            walker.statement(stmt)
        return walker.counts


class _BodyWalker:
    def __init__(self, analyzer: _Analyzer, owner: _Module | None, seen: set[str]) -> None:
        self.analyzer, self.owner, self.seen = analyzer, owner, seen
        self.counts = _Counts()
        self.scalars: set[str] = set()

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            return  # docstring
        if isinstance(stmt, (ast.For, ast.While, ast.AsyncFor)):
            before = self.counts.ops
            for inner in stmt.body:
                self.statement(inner)
            self.expr(stmt.iter if isinstance(stmt, (ast.For, ast.AsyncFor)) else stmt.test)
            if self.counts.ops > before:
                self.counts.note("loop in forward")
            return
        if isinstance(stmt, (ast.If, ast.With, ast.Try)):
            for inner in [*getattr(stmt, "body", []), *getattr(stmt, "orelse", [])]:
                self.statement(inner)
            return
        if isinstance(stmt, (ast.Raise, ast.Assert)):
            return
        if isinstance(stmt, ast.Assign):
            self._track_scalars(stmt)
        before = self.counts.ops
        if isinstance(stmt, ast.AugAssign):
            self.counts.arith += 0 if self.scalar(stmt.value) and self.scalar(stmt.target) else 1
            self.expr(stmt.value)
        else:
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.expr):
                    self.expr(child)
        if self.counts.ops > before:
            self.counts.statements += 1

    def _track_scalars(self, stmt: ast.Assign) -> None:
        """Names bound to sizes (``B, T, C = x.size()``) or scalar arithmetic are not tensors."""
        is_scalar = self.scalar(stmt.value) or self._is_size(stmt.value)
        for target in stmt.targets:
            names = [target] if isinstance(target, ast.Name) else getattr(target, "elts", [])
            for name in names:
                if isinstance(name, ast.Name):
                    (self.scalars.add if is_scalar else self.scalars.discard)(name.id)

    def _is_size(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Subscript):
            return self._is_size(node.value)
        if isinstance(node, ast.Attribute):
            return node.attr in _SCALAR_ATTRS
        if isinstance(node, ast.Call):
            return _dotted(node.func)[-1:] in (["size"], ["dim"], ["numel"], ["len"])
        return False

    def scalar(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.scalars or node.id.isupper()
        if isinstance(node, ast.BinOp):
            return self.scalar(node.left) and self.scalar(node.right)
        if isinstance(node, ast.UnaryOp):
            return self.scalar(node.operand)
        if isinstance(node, ast.Call):
            parts = _dotted(node.func)
            return parts[:1] == ["math"] or parts in (["float"], ["int"]) or self._is_size(node)
        if isinstance(node, ast.Attribute):
            attr = _is_self_attr(node)
            owner_attrs = self.owner.attrs if self.owner else {}
            return (attr is not None and attr not in owner_attrs and self._self_scalar(attr)) or (
                node.attr in _SCALAR_ATTRS
            )
        if isinstance(node, ast.Subscript):
            return self._is_size(node)
        return False

    def _self_scalar(self, attr: str) -> bool:
        """``self.eps``: a number unless ``__init__`` made it a Parameter, buffer or tensor."""
        init = self.owner.methods.get("__init__") if self.owner else None
        if init is None:
            return True
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and any(_is_self_attr(t) == attr for t in node.targets):
                return not isinstance(node.value, ast.Call) or _dotted(node.value.func)[:1] == ["math"]
            buffer = isinstance(node, ast.Call) and _dotted(node.func)[-1:] == ["register_buffer"]
            if buffer and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == attr:
                return False
        return True

    def expr(self, node: ast.expr) -> None:
        if isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.BinOp):
            if not (self.scalar(node.left) and self.scalar(node.right)):
                if isinstance(node.op, ast.MatMult):
                    self.counts.heavy += 1
                else:
                    self.counts.arith += 1
            self.expr(node.left)
            self.expr(node.right)
        elif isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub) and not self.scalar(node.operand):
                self.counts.arith += 1
            self.expr(node.operand)
        elif isinstance(node, ast.Subscript):
            self.expr(node.value)
        elif isinstance(node, (ast.Lambda, ast.Constant, ast.JoinedStr)):
            return
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Call):  # ``nn.ReLU()(x)``: the layer built and applied in place
            self.call(node.func)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self.expr(arg)
            return
        parts = _dotted(node.func)
        name = parts[-1] if parts else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
        attr = _is_self_attr(node.func)
        args = [*node.args, *(k.value for k in node.keywords)]
        if attr is not None and self.owner is not None and attr in self.owner.attrs:
            self.counts.add(self.owner.attrs[attr])
        elif attr is not None and self.owner is not None and attr in self.owner.methods:
            if attr not in self.seen:
                self.counts.add(self.analyzer.body_counts(self.owner.methods[attr], self.owner, self.seen))
        elif len(parts) == 1 and name in self.analyzer.functions:
            if name not in self.seen:
                self.counts.add(self.analyzer.body_counts(self.analyzer.functions[name], None, self.seen))
        elif len(parts) == 1 and name in self.analyzer.classes:
            self.counts.add(self.analyzer.layer_of(node) or _Counts())
        elif parts[:1] == ["math"] or (len(parts) == 1 and name in _LAYOUT_FUNCTIONS):
            return
        elif name in _LAYOUT:
            if isinstance(node.func, ast.Attribute) and not (parts and parts[0] in _TORCH_ROOTS):
                self.expr(node.func.value)  # the tensor being viewed may itself be computed
        elif self.analyzer.is_nn(parts) and name[:1].isupper():
            self.counts.add(self.analyzer.layer_of(node) or _Counts())
        else:
            if name in _HEAVY:
                self.counts.heavy += 1
            elif name:
                self.counts.named += 1
            if isinstance(node.func, ast.Attribute) and not (parts and parts[0] in _TORCH_ROOTS):
                self.expr(node.func.value)
        for arg in args:
            self.expr(arg)


def _module_classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    """The file's own ``nn.Module`` classes (a base naming ``Module``, or another of them): only these are
    sub-blocks; a config class or a dataclass built in ``__init__`` is not a layer."""
    classes = [c for c in tree.body if isinstance(c, ast.ClassDef)]
    out: dict[str, ast.ClassDef] = {}
    changed = True
    while changed:
        changed = False
        for c in classes:
            bases = [_dotted(b)[-1:] for b in c.bases]
            if c.name not in out and any(b == ["Module"] or (b and b[0] in out) for b in bases):
                out[c.name] = c
                changed = True
    return out


def _model_class(tree: ast.Module) -> ast.ClassDef:
    modules = _module_classes(tree)
    if "Model" in modules:
        return modules["Model"]
    if not modules:
        raise ValueError("no class Model (nor any nn.Module subclass) in the reference")
    return list(modules.values())[-1]


def classify_level(pytorch_code: str) -> LevelGuess:
    """Level 1 (single op), 2 (fused ops) or 3 (whole model) of a reference, with the reasons.

    Raises ValueError naming the syntax error when the code does not parse, or when it has no module class:
    a level guessed from unparseable text would silently mis-schedule RL data.
    """
    try:
        tree = ast.parse(pytorch_code)
    except SyntaxError as exc:
        raise ValueError(f"the reference does not parse as Python (line {exc.lineno}: {exc.msg})") from exc
    cls = _model_class(tree)
    analyzer = _Analyzer(tree)
    counts = analyzer.class_counts(cls.name)
    summary = (
        f"{counts.heavy} contraction(s), {counts.named} other named op(s), {counts.arith} arithmetic op(s)"
    )
    if counts.structure:
        return LevelGuess(3, [*counts.structure, summary])
    if counts.heavy >= 2:
        return LevelGuess(3, [f"{counts.heavy} contractions: a stack of layers", summary])
    if counts.ops >= _MANY_OPS:
        return LevelGuess(3, [f"{counts.ops} ops: many layers", summary])
    if counts.heavy == 1 and counts.ops >= 2:
        return LevelGuess(2, ["a contraction with other ops fused around it", summary])
    if counts.heavy == 0 and (counts.named >= 3 or (counts.statements >= 3 and counts.ops >= 3)):
        return LevelGuess(2, ["a chain of ops without a contraction", summary])
    single = "a single operator" if counts.ops <= 1 else "one operator written as a formula"
    return LevelGuess(1, [single, summary])


__all__ = ["LevelGuess", "classify_level"]
