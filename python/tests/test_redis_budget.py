"""paceline.redis.RedisBudget against a real redis-server: processes sharing one queue, one
cap and the rates; a process killed with SIGKILL holding the only permit; settles;
cancellations; values the budget did not write; the server going away and coming back."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import redis.asyncio

import paceline
import paceline.redis as pr
from redis_fixtures import BINARIES, client, run

REDIS_BINARIES = BINARIES  # conftest's server: one per binary

LEASE = 10.0


def budget_of(r, name="b", **kw):
    kw.setdefault("timeout", 5.0)
    return pr.RedisBudget(r, name, **kw)


def child(server, body):
    """A Python process running ``body`` (an async main) against the server."""
    code = textwrap.dedent(
        f"""
        import asyncio, sys, time, os
        import redis.asyncio
        import paceline, paceline.redis as pr
        URL = {server.url!r}
        """
    ) + textwrap.dedent(body) + "\nasyncio.run(main())\n"
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def once_per_run(server):
    """The leases are the client's timing, not the server's: a test that waits one out
    runs against redis-server only (the others cover Valkey)."""
    if os.path.basename(server.binary).startswith("valkey"):
        pytest.skip("waits out a lease: run against redis-server only")


def most_at_once(spans):
    """The most of the ``(start, end)`` spans that overlap at any instant."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running, most = 0, 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_processes_share_the_cap_and_each_caller_gets_its_turn(fresh):
    body = """
    async def main():
        r = redis.asyncio.Redis.from_url(URL)
        b = pr.RedisBudget(r, "cap", in_flight=2, timeout=5.0)
        async def one():
            async with b.acquire():
                start = time.monotonic()
                await asyncio.sleep(0.03)
                print(start, time.monotonic(), flush=True)
        await asyncio.gather(*(one() for _ in range(8)))
    """
    procs = [child(fresh, body) for _ in range(3)]
    spans = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        spans += [tuple(map(float, line.split())) for line in out.split("\n") if line]
    assert len(spans) == 24
    # CLOCK_MONOTONIC is the host's: at no instant were more than two turns running.
    assert most_at_once(spans) == 2


# The Rust example `fleet_budget`, built (CI builds every example with every feature and
# names it here): a Rust client of the same budget as the Python ones.
RUST_CLIENT = os.environ.get("PACELINE_RUST_FLEET_CLIENT")


@pytest.mark.skipif(
    not RUST_CLIENT, reason="PACELINE_RUST_FLEET_CLIENT names the Rust example's binary"
)
def test_a_rust_client_and_python_clients_share_one_budget(fresh):
    # The example's budget: 40 requests a second, bursts of 4, 2 calls in flight; each
    # turn held 30 ms; `start end` printed per turn, in seconds since the epoch.
    # The Python clients start their turns once every interpreter is up (START), the
    # Rust client is started then (it is up at once).
    start_at = time.time() + 3.0
    body = f"""
    START = {start_at!r}
    """ + """
    async def main():
        r = redis.asyncio.Redis.from_url(URL)
        rate = paceline.Rate(40, per=1.0, burst=4)
        b = pr.RedisBudget(r, "mixed", in_flight=2, requests=rate, timeout=5.0)
        await asyncio.sleep(max(0.0, START - time.time()))
        async def one():
            async with b.acquire():
                start = time.time()
                await asyncio.sleep(0.03)
                print(start, time.time(), flush=True)
        await asyncio.gather(*(one() for _ in range(8)))
    """
    pythons = [child(fresh, body) for _ in range(2)]
    time.sleep(max(0.0, start_at - time.time()))
    rust = subprocess.Popen(
        [RUST_CLIENT, fresh.url, "mixed", "8", "4", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    spans = {}
    for name, p in [("rust", rust), ("python", pythons[0]), ("python", pythons[1])]:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        spans.setdefault(name, []).extend(
            tuple(map(float, line.split())) for line in out.split("\n") if line
        )
    assert (len(spans["rust"]), len(spans["python"])) == (8, 16)
    every = spans["rust"] + spans["python"]
    # One cap for both languages: at no instant more than two turns running (each span
    # printed inside its turn).
    assert most_at_once(every) <= 2
    # The clients ran at the same time, the Rust one's turns among the Python ones'.
    assert min(s for s, _ in spans["rust"]) < max(e for _, e in spans["python"])
    assert min(s for s, _ in spans["python"]) < max(e for _, e in spans["rust"])
    # One rate for both: 24 turns at 40/s from a burst of 4 take 0.475 s or more (a
    # budget of its own per language would let the 16 Python turns go in 0.3 s).
    starts = sorted(s for s, _ in every)
    assert starts[-1] - starts[0] >= (24 - 4) / 40 - 0.02, starts


def test_processes_together_keep_to_the_rates(fresh):
    body = """
    async def main():
        r = redis.asyncio.Redis.from_url(URL)
        b = pr.RedisBudget(r, "rate", requests=paceline.Rate(40, per=1.0, burst=4), timeout=5.0)
        async def one():
            await (await b.acquire()).release()
            print(time.monotonic(), flush=True)
        await asyncio.gather(*(one() for _ in range(12)))
    """
    started = time.monotonic()
    procs = [child(fresh, body) for _ in range(3)]
    times = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        times += [float(t) for t in out.split()]
    times.sort()
    assert len(times) == 36
    # 4 at once, then 32 at 25 ms: the 36th admitted 0.8 s after the first (each time
    # is read a round trip after its admission: some slack).
    assert times[-1] - times[0] >= 0.7, times[-1] - times[0]
    assert time.monotonic() - started < 30


def test_a_process_killed_holding_the_only_permit_gives_it_back_within_a_lease(fresh):
    once_per_run(fresh)
    body = """
    async def main():
        r = redis.asyncio.Redis.from_url(URL)
        b = pr.RedisBudget(r, "killed", in_flight=1, timeout=5.0)
        turn = await b.acquire()
        print("holding", flush=True)
        await asyncio.sleep(3600)
    """
    p = child(fresh, body)
    assert p.stdout.readline().strip() == "holding"

    async def main():
        b = budget_of(client(fresh), "killed", in_flight=1)
        assert await b.try_acquire() is None
        p.send_signal(signal.SIGKILL)
        p.wait()
        started = time.monotonic()
        turn = await asyncio.wait_for(b.acquire(), LEASE * 2)
        took = time.monotonic() - started
        await turn.release()
        return took

    took = run(main())
    assert took <= LEASE + 1.5, took


def test_a_turn_longer_than_a_lease_keeps_its_permit(fresh):
    once_per_run(fresh)
    async def main():
        holder = budget_of(client(fresh), "long", in_flight=1)
        other = budget_of(client(fresh), "long", in_flight=1)
        turn = await holder.acquire()
        with pytest.raises(TimeoutError):
            await other.acquire(timeout=LEASE + 2)
        await turn.release()
        turn = await asyncio.wait_for(other.acquire(), 2)
        await turn.release()

    run(main())


def test_a_settle_refunds_for_every_client_and_a_heavy_caller_is_not_overtaken(fresh):
    async def main():
        tokens = paceline.Rate(100, per=1.0)
        a = budget_of(client(fresh), "settle", tokens=tokens)
        b = budget_of(client(fresh), "settle", tokens=tokens)
        turn = await a.acquire(tokens=100)
        order = []

        async def heavy():
            async with b.acquire(tokens=80):
                order.append(("heavy", time.monotonic()))

        async def light():
            async with a.acquire(tokens=1):
                order.append(("light", time.monotonic()))

        h = asyncio.ensure_future(heavy())
        await asyncio.sleep(0.05)
        l = asyncio.ensure_future(light())
        await asyncio.sleep(0.05)
        assert await b.waiting() == 2
        settled = time.monotonic()
        await turn.settle(tokens=10)  # 90 come back
        await asyncio.gather(h, l)
        assert [name for name, _ in order] == ["heavy", "light"]
        assert order[0][1] - settled < 0.4

    run(main())


def test_a_cancelled_waiter_leaves_the_queue_and_a_turn_too_far_off_is_refused_at_once(fresh):
    async def main():
        b = budget_of(client(fresh), "leave", requests=paceline.Rate(1, per=60.0))
        turn = await b.acquire()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(b.acquire(), 0.1)
        await asyncio.sleep(0.3)
        assert await b.waiting() == 0
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await b.acquire(timeout=1.0)
        assert time.monotonic() - started < 0.5
        assert await b.waiting() == 0
        await turn.release()
        assert await b.in_flight() == 0

    run(main())


def test_an_exception_in_the_block_releases_the_turn(fresh):
    async def main():
        b = budget_of(client(fresh), "raise", in_flight=1)
        with pytest.raises(ZeroDivisionError):
            async with b.acquire():
                1 / 0
        assert await b.in_flight() == 0
        turn = await b.try_acquire()
        assert turn is not None and turn.cost("requests") is None
        await turn.release()

    run(main())


def test_a_value_it_did_not_write_is_refused_and_left_as_it_is(fresh):
    async def main():
        r = client(fresh)
        await r.set("paceline:{foreign}:budget", "someone else's")
        b = budget_of(r, "foreign", in_flight=1)
        with pytest.raises(pr.RedisRejected):
            await b.try_acquire()
        assert await r.get("paceline:{foreign}:budget") == b"someone else's"
        await r.rpush("paceline:{listed}:budget", "x")
        with pytest.raises(pr.RedisRejected):
            await budget_of(r, "listed", in_flight=1).acquire()
        one = budget_of(r, "rules", calls=paceline.Rate(5))
        await (await one.acquire()).release()
        other = budget_of(r, "rules", calls=paceline.Rate(6))
        with pytest.raises(pr.RedisRejected, match="other rates"):
            await other.acquire()
        # The same rates listed in another order are the same budget.
        ab = budget_of(r, "order", a=paceline.Rate(5), b=paceline.Rate(7))
        ba = budget_of(r, "order", b=paceline.Rate(7), a=paceline.Rate(5))
        await (await ab.acquire(b=2)).release()
        assert await ba.remaining("b") == 5

    run(main())


def test_a_client_that_decodes_responses_shares_the_budget(fresh):
    async def main():
        raw = budget_of(client(fresh), "text", in_flight=1)
        text = budget_of(client(fresh, decode_responses=True), "text", in_flight=1)
        turn = await raw.acquire()
        assert await text.try_acquire() is None
        await turn.release()
        turn = await text.acquire()
        assert await raw.in_flight() == 1
        await turn.release()

    run(main())


def test_the_server_going_away_fails_calls_within_the_timeout_and_its_return_serves(fresh):
    async def main():
        b = pr.RedisBudget(client(fresh), "away", in_flight=1, timeout=0.3)
        turn = await b.acquire()
        waiting = asyncio.ensure_future(b.acquire())
        await asyncio.sleep(0.1)
        fresh.stop()
        started = time.monotonic()
        with pytest.raises(pr.RedisUnavailable):
            await asyncio.wait_for(waiting, 5)
        assert time.monotonic() - started < 3
        with pytest.raises(pr.RedisUnavailable):
            await b.try_acquire()
        with pytest.raises(pr.RedisUnavailable):
            await turn.release()
        fresh.start()
        for _ in range(50):
            try:
                turn = await b.try_acquire()
                break
            except pr.RedisUnavailable:
                await asyncio.sleep(0.1)
        assert turn is not None
        await turn.release()

    run(main())


def test_bad_arguments_are_refused_before_any_call(fresh):
    import redis as sync_redis

    with pytest.raises(TypeError, match="asyncio client"):
        pr.RedisBudget(sync_redis.Redis(), "b", in_flight=1)
    r = client(fresh)
    with pytest.raises(ValueError):
        pr.RedisBudget(r, "", in_flight=1)
    with pytest.raises(ValueError):
        pr.RedisBudget(r, "b")
    with pytest.raises(ValueError):
        pr.RedisBudget(r, "b", in_flight=1025)
    with pytest.raises(ValueError, match="braces"):
        pr.RedisBudget(r, "b", in_flight=1, prefix="a{b}")
    b = pr.RedisBudget(r, "b", tokens=paceline.Rate(100))

    async def main():
        with pytest.raises(ValueError, match="tokns"):
            await b.acquire(tokns=1)
        with pytest.raises(ValueError, match="burst"):
            await b.acquire(tokens=101)
        turn = await b.acquire(tokens=10)
        with pytest.raises(ValueError):
            turn.settle(tokns=5)
        assert not turn.ended
        await turn.settle(tokens=5)
        with pytest.raises(RuntimeError):
            turn.settle(tokens=5)

    run(main())


def test_a_forked_child_is_a_client_of_its_own(fresh):
    async def take(b):
        return await b.acquire()

    async def take_and_release(b):
        await (await b.acquire()).release()

    b = budget_of(client(fresh), "fork", in_flight=2)
    turn = run(take(b))
    owner = b._owner
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            b._client = client(fresh)
            run(take_and_release(b))
            code = 0 if b._owner != owner else 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0

    async def main():
        b._client = client(fresh)
        assert await b.in_flight() == 1
        await turn.release()

    run(main())


def test_the_httpx_transport_books_follows_and_settles_on_a_fleet_budget(fresh):
    """Two clients (each with its own RedisBudget, as two hosts) call one fake model API
    through paceline.httpx.AsyncTransport(budget=...): few refusals, every permit back."""
    import httpx
    import json

    import paceline.httpx
    from provider_app import Provider

    provider = Provider("openai", 40, 4_000, 10, 2_000)
    try:

        async def main():
            budgets = [
                budget_of(
                    client(fresh),
                    "provider",
                    requests=paceline.Rate(40, burst=10),
                    tokens=paceline.Rate(4_000, burst=2_000),
                    in_flight=8,
                )
                for _ in range(2)
            ]
            statuses = []

            async def host(b):
                transport = paceline.httpx.AsyncTransport(
                    budget=b,
                    cost=lambda request: {"tokens": json.loads(request.content)["tokens"]},
                    settle_from=lambda r: {"tokens": r.json()["usage"]["total_tokens"]},
                    retries=0,
                )
                async with httpx.AsyncClient(transport=transport, timeout=30) as c:

                    async def worker():
                        for _ in range(10):
                            r = await c.post(provider.url, json={"tokens": 200})
                            statuses.append(r.status_code)

                    await asyncio.gather(*(worker() for _ in range(4)))

            await asyncio.gather(*(host(b) for b in budgets))
            await asyncio.sleep(0.2)  # the last ends land
            assert len(statuses) == 80
            assert await budgets[0].in_flight() == 0
            assert await budgets[1].waiting() == 0

        run(main())
        assert provider.refusals() <= 2, provider.log
    finally:
        provider.close()


def test_waiters_left_when_asyncio_run_ends_are_out_of_the_queue_when_it_returns(fresh):
    """asyncio.run cancels the tasks still waiting when its main returns: they give their
    places up before the loop closes, so the process (and every other client) is not
    held up behind them."""
    rates = dict(requests=paceline.Rate(1, per=60.0))

    async def main():
        b = budget_of(client(fresh), "run-end", **rates)
        await b.acquire()
        for _ in range(3):
            asyncio.ensure_future(b.acquire())
        await asyncio.sleep(0.3)
        assert await b.waiting() == 3
        # Returns with the waiters still pending.

    run(main())

    async def after():
        b = budget_of(client(fresh), "run-end", **rates)
        assert await b.waiting() == 0

    run(after())


def test_a_name_that_would_split_the_keys_over_cluster_slots_is_refused(fresh):
    r = client(fresh)
    for name in ("}x", "a}b", "x}"):
        with pytest.raises(ValueError, match="}"):
            pr.RedisBudget(r, name, in_flight=1)
    pr.RedisBudget(r, "a{b", in_flight=1)  # one hash tag still: "{a{b}"
