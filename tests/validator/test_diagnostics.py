"""Parsing nvcc / host-compiler / ptxas output into diagnostics on the user's file.

The logs below are real output, captured on this machine (nvcc 13.0, g++ 12.2, LC_ALL=C) by compiling the
small broken files shown beside them; only temporary paths were shortened.
"""

from __future__ import annotations

from pathlib import Path

from dice.validator.diagnostics import (
    FileMapping,
    include_site_finder,
    parse_compiler_output,
    rewrite_paths,
    to_diagnostics,
)

# a.cu: `#include "hdr.cuh"`; k<T> calls twice(x[0]) (hdr.cuh: `return x.bogus * 2;`), main launches
# k<float> at line 13 and calls host_t(3) at line 14; `int y = 0;` unused at line 15.
EDG_INSTANTIATION = """a.cu(15): warning #177-D: variable "y" was declared but never referenced
      int y = 0;
          ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

hdr.cuh(4): error: expression must have class type but it has type "float"
      return x.bogus * 2;
             ^
          detected during:
            instantiation of "T twice(T) [with T=float]" at line 6 of a.cu
            instantiation of "void k(T *) [with T=float]" at line 13 of a.cu

a.cu(10): error: expression must have class type but it has type "int"
  void host_t(T v) { v.nothing(); }
                     ^
          detected during instantiation of "void host_t(T) [with T=int]" at line 14

2 errors detected in the compilation of "a.cu".
"""

# f.cu line 2: #include "h1.h"; h1.h line 2: #include "inc/h2.h"; inc/h2.h line 2: a missing header.
GCC_INCLUDE_CHAIN = """In file included from h1.h:2,
                 from f.cu:2:
inc/h2.h:2:10: fatal error: missing_dep.h: No such file or directory
    2 | #include "missing_dep.h"
      |          ^~~~~~~~~~~~~~~
compilation terminated.
"""

# g.cpp: `#include "gh.h"` then `int main() { return call(3); }`; gh.h: `return v.size();` in a template.
GCC_REQUIRED_FROM = """In file included from g.cpp:1:
gh.h: In instantiation of 'int call(T) [with T = int]':
g.cpp:2:25:   required from here
gh.h:2:26: error: request for member 'size' in 'v', which is of non-class type 'int'
    2 | int call(T v) { return v.size(); }
      |                        ~~^~~~
"""

# p.cu line 2: asm volatile("bogus.instr %0;" :: "r"(x));
PTXAS = """ptxas /tmp/tmpxft_00004825_00000000-6_p.ptx, line 28; error   : Unknown modifier '.instr'
ptxas /tmp/tmpxft_00004825_00000000-6_p.ptx, line 28; error   : Not a name of any known instruction: 'bogus'
ptxas fatal   : Ptx assembly aborted due to errors
"""

# a tab-indented call with the wrong argument type: `\tfoo(x);` on line 3
EDG_TAB = """/tmp/tmpxft_000047d0_00000000-1_stdin(3): error: argument of type "int" is incompatible with parameter of type "float *"
   foo(x);
       ^

1 error detected in the compilation of "/tmp/tmpxft_000047d0_00000000-1_stdin".
"""  # noqa: E501


def _mapping(name: str, **kw) -> FileMapping:
    return FileMapping(lambda p: p is not None and Path(p).name == name, name, **kw)


def test_edg_errors_warnings_columns_and_instantiation_chains() -> None:
    raw = parse_compiler_output(EDG_INSTANTIATION)
    assert [(d.file, d.line, d.severity) for d in raw] == [
        ("a.cu", 15, "warning"),
        ("hdr.cuh", 4, "error"),
        ("a.cu", 10, "error"),
    ]
    assert raw[0].column == 8 and raw[1].column == 11
    assert raw[1].sites == [("a.cu", 6, "instantiation"), ("a.cu", 13, "instantiation")]
    assert raw[2].sites == [("a.cu", 14, "instantiation")]  # "at line 14": the error's own file
    diags = to_diagnostics(raw, _mapping("a.cu"))
    assert [(d["line"], d["severity"]) for d in diags] == [(14, "warning"), (5, "error"), (9, "error")]
    header = diags[1]
    assert header["message"].endswith("(in hdr.cuh:4, instantiated at line 6)")
    assert header["header"] == {"path": "hdr.cuh", "line": 3, "column": 11}
    assert header["source"] == "nvcc" and header["column"] is None
    assert any("line 13 of a.cu" in n for n in header["notes"])
    assert diags[2]["column"] == 19 and diags[2]["notes"]


def test_gcc_include_chain_puts_a_header_error_on_the_users_include() -> None:
    raw = parse_compiler_output(GCC_INCLUDE_CHAIN)
    assert len(raw) == 1 and raw[0].source == "host compiler" and raw[0].file == "inc/h2.h"
    assert raw[0].message.startswith("fatal error: missing_dep.h")
    assert raw[0].sites == [("h1.h", 2, "include"), ("f.cu", 2, "include")]
    (diag,) = to_diagnostics(raw, _mapping("f.cu"))
    assert diag["line"] == 1 and "included at line 2" in diag["message"] and diag["header"]["line"] == 1


def test_gcc_required_from_here_is_the_instantiation_site() -> None:
    raw = parse_compiler_output(GCC_REQUIRED_FROM)
    assert raw[0].column == 25 and raw[0].sites[0] == ("g.cpp", 2, "instantiation")
    (diag,) = to_diagnostics(raw, _mapping("g.cpp"))
    assert diag["line"] == 1 and "instantiated at line 2" in diag["message"]
    assert any("In instantiation of" in n for n in diag["notes"])


def test_ptxas_errors_map_through_the_ptx_loc_lines() -> None:
    raw = parse_compiler_output(PTXAS)
    assert [d.message for d in raw] == [
        "Unknown modifier '.instr'",
        "Not a name of any known instruction: 'bogus'",
    ]
    assert to_diagnostics(raw, _mapping("p.cu")) == []  # no PTX at hand: the message and log carry them
    diags = to_diagnostics(raw, _mapping("p.cu", ptx_line=lambda ptx, line: 2 if line == 28 else None))
    assert {d["line"] for d in diags} == {1}


def test_a_tab_counts_as_one_column_and_paths_are_rewritten_whole() -> None:
    (diag,) = to_diagnostics(parse_compiler_output(EDG_TAB), _mapping("tmpxft_000047d0_00000000-1_stdin"))
    assert diag["column"] == 5  # "\tfoo(x);": the x
    log = rewrite_paths(EDG_TAB, {"/tmp/tmpxft_000047d0_00000000-1_stdin": "k.cu"})
    assert log.startswith("k.cu(3): error") and 'compilation of "k.cu"' in log
    assert rewrite_paths("/a/x.cuh(3): error", {"/a/x.cu": "x.cu"}) == "/a/x.cuh(3): error"


def test_nvrtc_source_name_and_unlocated_nvcc_errors() -> None:
    raw = parse_compiler_output("nvcc fatal   : Unknown option '-bogus'\n", edg_source="nvrtc")
    assert raw[0].file is None and raw[0].message == "nvcc: Unknown option '-bogus'"
    raw = parse_compiler_output('dice_device.cu(2): error: identifier "q" is undefined\n', edg_source="nvrtc")
    assert raw[0].source == "nvrtc"


def test_include_sites_follow_project_headers(tmp_path: Path) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "top.h").write_text('#pragma once\n#include "inc/deep.h"\n')
    (tmp_path / "inc" / "deep.h").write_text("#pragma once\n")
    text = '#include <cstdio>\n\n#include "top.h"\n__global__ void k() {}\n'
    find = include_site_finder(text, str(tmp_path), [])
    assert find(str(tmp_path / "inc" / "deep.h")) == 2
    assert find(str(tmp_path / "top.h")) == 2
    assert find("/usr/include/stdio.h") is None
