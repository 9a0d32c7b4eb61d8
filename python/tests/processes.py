"""Several processes running one function, for the tests across processes."""

import multiprocessing


def results(target, args, count, start_method="fork", exit_zero=True):
    """Runs ``target(*args, out)`` in ``count`` processes (``start_method``'s) and returns
    what each put on ``out``, in the order they came, once every one has ended; each must
    have exited 0 unless ``exit_zero`` is false."""
    ctx = multiprocessing.get_context(start_method)
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out)) for _ in range(count)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        if exit_zero:
            assert p.exitcode == 0
    return got
