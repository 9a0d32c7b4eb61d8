"""An upstream that answers back, drawn: a fake upstream on loopback allowing 50 requests
per second (bursts of 10, answering with `Retry-After` and the IETF `RateLimit` fields),
and two clients configured for 100/s sending 600 requests from 50 tasks, each request
sent until it succeeds: one that does not listen (aiolimiter at 100/s, a refused request
sent again at once) and paceline's (`paceline.httpx.AsyncTransport`). Requests the
upstream saw and the 429s it sent, per second, from its own log.

    cargo build --release -p paceline-benches --example upstream_matrix
    pip install ./python httpx aiolimiter matplotlib
    python docs/pictures/upstream.py        # writes docs/pictures/upstream.png
"""

import pathlib
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent / "python" / "bench"))
import upstream_matrix  # noqa: E402

TASKS, REQUESTS = 50, 600
CLIENTS = [
    ("deaf", "a client that does not listen (aiolimiter, 100/s)"),
    ("paceline-py", "paceline.httpx (configured for 100/s)"),
]


def per_second(log, status=None):
    start = log[0][0]
    seconds = int(max(t for t, _, _ in log) - start) + 1
    counts = [0] * seconds
    for t, s, _ in log:
        if status is None or s == status:
            counts[int(t - start)] += 1
    return counts


def main() -> None:
    server = upstream_matrix.Server("ietf")
    logs = {}
    try:
        for name, _ in CLIENTS:
            time.sleep(1.5)  # the upstream's burst whole again, its log empty
            server.log()
            upstream_matrix.run_client(name, server.url, TASKS, REQUESTS)
            logs[name] = sorted(server.log())
    finally:
        server.close()
    fig, axes = plt.subplots(1, len(CLIENTS), figsize=(10, 3.6), dpi=110, sharey=True)
    for ax, (name, title) in zip(axes, CLIENTS):
        log = logs[name]
        sent, refused = per_second(log), per_second(log, 429)
        xs = range(len(sent))
        ax.bar(xs, sent, color="#9ecae1", label="requests the upstream saw")
        ax.bar(xs, refused, color="#de2d26", label="429s it answered")
        ax.axhline(upstream_matrix.ALLOWED, color="black", linewidth=0.8, linestyle=":",
                   label="what it allows: 50/s")
        share = sum(refused) / len(log) * 100
        ax.set_title(f"{title}\n{len(log)} requests sent, {share:.0f} % refused", fontsize=9)
        ax.set_xlabel("second of the run")
        print(f"{name:12} sent {len(log):4d}, refused {sum(refused):4d} ({share:.1f} %), "
              f"{len(sent)} s")
    axes[0].set_ylabel("per second")
    axes[0].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"{REQUESTS} requests from {TASKS} tasks to an upstream allowing 50/s",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "upstream.png")


if __name__ == "__main__":
    main()
