"""A fake upstream API for the tests that follow an upstream (test_upstream*.py), served
by uvicorn on loopback. It enforces its own limit and says so the way it is told to.

Every request is logged (its arrival time, status and the Retry-After it got). The
behaviour is set through `POST /config` with a JSON body (anything left out keeps its
value):

    {"rate": 50, "burst": 10,          # a GCRA limit (paceline.Limiter), or
     "window": null,                   # seconds: a fixed window of `rate` per window
     "fields": "ietf" | "retry-after" | "x" | "bare",
     "policy": null,                   # a RateLimit-Policy value to send instead of ours
     "extra": [],                      # [name, value] pairs added to every response
     "refusal_extra": [],              # [name, value] pairs added to every refusal
     "date_skew": null,                # seconds: send `Date` this far off, and a
                                       # Retry-After as an HTTP-date on that clock
     "refuse_all": null}               # seconds: refuse everything with this Retry-After

`GET /log` returns the log as JSON lines and clears it.
"""

import email.utils
import json
import math
import time

import paceline

from asgi_calls import body_of

state = {}


def configure(**changes):
    state.update(changes)
    if "rate" in changes or "burst" in changes or "window" in changes:
        state["limiter"] = paceline.Limiter(state["rate"], per=1.0, burst=state["burst"])
        state["window_start"] = None
        state["window_count"] = 0


configure(
    rate=50,
    burst=10,
    window=None,
    fields="ietf",
    policy=None,
    extra=[],
    refusal_extra=[],
    date_skew=None,
    refuse_all=None,
)
log = []


def decide(now):
    """(admitted, remaining, seconds until more, seconds until the quota is whole)."""
    if state["window"]:
        window = state["window"]
        start = math.floor(now / window) * window
        if state["window_start"] != start:
            state["window_start"], state["window_count"] = start, 0
        end = start + window - now
        if state["window_count"] < state["rate"]:
            state["window_count"] += 1
            return True, state["rate"] - state["window_count"], end, end
        return False, 0, end, end
    limiter = state["limiter"]
    admitted = limiter.try_acquire()
    return admitted, limiter.remaining(), limiter.wait_time(), limiter.wait_time(state["burst"])


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/config":
        body = await body_of(receive)
        configure(**json.loads(body))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/log":
        text = "".join(json.dumps(row) + "\n" for row in log).encode()
        log.clear()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": text})
        return
    now = time.time()
    if state["refuse_all"] is not None:
        admitted, remaining, wait, full = False, 0, state["refuse_all"], state["refuse_all"]
    else:
        admitted, remaining, wait, full = decide(now)
    headers = [(n.encode(), v.encode()) for n, v in state["extra"]]
    retry_after = None
    fields = state["fields"]
    if not admitted:
        retry_after = max(1, math.ceil(wait))
        headers += [(n.encode(), v.encode()) for n, v in state["refusal_extra"]]
        if fields in ("ietf", "retry-after"):
            if state["date_skew"] is not None:
                server_now = now + state["date_skew"]
                value = email.utils.formatdate(server_now + retry_after, usegmt=True)
            else:
                value = str(retry_after)
            headers.append((b"retry-after", value.encode()))
    if state["date_skew"] is not None:
        date = email.utils.formatdate(now + state["date_skew"], usegmt=True)
        headers.append((b"date", date.encode()))
    if fields == "ietf":
        window = state["window"] or 1
        policy = state["policy"] or f'"default";q={state["rate"]};w={window}'
        headers.append((b"ratelimit-policy", policy.encode()))
        reset = max(1, math.ceil(wait if remaining == 0 else full))
        headers.append((b"ratelimit", f'"default";r={remaining};t={reset}'.encode()))
    elif fields == "x":
        reset = max(1, math.ceil(wait if remaining == 0 else full))
        headers.append((b"x-ratelimit-limit", str(state["rate"]).encode()))
        headers.append((b"x-ratelimit-remaining", str(remaining).encode()))
        headers.append((b"x-ratelimit-reset", str(reset).encode()))
    status = 200 if admitted else 429
    log.append([time.monotonic(), status, retry_after])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})
