"""``dice train ...``: build the SFT corpus, run block-diffusion SFT, evaluate on the held-out split.

``dice train sft`` is the entry point ``accelerate launch`` runs on several processes/GPUs/nodes
(``accelerate launch --config_file training/configs/<cfg>.yaml -m dice train sft ...``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dice import safeio
from dice.commands.common import CliError, check_input_file, print_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="build the SFT corpus, run block-diffusion SFT, evaluate")
    sub = parser.add_subparsers(dest="train_command", metavar="STAGE", required=True)

    corpus = sub.add_parser(
        "corpus",
        help="build the SFT corpus (held-out split by problem) and train a BPE tokenizer on its train split",
    )
    corpus.add_argument(
        "--data-dir", type=Path, required=True, help="the shared data folder (../shared/data)"
    )
    corpus.add_argument(
        "--out", type=Path, required=True, help="output folder (train.jsonl, heldout.jsonl, ...)"
    )
    corpus.add_argument("--seed", type=int, default=0)
    corpus.add_argument(
        "--heldout-fraction",
        type=float,
        default=0.08,
        help="fraction of problems held out besides KernelBench PR-67's eval problems",
    )
    corpus.add_argument("--cu-variants", type=int, default=12, help=".cu infill examples per CUDA source")
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
    corpus.set_defaults(func=run_corpus)

    pack = sub.add_parser("pack", help="tokenise examples and pack them into block-aligned rows (.npz)")
    pack.add_argument("--examples", type=Path, required=True, help=".jsonl(.gz) from `dice train corpus`")
    pack.add_argument("--tokenizer", type=Path, required=True, help="tokenizer folder")
    pack.add_argument("--seq-len", type=int, default=4096, help="row length in tokens")
    pack.add_argument("--block-size", type=int, default=4)
    pack.add_argument("--out", type=Path, required=True, help="rows file (.npz compressed, or .safetensors)")
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


def run_corpus(args: argparse.Namespace) -> int:
    from training.corpus import CorpusConfig, build_corpus

    if not args.data_dir.is_dir():
        raise CliError(f"{args.data_dir}: data folder not found")
    if args.model_template:
        check_input_file(args.model_template, what="config template", max_bytes=safeio.CONFIG_LIMIT)
    stats = build_corpus(
        CorpusConfig(
            args.data_dir,
            args.out,
            seed=args.seed,
            heldout_fraction=args.heldout_fraction,
            cu_variants=args.cu_variants,
        )
    )
    if args.tokenizer_vocab:
        from training.tokenizer import read_text_chunks, train_bpe

        ids = train_bpe(
            read_text_chunks(args.out / "tokenizer_text.txt"), args.tokenizer_vocab, args.out / "tokenizer"
        )
        stats["tokenizer"] = ids
        if args.model_template:
            from training.tokenizer import write_model_config

            write_model_config(args.model_template, args.out / "tokenizer", args.out / "init_config.json")
    print_json(stats, indent=2)
    return 0


def run_pack(args: argparse.Namespace) -> int:
    from engine.tokenizer import load_tokenizer
    from training.corpus import read_examples, tokenize_and_pack

    check_input_file(args.examples, what="examples file", max_bytes=safeio.DATA_LIMIT)
    rows, stats = tokenize_and_pack(
        read_examples(args.examples),
        load_tokenizer(args.tokenizer),
        seq_len=args.seq_len,
        block_size=args.block_size,
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
