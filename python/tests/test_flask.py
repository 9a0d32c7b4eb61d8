"""``paceline.flask.Limiter``: flask-limiter's constructor and decorators on paceline's
decision, through Flask's own test client and under a real ``gunicorn -w 4`` on
loopback, where a limit kept in a shared file is one bound for every worker."""

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

flask = pytest.importorskip("flask")

from paceline.flask import Limiter  # noqa: E402

from ports import listening  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def app_module(tmp_path, monkeypatch):
    monkeypatch.setenv("PACELINE_TEST_STORAGE", f"file://{tmp_path}/flask")
    sys.modules.pop("flask_app", None)
    monkeypatch.syspath_prepend(HERE)
    import flask_app

    yield flask_app
    sys.modules.pop("flask_app", None)


def test_the_test_client_works_with_flask_limiters_decorators(app_module):
    client = app_module.app.test_client()
    # Default limits: each route counted apart, 20 at once.
    assert [client.get("/").status_code for _ in range(21)] == [200] * 20 + [429]
    refused = client.get("/")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert '"default 20 per second"' in refused.headers["RateLimit-Policy"]
    assert b"Too Many Requests" in refused.data
    # A route's own limit, keyed by its own key_func.
    logins = [client.post("/login", data={"user": "ann"}).status_code for _ in range(4)]
    assert logins == [200, 200, 200, 429]
    assert client.post("/login", data={"user": "bob"}).status_code == 200
    # A cost function: 2 pages cost 2 of 5.
    assert [client.get("/search?pages=2").status_code for _ in range(3)] == [200, 200, 429]
    # Exempt view and blueprint; the fields on admitted responses.
    assert {client.get("/health").status_code for _ in range(30)} == {200}
    assert {client.get("/admin/stats").status_code for _ in range(30)} == {200}
    time.sleep(0.06)
    ok = client.get("/")
    assert ok.status_code == 200 and "RateLimit" in ok.headers


def test_a_reset_lets_a_suite_pass_twice(app_module):
    for _ in range(2):
        app_module.limiter.reset()
        client = app_module.app.test_client()
        logins = [client.post("/login", data={"user": "ann"}).status_code for _ in range(4)]
        assert logins == [200, 200, 200, 429]


def test_on_breach_replaces_the_refusal_and_keeps_its_fields():
    app = flask.Flask("breach")
    seen = []

    def breach(info):
        seen.append(info)
        return flask.jsonify(error="slow down", limit=info.limit), 429

    limiter = Limiter(app=app, default_limits=["1 per hour"], on_breach=breach)

    @app.route("/")
    def home():
        return "ok"

    client = app.test_client()
    assert client.get("/").status_code == 200
    refused = client.get("/")
    assert refused.status_code == 429 and refused.json["error"] == "slow down"
    assert int(refused.headers["Retry-After"]) > 3000 and "RateLimit" in refused.headers
    assert seen and seen[0].retry_after == int(refused.headers["Retry-After"])
    del limiter


def test_mistakes_raise_where_they_are_written(tmp_path):
    with pytest.raises(ValueError, match="fortnight"):
        Limiter(default_limits=["10 per fortnight"])
    limiter = Limiter()
    with pytest.raises(ValueError, match="fortnight"):
        limiter.limit("10 per fortnight")
    with pytest.raises(ValueError, match="unknown scheme 'mongodb'.*memory://"):
        Limiter(storage_uri="mongodb://localhost")
    with pytest.raises(ValueError, match="does not exist"):
        Limiter(storage_uri=f"file://{tmp_path}/no/such/dir/app")
    # An unreachable Redis is no mistake at import: the failure policy answers later.
    Limiter(storage_uri="redis://127.0.0.1:9/0")


# Under a real gunicorn with 4 sync workers.


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gunicorn(tmp_path):
    if subprocess.run([sys.executable, "-m", "gunicorn", "--version"], capture_output=True).returncode:
        pytest.skip("gunicorn is not installed")
    servers = []

    def start(storage, workers=4, server=None):
        port = _free_port()
        log = open(tmp_path / f"gunicorn-{port}.log", "w+")
        env = dict(os.environ, PACELINE_TEST_STORAGE=storage, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        command = server or [sys.executable, "-m", "gunicorn", "-w", str(workers)]
        if server is None:
            command += ["-b", f"127.0.0.1:{port}", "--graceful-timeout", "2", "flask_app:app"]
        else:
            command = [part.replace("{port}", str(port)) for part in command]
        proc = subprocess.Popen(command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT)
        servers.append(proc)
        if not listening(port, 30, 0.1):
            raise AssertionError("gunicorn did not start: " + open(log.name).read())
        time.sleep(0.5)  # every worker booted
        return port, log.name

    yield start
    for proc in servers:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _flood(port, path, seconds, threads=8, headers=None):
    """Requests from `threads` threads for `seconds`: (admitted, statuses seen, elapsed)."""
    admitted = []
    statuses = set()
    stop = time.monotonic() + seconds

    def run():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        count = 0
        while time.monotonic() < stop:
            try:
                conn.request("GET", path, headers=headers or {})
                response = conn.getresponse()
                response.read()
            except (ConnectionError, http.client.HTTPException):
                # A server that closes after each response (uWSGI's http-socket).
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                continue
            statuses.add(response.status)
            count += response.status == 200
            if response.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        admitted.append(count)

    start = time.monotonic()
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(admitted), statuses, time.monotonic() - start


def test_four_gunicorn_workers_hold_one_bound_through_a_shared_file(gunicorn, tmp_path):
    port, _ = gunicorn(f"file://{tmp_path}/one")
    admitted, statuses, elapsed = _flood(port, "/", 2.0)
    # "20 per second": at most 20 at once plus 20 a second, for all 4 workers together.
    assert admitted <= 20 + 20 * elapsed + 2, (admitted, elapsed)
    assert admitted >= 20 + 20 * (elapsed - 0.5) * 0.5, (admitted, elapsed)
    assert statuses == {200, 429}


def test_a_forwarded_for_rotated_by_the_client_gets_no_new_bucket(gunicorn, tmp_path):
    port, _ = gunicorn(f"file://{tmp_path}/xff")
    admitted = 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for i in range(40):
        conn.request("GET", "/", headers={"X-Forwarded-For": f"198.51.100.{i}"})
        response = conn.getresponse()
        response.read()
        admitted += response.status == 200
    assert admitted <= 20 + 20 * 2, admitted  # one client: the peer, not the header


def test_limits_kept_in_memory_under_several_workers_say_so(gunicorn):
    port, log = gunicorn("memory://", workers=2)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(4):
        conn.request("GET", "/")
        conn.getresponse().read()
    time.sleep(0.3)
    assert "kept in this worker process's memory" in open(log).read()


def test_a_limit_in_redis_under_two_workers_and_redis_going_away(gunicorn):
    from redis_servers import Server, have, server_binary

    if not have(server_binary()):
        pytest.skip(f"{server_binary()} is not installed")
    server = Server()
    try:
        port, log = gunicorn(server.url, workers=2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

        def login(user):
            conn.request("POST", "/login", body=f"user={user}",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
            response = conn.getresponse()
            response.read()
            return response.status

        # "3 per hour" per user, one count for both workers (kept in Redis).
        assert sorted(login("ann") for _ in range(6)) == [200] * 3 + [429] * 3
        server.stop()
        started = time.monotonic()
        statuses = {login("bob") for _ in range(3)}
        assert statuses == {503}, (statuses, open(log).read()[-2000:])
        assert time.monotonic() - started < 3 * 1.0
    finally:
        server.stop()


@pytest.mark.parametrize("server", ["gthread", "waitress", "uwsgi"])
def test_threaded_servers_hold_the_bound(gunicorn, tmp_path, server):
    if server == "gthread":
        command = [sys.executable, "-m", "gunicorn", "-k", "gthread", "--threads", "4", "-w", "2",
                   "-b", "127.0.0.1:{port}", "--graceful-timeout", "2", "flask_app:app"]
    elif server == "uwsgi":
        uwsgi = os.path.join(os.path.dirname(sys.executable), "uwsgi")
        if not os.path.exists(uwsgi):
            pytest.skip("uWSGI is not installed")
        # 3 processes of 2 threads each, forked after the app is imported.
        command = [uwsgi, "--http-socket", "127.0.0.1:{port}", "--module", "flask_app:app",
                   "--master", "--processes", "3", "--threads", "2", "--die-on-term",
                   "--disable-logging"]
    else:
        pytest.importorskip("waitress")
        command = [sys.executable, "-m", "waitress", "--listen=127.0.0.1:{port}", "--threads=4",
                   "flask_app:app"]
    port, _ = gunicorn(f"file://{tmp_path}/{server}", server=command)
    admitted, statuses, elapsed = _flood(port, "/", 2.0)
    assert admitted <= 20 + 20 * elapsed + 2, (admitted, elapsed)
    assert admitted >= 20 + 20 * (elapsed - 0.5) * 0.5, (admitted, elapsed)


# What an attack on the above found.


def _statuses(client, path, n, **kw):
    return [client.get(path, **kw).status_code for _ in range(n)]


def test_one_limiter_serves_two_apps_and_reads_flask_limiters_settings():
    limiter = Limiter()
    apps = []
    for name in ("api", "admin"):
        app = flask.Flask(name)
        app.config["RATELIMIT_DEFAULT"] = "2 per minute"

        @app.route("/items")
        def items():
            return "items"

        limiter.init_app(app)
        apps.append(app.test_client())
    for client in apps:
        assert _statuses(client, "/items", 3) == [200, 200, 429]


def test_limits_and_exemptions_of_nested_and_renamed_blueprints_apply():
    app = flask.Flask("nested")
    limiter = Limiter(app=app, default_limits=["3 per minute"])
    api = flask.Blueprint("api", __name__)
    v1 = flask.Blueprint("v1", __name__)
    health = flask.Blueprint("health", __name__)

    @v1.route("/login")
    def login():
        return "login"

    @health.route("/ping")
    def ping():
        return "pong"

    limiter.limit("1 per hour")(v1)
    limiter.exempt(health)
    api.register_blueprint(v1, url_prefix="/v1")
    api.register_blueprint(health, url_prefix="/health")
    app.register_blueprint(api, url_prefix="/api")
    public = flask.Blueprint("pub", __name__)

    @public.route("/x")
    def x():
        return "x"

    limiter.limit("1 per hour")(public)
    app.register_blueprint(public, url_prefix="/pub", name="public")
    client = app.test_client()
    assert _statuses(client, "/api/v1/login", 2) == [200, 429]
    assert _statuses(client, "/api/health/ping", 5) == [200] * 5
    assert _statuses(client, "/pub/x", 2) == [200, 429]


def test_method_views_and_factory_views_keep_their_own_limits():
    from flask.views import MethodView

    app = flask.Flask("views")
    limiter = Limiter(app=app)

    class Login(MethodView):
        decorators = [limiter.limit("1 per hour")]

        def get(self):
            return "login"

    class Catalog(MethodView):
        def get(self):
            return "catalog"

    def page(text):
        @limiter.limit("2 per hour")
        def view():
            return text

        return view

    app.add_url_rule("/login", view_func=Login.as_view("login"))
    app.add_url_rule("/catalog", view_func=Catalog.as_view("catalog"))
    app.add_url_rule("/a", "a", page("a"))
    app.add_url_rule("/b", "b", page("b"))
    client = app.test_client()
    assert _statuses(client, "/login", 2) == [200, 429]
    assert _statuses(client, "/catalog", 3) == [200] * 3
    assert _statuses(client, "/a", 3) == [200, 200, 429]
    assert _statuses(client, "/b", 3) == [200, 200, 429]


def test_a_view_with_two_limits_of_one_text_or_several_rates_in_a_file_is_served(tmp_path):
    app = flask.Flask("rates")
    limiter = Limiter(app=app, storage_uri=f"file://{tmp_path}/rates")

    @app.route("/twice", methods=["GET", "POST"])
    @limiter.limit("2 per hour", methods=["GET"])
    @limiter.limit("2 per hour", methods=["POST"])
    def twice():
        return "ok"

    @app.route("/both")
    @limiter.limit("3/second;2/hour")
    def both():
        return "ok"

    client = app.test_client()
    assert _statuses(client, "/twice", 3) == [200, 200, 429]
    assert [client.post("/twice").status_code for _ in range(3)] == [200, 200, 429]
    assert _statuses(client, "/both", 3) == [200, 200, 429]


def test_static_files_are_not_limited_by_the_defaults(tmp_path):
    (tmp_path / "site.css").write_text("body {}")
    app = flask.Flask("static", static_folder=str(tmp_path), static_url_path="/static")
    Limiter(app=app, default_limits=["2 per minute"])
    assert _statuses(app.test_client(), "/static/site.css", 4) == [200] * 4


def test_a_wsgi_limit_with_an_async_key_fails_when_it_is_made():
    from paceline.wsgi import Limit, RateLimitMiddleware

    async def key(environ):
        return "k"

    with pytest.raises(TypeError, match="WSGI server cannot await"):
        RateLimitMiddleware(lambda environ, start_response: [], [Limit("k", 1, key=key)])


def test_a_redis_cluster_by_uri_spreads_clients_and_keeps_each_exact():
    from redis_servers import Cluster, cli_binary, have, server_binary

    if not have(server_binary()) or not have(cli_binary()):
        pytest.skip("redis-server and redis-cli are needed for a cluster")
    cluster = Cluster()
    try:
        app = flask.Flask("cluster")
        limiter = Limiter(app=app, default_limits=["2 per hour"],
                          storage_uri=f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}")

        @app.route("/")
        def home():
            return "ok"

        client = app.test_client()
        for i in range(12):
            address = f"10.{i * 37 % 256}.{i * 101 % 256}.{i + 1}"
            assert _statuses(client, "/", 3, environ_base={"REMOTE_ADDR": address}) == [200, 200, 429]
        stored = [n.cli("DBSIZE").strip() for n in cluster.nodes]
        assert sum(int(s) for s in stored) == 12 and sum(s != "0" for s in stored) >= 2, stored
        del limiter
    finally:
        cluster.stop()


def test_a_redis_over_tls_by_uri(tmp_path):
    import shutil

    from redis_servers import free_port, server_binary

    if not shutil.which("openssl") or not shutil.which(server_binary()):
        pytest.skip("openssl and a redis-server are needed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True)
    port = free_port()
    server = subprocess.Popen(
        [server_binary(), "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
         "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        listening(port, 10, 0.05)
        app = flask.Flask("tls")
        Limiter(app=app, default_limits=["2 per hour"],
                storage_uri=f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none")

        @app.route("/")
        def home():
            return "ok"

        assert _statuses(app.test_client(), "/", 3) == [200, 200, 429]
    finally:
        server.kill()
        server.wait()
