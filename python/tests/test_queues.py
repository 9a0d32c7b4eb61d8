"""``paceline.dramatiq.paced`` and ``paceline.rq.paced`` in real ``dramatiq`` and
``rq worker`` processes on a real Redis: one rate across the workers, in both storages."""

import time
import uuid

import pytest

pytest.importorskip("dramatiq")
pytest.importorskip("rq")

from queue_workers import assert_paced, dramatiq_nodes, record_of, rq_workers, starts, stopping, wait_for  # noqa: E402


def _storage(kind, server, tmp_path):
    if kind == "redis":
        return f"redis://127.0.0.1:{server.port}/1"
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
def test_dramatiq_workers_hold_one_rate(fresh, tmp_path, kind, monkeypatch):
    url = f"redis://127.0.0.1:{fresh.port}/0"
    apps = _apps(url, monkeypatch)
    with stopping(dramatiq_nodes(tmp_path, url, _storage(kind, fresh, tmp_path))):
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
    # 100, and 3 that fail once and run again, each run booked.
    assert_paced(times, 106, 20, 20)
    assert len(others) == 3 and max(others) - sent_other <= 2.0


@pytest.mark.parametrize("kind", ["redis", "file"])
def test_rq_workers_hold_one_rate(fresh, tmp_path, kind, monkeypatch):
    from rq import Queue

    url = f"redis://127.0.0.1:{fresh.port}/0"
    apps = _apps(url, monkeypatch)
    with stopping(rq_workers(tmp_path, url, _storage(kind, fresh, tmp_path), ["paced"], count=3)):
        queue = Queue("paced", connection=apps._record)
        time.sleep(2.0)
        for n in range(50):
            queue.enqueue(apps.paced_job, n)
        record = apps._record
        wait_for(lambda: record.llen("rq") >= 50, 30, "the paced job's starts")
        times = starts(record, "rq")
    assert_paced(times, 50, 20, 20)
