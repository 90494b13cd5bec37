"""The ``#include`` lines of a device-code extraction: which stay, which go, which become libcu++ twins, and
the lines added for standard names (``INFINITY``, ``int64_t``, ``uint``...) that the kept code uses."""

from __future__ import annotations

from collections.abc import Collection

import tree_sitter

from dice.cuda_source._edits import Edit, names_defined, names_used
from dice.cuda_source._headers import (
    BY_USAGE,
    DEVICE_HEADER_PREFIXES,
    DEVICE_HEADERS,
    GLOBAL_INT_TYPES,
    HOST_TYPEDEFS,
    LIBCUXX_TWINS,
    MATH_MACROS,
    STD_ALIAS,
    STD_MINMAX,
    TRIGGER_WORDS,
    twins_needed,
)
from dice.cuda_source._syntax import node_text


class Includes:
    """Collects the include decisions while the extractor walks the file, then (:meth:`finish`) adds the
    libcu++ twins and fallbacks the kept code needs."""

    def __init__(self, data: bytes, project_headers: Collection[str] = ()) -> None:
        self.data = data
        self.project_headers = project_headers
        self.dropped: list[str] = []
        self._twins: list[tuple[int, int, str, str]] = []
        self._drops: list[Edit] = []

    def visit(self, node: tree_sitter.Node, edits: list[Edit]) -> None:
        """One ``#include``: kept (device headers, quoted user headers), dropped, or a twin candidate."""
        path = node.child_by_field_name("path")
        if path is None or path.type != "system_lib_string":
            return  # "user.cuh": the caller's include path decides
        header = node_text(self.data, path)[1:-1].strip()
        if (
            header in DEVICE_HEADERS
            or header.startswith(DEVICE_HEADER_PREFIXES)
            or header in self.project_headers
        ):
            return
        end = node.end_byte
        while end > node.start_byte and self.data[end - 1 : end] in (b"\n", b"\r"):
            end -= 1
        twin = LIBCUXX_TWINS.get(header)
        if twin is None:
            self.dropped.append(header)
            drop = (node.start_byte, end, b"")
            edits.append(drop)
            self._drops.append(drop)
        else:
            self._twins.append((node.start_byte, end, header, twin))

    def finish(self, root: tree_sitter.Node, edits: list[Edit]) -> None:
        """Standard headers: a libcu++ twin where the kept device code uses what the header declares.

        Files often include <cstdio> or <cmath> for their host code only; rewriting those would make the
        compile depend on libcu++ for nothing. The other way round, nvcc makes <math.h> and friends visible
        without an include (and torch/extension.h brings <cstdint>, <limits>...; <sys/types.h> brings
        ``uint``), so a kernel may use ``INFINITY``, ``int64_t`` or ``uint`` with no include of its own:
        those twins and typedefs are added where the first dropped include was, or at the top of the file.
        """
        if not self._twins and not any(word in self.data for word in TRIGGER_WORDS):
            return
        used = names_used(root, self.data, edits)
        needed = twins_needed(used)
        blocks: list[tuple[int, int, list[str]]] = []
        explicit: set[str] = set()
        for start, end, header, twin in sorted(self._twins):  # the first include of a header gets the twin
            wanted = twin in needed or ("std" in used and twin not in BY_USAGE)
            if wanted and twin not in explicit:
                explicit.add(twin)
                blocks.append((start, end, _twin_lines(twin)))
            else:
                self.dropped.append(header)
                edits.append((start, end, b""))
        added = [line for twin in sorted(needed - explicit) for line in _twin_lines(twin)]
        added += [
            f"#ifndef {name}\n#define {name} {value}\n#endif"
            for name, value in MATH_MACROS.items()
            if name in used
        ]
        typedefs = [name for name in HOST_TYPEDEFS if name in used]
        if typedefs:
            defined = names_defined(root, self.data, edits)
            added += [HOST_TYPEDEFS[name] for name in typedefs if name not in defined]
        if added:
            anchor = next((e for e in sorted(edits) if e[2] == b"" and e in self._drops), None)
            if anchor is not None:
                edits.remove(anchor)
                blocks.append((anchor[0], anchor[1], added))
            else:
                blocks.append((0, 0, added))
        std_alias_pending = "std" in used
        for start, end, lines in sorted(blocks):
            if std_alias_pending:
                lines = [*lines, STD_ALIAS, *([STD_MINMAX] if used & {"max", "min"} else [])]
                std_alias_pending = False
            text = "\n".join(lines)
            edits.append((start, end, (text + "\n" if start == end else text).encode()))


def _twin_lines(twin: str) -> list[str]:
    return [f"#include <cuda/std/{twin}>", *([GLOBAL_INT_TYPES] if twin == "cstdint" else [])]
