"""The seeds' job, drawn: 300 calls to a (fake) API at 100 per second, each call taking
5-300 ms, paced by a home-made token bucket, by aiolimiter and by paceline, one after the
other on one event loop: the calls let through so far against time, with the configured rate
as a line.

    pip install ./python aiolimiter matplotlib
    python docs/pictures/seeds.py          # writes docs/pictures/seeds.png, prints the rates
"""

import asyncio
import pathlib
import random
import time

import aiolimiter
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import paceline  # noqa: E402

CALLS, RATE = 300, 100
HERE = pathlib.Path(__file__).parent


class HomeMadeBucket:
    """The token bucket as it is usually written by hand: it starts full (a bucket of
    `rate` tokens), refills continuously, and a caller that finds it empty sleeps until
    one token should be there, then checks again."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = rate
        self.last = time.monotonic()

    async def acquire(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)


async def run(acquire) -> list:
    """The instants (s from the start) at which each of the calls was let through."""
    t0 = time.monotonic()
    starts = []

    async def call() -> None:
        await acquire()
        starts.append(time.monotonic() - t0)
        await asyncio.sleep(random.uniform(0.005, 0.300))

    await asyncio.gather(*(call() for _ in range(CALLS)))
    return sorted(starts)


def busiest_second(starts: list) -> int:
    """The most calls let through in any one-second window."""
    most, j = 0, 0
    for i, t in enumerate(starts):
        while starts[j] <= t - 1.0:
            j += 1
        most = max(most, i - j + 1)
    return most


def main() -> None:
    limiters = {
        "home-made token bucket": HomeMadeBucket(RATE).acquire,
        "aiolimiter AsyncLimiter(100, 1)": aiolimiter.AsyncLimiter(RATE, 1).acquire,
        "paceline Limiter(100, burst=1)": paceline.Limiter(RATE, per=1.0, burst=1).acquire,
    }
    runs = {name: asyncio.run(run(acquire)) for name, acquire in limiters.items()}
    fig, ax = plt.subplots(figsize=(8, 4), dpi=110)
    styles = [("-", 3.2), ("--", 1.6), ("-", 1.8)]
    for (name, starts), (style, width) in zip(runs.items(), styles):
        most = busiest_second(starts)
        label = f"{name}: {most} in its busiest second"
        ax.step(starts, range(1, len(starts) + 1), where="post", linestyle=style,
                linewidth=width, label=label)
        print(f"{name:34} busiest second {most:3d}, all {CALLS} let through by {starts[-1]:.2f} s")
    ax.plot([0, 3], [1, 301], color="black", linewidth=0.8, linestyle=":",
            label=f"configured: {RATE}/s")
    ax.set_xlabel("seconds from the start")
    ax.set_ylabel("calls let through so far")
    ax.set_xlim(0, 3.2)
    ax.set_ylim(0, CALLS + 10)
    ax.set_title(f"{CALLS} calls to an API at {RATE}/s, each taking 5-300 ms")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(HERE / "seeds.png")


if __name__ == "__main__":
    main()
