"""The static guards see through obfuscated torch fallbacks: names resolved at run time (getattr with a
computed name, ``__import__``, ``importlib``, ``eval``/``exec``), ``torch.ops``, aliases of torch, swallowed
exceptions and a kernel whose result is dropped. Honest uses of torch (allocation, reshapes, parameters,
streams) pass, and so does a kernel writing into a buffer torch allocated."""

from __future__ import annotations

import pytest

from dice.validator.guards import STATIC_GUARDS, analyze_candidate, static_guards

from .conftest import candidate

HONEST = candidate("level1_19_relu.py")
PRELUDE = HONEST[: HONEST.index("class ModelNew")]
KERNEL = "relu_ext.relu_forward(x, x.numel())"


def model(forward: str, extra: str = "", init: str = "") -> str:
    """The ReLU candidate with another ``forward`` body (and lines before the class, in ``__init__``); a body
    or ``__init__`` that does not call the extension calls it first, as a fallback that hides does."""
    if "relu_ext" not in forward + init:
        forward = f"k = {KERNEL}\n{forward}"
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    init_body = "\n".join("        " + line for line in init.strip().splitlines())
    return (
        f"{PRELUDE}{extra}\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        f"{init_body}\n\n    def forward(self, x):\n{body}\n"
    )


ADVERSARIAL = {
    "getattr_computed_name": (model('name = "re" + "lu"\nreturn getattr(torch, name)(x)'), "dynamic_code"),
    "getattr_on_F_computed": (
        model("import torch.nn.functional as F\nop = 'leaky_relu'\nreturn getattr(F, op)(x)"),
        "dynamic_code",
    ),
    "getattr_module_level": (
        model("return _act(x)", extra="_act = getattr(torch, ''.join(['re', 'lu']))"),
        "dynamic_code",
    ),
    "getattr_alias_of_getattr": (model("g = getattr\nreturn g(torch, 'relu')(x)"), "kernel_result_unused"),
    "dunder_import": (model('return __import__("torch").relu(x)'), "dynamic_code"),
    "importlib": (
        model(
            'F = importlib.import_module("torch.nn.functional")\nreturn F.relu(x)', extra="import importlib"
        ),
        "dynamic_code",
    ),
    "from_importlib": (
        model('return import_module("torch").relu(x)', extra="from importlib import import_module"),
        "dynamic_code",
    ),
    "eval": (model('return eval("torch.relu(x)")'), "dynamic_code"),
    "exec": (
        model('ns = {"x": x, "torch": torch}\nexec("y = torch.relu(x)", ns)\nreturn ns["y"]'),
        "dynamic_code",
    ),
    "builtins_module": (
        model('return builtins.eval("torch.relu(x)")', extra="import builtins"),
        "dynamic_code",
    ),
    "globals_lookup": (model('return globals()["torch"].relu(x)'), "dynamic_code"),
    "sys_modules": (model('return sys.modules["torch"].relu(x)', extra="import sys"), "dynamic_code"),
    "methodcaller": (
        model('return methodcaller("relu")(x)', extra="from operator import methodcaller"),
        "dynamic_code",
    ),
    "torch_dict": (model('return torch.__dict__["relu"](x)'), "dynamic_code"),
    "torch_ops_aten": (model("return torch.ops.aten.relu(x)"), "torch_fallback"),
    "torch_ops_alias": (model("ops = torch.ops\nreturn ops.aten.relu.default(x)"), "torch_fallback"),
    "torch_ops_getattr": (model('return getattr(torch, "ops").aten.relu(x)'), "torch_fallback"),
    "alias_of_F": (
        model(f"out = {KERNEL}\nreturn f.leaky_relu(x)", extra="f = torch.nn.functional"),
        "kernel_result_unused",
    ),
    "from_import_as": (
        model(f"_ = {KERNEL}\nreturn r(x)", extra="from torch.nn.functional import relu as r"),
        "kernel_result_unused",
    ),
    "class_attribute_alias": (
        model(f"y = {KERNEL}\nreturn self.act(x)", init="self.act = nn.ReLU()"),
        "kernel_result_unused",
    ),
    "discarded_kernel_leaky": (
        model(f"out = {KERNEL}\nreturn torch.nn.functional.leaky_relu(x)"),
        "kernel_result_unused",
    ),
    "kernel_in_init_only": (
        model("return torch.clamp(x, min=0)", init="self.warm = relu_ext.relu_forward(torch.ones(4), 4)"),
        "kernel_result_unused",
    ),
    "tensor_method_fallback": (model(f"y = {KERNEL}\nreturn x.clamp_min(0)"), "kernel_result_unused"),
    "helper_function_fallback": (
        model(f"y = {KERNEL}\nreturn _helper(x)", extra="def _helper(t):\n    return torch.relu(t)"),
        "kernel_result_unused",
    ),
    "suppress": (
        model(
            f"out = torch.relu(x)\nwith contextlib.suppress(Exception):\n    out = {KERNEL}\nreturn out",
            extra="import contextlib",
        ),
        "torch_fallback",
    ),
    "suppress_from_import": (
        model(
            f"with quiet(RuntimeError):\n    return {KERNEL}\nreturn torch.relu(x)",
            extra="from contextlib import suppress as quiet",
        ),
        "torch_fallback",
    ),
    "suppress_exit_stack": (
        model(
            f"with contextlib.ExitStack() as st:\n    st.enter_context(contextlib.suppress(Exception))\n"
            f"    return {KERNEL}\nreturn torch.relu(x)",
            extra="import contextlib",
        ),
        "torch_fallback",
    ),
    "custom_swallowing_context": (
        model(
            f"with Quiet():\n    return {KERNEL}\nreturn torch.relu(x)",
            extra="class Quiet:\n    def __enter__(self):\n        return self\n\n"
            "    def __exit__(self, *exc):\n        return True",
        ),
        "torch_fallback",
    ),
    "try_star": (
        model(f"try:\n    return {KERNEL}\nexcept* Exception:\n    return torch.relu(x)"),
        "torch_fallback",
    ),
}

HONEST_CONTROLS = {
    "allocation_and_views": model(
        "x = x.contiguous().view(-1)\nout = torch.empty_like(x)\ny = relu_ext.relu_forward(x, x.numel())\n"
        "out.copy_(y)\nreturn out.view(16, -1)"
    ),
    "writes_into_buffer": model("out = torch.empty_like(x)\nrelu_ext.relu_forward(x, x.numel())\nreturn out"),
    "parameters_and_streams": model(
        f"w = getattr(self, 'weight')\nstream = torch.cuda.current_stream()\ny = {KERNEL}\n"
        "return (y * w.sum()).reshape(x.shape)",
        init="self.weight = nn.Parameter(torch.ones(1))\nself.ext = relu_ext",
    ),
    "extension_on_self": model(
        "return self.ext.relu_forward(x.contiguous(), x.numel())", init="self.ext = relu_ext"
    ),
    "torch_around_kernel": model(f"y = {KERNEL}\nreturn torch.nn.functional.dropout(y, 0.0, self.training)"),
    "helper_calls_kernel": model("return _run(x.contiguous())", extra=f"def _run(x):\n    return {KERNEL}"),
    "torch_op_then_kernel": model("h = torch.matmul(x, x.t())\nreturn relu_ext.relu_forward(h, h.numel())"),
    "kernel_on_list": model(f"outs = []\nouts.append({KERNEL})\nreturn torch.cat(outs)"),
    "getattr_on_extension": model('fn = getattr(relu_ext, "relu_" + "forward")\nreturn fn(x, x.numel())'),
    "suppress_around_build_only": model(
        KERNEL.join(["return ", ""]),
        extra="import contextlib\nwith contextlib.suppress(ImportError):\n    import numpy",
    ),
    "model_eval_method": model(f"self.eval()\nreturn {KERNEL}"),
    "torch_no_grad": model(f"with torch.no_grad():\n    y = {KERNEL}\nreturn y"),
}


def hits_of(src: str) -> list[str]:
    return [hit.guard for hit in static_guards(src, analyze_candidate(src))]


def test_the_template_is_the_honest_candidate() -> None:
    assert hits_of(model(f"x = x.contiguous()\nreturn {KERNEL}")) == []


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_obfuscated_fallback_is_rejected(name: str) -> None:
    src, guard = ADVERSARIAL[name]
    assert guard in STATIC_GUARDS
    assert hits_of(src)[:1] == [guard], name


@pytest.mark.parametrize("name", sorted(HONEST_CONTROLS))
def test_honest_use_of_torch_passes(name: str) -> None:
    assert hits_of(HONEST_CONTROLS[name]) == []


def test_hit_names_the_line() -> None:
    (hit,) = static_guards(src := ADVERSARIAL["discarded_kernel_leaky"][0], analyze_candidate(src))
    assert "leaky_relu" in src.splitlines()[hit.line - 1]
    assert "no call into the candidate's kernel" in hit.message


def test_cpu_verdict_names_the_guards_and_claims_no_proof() -> None:
    import ast

    from dice.validator.guards import CandidateInfo
    from dice.validator.kbstatic import static_compile_check

    verdict = static_compile_check(CandidateInfo(tree=ast.parse(""), has_model_new=True), strict=False)
    assert verdict.status == "compiled"
    assert "checked static honesty guards" not in verdict.message
    assert f"the static guards ({', '.join(STATIC_GUARDS)})" in verdict.message
    assert "not a proof" in verdict.message
