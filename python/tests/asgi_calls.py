"""Requests through an ASGI app in the tests' own process, and an app that answers them."""

import asyncio


async def ok(scope, receive, send):
    """An app that answers 200 ``ok``."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def sent_by(app, method="GET", path="/", headers=(), client=("192.0.2.1", 1234), raw=()):
    """The messages ``app`` sends for one request with an empty body: ``headers`` pairs
    of ``str``, then ``raw`` pairs of ``bytes``."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "client": client,
             "headers": [(k.encode(), v.encode()) for k, v in headers] + list(raw)}
    await app(scope, receive, send)
    return sent


async def call(app, **request):
    """One request through ``app`` (``sent_by``'s arguments): ``(status, headers dict)``."""
    start = (await sent_by(app, **request))[0]
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


def statuses(app, n, **request):
    """The statuses of ``n`` requests in a row, on an event loop of their own."""
    async def run():
        return [(await call(app, **request))[0] for _ in range(n)]

    return asyncio.run(run())


async def body_of(receive):
    """A request's whole body, as an app reads it from ``receive``."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
