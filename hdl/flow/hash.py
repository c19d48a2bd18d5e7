# Ref: J. L. Carter, M. N. Wegman, "Universal classes of hash functions", JCSS 18 (1979) (H3 class);
#      M. Patrascu, M. Thorup, "The power of simple tabulation hashing", J. ACM 59(3) (2012)
"""Hashing of flow keys for the cuckoo table, as gateware and as its pure-Python twin.

Each way ``w`` has its own hash ``h_w``: simple tabulation over 4-bit characters. The 32-bit key
is cut into eight nibbles; nibble ``j`` selects entry ``T_w,j[nibble]`` of a table of sixteen
random ``out_bits``-bit words, and the hash is the XOR of the eight selected words. Seen as a
matrix, this is an H3 hash (output bit ``i`` = parity of a fixed random subset of input bits)
applied to the key's *one-hot nibble expansion* (128 bits, one bit set per nibble): the
``rows`` attribute gives that GF(2) matrix. In gateware each output bit is eight 4-input
functions (one LUT4 each) and a XOR of eight: three LUT levels, no multiplier, no carry chain.

Why not plain H3 on the 32 key bits (the first plan): a plain H3 hash is *linear*, and flow keys
are not random -- QPNs are handed out consecutively, in a few tenants. A set of consecutive
keys is (nearly) a linear subspace, and on it every way's hash is a linear map, so the cuckoo
graph becomes a rigid algebraic structure instead of a random one. A model of this table's
insert algorithm (4 ways, stash 4, 128 kicks, sequential QPNs) reached its first FULL at only
63-89% load with plain H3 over several seeds, against 95-98% with random keys; tabulation
reached 95-98% with both (``tests/unit/test_flowhash.py`` keeps that check). Tabulation hashing
is 3-independent and known to behave like a random function for cuckoo hashing, at about
twice the LUTs of a plain H3 (it is still small next to the compare logic).

The tables of way ``w`` come from ``random.Random(f"flow-h3:{seed}:{w}")``, so the gateware,
the tests and the host/bench models all derive the same slot addresses from ``(seed, way)``.

Use::

    hashes = flow_hashes(capacity=4096, ways=4, seed=0)    # one hash per way
    hashes[w](key)                 # int -> int (Python)
    hashes[w].gateware(key_value)  # Value -> Value of out_bits (Amaranth)
    slot_addresses(hashes, key)    # [h_0(key), h_1(key), ...]
"""

import random

from amaranth.hdl import Cat, Const

from .fields import FLOW_KEY

__all__ = ["FlowHash", "flow_hashes", "slot_addresses", "addr_bits_of"]

CHAR_BITS = 4


class FlowHash:
    """One hash ``in_bits -> out_bits``: simple tabulation over 4-bit characters, the tables
    seeded by ``(seed, way)``.

    ``tables[j][v]``: the word character ``j`` (key bits ``4j .. 4j+3``) contributes when its
    value is ``v``. ``rows[i]``: the equivalent H3 row over the one-hot expansion (bit
    ``16 j + v`` set when bit ``i`` of ``tables[j][v]`` is).
    """

    def __init__(self, in_bits, out_bits, *, seed=0, way=0):
        if out_bits < 0 or in_bits < 1:
            raise ValueError(f"FlowHash: bad widths {in_bits} -> {out_bits}")
        self.in_bits = in_bits
        self.out_bits = out_bits
        self.seed = seed
        self.way = way
        self.chars = -(-in_bits // CHAR_BITS)
        rng = random.Random(f"flow-h3:{seed}:{way}")
        self.tables = tuple(tuple(rng.getrandbits(out_bits) if out_bits else 0 for _ in range(1 << CHAR_BITS))
                            for _ in range(self.chars))
        self.rows = tuple(
            sum(((self.tables[j][v] >> i) & 1) << (j << CHAR_BITS | v)
                for j in range(self.chars) for v in range(1 << CHAR_BITS))
            for i in range(out_bits))

    def __call__(self, key):
        """The hash of the integer ``key`` (Python twin of :meth:`gateware`)."""
        key = int(key)
        out = 0
        for j in range(self.chars):
            out ^= self.tables[j][(key >> (CHAR_BITS * j)) & ((1 << CHAR_BITS) - 1)]
        return out

    def truth_table(self, i, j):
        """The 16-entry truth table of output bit ``i`` as a function of character ``j``."""
        return sum(((self.tables[j][v] >> i) & 1) << v for v in range(1 << CHAR_BITS))

    def gateware(self, key):
        """The hash of the Amaranth value ``key`` (``in_bits`` wide): per output bit, the XOR
        of one 4-input function per character. Put the result in a named Signal before using it
        in several places."""
        if not self.out_bits:
            return Const(0, 0)
        chars = [key[CHAR_BITS * j:min(CHAR_BITS * (j + 1), self.in_bits)] for j in range(self.chars)]
        bits = []
        for i in range(self.out_bits):
            terms = [Const(self.truth_table(i, j), 1 << CHAR_BITS).bit_select(c, 1)
                     for j, c in enumerate(chars) if self.truth_table(i, j)]
            bits.append(Cat(*terms).xor() if terms else Const(0, 1))
        return Cat(*bits)


def addr_bits_of(capacity, ways):
    """Address bits of one way of a table of ``capacity`` slots in ``ways`` memories."""
    depth = capacity // ways
    if depth < 1 or depth * ways != capacity or depth & (depth - 1):
        raise ValueError(f"capacity {capacity} / ways {ways} is not a power-of-two depth")
    return depth.bit_length() - 1


def flow_hashes(capacity, ways, seed=0):
    """The per-way hashes of a flow table of ``capacity`` slots in ``ways`` ways."""
    bits = addr_bits_of(capacity, ways)
    return [FlowHash(FLOW_KEY.width, bits, seed=seed, way=w) for w in range(ways)]


def slot_addresses(hashes, key):
    """``[h_w(key) for each way]``: the slot address of ``key`` (an int) in every way."""
    return [h(key) for h in hashes]
