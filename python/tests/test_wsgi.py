"""``paceline.wsgi.RateLimitMiddleware`` called as a WSGI server calls it: the ASGI
limits, keys, costs, refusals and hook for PEP 3333 apps; storage URIs."""

import io
import logging
import os
import time

import pytest

from paceline.wsgi import KeySource, Limit, RateLimitMiddleware

HOUR = 3600.0


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def call(middleware, key=None, method="GET", address="192.0.2.1", **extra):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": "/", "wsgi.input": io.BytesIO(),
               "wsgi.multiprocess": False, **extra}
    if address is not None:
        environ["REMOTE_ADDR"] = address
    if key is not None:
        environ["HTTP_X_API_KEY"] = key
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)

    body = b"".join(middleware(environ, start_response))
    return int(seen["status"].split()[0]), seen["headers"], body


def test_limits_keys_costs_and_the_refusal():
    by_key = RateLimitMiddleware(app, [Limit("k", 3, per=HOUR, key=KeySource.header("x-api-key"),
                                             cost=lambda environ: int(environ.get("HTTP_X_COST", "1")))])
    assert [call(by_key, "a")[0] for _ in range(4)] == [200, 200, 200, 429]
    status, headers, body = call(by_key, "a")
    assert status == 429 and int(headers["retry-after"]) > 1000 and b'limit "k"' in body
    assert call(by_key, "b", HTTP_X_COST="3")[0] == 200 and call(by_key, "b")[0] == 429
    assert call(by_key, "\xe9")[0] == 200  # a header the server wrote as latin-1 text
    assert call(by_key, "a", method="OPTIONS")[0] == 200


def test_the_refusal_hook_gets_the_environ_and_keeps_the_fields():
    def custom(environ, info):
        def response(environ, start_response):
            start_response("429 Too Many Requests", [("Content-Type", "application/json")])
            return [b'{"retry_after": %d}' % info.retry_after]

        return response

    middleware = RateLimitMiddleware(app, [Limit("one", 1, per=HOUR)], on_refusal=custom)
    call(middleware)
    status, headers, body = call(middleware)
    assert status == 429 and body.startswith(b'{"retry_after": ')
    assert "ratelimit" in {name.lower() for name in headers} and "retry-after" in headers


def test_wait_mode_blocks_the_thread_for_its_turn():
    middleware = RateLimitMiddleware(app, [Limit("slow", 1, per=0.5, burst=1)], wait_up_to=2.0)
    assert call(middleware)[0] == 200
    started = time.monotonic()
    assert call(middleware)[0] == 200
    assert 0.4 < time.monotonic() - started < 1.5


def test_a_server_without_addresses_is_told_in_wsgis_words(caplog):
    middleware = RateLimitMiddleware(app, [Limit("ip", 1, per=HOUR)])
    status, _, body = call(middleware, address=None)
    assert status == 500 and b"REMOTE_ADDR" in body


def test_behind_proxies_under_wsgi_is_not_taken_for_a_rewriting_server(caplog):
    proxied = RateLimitMiddleware(app, [Limit("p", 5, per=HOUR, key=KeySource.behind_proxies(["127.0.0.1/32"]))])
    with caplog.at_level(logging.ERROR, logger="paceline.asgi"):
        call(proxied, address="127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert not [r for r in caplog.records if "proxy headers" in r.getMessage()]


def test_a_file_storage_takes_a_capacity(tmp_path):
    small = Limit("small", 1, per=HOUR, storage_uri=f"file://{tmp_path}/app?capacity=64")
    large = Limit("large", 1, per=HOUR, storage_uri=f"file://{tmp_path}/app")
    assert os.path.getsize(small.shared) < os.path.getsize(large.shared)
    with pytest.raises(ValueError, match="capacity"):
        Limit("bad", 1, per=HOUR, storage_uri=f"file://{tmp_path}/app?size=1")
