"""The request decision that every server integration shares, under the cases an attack on
it found: one deadline per waiting request across every limit (in the process and in
Redis), the longest ``Retry-After`` when a cost is a function, every header value a key
of its own (bytes that are not ASCII, control bytes), keys a function cannot encode, an
outage answered within one Redis timeout, and Redis's errors told and logged per key.
Limits in Redis run against a real redis-server started here."""

import asyncio
import logging
import time

import pytest

redis = pytest.importorskip("redis")
import redis.asyncio  # noqa: E402

from paceline.asgi import KeySource, Limit, RateLimitMiddleware  # noqa: E402

from asgi_calls import ok as ok_app  # noqa: E402
from redis_servers import have, server_binary  # noqa: E402

HOUR = 3600.0
# Calls may take 5 s, unless a test is about timeouts: a loaded machine is no outage.
SLOW_OK = 5.0
API_KEY = KeySource.header("x-api-key")

needs_redis = pytest.mark.skipif(not have(server_binary()), reason=f"{server_binary()} is not installed")


async def call(app, headers=(), client=("203.0.113.7", 40000)):
    """One request through the middleware: ``(status, fields as a dict of lists)``."""
    sent = []

    async def stay():
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": list(headers), "client": client}
    await app(scope, stay, send)
    fields = {}
    for name, value in sent[0].get("headers", []):
        fields.setdefault(name.decode(), []).append(value.decode("latin-1"))
    return sent[0]["status"], fields


async def timed(app, **kw):
    start = time.monotonic()
    status, fields = await call(app, **kw)
    return status, fields, time.monotonic() - start


def retry_after(fields):
    return int(fields["retry-after"][0])


# One deadline per request.


@needs_redis
def test_a_turn_in_redis_past_the_deadline_refuses_at_once_and_spends_nothing_here(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        local = Limit("local", 1, per=1.0, burst=1, key=API_KEY)
        fleet = Limit("fleet", 1, per=60.0, burst=1, key=API_KEY, redis=r, redis_timeout=SLOW_OK)
        strict = RateLimitMiddleware(ok_app, [local, fleet])
        patient = RateLimitMiddleware(ok_app, [local, fleet], wait_up_to=3.0)
        only_local = RateLimitMiddleware(ok_app, [local])  # the same Limit: its counts
        key = [(b"x-api-key", b"k")]
        assert (await call(strict, key))[0] == 200
        # The local turn is 1 s away, within the deadline; the one in Redis 60 s away.
        status, fields, took = await timed(patient, headers=key)
        assert status == 429 and took < 0.8, (status, took)
        assert retry_after(fields) >= 55, fields
        # Nothing was spent: the local cell comes back at 1 s, as if it had never asked.
        await asyncio.sleep(1.1)
        assert [(await call(only_local, key))[0] for _ in range(2)] == [200, 429]
        assert 50 < await fleet.redis.wait_time("k") <= 60
        await r.aclose()

    asyncio.run(go())


@needs_redis
def test_two_limits_in_redis_share_one_deadline_and_the_first_is_not_spent(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        near = Limit("near", 1, per=1.0, burst=1, key=API_KEY, redis=r, redis_timeout=SLOW_OK)
        far = Limit("far", 1, per=60.0, burst=1, key=API_KEY, redis=r, redis_timeout=SLOW_OK)
        patient = RateLimitMiddleware(ok_app, [near, far], wait_up_to=3.0)
        key = [(b"x-api-key", b"k")]
        assert (await call(patient, key))[0] == 200
        status, fields, took = await timed(patient, headers=key)
        assert status == 429 and took < 0.8, (status, took)
        assert retry_after(fields) >= 55 and '"far"' in fields["ratelimit-policy"][0], fields
        # The near limit's turn was not booked: one cell in a second, not two.
        assert await near.redis.wait_time("k") <= 1.0
        await r.aclose()

    asyncio.run(go())


@needs_redis
def test_a_waiting_request_waits_for_its_latest_turn_not_their_sum(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        local = Limit("local", 1, per=1.0, burst=1, key=API_KEY)
        fleet = Limit("fleet", 1, per=1.5, burst=1, key=API_KEY, redis=r, redis_timeout=SLOW_OK)
        patient = RateLimitMiddleware(ok_app, [local, fleet], wait_up_to=2.5, headers_on_success=True)
        key = [(b"x-api-key", b"k")]
        assert (await call(patient, key))[0] == 200
        status, fields, took = await timed(patient, headers=key)
        assert status == 200 and 1.3 < took < 2.3, (status, took)
        assert '"fleet"' in " ".join(fields["ratelimit-policy"]), fields
        # A client that leaves while it waits gives both turns back.
        await r.aclose()

    asyncio.run(go())


@needs_redis
def test_a_client_that_leaves_gives_back_its_turns_here_and_in_redis(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        local = Limit("local", 1, per=2.0, burst=1, key=API_KEY)
        fleet = Limit("fleet", 1, per=2.0, burst=1, key=API_KEY, redis=r, redis_timeout=SLOW_OK)
        patient = RateLimitMiddleware(ok_app, [local, fleet], wait_up_to=5.0)
        key = [(b"x-api-key", b"k")]
        assert (await call(patient, key))[0] == 200
        sent = []

        async def leaving():
            await asyncio.sleep(0.3)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/", "headers": key, "client": ("203.0.113.7", 1)}
        await patient(scope, leaving, send)
        assert sent == []
        # Both turns given back: the next request is served at 2 s, not 4 s.
        status, _, took = await timed(patient, headers=key)
        assert status == 200 and took < 2.3, took
        await r.aclose()

    asyncio.run(go())


def test_a_local_turn_past_the_deadline_refuses_at_once():
    local = Limit("local", 1, per=HOUR, burst=1, key=API_KEY)
    patient = RateLimitMiddleware(ok_app, [local], wait_up_to=1.0)

    async def go():
        key = [(b"x-api-key", b"k")]
        assert (await call(patient, key))[0] == 200
        status, fields, took = await timed(patient, headers=key)
        assert status == 429 and took < 0.5 and retry_after(fields) > HOUR - 60

    asyncio.run(go())


# The longest Retry-After.


@needs_redis
def test_a_refusal_here_is_told_the_wait_of_a_redis_limit_whose_cost_is_a_function(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        calls = []

        def ten(scope):
            calls.append(scope["path"])
            return 10

        limits = [
            Limit("minute", 1, per=60.0, burst=1, key=API_KEY),
            Limit("hourly", 10, per=HOUR, burst=10, key=API_KEY, cost=ten, redis=r, redis_timeout=SLOW_OK),
        ]
        middleware = RateLimitMiddleware(ok_app, limits)
        key = [(b"x-api-key", b"k")]
        assert (await call(middleware, key))[0] == 200
        calls.clear()
        status, fields = await call(middleware, key)
        assert status == 429 and retry_after(fields) >= HOUR - 60, fields
        assert "hourly" in fields["ratelimit-policy"][-1] or '"hourly"' in " ".join(fields["ratelimit-policy"])
        assert calls == ["/"]  # the cost function asked once for the request
        await r.aclose()

    asyncio.run(go())


# Every header value a key.


def _statuses(app, headers, n):
    async def go():
        return [(await call(app, headers))[0] for _ in range(n)]

    return asyncio.run(go())


@pytest.mark.parametrize("missing", [None, "skip"])
def test_a_header_value_that_is_not_ascii_is_a_key_here(missing):
    app = RateLimitMiddleware(ok_app, [Limit("k", 3, per=HOUR, key=API_KEY)], on_missing_key=missing)
    assert _statuses(app, [(b"x-api-key", b"tenant-\xe9")], 10) == [200] * 3 + [429] * 7
    # Another such client has a bucket of its own, and so does one sending UTF-8.
    assert _statuses(app, [(b"x-api-key", b"other-\xff")], 4) == [200] * 3 + [429]
    assert _statuses(app, [(b"x-api-key", "tenant-\xe9".encode())], 4) == [200] * 3 + [429]


def test_control_bytes_in_a_key_never_join_another_clients_bucket():
    app = RateLimitMiddleware(ok_app, [Limit("k", 1, per=HOUR, key=API_KEY)])
    values = [b"a?", b"a\x01", b"a\x02", b"a\xff", b"a\xff\x81", b"a\x7f"]
    for value in values:
        assert _statuses(app, [(b"x-api-key", value)], 2) == [200, 429], value


@needs_redis
@pytest.mark.parametrize("missing", [None, "skip"])
def test_a_header_value_that_is_not_ascii_is_a_key_in_redis(fresh, missing):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        app = RateLimitMiddleware(
            ok_app, [Limit("k", 3, per=HOUR, key=API_KEY, redis=r, redis_timeout=SLOW_OK)],
            on_missing_key=missing,
        )
        tenant = [(b"x-api-key", b"tenant-\xe9")]
        assert [(await call(app, tenant))[0] for _ in range(5)] == [200] * 3 + [429] * 2
        other = [(b"x-api-key", b"other-\xff")]
        assert [(await call(app, other))[0] for _ in range(4)] == [200] * 3 + [429]
        await r.aclose()

    asyncio.run(go())


def test_a_key_function_with_a_lone_surrogate_is_a_key_here():
    by_text = lambda scope: "t-\udcff"  # noqa: E731 - what surrogateescape decoding makes
    app = RateLimitMiddleware(ok_app, [Limit("k", 1, per=HOUR, key=by_text)])
    assert _statuses(app, [], 2) == [200, 429]
    other = RateLimitMiddleware(ok_app, [Limit("k2", 1, per=HOUR, key=lambda scope: "t-\udcfe")])
    assert _statuses(other, [], 1) == [200]


@needs_redis
def test_a_key_function_with_a_lone_surrogate_is_a_key_in_redis(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        keys = iter(["t-\udcff", "t-\udcff", "t-\udcfe"])
        app = RateLimitMiddleware(
            ok_app, [Limit("k", 1, per=HOUR, key=lambda scope: next(keys), redis=r, redis_timeout=SLOW_OK)]
        )
        assert [(await call(app))[0] for _ in range(3)] == [200, 429, 200]
        await r.aclose()

    asyncio.run(go())


# Redis's trouble.


@needs_redis
def test_an_outage_in_wait_mode_is_answered_within_one_redis_timeout(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        timeout = 1.0
        app = RateLimitMiddleware(
            ok_app, [Limit("w", 1, per=HOUR, key=API_KEY, redis=r, redis_timeout=timeout)], wait_up_to=10.0
        )
        key = [(b"x-api-key", b"k")]
        assert (await call(app, key))[0] == 200
        fresh.cli("CLIENT", "PAUSE", "4000", "ALL")
        try:
            status, fields, took = await timed(app, headers=key)
        finally:
            fresh.cli("CLIENT", "UNPAUSE")
        assert status == 503 and fields["retry-after"] == ["1"]
        assert took < 1.6 * timeout, took
        await r.aclose()

    asyncio.run(go())


@needs_redis
def test_a_corrupt_value_is_told_as_an_error_and_logged_for_each_key(fresh, caplog):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        app = RateLimitMiddleware(ok_app, [Limit("c", 1, per=HOUR, key=API_KEY, redis=r, redis_timeout=SLOW_OK)])
        await r.lpush("paceline-asgi:c:{bad-1}", "x")
        await r.lpush("paceline-asgi:c:{bad-2}", "x")
        bodies = []
        for key in (b"bad-1", b"bad-2", b"bad-1"):
            sent = []

            async def send(message):
                sent.append(message)

            async def receive():
                return {"type": "http.request", "body": b""}

            scope = {"type": "http", "method": "GET", "path": "/", "client": ("192.0.2.1", 1),
                     "headers": [(b"x-api-key", key)]}
            await app(scope, receive, send)
            assert sent[0]["status"] == 503
            bodies.append(sent[1]["body"])
        assert all(b"answered with an error" in body for body in bodies), bodies
        assert (await call(app, [(b"x-api-key", b"good")]))[0] == 200
        await r.aclose()

    with caplog.at_level(logging.ERROR, logger="paceline.asgi"):
        asyncio.run(go())
    logged = [record.getMessage() for record in caplog.records]
    assert sum("bad-1" in m for m in logged) == 1 and sum("bad-2" in m for m in logged) == 1, logged


@needs_redis
def test_two_limits_of_one_name_in_redis_are_one_count_and_another_quota_is_told(fresh, caplog):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        first = RateLimitMiddleware(ok_app, [Limit("same", 2, per=HOUR, key=API_KEY, redis=r, redis_timeout=SLOW_OK)])
        second = RateLimitMiddleware(ok_app, [Limit("same", 2, per=HOUR, key=API_KEY, redis=r, redis_timeout=SLOW_OK)])
        key = [(b"x-api-key", b"k")]
        assert [(await call(app, key))[0] for app in (first, second, first)] == [200, 200, 429]
        assert not caplog.records
        Limit("same", 5, per=HOUR, key=API_KEY, redis=r)
        await r.aclose()

    with caplog.at_level(logging.WARNING, logger="paceline.asgi"):
        asyncio.run(go())
    assert any("two limits named 'same'" in record.getMessage() for record in caplog.records)


# What an attack on the above found.


async def leaving_after(seconds):
    await asyncio.sleep(seconds)
    return {"type": "http.disconnect"}


async def call_leaving(app, headers, seconds):
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return await leaving_after(seconds)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": list(headers), "client": ("203.0.113.7", 1)}
    await app(scope, receive, send)
    return sent


def _local_cells(limit, key, most):
    """How many requests of `key` the in-process `limit` admits now (spending them)."""
    app = RateLimitMiddleware(ok_app, [limit])

    async def go():
        return sum([(await call(app, [(b"x-api-key", key)]))[0] == 200 for _ in range(most)])

    return asyncio.run(go())


@needs_redis
def test_cors_preflights_spend_nothing_in_redis_either(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        for wait in (None, 1.0):
            fresh.cli("FLUSHALL")
            app = RateLimitMiddleware(
                ok_app, [Limit("p", 2, per=HOUR, key=API_KEY, redis=r, redis_timeout=SLOW_OK)], wait_up_to=wait
            )
            options = []
            for _ in range(3):
                sent = []

                async def send(message):
                    sent.append(message)

                async def receive():
                    return {"type": "http.request", "body": b""}

                scope = {"type": "http", "method": "OPTIONS", "path": "/", "client": ("192.0.2.1", 1),
                         "headers": [(b"x-api-key", b"k")]}
                await app(scope, receive, send)
                options.append(sent[0]["status"])
            assert options == [200] * 3
            assert [(await call(app, [(b"x-api-key", b"k")]))[0] for _ in range(3)] == [200, 200, 429]
        await r.aclose()

    asyncio.run(go())


@needs_redis
def test_a_client_leaving_while_its_redis_turn_comes_gives_back_a_cell_due_here_at_once(fresh):
    local = Limit("local", 5, per=HOUR, key=API_KEY)

    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        fleet = Limit("fleet", 1, per=2.0, burst=1, key=API_KEY, redis=r, redis_timeout=SLOW_OK)
        app = RateLimitMiddleware(ok_app, [local, fleet], wait_up_to=5.0)
        assert (await call(app, [(b"x-api-key", b"k")]))[0] == 200
        assert await call_leaving(app, [(b"x-api-key", b"k")], 0.3) == []
        await r.aclose()

    asyncio.run(go())
    assert _local_cells(local, b"k", 5) == 4  # one spent by the admitted request only


@needs_redis
def test_an_outage_refused_in_wait_mode_spends_nothing_here(fresh):
    local = Limit("local", 3, per=HOUR, key=API_KEY)

    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        fleet = Limit("fleet", 10, per=1.0, key=API_KEY, redis=r, redis_timeout=0.3)
        app = RateLimitMiddleware(ok_app, [local, fleet], wait_up_to=2.0)
        assert (await call(app, [(b"x-api-key", b"warm")]))[0] == 200
        fresh.cli("CLIENT", "PAUSE", "3000", "ALL")
        try:
            for _ in range(3):
                assert (await call(app, [(b"x-api-key", b"k")]))[0] == 503
        finally:
            fresh.cli("CLIENT", "UNPAUSE")
        await r.aclose()

    asyncio.run(go())
    assert _local_cells(local, b"k", 4) == 3


@needs_redis
def test_wait_mode_and_refusing_mode_tell_the_same_longest_wait(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        limits = [
            Limit("hourly", 1, per=HOUR, burst=1, key=API_KEY),
            Limit("minute", 1, per=60.0, burst=1, key=API_KEY, redis=r, redis_timeout=SLOW_OK),
        ]
        for wait in (1.0, None):
            fresh.cli("FLUSHALL")
            app = RateLimitMiddleware(ok_app, limits, wait_up_to=wait)
            key = [(b"x-api-key", f"k{wait}".encode())]
            assert (await call(app, key))[0] == 200
            status, fields = await call(app, key)
            assert status == 429 and retry_after(fields) >= HOUR - 60, (wait, fields)
        await r.aclose()

    asyncio.run(go())


@needs_redis
def test_a_request_that_can_never_pass_is_told_so_beside_limits_in_redis(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        fleet = Limit("fleet", 1, per=60.0, burst=1, key=API_KEY, redis=r, redis_timeout=SLOW_OK)
        costly = Limit("local", 2, per=HOUR, burst=2, key=API_KEY, cost=5)
        for wait in (None, 1.0):
            fresh.cli("FLUSHALL")
            app = RateLimitMiddleware(ok_app, [costly, fleet], wait_up_to=wait)
            key = [(b"x-api-key", b"k")]
            await call(app, key)
            status, fields = await call(app, key)
            assert status == 429 and "retry-after" not in fields, (wait, fields)
        # A limit in Redis that can never admit the request says so over a wait here.
        huge = Limit("fleet-huge", 2, per=HOUR, burst=2, key=API_KEY, cost=5, redis=r, redis_timeout=SLOW_OK)
        app = RateLimitMiddleware(ok_app, [Limit("one", 1, per=HOUR, key=API_KEY), huge])
        key = [(b"x-api-key", b"j")]
        for _ in range(2):
            status, fields = await call(app, key)
            assert status == 429 and "retry-after" not in fields, fields
        await r.aclose()

    asyncio.run(go())


@needs_redis
def test_an_async_key_function_spends_the_requests_deadline(fresh):
    async def slow_key(scope):
        await asyncio.sleep(0.6)
        return "k"

    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        local = Limit("local", 1, per=0.9, burst=1, key=slow_key)
        app = RateLimitMiddleware(ok_app, [local], wait_up_to=0.8)
        with_fleet = RateLimitMiddleware(
            ok_app,
            [local, Limit("fleet", 100, per=1.0, key=API_KEY, cost=lambda scope: 1, redis=r, redis_timeout=SLOW_OK)],
            wait_up_to=0.8,
        )
        for middleware in (app, with_fleet):
            await asyncio.sleep(1.0)  # the local cell back
            assert (await call(middleware, [(b"x-api-key", b"k")]))[0] == 200
            # The next turn is 0.9 s after the first: 1.5 s after this request arrives,
            # past its 0.8 s (0.6 s of which its key function took).
            status, _, took = await timed(middleware, headers=[(b"x-api-key", b"k")])
            assert status == 429 and took < 1.0, (status, took)
        await r.aclose()

    asyncio.run(go())


def test_a_grpc_content_type_is_a_key_of_its_own():
    app = RateLimitMiddleware(ok_app, [Limit("ct", 1, per=HOUR, key=KeySource.header("content-type"))],
                              on_missing_key="skip")
    assert _statuses(app, [(b"content-type", b"application/grpc+t1")], 3) == [200, 429, 429]
    assert _statuses(app, [(b"content-type", b"application/grpc+t2")], 1) == [200]


def test_a_client_written_as_a_list_or_without_a_port_is_a_client():
    app = RateLimitMiddleware(ok_app, [Limit("ip", 1, per=HOUR)])

    async def go(client):
        return (await call(app, client=client))[0]

    assert asyncio.run(go(["198.51.100.1", 5000])) == 200
    assert asyncio.run(go(("198.51.100.1", None))) == 429  # the same client
    assert asyncio.run(go(("198.51.100.2", None))) == 200


@needs_redis
def test_a_local_share_past_the_deadline_during_an_outage_refuses_at_once_spending_nothing(fresh):
    import paceline

    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        near = paceline.KeyedLimiter(1, per=1.5, burst=1)
        far = paceline.KeyedLimiter(1, per=60.0, burst=1)
        app = RateLimitMiddleware(
            ok_app,
            [Limit("a", 10, per=1.0, key=API_KEY, redis=r, redis_timeout=0.3, on_redis_failure=near),
             Limit("b", 10, per=1.0, key=API_KEY, redis=r, redis_timeout=0.3, on_redis_failure=far)],
            wait_up_to=2.0,
        )
        fresh.cli("CLIENT", "PAUSE", "3000", "ALL")
        try:
            assert (await call(app, [(b"x-api-key", b"k")]))[0] == 200
            status, fields, took = await timed(app, headers=[(b"x-api-key", b"k")])
        finally:
            fresh.cli("CLIENT", "UNPAUSE")
        assert status == 429 and retry_after(fields) >= 55 and took < 1.0, (status, fields, took)
        assert near.wait_time("k") <= 1.5  # not booked by the refused request
        await r.aclose()

    asyncio.run(go())


@needs_redis
def test_a_refusal_here_during_an_outage_is_answered_within_one_timeout(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        fleet = [Limit(f"f{i}", 10, per=1.0, key=API_KEY, redis=r, redis_timeout=0.4) for i in range(3)]
        app = RateLimitMiddleware(ok_app, [Limit("one", 1, per=HOUR, key=API_KEY), *fleet])
        assert (await call(app, [(b"x-api-key", b"k")]))[0] == 200
        fresh.cli("CLIENT", "PAUSE", "3000", "ALL")
        try:
            status, _, took = await timed(app, headers=[(b"x-api-key", b"k")])
        finally:
            fresh.cli("CLIENT", "UNPAUSE")
        assert status == 429 and took < 0.75, took
        await r.aclose()

    asyncio.run(go())
