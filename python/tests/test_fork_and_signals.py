"""paceline across `fork` and under signals, with real processes and real signals.

A forked child (os.fork, multiprocessing's fork start method, gunicorn --preload) must be
served by the limiters it inherited; a blocked `acquire_blocking` must answer Ctrl-C and
give its turn back."""

import asyncio
import multiprocessing
import os
import signal
import threading
import time

import pytest

import paceline

# How long a child may take before it counts as hung: its waits add up to well under a
# second; the rest is room for a loaded machine.
HUNG_AFTER = 10.0

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def run_in_child(child):
    """Forks; the child runs `child()` and exits 0 if it returned True. Returns the
    child's exit code, or fails the test if it has not exited after HUNG_AFTER."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if child() else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + HUNG_AFTER
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung: killed after {HUNG_AFTER} s")


async def waits(limiter, count):
    await asyncio.gather(*(limiter.acquire() for _ in range(count)))


def test_a_forked_child_is_served_by_the_limiter_it_inherited_and_by_new_ones():
    limiter = paceline.Limiter(100, per=1.0, burst=1)
    keyed = paceline.KeyedLimiter(100, per=1.0, burst=1)
    # Tasks that wait: the Rust timer thread starts in the parent.
    asyncio.run(waits(limiter, 5))
    asyncio.run(keyed.acquire("a"))
    asyncio.run(keyed.acquire("a"))

    def child():
        t0 = time.monotonic()
        for _ in range(3):
            limiter.acquire_blocking(timeout=1.0)
        asyncio.run(waits(limiter, 3))
        keyed.acquire_blocking("a", timeout=1.0)
        asyncio.run(keyed.acquire("a"))
        fresh = paceline.Limiter(100, per=1.0, burst=1)
        fresh.acquire_blocking()
        fresh.acquire_blocking()
        return time.monotonic() - t0 < 5.0

    assert run_in_child(child) == 0
    # The parent is still served.
    limiter.acquire_blocking(timeout=1.0)


def test_a_child_forked_while_other_threads_wait_is_served():
    limiter = paceline.Limiter(50, per=1.0, burst=1)
    stop = threading.Event()

    def blocking():
        while not stop.is_set():
            limiter.acquire_blocking()

    def looping():
        async def main():
            while not stop.is_set():
                await limiter.acquire()

        asyncio.run(main())

    threads = [threading.Thread(target=blocking), threading.Thread(target=looping)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.2)
        codes = []
        for _ in range(3):
            # In the child those threads are gone; their bookings stay spent.
            codes.append(
                run_in_child(
                    lambda: (
                        limiter.acquire_blocking(timeout=2.0),
                        asyncio.run(waits(limiter, 2)),
                        True,
                    )[-1]
                )
            )
            time.sleep(0.05)
        assert codes == [0, 0, 0]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)


# What a module-level limiter is for a pool: the workers inherit it through fork.
POOL_LIMITER = None


def pool_worker(count):
    t0 = time.monotonic()
    for _ in range(count):
        POOL_LIMITER.acquire_blocking(timeout=2.0)
    asyncio.run(waits(POOL_LIMITER, count))
    return time.monotonic() - t0


def test_multiprocessing_fork_workers_are_served_by_the_inherited_limiter():
    global POOL_LIMITER
    POOL_LIMITER = paceline.Limiter(200, per=1.0, burst=1)
    asyncio.run(waits(POOL_LIMITER, 5))
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        elapsed = pool.map_async(pool_worker, [5] * 4).get(timeout=HUNG_AFTER * 2)
    # Each worker's limiter is its own copy: 10 turns at 200/s, 45 ms at the least.
    assert all(0.045 - 0.002 <= e < 5.0 for e in elapsed), elapsed


def test_ctrl_c_interrupts_acquire_blocking_and_gives_the_turn_back():
    limiter = paceline.Limiter(1, per=10.0, burst=1)
    assert limiter.try_acquire()
    # The next turn is 10 s away; Ctrl-C comes after 0.5 s.
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        limiter.acquire_blocking()
    elapsed = time.monotonic() - t0
    assert 0.5 - 0.01 <= elapsed < 3.0, elapsed
    # The turn went back: the next one is still the first after the spent cell (about
    # 9.5 s away), not one behind the interrupted booking (about 19.5 s).
    assert limiter.wait_time() < 10.0 - elapsed + 0.1, limiter.wait_time()


def test_a_signal_handler_that_raises_ends_a_keyed_blocking_wait():
    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop()

    old = signal.signal(signal.SIGALRM, handler)
    try:
        keyed = paceline.KeyedLimiter(1, per=10.0, burst=1)
        assert keyed.try_acquire("k")
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        with pytest.raises(Stop):
            keyed.acquire_blocking("k")
        assert time.monotonic() - t0 < 3.0
        assert keyed.wait_time("k") < 10.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_child_never_runs_the_wakers_of_the_parents_event_loop():
    # Tasks on another thread's loop wait on a budget; each child inherits their alarms,
    # and its timer rings them: the parent loop's call_soon_threadsafe must never run
    # there (it crashed children), and every child must exit cleanly.
    budget = paceline.Budget(in_flight=2, requests=paceline.Rate(2000, 1.0, 1))
    ready, stop = threading.Event(), threading.Event()
    r, w = os.pipe()

    class Spy(asyncio.SelectorEventLoop):
        def call_soon_threadsafe(self, *args, **kwargs):
            if os.getpid() != self.owner:
                os.write(w, b"x")
            return super().call_soon_threadsafe(*args, **kwargs)

    def loop_thread():
        loop = Spy()
        loop.owner = os.getpid()

        async def waiter():
            while not stop.is_set():
                async with budget.acquire(requests=1, timeout=30):
                    await asyncio.sleep(0)

        async def main():
            tasks = [asyncio.create_task(waiter()) for _ in range(50)]
            await asyncio.sleep(0.2)
            ready.set()
            await asyncio.gather(*tasks)

        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=loop_thread, daemon=True)
    thread.start()
    ready.wait(10)
    failed = []
    for _ in range(15):
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)
            code = 3
            try:
                time.sleep(0.2)
                with budget.acquire_blocking(requests=1, timeout=5):
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            failed.append(status)
    stop.set()
    thread.join(10)
    os.set_blocking(r, False)
    try:
        ran = len(os.read(r, 1 << 16))
    except BlockingIOError:
        ran = 0
    assert (ran, failed) == (0, [])
