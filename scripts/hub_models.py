"""Print the model-hub ids that job configs name; the Makefile keeps the hub offline when there are none.

  python3 scripts/hub_models.py configs/training/extractor_qwen3_4b.yaml ...   ->  Qwen/Qwen3-4B

A hub id is a top-level model setting (model, models, banks, lm, ...) whose value is not `embedded:<name>`,
a URL, the e2e banks `gold` and `turns`, null, or a local path (an existing one, or one under runs/ or
data/ not built yet); and for a merge config, the base model in <run_dir>/{adapter,model}/memdistill.json.
Standard library only: make runs it before the venv exists. Missing files are skipped.
"""

import json
import re
import sys
from pathlib import Path

KEYS = {
    "model",
    "models",
    "banks",
    "lm",
    "fallback_lm",
    "extractor",
    "fallback_extractor",
    "embedding_model",
    "token_counter",
}
LOCAL = ("embedded:", "http://", "https://", "records:", "runs/", "data/", ".", "/", "~")


def hub_models(path) -> list[str]:
    p = Path(path)
    if not p.is_file():
        return []
    found = []
    for line in p.read_text().splitlines():
        m = re.match(r"^(\w+)\s*:\s*(.*?)\s*(?:#.*)?$", line)  # top level only: nested keys are indented
        if m and m.group(1) == "run_dir":  # merge: the base model the adapter was trained on
            metas = [Path(m.group(2).strip("'\"")) / d / "memdistill.json" for d in ("adapter", "model")]
            meta = next((f for f in metas if f.is_file()), None)
            base = json.loads(meta.read_text()).get("base_model", "") if meta else ""
            found += [base] if base and not base.startswith(LOCAL) and not Path(base).exists() else []
        if not m or m.group(1) not in KEYS:
            continue
        for value in m.group(2).strip("[]").split(","):
            v = value.strip().strip("'\"")
            if v and v not in ("null", "~", "gold", "turns") and not v.startswith(LOCAL) and not Path(v).exists():
                found.append(v)
    return found


if __name__ == "__main__":
    print(" ".join(dict.fromkeys(v for a in sys.argv[1:] for v in hub_models(a))))
