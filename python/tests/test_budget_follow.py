"""A budget following a provider's per-dimension fields through the httpx transports and
the aiohttp hook, against a fake model API on loopback (provider_app.py): few refusals,
hostile fields never park a client past max_hold, the turn settled from the response."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from pathlib import Path

import aiohttp
import httpx
import pytest

import paceline
import paceline.aiohttp
import paceline.httpx

sys.path.insert(0, str(Path(__file__).parent))
from provider_app import Provider  # noqa: E402

# The provider: 40 requests and 4 000 tokens a second, bursts of 10 and 2 000. A call
# estimates 200 tokens and uses 150 (tokens bind: about 27 calls a second).
RATE, TOKENS, BURST, TOKEN_BURST = 40, 4_000, 10, 2_000
ESTIMATE, USED = 200, 150


def budget() -> paceline.Budget:
    return paceline.Budget(
        requests=paceline.Rate(RATE, burst=BURST),
        tokens=paceline.Rate(TOKENS, burst=TOKEN_BURST),
        in_flight=8,
    )


def cost(request):
    return {"tokens": json.loads(request.content)["tokens"]}


def settle_from(response):
    return {"tokens": response.json()["usage"]["total_tokens"]}


@pytest.fixture
def provider(request):
    style = getattr(request, "param", "openai")
    p = Provider(style, RATE, TOKENS, BURST, TOKEN_BURST)
    yield p
    p.close()


async def async_calls(transport, url, count, tasks=8):
    statuses = []
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:

        async def worker(n):
            for _ in range(n):
                r = await client.post(url, json={"tokens": ESTIMATE})
                statuses.append(r.status_code)

        await asyncio.gather(*(worker(count // tasks) for _ in range(tasks)))
    return statuses


@pytest.mark.parametrize("provider", ["openai", "anthropic", "ietf"], indirect=True)
def test_async_httpx_books_follows_and_settles_with_few_refusals(provider):
    b = budget()
    transport = paceline.httpx.AsyncTransport(
        budget=b, cost=cost, settle_from=settle_from, retries=0
    )
    start = time.monotonic()
    statuses = asyncio.run(async_calls(transport, provider.url, 120))
    elapsed = time.monotonic() - start
    assert len(statuses) == 120
    assert provider.refusals() <= 1, provider.log
    assert b.in_flight == 0
    # Settled at 150, not booked at 200: about 27 calls a second after the burst.
    assert elapsed < 120 * USED / TOKENS + 1.0, elapsed


@pytest.mark.parametrize("provider", ["anthropic"], indirect=True)
def test_sync_httpx_in_threads(provider):
    b = budget()
    transport = paceline.httpx.Transport(budget=b, cost=cost, settle_from=settle_from, retries=0)
    statuses = []
    with httpx.Client(transport=transport, timeout=30) as client:

        def worker():
            for _ in range(20):
                statuses.append(client.post(provider.url, json={"tokens": ESTIMATE}).status_code)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(statuses) == 80
    assert provider.refusals() <= 1, provider.log
    assert b.in_flight == 0


@pytest.mark.parametrize("provider", ["ietf", "openai"], indirect=True)
def test_aiohttp_books_from_the_request_context(provider):
    b = budget()

    def aio_cost(request):
        return {"tokens": request.ctx["tokens"]}

    config = paceline.aiohttp.trace_config(
        budget=b, cost=aio_cost, settle_from=lambda r: {"tokens": USED}
    )

    async def main():
        statuses = []
        async with aiohttp.ClientSession(trace_configs=[config]) as session:

            async def worker():
                for _ in range(12):
                    async with session.post(
                        provider.url,
                        json={"tokens": ESTIMATE},
                        trace_request_ctx={"tokens": ESTIMATE},
                    ) as r:
                        body = await r.json()
                        statuses.append(r.status)
                        if r.status == 200:
                            assert body["usage"]["total_tokens"] == USED

            await asyncio.gather(*(worker() for _ in range(8)))
        return statuses

    statuses = asyncio.run(main())
    assert len(statuses) == 96
    assert provider.refusals() <= 1, provider.log
    assert b.in_flight == 0


HOSTILE = [
    ("retry-after", "999999999"),
    ("x-ratelimit-remaining-tokens", "0"),
    ("x-ratelimit-reset-tokens", "9999h"),
    ("x-ratelimit-remaining-requests", "0"),
    ("x-ratelimit-reset-requests", "99999999999999999999999h"),
    ("anthropic-ratelimit-tokens-remaining", "0"),
    ("anthropic-ratelimit-tokens-reset", "9999-12-31T23:59:59Z"),
    ("ratelimit", '"tokens";r=0;t=99999999999'),
    ("x-ratelimit-reset-requests", "NaN"),
    ("retry-after", "-1"),
]


@pytest.mark.parametrize("client", ["async", "sync", "aiohttp"])
def test_hostile_fields_never_park_past_max_hold(provider, client):
    provider.hostile, provider.hostile_count = HOSTILE, 1
    max_hold = 0.5
    b = budget()
    if client == "async":
        transport = paceline.httpx.AsyncTransport(budget=b, max_hold=max_hold, retries=0)

        async def main():
            async with httpx.AsyncClient(transport=transport, timeout=30) as c:
                for _ in range(2):
                    await c.post(provider.url, json={"tokens": 1})

        asyncio.run(main())
    elif client == "sync":
        transport = paceline.httpx.Transport(budget=b, max_hold=max_hold, retries=0)
        with httpx.Client(transport=transport, timeout=30) as c:
            for _ in range(2):
                c.post(provider.url, json={"tokens": 1})
    else:
        config = paceline.aiohttp.trace_config(budget=b, max_hold=max_hold)

        async def main():
            async with aiohttp.ClientSession(trace_configs=[config]) as s:
                for _ in range(2):
                    async with s.post(provider.url, json={"tokens": 1}) as r:
                        await r.read()

        asyncio.run(main())
    arrivals = [t for t, _ in provider.log]
    statuses = [s for _, s in provider.log]
    assert statuses == [429, 200]
    gap = arrivals[1] - arrivals[0]
    # Held (the Retry-After was followed), but for max_hold, not for decades.
    assert max_hold - 0.05 <= gap <= max_hold + 0.4, gap


def test_a_settle_from_that_raises_keeps_the_estimate_and_the_call(provider, caplog):
    b = budget()

    def broken(response):
        raise KeyError("usage")

    transport = paceline.httpx.Transport(budget=b, cost=cost, settle_from=broken)
    with caplog.at_level(logging.WARNING, logger="paceline"):
        with httpx.Client(transport=transport) as c:
            r = c.post(provider.url, json={"tokens": ESTIMATE})
    assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == USED
    assert b.in_flight == 0
    assert "settle_from failed" in caplog.text
    # The estimate was kept: 200 of the 2 000 tokens spent (give or take the refill).
    assert 1_800 <= b.remaining("tokens") < 1_900


def test_a_streamed_response_holds_its_turn_until_its_body_is_closed(provider):
    b = budget()
    seen = []

    def settle(response):
        seen.append(response.json()["usage"]["total_tokens"])
        return {"tokens": seen[-1]}

    transport = paceline.httpx.AsyncTransport(budget=b, cost=cost, settle_from=settle)

    async def main():
        async with httpx.AsyncClient(transport=transport) as c:
            async with c.stream("POST", provider.url, json={"tokens": ESTIMATE}) as r:
                assert b.in_flight == 1 and seen == []
                async for _ in r.aiter_bytes():
                    pass
            assert b.in_flight == 0 and seen == [USED]

    asyncio.run(main())


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError):
        paceline.httpx.AsyncTransport()
    with pytest.raises(TypeError):
        paceline.httpx.Transport(paceline.Limiter(1), cost=cost)
    with pytest.raises(TypeError):
        paceline.httpx.AsyncTransport(budget="not a budget")
    with pytest.raises(TypeError):
        paceline.aiohttp.trace_config(budget=budget(), settle_from=3)
    with pytest.raises(ValueError):
        paceline.httpx.AsyncTransport(budget=budget()).pace("example.com")
    b = budget()
    with pytest.raises(ValueError):
        b.follow(429, [], max_hold=float("nan"))
    with pytest.raises(TypeError):
        b.hold_for("1")


@pytest.mark.parametrize(
    "status, error",
    [("429", TypeError), (429.0, TypeError), (True, TypeError), (-1, ValueError), (2**70, ValueError), (99, ValueError)],
)
def test_a_status_that_is_not_an_http_status_is_refused_and_holds_nothing(status, error):
    b = budget()
    with pytest.raises(error):
        b.follow(status, [("retry-after", "5")])
    assert b.try_acquire(tokens=1) is not None


def test_follow_takes_a_mapping_of_headers_and_refuses_what_is_not_pairs():
    b = budget()
    assert b.follow(200, {"x-ratelimit-remaining-tokens": "300"}) == 1
    assert b.remaining("tokens") == 300
    for bad in (["ab", "cd"], [("a", "b", "c")], [(1, b"2")], [("a", 2)]):
        with pytest.raises(TypeError):
            b.follow(200, bad)


def test_budget_follow_and_hold_for_directly():
    b = budget()
    assert b.follow(200, [("x-ratelimit-remaining-tokens", "300"), ("x-other", b"1")]) == 1
    assert b.remaining("tokens") == 300
    b.hold_for(0.2)
    assert b.try_acquire() is None
    time.sleep(0.25)
    turn = b.try_acquire(tokens=1)
    assert turn is not None
    turn.release()


def test_follow_reads_header_names_given_as_bytes():
    # httpx's `response.headers.raw` and aiohttp's `raw_headers` are bytes pairs.
    b = budget()
    assert b.follow(200, [(b"x-ratelimit-remaining-tokens", b"300")]) == 1
    assert b.remaining("tokens") == 300


def test_an_announced_limit_below_the_configured_rate_paces_the_dimension():
    # Configured at 40 requests/s; the provider says 120 a minute (2/s).
    b = budget()
    fields = [("x-ratelimit-limit-requests", "120"), ("x-ratelimit-remaining-requests", "119")]
    assert b.follow(200, fields) == 1
    for _ in range(BURST):
        b.try_acquire(tokens=1).release()
    assert b.try_acquire(tokens=1) is None
    # The next request after half a second (2/s), not after 25 ms (40/s).
    assert 0.3 < b.wait_time(tokens=1) <= 0.5
    # Announced at the configured rate again: the empty bucket's backlog is the same
    # count of cells at 40/s, so the next request comes within 25 ms, then 25 ms apart.
    b.follow(200, [("x-ratelimit-limit-requests", str(RATE * 60)), ("x-ratelimit-remaining-requests", "5")])
    assert b.wait_time(tokens=1) <= 1.0 / RATE + 0.005
    time.sleep(b.wait_time(tokens=1) + 0.005)
    b.try_acquire(tokens=1).release()
    assert b.wait_time(tokens=1) <= 1.0 / RATE + 0.005


def test_a_response_read_already_by_the_transport_below_is_settled_at_once():
    """A transport that answers from memory (httpx.MockTransport, a cache, a test double)
    hands back a response already read and closed: its turn is settled then, not left
    open for a body that will never be closed through the transport."""

    def handler(request):
        return httpx.Response(200, json={"usage": {"total_tokens": 7}})

    b = paceline.Budget(tokens=paceline.Rate(100), in_flight=1)
    transport = paceline.httpx.AsyncTransport(
        budget=b,
        transport=httpx.MockTransport(handler),
        cost=lambda request: {"tokens": 10},
        settle_from=lambda r: {"tokens": r.json()["usage"]["total_tokens"]},
        retries=0,
    )

    async def main():
        async with httpx.AsyncClient(transport=transport, timeout=3) as client:
            for _ in range(3):
                r = await client.post("http://provider.test/v1", json={})
                assert r.status_code == 200
                assert b.in_flight == 0, "the permit came back"

    asyncio.run(main())
    # Settled at 7, not kept at 10: three calls spent 21 tokens of 100.
    assert b.remaining("tokens") >= 79
