"""The decoding settings of the served path. vLLM's xgrammar backend, given what memdistill starts it with
(`structured_outputs`: disable_any_whitespace), compiles the window schema exactly as below (vllm
v1/structured_output/backend_xgrammar.py: any_whitespace off, separators "," and ":"); these tests drive
that grammar with the real tokenizer and then ask the live server."""

import json

import pytest

from memdistill.data import seed as seedlib
from memdistill.serve.server import ServeConfig, vllm_command
from memdistill.spec import extractor, query_parser
from memdistill.spec.dialogue import windows
from tests.conftest import REPO

xg = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def window_grammar(smollm2_dir):
    from transformers import AutoTokenizer

    seed = seedlib.load(REPO / "data" / "seed")
    w = windows(next(iter(seed.conversations.values())), 6, 1)[1]
    compiler = xg.GrammarCompiler(xg.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(smollm2_dir)))
    schema = json.dumps(extractor.json_schema(w))
    grammar = compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    return w, grammar, extractor.render_completion(seed.gold_records(w))


def _accepts(grammar, text: str) -> bool:
    return xg.GrammarMatcher(grammar).accept_string(text)


def test_the_server_is_started_without_free_whitespace():
    cmd = vllm_command(ServeConfig(), "some/model", 8000)
    cfg = json.loads(cmd[cmd.index("--structured-outputs-config") + 1])
    assert cfg == {"backend": "xgrammar", "disable_any_whitespace": True}


def test_grammar_takes_the_compact_gold_completion_and_no_whitespace_between_tokens(window_grammar):
    _, grammar, gold = window_grammar
    assert gold.startswith('{"memories":[{') and _accepts(grammar, gold)
    for spaced in ('{ "memories"', '{\n"memories"', '{"memories" :', '{"memories":\t['):
        assert not _accepts(grammar, spaced), spaced
    assert not _accepts(grammar, gold.replace('},{"source_id"', '}, {"source_id"', 1))


def test_grammar_closes_a_looping_list_at_the_record_bound(window_grammar):
    w, grammar, gold = window_grammar
    rec = json.loads(gold)["memories"][0]
    bound = extractor.MAX_RECORDS_PER_MESSAGE * len(w.extractable())
    m = xg.GrammarMatcher(grammar)
    assert m.accept_string(json.dumps({"memories": [rec] * bound}, separators=(",", ":"))[:-2])
    assert not m.fork().accept_string(",")  # one more record is not a token the model may choose
    assert m.accept_string("]}") and m.is_completed()


def _whitespace_outside_strings(text: str) -> list[int]:
    where, in_string, escaped = [], False, False
    for i, c in enumerate(text):
        if in_string:
            escaped, in_string = (not escaped and c == "\\"), in_string and (escaped or c != '"')
        elif c == '"':
            in_string = True
        elif c.isspace():
            where.append(i)
    return where


def test_whitespace_scanner_by_hand():
    assert _whitespace_outside_strings('{"a b":"c \\" d","e":[1,2]}') == []
    assert _whitespace_outside_strings('{"a": [1, 2]}\n') == [5, 9, 13]


def test_served_structured_output_has_no_free_whitespace(mm, seed_windows):
    """The live server (configs/serving/cpu.yaml) under the window schema: whatever the untrained model
    writes, and however far it gets before the cap, no whitespace appears outside JSON strings."""
    for w in seed_windows:
        text, _, ct = mm.chat(extractor.chat_messages(w), extractor.json_schema(w), "memories", max_tokens=256)
        assert text.startswith('{"memories":[') and ct > 0
        assert _whitespace_outside_strings(text) == []


@pytest.fixture(scope="module")
def seed_windows():
    seed = seedlib.load(REPO / "data" / "seed")
    conv = next(c for c in seed.conversations.values() if c.style == "multi-party")
    return windows(conv, 3, 1)[:2]


def test_query_grammar_bounds_every_string_and_list(smollm2_dir):
    """A looping query analysis cannot run to the token cap inside one string or list: the schema's bounds
    reach the grammar vLLM decodes with (the patterned `time` included)."""
    from transformers import AutoTokenizer

    compiler = xg.GrammarCompiler(xg.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(smollm2_dir)))
    grammar = compiler.compile_json_schema(
        json.dumps(query_parser.json_schema()), any_whitespace=False, separators=(",", ":")
    )
    gold = json.dumps(seedlib.load(REPO / "data" / "seed").rows("questions", "test")[0]["query"], separators=(",", ":"))
    assert _accepts(grammar, gold)
    # vLLM answers 400 to a schema with a feature xgrammar lacks (uniqueItems, a pattern with a length bound)
    from vllm.v1.structured_output.backend_xgrammar import has_xgrammar_unsupported_json_features

    assert not has_xgrammar_unsupported_json_features(query_parser.json_schema())
    anchor = '{"query_anchor":"'
    assert _accepts(grammar, anchor + "a" * query_parser.MAX_ANCHOR_CHARS)
    assert not _accepts(grammar, anchor + "a" * (query_parser.MAX_ANCHOR_CHARS + 1))
    dim = anchor + 'x","need_assistant_context":false,"dimension":{"target_memory_type":[],'
    kws = dim + '"keywords":[' + ",".join(['"k"'] * query_parser.MAX_KEYWORDS)
    assert _accepts(grammar, kws) and not _accepts(grammar, kws + ",")
    assert not _accepts(grammar, dim + '"keywords":["' + "k" * (query_parser.MAX_KEYWORD_CHARS + 1))
    time = dim + '"keywords":[],"time":"around '
    assert _accepts(grammar, time + "1" * (query_parser.MAX_FIELD_CHARS - 7) + '"')
    assert not _accepts(grammar, time + "1" * (query_parser.MAX_FIELD_CHARS - 6))
    assert not _accepts(grammar, dim + '"keywords":[],"time":"yesterday"')  # the pattern still holds
