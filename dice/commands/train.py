"""``dice train ...``: build the SFT corpus, run block-diffusion SFT, evaluate on the held-out split.

``dice train sft`` is the entry point ``accelerate launch`` runs on several processes/GPUs/nodes
(``accelerate launch --config_file training/configs/<cfg>.yaml -m dice train sft ...``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dice import safeio
from dice.commands.common import CliError, check_input_file, print_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="build the SFT corpus, run block-diffusion SFT, evaluate")
    sub = parser.add_subparsers(dest="train_command", metavar="STAGE", required=True)

    corpus = sub.add_parser(
        "corpus",
        help="build the SFT corpus (KernelBench split by problem, real CUDA code split by project and file) "
        "and train a BPE tokenizer on its train split",
    )
    _add_corpus_arguments(corpus)
    corpus.set_defaults(func=run_corpus)

    pack = sub.add_parser("pack", help="tokenise examples and pack them into block-aligned rows (.npz)")
    pack.add_argument("--examples", type=Path, required=True, help=".jsonl(.gz) from `dice train corpus`")
    pack.add_argument("--tokenizer", type=Path, required=True, help="tokenizer folder")
    pack.add_argument("--seq-len", type=int, default=4096, help="row length in tokens")
    pack.add_argument("--block-size", type=int, default=4)
    pack.add_argument("--out", type=Path, required=True, help="rows file (.npz compressed, or .safetensors)")
    pack.add_argument(
        "--code-files",
        type=Path,
        action="append",
        default=[],
        help="also plain code as language-model rows (no prompt, loss on every token): a .jsonl(.gz) of "
        'files with a "text" field, e.g. the corpus\' train_files.jsonl.gz (repeatable)',
    )
    pack.set_defaults(func=run_pack)

    from training.config import SFTConfig

    sft = sub.add_parser(
        "sft",
        help="block-diffusion SFT (SDAR objective) of a checkpoint or a random init, through accelerate",
        description="Block-diffusion SFT. Several GPUs / nodes: accelerate launch --config_file "
        "training/configs/<cfg>.yaml -m dice train sft ...",
    )
    SFTConfig.add_arguments(sft)
    sft.set_defaults(func=run_sft)

    from training.rl.config import RLConfig

    rl = sub.add_parser(
        "rl",
        help="BiC-RL: TraceRL post-training with engine rollouts and validator rewards (docs/RL.md)",
        description="BiC-RL (TraceRL). Phase infill, then phase e2e with --model <infill run>/final. Several "
        "GPUs: accelerate launch --config_file training/configs/<cfg>.yaml -m dice train rl ...",
    )
    RLConfig.add_arguments(rl)
    rl.set_defaults(func=run_rl)

    ev = sub.add_parser("eval", help="held-out masked-token accuracy and NVRTC compile rate of .cu infills")
    ev.add_argument("--model", type=Path, required=True, help="checkpoint folder")
    ev.add_argument("--heldout", type=Path, required=True, help="heldout.jsonl from `dice train corpus`")
    ev.add_argument("--out", type=Path, required=True, help="JSON file for the numbers")
    ev.add_argument("--seq-len", type=int, default=4096)
    ev.add_argument("--max-infill", type=int, default=200, help=".cu infill items to generate and compile")
    ev.add_argument("--max-new-tokens", type=int, default=64)
    ev.add_argument("--seed", type=int, default=0)
    ev.set_defaults(func=run_eval)


def _add_corpus_arguments(corpus: argparse.ArgumentParser) -> None:
    corpus.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the shared data folder (../shared/data): KernelBench sources, cuda-corpus/, realproj/",
    )
    corpus.add_argument(
        "--out", type=Path, required=True, help="output folder (train.jsonl.gz, heldout.jsonl.gz, ...)"
    )
    corpus.add_argument("--seed", type=int, default=0)
    corpus.add_argument(
        "--heldout-fraction",
        type=float,
        default=0.08,
        help="fraction of KernelBench problems held out besides KernelBench PR-67's eval problems",
    )
    corpus.add_argument("--cu-variants", type=int, default=12, help=".cu infill examples per CUDA source")
    corpus.add_argument("--no-kernelbench", action="store_true", help="leave the KernelBench sources out")
    corpus.add_argument(
        "--tokenizer-vocab",
        type=int,
        default=0,
        help="train a byte-level BPE of this size into OUT/tokenizer (0 = none)",
    )
    corpus.add_argument(
        "--model-template",
        type=Path,
        default=None,
        help="config.json template; written to OUT/init_config.json with the tokenizer's ids",
    )
    _add_real_code_arguments(corpus.add_argument_group("real CUDA code (training.embedded)"))


def _add_real_code_arguments(real) -> None:  # real: an argparse argument group
    real.add_argument(
        "--cuda-corpus",
        type=Path,
        default=None,
        help="real-code corpus: files.jsonl(.gz) or its folder "
        "(default: DATA_DIR/cuda-corpus when it exists)",
    )
    real.add_argument("--no-cuda-corpus", action="store_true", help="leave the real-code corpus out")
    real.add_argument(
        "--realproj",
        type=Path,
        default=None,
        help="reference tree no training file may duplicate (default: DATA_DIR/realproj when it exists)",
    )
    real.add_argument("--no-realproj", action="store_true", help="compare against no reference tree")
    # Defaults None: training.embedded's own (imported only when the command runs: it pulls in torch).
    real.add_argument(
        "--holdout-projects",
        default=None,
        help="comma-separated owner/name projects held out whole "
        "(default: ggml-org/ggml,NVIDIA/CUDALibrarySamples)",
    )
    real.add_argument(
        "--heldout-projects-extra", type=int, default=0, help="hold out N more projects, seeded picks"
    )
    real.add_argument(
        "--heldout-file-fraction",
        type=float,
        default=None,
        help="fraction of the other projects' files held out, by a seeded hash of repo:path (default 0.05)",
    )
    real.add_argument(
        "--near-duplicate-threshold",
        type=float,
        default=None,
        help="Jaccard of normalised-code shingles from which a training file duplicates a held-out one "
        "(default 0.8)",
    )
    real.add_argument(
        "--holes-per-kb",
        type=float,
        default=None,
        help="infill holes per 1,000 bytes of a file (default 0.667: one per 1.5 KB)",
    )
    real.add_argument(
        "--max-holes-per-file", type=int, default=None, help="at most this many holes per file (default 24)"
    )
    real.add_argument(
        "--window-bytes",
        default=None,
        help="MIN,MAX: each example's budget for 2*prefix+suffix bytes is drawn in this range "
        "(default 1500,6000)",
    )
    real.add_argument("--workers", type=int, default=0, help="processes cutting holes (0: one per CPU)")


def _corpus_config(args: argparse.Namespace):  # -> training.embedded.EmbeddedConfig
    from training.embedded import EmbeddedConfig, HoleConfig, SplitConfig

    data = args.data_dir
    if data is not None and not data.is_dir():
        raise CliError(f"--data-dir {data}: data folder not found")
    if not args.no_kernelbench and data is None:
        raise CliError("--data-dir is needed for the KernelBench sources (or give --no-kernelbench)")
    cuda = None if args.no_cuda_corpus else args.cuda_corpus
    if cuda is not None and not cuda.exists():
        raise CliError(f"--cuda-corpus {cuda}: not found")
    if cuda is None and not args.no_cuda_corpus and data is not None and (data / "cuda-corpus").is_dir():
        cuda = data / "cuda-corpus"
    trees: tuple[Path, ...] = ()
    if not args.no_realproj:
        if args.realproj is not None and not args.realproj.is_dir():
            raise CliError(f"--realproj {args.realproj}: folder not found")
        tree = args.realproj or (data / "realproj" if data is not None else None)
        trees = (tree,) if tree is not None and tree.is_dir() else ()
    split: dict = {"extra_projects": args.heldout_projects_extra}
    if args.holdout_projects is not None:
        split["holdout_projects"] = tuple(p.strip() for p in args.holdout_projects.split(",") if p.strip())
    if args.heldout_file_fraction is not None:
        split["file_fraction"] = args.heldout_file_fraction
    if args.near_duplicate_threshold is not None:
        split["threshold"] = args.near_duplicate_threshold
    holes: dict = {}
    if args.holes_per_kb is not None:
        holes["holes_per_kb"] = args.holes_per_kb
    if args.max_holes_per_file is not None:
        holes["max_holes"] = args.max_holes_per_file
    if args.window_bytes is not None:
        try:
            lo, hi = (int(v) for v in args.window_bytes.split(","))
        except ValueError as exc:
            raise CliError(f"--window-bytes {args.window_bytes!r}: expected MIN,MAX in bytes") from exc
        holes["window"] = (lo, hi)
    return EmbeddedConfig(
        args.out,
        data_dir=data,
        seed=args.seed,
        kernelbench=not args.no_kernelbench,
        heldout_fraction=args.heldout_fraction,
        cu_variants=args.cu_variants,
        cuda_corpus=cuda,
        reference_trees=trees,
        split=SplitConfig(**split),
        holes=HoleConfig(**holes),
        workers=args.workers,
    )


def run_corpus(args: argparse.Namespace) -> int:
    from training.embedded import build_embedded_corpus

    if args.model_template:
        check_input_file(args.model_template, what="config template", max_bytes=safeio.CONFIG_LIMIT)
    cfg = _corpus_config(args)
    try:
        cfg.validate()
        stats = build_embedded_corpus(cfg)
    except (ValueError, FileNotFoundError) as exc:  # ReadError is a ValueError
        raise CliError(str(exc)) from exc
    if args.tokenizer_vocab:
        from training.tokenizer import read_text_chunks, train_bpe

        ids = train_bpe(
            read_text_chunks(args.out / "tokenizer_text.txt"), args.tokenizer_vocab, args.out / "tokenizer"
        )
        stats["tokenizer"] = ids
        if stats.get("cuda_corpus"):
            # the real-code holes are cut as whole lines: a model trained on them is prompted so
            # (engine.model_settings; the file travels with the tokenizer into every checkpoint)
            from engine.model_settings import MODEL_SETTINGS_FILE

            settings = json.dumps({"infill_holes": "line"}, indent=2) + "\n"
            (args.out / "tokenizer" / MODEL_SETTINGS_FILE).write_text(settings, encoding="utf-8")
        if args.model_template:
            from training.tokenizer import write_model_config

            write_model_config(args.model_template, args.out / "tokenizer", args.out / "init_config.json")
    real = stats.get("cuda_corpus")
    if real is not None:  # the lists are in corpus_stats.json and split.json
        stats["cuda_corpus"] = {
            k: v for k, v in real.items() if k not in ("dropped_as_duplicate", "per_project")
        }
    stats.pop("heldout_groups", None)
    print_json(stats, indent=2)
    return 0


def run_pack(args: argparse.Namespace) -> int:
    from engine.tokenizer import load_tokenizer
    from training.corpus import read_code_texts, read_examples, tokenize_and_pack

    check_input_file(args.examples, what="examples file", max_bytes=safeio.DATA_LIMIT)
    for path in args.code_files:
        check_input_file(path, what="code files", max_bytes=safeio.DATA_LIMIT)
    try:
        examples = read_examples(args.examples)
        code_texts = [text for path in args.code_files for text in read_code_texts(path)]
    except (ValueError, OSError) as exc:  # bad JSON, a record without its fields, a broken .gz
        raise CliError(f"cannot read the data: {exc}") from exc
    rows, stats = tokenize_and_pack(
        examples,
        load_tokenizer(args.tokenizer),
        seq_len=args.seq_len,
        block_size=args.block_size,
        code_texts=code_texts,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows.save(args.out)
    print_json(stats, indent=2)
    return 0


def run_sft(args: argparse.Namespace) -> int:
    from training.config import SFTConfig
    from training.sft import main

    cfg = SFTConfig.from_args(args)
    try:
        cfg.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    summary = main(cfg)
    print_json(summary, indent=2)
    return 0


def run_rl(args: argparse.Namespace) -> int:
    from training.rl.config import RLConfig

    cfg = RLConfig.from_args(args)
    try:
        cfg.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if not Path(cfg.model).is_dir():
        raise CliError(f"--model {cfg.model}: checkpoint folder not found")
    for path in [*cfg.tasks, *([cfg.eval_tasks] if cfg.eval_tasks else [])]:
        check_input_file(Path(path), what="task file", max_bytes=safeio.DATA_LIMIT)
    from training.rl.tasks import TaskFileError
    from training.rl.trainer import RLSetupError, main

    try:
        summary = main(cfg)
    except (TaskFileError, RLSetupError) as exc:
        raise CliError(str(exc)) from exc
    print_json(summary, indent=2)
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from training.evaluate import evaluate_heldout

    if not args.model.is_dir():
        raise CliError(f"{args.model}: checkpoint folder not found")
    check_input_file(args.heldout, what="held-out file", max_bytes=safeio.DATA_LIMIT)
    result = evaluate_heldout(
        args.model,
        args.heldout,
        seq_len=args.seq_len,
        max_infill=args.max_infill,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(safeio.dumps_strict(result, indent=2) + "\n")
    print_json(result["summary"], indent=2)
    return 0
