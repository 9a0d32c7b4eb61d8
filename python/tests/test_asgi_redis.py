"""paceline.asgi limits kept in Redis (``Limit(..., redis=client)``): one bound per client
across the servers of a fleet, each server a process of its own with its own event loop
and client, against a real redis-server started here; the fields against the Rust
layer's for the same quota; outages; wait mode across servers."""

import asyncio
import time

import pytest

redis = pytest.importorskip("redis")
import redis.asyncio  # noqa: E402

import paceline  # noqa: E402
from paceline.asgi import KeySource, Limit, RateLimitMiddleware, RouteLimit  # noqa: E402

import processes  # noqa: E402
from asgi_calls import ok as ok_app  # noqa: E402
from redis_servers import have, server_binary  # noqa: E402

if not have(server_binary()):
    pytest.skip(f"{server_binary()} is not installed", allow_module_level=True)

HOUR = 3600.0
# Calls may take 5 s, unless a test is about timeouts: a loaded machine is no outage.
SLOW_OK = 5.0
PROXY = KeySource.behind_proxies(["127.0.0.1/32"])


async def call(middleware, ip="203.0.113.7", headers=(), receive=None, peer="127.0.0.1"):
    """One request through the middleware: (status, headers as a dict of lists)."""
    sent = []

    async def stay():
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [(b"x-forwarded-for", ip.encode()), *headers],
        "client": (peer, 40000),
    }
    await middleware(scope, receive or stay, send)
    if not sent:
        return None, {}
    fields = {}
    for name, value in sent[0].get("headers", []):
        fields.setdefault(name.decode(), []).append(value.decode())
    return sent[0]["status"], fields


def fleet_server(url, clients, each, out):
    """One server of the fleet: its own loop, client and middleware; sends `each`
    requests per client; puts the statuses per client."""

    async def go():
        r = redis.asyncio.Redis.from_url(url)
        middleware = RateLimitMiddleware(
            ok_app, limits=[Limit("per-ip", rate=5, per=HOUR, burst=5, key=PROXY, redis=r, redis_timeout=SLOW_OK)]
        )
        statuses = {ip: [] for ip in clients}
        for _ in range(each):
            results = await asyncio.gather(*(call(middleware, ip) for ip in clients))
            for ip, (status, fields) in zip(clients, results):
                statuses[ip].append(status)
                if status == 429:
                    assert int(fields["retry-after"][0]) >= 1
                    assert fields["ratelimit-policy"] == ['"per-ip";q=5;w=3600']
                    assert fields["ratelimit"][0].startswith('"per-ip";r=0;t=')
        await r.aclose()
        return statuses

    out.put(asyncio.run(go()))


def test_servers_of_a_fleet_hold_one_bound_per_client(fresh):
    clients = [f"198.51.100.{i}" for i in range(1, 21)]
    results = processes.results(fleet_server, (fresh.url, clients, 4), 3)
    for ip in clients:
        got = sorted(s for statuses in results for s in statuses[ip])
        assert got == [200] * 5 + [429] * 7, (ip, got)
    # One Redis key per client, hash-tagged, under the limit's name.
    assert fresh.cli("EXISTS", "paceline-asgi:per-ip:{198.51.100.1}").strip() == "1"


def test_the_fields_are_the_rust_layers_for_the_same_quota(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        # Intervals of a second or more: a loaded machine's pauses between the two calls
        # change no field.
        # 3 per 7 s: not a whole number of cells in its burst window (q=3;w=7).
        for rate, per, burst in ((10, 60.0, 3), (2, 4.0, 3), (100, 100.0, 1), (3, 7.0, 1)):
            fresh.cli("FLUSHALL")
            options = dict(headers_on_success=True, legacy_headers=True)
            local = RateLimitMiddleware(ok_app, [Limit("api", rate, per, burst, key=PROXY)], **options)
            fleet = RateLimitMiddleware(ok_app, [Limit("api", rate, per, burst, key=PROXY, redis=r, redis_timeout=SLOW_OK)], **options)
            for _ in range(burst + 2):
                a = await call(local)
                b = await call(fleet)
                assert a[0] == b[0]
                assert a[1]["ratelimit-policy"] == b[1]["ratelimit-policy"]
                assert a[1]["ratelimit"] == b[1]["ratelimit"], (rate, per, burst)
                assert a[1].get("retry-after") == b[1].get("retry-after")
                for name in ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"):
                    assert a[1][name] == b[1][name], (name, rate, per, burst)
        await r.aclose()

    asyncio.run(go())


def test_a_limit_in_redis_and_one_in_the_process_together(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        middleware = RateLimitMiddleware(
            ok_app,
            [
                Limit("local", rate=2, per=HOUR, key=PROXY),
                Limit("fleet", rate=3, per=HOUR, key=KeySource.header("x-api-key"), redis=r, redis_timeout=SLOW_OK),
            ],
        )
        key = [(b"x-api-key", b"k1")]
        statuses = [(await call(middleware, "192.0.2.1", key))[0] for _ in range(3)]
        assert statuses == [200, 200, 429]  # the local limit refuses the third...
        assert await r.get("paceline-asgi:fleet:{k1}") is not None
        # ...without spending the fleet's: one cell left for k1 from another client.
        status, fields = await call(middleware, "192.0.2.2", key)
        assert status == 200
        status, fields = await call(middleware, "192.0.2.3", key)
        assert status == 429 and fields["ratelimit-policy"][0].startswith('"fleet"')
        # A request without the header shares one key (on_missing_key="shared").
        assert (await call(middleware, "192.0.2.4"))[0] == 200
        await r.aclose()

    asyncio.run(go())


def test_a_long_key_is_one_digest_for_every_server(fresh):
    async def go():
        long = b"k" * 10_000
        servers = []
        for _ in range(2):
            r = redis.asyncio.Redis.from_url(fresh.url)
            servers.append((r, RateLimitMiddleware(
                ok_app, [Limit("h", rate=1, per=HOUR, key=KeySource.header("x-api-key"), redis=r, redis_timeout=SLOW_OK)]
            )))
        assert (await call(servers[0][1], headers=[(b"x-api-key", long)]))[0] == 200
        assert (await call(servers[1][1], headers=[(b"x-api-key", long)]))[0] == 429
        keys = await servers[0][0].keys("paceline-asgi:h:*")
        assert len(keys) == 1 and len(keys[0]) < 100
        for r, _ in servers:
            await r.aclose()

    asyncio.run(go())


def test_an_outage_is_a_503_when_closed_and_passes_when_open(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        closed = RateLimitMiddleware(ok_app, [Limit("c", rate=1, per=HOUR, key=PROXY, redis=r, redis_timeout=0.2)])
        opened = RateLimitMiddleware(
            ok_app, [Limit("o", rate=1, per=HOUR, key=PROXY, redis=r, redis_timeout=0.2, on_redis_failure="open")]
        )
        local = RateLimitMiddleware(
            ok_app,
            [Limit("l", rate=1, per=HOUR, key=PROXY, redis=r, redis_timeout=0.2,
                   on_redis_failure=paceline.KeyedLimiter(1, HOUR, 1))],
        )
        assert (await call(closed))[0] == 200
        fresh.stop()
        status, fields = await call(closed)
        assert status == 503 and fields["retry-after"] == ["1"] and "ratelimit" not in fields
        assert [(await call(opened))[0] for _ in range(3)] == [200, 200, 200]
        assert [(await call(local))[0] for _ in range(2)] == [200, 429]
        # Wait mode on the local share: a turn beyond wait_up_to is a 429, not an error.
        waiting = RateLimitMiddleware(
            ok_app,
            [Limit("w", rate=1, per=HOUR, key=PROXY, redis=r, redis_timeout=0.2,
                   on_redis_failure=paceline.KeyedLimiter(1, HOUR, 1))],
            wait_up_to=0.1,
        )
        assert [(await call(waiting))[0] for _ in range(2)] == [200, 429]
        fresh.start()
        await r.aclose()
        # An error Redis answers (a foreign value at the key) admits nothing either.
        r = redis.asyncio.Redis.from_url(fresh.url)
        opened = RateLimitMiddleware(
            ok_app, [Limit("o", rate=1, per=HOUR, key=PROXY, redis=r, redis_timeout=SLOW_OK, on_redis_failure="open")]
        )
        await r.lpush("paceline-asgi:o:{203.0.113.7}", "x")
        assert (await call(opened))[0] == 503
        await r.aclose()

    asyncio.run(go())


def test_wait_mode_books_fleet_turns_and_a_client_that_leaves_gives_it_back(fresh):
    per = 2.0

    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        middleware = RateLimitMiddleware(
            ok_app, [Limit("slow", rate=1, per=per, burst=1, key=KeySource.global_(), redis=r, redis_timeout=SLOW_OK)],
            wait_up_to=3 * per,
        )

        async def leaving():
            await asyncio.sleep(0.2)
            return {"type": "http.disconnect"}

        start = time.monotonic()
        assert (await call(middleware))[0] == 200
        assert (await call(middleware, receive=leaving)) == (None, {})  # left: nothing sent
        status, _ = await call(middleware)  # takes the turn given back: at `per`
        took = time.monotonic() - start
        assert status == 200
        assert per - 0.05 <= took < 2 * per - 0.5, took
        # Beyond wait_up_to: refused at once, nothing booked.
        short = RateLimitMiddleware(
            ok_app, [Limit("hourly", rate=1, per=HOUR, burst=1, key=KeySource.global_(), redis=r, redis_timeout=SLOW_OK)],
            wait_up_to=0.1,
        )
        assert (await call(short))[0] == 200
        t0 = time.monotonic()
        status, fields = await call(short)
        assert status == 429 and time.monotonic() - t0 < 2.0
        assert int(fields["retry-after"][0]) > HOUR - 60
        await r.aclose()

    asyncio.run(go())


def test_bad_configuration_of_a_limit_in_redis(fresh):
    r = redis.asyncio.Redis.from_url(fresh.url)
    with pytest.raises(ValueError, match="not both"):
        Limit("x", 1, redis=r, shared="/dev/shm/paceline-test-x")
    with pytest.raises(ValueError, match="max_keys"):
        Limit("x", 1, redis=r, max_keys=10)
    with pytest.raises(ValueError, match="braces"):
        Limit("a{b}", 1, redis=r)
    with pytest.raises(TypeError, match="asyncio"):
        Limit("x", 1, redis=redis.Redis.from_url(fresh.url))
    with pytest.raises(ValueError, match="on_failure"):
        Limit("x", 1, redis=r, on_redis_failure="sometimes")
    with pytest.raises(ValueError, match="RateLimitMiddleware"):
        RouteLimit(Limit("x", 1, redis=r))


def test_a_limit_in_redis_takes_costs_methods_and_exemptions(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        costly = RateLimitMiddleware(
            ok_app,
            [Limit("costly", rate=5, per=HOUR, key=PROXY, cost=2, redis=r, redis_timeout=SLOW_OK)],
        )
        statuses = [(await call(costly))[0] for _ in range(4)]
        # 5 cells at 2 a request: two pass, the third finds one cell.
        assert statuses == [200, 200, 429, 429]
        huge = RateLimitMiddleware(
            ok_app,
            [Limit("huge", rate=5, per=HOUR, key=PROXY, cost=6, redis=r, redis_timeout=SLOW_OK)],
        )
        status, fields = await call(huge)
        assert status == 429 and "retry-after" not in fields  # it can never pass
        posts = RateLimitMiddleware(
            ok_app,
            [Limit("posts", rate=1, per=HOUR, key=PROXY, methods=["POST"],
                   exempt_when=lambda scope: scope["path"] == "/free",
                   redis=r, redis_timeout=SLOW_OK)],
        )
        # GETs are not counted at all.
        assert [(await call(posts))[0] for _ in range(3)] == [200, 200, 200]
        await r.aclose()

    asyncio.run(go())


def test_a_refusal_in_the_process_is_told_the_longest_wait_of_the_limits_in_redis(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        key = KeySource.header("x-user")
        both = [
            Limit("fast", rate=1, per=30.0, key=key),
            Limit("slow", rate=1, per=HOUR, key=key, redis=r, redis_timeout=SLOW_OK),
        ]
        middleware = RateLimitMiddleware(ok_app, both, legacy_headers=True)
        local = RateLimitMiddleware(
            ok_app, [Limit("fast", rate=1, per=30.0, key=key), Limit("slow", rate=1, per=HOUR, key=key)],
            legacy_headers=True,
        )
        user = [(b"x-user", b"u")]
        assert (await call(middleware, headers=user))[0] == 200
        assert (await call(local, headers=user))[0] == 200
        status, fields = await call(middleware, headers=user)
        expected_status, expected = await call(local, headers=user)
        assert status == expected_status == 429
        assert int(fields["retry-after"][0]) >= HOUR - 5, fields
        assert abs(int(fields["retry-after"][0]) - int(expected["retry-after"][0])) <= 1
        joined = ", ".join(fields["ratelimit"])
        assert '"fast"' in joined and '"slow"' in joined, fields
        assert fields["x-ratelimit-limit"] == expected["x-ratelimit-limit"]
        assert fields["x-ratelimit-remaining"] == ["0"]
        await r.aclose()

    asyncio.run(go())


def test_an_empty_key_is_a_key_of_its_own(fresh):
    async def go():
        r = redis.asyncio.Redis.from_url(fresh.url)
        middleware = RateLimitMiddleware(
            ok_app, [Limit("k", rate=1, per=HOUR, key=KeySource.header("x-api-key"), redis=r, redis_timeout=SLOW_OK)]
        )
        empty = [(b"x-api-key", b"")]
        assert [(await call(middleware, headers=empty))[0] for _ in range(2)] == [200, 429]
        assert (await call(middleware, headers=[(b"x-api-key", b"a")]))[0] == 200
        by_function = RateLimitMiddleware(
            ok_app, [Limit("f", rate=1, per=HOUR, key=lambda scope: "", redis=r, redis_timeout=SLOW_OK)]
        )
        assert [(await call(by_function))[0] for _ in range(2)] == [200, 429]
        await r.aclose()

    asyncio.run(go())


def test_the_frameworks_test_client_works_with_a_client_made_at_import(fresh):
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    r = redis.asyncio.Redis.from_url(fresh.url)  # made once, outside any loop

    async def home(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", home)])
    app.add_middleware(
        RateLimitMiddleware,
        limits=[Limit("api", 2, per=HOUR, burst=2, key=KeySource.header("x-user"), redis=r, redis_timeout=SLOW_OK)],
    )
    for block in range(3):
        with TestClient(app, raise_server_exceptions=False) as c:
            statuses = [c.get("/", headers={"x-user": f"u{block}"}).status_code for _ in range(3)]
        assert statuses == [200, 200, 429], (block, statuses)
