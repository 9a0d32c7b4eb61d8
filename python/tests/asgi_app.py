"""The FastAPI app that test_asgi.py serves with a real uvicorn (one or several workers).

Its limits come from the environment (PACELINE_ASGI_TEST, JSON), so every worker process
that uvicorn starts builds the same middleware:

    {"limits": [{"name": ..., "rate": ..., "per": ..., "burst": ...,
                 "key": ["proxies", ["127.0.0.1/32"]] | ["peer"] | ["header", name]
                        | ["global"] | ["tenant"],
                 "shared": path or null}],
     "headers_on_success": bool, "wait_up_to": seconds or null, "json_refusal": bool}

Routes: `/pid` (exempt: the tests' readiness probe), `/` (limited by the middleware
only), `/upload` (echoes its body's length), `/login` (a RouteLimit dependency on top, 2
per hour per client), `/decorated` (a RouteLimit decorator on a FastAPI endpoint, 2 per
hour per client) and `/plain` (the same on a plain Starlette endpoint).
"""

import json
import os

from fastapi import Depends, FastAPI, Request
from starlette.responses import JSONResponse, PlainTextResponse

from paceline.asgi import KeySource, Limit, RateLimitMiddleware, RouteLimit

config = json.loads(os.environ["PACELINE_ASGI_TEST"])


def source(spec):
    kind = spec[0]
    if kind == "proxies":
        return KeySource.behind_proxies(spec[1])
    if kind == "peer":
        return KeySource.peer_ip()
    if kind == "header":
        return KeySource.header(spec[1])
    if kind == "global":
        return KeySource.global_()
    if kind == "tenant":
        return lambda scope: dict(scope["headers"]).get(b"x-tenant", b"").decode() or None
    raise ValueError(kind)


limits = [
    Limit(
        spec["name"],
        rate=spec["rate"],
        per=spec["per"],
        burst=spec.get("burst"),
        key=source(spec["key"]),
        shared=spec.get("shared"),
    )
    for spec in config["limits"]
]


def json_refusal(scope, info):
    return JSONResponse(
        {"error": "rate limited", "limit": info.limit, "retry_after": info.retry_after},
        status_code=info.status,
    )


app = FastAPI()
app.add_middleware(
    RateLimitMiddleware,
    limits=limits,
    headers_on_success=config.get("headers_on_success", False),
    wait_up_to=config.get("wait_up_to"),
    on_refusal=json_refusal if config.get("json_refusal") else None,
    # The tests' readiness probe is not counted; CORS preflights neither (the default
    # that an exempt function replaces).
    exempt=lambda scope: scope["method"] == "OPTIONS" or scope["path"] == "/pid",
)

route_key = KeySource.behind_proxies(["127.0.0.1/32"])
login_limit = RouteLimit(Limit("login", rate=2, per=3600.0, key=route_key))
decorated_limit = RouteLimit(
    Limit("decorated", rate=2, per=3600.0, key=route_key), headers_on_success=True
)


@app.get("/")
async def home():
    return PlainTextResponse("ok")


@app.post("/upload")
async def upload(request: Request):
    body = await request.body()
    return PlainTextResponse(str(len(body)))


@app.post("/login", dependencies=[Depends(login_limit)])
async def login():
    return PlainTextResponse("welcome")


@app.get("/decorated")
@decorated_limit.limit
async def decorated(request: Request):
    return PlainTextResponse("decorated")


plain_limit = RouteLimit(Limit("plain", rate=2, per=3600.0, key=route_key), headers_on_success=True)


@plain_limit.limit
async def plain(request):
    # A Starlette endpoint (no FastAPI parameters), routed as Starlette routes are.
    return PlainTextResponse("plain")


app.add_route("/plain", plain)


@app.get("/pid")
async def pid():
    return PlainTextResponse(str(os.getpid()))
