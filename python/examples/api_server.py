"""Limiting a FastAPI app per client with paceline.asgi, served by a real uvicorn.

    python python/examples/api_server.py

starts the app on a loopback port and plays three clients behind a proxy against it.
To serve it with several workers sharing one bound per client:

    API_LIMIT_FILE=/dev/shm/my-api uvicorn api_server:app --app-dir python/examples \\
        --workers 4 --no-proxy-headers
"""

import asyncio
import os
import socket
import threading
import time

import httpx
import uvicorn
from fastapi import Depends, FastAPI

from paceline.asgi import KeySource, Limit, RateLimitMiddleware, RouteLimit

# Clients come through a proxy on this host: its X-Forwarded-For names them. Anyone else
# is keyed by their own address, whatever they write in that header.
client = KeySource.behind_proxies(["127.0.0.1/32", "10.0.0.0/8"])

app = FastAPI()
app.add_middleware(
    RateLimitMiddleware,
    limits=[
        # 10 requests per second per client, 20 at once; in a file every worker shares
        # when API_LIMIT_FILE names one.
        Limit("per-ip", rate=10, per=1.0, burst=20, key=client,
              shared=os.environ.get("API_LIMIT_FILE")),
    ],
    headers_on_success=True,
)

# One route limited further: 3 login attempts per minute per client.
login_limit = RouteLimit(Limit("login", rate=3, per=60.0, key=client))


@app.get("/items")
async def items():
    return {"items": [1, 2, 3]}


@app.post("/login", dependencies=[Depends(login_limit)])
async def login():
    return {"token": "t0k3n"}


async def play(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as http:

        def as_client(ip):
            return {"x-forwarded-for": ip}

        print("three clients send 25 requests each at once (burst 20):")
        for ip in ("203.0.113.1", "203.0.113.2", "203.0.113.3"):
            rs = await asyncio.gather(*(http.get("/items", headers=as_client(ip)) for _ in range(25)))
            codes = [r.status_code for r in rs]
            print(f"  {ip}: {codes.count(200)} admitted, {codes.count(429)} refused")
        refused = next(r for r in rs if r.status_code == 429)
        print("  a refusal says:")
        for name in ("retry-after", "ratelimit-policy", "ratelimit"):
            print(f"    {name}: {refused.headers[name]}")

        print("203.0.113.1 now asks 50 times a second for 3 s (its burst is spent):")
        admitted, start = 0, time.monotonic()
        for second in range(1, 4):
            got = 0
            while time.monotonic() < start + second:
                r = await http.get("/items", headers=as_client("203.0.113.1"))
                got += r.status_code == 200
                await asyncio.sleep(0.02)
            admitted += got
            print(f"  second {second}: {got} admitted")
        took = time.monotonic() - start
        print(f"  achieved rate: {admitted / took:.1f}/s   (configured: 10/s per client)")

        codes = [(await http.post("/login", headers=as_client("203.0.113.9"))).status_code
                 for _ in range(5)]
        print(f"/login, 5 attempts by 203.0.113.9: {codes} (3 per minute)")


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            proxy_headers=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    print(f"FastAPI on uvicorn at http://127.0.0.1:{port}, limited by paceline.asgi")
    try:
        asyncio.run(play(f"http://127.0.0.1:{port}"))
    finally:
        server.should_exit = True
        thread.join()


if __name__ == "__main__":
    main()
