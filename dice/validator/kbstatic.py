"""The KernelBench check on a worker without a GPU: what can honestly be checked without running anything
(Python syntax and the static guards, done by the caller, and the device code of every ``load_inline`` whose
sources resolve statically, compiled with NVRTC)."""

from __future__ import annotations

from dice.validator.compile import TORCH_HEADER_PREFIXES, nvrtc_compile
from dice.validator.guards import STATIC_GUARDS, CandidateInfo
from dice.validator.paths import default_arch
from dice.validator.verdict import FLAG_NOT_RUN, FLAG_NOT_TRUSTED, Verdict

STATIC_CAVEAT = (
    "The static guards read the source for known ways of cheating; passing them is not a proof that the "
    "kernel computes the result (only the GPU run with the dynamic guards checks that)."
)


def static_compile_check(info: CandidateInfo, strict: bool, *, not_run: str | None = None) -> Verdict:
    """Without a GPU, what can honestly be checked: Python syntax, static guards and the device code.
    ``not_run``: the reason nothing may run on this machine either (an untrusted workspace)."""
    from dice.cuda_source import extract_device_code

    checked = ["Python syntax", f"the static guards ({', '.join(STATIC_GUARDS)})"]
    not_checked = [
        "the torch extension build (host code, load_inline)",
        "correctness",
        "timing",
        "dynamic guards",
    ]
    logs: list[str] = []
    unresolved = [ext for ext in info.extensions if not ext.resolved]
    for i, ext in enumerate(e for e in info.extensions if e.resolved):
        for j, cuda in enumerate(ext.cuda_sources):
            device = extract_device_code(cuda)
            result = nvrtc_compile(
                device.source,
                arch=default_arch(),
                line_map=device.line_map,
                display_name=f"cuda_sources[{i}.{j}]",
                stub_header_prefixes=TORCH_HEADER_PREFIXES,
            )
            logs.append(result.log)
            if not result.ok:
                return Verdict(
                    "compile_error",
                    False,
                    message="CUDA device code does not compile (NVRTC): " + _first_error(result.log),
                    log=result.log,
                    diagnostics=result.diagnostics,
                )
        if ext.cuda_sources:
            checked.append(f"device code of load_inline at line {ext.line} with NVRTC (sm_{default_arch()})")
    if unresolved:
        not_checked.append(
            "CUDA source built at run time (line " + ", ".join(str(e.line) for e in unresolved) + ")"
        )
    tol = "1e-4" if strict else "1e-2"
    why = "no GPU" if not_run is None else "not run: " + not_run
    message = (
        f"compiled ({why}): checked {', '.join(checked)}; not checked: {', '.join(not_checked)} "
        f"(tolerance {tol} applies when run on a GPU). {STATIC_CAVEAT}"
    )
    return Verdict(
        "compiled",
        True,
        None,
        message=message,
        log="\n".join(x for x in logs if x),
        flags=[FLAG_NOT_RUN] + ([FLAG_NOT_TRUSTED] if not_run is not None else []),
    )


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line:
            return line.strip()
    return log.strip().splitlines()[0] if log.strip() else "failed"
