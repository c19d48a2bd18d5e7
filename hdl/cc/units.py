"""Units of the TX scheduler's token buckets, in pure Python (no amaranth import), so the host
driver, the reference models and the gateware share one definition.

Rates are 20-bit unsigned Mb/s (= bits per microsecond); ``RATE_UNLIMITED`` (2**20 - 1) means
"no pacing". Time in the gateware is clock cycles; ``us_cycles`` is the number of clock cycles
per microsecond (250 at 250 MHz).

The scheduler keeps a global *rate clock* ``V``: the number of bytes a 1 Mb/s flow has earned
since reset. ``V`` advances by ``pace_scale(us_cycles)`` units of ``2**-SCALE_BITS`` bytes per
clock cycle (a 1 Mb/s flow earns ``1 / (8 * us_cycles)`` bytes per cycle). A bucket of rate ``R``
earns ``R * (V_now - V_then)`` bytes between two instants. Buckets keep their stamp of ``V``
with ``STAMP_FRAC`` fraction bits (``2**-STAMP_FRAC`` bytes per Mb/s) and their tokens in
``2**-STAMP_FRAC`` bytes.

Error bound: ``pace_scale`` is rounded to the nearest integer, so the rate clock (and every rate)
is off by at most ``0.5 / pace_scale``: 0.024 % at ``us_cycles`` = 1000 (pace_scale 2097),
much less for faster clocks. Truncating ``V`` to the stamp precision loses nothing over time:
every refill adds ``R * (stamp_new - stamp_old)`` and the stamps telescope, so the truncation
only delays credit by less than one stamp unit (2**-10 bytes per Mb/s: 7.8 ns of time).
"""

__all__ = ["RATE_BITS", "RATE_UNLIMITED", "SCALE_BITS", "STAMP_FRAC", "STAMP_INT", "SAT_BITS",
           "TOKEN_BITS", "pace_scale", "bytes_per_cycle"]

RATE_BITS = 20
RATE_UNLIMITED = (1 << RATE_BITS) - 1
SCALE_BITS = 24         # fraction bits of the rate clock V (and of pace_scale)
STAMP_FRAC = 10         # fraction bits of the stamps of V kept per bucket, and of tokens
STAMP_INT = 24          # integer bits of V: it wraps every 2**24 * 8 us (134 s)
SAT_BITS = 18           # a bucket not charged for 2**18 bytes-per-Mb/s (2.1 s) is full
TOKEN_BITS = 36         # signed tokens in 2**-10 bytes: +-32 MiB


def pace_scale(us_cycles):
    """``round(2**SCALE_BITS / (8 * us_cycles))``: how far the rate clock advances per cycle,
    in 2**-24 bytes per Mb/s. 0 for ``us_cycles`` 0 (time stands still)."""
    if us_cycles <= 0:
        return 0
    return ((1 << SCALE_BITS) + 4 * us_cycles) // (8 * us_cycles)


def bytes_per_cycle(rate, us_cycles):
    """Exact bytes per clock cycle of a flow of ``rate`` Mb/s."""
    return rate / (8 * us_cycles)
