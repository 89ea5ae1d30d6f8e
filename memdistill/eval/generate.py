"""Generating from a model for evaluation: in-process (HF transformers) or served (vLLM).

Both render prompts through the shared path (memdistill.spec.render: the HF generator calls it, vLLM applies
the same chat template with the same kwargs) and return the raw text plus prompt and output token
counts, so metrics can charge tokens per window. On CPU the served path is several times faster
(continuous batching); the in-process one needs no server.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from memdistill.core.io import append_jsonl, recover_log
from memdistill.spec.render import prompt_ids


@dataclass
class Generation:
    text: str
    prompt_tokens: int
    output_tokens: int


class HFGenerator:
    def __init__(self, model: str, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from memdistill.core.models import model_path

        path = model_path(model)
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id

    def __call__(
        self, conversations: list[list[dict]], max_new_tokens: int = 512, batch_size: int = 8, progress=None, sink=None
    ) -> list[Generation]:
        """Greedy generation for each chat (system + user messages), batched by prompt length;
        `sink(i, generation)` sees each one as it finishes."""
        import torch

        ids = [prompt_ids(self.tok, msgs) for msgs in conversations]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[Generation | None] = [None] * len(ids)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            width = max(len(ids[i]) for i in batch)
            # left padding keeps every prompt's last token at the same position for generation
            input_ids = torch.tensor([[self.pad] * (width - len(ids[i])) + ids[i] for i in batch])
            attn = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in batch])
            with torch.no_grad():
                gen = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=attn,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=self.pad,
                    eos_token_id=self.tok.eos_token_id,
                )
            for row, i in zip(gen[:, width:], batch):
                toks = row.tolist()
                n = next((k + 1 for k, t in enumerate(toks) if t == self.tok.eos_token_id), len(toks))
                out[i] = Generation(self.tok.decode(toks[:n], skip_special_tokens=True), len(ids[i]), n)
                if sink is not None:
                    sink(i, out[i])
            if progress is not None:
                progress.update(len(batch))
        return out


DEFAULT_SERVE_CONFIG = "configs/serving/cpu.yaml"


def private_serve_config(
    serve_config: str = DEFAULT_SERVE_CONFIG, model: str | None = None, max_model_len: int | None = None, overrides=()
):
    """The ServeConfig of a server an evaluation job starts for itself: how `serve_config` runs the model
    (dtype, tensor / data parallel, replicas, GPU memory, extra args), with `overrides` (key=value) on
    top; then the job's model and context length, a free local port, and no API key (it listens on
    127.0.0.1 for this process alone, whose client sends none). A relative path is read from the checkout."""
    from memdistill.core.config import load_config
    from memdistill.core.models import REPO
    from memdistill.serve.server import ServeConfig, free_port

    path = Path(serve_config)
    path = path if path.is_absolute() or path.exists() else REPO / path
    own = [f"port={free_port()}", "host=127.0.0.1", "api_key_env=null"]
    own += [f"extractor={model}", f"fallback_extractor={model}"] if model else []
    own += [f"max_model_len={max_model_len}"] if max_model_len else []
    return load_config(ServeConfig, path, [*overrides, *own])


class VLLMGenerator:
    """Starts a private vLLM server for `model` (use as a context manager) and generates through it.
    `serve_config` says how (configs/serving/gpu.yaml: bf16 on GPUs); `max_model_len` is the job's."""

    def __init__(
        self,
        model: str,
        structured: bool = False,
        concurrency: int = 16,
        max_model_len: int = 4096,
        serve_config: str = DEFAULT_SERVE_CONFIG,
        serve_overrides=(),
    ):
        from memdistill.serve.server import Servers

        cfg = private_serve_config(serve_config, model, max_model_len, serve_overrides)
        self.servers = Servers(cfg, log_dir=tempfile.mkdtemp(prefix="eval-vllm-"))
        self.structured, self.concurrency = structured, concurrency

    def __enter__(self):
        from memdistill.serve.client import MemoryModels

        self.servers.start()
        # every replica the serving config starts, round-robin
        self.client = MemoryModels(
            [f"{u}/v1" for u in self.servers.urls], structured=self.structured, timeout=1800, max_retries=1
        )
        return self

    def __exit__(self, *exc):
        self.servers.stop()

    def __call__(
        self,
        conversations: list[list[dict]],
        max_new_tokens: int = 512,
        progress=None,
        schema: dict | list | None = None,
        sink=None,
    ) -> list[Generation]:
        """`schema` (one for all, or a list with one per conversation) constrains decoding only when the
        generator was made with structured=True; `sink(i, generation)` sees each one as it finishes."""
        from concurrent.futures import ThreadPoolExecutor

        schemas = schema if isinstance(schema, list) else [schema] * len(conversations)

        def one(i, msgs, sch):
            gen = Generation(*self.client.chat(msgs, sch, "output", max_tokens=max_new_tokens))
            if progress is not None:
                progress.update(1)
            if sink is not None:
                sink(i, gen)
            return gen

        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(one, range(len(conversations)), conversations, schemas))


def model_fingerprint(model: str) -> str:
    """Names a model's weights: a retrained or re-merged directory gets a new fingerprint."""
    p = Path(model)
    if not p.is_dir():
        return model
    files = sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin")) + [p / "config.json"]
    return model + ":" + ",".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.exists())


class GenerationCache:
    """Append-only log of finished generations, flushed one at a time: an eval killed midway redoes only
    the prompts that had not finished, and a rerun on unchanged models generates nothing."""

    def __init__(self, path: str | Path, model: str, **params):
        self.path, self.lock = Path(path), threading.Lock()
        self.prefix = json.dumps([model_fingerprint(model), params], sort_keys=True)
        self.rows: dict[str, Generation] = {}
        # a line cut short by a kill is dropped: that prompt is simply generated again
        for row in recover_log(self.path):
            self.rows[row["key"]] = Generation(row["text"], row["prompt_tokens"], row["output_tokens"])

    def key(self, messages: list[dict], max_new_tokens: int, schema) -> str:
        blob = json.dumps([self.prefix, messages, max_new_tokens, schema], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> Generation | None:
        return self.rows.get(key)

    def put(self, key: str, gen: Generation) -> None:
        with self.lock:
            self.rows[key] = gen
            append_jsonl(self.path, [{"key": key, **asdict(gen)}])
