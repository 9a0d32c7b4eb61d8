"""Real task-queue worker processes for the tests (``celery worker``, ``rq worker``,
``dramatiq``), each in a process group of its own so that a test can SIGKILL a whole node,
and the starts the test apps record in Redis, checked against the rate."""

import bisect
import contextlib
import os
import signal
import subprocess
import sys
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)


class Node:
    """One worker node: ``argv`` run with the tests' folder on ``PYTHONPATH``."""

    def __init__(self, argv, env, log):
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])), **env},
            cwd=HERE,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self):
        """SIGKILL to the node and every process it made."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.kill()
        self.kill()
        self.log.close()


def celery_nodes(tmp_path, broker, storage, count=2, children=4):
    env = {"PACELINE_TEST_BROKER": broker, "PACELINE_TEST_STORAGE": storage}
    return [
        Node(
            [os.path.join(BIN, "celery"), "-A", "celery_app", "worker", "-P", "prefork", "-c", str(children),
             "-n", f"node{i}@%h", "--loglevel=warning", "--without-gossip", "--without-mingle"],
            env,
            tmp_path / f"celery{i}.log",
        )
        for i in range(count)
    ]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def starts(record, name):
    """The wall times recorded under ``name``, sorted."""
    return sorted(float(x.split()[0]) for x in record.lrange(name, 0, -1))


def worst_window(times, burst, rate, windows=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0)):
    """The most any window of those lengths holds beyond ``burst + rate * w`` (at most 0:
    every window kept the rate)."""
    worst = -float("inf")
    for i, t in enumerate(times):
        for w in windows:
            inside = bisect.bisect_right(times, t + w) - i
            worst = max(worst, inside - (burst + rate * w))
    return worst


def record_of(url):
    return redis.Redis.from_url(url)


def dramatiq_nodes(tmp_path, broker, storage, count=2, threads=4):
    # A worker releases a delayed message up to this late (ms): see paceline.dramatiq.
    env = {"PACELINE_TEST_BROKER": broker, "PACELINE_TEST_STORAGE": storage, "dramatiq_worker_timeout": "100"}
    return [
        Node(
            [os.path.join(BIN, "dramatiq"), "queue_apps", "--processes", "1", "--threads", str(threads)],
            env,
            tmp_path / f"dramatiq{i}.log",
        )
        for i in range(count)
    ]


def rq_workers(tmp_path, broker, storage, queues, count=2):
    env = {"PACELINE_TEST_BROKER": broker, "PACELINE_TEST_STORAGE": storage}
    return [
        Node([os.path.join(BIN, "rq"), "worker", "--url", broker, *queues], env, tmp_path / f"rq{i}.log")
        for i in range(count)
    ]


@contextlib.contextmanager
def stopping(nodes):
    """``nodes``, stopped however the block ends."""
    try:
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def assert_paced(times, count, burst, rate):
    """``count`` starts that kept ``burst`` and ``rate``: ``burst`` at once, the rest at
    ``rate`` a second (the first start may come a few ms after its turn), and no window
    past ``burst + rate * w``."""
    assert len(times) == count
    assert times[-1] - times[0] >= (count - burst) / rate - 0.05
    assert worst_window(times, burst, rate) <= 0
