"""JSONL and JSON files: one reader (errors name file:line) and writers that never leave half a file.

Readers skip blank lines. Writers go through a temporary file and `os.replace`, so a kill leaves the old
file or the new one, never a mix; `append_jsonl` is for logs that grow one record at a time (a kill
loses at most the record being written, and readers that tolerate a torn last line recover).
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class JsonlError(ValueError):
    pass


def read_jsonl(path, error: type[Exception] = JsonlError, missing_ok: bool = False) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; a line that is not a JSON object raises `error`
    naming the file and line."""
    path = Path(path)
    if not path.exists():
        if missing_ok:
            return
        raise error(f"{path}: no such file")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise error(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def load_jsonl(path, error: type[Exception] = JsonlError, missing_ok: bool = False) -> list[dict]:
    return [row for _, row in read_jsonl(path, error, missing_ok)]


def _dumps(row) -> str:
    return json.dumps(row, ensure_ascii=False) + "\n"


def write_text(path, text: str) -> None:
    """Replace `path` with `text` atomically (a temporary file beside it, then os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path, obj, indent: int = 1) -> None:
    write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def write_jsonl(path, rows) -> None:
    write_text(path, "".join(_dumps(r) for r in rows))


def append_jsonl(path, rows, fsync: bool = False) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.writelines(_dumps(r) for r in rows)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


@contextmanager
def atomic_dir(out):
    """Build a directory under a temporary name and move it into place only when the block succeeds:
    a model directory is either complete or absent."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    if out.is_symlink():
        out.unlink()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def recover_log(path, error: type[Exception] = JsonlError) -> list[dict]:
    """The records of an append-only JSONL log. A kill mid-write leaves half a last line: that record
    was never finished, so it is cut off (and redone by the caller); any other bad line is an error."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        os.truncate(path, end)
    return load_jsonl(path, error)


def require_dataset(path, data_config: str) -> Path:
    """A training job's input file; missing, it is an error that names the build (jobs never start one)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"{p}: no such dataset; build it first with `memdistill data --config {data_config}` "
            f"(`make data` builds the default one)"
        )
    return p
