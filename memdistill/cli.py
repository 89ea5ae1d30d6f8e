"""`memdistill` command line: one subcommand per job.

memdistill windows --format locomo|longmemeval|chat-jsonl|seed PATH [--model DIR] [--window W --overlap O]
memdistill parse --model extractor [--window FILE]  < raw_model_output
memdistill models                                   materialise the embedded default models
memdistill check-seed [DIR]                         validate the gold corpus, print statistics
memdistill data --config configs/data/seed.yaml [key=value ...]
memdistill data --config configs/data/teacher_vllm_qwen3.yaml   label with a teacher, then build
memdistill train extractor --config configs/training/extractor_cpu.yaml [key=value ...]
memdistill train router|planner|gate|consolidator|segmenter|querytyper --config configs/training/<task>_cpu.yaml
memdistill train summarizer --config configs/training/summarizer_cpu.yaml
memdistill merge --config configs/training/merge_cpu.yaml [key=value ...]
memdistill eval --config configs/eval/extractor_cpu.yaml [key=value ...]
memdistill eval-fidelity --config configs/eval/fidelity_cpu.yaml [key=value ...]
memdistill eval-encoders --config configs/eval/encoders_cpu.yaml [key=value ...]
memdistill eval-typing --config configs/eval/typing_cpu.yaml [key=value ...]
memdistill eval-e2e --config configs/eval/e2e_cpu.yaml [key=value ...]
memdistill eval-mem0 --config configs/eval/mem0_cpu.yaml [key=value ...]
memdistill ablate --config configs/eval/ablate_extractor_cpu.yaml [key=value ...]
memdistill serve --config configs/serving/cpu.yaml [key=value ...]
memdistill front [--config FILE] [key=value ...]          (started by `serve`; alone over any served extractor)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path


class UsageError(Exception):
    pass


def _windows(args) -> int:
    from memdistill.core.models import trained_windows
    from memdistill.data.sources import SourceError, load
    from memdistill.spec.dialogue import choose_window, windows

    trained = None
    if args.model:
        if not Path(args.model).is_dir():
            raise UsageError(f"--model {args.model}: no such model directory")
        trained = trained_windows(args.model)
        if trained is None:
            raise UsageError(f"--model {args.model}: no training windows in its metadata (memdistill.json)")
    try:
        convs = load(args.format, args.path)
    except SourceError as e:
        print(f"memdistill windows: {e}", file=sys.stderr)
        return 1
    noted = set()
    for conv in convs:
        size, overlap, note = choose_window(conv.style, trained, args.window, args.overlap)
        if note and args.model and note not in noted:  # without --model the presets are the documented default
            noted.add(note)
            print(f"memdistill windows: {note}", file=sys.stderr)
        try:
            ws = windows(conv, size, overlap)
        except ValueError as e:
            raise UsageError(str(e)) from None
        for w in ws:
            sys.stdout.write(json.dumps(w.to_json(), ensure_ascii=False) + "\n")
    return 0


def _parse(args) -> int:
    from memdistill.spec import MODELS
    from memdistill.spec.dialogue import Window

    raw, m = sys.stdin.read(), MODELS[args.model]
    if m.unit == "window":
        window = None
        if args.window:
            try:
                with open(args.window, encoding="utf-8") as f:
                    line = next((ln for ln in f if ln.strip()), None)
                if line is None:
                    raise UsageError(f"--window {args.window}: file is empty")
                window = Window.from_json(json.loads(line))
            except OSError as e:
                raise UsageError(f"--window {args.window}: {e.strerror}") from None
            except (json.JSONDecodeError, KeyError, ValueError) as e:
                raise UsageError(f"--window {args.window}: not a window line from `memdistill windows` ({e})") from None
        result = m.parse(raw, window)
    else:
        if args.window:
            raise UsageError("--window only applies to a model that reads windows (extractor)")
        result = m.parse(raw)
    print(json.dumps(result.to_json(), ensure_ascii=False))
    return 0


def _models(args) -> int:
    from memdistill.core.models import materialise

    for name, path in materialise(force=args.force).items():
        print(f"{name}: {path}")
    return 0


def _check_seed(args) -> int:
    from memdistill.data.seed import check

    report = check(args.dir)
    print(report.render())
    return 0 if report.ok else 1


def _job(module: str, **kwargs):
    def run(args) -> int:
        import importlib

        # the job's own parser answers --help: it lists every setting with its type, default and comment
        argv = ["--help"] if args.help else (["--config", args.config] if args.config else []) + list(args.overrides)
        return importlib.import_module(module).main(argv, **kwargs)

    return run


def build_parser() -> argparse.ArgumentParser:
    from memdistill.spec import MODELS, NAMES, TRAINING_SETS

    p = argparse.ArgumentParser(prog="memdistill", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    w = sub.add_parser("windows", help="render overlapping extraction windows as JSONL on stdout")
    w.add_argument("--format", required=True, choices=["locomo", "longmemeval", "chat-jsonl", "seed", "hf"])
    w.add_argument("path")
    w.add_argument(
        "--model", help="a trained extractor directory (merged model or run): default to the windows it was trained on"
    )
    w.add_argument(
        "--window",
        type=int,
        help="messages per window (default: the model's training window, else the "
        "paper presets, 25 multi-party and 15 user-assistant)",
    )
    w.add_argument(
        "--overlap",
        type=int,
        help="context messages repeated at the start of each window (default: the model's, else 5 / 3)",
    )
    w.set_defaults(func=_windows)

    pa = sub.add_parser("parse", help="parse a raw model output from stdin into validated records + problems")
    pa.add_argument("--model", required=True, choices=NAMES)
    pa.add_argument("--window", help="a file whose first line is one window from `memdistill windows`")
    pa.set_defaults(func=_parse)

    m = sub.add_parser("models", help="materialise the embedded default models under .cache/models")
    m.add_argument("--force", action="store_true", help="rebuild even if present")
    m.set_defaults(func=_models)

    jobs = [
        ("data", "build training sets (gold corpus or teacher labels)", _job("memdistill.data.build")),
        ("merge", "merge a trained adapter and export a servable model", _job("memdistill.train.merge")),
        ("eval", "compare extractors on the gold test split", _job("memdistill.eval.extractor")),
        (
            "eval-fidelity",
            "a student extractor against its teacher (endpoint or labels file) on held-out windows, no gold needed",
            _job("memdistill.eval.fidelity"),
        ),
        (
            "eval-encoders",
            "router, planner, gate and consolidator vs the served LM and rules on the gold test split",
            _job("memdistill.eval.encoders"),
        ),
        ("eval-e2e", "memory banks + retrieval (+ QA and judge) end to end", _job("memdistill.eval.e2e")),
        (
            "eval-typing",
            "MemoType query typing (raw question, LM hypothetical memories, query typer) and type-scoped retrieval",
            _job("memdistill.eval.query_types"),
        ),
        (
            "eval-consolidation",
            "banks consolidated as records arrive: update efficiency, knowledge-update ranking, recall",
            _job("memdistill.eval.consolidation"),
        ),
        (
            "eval-mem0",
            "mem0's own add() / search() on the gold test split: its prompt vs the compatibility front vs raw messages",
            _job("memdistill.eval.mem0_compat"),
        ),
        ("ablate", "extractor variants built, trained and evaluated side by side", _job("memdistill.eval.ablate")),
        ("serve", "serve the models behind an OpenAI-compatible endpoint (vLLM)", _job("memdistill.serve.server")),
        ("front", "the mem0 compatibility front alone, over a served extractor", _job("memdistill.serve.front")),
    ]
    for name, help_, func in jobs:
        j = sub.add_parser(name, help=help_, add_help=False)
        j.add_argument("-h", "--help", action="store_true", help="list the job's settings")
        j.add_argument("--config")
        j.add_argument("overrides", nargs="*", help="key=value settings that override the YAML")
        j.set_defaults(func=func)
    train = sub.add_parser("train", help="train a compact model").add_subparsers(dest="model", required=True)
    # one subcommand per training set of the spec's table: the LM's LoRA job for an LM's set (the extractor's
    # trains the query parser too), the encoder job for an encoder's
    for name in TRAINING_SETS:
        lm = MODELS[name].head == "lm"
        t = train.add_parser(name, help=f"train the {name}", add_help=False)
        t.add_argument("-h", "--help", action="store_true", help="list the job's settings")
        t.add_argument("--config")
        t.add_argument("overrides", nargs="*", help="key=value settings that override the YAML")
        t.set_defaults(func=_job("memdistill.train.extractor") if lm else _job("memdistill.train.encoder", task=name))

    c = sub.add_parser("check-seed", help="validate the gold seed corpus and print its statistics")
    c.add_argument("dir", nargs="?", default="data/seed")
    c.set_defaults(func=_check_seed)
    return p


def _terminate(signum, frame):
    """SIGTERM (a process manager, `kill`) unwinds like Ctrl-C: every `finally` and context manager runs, so
    the servers a job started are stopped, not orphaned. A second TERM while stopping is ignored."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"memdistill {getattr(args, 'command', '')}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`memdistill windows ... | head`): stop quietly, as Unix tools do; stdout is
        # pointed at devnull so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
