"""paceline.httpx paced by a fleet-wide limiter (paceline.redis), against a real
redis-server: clients in several processes share one line of turns; the thread twin; a
local transport that follows the upstream on top of the fleet's."""

import asyncio
import threading
import time

import pytest

redis = pytest.importorskip("redis")
httpx = pytest.importorskip("httpx")
import redis.asyncio  # noqa: E402

import paceline  # noqa: E402
import paceline.httpx  # noqa: E402
import paceline.redis as pr  # noqa: E402

import processes  # noqa: E402
from redis_servers import have, server_binary  # noqa: E402

if not have(server_binary()):
    pytest.skip(f"{server_binary()} is not installed", allow_module_level=True)


def upstream(times, status=200, headers=None):
    def handle(request):
        times.append(time.time())
        return httpx.Response(status, headers=headers or {}, text="ok")

    return handle


def fleet_client(url, count, out):
    async def go():
        r = redis.asyncio.Redis.from_url(url)
        limiter = pr.RedisLimiter(r, 20, 1.0, 1, timeout=5.0)  # 50 ms apart
        times = []
        transport = paceline.httpx.AsyncFleetTransport(
            limiter, httpx.MockTransport(upstream(times)), key="partner-api"
        )
        async with httpx.AsyncClient(transport=transport) as client:
            await asyncio.gather(*(client.get("http://partner.example/") for _ in range(count)))
        await r.aclose()
        return times

    out.put(asyncio.run(go()))


def test_clients_in_several_processes_share_one_line_of_turns(server):
    server.cli("FLUSHALL")
    times = sorted(t for got in processes.results(fleet_client, (server.url, 8), 3, exit_zero=False) for t in got)
    assert len(times) == 24
    # 24 requests at 20/s with a burst of 1: never two within the interval (the sending
    # is read a moment after each turn, so allow a little), and 23 intervals in all.
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert sum(1 for g in gaps if g < 0.040) <= 2, gaps
    assert times[-1] - times[0] >= 23 * 0.050 - 0.05


def test_the_thread_twin_and_a_follower_on_top(server):
    server.cli("FLUSHALL")
    r = redis.Redis.from_url(server.url, socket_timeout=5.0, socket_connect_timeout=1.0)
    limiter = pr.SyncRedisLimiter(r, 20, 1.0, 1)
    times = []
    fleet = paceline.httpx.FleetTransport(limiter, httpx.MockTransport(upstream(times)))
    with httpx.Client(transport=fleet) as client:
        threads = [threading.Thread(target=client.get, args=("http://a.example/",)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # Turns 50 ms apart at Redis's clock; each request is seen a round trip or so after
    # its turn, which a loaded machine varies by a few ms.
    assert len(times) == 6 and max(times) - min(times) >= 5 * 0.050 - 0.03
    # A 429 is retried by the local transport on top: in a new fleet turn each time.
    refused = []
    follower = paceline.httpx.Transport(
        paceline.Limiter(1000, 1.0, 1000),
        paceline.httpx.FleetTransport(limiter, httpx.MockTransport(upstream(refused, 429))),
        retries=2,
    )
    with httpx.Client(transport=follower) as client:
        assert client.get("http://b.example/").status_code == 429
    assert len(refused) == 3
    r.close()


def test_a_fleet_transport_takes_a_fleet_limiter_only(server):
    with pytest.raises(TypeError, match="RedisLimiter"):
        paceline.httpx.AsyncFleetTransport(paceline.Limiter(10))
    r = redis.Redis.from_url(server.url, socket_timeout=5.0)
    with pytest.raises(TypeError, match="SyncRedisLimiter"):
        paceline.httpx.FleetTransport(pr.RedisLimiter(redis.asyncio.Redis.from_url(server.url), 1))
    with pytest.raises(TypeError, match="key"):
        paceline.httpx.FleetTransport(pr.SyncRedisLimiter(r, 1), key=3)
    # A turn further than max_wait raises at once, booking nothing.
    server.cli("FLUSHALL")
    limiter = pr.SyncRedisLimiter(r, 1, 10.0, 1)
    transport = paceline.httpx.FleetTransport(
        limiter, httpx.MockTransport(upstream([])), key="k", max_wait=0.1
    )
    with httpx.Client(transport=transport) as client:
        assert client.get("http://c.example/").status_code == 200
        with pytest.raises(TimeoutError):
            client.get("http://c.example/")
    r.close()


def test_the_wait_for_a_fleet_turn_counts_against_the_clients_timeout(server):
    server.cli("FLUSHALL")

    async def go():
        r = redis.asyncio.Redis.from_url(server.url)
        limiter = pr.RedisLimiter(r, 1, 3.0, 1, timeout=5.0)  # a turn every 3 s
        times = []
        fleet = paceline.httpx.AsyncFleetTransport(limiter, httpx.MockTransport(upstream(times)), key="k")
        outer = paceline.httpx.AsyncTransport(paceline.Limiter(100), transport=fleet)
        for transport in (fleet, outer):
            server.cli("FLUSHALL")
            times.clear()
            async with httpx.AsyncClient(transport=transport, timeout=0.5) as client:
                assert (await client.get("http://a.example/")).status_code == 200
                started = time.monotonic()
                with pytest.raises(httpx.PoolTimeout):
                    await client.get("http://a.example/")
                assert time.monotonic() - started < 1.0
            assert len(times) == 1  # nothing sent
            assert await limiter.wait_time("k") > 1.5  # and nothing booked
        await r.aclose()

    asyncio.run(go())
    r = redis.Redis.from_url(server.url, socket_timeout=5.0)
    server.cli("FLUSHALL")
    times = []
    transport = paceline.httpx.FleetTransport(
        pr.SyncRedisLimiter(r, 1, 3.0, 1), httpx.MockTransport(upstream(times)), key="k"
    )
    with httpx.Client(transport=transport, timeout=0.5) as client:
        client.get("http://a.example/")
        with pytest.raises(httpx.PoolTimeout):
            client.get("http://a.example/")
    assert len(times) == 1
    r.close()
