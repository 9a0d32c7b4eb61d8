"""Fixtures the test modules share: ``server``, a redis-server of the module's own, and
``fresh``, that server running and flushed for each test. A module that names
``REDIS_BINARIES`` (the paceline.redis tests) gets a server per binary, its script cache
flushed for each test too. A module that defines a fixture of the same name uses its
own."""

import pytest

from redis_servers import Server


def pytest_generate_tests(metafunc):
    binaries = getattr(metafunc.module, "REDIS_BINARIES", None)
    if binaries and "server" in metafunc.fixturenames:
        metafunc.parametrize("server", binaries, indirect=True, scope="module")


@pytest.fixture(scope="module")
def server(request):
    s = Server(binary=getattr(request, "param", None))
    yield s
    s.stop()


@pytest.fixture
def fresh(request, server):
    if server.proc is None:
        server.start()
    server.cli("FLUSHALL")
    if getattr(request.module, "REDIS_BINARIES", None):
        server.cli("SCRIPT", "FLUSH")
    return server
