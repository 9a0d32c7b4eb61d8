"""paceline.asgi against a real uvicorn (one worker, and four sharing a file) and a real
HTTP client on loopback: exact per-client bounds for many clients behind a trusted proxy,
spoofed forwarding headers, the header values against a model of the fields, the 500 of a
server that gives no client address, wait mode (a client that leaves gives its turn
back), custom refusals, FastAPI and Starlette per-route limits, and bad configuration."""

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from paceline.asgi import KeySource, Limit, RateLimitMiddleware

from asgi_calls import sent_by

HERE = os.path.dirname(os.path.abspath(__file__))
HOUR = 3600.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`uvicorn asgi_app:app` in its own process group, configured by `config`."""

    def __init__(self, config, workers=1, uds=None):
        self.port = None if uds else free_port()
        self.uds = uds
        bind = ["--uds", uds] if uds else ["--host", "127.0.0.1", "--port", str(self.port)]
        env = dict(os.environ, PACELINE_ASGI_TEST=json.dumps(config))
        # --no-proxy-headers: the client address the app sees is the socket's peer, so
        # paceline (not uvicorn) is what reads X-Forwarded-For.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "asgi_app:app", *bind, "--workers", str(workers),
             "--no-proxy-headers", "--log-level", "warning", "--app-dir", HERE],
            env=env,
            start_new_session=True,
        )
        self.url = "http://test" if uds else f"http://127.0.0.1:{self.port}"
        self.wait_until_up(workers)

    def client(self, **kw):
        transport = httpx.AsyncHTTPTransport(uds=self.uds) if self.uds else None
        return httpx.AsyncClient(base_url=self.url, transport=transport, timeout=30.0, **kw)

    def wait_until_up(self, workers):
        deadline = time.monotonic() + 60
        pids = set()
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "uvicorn exited"
            try:
                transport = httpx.HTTPTransport(uds=self.uds) if self.uds else None
                with httpx.Client(base_url=self.url, transport=transport, timeout=2) as c:
                    # Fresh connections, so the kernel spreads them over the workers.
                    r = c.get("/pid", headers={"connection": "close"})
                    if r.status_code == 200:
                        pids.add(r.text)
                        if len(pids) >= min(workers, 2):
                            return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"uvicorn did not start {workers} workers (saw {pids})")

    def stop(self):
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def serve():
    servers = []

    def start(config, **kw):
        server = Server(config, **kw)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def per_ip(burst=5, shared=None, key=("proxies", ["127.0.0.1/32"]), **extra):
    limit = {"name": "per-ip", "rate": burst, "per": HOUR, "burst": burst, "key": list(key)}
    if shared:
        limit["shared"] = shared
    return {"limits": [limit], **extra}


async def burst_from_clients(server, clients, each, fresh_connections=False):
    """Every client sends `each` requests at once; the statuses per client."""
    headers = {"connection": "close"} if fresh_connections else {}
    async with server.client(limits=httpx.Limits(max_connections=64)) as http:

        async def one(ip):
            r = await http.get("/", headers={"x-forwarded-for": ip, **headers})
            return ip, r.status_code

        results = await asyncio.gather(
            *(one(ip) for ip in clients for _ in range(each))
        )
    statuses = {ip: [] for ip in clients}
    for ip, status in results:
        statuses[ip].append(status)
    return statuses


CLIENTS = [f"203.0.{i // 250}.{i % 250 + 1}" for i in range(60)]


def test_each_client_gets_exactly_its_burst_behind_a_trusted_proxy(serve):
    server = serve(per_ip(burst=5))
    statuses = asyncio.run(burst_from_clients(server, CLIENTS, 8))
    for ip, got in statuses.items():
        assert sorted(got) == [200] * 5 + [429] * 3, (ip, got)


def test_four_workers_sharing_a_file_enforce_one_bound_per_client(serve, tmp_path):
    server = serve(per_ip(burst=5, shared=str(tmp_path / "api")), workers=4)
    # Fresh connections: the kernel hands them to all four workers.
    statuses = asyncio.run(burst_from_clients(server, CLIENTS, 8, fresh_connections=True))
    for ip, got in statuses.items():
        assert sorted(got) == [200] * 5 + [429] * 3, (ip, got)


def test_a_spoofed_forwarding_header_counts_under_the_proxys_client(serve):
    server = serve(per_ip(burst=5))

    async def run():
        async with server.client() as http:
            got = []
            for i in range(12):
                # The proxy (127.0.0.1) appends the client it saw; the client wrote the rest.
                spoof = f"198.51.100.{i}, 192.0.2.{i}"
                r = await http.get("/", headers={"x-forwarded-for": f"{spoof}, 203.0.113.9"})
                got.append(r.status_code)
            return got

    assert asyncio.run(run()) == [200] * 5 + [429] * 7


def test_forwarding_headers_from_an_untrusted_peer_are_ignored(serve):
    # The trusted proxies are elsewhere: the peer (127.0.0.1) is the client, whatever
    # it writes.
    server = serve(per_ip(burst=5, key=("proxies", ["10.99.0.0/16"])))
    statuses = asyncio.run(burst_from_clients(server, CLIENTS[:10], 1))
    got = sorted(s for ss in statuses.values() for s in ss)
    assert got == [200] * 5 + [429] * 5


def model_fields(name, rate, per, burst, n):
    """The RateLimit fields of the n-th request (1-based) in a burst sent at once to a
    fresh key, as the IETF draft and paceline's layer write them: the policy is q cells
    per w seconds with w the burst window rounded up; r the cells left; t the seconds
    (rounded up) until the key is full again; a refusal's Retry-After the seconds
    (rounded up) until the next cell."""
    interval = per / rate
    w = max(1, math.ceil(interval * burst))
    q = int(w / interval)
    admitted = min(n, burst)
    fields = {
        "ratelimit-policy": f'"{name}";q={q};w={w}',
        "ratelimit": f'"{name}";r={burst - admitted};t={math.ceil(interval * admitted)}',
    }
    if n > burst:
        fields["retry-after"] = str(math.ceil(interval))
    return fields


@pytest.mark.parametrize("rate,per,burst", [(3, 60.0, 3), (100, HOUR, 4), (2, 10.0, 1)])
def test_header_values_follow_the_model(serve, rate, per, burst):
    config = {
        "limits": [{"name": "api", "rate": rate, "per": per, "burst": burst,
                    "key": ["proxies", ["127.0.0.1/32"]]}],
        "headers_on_success": True,
    }
    server = serve(config)

    async def run():
        async with server.client() as http:
            out = []
            for _ in range(burst + 2):
                r = await http.get("/", headers={"x-forwarded-for": "192.0.2.1"})
                out.append((r.status_code, {k: r.headers.get(k) for k in
                                            ("ratelimit-policy", "ratelimit", "retry-after")}))
            return out

    for n, (status, fields) in enumerate(asyncio.run(run()), start=1):
        expected = model_fields("api", rate, per, burst, n)
        assert status == (200 if n <= burst else 429)
        assert {k: v for k, v in fields.items() if v is not None} == expected, n


def test_several_limits_answer_with_the_longest_wait_and_every_field(serve):
    config = {
        "limits": [
            {"name": "per-ip", "rate": 3, "per": 60.0, "key": ["proxies", ["127.0.0.1/32"]]},
            {"name": "per-tenant", "rate": 4, "per": HOUR, "key": ["tenant"]},
        ],
    }
    server = serve(config)

    async def run():
        async with server.client() as http:
            out = []
            for i in range(5):
                r = await http.get("/", headers={"x-forwarded-for": f"192.0.2.{i % 2}",
                                                 "x-tenant": "acme"})
                out.append(r)
            return out

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 4 + [429]
    refused = responses[-1]
    # The tenant's next cell is 15 minutes away; the client's own limit has cells left.
    assert refused.headers["retry-after"] == "900"
    assert refused.headers["ratelimit-policy"] == '"per-ip";q=3;w=60, "per-tenant";q=4;w=3600'
    assert refused.headers["ratelimit"] == '"per-ip";r=1;t=40, "per-tenant";r=0;t=3600'
    assert "per-tenant" in refused.text


def test_a_server_that_gives_no_client_address_answers_500_naming_the_fix(serve, tmp_path):
    server = serve(per_ip(key=("peer",)), uds=str(tmp_path / "sock"))

    async def run():
        async with server.client() as http:
            return await http.get("/")

    r = asyncio.run(run())
    assert r.status_code == 500
    assert "keys clients by their address" in r.text
    assert "on_missing_key" in r.text and "--proxy-headers" in r.text


def test_custom_refusal_keeps_retry_after_and_the_fields(serve):
    server = serve(per_ip(burst=1, json_refusal=True))

    async def run():
        async with server.client() as http:
            return [await http.get("/", headers={"x-forwarded-for": "192.0.2.7"})
                    for _ in range(2)]

    ok, refused = asyncio.run(run())
    assert ok.status_code == 200 and refused.status_code == 429
    assert refused.json() == {"error": "rate limited", "limit": "per-ip", "retry_after": 3600}
    assert refused.headers["retry-after"] == "3600"
    assert refused.headers["ratelimit"] == '"per-ip";r=0;t=3600'
    assert refused.headers["content-type"] == "application/json"


def paced(rate, per, wait_up_to):
    """One global limit (burst 1) in wait mode."""
    limit = {"name": "paced", "rate": rate, "per": per, "burst": 1, "key": ["global"]}
    return {"limits": [limit], "wait_up_to": wait_up_to}


def test_wait_mode_serves_in_turn_at_the_rate(serve):
    server = serve(paced(rate=10, per=1.0, wait_up_to=5.0))

    async def run():
        async with server.client() as http:
            start = time.monotonic()
            statuses = await asyncio.gather(*(http.get("/") for _ in range(10)))
            return [r.status_code for r in statuses], time.monotonic() - start

    statuses, took = asyncio.run(run())
    assert statuses == [200] * 10
    # Ten turns 100 ms apart, the first at once: at least 0.9 s (generous above).
    assert 0.85 <= took < 8.0, took


def test_wait_mode_refuses_beyond_wait_up_to(serve):
    server = serve(paced(rate=1, per=60.0, wait_up_to=1.0))

    async def run():
        async with server.client() as http:
            return [(await http.get("/")).status_code for _ in range(2)]

    assert asyncio.run(run()) == [200, 429]


def test_a_client_that_leaves_while_waiting_gives_its_turn_back():
    """Directly on the ASGI interface, where the disconnect is in the test's hands: a
    request waiting its turn gets `http.disconnect`; the next one is served in the turn
    it gave back, not one later."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    per = 4.0
    middleware = RateLimitMiddleware(
        app,
        limits=[Limit("slow", rate=1, per=per, burst=1, key=KeySource.global_())],
        wait_up_to=3 * per,
    )

    async def request(leave_after=None):
        sent = []
        left = asyncio.Event()

        async def receive():
            if leave_after is None:
                await asyncio.Event().wait()  # never: the client stays
            await asyncio.sleep(leave_after)
            left.set()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
                 "client": ("192.0.2.1", 1234)}
        await middleware(scope, receive, send)
        return sent

    async def run():
        start = time.monotonic()
        first = await request()
        leaving = await request(leave_after=0.2)  # would be served at `per`
        served = await request()  # takes the turn given back: at `per`, not 2 * per
        return first, leaving, served, time.monotonic() - start

    first, leaving, served, took = asyncio.run(run())
    assert first[0]["status"] == 200
    assert leaving == []  # nothing was sent to a client that left
    assert served[0]["status"] == 200
    assert per - 0.1 <= took < 2 * per - 0.5, took


def test_a_request_body_read_while_waiting_reaches_the_app(serve):
    server = serve(paced(rate=5, per=1.0, wait_up_to=5.0))

    async def run():
        async with server.client() as http:
            bodies = [os.urandom(n) for n in (10, 70_000, 1)]
            rs = await asyncio.gather(*(http.post("/upload", content=b) for b in bodies))
            return [r.text for r in rs], [str(len(b)) for b in bodies]

    got, expected = asyncio.run(run())
    assert got == expected


def test_options_are_exempt_and_other_scopes_pass(serve):
    server = serve(per_ip(burst=1))

    async def run():
        async with server.client() as http:
            h = {"x-forwarded-for": "192.0.2.9"}
            return [(await http.request(m, "/", headers=h)).status_code
                    for m in ("OPTIONS", "OPTIONS", "GET", "GET")]

    # OPTIONS reaches the app (FastAPI answers 405 for a GET-only route), never counted.
    assert asyncio.run(run()) == [405, 405, 200, 429]


def test_fastapi_dependency_and_starlette_decorator(serve):
    server = serve(per_ip(burst=1000))

    async def run():
        async with server.client() as http:
            h = {"x-forwarded-for": "192.0.2.50"}
            logins = [await http.post("/login", headers=h) for _ in range(3)]
            other = await http.post("/login", headers={"x-forwarded-for": "192.0.2.51"})
            decorated = [await http.get("/decorated", headers=h) for _ in range(3)]
            plain = [await http.get("/plain", headers=h) for _ in range(3)]
            return logins, other, decorated, plain

    logins, other, decorated, plain = asyncio.run(run())
    assert [r.status_code for r in logins] == [200, 200, 429]
    assert logins[2].headers["retry-after"] == "1800"
    assert logins[2].headers["ratelimit"] == '"login";r=0;t=3600'
    assert "login" in logins[2].json()["detail"]
    assert other.status_code == 200
    assert [r.status_code for r in decorated] == [200, 200, 429]
    assert decorated[0].headers["ratelimit"] == '"decorated";r=1;t=1800'
    assert decorated[2].headers["retry-after"] == "1800"
    assert [r.status_code for r in plain] == [200, 200, 429]
    assert plain[1].headers["ratelimit"] == '"plain";r=0;t=3600'
    assert plain[2].headers["retry-after"] == "1800"


def test_bad_configuration_raises_at_start_up():
    async def app(scope, receive, send):
        pass

    with pytest.raises(ValueError, match="rate"):
        Limit("x", rate=0)
    with pytest.raises(ValueError, match="per"):
        Limit("x", rate=1, per=-1)
    with pytest.raises(ValueError, match="burst"):
        Limit("x", rate=1, burst=0)
    with pytest.raises(ValueError, match="trusted proxy network"):
        KeySource.behind_proxies(["10.0.0.0/33"])
    with pytest.raises(TypeError, match="list of networks"):
        KeySource.behind_proxies("10.0.0.0/8")
    with pytest.raises(ValueError, match="header name"):
        KeySource.header("not a header")
    with pytest.raises(ValueError, match="ipv6_prefix"):
        KeySource.peer_ip(ipv6_prefix=129)
    with pytest.raises(ValueError, match="name"):
        RateLimitMiddleware(app, limits=[Limit("per-ip\n", rate=1)])
    with pytest.raises(ValueError, match="share a name"):
        RateLimitMiddleware(app, limits=[Limit("a", rate=1), Limit("a", rate=2)])
    with pytest.raises(TypeError, match="non-empty list"):
        RateLimitMiddleware(app, limits=[])
    with pytest.raises(ValueError, match="on_missing_key"):
        RateLimitMiddleware(app, limits=[Limit("a", rate=1)], on_missing_key="maybe")
    with pytest.raises(ValueError, match="wait_up_to"):
        RateLimitMiddleware(app, limits=[Limit("a", rate=1)], wait_up_to=-1)
    with pytest.raises(ValueError, match="max_keys"):
        Limit("a", rate=1, shared="/dev/shm/x", max_keys=10)


def test_a_shared_file_made_for_another_quota_is_refused_at_start_up(tmp_path):
    async def app(scope, receive, send):
        pass

    path = str(tmp_path / "api")
    RateLimitMiddleware(app, limits=[Limit("a", rate=5, per=60.0, shared=path)])
    with pytest.raises(ValueError, match="the file enforces .* on_mismatch"):
        RateLimitMiddleware(app, limits=[Limit("a", rate=6, per=60.0, shared=path)])
    # A deploy that changes the quota replaces it for every process.
    RateLimitMiddleware(
        app, limits=[Limit("a", rate=6, per=60.0, shared=path, on_mismatch="replace")]
    )
    RateLimitMiddleware(app, limits=[Limit("a", rate=6, per=60.0, shared=path)])


def test_keys_from_a_callable_and_a_header(tmp_path):
    """The key sources Python computes (a callable) and the layer reads (a header), with
    the missing-key rules, on the ASGI interface."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def tenant(scope):
        return dict(scope["headers"]).get(b"x-tenant", b"").decode() or None

    def build(**kw):
        return RateLimitMiddleware(
            app,
            limits=[
                Limit("tenant", rate=2, per=HOUR, key=tenant),
                Limit("api-key", rate=3, per=HOUR, key=KeySource.header("X-Api-Key")),
            ],
            **kw,
        )

    async def status(middleware, headers):
        sent = await sent_by(middleware, headers=headers.items(), client=("192.0.2.1", 1))
        return sent[0]["status"]

    async def run():
        m = build()
        a = [await status(m, {"x-tenant": "a", "x-api-key": f"k{i}"}) for i in range(3)]
        b = [await status(m, {"x-tenant": "b", "x-api-key": "k9"}) for _ in range(3)]
        strict = build(on_missing_key=401)
        missing = await status(strict, {"x-tenant": "a"})
        skip = build(on_missing_key="skip")
        skipped = [await status(skip, {}) for _ in range(5)]
        return a, b, missing, skipped

    a, b, missing, skipped = asyncio.run(run())
    assert a == [200, 200, 429]  # the tenant's limit
    assert b == [200, 200, 429]  # b's tenant: 2 (the api key k9 had 3)
    assert missing == 401
    assert skipped == [200] * 5


def test_a_full_shared_table_answers_503_and_one_file_holds_one_limit(tmp_path):
    """A client the shared table has no room for spent nothing: 503 with Retry-After and no
    RateLimit field. And two limits can never share one file's buckets."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    path = str(tmp_path / "per-key")
    middleware = RateLimitMiddleware(
        app,
        limits=[
            Limit("per-key", rate=1, per=HOUR, key=KeySource.header("x-api-key"),
                  shared=path, capacity=1)
        ],
    )

    async def call(key):
        sent = await sent_by(middleware, client=("192.0.2.1", 1), raw=[(b"x-api-key", key.encode())])
        start = sent[0]
        return start["status"], dict(start.get("headers", [])), b"".join(
            m.get("body", b"") for m in sent[1:]
        )

    async def run():
        answers = []
        for i in range(1000):
            answer = await call(f"client-{i}")
            answers.append(answer)
            if answer[0] != 200:
                break
        again = await call("client-0")
        return answers, again

    answers, again = asyncio.run(run())
    status, headers, body = answers[-1]
    assert status == 503, (len(answers), status)
    assert len(answers) - 1 >= 1  # at least the capacity asked for
    assert b"ratelimit" not in headers and int(headers[b"retry-after"]) > 3000
    assert b"as many clients as it has room for" in body
    assert again[0] == 429  # a stored client that spent its quota: 429 as usual
    # Another limit on the same file is an error at start-up, even replacing the quota.
    with pytest.raises(ValueError, match="holds the limit \"per-key\""):
        RateLimitMiddleware(app, limits=[Limit("login", rate=1, per=HOUR, shared=path,
                                               capacity=1, on_mismatch="replace")])
