"""``paceline.dramatiq.paced`` and ``paceline.rq.paced`` in real ``dramatiq`` and
``rq worker`` processes on a real Redis: one rate across the workers, in both storages."""

import time
import uuid

import pytest

pytest.importorskip("dramatiq")
pytest.importorskip("rq")

from queue_workers import dramatiq_nodes, record_of, rq_workers, starts, wait_for, worst_window  # noqa: E402
from redis_servers import Server  # noqa: E402


@pytest.fixture(scope="module")
def broker():
    server = Server()
    yield server
    server.stop()


def _storage(kind, broker, tmp_path):
    if kind == "redis":
        return f"redis://127.0.0.1:{broker.port}/1"
    return f"file://{tmp_path}/paced-{uuid.uuid4().hex[:8]}"


def _apps(url, monkeypatch):
    monkeypatch.setenv("PACELINE_TEST_BROKER", url)
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    import queue_apps

    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)
    for actor in (queue_apps.paced_actor, queue_apps.other_actor):
        actor.broker = broker
        broker.declare_actor(actor)
    queue_apps._record = record_of(url)
    return queue_apps


@pytest.mark.parametrize("kind", ["redis", "file"])
def test_dramatiq_workers_hold_one_rate(broker, tmp_path, kind, monkeypatch):
    broker.cli("FLUSHALL")
    url = f"redis://127.0.0.1:{broker.port}/0"
    apps = _apps(url, monkeypatch)
    nodes = dramatiq_nodes(tmp_path, url, _storage(kind, broker, tmp_path))
    try:
        time.sleep(3.0)  # the workers start
        for n in range(100):
            apps.paced_actor.send(n)
        for n in range(3):
            apps.paced_actor.send(-1 - n)  # each fails once, and its retry books again
        sent_other = time.time()
        for n in range(3):
            apps.other_actor.send(n)
        record = apps._record
        wait_for(lambda: record.llen("dramatiq") >= 106, 30, "the paced actor's starts")
        time.sleep(0.3)
        times, others = starts(record, "dramatiq"), starts(record, "dramatiq-other")
    finally:
        for node in nodes:
            node.stop()
    # 100, and 3 that fail once and run again.
    assert len(times) == 106
    # 20 at once, then at least 86 more at 20 a second.
    assert round(times[-1] - times[0], 2) >= 4.3
    assert worst_window(times, 20, 20) <= 0
    assert len(others) == 3 and max(others) - sent_other <= 2.0


@pytest.mark.parametrize("kind", ["redis", "file"])
def test_rq_workers_hold_one_rate(broker, tmp_path, kind, monkeypatch):
    from rq import Queue

    broker.cli("FLUSHALL")
    url = f"redis://127.0.0.1:{broker.port}/0"
    apps = _apps(url, monkeypatch)
    workers = rq_workers(tmp_path, url, _storage(kind, broker, tmp_path), ["paced"], count=3)
    try:
        queue = Queue("paced", connection=apps._record)
        time.sleep(2.0)
        for n in range(50):
            queue.enqueue(apps.paced_job, n)
        record = apps._record
        wait_for(lambda: record.llen("rq") >= 50, 30, "the paced job's starts")
        times = starts(record, "rq")
    finally:
        for worker in workers:
            worker.stop()
    # 20 at once, then 30 at 20 a second.
    assert round(times[-1] - times[0], 2) >= 1.5
    assert worst_window(times, 20, 20) <= 0
