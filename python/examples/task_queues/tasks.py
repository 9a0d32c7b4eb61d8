"""The paced task of each queue (Celery, Dramatiq, RQ) that ``run.py`` drives: "call the
API" 50 times a second across every worker, however many there are. Each start is
recorded in Redis so that the driver can print the rate the workers kept together."""

import os
import time

import dramatiq
import redis
from celery import Celery
from dramatiq.brokers.redis import RedisBroker

BROKER = os.environ.get("EXAMPLE_BROKER", "redis://127.0.0.1:6379/0")
STORAGE = os.environ.get("EXAMPLE_STORAGE", "redis://127.0.0.1:6379/1")
starts = redis.Redis.from_url(BROKER)

# Celery: @paced under @app.task.
app = Celery("tasks", broker=BROKER)
app.conf.worker_hijack_root_logger = False

from paceline.celery import paced  # noqa: E402


@app.task
@paced("50/second", storage_uri=STORAGE)
def call_api_celery(n):
    starts.rpush("starts", time.time())


# Dramatiq: @paced under @dramatiq.actor, the broker set first.
dramatiq.set_broker(RedisBroker(url=BROKER))
import paceline.dramatiq  # noqa: E402


@dramatiq.actor
@paceline.dramatiq.paced("50/second", storage_uri=STORAGE)
def call_api_dramatiq(n):
    starts.rpush("starts", time.time())


# RQ: @paced on the job's function.
import paceline.rq  # noqa: E402


@paceline.rq.paced("50/second", storage_uri=STORAGE)
def call_api_rq(n):
    starts.rpush("starts", time.time())
