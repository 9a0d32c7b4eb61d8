"""How the pacing tests read start times: the most that fall in any window, with the
slack a loaded machine's late readings need."""

# How many more starts than the quota allows a window of readings may hold: each task
# reads the time a moment after its admission, and a loaded machine delays some readings
# more than others, which can bring readings of admissions a few intervals apart into one
# window. The misbehaviours these tests guard against exceed their bounds by far more.
SLACK = 3


def starts_within(starts, window):
    """The most start times that fall in any half-open window of `window` seconds."""
    starts = sorted(starts)
    best, j = 0, 0
    for i, t in enumerate(starts):
        while starts[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best
