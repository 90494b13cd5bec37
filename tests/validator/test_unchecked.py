"""The verdict's ``unchecked`` list: what no compiler type-checked, and the label of a fill inside it."""

from __future__ import annotations

from dice.cuda_source import extract_device_code, parse_document
from dice.validator.unchecked import (
    REASON_HOST_NO_NVCC,
    REASON_TEMPLATE_NVCC,
    REASON_TEMPLATE_NVRTC,
    launch_name_expressions,
    unchecked_ranges,
)
from dice.validator.verdict import FLAG_FILL_NOT_CHECKED, Verdict, mark_unchecked, verdict_label

SOURCE = """#include <cstdio>
template <typename T, int N>
__global__ void launched(T* x) { x[0] = T(N); }
template <typename T>
struct Box { __device__ T get() const { return T(); } };
namespace ns {
template <typename T> __device__ T sq(T v) { return v * v; }
template <typename T> __device__ T cube(T v) { return v * v * v; }
__device__ float use() { return sq(2.f); }
template <typename T> __global__ void by_macro(T* p) { p[0] = cube(p[0]); }
}
template <typename T> __global__ void unused(T* p) { p[0] = T(); }
#define LAUNCH(T) ns::by_macro<T><<<1, 1>>>(nullptr)
void launch(float* p) { launched<float, 8><<<1, 1>>>(p); LAUNCH(int); }
template <typename T> void host_t(T v) { v.nothing(); }
int main() { launch(nullptr); return 0; }
"""


def _by_function(entries):
    return {e["function"]: e for e in entries}


def test_name_expressions_come_from_the_host_codes_own_launches() -> None:
    assert launch_name_expressions(parse_document(SOURCE)) == ["launched<float, 8>"]


def test_nvrtc_only_leaves_host_code_and_uninstantiated_templates_unchecked() -> None:
    doc = parse_document(SOURCE)
    got = _by_function(
        unchecked_ranges(
            doc, nvcc_compiled=False, device=extract_device_code(SOURCE), nvrtc_names=["launched<float, 8>"]
        )
    )
    # launched: a name expression; sq: used by device code. by_macro is launched only by host code.
    assert set(got) == {"get", "cube", "by_macro", "unused", "launch", "host_t", "main"}
    assert got["main"]["reason"] == REASON_HOST_NO_NVCC
    assert got["unused"]["reason"] == REASON_TEMPLATE_NVRTC
    assert (got["unused"]["line"], got["unused"]["end_line"]) == (11, 11)
    without = _by_function(unchecked_ranges(doc, nvcc_compiled=False, device=extract_device_code(SOURCE)))
    assert "launched" in without


def test_after_nvcc_only_templates_nothing_instantiates_are_unchecked() -> None:
    got = _by_function(unchecked_ranges(parse_document(SOURCE), nvcc_compiled=True))
    # by_macro and cube are reached through the LAUNCH macro the host code uses
    assert set(got) == {"get", "unused", "host_t"}
    assert {e["reason"] for e in got.values()} == {REASON_TEMPLATE_NVCC}


def test_a_multi_line_template_range_and_explicit_specialisations() -> None:
    src = (
        "template <typename T>\n__global__ void k(T* x) {\n  x[0] = T();\n}\n"
        "template <> __device__ float f<float>(float v) { return v; }\n"
        "template __global__ void k<int>(int*);\n"
    )
    doc = parse_document(src)
    assert unchecked_ranges(doc, nvcc_compiled=False, device=extract_device_code(src)) == []
    only = unchecked_ranges(parse_document(src.rsplit("template __global__", 1)[0]), nvcc_compiled=True)
    assert only == [{"line": 0, "end_line": 3, "function": "k", "reason": REASON_TEMPLATE_NVCC}]


def test_mark_unchecked_flags_a_fill_in_an_unchecked_range_and_the_label_says_so() -> None:
    verdict = Verdict(
        "compiled",
        True,
        message="compiled: device code with NVRTC (sm_90, 0.05 s). Not run: no GPU.",
        flags=["not_run"],
        unchecked=[{"line": 4, "end_line": 9, "function": "k", "reason": REASON_TEMPLATE_NVRTC}],
    )
    assert verdict_label(verdict) == "compiled ✓ · not run"
    assert mark_unchecked(verdict, 3) is verdict
    marked = mark_unchecked(verdict, 9)
    assert marked is not verdict and FLAG_FILL_NOT_CHECKED in marked.flags
    assert FLAG_FILL_NOT_CHECKED not in verdict.flags  # a copy
    assert verdict_label(marked) == "not checked (template never instantiated) · not run"
    assert marked.message.splitlines()[0] == "fill not checked: template never instantiated"
    assert "lines 5-10" in marked.message
    assert verdict_label(marked.to_json()) == verdict_label(marked)
    again = Verdict.from_json(marked.to_json())
    assert again.unchecked == verdict.unchecked and mark_unchecked(again, 5).flags == again.flags
    ran = Verdict("correct", True, True, speedup=1.5, flags=[FLAG_FILL_NOT_CHECKED])
    assert verdict_label(ran) == f"compiled ✓ · correct ✓ · 1.50× vs PyTorch · flags: {FLAG_FILL_NOT_CHECKED}"


def test_preprocessor_branches_that_never_reached_the_compiler() -> None:
    from dice.validator.unchecked import REASON_INACTIVE, inactive_ranges

    src = (
        "#include <x.h>\n"
        "__device__ int f(int a) {\n"
        "#if defined(FOO)\n"
        "    int b = a;\n"
        "    return b;\n"
        "#else\n"
        "    return a;\n"
        "#endif\n"
        "}\n"
        "#define M(x) \\\n"
        "    x + 1\n"
        "/* a comment\n"
        "   more */\n"
        "#ifdef BAR\n"
        "int g();\n"
        "#endif\n"
    )
    doc = parse_document(src)
    # lines 0, 1, 6, 8 and 14 produced code (as nvcc's preprocessed output says)
    assert inactive_ranges(doc, [0, 1, 6, 8, 14]) == [
        {"line": 3, "end_line": 4, "function": "f", "reason": REASON_INACTIVE}
    ]
    assert inactive_ranges(doc, [0, 1, 3, 8, 14]) == [
        {"line": 6, "end_line": 6, "function": "f", "reason": REASON_INACTIVE}
    ]
    assert inactive_ranges(parse_document("__global__ void k() {}\n"), []) == []  # no #if: nothing to say
    got = unchecked_ranges(doc, nvcc_compiled=True, active=[0, 1, 6, 8])
    assert [(e["line"], e["function"]) for e in got] == [(3, "f"), (14, "")]


def test_branch_probe_marks_each_conditional_branch_with_code() -> None:
    """One ``#warning`` before the first code line of each nested branch; the lines after it keep their
    original numbers (the probe's own line maps to the line it precedes); top-level code gets none."""
    from dice.validator.unchecked import REASON_INACTIVE_NVRTC, branch_probe

    src = (
        "__device__ int f(int a) {\n"  # 0
        "#if defined(FOO)\n"  # 1
        "    return a + 1;\n"  # 2
        "#elif BAR\n"  # 3
        "    // nothing but a comment\n"  # 4
        "#else\n"  # 5
        "    return a;\n"  # 6
        "#endif\n"  # 7
        "}\n"  # 8
    )
    device = extract_device_code(src)
    probe = branch_probe(device)
    assert probe is not None and probe.regions == [[2], [6]]
    lines = probe.source.splitlines()
    assert lines[2] == "#warning dice_active_branch_0" and lines[3] == "    return a + 1;"
    assert lines[7] == "#warning dice_active_branch_1" and lines[8] == "    return a;"
    assert probe.line_map[2] == probe.line_map[3] == 2 and probe.line_map[8] == 6
    doc = parse_document(src)
    log = "k.cu(7): warning #1105-D: #warning directive: dice_active_branch_1\n"
    assert probe.inactive(log, device, doc) == [
        {"line": 2, "end_line": 2, "function": "f", "reason": REASON_INACTIVE_NVRTC}
    ]
    # a probe missing from the log (the compile stopped before it, a suppressed warning): not known checked
    assert [e["line"] for e in probe.inactive("", device, doc)] == [2, 6]
    assert branch_probe(extract_device_code("__global__ void k() {}\n")) is None
    assert branch_probe(extract_device_code("#ifndef X\n#define X\n#endif\n__global__ void k() {}\n")) is None


def test_a_fill_in_a_branch_nvrtc_skipped_is_not_counted_as_compiled(cpu_pool) -> None:
    """A file with no host code is decided by NVRTC alone; garbage in an ``#if`` branch it never compiled
    used to come back "compiled" with nothing unchecked. The branch probe reports it, and the label of a fill
    there says so; the branch that was compiled stays checked."""
    text = (
        "__device__ int f(int a) {\n"
        "#if defined(DICE_NOT_DEFINED)\n"
        "    return dice_garbage(a);\n"
        "#else\n"
        "    return a;\n"
        "#endif\n"
        "}\n"
        "__global__ void k(int* x) { x[0] = f(x[0]); }\n"
    )
    v = cpu_pool.validate_cu(text, filename="branches.cu")
    assert v.status == "compiled", v.log
    assert [(u["line"], u["end_line"], u["function"]) for u in v.unchecked] == [(2, 2, "f")]
    assert verdict_label(mark_unchecked(v, 2)).startswith("not checked (preprocessor branch not compiled)")
    assert mark_unchecked(v, 4) is v
    assert "dice_active_branch" not in v.log  # the probe's warnings stay out of the user's log
