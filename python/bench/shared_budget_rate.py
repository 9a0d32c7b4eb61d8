"""A shared budget's queue at its rate: asyncio tasks spread over processes, each
admitted, doing nothing and asking again, against one rate (no burst left: the budget is
emptied first, so only the steady rate counts). Prints the admissions per second against
the rate and the CPU the processes used.

``python python/bench/shared_budget_rate.py [rate] [tasks] [processes] [seconds]``
(defaults 500 500 4 4)."""

import multiprocessing
import os
import sys
import tempfile
import time

import paceline

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from processes import admissions  # noqa: E402


def open_budget(path: str, rate: int) -> paceline.Budget:
    return paceline.Budget.shared(path, requests=paceline.Rate(rate, per=1.0), in_flight=2_048)


def worker(path: str, rate: int, tasks: int, start: float, seconds: float, out) -> None:
    admissions(open_budget(path, rate), tasks, start, seconds, out, pause=0.001)


def main() -> None:
    rate, tasks, procs = (int(a) for a in (sys.argv[1:4] + ["500", "500", "4"][len(sys.argv[1:4]):]))
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 4.0
    path = os.path.join(tempfile.mkdtemp(), "budget")
    budget = open_budget(path, rate)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 1.5
    shares = [tasks // procs + (1 if i < tasks % procs else 0) for i in range(procs)]
    ps = [ctx.Process(target=worker, args=(path, rate, n, start, seconds, out)) for n in shares]
    for p in ps:
        p.start()
    time.sleep(max(0.0, start - 0.05 - time.time()))
    turn = budget.try_acquire(requests=rate)  # the burst spent: only the rate counts
    if turn is not None:
        turn.release()
    before = os.times()
    admitted = sum(out.get() for _ in ps)
    for p in ps:
        p.join()
    after = os.times()
    cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    print(
        f"{tasks} tasks over {procs} processes, rate {rate}/s: {admitted / seconds:.1f}/s "
        f"({100 * admitted / seconds / rate:.1f} % of the rate); processes' CPU {cpu:.2f} s "
        f"in {seconds:.0f} s"
    )


if __name__ == "__main__":
    main()
