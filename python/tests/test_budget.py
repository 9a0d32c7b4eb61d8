"""paceline.Budget under real event loops and threads: one first-come-first-served turn
across every dimension, the in-flight cap, cancellation, timeouts, exceptions, settles,
bad input, signals and fork. Real-time bounds are generous (a loaded 2-core machine)."""

import asyncio
import logging
import os
import signal
import threading
import time

import pytest

import paceline
from paceline import Budget, Rate

HUNG_AFTER = 10.0


def model_budget(in_flight=None, **overrides):
    rates = dict(requests=Rate(20, per=1.0, burst=1), tokens=Rate(1000, per=1.0))
    rates.update(overrides)
    return Budget(in_flight=in_flight, **rates)


def wait_until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


# --- one turn, first come first served ---------------------------------------------


def test_callers_on_two_loops_and_two_threads_are_admitted_in_arrival_order():
    # One permit, held: nobody is admitted until all six callers have queued, so the
    # queue's length counts arrivals.
    budget = model_budget(in_flight=1)
    held = budget.try_acquire()
    assert held is not None
    order = []
    lock = threading.Lock()

    def arrive(i):
        # Caller i asks only once callers 0..i-1 are queued: arrival order is i.
        wait_until(lambda: budget.waiting == i)

    async def on_loop(ids):
        async def one(i):
            arrive(i)
            async with budget.acquire(tokens=10) as turn:
                with lock:
                    order.append(i)
                turn.settle(tokens=5)

        # Each caller's arrival blocks its loop until its turn to ask comes, so the
        # callers of one loop are started one after another.
        tasks = []
        for i in ids:
            tasks.append(asyncio.ensure_future(one(i)))
            while budget.waiting <= i and not tasks[-1].done():
                await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)

    def blocking(ids):
        for i in ids:
            arrive(i)
            with budget.acquire_blocking(tokens=10):
                with lock:
                    order.append(i)

    # Loop A takes 0, 4; loop B 1, 5; thread C 2; thread D 3.
    workers = [
        threading.Thread(target=lambda: asyncio.run(on_loop([0, 4]))),
        threading.Thread(target=lambda: asyncio.run(on_loop([1, 5]))),
        threading.Thread(target=blocking, args=([2],)),
        threading.Thread(target=blocking, args=([3],)),
    ]
    for w in workers:
        w.start()
    wait_until(lambda: budget.waiting == 6)
    held.release()
    for w in workers:
        w.join(timeout=HUNG_AFTER)
    assert order == [0, 1, 2, 3, 4, 5]
    assert (budget.in_flight, budget.waiting) == (0, 0)


def test_a_heavy_caller_is_not_overtaken_and_nothing_is_charged_in_part():
    budget = Budget(tokens=Rate(100, per=1.0), requests=Rate(100, per=1.0))
    first = budget.try_acquire(tokens=100)
    order = []

    async def main():
        async def ask(name, tokens):
            async with budget.acquire(tokens=tokens):
                order.append(name)

        heavy = asyncio.ensure_future(ask("heavy", 60))
        await asyncio.sleep(0.01)
        light = asyncio.ensure_future(ask("light", 1))
        await asyncio.sleep(0.05)
        # Requests are plentiful, tokens are not: the waiters charged nothing yet.
        assert budget.remaining("requests") >= 98
        assert budget.try_acquire(tokens=1) is None, "try_acquire jumped the queue"
        await asyncio.gather(heavy, light)

    asyncio.run(main())
    first.release()
    assert order == ["heavy", "light"]


def test_the_in_flight_cap_holds_at_every_instant():
    budget = Budget(requests=Rate(1000, per=1.0), in_flight=3)
    running = 0
    most = 0

    async def call():
        nonlocal running, most
        async with budget.acquire():
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.005)
            running -= 1

    async def main():
        await asyncio.gather(*(call() for _ in range(40)))

    asyncio.run(main())
    assert most == 3
    assert budget.in_flight == 0


def test_one_acquire_shared_by_tasks_serves_one_block_at_a_time_and_the_cap_holds():
    # `slot = budget.acquire()` used like a semaphore by several tasks: a second `async
    # with` on it while one is inside raises instead of overwriting the first's turn
    # (which returned its permit while its task was still inside).
    budget = Budget(requests=Rate(1000, per=1.0), in_flight=2)
    slot = budget.acquire()
    running = 0
    most = 0
    refused = 0

    async def call():
        nonlocal running, most, refused
        try:
            async with slot:
                running += 1
                most = max(most, running)
                await asyncio.sleep(0.01)
                running -= 1
        except RuntimeError as e:
            assert "one `async with` at a time" in str(e)
            refused += 1

    async def main():
        await asyncio.gather(*(call() for _ in range(4)))
        async with slot:  # free again once the block ended
            pass

    asyncio.run(main())
    assert most == 1 and refused == 3
    assert budget.in_flight == 0 and budget.waiting == 0


def test_a_waiter_left_pending_on_a_closed_loop_gives_its_place_up_at_its_turn():
    # A program that wanted only the first of several results closes its loop with an
    # acquire still queued: when its turn comes it finds its loop closed and leaves the
    # queue, so no one behind it waits for ever.
    budget = Budget(requests=Rate(1, per=1.0))
    held = budget.try_acquire()
    assert held is not None

    def abandon():
        loop = asyncio.new_event_loop()

        async def main():
            queued = asyncio.ensure_future(budget.acquire())
            fast = asyncio.ensure_future(asyncio.sleep(0.01))
            await asyncio.wait([queued, fast], return_when=asyncio.FIRST_COMPLETED)

        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=abandon)
    thread.start()
    thread.join()
    started = time.monotonic()
    budget.acquire_blocking(timeout=5.0).release()
    assert time.monotonic() - started < 3.0
    assert budget.waiting == 0


def test_threads_block_with_the_gil_released_within_the_cap():
    budget = Budget(in_flight=2)
    running = 0
    most = 0
    lock = threading.Lock()

    def worker():
        nonlocal running, most
        for _ in range(5):
            with budget.acquire_blocking():
                with lock:
                    running += 1
                    most = max(most, running)
                time.sleep(0.003)
                with lock:
                    running -= 1

    threads = [threading.Thread(target=worker) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=HUNG_AFTER)
    assert most == 2
    assert budget.in_flight == 0


# --- cancellation, timeouts, exceptions -----------------------------------------------


def test_a_cancelled_waiter_gives_its_place_back_having_spent_nothing():
    budget = Budget(tokens=Rate(100, per=1.0), in_flight=5)
    held = budget.try_acquire(tokens=100)

    async def main():
        waiter = asyncio.ensure_future(budget.acquire(tokens=90).__aenter__())
        behind = asyncio.ensure_future(budget.acquire(tokens=10).__aenter__())
        await asyncio.sleep(0.02)
        assert budget.waiting == 2
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert budget.waiting == 1
        t0 = time.monotonic()
        turn = await asyncio.wait_for(behind, 2.0)
        # 10 tokens at 100/s from 0: ready by 0.1 s; not behind the 90 (0.9 s more).
        assert time.monotonic() - t0 < 0.5
        turn.release()

    asyncio.run(main())
    held.release()
    assert (budget.in_flight, budget.waiting) == (0, 0)


def test_wait_for_timeouts_racing_turns_leave_the_budget_whole():
    budget = Budget(requests=Rate(500, per=1.0, burst=2), tokens=Rate(50_000, per=1.0), in_flight=3)

    async def one(i):
        try:
            turn = await asyncio.wait_for(budget.acquire(tokens=100), 0.001 * (i % 30))
        except asyncio.TimeoutError:
            return
        await asyncio.sleep(0.001)
        turn.settle(tokens=50)

    async def main():
        await asyncio.gather(*(one(i) for i in range(200)))

    asyncio.run(main())
    assert (budget.in_flight, budget.waiting) == (0, 0)


def test_a_timeout_beyond_the_turn_raises_at_once_and_books_nothing():
    budget = Budget(tokens=Rate(1000, per=3600.0))
    held = budget.try_acquire(tokens=1000)

    async def main():
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await budget.acquire(tokens=500, timeout=0.1)  # 30 minutes away
        assert time.monotonic() - t0 < 0.05
        assert budget.waiting == 0

    asyncio.run(main())
    with pytest.raises(TimeoutError):
        budget.acquire_blocking(tokens=500, timeout=0.1)
    assert budget.waiting == 0
    assert 1790.0 < budget.wait_time(tokens=500) <= 1800.0
    held.release()


def test_a_timeout_that_passes_in_the_queue_gives_the_place_up():
    budget = Budget(in_flight=1)
    held = budget.try_acquire()

    async def main():
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            async with budget.acquire(timeout=0.1):
                pass
        assert 0.09 < time.monotonic() - t0 < 2.0
        assert budget.waiting == 0

    asyncio.run(main())
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        budget.acquire_blocking(timeout=0.1)
    assert 0.09 < time.monotonic() - t0 < 2.0
    held.release()
    assert budget.try_acquire() is not None


def test_an_exception_in_the_block_returns_the_permit_and_keeps_the_estimate():
    budget = Budget(tokens=Rate(1000, per=3600.0), in_flight=1)

    async def main():
        with pytest.raises(RuntimeError, match="the call failed"):
            async with budget.acquire(tokens=400):
                raise RuntimeError("the call failed")

    asyncio.run(main())
    assert budget.in_flight == 0
    assert budget.remaining("tokens") == 600  # the estimate stays
    with pytest.raises(ValueError):
        with budget.acquire_blocking(tokens=10):
            raise ValueError("here too")
    assert budget.in_flight == 0


# --- settles -------------------------------------------------------------------------


def test_settle_gives_back_or_charges_the_difference():
    budget = Budget(tokens=Rate(1000, per=3600.0), in_flight=2)
    turn = budget.try_acquire(tokens=600)
    assert budget.remaining("tokens") == 400
    turn.settle(tokens=250)
    assert budget.remaining("tokens") == 750
    assert turn.ended and budget.in_flight == 0
    with pytest.raises(RuntimeError, match="already ended"):
        turn.settle(tokens=1)
    turn.release()  # does nothing now
    turn = budget.try_acquire(tokens=100)
    turn.settle(tokens=2000)  # more than the burst: the upstream spent it
    assert budget.remaining("tokens") == 0
    assert budget.wait_time(tokens=1) > 3600.0


def test_a_bad_settle_raises_and_leaves_the_turn_as_it_was():
    budget = Budget(tokens=Rate(1000, per=3600.0), in_flight=1)
    turn = budget.try_acquire(tokens=600)
    with pytest.raises(ValueError, match='no dimension named "tokns"'):
        turn.settle(tokns=100)
    for bad, error in [(-1, ValueError), (2**32, ValueError), (1.5, TypeError), (True, TypeError)]:
        with pytest.raises(error):
            turn.settle(tokens=bad)
    assert not turn.ended and budget.in_flight == 1
    assert budget.remaining("tokens") == 400
    turn.settle(tokens=100)
    assert budget.remaining("tokens") == 900


# --- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "costs, error, message",
    [
        ({"tokns": 1}, ValueError, 'no dimension named "tokns"'),
        ({"tokens": -1}, ValueError, "between 0 and"),
        ({"tokens": 2**32}, ValueError, "between 0 and"),
        ({"tokens": 2**64}, ValueError, "between 0 and"),
        ({"tokens": 1.0}, TypeError, "must be an int"),
        ({"tokens": True}, TypeError, "must be an int"),
        ({"tokens": "5"}, TypeError, "must be an int"),
        ({"tokens": 1001}, ValueError, "can never be admitted"),
        ({"requests": 2}, ValueError, "the burst of requests is 1"),
    ],
)
def test_bad_costs_raise_clear_errors_and_change_nothing(costs, error, message):
    budget = model_budget(in_flight=2)
    with pytest.raises(error, match=message):
        budget.try_acquire(**costs)
    with pytest.raises(error, match=message):
        budget.acquire_blocking(**costs)
    with pytest.raises(error, match=message):
        budget.wait_time(**costs)

    async def main():
        with pytest.raises(error, match=message):
            async with budget.acquire(**costs):
                pass

    asyncio.run(main())
    assert (budget.in_flight, budget.waiting) == (0, 0)
    assert (budget.remaining("requests"), budget.remaining("tokens")) == (1, 1000)


def test_bad_budgets_and_rates_raise_clear_errors():
    with pytest.raises(ValueError, match="at least one rate or an in_flight cap"):
        Budget()
    with pytest.raises(ValueError, match="in_flight must be between 1"):
        Budget(in_flight=0)
    with pytest.raises(TypeError, match="must be a paceline.Rate"):
        Budget(tokens=100)
    with pytest.raises(ValueError, match="may not be named 'timeout'"):
        Budget(timeout=Rate(1))
    with pytest.raises(ValueError, match="count must be between 1"):
        Rate(0)
    with pytest.raises(ValueError, match="per must be a positive"):
        Rate(10, per=float("nan"))
    with pytest.raises(TypeError):
        Rate(10.5)
    with pytest.raises(ValueError, match="burst"):
        Rate(10, burst=0)
    with pytest.raises(ValueError, match="below one nanosecond"):
        Budget(tokens=Rate(2**32 - 1, per=1e-3))
    assert Rate(500, per=60.0).burst == 500
    with pytest.raises(TypeError):
        model_budget().remaining(3)
    with pytest.raises(ValueError, match="no dimension"):
        model_budget().remaining("x")


# --- signals and fork ---------------------------------------------------------------


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="needs SIGINT")
def test_ctrl_c_interrupts_acquire_blocking_and_gives_the_place_back():
    budget = Budget(in_flight=1)
    held = budget.try_acquire()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        budget.acquire_blocking()
    assert 0.29 <= time.monotonic() - t0 < 3.0
    assert budget.waiting == 0
    held.release()
    assert budget.try_acquire() is not None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_is_not_held_by_the_parents_other_threads():
    # In the parent another thread holds the only permit and a third waits at the head
    # of the queue; neither exists in the child, whose budget counts its own turns.
    budget = Budget(requests=Rate(100, per=1.0, burst=1), in_flight=1)
    asyncio.run(budget.acquire().__aenter__())  # the timer thread may start here
    release = threading.Event()
    holding = threading.Event()

    def holder():
        with budget.acquire_blocking():
            holding.set()
            release.wait()

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    holding.wait()
    threads.append(threading.Thread(target=lambda: budget.acquire_blocking().release()))
    threads[1].start()
    wait_until(lambda: budget.waiting == 1)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            turn = budget.acquire_blocking(timeout=2.0)
            turn.release()

            async def again():
                async with budget.acquire(timeout=2.0):
                    pass

            asyncio.run(again())
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + HUNG_AFTER
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                assert os.waitstatus_to_exitcode(status) == 0
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung")
            time.sleep(0.02)
    finally:
        release.set()
        for t in threads:
            t.join(timeout=HUNG_AFTER)
    assert (budget.in_flight, budget.waiting) == (0, 0)


def test_budget_names_are_exported():
    assert {"Budget", "Rate", "Turn"} <= set(paceline.__all__)


def test_a_turn_that_waits_long_says_so_in_a_debug_line(caplog):
    budget = paceline.Budget(requests=paceline.Rate(1, per=3600.0))

    async def go():
        first = await budget.acquire()
        first.release()
        waiter = asyncio.ensure_future(budget.acquire())
        await asyncio.sleep(0.3)
        assert budget.waiting == 1 and not caplog.records  # not yet a second
        await asyncio.sleep(1.2)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert budget.waiting == 0

    with caplog.at_level(logging.DEBUG, logger="paceline"):
        asyncio.run(go())
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(said) == 1 and "has waited 1 s" in said[0] and "1 callers wait" in said[0], said
