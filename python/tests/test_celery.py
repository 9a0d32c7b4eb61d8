"""``paceline.celery.paced`` in real ``celery worker`` nodes (prefork) on a real Redis
broker: one rate across nodes for both storages, other tasks not starved, per-key
buckets, retries that book again, a node SIGKILLed mid-run, Redis gone; and bad input."""

import contextlib
import os
import time
import uuid

import pytest

celery = pytest.importorskip("celery")

from paceline import Budget, Rate  # noqa: E402
from paceline.celery import PacedKeyError, paced  # noqa: E402
from queue_workers import celery_nodes, record_of, starts, wait_for, worst_window  # noqa: E402
from redis_servers import Server  # noqa: E402


def _app(url):
    os.environ["PACELINE_TEST_BROKER"] = url
    import celery_app

    celery_app.app.conf.broker_url = url
    celery_app._record = record_of(url)
    return celery_app


def _ready(app, nodes):
    wait_for(lambda: len(app.control.ping(timeout=0.5) or []) >= nodes, 30, f"{nodes} celery nodes answering")


@contextlib.contextmanager
def _running(broker, tmp_path, count=2, storage=None):
    """The test app on ``broker`` (flushed) and ``count`` worker nodes answering,
    stopped at the end: yields the app's module and the nodes."""
    url = f"redis://127.0.0.1:{broker.port}/0"
    ca = _app(url)
    nodes = celery_nodes(tmp_path, url, storage or _storage("redis", broker, tmp_path), count=count)
    try:
        _ready(ca.app, count)
        yield ca, nodes
    finally:
        for node in nodes:
            node.stop()


def _storage(kind, server, tmp_path):
    if kind == "redis":
        return f"redis://127.0.0.1:{server.port}/1"
    return f"file://{tmp_path}/paced-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("kind", ["redis", "file"])
def test_two_nodes_hold_one_rate_and_other_tasks_still_run(fresh, tmp_path, kind):
    with _running(fresh, tmp_path, 2, _storage(kind, fresh, tmp_path)) as (ca, nodes):
        record = ca._record
        for n in range(250):
            ca.call_api.delay(n)
        sent_other = time.time()
        for n in range(5):
            ca.other.delay(n)
        wait_for(lambda: record.llen("starts") >= 250, 20, "250 paced starts")
        time.sleep(0.3)
        times = starts(record, "starts")
        others = starts(record, "other")
    assert len(times) == 250
    span = times[-1] - times[0]
    # 50 at once (the burst), then 200 at 50 a second: 4.0 s from the first turn to the
    # last, measured from start to start (the first may start a few ms after its turn on
    # a loaded machine; no window may hold more than the rate allows).
    assert span >= 4.0 - 0.02, span
    assert span <= 4.7, span
    assert worst_window(times, 50, 50) <= 0
    assert len(others) == 5
    assert max(others) - sent_other <= 2.0, [t - sent_other for t in others]


def test_keys_and_retries_book_their_own_turns(fresh, tmp_path):
    with _running(fresh, tmp_path, 1, _storage("redis", fresh, tmp_path)) as (ca, nodes):
        record = ca._record
        for n in range(15):
            ca.per_customer.delay("acme", n)
            ca.per_customer.delay("globex", n)
        for n in range(10):
            ca.flaky.delay(n)
        wait_for(
            lambda: record.llen("starts:acme") >= 15 and record.llen("starts:globex") >= 15
            and record.llen("flaky") >= 15,
            20,
            "the keyed and the retried starts",
        )
        acme, globex, flaky = starts(record, "starts:acme"), starts(record, "starts:globex"), starts(record, "flaky")
    for customer in (acme, globex):
        # Each customer its own "5/second": 5 at once, 10 more at 5 a second (the first
        # start may come a little after its turn: the first child takes longest).
        assert customer[-1] - customer[0] >= 1.95
        assert worst_window(customer, 5, 5) <= 0
    # The two customers ran side by side, not one after the other.
    assert abs(acme[0] - globex[0]) < 1.0
    # 10 executions and 5 retries, each booked: 4 at once, 11 more at 4 a second.
    assert len(flaky) == 15
    assert flaky[-1] - flaky[0] >= 2.7
    assert worst_window(flaky, 4, 4) <= 0


def test_a_node_killed_mid_run_loses_only_its_own_turns(fresh, tmp_path):
    with _running(fresh, tmp_path, 2, _storage("redis", fresh, tmp_path)) as (ca, nodes):
        record = ca._record
        for n in range(200):
            ca.call_api.delay(n)
        time.sleep(1.5)
        nodes[0].kill()
        # The survivor runs what is left, and what the killed node held comes back to
        # it once the broker's visibility timeout (8 s here) has passed.
        wait_for(lambda: record.llen("starts") >= 190, 45, f"the paced starts after a node was killed ({record.llen('starts')})")
        time.sleep(1.0)
        times = starts(record, "starts")
    # Those the killed node had started when it died are gone with it (Celery acks early).
    assert 190 <= len(times) <= 200
    assert worst_window(times, 50, 50) <= 0


def test_forged_marks_bound_keys_and_far_turns(fresh, tmp_path):
    """A producer's forged booking is booked anyway; a bound task's key function gets
    the task first; a turn further than half the broker's visibility timeout (8 s here)
    is not made an ETA the broker would deliver twice."""
    from paceline._tasks.pacer import MARK

    with _running(fresh, tmp_path, 1, _storage("redis", fresh, tmp_path)) as (ca, nodes):
        record = ca._record
        # What a producer can compute: the fingerprint of the workers' pacer.
        from paceline._tasks.pacer import Pacer

        fingerprint = Pacer("2/second", storage_uri=_storage("redis", fresh, tmp_path), name="slow").fingerprint
        for n in range(8):
            forged = {"p": fingerprint, "r": 0, "at": time.time() + 3600, "s": "0" * 64}
            ca.slow.apply_async((n,), headers={MARK: forged})
        for doc in range(6):
            ca.bound.delay("acme", f"doc{doc}")
        wait_for(lambda: record.llen("slow") >= 8 and record.llen("bound:acme") >= 6, 20, "the forged and bound starts")
        forged_starts, bound_starts = starts(record, "slow"), starts(record, "bound:acme")
        # 24 more of "2/second": the last turns are 12 s away, past the 4 s horizon.
        record.delete("slow")
        for n in range(24):
            ca.slow.delay(n)
        wait_for(lambda: record.llen("slow") >= 24, 30, "the far turns")
        time.sleep(9.0)  # past the visibility timeout: a message held as an ETA comes back
        far = [x.split()[2].decode() for x in record.lrange("slow", 0, -1)]
    # 2 at once, then one every half second: never 8 at once.
    assert forged_starts[-1] - forged_starts[0] >= 2.95
    assert worst_window(forged_starts, 2, 2) <= 0
    assert bound_starts[-1] - bound_starts[0] >= 1.95
    assert sorted(far) == sorted(str(n) for n in range(24))  # each ran once


def test_redis_gone_hands_tasks_back_and_loses_none(fresh, tmp_path):
    storage = Server()
    try:
        with _running(fresh, tmp_path, 1, f"redis://127.0.0.1:{storage.port}/0") as (ca, nodes):
            record = ca._record
            storage.stop()
            for n in range(20):
                ca.call_api.delay(n)
            time.sleep(2.0)
            assert record.llen("starts") == 0  # failing closed: nothing ran unlimited
            storage.start()
            wait_for(lambda: record.llen("starts") >= 20, 20, "the tasks handed back while Redis was gone")
            assert worst_window(starts(record, "starts"), 50, 50) <= 0
    finally:
        storage.stop()


def test_bad_input_fails_at_import_or_at_the_call():
    with pytest.raises(ValueError, match="unknown scheme"):
        paced("5/second", storage_uri="memcached://localhost")
    with pytest.raises(ValueError):
        paced("five a second", storage_uri="memory://")(lambda: None)
    with pytest.raises(ValueError, match="storage_uri"):
        paced("5/second", storage_uri=None)(lambda: None)
    with pytest.raises(ValueError, match="a rate, a budget"):
        paced(storage_uri="memory://")(lambda: None)
    with pytest.raises(TypeError, match="async"):

        async def body():
            pass

        paced("5/second", storage_uri="memory://")(body)

    def boom(n):
        raise LookupError("no such customer")

    called = []
    task = paced("5/second", storage_uri="memory://", key=boom)(lambda n: called.append(n))
    with pytest.raises(PacedKeyError, match="no such customer"):
        task(1)
    task = paced("5/second", storage_uri="memory://", key=lambda n: n)(lambda n: called.append(n))
    with pytest.raises(PacedKeyError, match="non-empty str"):
        task(1)
    assert called == []


def test_a_direct_call_waits_its_turn_and_settles_its_budget():
    budget = Budget(requests=Rate(100, per=60.0), tokens=Rate(10_000, per=60.0))
    body = paced(
        "2/second",
        storage_uri="memory://",
        budget=budget,
        cost=lambda doc: {"requests": 1, "tokens": 1000},
        settle=lambda result: {"requests": 1, "tokens": result},
    )(lambda doc: 300)
    start = time.monotonic()
    assert [body(i) for i in range(4)] == [300] * 4
    # "2/second": 2 at once, then one every half second.
    assert time.monotonic() - start >= 0.95
    # Settled at 300 tokens each, not the 1000 estimated.
    # (What refilled since is at most a few hundred: 10 000 a minute.)
    assert 10_000 - 4 * 300 <= budget.remaining("tokens") < 10_000 - 4 * 300 + 500
