"""The arq worker the arq test runs (``arq arq_app.WorkerSettings``): a paced job whose
starts are recorded in Redis, configured by ``PACELINE_TEST_BROKER`` and
``PACELINE_TEST_STORAGE``."""

import os
import time

import redis
from arq.connections import RedisSettings

from paceline.arq import paced

BROKER = os.environ.get("PACELINE_TEST_BROKER", "redis://127.0.0.1:6379/0")
STORAGE = os.environ.get("PACELINE_TEST_STORAGE", "memory://")
_record = redis.Redis.from_url(BROKER)


@paced("20/second", storage_uri=STORAGE, name="arq-paced")
async def paced_job(ctx, n):
    _record.rpush("arq", f"{time.time():.6f} {os.getpid()} {n}")


class WorkerSettings:
    functions = [paced_job]
    redis_settings = RedisSettings.from_dsn(BROKER)
    max_jobs = 50
    poll_delay = 0.05
