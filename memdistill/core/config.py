"""YAML + CLI overrides -> one config dataclass per job. Unknown keys are an error, naming the key.

A field typed as a dataclass (or `SomeDataclass | None`) takes a mapping, checked the same way
(`from_mapping`). `memdistill <job> --help` lists every key with its type, default and the comment
written beside it in the dataclass (`key_help`).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import yaml


class ConfigError(ValueError):
    pass


def coerce(name: str, tp, value, where: str):
    """Check (and for overrides given as text, convert) one value against its declared type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(name, inner[0], value, where)
    if dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else from_mapping(tp, value, f"{where}: {name}")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: {name} should be a list, got {value!r}")
        return list(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {name} should be a mapping, got {value!r}")
        return value
    if tp in (int, float, str, bool) and not (isinstance(value, tp) and not (tp is int and isinstance(value, bool))):
        raise ConfigError(f"{where}: {name} should be {tp.__name__}, got {value!r}")
    return value


def _missing(fields: dict, values: dict) -> list[str]:
    """Required fields (no default) that were given no value."""
    return [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING]  # fmt: skip


def from_mapping(cls, data, where: str):
    """A nested config dataclass from a mapping; unknown and missing keys are errors naming `where`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: should be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} (known: {', '.join(fields)})")
    hints = typing.get_type_hints(cls)
    values = {k: coerce(k, hints[k], v, where) for k, v in data.items()}
    missing = _missing(fields, values)
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing}")
    return cls(**values)


def key_help(cls) -> list[tuple[str, str, str, str]]:
    """(key, type, default, the comment written beside the field) for each field of a config dataclass."""
    import inspect
    import re

    comments: dict[str, str] = {}
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        source = ""
    pending: list[str] = []
    for line in source.splitlines():
        s = line.strip()
        if s.startswith("#"):
            pending.append(s.lstrip("# "))
            continue
        m = re.match(r"(\w+)\s*:\s*[^=]+?(?:=.*?)?(?:\s+#\s*(.*))?$", s)
        if m and not s.startswith(("def ", "class ", "@")):
            comments[m.group(1)] = " ".join(pending + ([m.group(2)] if m.group(2) else []))
        pending = []
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else f.default_factory()
            if f.default_factory is not dataclasses.MISSING
            else "(required)"
        )
        tp = getattr(hints[f.name], "__name__", None) or str(hints[f.name]).replace("typing.", "")
        out.append((f.name, tp, repr(default), comments.get(f.name, "")))
    return out


def load_config(cls, path=None, overrides=(), base: dict | None = None):
    """Build `cls` from a YAML file, then `key=value` overrides (values parsed as YAML)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict = dict(base or {})
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"{p}: no such config file")
        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping of settings")
        for k, v in data.items():
            if k not in fields:
                raise ConfigError(f"{p}: unknown key {k!r} for {cls.__name__} (known: {', '.join(sorted(fields))})")
            values[k] = coerce(k, hints[k], v, str(p))
    for item in overrides:
        k, sep, raw = item.partition("=")
        k = k.strip().lstrip("-").replace("-", "_")
        if not sep:
            raise ConfigError(f"override {item!r}: expected key=value")
        if k not in fields:
            raise ConfigError(f"override {item!r}: unknown key {k!r} for {cls.__name__}")
        values[k] = coerce(k, hints[k], yaml.safe_load(raw) if raw.strip() else "", f"override {item!r}")
    missing = _missing(fields, values)
    if missing:
        raise ConfigError(f"{path or 'config'}: missing required key(s) {missing} for {cls.__name__}")
    return cls(**values)


def env_key(env: str | None, where: str) -> str | None:
    """The secret in environment variable `env` (configs name the variable, never the key); None when no
    variable is named, a ConfigError naming `where` when it is named but unset."""
    if not env:
        return None
    import os

    if not os.environ.get(env):
        raise ConfigError(f"{where}: environment variable {env} is not set")
    return os.environ[env]


def job_config(cls, argv, prog: str, doc: str, config_required: bool = False):
    """The command line every job shares: `--config FILE` then `key=value` overrides."""
    import argparse

    keys = "\n".join(f"  {k} ({tp}, default {d}){': ' + c if c else ''}" for k, tp, d, c in key_help(cls))
    p = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"settings (YAML keys, or key=value on the command line):\n{keys}",
    )
    p.add_argument("--config", required=config_required)
    p.add_argument("overrides", nargs="*", help="key=value settings that override the YAML")
    a = p.parse_args(argv)
    return load_config(cls, a.config, a.overrides)
