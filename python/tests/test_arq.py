"""``paceline.arq.paced`` in real ``arq`` worker processes on a real Redis: one rate
across the workers, in both storages, and a job cancelled while it waits gives its turn
back. (arq pins redis-py below 6, which Celery's Redis transport refuses: CI runs this
file in a venv of its own.)"""

import asyncio
import os
import time
import uuid

import pytest

arq = pytest.importorskip("arq")

from paceline.arq import paced  # noqa: E402
from queue_workers import BIN, Node, assert_paced, record_of, starts, stopping, wait_for  # noqa: E402


@pytest.mark.parametrize("kind", ["redis", "file"])
def test_arq_workers_hold_one_rate(fresh, tmp_path, kind):
    from arq import create_pool
    from arq.connections import RedisSettings

    url = f"redis://127.0.0.1:{fresh.port}/0"
    storage = f"redis://127.0.0.1:{fresh.port}/1" if kind == "redis" else f"file://{tmp_path}/paced-{uuid.uuid4().hex[:8]}"
    env = {"PACELINE_TEST_BROKER": url, "PACELINE_TEST_STORAGE": storage}
    nodes = [Node([os.path.join(BIN, "arq"), "arq_app.WorkerSettings"], env, tmp_path / f"arq{i}.log") for i in range(2)]
    with stopping(nodes):
        time.sleep(2.0)

        async def send():
            pool = await create_pool(RedisSettings.from_dsn(url))
            for n in range(60):
                await pool.enqueue_job("paced_job", n)
            await pool.aclose()

        asyncio.run(send())
        record = record_of(url)
        wait_for(lambda: record.llen("arq") >= 60, 30, "the paced job's starts")
        times = starts(record, "arq")
    assert_paced(times, 60, 20, 20)


def test_a_cancelled_job_gives_its_turn_back():
    ran = []

    @paced("2/second", storage_uri="memory://", burst=None)
    async def job(ctx, n):
        ran.append(n)

    async def main():
        await job({}, 1)
        await job({}, 2)  # the burst of 2
        waiting = asyncio.ensure_future(job({}, 3))  # half a second away
        await asyncio.sleep(0.1)
        waiting.cancel()
        await asyncio.sleep(0)  # job 3 is told, and gives its turn back
        start = time.monotonic()
        await job({}, 4)  # takes the turn job 3 gave back
        return time.monotonic() - start

    waited = asyncio.run(main())
    assert ran == [1, 2, 4]
    assert waited < 0.45


def test_arq_bad_input():
    with pytest.raises(TypeError, match="not async"):
        paced("2/second", storage_uri="memory://")(lambda ctx: None)
    with pytest.raises(TypeError, match="max_sleep"):
        paced("2/second", storage_uri="memory://", max_sleep=1.0)
    with pytest.raises(ValueError):
        paced("2 a second", storage_uri="memory://")
