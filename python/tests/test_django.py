"""``paceline.django``: the middleware from settings, the ``ratelimit`` decorator on sync
and async views, and DRF's throttles, through Django's ``Client`` / ``AsyncClient`` and
DRF's ``APIClient``, and under a real ``gunicorn -w 4`` on loopback, where a shared
file is one bound for every worker."""

import asyncio
import http.client
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("django")
pytest.importorskip("rest_framework")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")

import django  # noqa: E402

django.setup()

from django.test import AsyncClient, Client  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

import paceline.django.rest  # noqa: E402
from test_flask import _flood, gunicorn  # noqa: E402,F401 - the fixture, shared


@pytest.fixture(autouse=True)
def fresh():
    from django_site import urls

    for view in (urls.login, urls.soft, urls.async_view):
        view.paceline_checker().reset()
    paceline.django.rest.reset()
    time.sleep(0.05)  # the site's 20/second refills between tests
    yield


def test_the_decorator_on_sync_views_with_django_ratelimits_arguments():
    client = Client()
    logins = [client.post("/login", HTTP_X_API_KEY="a").status_code for _ in range(4)]
    assert logins == [200, 200, 200, 429]
    refused = client.post("/login", HTTP_X_API_KEY="a")
    assert int(refused["Retry-After"]) > 1000 and "RateLimit" in refused
    assert client.post("/login", HTTP_X_API_KEY="b").status_code == 200  # its own key
    assert client.get("/login").status_code == 200  # GET is not counted (method="POST")
    # block=False: the view runs, told.
    assert [client.get("/soft").content for _ in range(3)] == [b"fine", b"fine", b"limited"]


def test_the_decorator_on_async_views():
    async def go():
        client = AsyncClient()
        return [(await client.get("/async?user=u")).status_code for _ in range(3)]

    assert asyncio.run(go()) == [200, 200, 429]


def test_drf_throttles_keep_drfs_shape_and_an_exact_wait():
    client = APIClient()
    statuses = [client.get("/api/things").status_code for _ in range(11)]
    assert statuses == [200] * 10 + [429]
    refused = client.get("/api/things")
    assert refused.status_code == 429 and refused.json()["detail"].startswith("Request was throttled")
    assert 355 <= int(refused["Retry-After"]) <= 360  # 10/hour: the next cell in 360 s
    assert [client.post("/api/uploads").status_code for _ in range(3)] == [200, 200, 429]


def test_a_bad_setting_fails_when_django_starts():
    for storage, expected in (("mongodb://x", "unknown scheme"), ("memory://", None)):
        code = "import django; django.setup()"
        env = dict(os.environ, PACELINE_TEST_STORAGE=storage, PYTHONPATH=HERE)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=HERE)
        if expected is None:
            assert out.returncode == 0, out.stderr
        else:
            assert out.returncode != 0 and "ImproperlyConfigured" in out.stderr and expected in out.stderr


# Under a real gunicorn with 4 sync workers.


def test_four_workers_hold_the_sites_limit_and_drfs_throttle_as_one(gunicorn, tmp_path):
    command = [sys.executable, "-m", "gunicorn", "-w", "4", "-b", "127.0.0.1:{port}",
               "--graceful-timeout", "2", "django_site.wsgi"]
    port, _ = gunicorn(f"file://{tmp_path}/site", server=command)
    admitted, statuses, elapsed = _flood(port, "/", 2.0)
    assert admitted <= 20 + 20 * elapsed + 2, (admitted, elapsed)
    assert admitted >= 20 + 20 * (elapsed - 0.5) * 0.5, (admitted, elapsed)
    time.sleep(1.1)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    ok = 0
    for _ in range(20):  # under the site's limit, anon 10/hour: exactly 10, whichever worker
        conn.request("GET", "/api/things")
        response = conn.getresponse()
        response.read()
        ok += response.status == 200
        time.sleep(0.06)
    assert ok == 10


def too_many(request, info):
    from django.http import JsonResponse

    return JsonResponse({"error": "slow down", "limit": info.limit, "retry_after": info.retry_after}, status=429)


def test_a_refusal_hook_replaces_the_429_and_keeps_its_fields():
    from django.test import override_settings

    with override_settings(PACELINE_ON_REFUSAL="test_django.too_many"):
        client = Client()
        statuses = [client.post("/login", HTTP_X_API_KEY="hook").status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        refused = client.post("/login", HTTP_X_API_KEY="hook")
        assert refused.json()["error"] == "slow down" and refused.json()["retry_after"] > 1000
        assert "Retry-After" in refused and "RateLimit" in refused


# What an attack on the above found.


def test_a_class_based_view_and_a_group_keep_one_count():
    from django.test import RequestFactory
    from django.utils.decorators import method_decorator
    from django.views import View

    from paceline.django import ratelimit

    class Page(View):
        @method_decorator(ratelimit(key="ip", rate="2/h"))
        def get(self, request):
            from django.http import HttpResponse

            return HttpResponse("page")

    view = Page.as_view()
    factory = RequestFactory()
    assert [view(factory.get("/", REMOTE_ADDR="192.0.2.9")).status_code for _ in range(3)] == [200, 200, 429]

    @ratelimit(group="auth", key="ip", rate="2/h")
    def login(request):
        from django.http import HttpResponse

        return HttpResponse("login")

    @ratelimit(group="auth", key="ip", rate="2/h")
    def reset_password(request):
        from django.http import HttpResponse

        return HttpResponse("reset")

    request = factory.get("/", REMOTE_ADDR="192.0.2.10")
    assert [login(request).status_code, reset_password(request).status_code,
            login(request).status_code] == [200, 200, 429]


def test_the_decorators_keys_leave_no_way_around():
    from django.http import HttpResponse
    from django.test import RequestFactory

    from paceline.django import ratelimit

    factory = RequestFactory()

    @ratelimit(key="ip", rate="2/h")
    def by_ip(request):
        return HttpResponse("ok")

    # One IPv6 client rotating addresses inside its /64.
    rotating = [by_ip(factory.get("/", REMOTE_ADDR=f"2001:db8::{i:x}")).status_code for i in range(1, 5)]
    assert rotating == [200, 200, 429, 429]

    @ratelimit(key="header:x-api-key", rate="2/h")
    def by_header(request):
        return HttpResponse("ok")

    assert [by_header(factory.get("/")).status_code for _ in range(3)] == [200, 200, 429]

    @ratelimit(key="user", rate="2/h")
    def by_user(request):
        return HttpResponse("ok")

    from django.contrib.auth.models import AnonymousUser

    anonymous = factory.get("/")
    anonymous.user = AnonymousUser()
    assert [by_user(anonymous).status_code for _ in range(3)] == [200, 200, 429]


def test_an_async_view_keyed_by_user_reads_it_off_the_loop():
    from django.http import HttpResponse
    from django.test import RequestFactory

    from paceline.django import ratelimit

    class User:
        is_authenticated = True
        pk = 7

    @ratelimit(key="user", rate="1/h")
    async def view(request):
        return HttpResponse("ok")

    async def go():
        request = RequestFactory().get("/")
        request.user = User()
        return [(await view(request)).status_code for _ in range(2)]

    assert asyncio.run(go()) == [200, 429]


def test_drf_custom_throttles_as_drfs_docs_write_them_and_no_way_around_by_forwarded_for():
    from rest_framework.response import Response
    from rest_framework.test import APIRequestFactory
    from rest_framework.views import APIView

    from paceline.django.rest import AnonRateThrottle, SimpleRateThrottle

    class Burst(SimpleRateThrottle):
        scope = "uploads"

        def get_cache_key(self, request, view):
            return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    class Custom(APIView):
        throttle_classes = [Burst]

        def get(self, request):
            return Response({})

    class Anon(APIView):
        throttle_classes = [AnonRateThrottle]

        def get(self, request):
            return Response({})

    factory = APIRequestFactory()
    custom = Custom.as_view()
    assert [custom(factory.get("/", REMOTE_ADDR="192.0.2.20")).status_code for _ in range(3)] == [200, 200, 429]
    anon = Anon.as_view()
    spoofed = [
        anon(factory.get("/", REMOTE_ADDR="192.0.2.21", HTTP_X_FORWARDED_FOR=f"198.51.100.{i}")).status_code
        for i in range(12)
    ]
    assert spoofed == [200] * 10 + [429] * 2
