"""Reference expectations for the TX scheduler (``stellar.hdl.cc.sched``), from its
specification: pure Python, no amaranth.

A scheduler that is work conserving and round robin between backlogged flows of one class, with
per-flow rate limits, gives each flow its *max-min fair share* of the link: flows that want less
than an equal split get what they want, the others split what is left equally. ``maxmin``
computes it; ``per_clock`` converts Mb/s to bytes per clock (1 Mb/s = 1 bit per microsecond).
"""

__all__ = ["maxmin", "per_clock"]


def per_clock(rate, us_cycles):
    """Bytes per clock cycle of ``rate`` Mb/s at ``us_cycles`` clock cycles per microsecond."""
    return rate / (8 * us_cycles)


def maxmin(capacity, demands, weights=None):
    """Weighted max-min fair shares of ``capacity`` between flows wanting ``demands`` (None or
    ``float('inf')``: as much as they can get); returns a list in the order of ``demands``."""
    n = len(demands)
    weights = list(weights or [1] * n)
    want = [float("inf") if d is None else float(d) for d in demands]
    share = [0.0] * n
    active = set(range(n))
    left = float(capacity)
    while active and left > 1e-12:
        unit = left / sum(weights[i] for i in active)
        capped = {i for i in active if want[i] <= unit * weights[i]}
        if not capped:
            for i in active:
                share[i] = unit * weights[i]
            break
        for i in capped:
            share[i] = want[i]
            left -= want[i]
        active -= capped
    return share
