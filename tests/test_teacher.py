"""The teacher client against the fake OpenAI-compatible server (real HTTP on loopback) with faults."""

import asyncio
import time
from email.utils import formatdate

import pytest

from memdistill.data.fake_teacher import FakeOpenAI, content_hash
from memdistill.data.teacher import (
    ConfigError,
    Teacher,
    TeacherError,
    TeacherFatal,
    retry_after_seconds,
    settings_from_dict,
)
from memdistill.spec import extractor, planner
from memdistill.spec.render import CHAT_TEMPLATE_KWARGS

KEY = "sk-teacher-test-0123456789"


def _settings(urls, **kw):
    base = {
        "base_urls": urls if isinstance(urls, list) else [urls],
        "model": "fake-teacher",
        "concurrency": 4,
        "timeout_s": 0.6,
        "max_retries": 5,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
    }
    return settings_from_dict(base | kw)


def _msgs(k: int) -> list[dict]:
    return planner.chat_messages(f"Which hiking trails did Maya try in spring number {k}?", "teacher")


def _run(settings, cache_dir, coro_fn, api_key=KEY):
    async def main():
        async with Teacher(settings, cache_dir, api_key=api_key) as t:
            return await coro_fn(t), t.stats

    return asyncio.run(main())


def test_every_fault_is_retried_until_an_answer(tmp_path):
    with FakeOpenAI(api_key=KEY, hang_s=2.0, retry_after="0.4") as fake:
        for i, f in enumerate(["429", "500", "hang", "drop", "bad_body", "503"]):
            fake.add_fault(f, index=i)
        t0 = time.time()
        reply, stats = _run(
            _settings(fake.url, concurrency=1, max_retries=6),
            tmp_path,
            lambda t: t.complete(_msgs(0), planner.json_schema(), "plan"),
        )
        assert time.time() - t0 >= 0.4 + 0.6  # waited out Retry-After and the client timeout
        assert fake.requests == 7 and stats.requests == 7 and stats.retries == 6
        assert dict(stats.retry_codes) == {
            "http_429": 1,
            "http_500": 1,
            "timeout": 1,
            "connection": 1,
            "bad_response": 1,
            "http_503": 1,
        }
        assert planner.parse(reply.text).ok and reply.prompt_tokens > 0 and not reply.cached


def test_retries_run_out_and_client_errors_are_not_retried(tmp_path):
    with FakeOpenAI() as fake:
        fake.add_fault("500", content=_msgs(1), times=None)
        fake.add_fault("400", content=_msgs(2), times=None)

        async def both(t):
            out = []
            for k in (1, 2):
                with pytest.raises(TeacherError) as e:
                    await t.complete(_msgs(k))
                out.append(e.value.code)
            return out

        codes, stats = _run(_settings(fake.url, max_retries=2), tmp_path, both)
        assert codes == ["http_500", "http_400"]
        assert fake.requests == 3 + 1  # 500: first try + 2 retries; 400: once
        assert dict(stats.failures) == {"http_500": 1, "http_400": 1}


def test_a_wrong_key_stops_the_job_without_showing_the_key(tmp_path):
    with FakeOpenAI(api_key=KEY) as fake:
        with pytest.raises(TeacherFatal) as e:
            _run(_settings(fake.url), tmp_path, lambda t: t.complete(_msgs(0)), api_key="sk-wrong-key-987654")
        assert e.value.code == "http_401" and fake.requests == 1
        assert "sk-wrong-key-987654" not in str(e.value)


def test_cache_is_content_addressed_and_shared_across_endpoints(tmp_path):
    with FakeOpenAI(api_key=KEY) as a, FakeOpenAI(api_key=KEY) as b:
        first, _ = _run(_settings(a.url), tmp_path, lambda t: t.complete(_msgs(0), max_tokens=64))
        # another URL, same request: the URL is not part of the key
        again, stats = _run(_settings(b.url), tmp_path, lambda t: t.complete(_msgs(0), max_tokens=64))
        assert again.cached and again.text == first.text and stats.requests == 0 and b.requests == 0
        # a different generation parameter is a different request
        _run(_settings(b.url), tmp_path, lambda t: t.complete(_msgs(0), max_tokens=65))
        assert b.requests == 1
    for f in tmp_path.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert KEY.encode() not in data and b"127.0.0.1" not in data, f


def test_identical_requests_in_flight_are_sent_once(tmp_path):
    with FakeOpenAI(latency=0.2) as fake:
        replies, stats = _run(
            _settings(fake.url, concurrency=8),
            tmp_path,
            lambda t: asyncio.gather(*(t.complete(_msgs(0)) for _ in range(5))),
        )
        assert fake.requests == 1 and len({r.text for r in replies}) == 1
        assert sum(r.cached for r in replies) == 4 and stats.cache_hits == 4


def test_concurrency_is_bounded_and_spread_over_endpoints(tmp_path):
    with FakeOpenAI(latency=0.15) as a, FakeOpenAI(latency=0.15) as b:
        # a generous timeout: on a loaded CI machine the default 0.6 s let one request time out and be
        # retried, which is the retry path's business, not this test's
        _, stats = _run(
            _settings([a.url, b.url], concurrency=4, timeout_s=30.0),
            tmp_path,
            lambda t: asyncio.gather(*(t.complete(_msgs(k)) for k in range(16))),
        )
        assert stats.retries == 0 and a.requests + b.requests == 16 and a.requests >= 6 and b.requests >= 6
        assert a.max_inflight + b.max_inflight <= 4 + 1 and max(a.max_inflight, b.max_inflight) >= 2


def test_a_dead_endpoint_is_routed_around(tmp_path):
    with FakeOpenAI() as live:
        dead = FakeOpenAI().start()
        dead_url = dead.url
        dead.stop()  # connection refused from now on
        replies, stats = _run(
            _settings([dead_url, live.url], concurrency=2),
            tmp_path,
            lambda t: asyncio.gather(*(t.complete(_msgs(k)) for k in range(8))),
        )
        assert len(replies) == 8 and live.requests == 8
        assert stats.retry_codes["connection"] <= 2  # after one refusal the endpoint sits out its cool-down


@pytest.mark.parametrize("structured, no_think", [("json_schema", True), ("json_object", True), ("none", False)])
def test_request_body(tmp_path, structured, no_think):
    with FakeOpenAI(api_key=KEY) as fake:
        _run(
            _settings(fake.url, structured=structured, qwen3_no_think=no_think, max_tokens=99),
            tmp_path,
            lambda t: t.complete(_msgs(0), extractor.json_schema(), "memories"),
        )
        body = fake.log[0]["body"]
    assert body["model"] == "fake-teacher" and body["max_tokens"] == 99 and body["temperature"] == 0.0
    assert content_hash(body["messages"]) == content_hash(_msgs(0))
    if structured == "json_schema":
        assert body["response_format"]["type"] == "json_schema"
        assert body["response_format"]["json_schema"]["schema"] == extractor.json_schema()
    elif structured == "json_object":
        assert body["response_format"] == {"type": "json_object"}
    else:
        assert "response_format" not in body
    assert body.get("chat_template_kwargs") == (CHAT_TEMPLATE_KWARGS if no_think else None)


def test_settings_are_validated(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['modle'\]"):
        settings_from_dict({"base_urls": ["http://x/v1"], "modle": "m"})
    with pytest.raises(ConfigError, match="never put an API key in a config"):
        settings_from_dict({"base_urls": ["http://x/v1"], "model": "m", "api_key": "sk-1"})
    with pytest.raises(ConfigError, match="structured 'xml'"):
        settings_from_dict({"base_urls": ["http://x/v1"], "model": "m", "structured": "xml"})
    with pytest.raises(ConfigError, match="base_urls"):
        settings_from_dict({"base_urls": ["x"], "model": "m"})
    monkeypatch.delenv("MEMDISTILL_NO_SUCH_KEY", raising=False)
    s = settings_from_dict({"base_urls": ["http://x/v1"], "model": "m", "api_key_env": "MEMDISTILL_NO_SUCH_KEY"})
    with pytest.raises(ConfigError, match="MEMDISTILL_NO_SUCH_KEY"):
        Teacher(s, tmp_path)


def test_retry_after_forms():
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(None) is None
    assert 8 <= retry_after_seconds(formatdate(time.time() + 10, usegmt=True)) <= 10
    assert retry_after_seconds("soon") is None


def test_teacher_configs_parse():
    import yaml

    from tests.conftest import REPO

    for path in sorted((REPO / "configs/data_gen").glob("teacher_*.yaml")):
        s = settings_from_dict(yaml.safe_load(path.read_text())["teacher"], str(path))
        assert s.base_urls and s.model and s.api_key_env, path
