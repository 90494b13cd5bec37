"""CuKe's structural augmentation: more validated samples than the sources hold, each re-validated.

(a) **Shape variation** (:func:`shape_variants`): many kernels are shape-generic, so a validated pair is
re-posed with its reference's sizes scaled (batch sizes, sequence lengths, feature and spatial sizes). Only
the reference changes; the builder validates every variant as it validates any pair (correct and at least
the speedup threshold, per shape), so a kernel that hard-codes its sizes simply fails there. The sizes are
found by reading the reference, never by running it: the builder must not execute dataset code outside the
validator's sandboxed workers.

(b) **Layer blocks** (``training.cuke.blocks``): attention, MLP, RMSNorm+residual and RoPE references of
mainstream LLMs over a grid of shapes, solved by a **teacher** (:class:`Teacher`): a model behind an
OpenAI-compatible server (:class:`HttpTeacher`) or any checkpoint the engine loads (:class:`EngineTeacher`),
chosen from ``--teacher URL|PATH`` by :func:`teacher_from_arg`. :func:`teacher_candidates` turns its answers
into candidate pairs for the builder to validate, and :func:`augmentation_plan` counts what a run would
generate, so a build without a teacher still reports what a teacher run would feed.
"""

from __future__ import annotations

import ast
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from engine.answers import extract_program
from engine.errors import CheckpointError, RemoteError
from engine.prompts import kernelbench_prompt
from training.cuke.blocks import BLOCK_KINDS, layer_block_references
from training.cuke.records import Pair

log = logging.getLogger(__name__)

DEFAULT_SAMPLES = 4  # candidates asked of the teacher per reference
SAMPLE_TEMPERATURE = 0.8  # several samples at temperature 0 would be one answer repeated
_MODEL_NEW = re.compile(r"^\s*class\s+ModelNew\b", re.MULTILINE)
_CHAT_OPEN, _CHAT_CLOSE = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"


# ------------------------------------------------------------------------------------------ shape variants
_BATCH_NAME = re.compile(r"^(batch(_size)?|bs|b|n_?batch(es)?|num_batch(es)?)$", re.IGNORECASE)
# Sizes that change what the operation is, or must divide another size: kept as they are.
_FIXED_NAME = re.compile(
    r"kernel|stride|pad|dilation|group|head|pool|patch|window|scale|factor|ratio|rate|eps|momentum|layer"
    r"|stage|cluster|block|state|expand|squeeze|top_?k|axis|bits|slope|split|chunk",
    re.IGNORECASE,
)
# Init arguments that are sizes (an init argument of another name may be an axis or a count).
_SIZE_NAME = re.compile(
    r"channels|features|hidden|size|dim|emb|width|height|depth|len|seq|units|^[nmkldhw]\d?$", re.IGNORECASE
)
# (divisor name, dividend name): the divisions a layer requires (groups | channels, heads | embedding ...).
_DIVIDES = tuple(
    (re.compile(d, re.IGNORECASE), re.compile(q, re.IGNORECASE))
    for d, q in (
        ("group", "channel|feature|dim|hidden|emb"),
        ("head", "dim|emb|hidden|model|channel|feature"),
        ("patch|window", "size|height|width|image|res|dim|len"),
        ("block|chunk|split", "len|seq|size|dim"),
    )
)
_AXIS_KEYWORDS = frozenset({"dim", "axis", "dims", "start_dim", "end_dim"})
MIN_SIZE = 8  # a non-batch constant below this is a count or an index more often than a size
_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b if 0 <= b <= 64 else None,
    ast.LShift: lambda a, b: a << b if 0 <= b <= 64 else None,
}


@dataclass(frozen=True)
class Constant:
    """A module-level integer of a reference. ``role``: "batch" and "size" are scaled, "fixed" is kept
    (``why`` says why), "derived" follows the constants its expression names. ``span``: where its literal
    is in the source (line, column, end line, end column, as ``ast`` counts them)."""

    name: str  # "dim", or "input_shape[0]" for an element of a literal shape tuple
    value: int
    role: str
    why: str
    in_inputs: bool  # get_inputs uses it (it sizes an input tensor)
    span: tuple[int, int, int, int] | None


def _int_value(node: ast.expr, env: dict[str, int]) -> int | None:
    """An integer expression of literals and known constants, or None (no code is run)."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _int_value(node.operand, env)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _int_value(node.left, env), _int_value(node.right, env)
        if a is None or b is None or (b == 0 and isinstance(node.op, (ast.FloorDiv, ast.Mod))):
            return None
        return _OPS[type(node.op)](a, b)
    return None


def _bindings(tree: ast.Module) -> tuple[dict[str, ast.expr], Counter[str]]:
    """Module-level ``name = value`` (and ``a, b = x, y``) values, and how often each name is bound at
    module level (a name bound twice, or declared ``global`` in a function, is never rewritten)."""
    values: dict[str, ast.expr] = {}
    count: Counter[str] = Counter()
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            count.update(
                n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            )
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for t in targets:
            if isinstance(t, ast.Name):
                values[t.id] = value
            elif isinstance(t, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
                pairs = zip(t.elts, value.elts, strict=False) if len(t.elts) == len(value.elts) else ()
                values.update((e.id, v) for e, v in pairs if isinstance(e, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            count.update({name: 2 for name in node.names})
    return values, count


def _used_by(tree: ast.Module, func: str, values: dict[str, ast.expr]) -> set[str]:
    """The module names function ``func`` reads, directly or through module-level values that name them."""
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), None)
    todo = [n.id for n in ast.walk(fn) if isinstance(n, ast.Name)] if fn is not None else []
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            if name in values:
                todo.extend(n.id for n in ast.walk(values[name]) if isinstance(n, ast.Name))
    return seen


def _role(name: str, value: int, literal: bool, inputs: bool, init: bool, axes: set[str]) -> tuple[str, str]:
    if not literal:
        return "derived", "computed from other constants"
    if not (inputs or init):
        return "fixed", "not used by get_inputs or get_init_inputs"
    if name in axes:
        return "fixed", "used as a dim/axis argument"
    if _BATCH_NAME.match(name):
        return ("batch", "batch-like name") if value >= 1 else ("fixed", "not positive")
    if _FIXED_NAME.search(name):
        return "fixed", "a kernel/stride/padding/group/head-like name"
    if value < MIN_SIZE:
        return "fixed", f"small ({value} < {MIN_SIZE}): a count or an index"
    if inputs or _SIZE_NAME.search(name):
        return "size", "sizes an input" if inputs else "size-like init argument"
    return "fixed", "an init argument of no size-like name"


def _span(node: ast.expr) -> tuple[int, int, int, int]:
    return (node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0)


def classify_constants(code: str) -> dict[str, Constant]:
    """The integer constants of a reference's module level that its ``get_inputs`` / ``get_init_inputs``
    use (directly or through other constants), each with its role; {} when the code does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return {}
    values, count = _bindings(tree)
    inputs, init = _used_by(tree, "get_inputs", values), _used_by(tree, "get_init_inputs", values)
    axes = {
        k.value.id
        for k in ast.walk(tree)
        if isinstance(k, ast.keyword) and k.arg in _AXIS_KEYWORDS and isinstance(k.value, ast.Name)
    }
    env: dict[str, int] = {}
    out: dict[str, Constant] = {}
    for name, node in values.items():
        if count[name] != 1 or name not in inputs | init:
            continue
        literal = not any(isinstance(n, ast.Name) for n in ast.walk(node))
        if (
            isinstance(node, ast.Tuple)
            and literal
            and re.search(r"shape|size", name)
            and not _FIXED_NAME.search(name)
        ):
            for i, elt in enumerate(node.elts):  # input_shape = (32768,): each element is a size
                v = _int_value(elt, env)
                if v is not None:
                    role, why = _role(name, v, True, name in inputs, name in init, axes)
                    out[f"{name}[{i}]"] = Constant(f"{name}[{i}]", v, role, why, name in inputs, _span(elt))
            continue
        value = _int_value(node, env)
        if value is None:
            continue
        env[name] = value
        role, why = _role(name, value, literal, name in inputs, name in init, axes)
        out[name] = Constant(name, value, role, why, name in inputs, _span(node) if literal else None)
    return out


def _values_with(consts: dict[str, Constant], tree_values: dict[str, ast.expr], new: dict[str, int]) -> dict:
    """Every constant's value once ``new`` replaces some literals (derived ones computed again)."""
    env: dict[str, int] = {}
    for name, c in consts.items():
        if c.role == "derived":
            v = _int_value(tree_values[name], env)
            env[name] = v if v is not None else c.value
        else:
            env[name] = new.get(name, c.value)
    return env


def _divisibility_kept(consts: dict[str, Constant], after: dict[str, int]) -> bool:
    """Whether every 'b divides a' of the original that is a rule still holds: a group count of channels,
    a head count of an embedding, a patch or window of an image, a block or chunk of a sequence (by their
    names), or two constants that both changed. Other divisions are coincidences (the height 24 that 8
    groups happen to divide, batch 10 and 10 classes) and do not stop a variant."""
    changed = {n for n, v in after.items() if v != consts[n].value}
    for a, ca in consts.items():
        for b, cb in consts.items():
            if a == b or cb.value <= 1 or ca.value % cb.value or a not in changed:
                continue
            base_a, base_b = a.split("[")[0], b.split("[")[0]
            rule = b in changed or any(d.search(base_b) and q.search(base_a) for d, q in _DIVIDES)
            if rule and after[a] % after[b]:
                return False
    return True


def _scaled(members: list[Constant], scale: float, max_growth: float) -> dict[str, int] | None:
    """New values for ``members``, or None when nothing changes or the product of the changes (a proxy
    for how much the work and the memory grow) passes ``max_growth`` either way: exact where ``value *
    scale`` is an integer, else an odd size stays odd (KernelBench's 4095 is misaligned on purpose)."""
    new: dict[str, int] = {}
    growth = 1.0
    for c in members:
        exact = c.value * scale
        v = int(exact) if float(exact).is_integer() else int(exact) | 1
        if v >= min(2, c.value) and v != c.value:  # never down to 1 (BatchNorm needs 2 values per channel)
            new[c.name] = v
            growth *= v / c.value
    if not new or not 1.0 / max_growth <= growth <= max_growth:
        return None
    return new


def _rewrite(code: str, consts: dict[str, Constant], new: dict[str, int]) -> str:
    """``code`` with the literals of ``new``'s constants replaced (comments and layout kept)."""
    data = code.encode("utf-8")
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits = []
    for name, value in new.items():
        line, col, end_line, end_col = consts[name].span or (0, 0, 0, 0)
        edits.append((starts[line - 1] + col, starts[end_line - 1] + end_col, str(value).encode()))
    for start, end, text in sorted(edits, reverse=True):
        data = data[:start] + text + data[end:]
    return data.decode("utf-8")


def shape_variants(
    pair: Pair, *, scales: Sequence[float] = (0.5, 2.0), max_variants: int = 4, max_growth: float = 16.0
) -> list[Pair]:
    """The pair re-posed at other sizes: its reference with the batch-like constants scaled, then the other
    sizes, then both (each scale in turn), at most ``max_variants``. Kept: kernel/stride/padding/group/head
    constants, axis arguments, small counts, anything not used by get_inputs / get_init_inputs; a variant
    that would break a divisibility the reference has (groups | channels) or scale its sizes' product
    more than ``max_growth`` times either way is not made. Each is a new Pair (same kernel, id
    ``"<id>~<tag>"``, meta ``variant`` = the new values, ``variant_of`` = the pair's id) and compiles; []
    when nothing can vary."""
    consts = classify_constants(pair.pytorch_code)
    batch = [c for c in consts.values() if c.role == "batch"]
    sizes = [c for c in consts.values() if c.role == "size"]
    plans = [
        (group, members, s)
        for group, members in (("batch", batch), ("size", sizes))
        if members
        for s in scales
    ]
    if batch and sizes:
        plans += [("all", batch + sizes, s) for s in scales]
    tree_values = _bindings(ast.parse(pair.pytorch_code))[0] if consts else {}
    out: list[Pair] = []
    seen: set[tuple[tuple[str, int], ...]] = set()
    for group, members, scale in plans:
        new = _scaled(members, scale, max_growth)
        if len(out) >= max_variants or new is None or tuple(sorted(new.items())) in seen:
            continue
        if not _divisibility_kept(consts, _values_with(consts, tree_values, new)):
            continue
        code = _rewrite(pair.pytorch_code, consts, new)
        try:
            compile(code, f"<{pair.id} variant>", "exec")
        except (SyntaxError, ValueError):
            continue
        seen.add(tuple(sorted(new.items())))
        tag = f"{group}_x{scale:g}"
        meta = {"variant": new, "variant_of": pair.id, "variant_tag": tag}
        out.append(replace(pair, id=f"{pair.id}~{tag}", pytorch_code=code, meta=meta))
    return out


# ------------------------------------------------------------------------------------------ teachers
class TeacherError(RuntimeError):
    """A teacher that cannot be used or failed on a reference: ``str()`` names the teacher, the reference
    and the cause (timed out, refused, the server's own message)."""


class Teacher(Protocol):
    """What proposes ModelNew programs for references: ``propose`` returns, per reference and in order,
    ``samples`` programs (None where the answer held no ``class ModelNew`` program)."""

    name: str

    def propose(self, refs: list[Pair], samples: int) -> list[list[str | None]]: ...


def answer_program(answer: str) -> str | None:
    """The program a teacher's answer proposes (``engine.answers.extract_program``, the rule every part
    shares), or None when it defines no ``ModelNew``: there is nothing to validate then. A program that
    defines one but does not parse is kept, so the funnel counts it where it fails (compile)."""
    program = extract_program(answer)
    return program if _MODEL_NEW.search(program) else None


def _temperature(temperature: float | None, samples: int) -> float:
    if temperature is not None:
        return temperature
    return 0.0 if samples == 1 else SAMPLE_TEMPERATURE


def _check_samples(samples: int) -> None:
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")


def chat_user_turn(prompt: str) -> str:
    """The user message inside the ChatML that ``kernelbench_prompt`` renders, for a chat endpoint (the
    server applies its own model's template to it)."""
    if not (prompt.startswith(_CHAT_OPEN) and prompt.endswith(_CHAT_CLOSE)):
        raise ValueError("the KernelBench prompt is not one ChatML user turn: no chat message in it")
    return prompt[len(_CHAT_OPEN) : -len(_CHAT_CLOSE)]


class HttpTeacher:
    """A model behind an OpenAI-compatible server, through the project's client (``engine.remote``).

    ``api="completions"`` (default) sends DICE's KernelBench prompt as the raw ChatML text it is, to
    ``/v1/completions`` (streamed, as ``RemoteEngine.generate_program`` does): exactly what a DICE/Qwen-family
    model was trained on; ``dice serve``, vLLM and SGLang serve it. ``api="chat"`` sends the same prompt's
    user turn to ``/v1/chat/completions`` (not streamed), for a teacher of another family or a hosted API
    that only has chat: the server then applies its own template. ``timeout`` is the longest silence on
    the connection in seconds (for chat, the whole generation). The server is asked for its models at
    construction, so a bad URL fails before any GPU time is spent. ``concurrency`` references are in flight
    at once (a server batches them).
    """

    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        *,
        api: str = "completions",
        max_new_tokens: int = 8192,
        temperature: float | None = None,
        concurrency: int = 4,
        retries: int = 2,
        transport: Any = None,
    ) -> None:
        from engine.remote import RemoteEngine

        if api not in ("completions", "chat"):
            raise ValueError(f"unknown teacher api {api!r} (use 'completions' or 'chat')")
        self.api, self.max_new_tokens, self.temperature = api, max_new_tokens, temperature
        self.concurrency = max(1, concurrency)
        try:
            self.engine = RemoteEngine(
                url, api_key=api_key, model=model, timeout_s=timeout, retries=retries, transport=transport
            )
        except RemoteError as exc:  # ServerUnavailable included
            raise TeacherError(f"cannot use the teacher at {url}: {exc}") from None
        self.name = f"{self.engine.name} at {self.engine.url}"

    def close(self) -> None:
        self.engine.close()

    def propose(self, refs: list[Pair], samples: int) -> list[list[str | None]]:
        _check_samples(samples)
        if not refs:
            return []
        with ThreadPoolExecutor(min(self.concurrency, len(refs)), thread_name_prefix="cuke-teacher") as pool:
            return list(pool.map(lambda ref: self._propose_one(ref, samples), refs))

    def _propose_one(self, ref: Pair, samples: int) -> list[str | None]:
        try:
            answers = self._answers(ref.pytorch_code, samples)
        except RemoteError as exc:
            raise TeacherError(f"the teacher {self.name} failed on {ref.id}: {exc}") from None
        return [answer_program(a) for a in answers]

    def _answers(self, ref_src: str, samples: int) -> list[str]:
        temperature = _temperature(self.temperature, samples)
        if self.api == "completions":
            done = self.engine.generate_program(
                ref_src, n=samples, max_new_tokens=self.max_new_tokens, temperature=temperature
            )
            return [c.text for c in done]
        body = {
            "model": self.engine.name,
            "messages": [{"role": "user", "content": chat_user_turn(kernelbench_prompt(ref_src))}],
            "n": samples,
            "max_tokens": self.max_new_tokens,
            "temperature": temperature,
        }
        answer = self.engine._post_json("/v1/chat/completions", body)  # its retries and error messages
        choices = answer.get("choices")
        if not isinstance(choices, list) or len(choices) != samples:
            got = len(choices) if isinstance(choices, list) else "no"
            raise RemoteError(f"{self.engine.url}/v1/chat/completions answered {got} choices for n={samples}")
        texts = []
        for choice in sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0):
            message = choice.get("message") if isinstance(choice, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            texts.append(content if isinstance(content, str) else "")
        return texts


class EngineTeacher:
    """Any checkpoint ``engine.load_engine`` loads (a DICE/SDAR folder), generating in this process with
    ``Engine.generate_program`` (DICE's KernelBench prompt). A reference whose prompt leaves fewer than
    ``min_room`` tokens of the model's context gets no programs (None) instead of failing the run; the
    answer is cut at the context otherwise."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str | None = None,
        max_new_tokens: int = 4096,
        temperature: float | None = None,
        min_room: int = 64,
        **decode: Any,
    ) -> None:
        from engine import load_engine

        try:
            self.engine = load_engine(path, device=device)
        except (CheckpointError, OSError) as exc:
            raise TeacherError(f"cannot load the teacher checkpoint {path}: {exc}") from None
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.min_room, self.decode = min_room, decode
        self.name = f"{self.engine.name} ({self.engine.path})"

    def propose(self, refs: list[Pair], samples: int) -> list[list[str | None]]:
        _check_samples(samples)
        context = self.engine.config.max_position_embeddings
        out: list[list[str | None]] = []
        for ref in refs:
            room = context - len(self.engine.tokenizer.encode(kernelbench_prompt(ref.pytorch_code)))
            if room < self.min_room:
                log.warning(
                    "teacher %s: the prompt of %s leaves %d tokens of context", self.name, ref.id, room
                )
                out.append([None] * samples)
                continue
            done = self.engine.generate_program(
                ref.pytorch_code,
                n=samples,
                max_new_tokens=min(self.max_new_tokens, room),
                temperature=_temperature(self.temperature, samples),
                **self.decode,
            )
            out.append([answer_program(c.text) for c in done])
        return out


def teacher_from_arg(text: str, **options: Any) -> Teacher:
    """The teacher ``--teacher`` names: an ``http(s)://`` URL (:class:`HttpTeacher`; ``options`` such as
    model, api_key, timeout, api) or a checkpoint folder (:class:`EngineTeacher`; options such as device).
    ``TeacherError`` saying why when it is neither, or cannot be used."""
    value = (text or "").strip()
    if not value:
        raise TeacherError(
            "--teacher is empty: give an http(s):// URL of a model server or a checkpoint folder"
        )
    if value.startswith(("http://", "https://")):
        return HttpTeacher(value, **options)
    path = Path(value).expanduser()
    if path.is_dir():
        return EngineTeacher(path, **options)
    hint = ""
    if re.match(r"^[\w.-]+:\d+(/|$)", value):
        hint = f" (a server? write http://{value})"
    elif path.exists():
        hint = " (it is a file; a checkpoint is a folder with config.json and the weights)"
    raise TeacherError(
        f"--teacher {value!r} is neither an http(s):// URL of an OpenAI-compatible server nor a checkpoint "
        f"folder{hint or ' (no such folder)'}"
    )


def teacher_candidates(refs: list[Pair], teacher: Teacher, samples: int = DEFAULT_SAMPLES) -> list[Pair]:
    """Candidate pairs from the teacher's answers: ``"<ref id>#t<k>"`` for the k-th sample that held a
    ModelNew program (answers without one make no pair), the reference's fields and meta kept, plus
    ``meta["teacher"]`` (its name) and ``meta["sample"]``. Nothing here says they are good: the builder
    validates each (correct and at least the speedup threshold) before it keeps any."""
    _check_samples(samples)
    proposals = teacher.propose(refs, samples)
    if len(proposals) != len(refs):
        raise TeacherError(f"the teacher {teacher.name} answered {len(proposals)} of {len(refs)} references")
    out = []
    for ref, programs in zip(refs, proposals, strict=True):
        for k, program in enumerate(programs):
            if program is not None:
                meta = {**ref.meta, "teacher": teacher.name, "sample": k}
                out.append(replace(ref, id=f"{ref.id}#t{k}", cuda_code=program, meta=meta))
    log.info(
        "teacher %s: %d programs from %d references x %d samples", teacher.name, len(out), len(refs), samples
    )
    return out


def augmentation_plan(
    pairs: Sequence[Pair],
    refs: Sequence[Pair],
    teacher: Teacher | None,
    *,
    samples: int = DEFAULT_SAMPLES,
    scales: Sequence[float] = (0.5, 2.0),
    max_variants: int = 4,
) -> dict[str, Any]:
    """What augmentation would generate, without generating kernels: shape variants per pair (counted
    by producing them, which only reads the references), the layer-block references, and the teacher
    requests and candidates. With no teacher nothing is asked, and ``teacher.would_request`` /
    ``would_propose`` say what a ``--teacher`` run would feed the validator."""
    counts = [len(shape_variants(p, scales=scales, max_variants=max_variants)) for p in pairs]
    per_pair = Counter(counts)
    asked = len(refs) * samples
    return {
        "shape_variants": {
            "pairs": len(pairs),
            "pairs_with_variants": sum(1 for n in counts if n),
            "variants": sum(counts),
            "per_pair": {str(n): per_pair[n] for n in sorted(per_pair)},
            "scales": list(scales),
        },
        "layer_blocks": {
            "references": len(refs),
            "by_kind": dict(Counter(str(r.meta.get("block", "other")) for r in refs)),
            "by_level": {str(k): v for k, v in sorted(Counter(r.level for r in refs).items(), key=str)},
        },
        "teacher": {
            "given": teacher is not None,
            "name": teacher.name if teacher is not None else None,
            "samples_per_reference": samples,
            "requests": len(refs) if teacher is not None else 0,
            "would_request": len(refs),
            "would_propose": asked,
        },
    }


__all__ = [
    "BLOCK_KINDS",
    "DEFAULT_SAMPLES",
    "Constant",
    "EngineTeacher",
    "HttpTeacher",
    "Teacher",
    "TeacherError",
    "answer_program",
    "augmentation_plan",
    "chat_user_turn",
    "classify_constants",
    "layer_block_references",
    "shape_variants",
    "teacher_candidates",
    "teacher_from_arg",
]
