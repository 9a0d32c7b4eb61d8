"""The upstream matrix: clients configured for 100 requests per second against a fake
upstream on loopback that allows 50, each row an upstream that says so differently, from
1 task to 600. In each run every request is sent until it succeeds; the upstream logs
what it saw, and the run is measured there:

* refused: the share of the requests the upstream saw that it refused;
* ok/s: successes per second from the first success to the last, less the first
  refusal's Retry-After (obeying a first hold is allowed for), and that as a share of
  the 50/s the upstream allows.

Clients, in the same run against the same upstream:

* ``paceline-rust``: ``http::client::PaceMiddleware`` on reqwest (the Rust half,
  ``benches/examples/upstream_matrix.rs``), ``Quota::per_second(100).with_burst(1)``;
* ``paceline-py``: ``paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1))``;
* ``deaf``: ``aiolimiter.AsyncLimiter(100, 1)``, a refused request sent again at once;
* ``aiolimiter+RA``: the same, a refused request's task sleeping its Retry-After (1 s
  if none) before sending it again.

Rows: ``ietf`` (``RateLimit-Policy``, ``RateLimit`` and ``Retry-After``), ``retry-after``
(``Retry-After`` only), ``x`` (``X-RateLimit-*`` only), ``bare`` (a bare 429): a GCRA
limit with bursts of 10; the same four over a fixed 1 s window (``-window``);
``x-burst1`` and ``bare-burst1``: the GCRA limit with no burst (``x-burst1`` names the
limit and reports 0 left on every answer); and ``paceline-1``, ``paceline-10``, ``paceline-50``: paceline's own axum layer at that
burst, with its default fields.

    cargo build --release -p paceline-benches --example upstream_matrix
    pip install ./python httpx aiolimiter
    python python/bench/upstream_matrix.py [--rows ietf,bare] [--tasks 1,50,600] \\
        [--clients paceline-rust,paceline-py,deaf,aiolimiter+RA] [--requests 300]

Loopback only; each run is bounded (``--requests``, at least one per task, and 90 s).
"""

import argparse
import asyncio
import os
import subprocess
import sys
import time
import urllib.request

import aiolimiter
import httpx

import paceline
import paceline.httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = [
    "ietf", "retry-after", "x", "bare",
    "ietf-window", "retry-after-window", "x-window", "bare-window", "x-burst1", "bare-burst1",
    "paceline-1", "paceline-10", "paceline-50",
]
CLIENTS = ["paceline-rust", "paceline-py", "deaf", "aiolimiter+RA"]
ALLOWED = 50.0
RUN_LIMIT = 90.0


def binary():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    path = os.path.join(target, "release", "examples", "upstream_matrix")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: cargo build --release -p paceline-benches "
                 "--example upstream_matrix")
    return path


class Server:
    def __init__(self, row):
        self.process = subprocess.Popen(
            [binary(), "serve", row], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self.process.stdout.readline()
        assert line.startswith("PORT "), line
        self.url = f"http://127.0.0.1:{line.split()[1]}/"

    def log(self):
        with urllib.request.urlopen(self.url + "log", timeout=10) as response:
            rows = []
            for line in response.read().decode().splitlines():
                secs, status, ra = line.split()
                rows.append((float(secs), int(status), None if ra == "-" else int(ra)))
            return rows

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)


def measure(log):
    refused = sum(1 for _, s, _ in log if s == 429)
    ok = [t for t, s, _ in log if s == 200]
    first_hold = next((ra or 0 for _, s, ra in log if s == 429), 0)
    rate = 0.0
    if len(ok) > 1:
        span = ok[-1] - ok[0] - first_hold
        rate = (len(ok) - 1) / max(span, 1e-9)
    return refused / max(1, len(log)), rate


async def calls(send, url, tasks, requests):
    shares = [requests // tasks + (1 if i < requests % tasks else 0) for i in range(tasks)]

    async def worker(n):
        for _ in range(n):
            await send(url)

    await asyncio.wait_for(asyncio.gather(*(worker(n) for n in shares)), RUN_LIMIT)


async def paceline_py(url, tasks, requests):
    transport = paceline.httpx.AsyncTransport(paceline.Limiter(100, burst=1), retries=10_000)
    async with httpx.AsyncClient(transport=transport, timeout=RUN_LIMIT) as client:

        async def send(url):
            response = await client.get(url)
            assert response.status_code == 200, response.status_code

        await calls(send, url, tasks, requests)


async def aiolimiter_client(url, tasks, requests, listen):
    limiter = aiolimiter.AsyncLimiter(100, 1)
    async with httpx.AsyncClient(timeout=RUN_LIMIT) as client:

        async def send(url):
            while True:
                async with limiter:
                    response = await client.get(url)
                if response.status_code != 429:
                    return
                if listen:
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")))

        await calls(send, url, tasks, requests)


def run_client(name, url, tasks, requests):
    if name == "paceline-rust":
        subprocess.run(
            [binary(), "client", url, str(tasks), str(requests)],
            check=True, timeout=RUN_LIMIT + 10, stdout=subprocess.DEVNULL,
        )
    elif name == "paceline-py":
        asyncio.run(paceline_py(url, tasks, requests))
    elif name == "deaf":
        asyncio.run(aiolimiter_client(url, tasks, requests, listen=False))
    elif name == "aiolimiter+RA":
        asyncio.run(aiolimiter_client(url, tasks, requests, listen=True))
    else:
        raise SystemExit(f"no client {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--tasks", default="1,50,600")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    print("| upstream (allows 50/s) | tasks | client | refused | ok/s | of 50/s |")
    print("|---|---|---|---|---|---|")
    for row in args.rows.split(","):
        server = Server(row)
        try:
            for tasks in [int(t) for t in args.tasks.split(",")]:
                requests = max(args.requests, tasks)
                for name in args.clients.split(","):
                    # The upstream's burst (or window) whole again, its log empty.
                    time.sleep(1.5)
                    server.log()
                    note = ""
                    try:
                        run_client(name, server.url, tasks, requests)
                    except (asyncio.TimeoutError, subprocess.TimeoutExpired):
                        note = f" (stopped at {RUN_LIMIT:.0f} s)"
                    refused, rate = measure(server.log())
                    print(
                        f"| {row} | {tasks} | {name} | {refused * 100:.1f} % | {rate:.1f} "
                        f"| {rate / ALLOWED * 100:.0f} %{note} |",
                        flush=True,
                    )
        finally:
            server.close()


if __name__ == "__main__":
    main()
