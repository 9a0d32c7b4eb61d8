"""The hot path, drawn: ns per admitted check of one limiter shared by 1 to 16 threads, for
paceline, governor and the bare compare-and-swap floor, from the contention bench's own
output (docs/pictures/data/contention-*.txt), one panel per machine.

    bash benches/many-core.sh build
    PACELINE_BENCH_THREADS=1,2 bash benches/many-core.sh run contention \\
        > docs/pictures/data/contention-2vcpu.txt              # on the 2-vCPU machine
    bash benches/many-core.sh run contention \\
        > docs/pictures/data/contention-xeon-16.txt            # on the 16-core machine
    pip install matplotlib
    python docs/pictures/hot_path.py                            # writes hot_path.png
"""

import pathlib
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).parent
RUNS = [
    ("contention-2vcpu.txt", "2-vCPU KVM guest (the CI machine's size)"),
    ("contention-xeon-16.txt", "16-core Intel Xeon (Emerald Rapids)"),
]
CONTENDERS = [
    ("paceline", "paceline", "-", "o"),
    ("governor", "governor", "--", "s"),
    ("shared-cas", "shared-cas: a bare compare-and-swap loop on one shared word, no backoff", ":", "^"),
]
LINE = re.compile(r"^contention allowed\s+(\d+) threads (\S+)\s+([\d.]+) ns/op")


def read(name: str) -> dict:
    """contender -> {threads: ns per check of the group}, from one run's output."""
    found: dict = {}
    for line in (HERE / "data" / name).read_text().splitlines():
        m = LINE.match(line)
        if m:
            threads, who, ns = int(m[1]), m[2], float(m[3])
            found.setdefault(who, {})[threads] = ns
    return found


def main() -> None:
    runs = [(read(name), title, name) for name, title in RUNS if (HERE / "data" / name).exists()]
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.8), dpi=110, squeeze=False)
    for ax, (found, title, name) in zip(axes[0], runs):
        for who, label, style, marker in CONTENDERS:
            points = sorted(found.get(who, {}).items())
            if points:
                ax.plot([t for t, _ in points], [ns for _, ns in points], linestyle=style,
                        marker=marker, label=label)
                print(f"{name}: {who:11} " + "  ".join(f"{t}: {ns:.1f} ns" for t, ns in points))
        threads = sorted({t for series in found.values() for t in series})
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads, [str(t) for t in threads])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("threads sharing one limiter")
        ax.set_ylabel("ns per admitted check (lower is better)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("One limiter, every check admitted: time per check of all threads together",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "hot_path.png")


if __name__ == "__main__":
    main()
