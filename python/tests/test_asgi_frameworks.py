"""paceline.asgi as FastAPI and Starlette teams meet it: the frameworks' own test clients,
uvicorn's own proxy handling in each of its modes, configuration errors at import, what
slowapi users reach for (rates as text, costs, tiers, per-method limits, exemptions,
async keys, keys from authentication), shared files removed under running workers, and
a waiting request's body held within a bound."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from paceline.asgi import KeySource, Limit, RateLimitMiddleware, RouteLimit, exempt

from asgi_calls import call, ok, statuses

HOUR = 3600.0


# --- The frameworks' own test clients -------------------------------------------------


def test_fastapi_testclient_and_httpx_asgitransport_work_out_of_the_box():
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    app = fastapi.FastAPI()

    @app.get("/")
    async def index():
        return {"ok": True}

    app.add_middleware(RateLimitMiddleware, limits=[Limit("per-ip", 2, per=HOUR)])
    with TestClient(app) as client:  # its client host is "testclient", not an address
        codes = [client.get("/").status_code for _ in range(3)]
    assert codes == [200, 200, 429]

    async def through_httpx():
        transport = httpx.ASGITransport(app=app)  # client ("127.0.0.1", 123)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return [(await c.get("/")).status_code for _ in range(3)]

    assert asyncio.run(through_httpx()) == [200, 200, 429]


# --- uvicorn's own proxy handling, in each mode ---------------------------------------

APP = """
import os
from paceline.asgi import KeySource, Limit, RateLimitMiddleware

async def ok(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

key = KeySource.behind_proxies(["127.0.0.1"]) if os.environ["MODE"] == "paceline" else (
    KeySource.behind_proxies(["10.0.0.0/8"]) if os.environ["MODE"] == "both" else KeySource.peer_ip())
app = RateLimitMiddleware(ok, [Limit("per-ip", 2, per=3600.0, key=key)])
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tmp_path, mode, *args):
    (tmp_path / "proxied.py").write_text(APP)
    port = free_port()
    log = open(tmp_path / f"uvicorn-{mode}.log", "w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "proxied:app", "--host", "127.0.0.1", "--port",
         str(port), "--app-dir", str(tmp_path), *args],
        env=dict(os.environ, MODE=mode), stdout=log, stderr=log, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, headers={"x-forwarded-for": "198.51.100.254"}, timeout=2)
            break
        except httpx.TransportError:
            assert process.poll() is None and time.monotonic() < deadline, "no uvicorn"
            time.sleep(0.05)
    return process, url, log


def stop(process):
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(20)


def rotating(url, n=8):
    """A client that writes a new X-Forwarded-For on each request."""
    return [httpx.get(url, headers={"x-forwarded-for": f"198.51.100.{i}"}).status_code
            for i in range(n)]


def spoofing(url, n=4):
    """One real client (203.0.113.9, as the proxy appends it) that puts a new address of
    its own choosing left of it on each request."""
    return [httpx.get(url, headers={"x-forwarded-for": f"198.51.100.{i}, 203.0.113.9"}).status_code
            for i in range(n)]


def test_behind_uvicorns_proxy_handling_each_mode_keys_the_real_client(tmp_path):
    # uvicorn resolves the client (its proxy headers on, our proxy 127.0.0.1 trusted),
    # paceline keys by the peer it reports: each forwarded client its own bucket, and a
    # spoofed entry left of the real client changes nothing.
    process, url, _ = serve(tmp_path, "uvicorn", "--proxy-headers",
                            "--forwarded-allow-ips", "127.0.0.1")
    try:
        assert rotating(url) == [200] * 8
        assert spoofing(url) == [200, 200, 429, 429]
    finally:
        stop(process)
    # paceline resolves the client (uvicorn's proxy headers off): the same.
    process, url, _ = serve(tmp_path, "paceline", "--no-proxy-headers")
    try:
        assert rotating(url) == [200] * 8
        assert spoofing(url) == [200, 200, 429, 429]
    finally:
        stop(process)


def test_both_resolving_the_client_is_reported_loudly(tmp_path):
    # uvicorn's defaults (proxy headers on, 127.0.0.1 trusted) with behind_proxies of
    # another network: two trust lists that disagree.
    process, url, log = serve(tmp_path, "both")
    try:
        rotating(url, 2)
    finally:
        stop(process)
    log.seek(0)
    said = log.read()
    assert "Two trust lists disagree" in said and "--no-proxy-headers" in said, said


# --- Configuration errors at import ---------------------------------------------------


def test_a_bad_limit_fails_where_it_is_written(tmp_path):
    with pytest.raises(ValueError, match="printable ASCII"):
        Limit("per ip\n", 10)
    with pytest.raises(ValueError, match="trusted proxy network"):
        KeySource.behind_proxies(["10.0.0.0/33"])
    with pytest.raises(ValueError, match="not a rate"):
        Limit("api", "ten per second")
    path = str(tmp_path / "shared")
    Limit("api", 5, per=60.0, shared=path)
    with pytest.raises(ValueError, match="the file enforces"):
        Limit("api", 6, per=60.0, shared=path)  # at the Limit, not at the first request
    with pytest.raises(ValueError, match="holds the limit"):
        Limit("login", 5, per=60.0, shared=path)


# --- What slowapi users reach for -----------------------------------------------------


def test_rates_as_text_and_as_floats():
    app = RateLimitMiddleware(ok, [Limit("api", "2/minute;3/hour")])
    assert statuses(app, 3) == [200, 200, 429]
    half = RateLimitMiddleware(ok, [Limit("slow", 0.5)])  # one every two seconds
    assert statuses(half, 2) == [200, 429]
    status, headers = asyncio.run(call(RateLimitMiddleware(ok, [Limit("api", "2/minute;3/hour")])))
    assert status == 200
    with pytest.raises(ValueError, match="carries its own period"):
        Limit("api", "5/minute", per=60.0)


def test_costs_fixed_from_a_function_and_awaited():
    fixed = RateLimitMiddleware(ok, [Limit("api", 10, per=HOUR, cost=4)])
    assert statuses(fixed, 3) == [200, 200, 429]

    def by_header(scope):
        return int(dict(scope["headers"]).get(b"x-cost", b"1"))

    async def by_header_async(scope):
        await asyncio.sleep(0)
        return by_header(scope)

    for fn in (by_header, by_header_async):
        app = RateLimitMiddleware(ok, [Limit("api", 10, per=HOUR, cost=fn)])
        assert statuses(app, 2, headers=[("x-cost", "5")]) == [200, 200]
        assert statuses(app, 1, headers=[("x-cost", "1")]) == [429]
        assert statuses(app, 1, headers=[("x-cost", "0")]) == [200]
    never = RateLimitMiddleware(ok, [Limit("api", 10, per=HOUR, cost=11)])
    status, headers = asyncio.run(call(never))
    assert status == 429 and "retry-after" not in headers


def test_tiers_per_method_limits_and_exemptions():
    def api_key(scope):
        return dict(scope["headers"]).get(b"x-api-key", b"").decode() or None

    def tier(key):
        return "3/hour" if key.startswith("paid-") else None  # None: the limit's own

    app = RateLimitMiddleware(ok, [
        Limit("writes", 1, per=HOUR, key=api_key, quota_for=tier, methods=["POST"],
              exempt_when=lambda scope: scope["path"] == "/webhook"),
    ])
    assert statuses(app, 3, method="GET", headers=[("x-api-key", "free-1")]) == [200] * 3
    assert statuses(app, 2, method="POST", headers=[("x-api-key", "free-1")]) == [200, 429]
    assert statuses(app, 4, method="POST", headers=[("x-api-key", "paid-1")]) == [200] * 3 + [429]
    assert statuses(app, 3, method="POST", path="/webhook",
                    headers=[("x-api-key", "free-1")]) == [200] * 3
    with pytest.raises(ValueError, match="computed in Python"):
        Limit("writes", 1, quota_for=tier)


def test_an_exempt_endpoint_and_async_keys_from_authentication():
    fastapi = pytest.importorskip("fastapi")
    from fastapi import Depends, Request
    from fastapi.testclient import TestClient

    app = fastapi.FastAPI()

    async def authenticate(request: Request):
        # What an auth dependency leaves for later dependencies.
        request.state.user = request.headers.get("x-user", "anonymous")

    async def user(scope):
        await asyncio.sleep(0)
        return scope["state"]["user"]

    per_user = RouteLimit(Limit("per-user", 2, per=HOUR, key=user))

    @app.get("/me", dependencies=[Depends(authenticate), Depends(per_user)])
    async def me():
        return {"ok": True}

    @app.get("/health")
    @exempt
    async def health():
        return {"ok": True}

    app.add_middleware(RateLimitMiddleware, limits=[Limit("per-ip", 1, per=HOUR)])
    with TestClient(app) as client:
        assert [client.get("/health").status_code for _ in range(3)] == [200] * 3
        ann = [client.get("/me", headers={"x-user": "ann"}).status_code for _ in range(1)]
    # The per-ip limit (1/hour) took the one /me call above; a fresh app for per-user:
    app2 = fastapi.FastAPI()

    @app2.get("/me", dependencies=[Depends(authenticate), Depends(per_user)])
    async def me2():
        return {"ok": True}

    with TestClient(app2) as client:
        codes = [client.get("/me", headers={"x-user": "bob"}).status_code for _ in range(3)]
        other = client.get("/me", headers={"x-user": "cid"}).status_code
    assert ann == [200] and codes == [200, 200, 429] and other == 200


# --- Route limits, fields, and the thread pool ----------------------------------------


def test_a_decorated_plain_endpoint_runs_in_the_thread_pool_and_data_keeps_its_fields():
    starlette = pytest.importorskip("starlette.applications")
    from starlette.requests import Request
    from starlette.routing import Route
    from starlette.testclient import TestClient

    limit = RouteLimit(Limit("slow", 5, per=HOUR), headers_on_success=True)
    loop_threads = []

    @limit.limit
    def blocking(request: Request):
        loop_threads.append(threading.current_thread())
        return {"served": True}

    app = starlette.Starlette(routes=[Route("/", blocking)])
    with TestClient(app) as client:
        reply = client.get("/")
    assert reply.status_code == 200 and reply.json() == {"served": True}
    assert reply.headers["ratelimit"] == '"slow";r=4;t=720'
    assert loop_threads and loop_threads[0] is not threading.main_thread()


def test_fields_on_success_never_duplicate_the_apps_own():
    async def own(scope, receive, send):
        headers = [(b"ratelimit", b'"upstream";r=1;t=1')]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    app = RateLimitMiddleware(own, [Limit("api", 5, per=HOUR)], headers_on_success=True)
    sent = []

    async def run():
        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(message):
            sent.append(message)

        await app({"type": "http", "method": "GET", "path": "/", "headers": [],
                   "client": ("192.0.2.1", 1)}, receive, send)

    asyncio.run(run())
    names = [name for name, _ in sent[0]["headers"]]
    assert names.count(b"ratelimit") == 1 and b"ratelimit-policy" in names


# --- Shared files removed under running workers ---------------------------------------


def test_workers_rejoin_a_shared_file_removed_under_them(tmp_path):
    path = str(tmp_path / "per-ip")
    # Two workers' middlewares (two `Limit`s: each worker makes its own at import).
    a = RateLimitMiddleware(ok, [Limit("per-ip", 2, per=HOUR, shared=path)])
    b = RateLimitMiddleware(ok, [Limit("per-ip", 2, per=HOUR, shared=path)])
    assert statuses(a, 1) == [200] and statuses(b, 1) == [200]
    os.unlink(path)  # an operator, or a cleaner of /tmp
    time.sleep(1.1)
    # Each notices within a second and joins the file the path leads to now: one bound.
    assert statuses(a, 1) + statuses(b, 1) + statuses(a, 1) == [200, 200, 429]


# --- A waiting request's body ----------------------------------------------------------


def test_a_waiting_request_reads_at_most_its_buffer_of_body():
    app_read = []
    read_before_turn = []

    async def app(scope, receive, send):
        read_before_turn.append(sum(reads))
        while True:
            message = await receive()
            app_read.append(len(message.get("body", b"")))
            if not message.get("more_body"):
                break
        await ok(scope, receive, send)

    middleware = RateLimitMiddleware(app, [Limit("api", 1, per=0.3)], wait_up_to=5.0)

    reads = []

    async def upload():
        chunks = [b"x" * 16384] * 64  # 1 MiB in 16 KiB chunks

        async def receive():
            if chunks:
                chunk = chunks.pop()
                reads.append(len(chunk))
                return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
            await asyncio.sleep(10)
            return {"type": "http.disconnect"}

        async def send(message):
            pass

        scope = {"type": "http", "method": "POST", "path": "/", "headers": [],
                 "client": ("192.0.2.1", 1)}
        await call(middleware)  # spends the burst: the upload waits 0.3 s
        app_read.clear()
        read_before_turn.clear()
        started = time.monotonic()
        await middleware(scope, receive, send)
        return time.monotonic() - started

    waited = asyncio.run(upload())
    assert waited >= 0.2
    # While it waited, at most the buffer (64 KiB) and one chunk past it were read; the
    # app read the rest after its turn came, all of it.
    assert read_before_turn[-1] <= 64 * 1024 + 16384
    assert sum(app_read) == 1 << 20
    assert len(app_read) == 64


def test_the_readmes_slowapi_migration_app_behaves_as_slowapis(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi import Depends, FastAPI
    from fastapi.testclient import TestClient

    from paceline.asgi import exempt

    app = FastAPI()
    app.add_middleware(
        RateLimitMiddleware,
        # The README's "100/minute" as "100/hour": no cell comes back during the test.
        limits=[Limit("default", "100/hour", shared=str(tmp_path / "api"))],
    )
    search_limit = RouteLimit(Limit("search", "5/second", shared=str(tmp_path / "api-search")))

    @app.get("/search", dependencies=[Depends(search_limit)])
    async def search(q: str):
        return {"q": q}

    @app.get("/health")
    @exempt
    async def health():
        return {"ok": True}

    with TestClient(app) as client:
        searches = [client.get("/search", params={"q": "x"}).status_code for _ in range(7)]
        assert searches == [200] * 5 + [429] * 2
        refusal = client.get("/search", params={"q": "x"})
        assert refusal.headers["retry-after"] == "1"
        assert refusal.headers["ratelimit"].startswith('"search";r=0')
        # 8 requests of the default's 100 are spent; the health check spends none.
        assert all(client.get("/health").status_code == 200 for _ in range(150))
        others = [client.get("/nowhere").status_code for _ in range(100)]
        assert others.count(404) == 92 and others[92:] == [429] * 8
