"""What the httpx transports and the aiohttp hook make of each thing an upstream may say,
against the fake upstream of upstream_app.py served by a real uvicorn on loopback. Each
test sets the upstream's behaviour, makes a few requests and looks at what the upstream
saw and when."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

httpx = pytest.importorskip("httpx")  # installed by .ci/run

import paceline  # noqa: E402
import paceline.httpx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class Upstream:
    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "upstream_app:app", "--port", str(self.port),
             "--log-level", "warning", "--no-access-log"],
            cwd=HERE,
        )
        self.url = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                self.requests()
                break
            except OSError:
                assert time.monotonic() < deadline, "the upstream did not start"
                time.sleep(0.1)

    def configure(self, **settings):
        request = urllib.request.Request(
            self.url + "config", data=json.dumps(settings).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=5):
            pass

    def requests(self):
        """(monotonic time, status, retry-after) of every request since the last call."""
        with urllib.request.urlopen(self.url + "log", timeout=5) as response:
            return [tuple(json.loads(line)) for line in response.read().splitlines()]

    def close(self):
        self.server.terminate()
        self.server.wait(timeout=30)


DEFAULTS = dict(
    rate=50, burst=10, window=None, fields="ietf", policy=None, extra=[],
    refusal_extra=[], date_skew=None, refuse_all=None,
)


@pytest.fixture(scope="module")
def server():
    upstream = Upstream()
    yield upstream
    upstream.close()


@pytest.fixture
def upstream(server):
    server.configure(**DEFAULTS)
    time.sleep(0.25)  # its burst back
    server.requests()
    return server


async def calls(client, url, count, tasks):
    statuses = []

    async def worker(n):
        for _ in range(n):
            statuses.append((await client.get(url)).status_code)

    share = [count // tasks + (1 if i < count % tasks else 0) for i in range(tasks)]
    await asyncio.gather(*(worker(n) for n in share))
    return statuses


def run(transport, url, count, tasks=1, limit=20.0):
    """`count` calls from `tasks` tasks through `transport`; fails after `limit` s."""

    async def main():
        async with httpx.AsyncClient(transport=transport, timeout=60) as client:
            return await asyncio.wait_for(calls(client, url, count, tasks), limit)

    started = time.monotonic()
    statuses = asyncio.run(main())
    return statuses, time.monotonic() - started


def refused_share(seen):
    return sum(1 for _, status, _ in seen if status == 429) / max(1, len(seen))


def test_a_huge_announced_window_never_parks_the_client(upstream):
    # One request per 10^9 s: a budget that long is not a pace to follow.
    upstream.configure(policy='"p";q=1;w=1000000000')
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1))
    statuses, elapsed = run(transport, upstream.url, 3, limit=10)
    assert statuses == [200] * 3 and elapsed < 3, elapsed


def test_an_announced_pace_never_spaces_turns_past_max_hold(upstream):
    upstream.configure(policy='"p";q=1;w=30')
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1), max_hold=1.0)
    statuses, elapsed = run(transport, upstream.url, 4, limit=10)
    assert statuses == [200] * 4
    # Three turns at most 1 s apart (one request per 30 s was announced).
    assert 1.5 < elapsed < 4.5, elapsed


def test_several_policies_pace_by_the_shortest_window(upstream):
    # The draft's own shape: a short window to pace by, a long one as a budget.
    upstream.configure(policy='"burst";q=10;w=1, "daily";q=1000;w=86400')
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1))
    statuses, elapsed = run(transport, upstream.url, 20, tasks=5, limit=10)
    assert statuses == [200] * 20
    # About 10 per second after the first response (not one per 86.4 s, nor 100/s).
    assert 1.5 < elapsed < 4, elapsed


def test_a_higher_announced_quota_brings_the_pace_back_up(upstream):
    upstream.configure(rate=20, burst=1)
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1))
    run(transport, upstream.url, 30, tasks=5)
    upstream.configure(rate=200, burst=10)
    upstream.requests()
    statuses, elapsed = run(transport, upstream.url, 100, tasks=10)
    # Back to the configured 100/s: about 1 s (at the 20/s announced before, 5 s).
    assert statuses.count(200) == 100
    assert elapsed < 2.5, elapsed


def test_the_callers_own_quota_change_is_kept(upstream):
    limiter = paceline.Limiter(100, burst=1)
    transport = paceline.httpx.AsyncTransport(limiter)
    run(transport, upstream.url, 5)
    limiter.set_quota(10, per=1.0, burst=1)
    statuses, elapsed = run(transport, upstream.url, 20, tasks=4)
    # 10/s, the caller's, though the upstream keeps announcing 50/s.
    assert statuses == [200] * 20
    assert elapsed > 1.7, elapsed


def test_parameters_the_client_does_not_use_are_skipped(upstream):
    upstream.configure(policy='"default";q=50;w=1;qu="request";pk=:cHsxMjM0NQ==:')
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1))
    statuses, elapsed = run(transport, upstream.url, 300, tasks=30, limit=30)
    assert statuses.count(200) == 300
    assert refused_share(upstream.requests()) <= 0.03
    # 300 at the announced 50/s, and the first hold.
    assert elapsed < 300 / 50 / 0.9 + 1.5, elapsed


@pytest.mark.parametrize("skew", [-300, 300])
def test_an_http_date_retry_after_is_read_against_the_responses_date(upstream, skew):
    # Every request is refused: "come back at <the upstream's now + 2 s>", on a clock
    # `skew` seconds off ours.
    upstream.configure(refuse_all=2, date_skew=skew, fields="retry-after")
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1), retries=1)
    statuses, elapsed = run(transport, upstream.url, 1, limit=10)
    seen = upstream.requests()
    assert statuses == [429] and len(seen) == 2
    # The retry came after the 2 s hold, not at once (300 s behind) nor 300 s later.
    assert 1.5 < seen[1][0] - seen[0][0] < 3.5


def test_the_httpx_timeout_covers_the_wait_for_a_turn(upstream):
    upstream.configure(refuse_all=30)
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1), retries=0)

    async def main():
        async with httpx.AsyncClient(transport=transport, timeout=1.0) as client:
            assert (await client.get(upstream.url)).status_code == 429
            started = time.monotonic()
            with pytest.raises(httpx.TimeoutException):
                await asyncio.wait_for(client.get(upstream.url), 10)
            return time.monotonic() - started

    assert asyncio.run(main()) < 1.5
    with httpx.Client(transport=paceline.httpx.Transport(paceline.Limiter(100, burst=1),
                                                         retries=0), timeout=1.0) as client:
        assert client.get(upstream.url).status_code == 429
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException):
            client.get(upstream.url)
        assert time.monotonic() - started < 1.5


def test_the_aiohttp_timeout_covers_the_wait_for_a_turn(upstream):
    aiohttp = pytest.importorskip("aiohttp")
    import paceline.aiohttp

    upstream.configure(refuse_all=30)

    async def main():
        config = paceline.aiohttp.trace_config(paceline.Limiter(100, burst=1))
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(trace_configs=[config], timeout=timeout) as session:
            async with session.get(upstream.url) as response:
                assert response.status == 429
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(session.get(upstream.url), 10)
            return time.monotonic() - started

    assert asyncio.run(main()) < 1.5


def test_booked_turns_move_to_a_lower_adopted_pace(upstream):
    # Without the execution bound every turn is booked at once, at 100/s; the policy the
    # first refusal announces must space them again at the upstream's pace.
    limiter = paceline.Limiter(100, burst=1, execution_bound=False)
    transport = paceline.httpx.AsyncTransport(limiter)
    statuses, elapsed = run(transport, upstream.url, 300, tasks=300, limit=30)
    seen = upstream.requests()
    assert statuses.count(200) == 300
    assert refused_share(seen) <= 0.03, refused_share(seen)
    # 300 at 50/s, and the first hold.
    assert elapsed < 300 / 50 / 0.9 + 1.5, elapsed


def test_a_keyed_limiter_follows_each_hosts_announced_pace(upstream):
    transport = paceline.httpx.AsyncTransport(paceline.KeyedLimiter(100, burst=1))
    statuses, elapsed = run(transport, upstream.url, 300, tasks=30)
    seen = upstream.requests()
    assert statuses.count(200) == 300
    assert refused_share(seen) <= 0.03, refused_share(seen)
    assert elapsed < 300 / 50 / 0.9 + 1.5, elapsed


def test_per_host_state_stays_bounded(upstream):
    # A client that calls 100 000 hosts once each keeps a bounded table: hosts that are
    # idle are forgotten (never merged with others).
    transport = paceline.httpx.AsyncTransport(
        paceline.KeyedLimiter(100, burst=1), key=lambda host: host
    )
    run(transport, upstream.url, 1)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    hosts = transport._options.hosts if hasattr(transport._options, "hosts") else (
        transport._options.following)
    before = rss()
    for i in range(100_000):
        hosts.observe(f"host-{i}.example", 200, [("ratelimit-policy", b'"a";q=5;w=1')])
    assert rss() - before < 10 * 2**20, (rss() - before) / 2**20


@pytest.mark.parametrize(
    "extra, gap",
    [
        # Two Retry-After fields: the longest one readable counts (capped at max_hold).
        ([["retry-after", "60"], ["retry-after", "soon"]], (1.5, 2.6)),
        # 16 digits: capped like any long hold.
        ([["retry-after", "9999999999999999"]], (1.5, 2.6)),
        # Decimal seconds.
        ([["retry-after", "1.5"]], (1.3, 2.2)),
        # No 31 February: ignored, so no hold.
        ([["retry-after", "Mon, 31 Feb 2099 00:00:00 GMT"]], (0.0, 0.6)),
    ],
)
def test_retry_after_values_are_read_as_meant(upstream, extra, gap):
    upstream.configure(refuse_all=1, fields="bare", refusal_extra=extra)
    transport = paceline.httpx.AsyncTransport(
        paceline.Limiter(100, burst=1), retries=1, max_hold=2.0
    )
    run(transport, upstream.url, 1, limit=10)
    seen = upstream.requests()
    assert len(seen) == 2
    assert gap[0] <= seen[1][0] - seen[0][0] <= gap[1], seen[1][0] - seen[0][0]


def test_a_reset_in_epoch_milliseconds_holds_until_then(upstream):
    # Nothing left until a reset 2 s away, given in Unix milliseconds.
    reset = str(int((time.time() + 2) * 1000))
    upstream.configure(
        fields="bare",
        extra=[["x-ratelimit-remaining", "0"], ["x-ratelimit-reset", reset]],
    )
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1))
    statuses, elapsed = run(transport, upstream.url, 2, limit=10)
    assert statuses == [200, 200]
    assert 1.5 < elapsed < 3.5, elapsed


def test_the_draft_07_ratelimit_field_is_followed(upstream):
    upstream.configure(fields="bare", extra=[["ratelimit", "limit=10, remaining=0, reset=2"]])
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1))
    statuses, elapsed = run(transport, upstream.url, 2, limit=10)
    assert statuses == [200, 200]
    assert 1.5 < elapsed < 3.5, elapsed


def test_a_request_refused_at_once_by_a_hold_spends_none_of_the_callers_quota(upstream):
    # The upstream holds for 3 s; requests whose client allows 0.5 s for a turn fail at
    # once with PoolTimeout, having booked nothing: the caller's own quota is untouched.
    upstream.configure(refuse_all=3)
    limiter = paceline.Limiter(5, per=60.0, burst=5)

    async def main():
        transport = paceline.httpx.AsyncTransport(limiter, max_hold=3.0, retries=0)
        timeout = httpx.Timeout(60, pool=0.5)
        async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
            assert (await client.get(upstream.url)).status_code == 429
            for _ in range(4):
                with pytest.raises(httpx.PoolTimeout):
                    await client.get(upstream.url)

    asyncio.run(main())
    assert limiter.remaining() == 4
    transport = paceline.httpx.Transport(limiter, max_hold=3.0, retries=0)
    with httpx.Client(transport=transport, timeout=httpx.Timeout(60, pool=0.5)) as client:
        assert client.get(upstream.url).status_code == 429
        for _ in range(2):
            with pytest.raises(httpx.PoolTimeout):
                client.get(upstream.url)
    assert limiter.remaining() == 3
