"""paceline.httpx and paceline.aiohttp against a real upstream on loopback that enforces
its own limit (50 per second, bursts of 10) and answers 429 with Retry-After and, unless
told otherwise, the IETF RateLimit fields. The upstream logs every request it sees."""

import asyncio
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

httpx = pytest.importorskip("httpx")  # installed by .ci/run

import paceline  # noqa: E402
import paceline.httpx  # noqa: E402

UPSTREAM = """
import math, os, time
import paceline

limiter = paceline.Limiter(int(os.environ["RATE"]), per=1.0, burst=10)
rate = [int(os.environ["RATE"])]
fields = os.environ["FIELDS"]
log = open(os.environ["LOG"], "a", buffering=1)


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/quota":
        rate[0] = int(scope["query_string"].decode())
        limiter.set_quota(rate[0], per=1.0, burst=10)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    now = time.monotonic()
    headers, retry_after = [], ""
    if limiter.try_acquire():
        status = 200
    else:
        status = 429
        retry_after = str(max(1, math.ceil(limiter.wait_time())))
        headers.append((b"retry-after", retry_after.encode()))
    if fields == "all":
        reset = max(1, math.ceil(limiter.wait_time(10)))
        headers.append((b"ratelimit-policy", f'"default";q={rate[0]};w=1'.encode()))
        headers.append((b"ratelimit", f'"default";r={limiter.remaining()};t={reset}'.encode()))
    log.write(f"{now} {status} {retry_after}\\n")
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})
"""


class Upstream:
    """The upstream above, served by uvicorn on a free loopback port."""

    def __init__(self, tmp_path, rate=50, fields="all"):
        (tmp_path / "upstream.py").write_text(UPSTREAM)
        self.log = tmp_path / "requests.log"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(os.environ, RATE=str(rate), FIELDS=fields, LOG=str(self.log))
        self.server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "upstream:app", "--port", str(self.port),
             "--log-level", "warning", "--no-access-log"],
            cwd=tmp_path, env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "quota?" + str(rate), timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the upstream did not start"
                time.sleep(0.1)
        time.sleep(0.3)  # its burst back

    def requests(self):
        """(time, status, retry-after seconds or None) of every request it saw."""
        rows = []
        for line in self.log.read_text().splitlines():
            parts = line.split()
            rows.append((float(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else None))
        return rows

    def set_rate(self, rate):
        with urllib.request.urlopen(self.url + "quota?" + str(rate), timeout=5):
            pass

    def close(self):
        self.server.terminate()
        self.server.wait(timeout=30)


@pytest.fixture
def upstream(tmp_path, request):
    server = Upstream(tmp_path, **getattr(request, "param", {}))
    yield server
    server.close()


async def run_tasks(transport, url, requests, tasks):
    statuses = []
    async with httpx.AsyncClient(transport=transport, timeout=60) as client:

        async def worker(count):
            for _ in range(count):
                statuses.append((await client.get(url)).status_code)

        t0 = time.monotonic()
        await asyncio.gather(*(worker(requests // tasks) for _ in range(tasks)))
        return statuses, time.monotonic() - t0


def test_a_client_configured_too_fast_converges_to_the_upstreams_pace(upstream):
    # 100/s against an upstream that allows 50/s: after the first refusals, the announced
    # policy becomes the client's quota.
    limiter = paceline.Limiter(100, per=1.0, burst=1)
    transport = paceline.httpx.AsyncTransport(limiter)
    statuses, elapsed = asyncio.run(run_tasks(transport, upstream.url, 1000, 50))
    seen = upstream.requests()
    refused = sum(1 for _, status, _ in seen if status == 429)
    assert statuses.count(200) == 1000, "every request got through in the end"
    assert refused < 0.03 * 1000, f"{refused} refusals"
    holds = max((ra for _, _, ra in seen if ra), default=0)
    assert elapsed <= 1000 / 50 * 1.15 + holds, (elapsed, holds)
    assert elapsed >= 1000 / 50 * 0.9 - 1, elapsed


@pytest.mark.parametrize("upstream", [{"fields": "retry-after"}], indirect=True)
def test_no_request_leaves_while_a_hold_runs_booked_turns_included(upstream):
    limiter = paceline.Limiter(100, per=1.0, burst=1)
    transport = paceline.httpx.AsyncTransport(limiter, retries=5)
    statuses, _ = asyncio.run(run_tasks(transport, upstream.url, 150, 15))
    seen = upstream.requests()
    holds = [(t, ra) for t, status, ra in seen if status == 429]
    assert holds, "the upstream never refused: the test proves nothing"
    # Requests already on the wire when a refusal was sent may still arrive: 50 ms of
    # grace. After that, nothing until the hold is over.
    for start, seconds in holds:
        inside = [t for t, _, _ in seen if start + 0.05 < t < start + seconds - 0.01]
        assert not inside, f"{len(inside)} requests inside the hold from {start}"
    assert statuses.count(200) >= 100


def test_the_client_follows_a_lower_limit_within_one_window(upstream):
    limiter = paceline.Limiter(100, per=1.0, burst=1)
    transport = paceline.httpx.AsyncTransport(limiter)
    changed = []

    def lower_later():
        time.sleep(3.0)
        changed.append(time.monotonic())
        upstream.set_rate(25)

    threading.Thread(target=lower_later).start()
    statuses, _ = asyncio.run(run_tasks(transport, upstream.url, 300, 30))
    seen = upstream.requests()
    after = [(t, s) for t, s, _ in seen if t > changed[0] + 1.0]
    span = after[-1][0] - after[0][0]
    admitted = sum(1 for _, s in after if s == 200)
    refused = sum(1 for _, s in after if s == 429)
    # At 25/s from a window after the change (the burst of 10 on top, 10 % for timing).
    assert admitted <= (25 * span + 10) * 1.1, (admitted, span)
    assert refused <= 3, refused
    # The upstream's new pace, at the 95 % the follower keeps of an announced one.
    # A host is its name and its port (not the scheme's default).
    host = httpx.URL(upstream.url).netloc.decode()
    assert host.startswith("127.0.0.1:")
    assert transport.pace(host)[1] == pytest.approx(1 / (25 * 0.95), rel=0.01)


def test_a_keyed_limiter_holds_each_host_on_its_own(upstream):
    limiter = paceline.KeyedLimiter(200, per=1.0, burst=1)
    transport = paceline.httpx.Transport(limiter, retries=0)
    with httpx.Client(transport=transport, timeout=30) as client:
        # Threads, with the sync transport: faster than the upstream allows.
        threads = [
            threading.Thread(target=lambda: [client.get(upstream.url) for _ in range(10)])
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    seen = upstream.requests()
    # The policy the first response announced paces the host: its burst is never spent,
    # so nothing (or next to nothing) is refused.
    assert sum(1 for _, status, _ in seen if status == 429) <= 3
    host = httpx.URL(upstream.url).netloc.decode()
    assert transport._options.hosts.followers.announced(host) == 50.0
    # A hold is the host's alone (another port of the same name is another host).
    followers = transport._options.hosts.followers
    transport._options.hosts.observe(host, 429, [("retry-after", b"5")])
    assert 4.0 < followers.wait_time(host) <= 5.0
    assert followers.wait_time("localhost") == 0.0
    assert followers.wait_time("127.0.0.1:1") == 0.0


def test_aiohttp_sessions_are_paced_and_follow_holds(upstream):
    aiohttp = pytest.importorskip("aiohttp")
    import paceline.aiohttp

    limiter = paceline.Limiter(100, per=1.0, burst=1)

    config = paceline.aiohttp.trace_config(limiter)

    async def main():
        async with aiohttp.ClientSession(trace_configs=[config]) as session:
            statuses = []
            for _ in range(40):
                async with session.get(upstream.url) as response:
                    statuses.append(response.status)
            return statuses

    statuses = asyncio.run(main())
    seen = upstream.requests()
    # The policy it announced became the client's pace after the first responses.
    assert config._paceline_hosts.followers.announced("") == 50.0
    assert statuses.count(429) <= 3, statuses
    assert len(seen) == 40


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="paceline.Limiter or KeyedLimiter"):
        paceline.httpx.AsyncTransport(object())
    with pytest.raises(ValueError, match="retries"):
        paceline.httpx.Transport(paceline.Limiter(1), retries=-1)
    limiter = paceline.Limiter(1)
    with pytest.raises(ValueError, match="seconds"):
        limiter.hold(float("nan"))
    limiter.hold(0.5)
    assert 0.4 < limiter.wait_time() <= 0.5
    assert math.isfinite(limiter.wait_time())


def test_aiohttp_paces_every_hop_of_a_redirect_chain():
    # Each hop of a redirect is a request to the upstream: it waits its turn as httpx's
    # hops do, and the hop's response steers the follower.
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp import web

    import paceline.aiohttp

    arrivals = []

    async def hop(request):
        arrivals.append(time.monotonic())
        n = int(request.rel_url.query.get("n", "0"))
        if n > 0:
            raise web.HTTPFound(f"/?n={n - 1}")
        return web.Response(text="done")

    async def main():
        (runner,), (port,) = await _servers(hop)
        config = paceline.aiohttp.trace_config(paceline.Limiter(10, per=1.0, burst=1))
        try:
            async with aiohttp.ClientSession(trace_configs=[config]) as session:
                async with session.get(f"http://127.0.0.1:{port}/?n=5") as response:
                    assert await response.text() == "done"
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert len(arrivals) == 6
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    # 10/s, burst 1: the turns 100 ms apart. An arrival is its turn plus the server's
    # scheduling delay, which a loaded machine stretches for one hop and not the next:
    # so each hop at least half a turn after the one before (unpaced, they come a
    # millisecond or two apart) and the five turns' span whole (less 20 ms).
    assert min(gaps) >= 0.05, gaps
    assert arrivals[-1] - arrivals[0] >= 0.48, gaps


def test_a_hold_that_comes_while_the_limiter_waits_refuses_as_its_turn_comes():
    # A's 429 holds the upstream 5 s while B waits its limiter's turn (1 s away); B's
    # timeout is 2.5 s: B is refused as its limiter's turn comes, not at its deadline.
    async def handle(request):
        if request.headers.get("x-which") == "a":
            await asyncio.sleep(0.3)  # answered once B waits for its turn
            return httpx.Response(429, headers={"retry-after": "5"})
        return httpx.Response(200)

    async def go():
        transport = paceline.httpx.AsyncTransport(
            paceline.Limiter(1, 1.0, 1), transport=httpx.MockTransport(handle), retries=0
        )
        async with httpx.AsyncClient(transport=transport, timeout=2.5) as client:
            started = time.monotonic()

            async def b():
                await asyncio.sleep(0.05)
                with pytest.raises(httpx.PoolTimeout):
                    await client.get("http://u.example/", headers={"x-which": "b"})
                return time.monotonic() - started

            a = client.get("http://u.example/", headers={"x-which": "a"})
            first, took = await asyncio.gather(a, b())
            assert first.status_code == 429
            assert 0.8 < took < 2.0, took

    asyncio.run(go())


async def _servers(*handlers):
    """Real aiohttp servers on loopback, one per handler: (runners, ports)."""
    from aiohttp import web

    runners, ports = [], []
    for handler in handlers:
        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        ports.append(site._server.sockets[0].getsockname()[1])
    return runners, ports


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
def test_two_ports_of_one_address_are_two_hosts(client):
    # A holds for 30 s; B, another server on the same address, answers at once.
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp import web

    import paceline.aiohttp

    async def a(request):
        return web.Response(status=429, headers={"Retry-After": "30"})

    async def b(request):
        return web.Response(text="ok")

    async def main():
        runners, (pa, pb) = await _servers(a, b)
        limiter = paceline.KeyedLimiter(100, burst=1)
        try:
            if client == "httpx":
                transport = paceline.httpx.AsyncTransport(limiter, retries=0)
                async with httpx.AsyncClient(transport=transport, timeout=2.0) as c:
                    assert (await c.get(f"http://127.0.0.1:{pa}/")).status_code == 429
                    started = time.monotonic()
                    assert (await c.get(f"http://127.0.0.1:{pb}/")).status_code == 200
            else:
                config = paceline.aiohttp.trace_config(limiter)
                timeout = aiohttp.ClientTimeout(total=2.0)
                async with aiohttp.ClientSession(trace_configs=[config], timeout=timeout) as s:
                    async with s.get(f"http://127.0.0.1:{pa}/") as r:
                        assert r.status == 429
                    started = time.monotonic()
                    async with s.get(f"http://127.0.0.1:{pb}/") as r:
                        assert r.status == 200
            return time.monotonic() - started
        finally:
            for runner in runners:
                await runner.cleanup()

    assert asyncio.run(main()) < 1.0


def test_the_default_port_written_or_not_is_one_host():
    seen = []
    transport = paceline.httpx.AsyncTransport(
        paceline.KeyedLimiter(100, burst=1),
        transport=httpx.MockTransport(lambda request: httpx.Response(200)),
        key=lambda host: seen.append(host) or host,
    )

    async def main():
        async with httpx.AsyncClient(transport=transport) as c:
            for url in ("http://LOCALHOST:80/", "http://localhost/", "https://h:443/",
                        "http://h:8080/", "http://[::1]:8080/"):
                await c.get(url)

    asyncio.run(main())
    assert seen == ["localhost", "localhost", "h", "h:8080", "[::1]:8080"]


def test_an_aiohttp_redirect_hop_further_than_what_is_left_of_the_timeout_fails_at_once():
    # A answers after 0.7 s with a redirect to B, held until 1.6 s: with total=1.0 the
    # hop's turn is past what is left, so it fails at once with aiohttp's own
    # ConnectionTimeoutError, not when the session's timer fires.
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp import web

    import paceline.aiohttp

    calls = {"b": 0}

    async def main():
        async def a(request):
            await asyncio.sleep(0.7)
            return web.Response(status=302, headers={"Location": f"http://localhost:{ports[1]}/"})

        async def b(request):
            calls["b"] += 1
            if calls["b"] == 1:
                return web.Response(status=429, headers={"Retry-After": "1.6"})
            return web.Response(text="ok")

        runners, ports = await _servers(a, b)
        config = paceline.aiohttp.trace_config(paceline.KeyedLimiter(100, burst=1))
        timeout = aiohttp.ClientTimeout(total=1.0)
        try:
            async with aiohttp.ClientSession(trace_configs=[config], timeout=timeout) as s:
                async with s.get(f"http://localhost:{ports[1]}/") as r:
                    assert r.status == 429
                started = time.monotonic()
                with pytest.raises(aiohttp.ConnectionTimeoutError):
                    async with s.get(f"http://127.0.0.1:{ports[0]}/"):
                        pass
                return time.monotonic() - started
        finally:
            for runner in runners:
                await runner.cleanup()

    assert asyncio.run(main()) < 0.95
