"""YAML + CLI overrides -> one config dataclass per job. Unknown keys are an error, naming the key."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import yaml


class ConfigError(ValueError):
    pass


def _coerce(name: str, tp, value, where: str):
    """Check (and for overrides given as text, convert) one value against its declared type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(name, inner[0], value, where)
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
            values[k] = _coerce(k, hints[k], v, str(p))
    for item in overrides:
        k, sep, raw = item.partition("=")
        k = k.strip().lstrip("-").replace("-", "_")
        if not sep:
            raise ConfigError(f"override {item!r}: expected key=value")
        if k not in fields:
            raise ConfigError(f"override {item!r}: unknown key {k!r} for {cls.__name__}")
        values[k] = _coerce(k, hints[k], yaml.safe_load(raw) if raw.strip() else "", f"override {item!r}")
    missing = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path or 'config'}: missing required key(s) {missing} for {cls.__name__}")
    return cls(**values)


def job_config(cls, argv, prog: str, doc: str, config_required: bool = False):
    """The command line every job shares: `--config FILE` then `key=value` overrides."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--config", required=config_required)
    p.add_argument("overrides", nargs="*", help="key=value settings that override the YAML")
    a = p.parse_args(argv)
    return load_config(cls, a.config, a.overrides)
