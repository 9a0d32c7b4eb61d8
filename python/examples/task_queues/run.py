"""Two workers of a task queue hold a task to one rate, 50 calls a second, together:
starts a redis-server of its own (broker and storage), two workers, sends 200 tasks and
prints the starts as they come and the rate the workers kept.

    python python/examples/task_queues/run.py celery      # or: dramatiq, rq, arq

Needs redis-server on PATH and `pip install celery dramatiq rq redis` (for arq, `pip
install arq` in a venv of its own: it pins redis-py below 6, which Celery refuses). Without paceline,
Celery's own rate_limit="50/s" is per worker: two workers would start 100 a second.
"""

import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
TASKS, RATE, BURST = 200, 50, 50


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workers(queue, env):
    if queue == "celery":
        argv = [os.path.join(BIN, "celery"), "-A", "tasks", "worker", "-c", "4", "--loglevel=warning"]
        return [subprocess.Popen(argv + ["-n", f"w{i}@%h"], env=env, cwd=HERE) for i in range(2)]
    if queue == "dramatiq":
        argv = [os.path.join(BIN, "dramatiq"), "tasks", "--processes", "1", "--threads", "4"]
        # A worker releases a delayed message up to this late (ms): see paceline.dramatiq.
        env = {**env, "dramatiq_worker_timeout": "100"}
        return [subprocess.Popen(argv, env=env, cwd=HERE) for _ in range(2)]
    if queue == "arq":
        argv = [os.path.join(BIN, "arq"), "arq_tasks.WorkerSettings"]
        return [subprocess.Popen(argv, env=env, cwd=HERE, stderr=subprocess.DEVNULL) for _ in range(2)]
    # SimpleWorker runs each job in the worker process itself (no fork per job).
    argv = [os.path.join(BIN, "rq"), "worker", "--url", env["EXAMPLE_BROKER"], "--quiet",
            "--worker-class", "rq.worker.SimpleWorker"]
    # An RQ worker runs one job at a time, and a job waits its turn in it: four of them.
    return [subprocess.Popen(argv, env=env, cwd=HERE) for _ in range(4)]


def send(queue, tasks):
    if queue == "arq":
        import asyncio

        from arq import create_pool
        from arq.connections import RedisSettings

        async def enqueue():
            pool = await create_pool(RedisSettings.from_dsn(os.environ["EXAMPLE_BROKER"]))
            for n in range(TASKS):
                await pool.enqueue_job("call_api_arq", n)
            await pool.aclose()

        asyncio.run(enqueue())
        return
    for n in range(TASKS):
        if queue == "celery":
            tasks.call_api_celery.delay(n)
        elif queue == "dramatiq":
            tasks.call_api_dramatiq.send(n)
        else:
            from rq import Queue

            Queue(connection=tasks.starts).enqueue(tasks.call_api_rq, n)


def main():
    queue = sys.argv[1] if len(sys.argv) > 1 else "celery"
    if queue not in ("celery", "dramatiq", "rq", "arq"):
        sys.exit("usage: run.py celery|dramatiq|rq|arq")
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}"
    env = {**os.environ, "EXAMPLE_BROKER": f"{url}/0", "EXAMPLE_STORAGE": f"{url}/1",
           "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    os.environ.update(env)
    sys.path.insert(0, HERE)
    time.sleep(0.5)
    tasks = __import__("arq_tasks" if queue == "arq" else "tasks")

    running = workers(queue, env)
    try:
        time.sleep(4.0)  # the workers start
        print(f"{queue}: {len(running)} workers, {TASKS} tasks paced at {RATE}/second (burst {BURST})")
        send(queue, tasks)
        deadline, shown = time.time() + 30, 0
        while time.time() < deadline and shown < TASKS:
            time.sleep(0.5)
            shown = tasks.starts.llen("starts")
            print(f"  {shown:4d} started")
        times = sorted(float(t) for t in tasks.starts.lrange("starts", 0, -1))
        span = times[-1] - times[0]
        print(f"{len(times)} started in {span:.2f} s: {BURST} at once, then "
              f"{(len(times) - BURST) / span:.1f}/s (the rate: {RATE}/s, whatever the worker count)")
    finally:
        for worker in running:
            worker.terminate()
        for worker in running:
            worker.wait(15)
        server.terminate()


if __name__ == "__main__":
    main()
