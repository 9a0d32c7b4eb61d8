"""How the benches time a call: the median over rounds."""

import statistics
import time

ROUNDS = 7


def per_call(fn, n, rounds=ROUNDS):
    """Median nanoseconds per call over ``rounds`` rounds of ``fn(n)``, which makes ``n``
    calls."""
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn(n)
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)
