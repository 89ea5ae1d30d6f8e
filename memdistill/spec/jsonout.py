"""Recovering JSON from raw model output, shared by every task parser.

Small models and teachers alike wrap JSON in think blocks, code fences and prose, and outputs get cut
at max_tokens. Nothing here raises on model output: every function returns what it could recover and
the `Problem`s it met.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

_DECODER = json.JSONDecoder()
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*[ \t]*\n?(.*?)(?:```|\Z)", re.S)
# How many candidate start positions to try before giving up on prose full of braces.
_MAX_STARTS = 32


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a model output. `code` is stable (tests and reports count by it)."""

    code: str
    detail: str = ""
    index: int | None = None  # position of the offending record, when there is one

    def to_json(self) -> dict:
        d = asdict(self)
        if d["index"] is None:
            del d["index"]
        return d


def strip_wrappers(raw: str) -> tuple[str, list[Problem]]:
    """Remove think blocks and code fences; report what was removed when it matters."""
    problems: list[Problem] = []
    text = _THINK.sub("", raw)
    low = text.lower()
    if "<think>" in low:
        # Thinking never closed (cut at max_tokens, or a thinking model left on): whatever JSON the
        # model wrote inside is still worth a try, so only the tag goes.
        problems.append(Problem("unterminated_think", "a <think> block was never closed"))
        text = re.sub(r"<think>", "", text, flags=re.I)
    elif "</think>" in low:
        # Templates that pre-fill "<think>" leave only the closing tag in the completion.
        text = text[low.rindex("</think>") + len("</think>") :]
    if "```" in text:
        for body in _FENCE.findall(text):
            if "{" in body or "[" in body:
                text = body
                break
    return text.strip(), problems


def _starts(text: str, opening: str) -> list[int]:
    return [m.start() for m in re.finditer(re.escape(opening), text)][:_MAX_STARTS]


def load_json(raw: str | None, list_key: str | None = None, expect: type = dict) -> tuple[object | None, list[Problem]]:
    """Find the JSON value in `raw`.

    `expect` is the top-level type the task wants (dict or list). With `list_key`, a truncated output
    is salvaged: the complete items of the list under that key (or of a bare top-level list) are
    kept, as `{list_key: [...]}`.
    """
    if raw is None or not raw.strip():
        return None, [Problem("empty_output", "the model returned nothing")]
    text, problems = strip_wrappers(raw)
    if not text:
        return None, problems + [Problem("empty_output", "nothing left after removing think blocks and fences")]

    starts = sorted(_starts(text, "{") + _starts(text, "["))
    for start in starts:
        # A start nested inside an earlier, unparseable bracket is a fragment of that value (a
        # record of a cut-off list), not the answer: only top-level starts count.
        if _depth(text[:start]):
            continue
        try:
            value, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if not isinstance(value, (dict, list)):
            continue
        if text[:start].strip() or text[end:].strip():
            problems.append(Problem("prose_around_json", "text before or after the JSON was ignored"))
        if list_key and isinstance(value, list) and expect is dict:
            problems.append(Problem("bare_list", f"a bare list was taken as {list_key!r}"))
            value = {list_key: value}
        return value, problems

    if list_key:
        items, found = _salvage_items(text, list_key)
        if found:
            problems.append(Problem("truncated_output", f"output ends mid-JSON; kept {len(items)} complete item(s)"))
            return {list_key: items}, problems
    kind = "invalid_json" if starts else "no_json"
    detail = "the JSON does not parse (cut off or malformed)" if starts else "no JSON object in the output"
    return None, problems + [Problem(kind, detail)]


def _depth(prefix: str) -> int:
    return prefix.count("{") + prefix.count("[") - prefix.count("}") - prefix.count("]")


def _salvage_items(text: str, list_key: str) -> tuple[list, bool]:
    """Decode the complete items of the (cut-off) list under `list_key`, in order."""
    m = re.search(r'"%s"\s*:\s*\[' % re.escape(list_key), text)
    if m:
        pos = m.end()
    else:
        stripped = text.lstrip()
        if not stripped.startswith("["):
            return [], False
        pos = len(text) - len(stripped) + 1
    items = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            item, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if isinstance(item, (int, float)) and not text[pos:].strip():
            break  # a number at the very end may itself be cut ("3" of "30")
        items.append(item)
    return items, True


# --- value normalisation shared by the task parsers -------------------------------------------

_KW_SPLIT = re.compile(r"[,;|\n]")


def norm_str(value) -> str:
    """A string field: None -> "", numbers -> str, whitespace trimmed."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(norm_str(v) for v in value if norm_str(v))
    return str(value).strip()


def norm_keywords(value) -> tuple[list[str], list[str]]:
    """Keywords as a clean list: a string is split, items trimmed, empties and case-duplicates dropped.

    Returns (keywords, notes) where notes name what was repaired.
    """
    notes = []
    if value is None:
        return [], notes
    if isinstance(value, str):
        notes.append("keywords given as a string were split")
        value = _KW_SPLIT.split(value)
    elif not isinstance(value, (list, tuple)):
        notes.append(f"keywords of type {type(value).__name__} were replaced by []")
        return [], notes
    out, seen = [], set()
    for kw in value:
        kw = norm_str(kw).strip(" .\"'")
        if kw and kw.lower() not in seen:
            seen.add(kw.lower())
            out.append(kw)
    if len(out) != len(value):
        notes.append("empty or duplicate keywords were dropped")
    return out, notes


def norm_bool(value) -> bool | None:
    """true/false from a bool, 0/1, or yes/no/true/false strings; None when it is none of these."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "yes", "y", "1"):
            return True
        if v in ("false", "no", "n", "0", ""):
            return False
    return None
