"""paceline.asgi against hostile clients and unlucky configurations: a client that writes
a quota into its own key, costly requests told when to retry, exempt endpoints behind
FastAPI's routers, async exemptions, limits that only fail at the first request, HEAD
beside GET, control bytes and a gRPC content type in a client's headers, shared files
removed or replaced by another user under running workers, and the exempt lookup's cost."""

import asyncio
import logging
import os
import time

import pytest

from paceline.asgi import KeySource, Limit, RateLimitMiddleware, RouteLimit, exempt

from asgi_calls import call, ok, statuses

HOUR = 3600.0


def by_query(scope):
    return scope.get("query_string", b"").decode() or None


def test_a_client_cannot_write_its_own_tier_into_its_key():
    # The key comes from the client (a query parameter); the tier function gives it none.
    limit = Limit("api", "2/minute", key=lambda scope: scope["path"].strip("/"),
                  quota_for=lambda key: "1000/minute" if key == "paying" else None)
    app = RateLimitMiddleware(ok, [limit])
    forged = "1000000/1000000000/1000000\x1fmallory"
    assert statuses(app, 5, path="/" + forged) == [200, 200, 429, 429, 429]
    assert statuses(app, 5, path="/mallory") == [200, 200, 429, 429, 429]
    assert statuses(app, 5, path="/paying") == [200] * 5


def test_a_costly_request_is_told_the_wait_for_all_its_cells():
    app = RateLimitMiddleware(ok, [Limit("x", 5, per=60.0, cost=2)])

    async def run():
        first = [(await call(app))[0] for _ in range(2)]
        return first, await call(app)

    first, (status, fields) = asyncio.run(run())
    assert first == [200, 200] and status == 429
    # One cell left of 5 per minute (one every 12 s): the second comes in 12 s.
    assert fields["retry-after"] == "12"


def test_exempt_endpoints_behind_fastapis_routers_are_exempt():
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    app = fastapi.FastAPI()
    ops = fastapi.APIRouter(prefix="/ops")

    @ops.get("/health")
    @exempt
    async def router_health():
        return {"ok": True}

    @ops.get("/work")
    async def router_work():
        return {"ok": True}

    inner = fastapi.APIRouter(prefix="/inner")

    @inner.get("/ping/{n}")
    @exempt
    async def nested_ping(n: int):
        return {"n": n}

    ops.include_router(inner)
    app.include_router(ops)
    app.add_middleware(RateLimitMiddleware, limits=[Limit("api", 2, per=HOUR)])
    with TestClient(app) as client:
        assert [client.get("/ops/health").status_code for _ in range(5)] == [200] * 5
        assert [client.get(f"/ops/inner/ping/{n}").status_code for n in range(5)] == [200] * 5
        assert [client.get("/ops/work").status_code for _ in range(3)] == [200, 200, 429]


def test_async_exemptions_are_awaited_and_a_coroutine_never_counts_as_true():
    async def never(scope):
        return False

    async def always(scope):
        return True

    for limits, options in [
        ([Limit("a", 2, per=HOUR, exempt_when=never)], {}),
        ([Limit("a", 2, per=HOUR)], {"exempt": never}),
    ]:
        app = RateLimitMiddleware(ok, limits, **options)
        assert statuses(app, 4) == [200, 200, 429, 429]
    app = RateLimitMiddleware(ok, [Limit("a", 1, per=HOUR, exempt_when=always)])
    assert statuses(app, 3) == [200, 200, 200]
    app = RateLimitMiddleware(ok, [Limit("a", 1, per=HOUR)], exempt=always)
    assert statuses(app, 3) == [200, 200, 200]
    # A plain function that returns a coroutine is an error, not an exemption.
    app = RateLimitMiddleware(ok, [Limit("a", 1, per=HOUR)], exempt=lambda s: never(s))
    with pytest.raises(TypeError, match="awaitable"):
        statuses(app, 1)
    # The synchronous path (RouteLimit.decide) refuses async functions plainly.
    with pytest.raises(TypeError, match="async"):
        RouteLimit(Limit("a", 1, exempt_when=never)).decide(
            {"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("1.2.3.4", 1)}
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda: Limit("a", 1, per=1e-12),
        lambda: Limit("a", 1, per=1e12),
        lambda: Limit("a", 1e-300),
        lambda: Limit("a", 2147483648.5),
        lambda: Limit("a", 10, methods=["GE T"]),
        lambda: Limit("a", 10, methods=["GET\n"]),
        lambda: Limit("a", "1/585 years"),
    ],
)
def test_every_bad_limit_fails_where_it_is_written(make):
    with pytest.raises(ValueError) as raised:
        make()
    assert "u64" not in str(raised.value)


def test_a_decorated_endpoint_returning_data_is_sent_as_json_without_fields():
    starlette = pytest.importorskip("starlette.applications")
    from starlette.routing import Route
    from starlette.testclient import TestClient

    limit = RouteLimit(Limit("data", 5, per=HOUR))

    @limit.limit
    def data(request):
        return {"served": True}

    with TestClient(starlette.Starlette(routes=[Route("/", data)])) as client:
        reply = client.get("/")
    assert reply.status_code == 200 and reply.json() == {"served": True}


def test_one_removed_shared_file_resets_no_other_limit(tmp_path):
    login = Limit("login", 3, per=HOUR)
    shared = Limit("api", 100, per=HOUR, shared=str(tmp_path / "api"))
    app = RateLimitMiddleware(ok, [shared, login])
    assert statuses(app, 5) == [200, 200, 200, 429, 429]
    os.unlink(tmp_path / "api")
    time.sleep(1.1)  # the files are checked once a second
    assert statuses(app, 3) == [429, 429, 429]
    assert (tmp_path / "api").exists()  # and the removed file was made anew


def test_a_limit_in_two_route_limits_is_one_count_and_both_rejoin_its_file(tmp_path):
    limit = Limit("login", 3, per=HOUR, shared=str(tmp_path / "login"))
    first, second = RouteLimit(limit), RouteLimit(limit)
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [],
             "client": ("203.0.113.9", 1)}
    assert [first.decide(scope)[0] for _ in range(2)] == [True, True]
    assert [second.decide(scope)[0] for _ in range(2)] == [True, False]
    os.unlink(tmp_path / "login")
    time.sleep(1.1)
    # The first to notice reopens the path; the other joins the same new file.
    assert first.decide(scope)[0] is True
    assert [second.decide(scope)[0] for _ in range(3)] == [True, True, False]
    assert first.decide(scope)[0] is False


def test_head_is_limited_with_get():
    app = RateLimitMiddleware(ok, [Limit("reads", 2, per=HOUR, methods=["GET"])])

    async def run():
        return [(await call(app, method=m))[0] for m in ["GET", "HEAD", "HEAD", "POST"]]

    assert asyncio.run(run()) == [200, 200, 429, 200]


def test_a_control_byte_in_a_forwarded_header_keeps_the_proxys_client():
    proxy = KeySource.behind_proxies(["10.0.0.0/8"])
    app = RateLimitMiddleware(ok, [Limit("per-ip", 2, per=HOUR, key=proxy)])
    forged = [(b"x-forwarded-for", b"6.6.6.6\x01, 203.0.113.5")]
    honest = [(b"x-forwarded-for", b"203.0.113.5")]
    behind = ("10.0.0.1", 40000)

    async def run():
        return [(await call(app, client=behind, raw=raw))[0] for raw in (honest, honest, forged)]

    assert asyncio.run(run()) == [200, 200, 429]
    # Another client is not caught in a shared keyless bucket.
    other = [(b"x-forwarded-for", b"198.51.100.1\x02, 198.51.100.7")]
    assert asyncio.run(call(app, client=behind, raw=other))[0] == 200


def test_a_grpc_content_type_gets_the_http_refusal():
    app = RateLimitMiddleware(ok, [Limit("a", 1, per=HOUR)])
    grpc = (("content-type", "application/grpc"),)
    assert statuses(app, 2, headers=grpc) == [200, 429]


def test_a_file_planted_at_a_removed_files_path_costs_no_request(tmp_path, caplog):
    other_user = pytest.importorskip("pwd").getpwnam("nobody").pw_uid
    if os.geteuid() != 0:
        pytest.skip("needs root to plant another user's file")
    path = tmp_path / "api"
    app = RateLimitMiddleware(ok, [Limit("api", 100, per=HOUR, shared=str(path))])
    assert statuses(app, 1) == [200]
    os.unlink(path)
    path.write_bytes(b"planted")
    os.chown(path, other_user, -1)
    time.sleep(1.1)
    with caplog.at_level(logging.ERROR, logger="paceline.asgi"):
        assert statuses(app, 3) == [200, 200, 200]
    assert "cannot be opened again" in caplog.text


def test_the_double_proxy_warning_sees_a_forwarded_port(caplog):
    proxy = KeySource.behind_proxies(["127.0.0.1/32"])
    app = RateLimitMiddleware(ok, [Limit("warn-port", 100, key=proxy)])
    # uvicorn resolved the client from "203.0.113.9:4444" and wrote that port.
    with caplog.at_level(logging.ERROR, logger="paceline.asgi"):
        asyncio.run(call(app, headers=(("x-forwarded-for", "203.0.113.9:4444"),),
                         client=("203.0.113.9", 4444)))
    assert "Two trust lists disagree" in caplog.text


def test_a_request_to_another_path_is_not_matched_against_the_routes():
    starlette = pytest.importorskip("starlette.applications")
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    matched = []

    class Counting(Route):
        def matches(self, scope):
            matched.append(scope["path"])
            return super().matches(scope)

    @exempt
    async def health(request):
        return PlainTextResponse("ok")

    async def work(request):
        return PlainTextResponse("ok")

    routes = [Counting(f"/r{i}", work) for i in range(40)] + [Counting("/health", health)]
    app = starlette.Starlette(routes=routes)
    app.add_middleware(RateLimitMiddleware, limits=[Limit("api", 1000)])
    with TestClient(app) as client:
        client.get("/r7")
        matched.clear()
        client.get("/r7")
        # The app's own routing matches once per route up to /r7; the middleware, never.
        assert len(matched) == 8, matched
        assert client.get("/health").status_code == 200


def test_a_server_without_addresses_answers_500_only_where_a_limit_by_address_applies():
    app = RateLimitMiddleware(ok, [Limit("posts", 2, per=HOUR, methods=["POST"])])

    async def run():
        return [(await call(app, method=m, client=None))[0] for m in ["GET", "POST"]]

    assert asyncio.run(run()) == [200, 500]
