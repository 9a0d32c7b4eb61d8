"""paceline.celery.paced beside Celery's own rate_limit, in the same run: two prefork
worker nodes (4 children each) on a Redis broker started here, 250 tasks at "50 a
second" each way, then 5 tasks of another type; prints when the 250 started, the most
any window held beyond 50 + 50 w, and when the other tasks started.

    python python/bench/celery_rates.py            # needs redis-server, celery, redis

Celery's rate_limit is per worker node: the two nodes start 100 a second between them.
"""

import bisect
import os
import socket
import subprocess
import sys
import time

import redis
from celery import Celery

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/0")
app = Celery("celery_rates", broker=BROKER)
app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)
record = redis.Redis.from_url(BROKER)

from paceline.celery import paced  # noqa: E402


@app.task
@paced("50/second", storage_uri=BROKER.rsplit("/", 1)[0] + "/1")
def with_paceline(n):
    record.rpush("paceline", time.time())


@app.task(rate_limit="50/s")
def with_rate_limit(n):
    record.rpush("rate_limit", time.time())


@app.task
def other(n):
    record.rpush("other", time.time())


def worst(times, burst=50, rate=50):
    out = -1e9
    for i, t in enumerate(times):
        for w in (0.1, 0.5, 1.0, 2.0):
            out = max(out, bisect.bisect_right(times, t + w) - i - (burst + rate * w))
    return out


def run(task, name):
    record.delete(name, "other")
    sent = time.time()
    for n in range(250):
        task.delay(n)
    other_sent = time.time()
    for n in range(5):
        other.delay(n)
    deadline = time.time() + 30
    while time.time() < deadline and (record.llen(name) < 250 or record.llen("other") < 5):
        time.sleep(0.1)
    times = sorted(float(t) for t in record.lrange(name, 0, -1))
    others = sorted(float(t) for t in record.lrange("other", 0, -1))
    span = times[-1] - times[0] if times else float("nan")
    late = max(others) - other_sent if len(others) == 5 else float("nan")
    print(f"  {name:10s} {len(times):3d} started in {span:5.2f} s (from the first send: "
          f"{times[-1] - sent:5.2f} s), most beyond 50 + 50 w: {worst(times):+4.0f}, "
          f"other tasks started after {late:4.2f} s")


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    env = {**os.environ, "BENCH_BROKER": url,
           "PYTHONPATH": os.path.dirname(os.path.abspath(__file__)) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    celery = os.path.join(os.path.dirname(sys.executable), "celery")
    nodes = [subprocess.Popen([celery, "-A", "celery_rates", "worker", "-c", "4", "-n", f"n{i}@%h",
                               "--loglevel=error"], env=env, cwd=os.path.dirname(os.path.abspath(__file__)))
             for i in range(2)]
    try:
        global record
        time.sleep(1.0)
        record = redis.Redis.from_url(url)
        app.conf.broker_url = url
        time.sleep(5.0)
        print("two prefork nodes x 4 children, 250 tasks at 50/second each way, then 5 others:")
        run(with_paceline, "paceline")
        time.sleep(2.0)
        run(with_rate_limit, "rate_limit")
    finally:
        everything = [*nodes, server]
        for process in everything:
            process.terminate()
        for process in everything:
            process.wait(20)


if __name__ == "__main__":
    main()
