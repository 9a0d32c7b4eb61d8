"""paceline from Python, on real event loops and real threads. Time bounds are generous
on the slow side (a loaded 2-core CI machine) and exact on the fast side (the quota)."""

import asyncio
import threading
import time

import pytest

import paceline
from paceline._paceline import Ready

from pacing import SLACK, starts_within


async def paced(limiter, count, n=1, work=0.0):
    """`count` tasks, each waiting its turn then 'calling the API' for `work` s."""
    t0 = time.monotonic()
    starts = []

    async def call():
        await limiter.acquire(n)
        starts.append(time.monotonic() - t0)
        await asyncio.sleep(work)

    await asyncio.gather(*(call() for _ in range(count)))
    return sorted(starts)


def test_100_per_second_exactly_over_3_seconds():
    limiter = paceline.Limiter(100, per=1.0, burst=1)
    starts = asyncio.run(paced(limiter, 301, work=0.05))
    # Never more than 100 in any one-second window: the quota, however long each call
    # (SLACK more for the readings each task takes a moment after its admission, which
    # a loaded machine delays by different amounts).
    assert starts_within(starts, 1.0) <= 100 + SLACK
    assert starts[-1] >= 3.0 - 0.002
    rate = 300 / (starts[-1] - starts[0])
    assert 80.0 <= rate <= 100.0 + 0.5, rate


def test_a_burst_of_40_then_2_per_second_for_coroutines():
    limiter = paceline.Limiter(2, per=1.0, burst=40)
    starts = asyncio.run(paced(limiter, 46))
    assert starts[39] < 0.5, "the burst starts at once"
    # Then one every 0.5 s: the 46th at 3.0 s, never earlier.
    for k in range(40, 46):
        assert starts[k] >= (k - 39) * 0.5 - 0.002, (k, starts[k])
    assert starts[45] < 3.0 + 1.0


def test_heavy_requests_are_not_overtaken_by_light_ones():
    async def main():
        limiter = paceline.Limiter(10, per=1.0, burst=10)
        assert limiter.try_acquire(10)
        order = []

        async def take(name, n, delay):
            await asyncio.sleep(delay)
            await limiter.acquire(n)
            order.append(name)

        await asyncio.gather(
            take("heavy", 10, 0.0), *(take(f"light{i}", 1, 0.05) for i in range(3))
        )
        return order

    assert asyncio.run(main()) == ["heavy", "light0", "light1", "light2"]


def test_a_cancelled_task_gives_its_cells_back_and_the_queue_moves_up():
    async def main():
        limiter = paceline.Limiter(10, per=1.0, burst=1)
        assert limiter.try_acquire()
        t0 = time.monotonic()
        done = {}

        async def wait(i):
            await limiter.acquire()
            done[i] = time.monotonic() - t0

        tasks = [asyncio.ensure_future(wait(i)) for i in range(10)]
        await asyncio.sleep(0.05)
        # Every other waiter gives up (as wait_for and task groups cancel).
        for task in tasks[1::2]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return done

    done = asyncio.run(main())
    assert sorted(done) == [0, 2, 4, 6, 8]
    # Five waiters at 10/s after the burst: the last at 0.5 s, not 0.9 s.
    assert max(done.values()) < 0.8, done
    assert max(done.values()) >= 0.5 - 0.002


def test_a_timeout_books_nothing_and_raises_at_once():
    async def main():
        limiter = paceline.Limiter(1, per=1.0, burst=1)
        assert limiter.try_acquire()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await limiter.acquire(timeout=0.1)
        assert time.monotonic() - t0 < 0.1
        # asyncio.wait_for around a wait: cancelled, its cell goes back.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(limiter.acquire(), 0.2)
        return t0

    t0 = asyncio.run(main())
    # Nothing is left booked: the next turn is the one after the first cell, at 1 s.
    limiter_wait = paceline.Limiter(1, per=1.0, burst=1)
    assert limiter_wait.try_acquire()


def test_threads_and_coroutines_on_several_loops_never_exceed_the_bound():
    limiter = paceline.Limiter(200, per=1.0, burst=5)
    starts, lock = [], threading.Lock()
    t0 = time.monotonic()
    deadline = t0 + 1.5

    def record():
        with lock:
            starts.append(time.monotonic() - t0)

    def thread_worker():
        while time.monotonic() < deadline:
            limiter.acquire_blocking()
            record()

    def loop_worker():
        async def task():
            while time.monotonic() < deadline:
                await limiter.acquire()
                record()

        async def main():
            await asyncio.gather(*(task() for _ in range(20)))

        asyncio.run(main())

    workers = [threading.Thread(target=thread_worker) for _ in range(3)]
    workers += [threading.Thread(target=loop_worker) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert not any(w.is_alive() for w in workers)
    # 200/s with a burst of 5: at most 5 + 200*w in any window of w seconds (SLACK more
    # for the readings taken after each admission).
    for window in (0.05, 0.2, 1.0):
        assert starts_within(starts, window) <= 5 + 200 * window + SLACK, window
    assert len(starts) >= 200, "threads and loops all made progress"


def starts_around_a_stall(execution_bound):
    """60 tasks through 100/s with a burst of 10, the loop stalled for 0.3 s meanwhile."""

    async def main():
        limiter = paceline.Limiter(100, per=1.0, burst=10, execution_bound=execution_bound)
        t0 = time.monotonic()
        starts = []

        async def call():
            await limiter.acquire()
            starts.append(time.monotonic() - t0)

        tasks = [asyncio.ensure_future(call()) for _ in range(60)]
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # the loop stalls: many booked turns pass meanwhile
        await asyncio.gather(*tasks)
        return starts

    return asyncio.run(main())


def test_a_stalled_loop_does_not_break_the_execution_bound():
    starts = starts_around_a_stall(execution_bound=True)
    assert len(starts) == 60
    # 100/s, burst 10: at most 110 in any second and 20 in any 0.1 s, stall or not.
    # (SLACK more for the readings taken a moment after each admission.) Without the
    # bound, 40 or more start in one 0.1 s window.
    assert starts_within(starts, 0.1) <= 20 + SLACK, sorted(starts)
    assert starts_within(starts, 1.0) <= 110 + SLACK


def test_without_the_execution_bound_a_stall_releases_turns_together():
    # The turns were booked exactly; only the moment the work ran bunched up.
    assert starts_within(starts_around_a_stall(execution_bound=False), 0.1) > 20 + SLACK


def starts_around_stalls(limiter, stalls, tasks=30, stall=0.6):
    """`tasks` tasks acquiring in a loop for the whole run, the loop stalled for `stall`
    seconds at each of `stalls` (seconds from the start)."""

    async def main():
        t0 = time.monotonic()
        starts = []

        async def worker():
            while time.monotonic() - t0 < stalls[-1] + 1.5:
                await limiter.acquire()
                starts.append(time.monotonic() - t0)

        async def staller():
            for at in stalls:
                await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))
                time.sleep(stall)

        await asyncio.gather(staller(), *(worker() for _ in range(tasks)))
        return starts

    return asyncio.run(main())


@pytest.mark.parametrize("keyed", [False, True])
def test_every_stall_is_spaced_not_only_the_first(keyed):
    # After a first stall the late waiters' execution cells lie ahead of the booking
    # cell; unless it is realigned, every later waiter waits on both, and the next stall
    # releases those waiting on execution cells together (16 in one second here).
    if keyed:
        keyed_limiter = paceline.KeyedLimiter(10, per=1.0, burst=1)

        class One:
            async def acquire(self):
                await keyed_limiter.acquire("k")

        limiter = One()
    else:
        limiter = paceline.Limiter(10, per=1.0, burst=1)
    starts = starts_around_stalls(limiter, (1.0, 2.5, 4.0))
    # 10/s, burst 1: at most 11 starts in any second (one more for the readings taken
    # after each admission).
    assert starts_within(starts, 1.0) <= 11 + SLACK, sorted(starts)
    assert starts_within(starts, 0.1) <= 2 + SLACK, sorted(starts)


def test_a_fast_queue_keeps_its_rate_with_the_execution_bound():
    # At 10 000/s the loop resumes waiters in rounds of its timer's resolution, so most
    # wait an interval or more for their execution cells though nothing stalled; holding
    # the booking cell for each of those pushed every later turn back, round after round
    # (the second half of this run came at about half the rate).
    async def main():
        limiter = paceline.Limiter(10_000, per=1.0, burst=1)
        admitted = []

        async def one():
            await limiter.acquire()
            admitted.append(time.monotonic())

        await asyncio.gather(*(one() for _ in range(10_000)))
        return sorted(admitted)

    admitted = asyncio.run(main())
    second_half = admitted[-1] - admitted[len(admitted) // 2]
    # 5 000 turns at 10 000/s: 0.5 s; at least 70 % of the rate, on a loaded machine too.
    assert second_half <= 0.5 / 0.7, second_half


def test_set_quota_while_running_keeps_the_spent_and_the_queue():
    async def main():
        limiter = paceline.Limiter(10, per=1.0, burst=1)
        assert limiter.try_acquire()
        t0 = time.monotonic()
        booked = asyncio.ensure_future(limiter.acquire())  # its turn: 0.1 s
        await asyncio.sleep(0.02)
        limiter.set_quota(100, per=1.0, burst=1)
        # What was spent stays spent: the booked turn keeps its place at 0.1 s, and
        # the turns booked after the change come 10 ms apart, not 100 ms.
        later = [asyncio.ensure_future(limiter.acquire()) for _ in range(5)]
        await booked
        first = time.monotonic() - t0
        await asyncio.gather(*later)
        return first, time.monotonic() - t0

    first, last = asyncio.run(main())
    assert 0.1 - 0.002 <= first < 0.5
    assert 0.15 - 0.002 <= last < 0.5


def test_keyed_limiters_limit_each_key_on_its_own():
    async def main():
        limiter = paceline.KeyedLimiter(5, per=1.0, burst=1)
        assert limiter.try_acquire("a")
        assert not limiter.try_acquire("a")
        assert limiter.try_acquire("b")
        t0 = time.monotonic()
        await asyncio.gather(limiter.acquire("a"), limiter.acquire("a"))
        return time.monotonic() - t0, len(limiter)

    elapsed, keys = asyncio.run(main())
    assert elapsed >= 0.4 - 0.002
    assert keys == 2
    limiter = paceline.KeyedLimiter(5, per=1.0, burst=2)
    limiter.acquire_blocking("x", 2)
    assert limiter.remaining("x") == 0


def test_bad_arguments_raise_clear_errors_and_change_nothing():
    with pytest.raises(ValueError, match="rate"):
        paceline.Limiter(0)
    with pytest.raises(TypeError, match="rate"):
        paceline.Limiter("100")
    with pytest.raises(TypeError, match="rate"):
        paceline.Limiter(True)
    with pytest.raises(ValueError, match="per"):
        paceline.Limiter(1, per=-1)
    with pytest.raises(ValueError, match="per"):
        paceline.Limiter(1, per=float("nan"))
    with pytest.raises(ValueError, match="burst"):
        paceline.Limiter(1, burst=0)
    with pytest.raises(ValueError):
        paceline.Limiter(1, per=1e-12)  # an interval below a nanosecond
    limiter = paceline.Limiter(10, per=1.0, burst=3)
    with pytest.raises(ValueError, match="burst"):
        limiter.try_acquire(4)
    with pytest.raises(ValueError, match="burst"):
        asyncio.run(limiter.acquire(4))
    with pytest.raises(ValueError, match="timeout"):
        asyncio.run(limiter.acquire(1, timeout=-1))
    with pytest.raises(TypeError, match="n must be an int"):
        limiter.try_acquire(1.5)
    with pytest.raises(ValueError, match="burst"):
        limiter.set_quota(10, burst=0)
    assert limiter.remaining() == 3, "nothing was spent"
    keyed = paceline.KeyedLimiter(1)
    with pytest.raises(TypeError, match="key"):
        keyed.try_acquire(7)
    assert len(keyed) == 0


def cancel_all(count, waiting):
    """Seconds the loop takes to cancel `count` tasks parked in `waiting()`."""

    async def main():
        tasks = [asyncio.ensure_future(waiting()) for _ in range(count)]
        await asyncio.sleep(0.1)
        t0 = time.perf_counter()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return time.perf_counter() - t0

    return asyncio.run(main())


def test_cancelling_many_waiters_costs_about_what_cancelling_plain_sleeps_costs():
    # A task group failing, or a timeout firing over a big batch, cancels every waiter at
    # once. Each cancellation gives cells back and moves everyone behind up: that must
    # cost about one cancellation each, not one pass over all the others.
    count = 30_000

    def paceline_waiters():
        limiter = paceline.Limiter(1000, per=1.0, burst=1)
        return cancel_all(count, limiter.acquire)

    def sleepers():
        return cancel_all(count, lambda: asyncio.sleep(1000))

    # Best of two each, interleaved, so a hiccup of the machine does not decide.
    ours = min(paceline_waiters(), paceline_waiters())
    plain = min(sleepers(), sleepers())
    assert ours < 4 * plain, (ours, plain)


def test_numbers_out_of_range_get_errors_that_name_them():
    limiter = paceline.Limiter(10, per=1.0, burst=3)
    with pytest.raises(ValueError, match=r"n must be between 0 and 4294967295, got 1099511627776"):
        limiter.try_acquire(2**40)
    with pytest.raises(ValueError, match=r"n must be between"):
        asyncio.run(limiter.acquire(2**40))
    with pytest.raises(ValueError, match=r"per / rate = 1e\+?30 s / 10 is too long"):
        paceline.Limiter(10, per=1e30)
    with pytest.raises(ValueError, match=r"per must be a positive, finite number"):
        paceline.Limiter(10, per=float("inf"))
    with pytest.raises(ValueError, match=r"below one nanosecond"):
        paceline.Limiter(10, per=1e-9)
    with pytest.raises(ValueError, match=r"timeout must be None or a number of seconds >= 0"):
        limiter.acquire_blocking(timeout=float("nan"))
    assert limiter.remaining() == 3, "nothing was spent"


def test_an_infinite_timeout_means_no_timeout():
    limiter = paceline.Limiter(100, per=1.0, burst=1)
    assert limiter.try_acquire()
    # As for asyncio.wait_for: wait however long the turn is.
    asyncio.run(limiter.acquire(timeout=float("inf")))
    limiter.acquire_blocking(timeout=float("inf"))
    keyed = paceline.KeyedLimiter(100, per=1.0, burst=1)
    asyncio.run(keyed.acquire("k", timeout=float("inf")))


def test_wait_time_says_how_long_a_turn_is_away_and_spends_nothing():
    limiter = paceline.Limiter(10, per=1.0, burst=2)
    assert limiter.wait_time() == 0.0
    assert limiter.try_acquire(2)
    assert 0.09 < limiter.wait_time() <= 0.1
    assert 0.19 < limiter.wait_time(2) <= 0.2
    assert limiter.remaining() == 0
    with pytest.raises(ValueError, match="burst"):
        limiter.wait_time(3)


def test_long_keys_cost_a_bounded_number_of_bytes():
    import resource

    keyed = paceline.KeyedLimiter(1, per=3600.0, burst=1)
    base = "x" * (1 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    for i in range(300):
        assert keyed.try_acquire(base + str(i))  # a fresh 1 MiB key, dropped after
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert len(keyed) == 300
    # Stored as they came, 300 keys would hold 300 MiB.
    assert grown_mib < 64, grown_mib
    # A long key is still its own key, the same each time it comes.
    assert not keyed.try_acquire(base + "0")
    assert keyed.try_acquire(base + "300")


def test_an_acquire_that_need_not_wait_completes_without_a_coroutine_and_asyncio_takes_it():
    limiter = paceline.Limiter(10, per=1.0, burst=3)
    ready = limiter.acquire()
    assert not asyncio.iscoroutinefunction(limiter.acquire)
    assert limiter.remaining() == 2, "the call itself took the cell"
    assert asyncio.iscoroutine(ready), "asyncio takes it as a coroutine"
    assert asyncio.run(ready) is None

    async def main():
        await limiter.acquire()
        return await asyncio.create_task(limiter.acquire())

    assert asyncio.run(main()) is None
    assert limiter.remaining() == 0
    assert limiter.stats()["admitted"] == 3


def test_an_acquire_does_not_jump_ahead_of_a_queued_waiter():
    async def main():
        limiter = paceline.Limiter(20, per=1.0, burst=1)
        order = []

        async def one(name):
            await limiter.acquire()
            order.append(name)

        assert limiter.try_acquire()
        first = asyncio.ensure_future(one("queued"))
        await asyncio.sleep(0.01)  # queued: its turn is booked, 50 ms away
        # The cell may be back by the time this runs; the queued waiter's turn is not.
        late = limiter.acquire()
        assert asyncio.iscoroutine(late) and not isinstance(late, Ready), "not taken now"
        await asyncio.gather(first, one_after(late, order))
        return order

    async def one_after(awaitable, order):
        await awaitable
        order.append("later")

    assert asyncio.run(main()) == ["queued", "later"]


def test_bad_arguments_to_acquire_raise_when_awaited_and_change_nothing():
    limiter = paceline.Limiter(10, per=1.0, burst=3)
    keyed = paceline.KeyedLimiter(10, per=1.0, burst=3)
    for bad, error, what in [
        ((True,), TypeError, "n must be an int, got bool"),
        (("1",), TypeError, "n must be an int, got str"),
        ((None,), TypeError, "n must be an int, got NoneType"),
        ((-1,), ValueError, "n must be between 0 and 4294967295, got -1"),
        ((1, "soon"), TypeError, "timeout"),
    ]:
        pending = limiter.acquire(*bad)
        with pytest.raises(error, match=what):
            asyncio.run(pending)
        with pytest.raises(error, match=what):
            asyncio.run(keyed.acquire("k", *bad))
    with pytest.raises(TypeError, match="key must be a str, got int"):
        asyncio.run(keyed.acquire(7))
    with pytest.raises(TypeError, match="n must be an int, got bool"):
        limiter.try_acquire(True)
    with pytest.raises(ValueError, match="n must be between 0 and 4294967295, got -1"):
        keyed.try_acquire("k", -1)
    # None is not "the default": an omitted n is 1, a None a mistake.
    with pytest.raises(TypeError, match="n must be an int, got NoneType"):
        limiter.try_acquire(None)
    with pytest.raises(TypeError, match="n must be an int, got NoneType"):
        keyed.try_acquire("k", None)
    assert limiter.remaining() == 3 and keyed.remaining("k") == 3, "nothing was spent"
    assert len(keyed) == 0, "no key was stored"
    assert limiter.stats()["admitted"] == 0 and limiter.stats()["refused"] == 0


def test_an_acquire_held_without_its_limiter_still_waits_its_turns():
    acquire = paceline.Limiter(50, per=1.0, burst=1).acquire

    async def main():
        t0 = time.monotonic()
        for _ in range(3):
            await acquire()  # the second and third wait their turns
        return time.monotonic() - t0

    assert asyncio.run(main()) >= 0.035


def test_a_limiter_bound_to_its_core_is_still_collected():
    import gc
    import weakref

    limiter = paceline.Limiter(10)
    keyed = paceline.KeyedLimiter(10)
    gone = [weakref.ref(limiter), weakref.ref(keyed)]
    del limiter, keyed
    gc.collect()
    assert [ref() for ref in gone] == [None, None]


def test_a_subclass_that_overrides_acquire_keeps_its_override():
    class Counting(paceline.Limiter):
        calls = 0

        def try_acquire(self, n=1):
            Counting.calls += 1
            return super().try_acquire(n)

        async def acquire(self, n=1, timeout=None):
            Counting.calls += 1
            await super().acquire(n, timeout)

    limiter = Counting(10, burst=2)
    assert limiter.try_acquire()
    asyncio.run(limiter.acquire())
    assert Counting.calls == 2 and limiter.remaining() == 0


def test_a_try_acquire_the_execution_cell_refuses_spends_nothing_of_the_booking_cell():
    limiter = paceline.Limiter(10, per=1.0, burst=2)
    core = limiter._core
    # Two waiters' late runs take the execution cell's whole burst (as after a stalled
    # loop), while the booking cell keeps its room.
    for _ in range(2):
        run = core.run(1)
        assert run.ready_in() == 0.0
        run.done()
    assert limiter.try_acquire(2) is False
    assert limiter.try_acquire() is False
    ticket = core.book(2, None)
    assert ticket.ready_in() == 0.0, "the refusals spent nothing of the booking cell"
    ticket.cancel()


def test_a_keyed_try_acquire_the_execution_cell_refuses_spends_nothing_of_the_booking_cell():
    for max_keys in (None, 10):
        keyed = paceline.KeyedLimiter(10, per=1.0, burst=2, max_keys=max_keys)
        core = keyed._core
        for _ in range(2):
            run = core.run("k", 1)
            assert run.ready_in() == 0.0
            run.done()
        assert keyed.try_acquire("k", 2) is False
        assert keyed.try_acquire("k") is False
        ticket = core.book("k", 2, None)
        assert ticket.ready_in() == 0.0, "the refusals spent nothing of the booking cell"
        ticket.cancel()
