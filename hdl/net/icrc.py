# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.8 "ICRC" (invariant-field masking for IPv4/IPv6)
"""Per-beat ICRC input masking, shared by the parser's checker and the deparser's generator.

The ICRC covers, in the init-0 formulation of ``stellar.hdl.net.crc``:
``FF FF FF FF`` (in the 4 bytes just before the IP header) || IP header || UDP || BTH ||
extension headers || payload || pad, with the variant fields forced to all ones:
IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label and hop limit; the UDP
checksum; BTH byte 4 (FECN, BECN, resv6). Ethernet/VLAN bytes before that are zeroed (no-ops
for an init-0 CRC); bytes from the ICRC on are zeroed. The parser and the deparser delay the
masked stream by ``(-end) mod B`` bytes so that the ICRC ends a word (leading zero bytes are
no-ops for the init-0 CRC); :class:`IcrcLanes` with ``crc_unpad`` / ``icrc_finish`` is the
undelayed form, which undoes the zero padding of the last word instead (used by ``test_crc``).
"""

from amaranth.hdl import Cat, Mux, Signal, signed, unsigned

from .crc import crc_step, materialize
from .layout import lane

__all__ = ["IcrcLanes", "icrc_capture", "icrc_delayed_word", "icrc_lane_ctrl", "icrc_mask",
           "icrc_overlay"]


def icrc_lane_ctrl(m, base, ip_off, udp_off, ipv6, end, nbytes, name="icrc"):
    """How the ICRC sees each lane of a beat whose lane 0 is absolute byte ``base`` (a multiple
    of ``nbytes``), as three ``nbytes``-bit vectors (one bit per lane; they do not depend on the
    data, so a pipeline can register them ahead of it): ``zero`` (the lane is left out: before
    the 4 bytes that precede the IP header, or from ``end`` on), ``ff`` (an all-ones byte: those
    4 bytes or a variant field), ``nib`` (the IPv6 first byte: its low nibble, the traffic
    class' high nibble, is forced to ones)."""
    # Compares against per-frame positions (ip_off + c, udp_off + c: small adders off the lane
    # path) rather than against lane - offset, so no lane address goes through an adder.
    ip_at = {c: materialize(m, ip_off + c, f"{name}_ip{c}") for c in (1, 2, 3, 7, 8, 10, 11)}
    udp_at = {c: materialize(m, udp_off + c, f"{name}_udp{c}") for c in (6, 7, 12)}
    ip_pre = materialize(m, ip_off - 4, f"{name}_ip_pre")
    zero, ff, nib = [], [], []
    for b in range(nbytes):
        a = Signal(unsigned(17), name=f"{name}_a{b}")
        m.d.comb += a.eq(base | b)        # base is a multiple of nbytes
        pre_ff = (a >= ip_pre) & (a < ip_off)
        v4_ff = ~ipv6 & ((a == ip_at[1]) | (a == ip_at[8]) | (a == ip_at[10]) | (a == ip_at[11]))
        v6_ff = ipv6 & ((a == ip_at[1]) | (a == ip_at[2]) | (a == ip_at[3]) | (a == ip_at[7]))
        l4_ff = (a == udp_at[6]) | (a == udp_at[7]) | (a == udp_at[12])  # UDP checksum, BTH 4
        zero.append((a < ip_pre) | (a >= end))
        ff.append(pre_ff | v4_ff | v6_ff | l4_ff)
        nib.append(ipv6 & (a == ip_off))          # version stays, traffic class high nibble
    return (materialize(m, Cat(*zero), f"{name}_zero"), materialize(m, Cat(*ff), f"{name}_ff"),
            materialize(m, Cat(*nib), f"{name}_nib"))


def icrc_mask(data, zero, ff, nib, nbytes):
    """The beat ``data`` as the ICRC sees it, from ``icrc_lane_ctrl``'s vectors: per bit
    ``~zero & (force | d)``, one LUT level."""
    out = []
    for b in range(nbytes):
        force = Cat(nib[b], nib[b], nib[b], nib[b], ff[b], ff[b], ff[b], ff[b]) | ff[b].replicate(8)
        out.append(Mux(zero[b], 0, lane(data, b) | force))
    return Cat(*out)


def icrc_delayed_word(m, data, zero, ff, nib, first, k, prev, nbytes, name, k_mod4=None):
    """The ICRC's input word for a beat of the stream delayed by ``k = (-end) mod nbytes``
    bytes, so that the ICRC ends a word. ``data`` and its lane controls (``zero``, ``ff``,
    ``nib``) come from registers; ``first`` marks a frame's first beat (nothing older to
    shift in); ``prev`` is the register the caller loads with the returned ``masked`` on
    every accepted beat. Returns ``(masked, word)``: this beat masked, and the delayed word,
    the top ``k`` bytes of the previous masked beat followed by the low ``nbytes - k`` of this
    one (leading zero bytes are no-ops for the init-0 CRC).

    ``k_mod4``: when the caller knows ``k % 4`` (the deparser: a RoCEv2 ICRC always starts at
    an offset that is 2 mod 4, so ``k % 4 == 2``), the shifter picks among ``nbytes / 4``
    positions (``k[2:]``) instead of ``nbytes`` (a 2:1 multiplexer at 64 bits, not 8:1)."""
    masked = materialize(m, icrc_mask(data, zero, ff, nib, nbytes), f"{name}_masked")
    lg = (nbytes - 1).bit_length()
    if not lg:
        return masked, masked
    older = Mux(first, 0, prev)
    both = Cat(older, masked)
    if k_mod4 is None or nbytes < 4:
        word = both.bit_select((nbytes - k[:lg]).as_unsigned() * 8, nbytes * 8)
    elif nbytes == 4:
        word = both[(4 - k_mod4) * 8:(8 - k_mod4) * 8]
    else:
        # nbytes - k = (4 - k_mod4) + 4 * (nbytes / 4 - 1 - k[2:]); the last term is ~k[2:]
        word = both[(4 - k_mod4) * 8:].bit_select((~k[2:lg]).as_unsigned() * 32, nbytes * 8)
    return masked, word


class IcrcLanes:
    """Combinational ICRC bookkeeping for one beat.

    Parameters: ``nbytes`` lanes per beat. Inputs (Values): ``base`` absolute byte offset of
    lane 0, ``ip_off`` (14 or 18), ``udp_off``, ``ipv6``, ``end`` (absolute offset of the first
    ICRC byte). Attributes after construction: ``masked`` (the beat as the CRC must see it),
    ``update`` (the beat holds CRC bytes), ``k`` (zero bytes padding the end, valid on the beat
    that holds byte end-1).
    """

    def __init__(self, m, data, base, ip_off, udp_off, ipv6, end, nbytes, name="icrc"):
        self.nbytes = nbytes
        zero, ff, nib = icrc_lane_ctrl(m, base, ip_off, udp_off, ipv6, end, nbytes, name=name)
        self.m = m
        self.name = name
        self.masked = materialize(m, icrc_mask(data, zero, ff, nib, nbytes), f"{name}_masked")
        self.update = base < end
        k = Signal(range(nbytes), name=f"{name}_k")
        m.d.comb += k.eq((-end)[:max(1, (nbytes - 1).bit_length())] if nbytes > 1 else 0)
        self.k = k

    def step(self, state, first):
        """Next CRC state: restart from 0 on the first beat of a frame."""
        return crc_step(self.m, Mux(first, 0, state), self.masked, name=f"{self.name}_crc")


def icrc_capture(old, data, base, end, nbytes):
    """The received ICRC (as a 32-bit value, wire byte 0 in bits [0:8]) after a beat whose lane 0
    is absolute byte ``base``: bytes ``end .. end+3`` that fall in this beat replace ``old``."""
    d = Signal(signed(17))
    d_eq = d.eq(end - base)
    out = []
    for i in range(4):
        pos = d + i
        hit = (pos >= 0) & (pos < nbytes)
        idx = pos[:max(1, (nbytes - 1).bit_length())]
        out.append(Mux(hit, data.word_select(idx, 8) if nbytes > 1 else data[:8], old[i * 8:i * 8 + 8]))
    return d_eq, Cat(*out)


def icrc_overlay(data, base, end, value, nbytes):
    """Write the 4 ICRC bytes of ``value`` at absolute offsets ``end .. end+3`` into a beat whose
    lane 0 is absolute byte ``base``."""
    d = Signal(signed(17))
    d_eq = d.eq(base - end)
    out = []
    for b in range(nbytes):
        pos = d + b
        hit = (pos >= 0) & (pos < 4)
        out.append(Mux(hit, value.word_select(pos[:2], 8), lane(data, b)))
    return d_eq, Cat(*out)
