"""paceline.asgi against slowapi, side by side in one run, on a minimal Starlette app.

    pip install ./python starlette slowapi uvicorn httpx; python3 python/bench/asgi_middleware.py

1. The cost one request pays for the middleware: requests from 1 000 clients (peer
   addresses) driven through each app's ASGI interface in this process (no sockets, so
   the difference is the middleware's own), admitted and refused, against the bare app.
   Rounds interleave the apps; medians over ROUNDS rounds, and the spread.
2. Across workers: `uvicorn --workers 4` with a limit of 10 per hour per client, one
   client sending 40 requests on fresh connections: how many each limiter admits
   (paceline's limit in a shared file; slowapi's in-memory storage, one per worker).
"""

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROUNDS = int(os.environ.get("ROUNDS", 9))
REQUESTS = 20_000
CLIENTS = 1_000

os.environ.setdefault("BENCH_APP", "bare")


def build(kind: str, limit: str):
    """The minimal Starlette app: `bare`, `paceline` or `slowapi`, limited to `limit`
    ("N/second" or "N/hour") per client address."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def home(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", home)])
    count, unit = limit.split("/")
    per = {"second": 1.0, "hour": 3600.0}[unit]
    if kind == "paceline":
        from paceline.asgi import KeySource, Limit, RateLimitMiddleware

        shared = os.environ.get("BENCH_SHARED")
        app.add_middleware(
            RateLimitMiddleware,
            limits=[Limit("per-ip", rate=int(count), per=per, key=KeySource.peer_ip(),
                          shared=shared, on_mismatch="replace")],
        )
    elif kind == "slowapi":
        from slowapi import Limiter, _rate_limit_exceeded_handler
        from slowapi.errors import RateLimitExceeded
        from slowapi.middleware import SlowAPIASGIMiddleware
        from slowapi.util import get_remote_address

        app.state.limiter = Limiter(key_func=get_remote_address, default_limits=[limit])
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)
        app.add_middleware(SlowAPIASGIMiddleware)
    return app


# The app uvicorn imports in part 2.
app = build(os.environ["BENCH_APP"], os.environ.get("BENCH_LIMIT", "10/hour"))


async def drive(app, n: int, clients: int) -> list:
    """Sends `n` GETs through `app`'s ASGI interface, from `clients` addresses in turn;
    the statuses seen."""
    statuses = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scopes = [
        {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
         "scheme": "http", "path": "/", "raw_path": b"/", "query_string": b"",
         "root_path": "", "headers": [(b"host", b"bench"), (b"user-agent", b"bench")],
         "client": (f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}", 40000),
         "server": ("127.0.0.1", 8000)}
        for i in range(clients)
    ]
    for i in range(n):
        await app(dict(scopes[i % clients]), receive, send)
    return statuses


def per_request_costs() -> None:
    print(f"1. Per-request cost, {REQUESTS} requests from {CLIENTS} clients through the ASGI "
          f"interface, median of {ROUNDS} interleaved rounds (min-max)")
    regimes = {
        # A limit nobody reaches: every request is admitted.
        "admitted": "1000000/second",
        # One request per client per hour: after each client's first, refused.
        "refused": "1/hour",
    }
    for regime, limit in regimes.items():
        apps = {kind: build(kind, limit) for kind in ("bare", "paceline", "slowapi")}
        samples = {kind: [] for kind in apps}
        seen = {}
        for _ in range(ROUNDS):
            for kind, a in apps.items():
                t0 = time.perf_counter_ns()
                statuses = asyncio.run(drive(a, REQUESTS, CLIENTS))
                samples[kind].append((time.perf_counter_ns() - t0) / REQUESTS / 1000)
                seen[kind] = sorted(set(statuses))
        bare = statistics.median(samples["bare"])
        print(f"  {regime} (statuses seen: {seen})")
        for kind, s in samples.items():
            median = statistics.median(s)
            extra = "" if kind == "bare" else f"   middleware: {median - bare:+5.1f} µs"
            print(f"    {kind:9} {median:6.1f} µs/request ({min(s):.1f}-{max(s):.1f}){extra}")


def across_workers() -> None:
    print("2. uvicorn --workers 4, limit 10/hour per client, one client sends 40 requests on "
          "fresh connections")
    import httpx

    for kind in ("paceline", "slowapi"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        tmp = tempfile.mkdtemp()
        env = dict(os.environ, BENCH_APP=kind, BENCH_LIMIT="10/hour",
                   BENCH_SHARED=os.path.join(tmp, "limit"))
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "asgi_middleware:app", "--port", str(port),
             "--workers", "4", "--log-level", "warning", "--no-proxy-headers",
             "--app-dir", os.path.dirname(os.path.abspath(__file__))],
            env=env, start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}/"
            deadline = time.monotonic() + 60
            while True:
                try:
                    # The probe is a request too: it is the first of the 40.
                    first = httpx.get(url, headers={"connection": "close"}).status_code
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            time.sleep(1.0)  # every worker up
            codes = [first] + [
                httpx.get(url, headers={"connection": "close"}).status_code for _ in range(39)
            ]
            print(f"    {kind:9} {codes.count(200):2} admitted of 40 (the limit: 10)")
        finally:
            os.killpg(server.pid, 15)
            server.wait()


if __name__ == "__main__":
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")
    per_request_costs()
    across_workers()
