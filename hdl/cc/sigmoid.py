"""FlowMatrix fixed-point sigmoid: the table the reaction point's ROM holds, its index function
and the rate normalisation constant the host writes to ``cc.fm_norm``.

Pure Python (no amaranth import): the gateware (``stellar.hdl.cc.rp``), the register map's reset
values (``stellar.hdl.regmap``) and the host driver use it.

Formats (Q<m>.<n>: unsigned fixed point with n fraction bits unless called signed):

- ``x``: the sigmoid argument, signed Q8.8 (1.0 = 256), any width: values outside the table
  saturate to its ends.
- table entry ``i`` (``0 <= i < 256``) holds sigmoid(-8 + i/16) as Q0.16:
  ``min(65535, floor(65535 / (1 + exp(-(i - 128) / 16)) + 1/2))`` (round half up, stated so the
  table is the same in any language). The table covers -8.0 to +8.0 - 1/16 in steps of 1/16;
  it is non-decreasing, ``table[128] = 32768`` (sigmoid(0) = 1/2 of 65535, rounded up).
- ``sigmoid_index(x) = clamp((x >> 4) + 128, 0, 255)`` with ``>>`` the arithmetic (floor) shift:
  the entry at or below ``x``.
- ``sigma0(fm_c)`` = ``table[sigmoid_index(fm_c)]``: the FlowMatrix weight W with no congestion
  signal (Q = 0 makes the argument exactly ``fm_c``).
- ``fm_norm(fm_c)`` = ``ceil(2**32 / (65536 - sigma0(fm_c)))`` (Q16.16): the rate of a QP is
  ``(max_rate * (65536 - W) * fm_norm) >> 32``, so at ``W = sigma0`` the product reaches at
  least ``max_rate * 2**32`` and the clamp gives exactly ``max_rate``. (The ceiling, not the
  floor: with the floor the uncongested rate would stop at ``max_rate - 1`` whenever the divisor
  does not divide 2**32.) ``sigma0 <= 65512`` for every ``fm_c``, so the value fits 32 bits.
"""

import math

__all__ = ["SIGMOID_ENTRIES", "SIGMOID_FRAC_BITS", "SIGMOID_X_SHIFT", "sigmoid_table",
           "sigmoid_index", "sigma0", "fm_norm"]

SIGMOID_ENTRIES = 256       # table length
SIGMOID_FRAC_BITS = 16      # entries are Q0.16
SIGMOID_X_SHIFT = 4         # Q8.8 argument >> 4 = steps of 1/16


def sigmoid_table():
    """The 256 table entries, Q0.16 (a new list each call)."""
    table = []
    for i in range(SIGMOID_ENTRIES):
        x = (i - SIGMOID_ENTRIES // 2) / 16
        table.append(min(65535, math.floor(65535 / (1 + math.exp(-x)) + 0.5)))
    return table


def sigmoid_index(x):
    """Table index of the signed Q8.8 argument ``x`` (saturating at both ends)."""
    return min(max((x >> SIGMOID_X_SHIFT) + SIGMOID_ENTRIES // 2, 0), SIGMOID_ENTRIES - 1)


_TABLE = sigmoid_table()


def _signed16(v):
    """``v`` as a signed 16-bit value (a CSR holds fm_c as 16 raw bits)."""
    v &= 0xFFFF
    return v - 0x10000 if v & 0x8000 else v


def sigma0(fm_c):
    """The table value at Q = 0, i.e. at argument ``fm_c`` (signed Q8.8, or its 16 raw bits)."""
    return _TABLE[sigmoid_index(_signed16(fm_c))]


def fm_norm(fm_c):
    """``cc.fm_norm`` for a given ``fm_c``: ceil(2**32 / (65536 - sigma0(fm_c))), Q16.16."""
    d = 65536 - sigma0(fm_c)
    return -(-(1 << 32) // d)
