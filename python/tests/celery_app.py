"""The Celery app the task-queue tests run in real ``celery worker`` processes: a Redis
broker, paced tasks whose starts are recorded (wall time, pid) in a Redis list, and an
unpaced task that records when it ran. Configured by the environment the tests set:
``PACELINE_TEST_BROKER`` (the broker's and the recording Redis's URL) and
``PACELINE_TEST_STORAGE`` (the paced task's storage URI)."""

import os
import time

import redis
from celery import Celery

from paceline.celery import paced

BROKER = os.environ.get("PACELINE_TEST_BROKER", "redis://127.0.0.1:6379/0")
STORAGE = os.environ.get("PACELINE_TEST_STORAGE", "memory://")
RATE = os.environ.get("PACELINE_TEST_RATE", "50/second")

app = Celery("celery_app", broker=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    # A killed node's reserved messages come back after this, not after an hour.
    # (and are looked for every second): the test that kills a node waits for them.
    broker_transport_options={
        "visibility_timeout": 8,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "unacked_restore_limit": 500,
    },
)

_record = redis.Redis.from_url(BROKER)


def _started(what, *extra):
    _record.rpush(what, f"{time.time():.6f} {os.getpid()} " + " ".join(str(e) for e in extra))


@app.task
@paced(RATE, storage_uri=STORAGE)
def call_api(n):
    _started("starts", n)


@app.task
@paced("5/second", storage_uri=STORAGE, key=lambda customer, n: customer, name="per-customer")
def per_customer(customer, n):
    _started(f"starts:{customer}", n)


@app.task(bind=True, max_retries=3)
@paced("4/second", storage_uri=STORAGE, name="flaky")
def flaky(self, n):
    _started("flaky", n, self.request.retries)
    if self.request.retries == 0 and n % 2 == 0:
        raise self.retry(countdown=0.1)


@app.task(bind=True)
@paced("2/second", storage_uri=STORAGE, key=lambda task, customer, doc=None: customer, name="bound")
def bound(self, customer, doc):
    _started(f"bound:{customer}", doc)


@app.task
@paced("2/second", storage_uri=STORAGE, name="slow")
def slow(n):
    _started("slow", n)


@app.task
def other(n):
    _started("other", n)


@app.task
def sleepy(seconds):
    time.sleep(seconds)

