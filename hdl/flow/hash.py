# Ref: J. L. Carter, M. N. Wegman, "Universal classes of hash functions", JCSS 18 (1979) (H3 class);
#      M. V. Ramakrishna, E. Fu, E. Bahcekapili, "Efficient hardware hashing functions for high
#      performance computers", IEEE Trans. Computers 46(12) (1997)
"""H3 universal hashing of flow keys, as gateware and as its pure-Python twin.

An H3 hash is a GF(2) matrix ``Q`` (``out_bits`` rows of ``in_bits`` bits): output bit ``i`` is
the parity of ``key & Q[i]``. In gateware that is one XOR tree per output bit over a fixed subset
of the key bits -- no multiplier, no carry chain, a few LUT levels. The family is universal:
for random ``Q`` two distinct keys collide with probability ``2**-out_bits``.

The matrix of way ``w`` comes from ``random.Random(f"flow-h3:{seed}:{w}")``, so the gateware,
the tests and the host/bench models all derive the same slot addresses from ``(seed, way)``.
Rows are drawn until the matrix has full rank: then every address has exactly
``2**(in_bits - out_bits)`` keys mapping to it (a rank-deficient matrix would leave addresses
that no key can reach).

Use::

    hashes = flow_hashes(capacity=4096, ways=4, seed=0)    # one H3 per way
    hashes[w](key)                 # int -> int (Python)
    hashes[w].gateware(key_value)  # Value -> Value of out_bits (Amaranth)
    slot_addresses(hashes, key)    # [h_0(key), h_1(key), ...]
"""

import random

from amaranth.hdl import Cat, Const

from .fields import FLOW_KEY

__all__ = ["H3", "flow_hashes", "slot_addresses", "addr_bits_of"]


def _rank(rows):
    """Rank over GF(2) of a list of row bit masks."""
    basis = []                      # reduced rows, each with a distinct leading bit
    for r in rows:
        for b in basis:
            r = min(r, r ^ b)       # clears b's leading bit from r if r has it
        if r:
            basis.append(r)
            basis.sort(reverse=True)
    return len(basis)


class H3:
    """One H3 hash function ``in_bits -> out_bits``, the matrix seeded by ``(seed, way)``.

    ``rows[i]`` is the mask of key bits whose parity is output bit ``i``.
    """

    def __init__(self, in_bits, out_bits, *, seed=0, way=0):
        if not 0 <= out_bits <= in_bits:
            raise ValueError(f"H3: out_bits {out_bits} must be in 0..{in_bits}")
        self.in_bits = in_bits
        self.out_bits = out_bits
        self.seed = seed
        self.way = way
        rng = random.Random(f"flow-h3:{seed}:{way}")
        rows = []
        while len(rows) < out_bits:
            row = rng.getrandbits(in_bits)
            if _rank(rows + [row]) == len(rows) + 1:
                rows.append(row)
        self.rows = tuple(rows)

    def __call__(self, key):
        """The hash of the integer ``key`` (Python twin of :meth:`gateware`)."""
        key = int(key)
        return sum((bin(key & row).count("1") & 1) << i for i, row in enumerate(self.rows))

    def gateware(self, key):
        """The hash of the Amaranth value ``key`` (``in_bits`` wide): one XOR tree per output
        bit over the key bits its row selects. Put the result in a named Signal before using
        it in several places."""
        if not self.rows:
            return Const(0, 0)
        bits = []
        for row in self.rows:
            taps = [key[j] for j in range(self.in_bits) if row >> j & 1]
            bits.append(Cat(*taps).xor())
        return Cat(*bits)


def addr_bits_of(capacity, ways):
    """Address bits of one way of a table of ``capacity`` slots in ``ways`` memories."""
    depth = capacity // ways
    if depth * ways != capacity or depth & (depth - 1) or depth < 1:
        raise ValueError(f"capacity {capacity} / ways {ways} is not a power-of-two depth")
    return depth.bit_length() - 1


def flow_hashes(capacity, ways, seed=0):
    """The per-way H3 hashes of a flow table of ``capacity`` slots in ``ways`` ways."""
    bits = addr_bits_of(capacity, ways)
    return [H3(FLOW_KEY.width, bits, seed=seed, way=w) for w in range(ways)]


def slot_addresses(hashes, key):
    """``[h_w(key) for each way]``: the slot address of ``key`` (an int) in every way."""
    return [h(key) for h in hashes]
