"""The paced arq job that ``run.py arq`` drives: "call the API" 50 times a second across
every worker. (arq pins redis-py below 6, which Celery's Redis transport refuses: run it
from a venv of its own, `pip install arq`.)"""

import os
import time

import redis
from arq.connections import RedisSettings

from paceline.arq import paced

BROKER = os.environ.get("EXAMPLE_BROKER", "redis://127.0.0.1:6379/0")
STORAGE = os.environ.get("EXAMPLE_STORAGE", "redis://127.0.0.1:6379/1")
starts = redis.Redis.from_url(BROKER)


@paced("50/second", storage_uri=STORAGE)
async def call_api_arq(ctx, n):
    starts.rpush("starts", time.time())


class WorkerSettings:
    functions = [call_api_arq]
    redis_settings = RedisSettings.from_dsn(BROKER)
    max_jobs = 100
