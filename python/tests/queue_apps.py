"""The Dramatiq actors and RQ jobs the task-queue tests run in real ``dramatiq`` and
``rq worker`` processes: paced ones whose starts are recorded (wall time, pid) in a Redis
list, and an unpaced one. Configured by the environment the tests set:
``PACELINE_TEST_BROKER`` (the broker's and the recording Redis's URL) and
``PACELINE_TEST_STORAGE`` (the paced functions' storage URI)."""

import os
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

BROKER = os.environ.get("PACELINE_TEST_BROKER", "redis://127.0.0.1:6379/0")
STORAGE = os.environ.get("PACELINE_TEST_STORAGE", "memory://")

dramatiq.set_broker(RedisBroker(url=BROKER))

import paceline.dramatiq  # noqa: E402 - after the broker: it installs its middleware there
import paceline.rq  # noqa: E402

_record = redis.Redis.from_url(BROKER)


def _started(what, *extra):
    _record.rpush(what, f"{time.time():.6f} {os.getpid()} " + " ".join(str(e) for e in extra))


@dramatiq.actor(max_retries=3, min_backoff=100, max_backoff=200)
@paceline.dramatiq.paced("20/second", storage_uri=STORAGE, name="dramatiq-paced")
def paced_actor(n):
    _started("dramatiq", n)
    if n < 0 and _record.incr(f"failed:{n}") == 1:
        raise RuntimeError("a retry of the actor's own")


@dramatiq.actor
def other_actor(n):
    _started("dramatiq-other", n)


@paceline.rq.paced("20/second", storage_uri=STORAGE, name="rq-paced")
def paced_job(n):
    _started("rq", n)


def other_job(n):
    _started("rq-other", n)
