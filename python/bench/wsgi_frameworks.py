"""paceline.flask against flask-limiter and paceline.django against django-ratelimit, side
by side in one run: the time each adds to an admitted request, and how many requests
each admits under `gunicorn -w 4`.

    pip install ./python flask flask-limiter django django-ratelimit djangorestframework gunicorn
    python3 python/bench/wsgi_frameworks.py

1. Added time per admitted request, in this process: Flask through its test client
   (`/` on a bare app, the same app under flask-limiter's `memory://`, under
   paceline.flask's `memory://`), Django through a view called with a `RequestFactory`
   request (bare, `django_ratelimit.decorators.ratelimit`, `paceline.django.ratelimit`).
   Every request is admitted (a limit of a million per second, 1 000 client addresses).
   Rounds interleave the stacks; medians over ROUNDS rounds. The goal: paceline adds at
   most 0.15 of what its peer adds.
2. Under `gunicorn -w 4` (sync workers), "20 per second" for one client, 8 threads for
   2 s: paceline.flask with `file:///dev/shm/...` beside flask-limiter's default
   `memory://`, and paceline's DRF `AnonRateThrottle` beside DRF's own on Django's
   default cache (allowed: 20 + 20 x elapsed).
"""

import gc
import os
import statistics
import sys
import tempfile
import time

ROUNDS = int(os.environ.get("ROUNDS", 15))
REQUESTS = 2_000
CLIENTS = 1_000
HERE = os.path.dirname(os.path.abspath(__file__))


def flask_apps():
    from flask import Flask

    apps = {}
    for kind in ("bare", "hook", "flask-limiter", "paceline"):
        app = Flask(f"bench-{kind}")
        if kind == "hook":
            # The floor of any limiter that works as a Flask extension: a before_request
            # hook that does nothing.
            app.before_request(lambda: None)
        elif kind == "flask-limiter":
            from flask_limiter import Limiter
            from flask_limiter.util import get_remote_address

            Limiter(get_remote_address, app=app, default_limits=["1000000 per second"], storage_uri="memory://")
        elif kind == "paceline":
            from paceline.flask import Limiter

            Limiter(app=app, default_limits=["1000000 per second"], storage_uri="memory://")

        @app.route("/")
        def home():
            return "ok"

        apps[kind] = app.test_client()
    return apps


def flask_round(client):
    gc.collect()
    gc.disable()  # a collection lands in whichever round it falls: none in any
    try:
        return _flask_round(client)
    finally:
        gc.enable()


def _flask_round(client):
    start = time.perf_counter()
    for i in range(REQUESTS):
        response = client.get("/", environ_base={"REMOTE_ADDR": f"10.0.{i % CLIENTS // 250}.{i % 250}"})
        assert response.status_code == 200
    return (time.perf_counter() - start) / REQUESTS * 1e6


def django_views():
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="bench",
            ALLOWED_HOSTS=["*"],
            CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            PACELINE_STORAGE_URI="memory://",
            SILENCED_SYSTEM_CHECKS=["django_ratelimit.E003", "django_ratelimit.W001"],
        )
        django.setup()
    from django.http import HttpResponse
    from django.test import RequestFactory
    from django_ratelimit.decorators import ratelimit as theirs

    from paceline.django import ratelimit as ours

    def view(request):
        return HttpResponse("ok")

    views = {
        "bare": view,
        "django-ratelimit": theirs(key="ip", rate="1000000/s")(view),
        "paceline": ours(key="ip", rate="1000000/s")(view),
    }
    factory = RequestFactory()
    requests = [factory.get("/", REMOTE_ADDR=f"10.0.{i // 250}.{i % 250}") for i in range(CLIENTS)]
    return views, requests


def django_round(view, requests):
    gc.collect()
    gc.disable()
    try:
        return _django_round(view, requests)
    finally:
        gc.enable()


def _django_round(view, requests):
    start = time.perf_counter()
    for i in range(REQUESTS):
        response = view(requests[i % CLIENTS])
        assert response.status_code == 200
    return (time.perf_counter() - start) / REQUESTS * 1e6


def added(label, rounds, peer):
    """Each stack's added time: the median over rounds of its time less the bare app's in
    the same round (paired, so a busy stretch of the machine cancels out)."""
    bare = statistics.median(rounds["bare"])
    print(f"  {label}: bare {bare:.1f} µs a request")
    extra = {}
    for kind in [k for k in rounds if k != "bare"]:
        diffs = sorted(a - b for a, b in zip(rounds[kind], rounds["bare"]))
        extra[kind] = statistics.median(diffs)
        print(f"    {kind:17s} +{extra[kind]:6.1f} µs (middle half of the rounds: "
              f"{diffs[len(diffs) // 4]:.1f} to {diffs[(3 * len(diffs)) // 4]:.1f})")
    print(f"    paceline adds {extra['paceline'] / extra[peer]:.3f} of what {peer} adds (goal: at most 0.15)")
    if "hook" in extra:
        print(f"    beyond the floor (a hook that does nothing): paceline {extra['paceline'] - extra['hook']:.1f} µs, "
              f"{peer} {extra[peer] - extra['hook']:.1f} µs "
              f"({(extra['paceline'] - extra['hook']) / (extra[peer] - extra['hook']):.3f})")


def cost():
    print(f"1. Added time per admitted request ({REQUESTS} requests a round, {ROUNDS} rounds, medians)")
    apps = flask_apps()
    views, requests = django_views()
    flask_rounds = {kind: [] for kind in apps}
    django_rounds = {kind: [] for kind in views}
    for kind in apps:  # warm up
        flask_round(apps[kind])
    for kind in views:
        django_round(views[kind], requests)
    for _ in range(ROUNDS):
        for kind in apps:
            flask_rounds[kind].append(flask_round(apps[kind]))
        for kind in views:
            django_rounds[kind].append(django_round(views[kind], requests))
    added("Flask (test client)", flask_rounds, "flask-limiter")
    added("Django (RequestFactory, a view)", django_rounds, "django-ratelimit")


#: A Django project of one DRF view, throttled by DRF's own AnonRateThrottle or
#: paceline's (``KIND``), kept where ``STORAGE`` says (paceline's).
DRF_SITE = """
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "drf_site")
SECRET_KEY = "bench"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "drf_site"
DATABASES = {}
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"]
PACELINE_STORAGE_URI = os.environ["STORAGE"]
THROTTLE = "paceline.django.rest" if os.environ["KIND"] == "paceline" else "rest_framework.throttling"
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_THROTTLE_CLASSES": [THROTTLE + ".AnonRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": "20/second"},
}

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.views import APIView  # noqa: E402


class Things(APIView):
    def get(self, request):
        return Response({})


urlpatterns = [path("", Things.as_view())]
application = get_wsgi_application()
"""


def workers():
    import signal
    import subprocess

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from test_flask import _flood, _free_port

    print("\n2. gunicorn -w 4, '20 per second', one client, 8 threads for 2 s")
    app_file = os.path.join(tempfile.mkdtemp(), "limiter_app.py")
    with open(app_file, "w") as f:
        f.write(
            "import os\nfrom flask import Flask\napp = Flask(__name__)\n"
            "if os.environ['KIND'] == 'paceline':\n"
            "    from paceline.flask import Limiter\n"
            "    Limiter(app=app, default_limits=['20 per second'], storage_uri=os.environ['STORAGE'])\n"
            "else:\n"
            "    from flask_limiter import Limiter\n"
            "    from flask_limiter.util import get_remote_address\n"
            "    Limiter(get_remote_address, app=app, default_limits=['20 per second'])\n"
            "@app.route('/')\ndef home():\n    return 'ok'\n"
        )
    shm = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)

    def flood(label, kind, target, storage):
        """`target` under gunicorn -w 4 with KIND=`kind`, flooded; prints what it admits."""
        port = _free_port()
        env = dict(os.environ, KIND=kind, STORAGE=f"file://{shm}/{storage}")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-w", "4", "-b", f"127.0.0.1:{port}", target],
            cwd=os.path.dirname(app_file), env=env, stderr=subprocess.DEVNULL,
        )
        time.sleep(3)
        admitted, _, elapsed = _flood(port, "/", 2.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        print(f"  {label:13s} admitted {admitted:4d} in {elapsed:.2f} s (allowed {20 + 20 * elapsed:.0f})")

    flood("paceline", "paceline", "limiter_app:app", "bench")
    flood("flask-limiter", "flask-limiter", "limiter_app:app", "bench")
    # DRF's AnonRateThrottle, its own (Django's default LocMemCache) and paceline's.
    with open(os.path.join(os.path.dirname(app_file), "drf_site.py"), "w") as f:
        f.write(DRF_SITE)
    flood("paceline DRF", "paceline", "drf_site", "drf")
    flood("DRF's own", "drf", "drf_site", "drf")

if __name__ == "__main__":
    cost()
    workers()
