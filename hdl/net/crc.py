# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.8 "ICRC"; IEEE 802.3 clause 3.2.9 (CRC-32)
"""Word-parallel CRC-32 for the ICRC, built from GF(2) matrices.

Why not ``amaranth.lib.crc``: it is the golden reference in the tests, but it processes whole
words only and unrolls the bit-serial update symbolically, which takes ~30 s and 18 k lines of
Verilog at 512 bits. The ICRC needs two more things it does not offer: a zero-cost way to skip
the bytes before the IP header, and a way to finish on a partial last word. Both come from the
same algebra, so this module computes the update matrices numerically (milliseconds) and emits
one masked XOR reduction per output bit.

The trick used everywhere (all in the reflected, LSB-first domain of zlib's CRC-32):
  * zlib.crc32(m) = crc0(m with its first 4 bytes inverted) ^ 0xFFFFFFFF, where crc0 is the
    CRC with init 0. The ICRC message starts with 8 bytes of 0xFF, so
    ICRC = crc0(FF FF FF FF || masked packet) ^ 0xFFFFFFFF.
  * crc0 ignores leading zero bytes, so bytes before (IP header - 4) are simply zeroed and the
    four 0xFF bytes are written into the stream just before the IP header.
  * A last word zero-padded with k bytes yields crc0(m) * x^(8k); multiplying by the inverse of
    the zero-byte matrix k times (in log2(B) conditional stages) recovers crc0(m).

Lane order: byte i of a data word is bits [8i, 8i+8) (AXI-Stream order: tdata[7:0] first).
"""

from functools import lru_cache

from amaranth.hdl import Cat, Const, Mux, Signal, Value

__all__ = ["POLY_REFLECTED", "crc32_matrices", "crc_step", "crc_unpad", "icrc_finish",
           "crc0_reference", "materialize"]

POLY_REFLECTED = 0xEDB88320


def _bit_update(state, bit):
    fb = (state ^ bit) & 1
    state >>= 1
    return state ^ POLY_REFLECTED if fb else state


def crc0_reference(data, state=0):
    """Bit-serial software model of the init-0, no-xorout reflected CRC-32 (for tests)."""
    for byte in data:
        for i in range(8):
            state = _bit_update(state, (byte >> i) & 1)
    return state


def _advance(state, data, nbits):
    for i in range(nbits):
        state = _bit_update(state, (data >> i) & 1)
    return state


@lru_cache(maxsize=None)
def crc32_matrices(nbits):
    """Return (state_masks, data_masks): output bit i = parity(state & sm[i]) ^ parity(data & dm[i])."""
    # Columns by linearity: the image of each basis vector.
    state_cols = [_advance(1 << j, 0, nbits) for j in range(32)]
    data_cols = [_advance(0, 1 << j, nbits) for j in range(nbits)]
    sm = [sum(1 << j for j in range(32) if (state_cols[j] >> i) & 1) for i in range(32)]
    dm = [sum(1 << j for j in range(nbits) if (data_cols[j] >> i) & 1) for i in range(32)]
    return tuple(sm), tuple(dm)


def _parity_mask(value, mask, width):
    if mask == 0:
        return Const(0, 1)
    return (value & Const(mask, width)).xor()


def materialize(m, value, name):
    """A Signal carrying ``value``. Every expression read by several parity trees goes through
    one: Amaranth lowers an expression again at every use, so sharing needs a named net."""
    sig = Signal(Value.cast(value).shape(), name=name)
    m.d.comb += sig.eq(value)
    return sig


def crc_step(m, state, data, name="crc"):
    """Combinational CRC-32 (init 0 domain) update of ``state`` by a whole word ``data``."""
    state = materialize(m, state, f"{name}_state")
    data = materialize(m, data, f"{name}_data")
    nbits = len(data)
    sm, dm = crc32_matrices(nbits)
    return materialize(m, Cat(*(_parity_mask(state, sm[i], 32) ^ _parity_mask(data, dm[i], nbits)
                                for i in range(32))), f"{name}_next")


def _gf2_inverse(cols):
    """Invert a 32x32 GF(2) matrix given as column bit-vectors; returns columns of the inverse."""
    n = 32
    # Rows of [A | I].
    rows = []
    for i in range(n):
        a = sum(((cols[j] >> i) & 1) << j for j in range(n))
        rows.append((a, 1 << i))
    for c in range(n):
        p = next(r for r in range(c, n) if (rows[r][0] >> c) & 1)
        rows[c], rows[p] = rows[p], rows[c]
        for r in range(n):
            if r != c and (rows[r][0] >> c) & 1:
                rows[r] = (rows[r][0] ^ rows[c][0], rows[r][1] ^ rows[c][1])
    inv_rows = [rows[i][1] for i in range(n)]
    return [sum(((inv_rows[i] >> j) & 1) << i for i in range(n)) for j in range(n)]


def _apply_cols(cols, state):
    out = 0
    for j in range(32):
        if (state >> j) & 1:
            out ^= cols[j]
    return out


@lru_cache(maxsize=None)
def _unpad_matrices(max_bytes):
    """Row masks of (zero-byte matrix)^-(2^s) for s = 0 .. log2(max_bytes)-1."""
    byte_cols = [_advance(1 << j, 0, 8) for j in range(32)]
    inv = _gf2_inverse(byte_cols)
    stages, cols, s = [], inv, 1
    while s < max_bytes:
        rows = [sum(1 << j for j in range(32) if (cols[j] >> i) & 1) for i in range(32)]
        stages.append(tuple(rows))
        cols = [_apply_cols(cols, c) for c in cols]  # square: M^(2s)
        s <<= 1
    return tuple(stages)


def crc_unpad(m, state, k, max_bytes, name="unpad"):
    """Undo ``k`` (0 <= k < max_bytes) trailing zero bytes: state * x^(-8k)."""
    state = materialize(m, state, f"{name}_0")
    for s, rows in enumerate(_unpad_matrices(max_bytes)):
        if s >= len(k):
            break
        undone = Cat(*(_parity_mask(state, rows[i], 32) for i in range(32)))
        state = materialize(m, Mux(k[s], undone, state), f"{name}_{s + 1}")
    return state


def icrc_finish(m, state, k, max_bytes, name="icrc"):
    """The 32-bit ICRC value from the crc0 state of a zero-padded stream; wire bytes are its
    little-endian bytes (byte 0 = bits [0:8])."""
    return materialize(m, crc_unpad(m, state, k, max_bytes, name=f"{name}_unpad") ^ 0xFFFFFFFF,
                       f"{name}_value")
