"""Several processes running one function, for the tests across processes (and the
benches), and the count of a budget's turns that one of them puts back."""

import asyncio
import multiprocessing
import time


def results(target, args, count, start_method="fork", exit_zero=True):
    """Runs ``target(*args, out)`` in ``count`` processes (``start_method``'s) and returns
    what each put on ``out``, in the order they came, once every one has ended; each must
    have exited 0 unless ``exit_zero`` is false."""
    ctx = multiprocessing.get_context(start_method)
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out)) for _ in range(count)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        if exit_zero:
            assert p.exitcode == 0
    return got


def admissions(budget, tasks, start, seconds, out, pause=None):
    """Puts on ``out`` how many turns of ``budget`` ``tasks`` asyncio tasks took from
    ``start`` to ``start + seconds`` (``time.time()``), each asking again as soon as it
    is admitted (``pause`` seconds later, with ``pause``)."""
    count = [0]

    async def task():
        while True:
            left = start + seconds - time.time()
            if left <= 0:
                return
            try:
                async with budget.acquire(timeout=left):
                    if time.time() <= start + seconds:
                        count[0] += 1
            except TimeoutError:
                return
            if pause is not None:
                await asyncio.sleep(pause)

    async def main():
        await asyncio.sleep(max(0.0, start - time.time()))
        await asyncio.gather(*(task() for _ in range(tasks)))

    asyncio.run(main())
    out.put(count[0])
