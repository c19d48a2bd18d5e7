# Ref: IEEE 802.3 clause 3.2.9 (CRC-32); IBTA Vol 1 Annex A17 (RoCEv2) A17.8 "ICRC".
"""stellar.hdl.net.crc and stellar.hdl.net.icrc against amaranth.lib.crc, zlib and scapy.

Golden references: the CRC-32 entry of ``amaranth.lib.crc.catalog`` (``CRC32_ETHERNET``, the
zlib CRC), the same algorithm with initial value 0 and no output XOR (the "crc0" the gateware
computes), ``zlib.crc32``, and the ICRC that scapy (``scapy.contrib.roce``) and real RoCE NICs
(``stellar.sim.captures``) put in frames. The gateware pieces run in the Amaranth simulator
inside tiny modules built here.
"""

import random
import zlib

import pytest
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import crc as libcrc
from amaranth.sim import Simulator
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.l2 import Ether
from stellar.hdl.net import crc as C
from stellar.hdl.net.icrc import IcrcLanes
from stellar.sim import captures
from stellar.sim import packets as P
from stellar.sim.amaranth_streams import run_seeds, seeded_rng

CRC32 = libcrc.catalog.CRC32_ETHERNET
CRC0 = libcrc.Algorithm(crc_width=32, polynomial=CRC32.polynomial, initial_crc=0,
                        reflect_input=True, reflect_output=True, xor_output=0)
SEED = run_seeds([1])[0]


def crc0(data, state=0):
    """crc0 (init ``state``, no output XOR) through zlib, whose ``value`` argument is a CRC
    after its output XOR."""
    return zlib.crc32(bytes(data), state ^ 0xFFFFFFFF) ^ 0xFFFFFFFF


def words(data, nbytes):
    return [int.from_bytes(data[i:i + nbytes], "little") for i in range(0, len(data), nbytes)]


def parity(x):
    return bin(x).count("1") & 1


def run_comb(m, testbench):
    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()


# --------------------------------------------------------------------------------------------
# References and the Python-level matrices
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nbits", [8, 64, 512])
def test_references_agree(nbits):
    rng = seeded_rng(f"crc-refs-{nbits}", SEED)
    nbytes = nbits // 8
    for n in (0, 1, 2, 5, 17):
        msg = rng.randbytes(n * nbytes)
        assert CRC32(data_width=nbits).compute(words(msg, nbytes)) == zlib.crc32(msg)
        assert CRC0(data_width=nbits).compute(words(msg, nbytes)) == crc0(msg)
        assert C.crc0_reference(msg) == crc0(msg)
    assert CRC32(data_width=8).compute(b"123456789") == 0xCBF43926   # the catalog's check value


@pytest.mark.parametrize("nbits", [8, 64, 512])
def test_step_matrices(nbits):
    """Output bit i of one word's update = parity(state & sm[i]) ^ parity(data & dm[i])."""
    rng = seeded_rng(f"crc-matrices-{nbits}", SEED)
    sm, dm = C.crc32_matrices(nbits)
    for _ in range(40):
        state, data = rng.getrandbits(32), rng.getrandbits(nbits)
        got = sum((parity(state & sm[i]) ^ parity(data & dm[i])) << i for i in range(32))
        assert got == crc0(data.to_bytes(nbits // 8, "little"), state)


def _apply_rows(rows, state):
    return sum(parity(state & rows[i]) << i for i in range(32))


@pytest.mark.parametrize("nbytes", [8, 64, 128])
def test_unpad_matrices(nbytes):
    """Python level: stage s undoes 2^s zero bytes, so the stages picked by the bits of k undo
    k zero bytes, for every k < nbytes."""
    rng = seeded_rng(f"crc-unpad-py-{nbytes}", SEED)
    stages = C._unpad_matrices(nbytes)
    assert len(stages) == (nbytes - 1).bit_length()
    for k in range(nbytes):
        msg = rng.randbytes(rng.randint(1, 40))
        state = crc0(msg + bytes(k))
        for s, rows in enumerate(stages):
            if k >> s & 1:
                state = _apply_rows(rows, state)
        assert state == crc0(msg), f"k={k}"


# --------------------------------------------------------------------------------------------
# Gateware
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nbits", [8, 64, 512])
def test_crc_step_gateware(nbits):
    """crc_step chained over whole words from 0xFFFFFFFF, output inverted, is the catalog CRC-32
    and zlib's; from 0 it is crc0."""
    rng = seeded_rng(f"crc-step-{nbits}", SEED)
    nbytes = nbits // 8
    m = Module()
    state = Signal(32)
    data = Signal(nbits)
    nxt = C.crc_step(m, state, data)
    msgs = [rng.randbytes(nbytes * n) for n in (1, 2, 7)]

    async def testbench(ctx):
        for msg in msgs:
            for init, xorout, ref in ((0xFFFFFFFF, 0xFFFFFFFF, CRC32), (0, 0, CRC0)):
                st = init
                for w in words(msg, nbytes):
                    ctx.set(state, st)
                    ctx.set(data, w)
                    st = ctx.get(nxt)
                assert st ^ xorout == ref(data_width=nbits).compute(words(msg, nbytes))
                if init:
                    assert st ^ xorout == zlib.crc32(msg)

    run_comb(m, testbench)


@pytest.mark.parametrize("nbytes", [8, 64])
def test_unpad_and_finish_gateware(nbytes):
    """For every k < B: crc_unpad turns crc0(m || k zero bytes) back into crc0(m), and
    icrc_finish gives zlib's CRC of m with its first 4 bytes inverted (FF FF FF FF || rest:
    the ICRC's 8 bytes of ones in the init-0 formulation)."""
    rng = seeded_rng(f"crc-unpad-{nbytes}", SEED)
    m = Module()
    state = Signal(32)
    k = Signal(range(nbytes))
    undone = C.crc_unpad(m, state, k, nbytes)
    finished = C.icrc_finish(m, state, k, nbytes)

    async def testbench(ctx):
        for pad in range(nbytes):
            rest = rng.randbytes(rng.randint(0, 90))
            msg = b"\xff" * 4 + rest
            ctx.set(state, crc0(msg + bytes(pad)))
            ctx.set(k, pad)
            assert ctx.get(undone) == crc0(msg), f"k={pad}"
            assert ctx.get(finished) == zlib.crc32(b"\xff" * 8 + rest), f"k={pad}"

    run_comb(m, testbench)


# --------------------------------------------------------------------------------------------
# ICRC: the init-0 formulation against scapy and real NICs
# --------------------------------------------------------------------------------------------

def _layout(frame):
    """(IP offset, IPv6?, UDP offset, end of the IP packet) of a RoCEv2 frame, from its bytes."""
    o = 18 if frame[12:14] == b"\x81\x00" else 14
    v6 = frame[o - 2:o] == b"\x86\xdd"
    if v6:
        return o, True, o + 40, o + 40 + int.from_bytes(frame[o + 4:o + 6], "big")
    return o, False, o + (frame[o] & 15) * 4, o + int.from_bytes(frame[o + 2:o + 4], "big")


def _masked(frame):
    """The IP packet up to the ICRC with the A17.8 variant fields set to ones."""
    o, v6, u, end = _layout(frame)
    pkt = bytearray(frame[o:end - 4])
    if v6:
        pkt[0] |= 0x0F                       # traffic class, high nibble (version stays)
        pkt[1:4] = b"\xff\xff\xff"           # traffic class, low nibble; flow label
        pkt[7] = 0xFF                        # hop limit
    else:
        pkt[1] = pkt[8] = 0xFF               # TOS, TTL
        pkt[10:12] = b"\xff\xff"             # header checksum
    pkt[u - o + 6:u - o + 8] = b"\xff\xff"   # UDP checksum
    pkt[u - o + 12] = 0xFF                   # BTH FECN, BECN, resv6
    return bytes(pkt)


def _frames():
    """Real RoCEv2 frames (one per file and length) and scapy-built ones of every shape."""
    out = []
    seen = set()
    for name, fs in captures.load_captures().items():
        for f in fs:
            if captures.is_rocev2(f) and (name, len(f)) not in seen:
                seen.add((name, len(f)))
                out.append(f)
    rng = random.Random(f"crc-frames:{SEED}")
    for ipv6, vlan, nopt in ((False, None, 0), (True, None, 0), (False, (3, 9), 40),
                             (True, (1, 2), 0), (False, None, 8)):
        for payload_len in (0, 1, 2, 3, 61):
            kw = P.random_roce(rng, 0x04, ipv6=ipv6, vlan=vlan, payload_len=payload_len,
                               ip_options=P.ip_options_of_length(nopt, rng) if nopt else b"")
            out.append(P.roce_frame(**kw))
    return out


FRAMES = _frames()


def test_init0_formulation_matches_scapy_and_nics():
    """ICRC = crc0(FF FF FF FF || masked packet) ^ 0xFFFFFFFF, unchanged by leading zero bytes
    (how the gateware skips the Ethernet header), equals scapy's ICRC and the wire's."""
    assert len(FRAMES) > 20
    for f in FRAMES:
        o, _, _, end = _layout(f)
        wire = f[end - 4:end]
        # Without the Ethernet padding: scapy's dissection would hang it under the BTH as a
        # Padding layer, and compute_icrc would cover it.
        scapy_icrc = Ether(f[:end])[ScapyBTH].compute_icrc(b"")
        masked = _masked(f)
        value = CRC0(data_width=8).compute(b"\xff" * 4 + masked) ^ 0xFFFFFFFF
        assert value.to_bytes(4, "little") == scapy_icrc == wire
        assert CRC0(data_width=8).compute(bytes(o - 4) + b"\xff" * 4 + masked) ^ 0xFFFFFFFF == value


@pytest.mark.parametrize("width", [64, 512])
def test_icrc_lanes_gateware(width):
    """IcrcLanes (masking, zeroing before the IP header and from the ICRC on) + crc_step +
    icrc_finish, fed the frame beat by beat, give the wire ICRC; bytes from the ICRC on are
    replaced by junk first, to show they do not count."""
    B = width // 8
    rng = seeded_rng(f"crc-icrc-lanes-{width}", SEED)
    m = Module()
    data = Signal(width)
    base = Signal(17)
    ip_off = Signal(5)
    udp_off = Signal(7)
    ipv6 = Signal()
    end = Signal(17)
    first = Signal()
    state = Signal(32)
    lanes = IcrcLanes(m, data, base, ip_off, udp_off, ipv6, end, B)
    nxt = Signal(32)
    m.d.comb += nxt.eq(Mux(lanes.update, lanes.step(state, first), state))
    finished = C.icrc_finish(m, state, lanes.k, B)

    async def testbench(ctx):
        for f in FRAMES:
            o, v6, u, ip_end = _layout(f)
            icrc_at = ip_end - 4
            frame = f[:icrc_at] + rng.randbytes(len(f) - icrc_at + rng.randint(0, B))
            ctx.set(ip_off, o)
            ctx.set(udp_off, u)
            ctx.set(ipv6, v6)
            ctx.set(end, icrc_at)
            st = rng.getrandbits(32)          # whatever the previous frame left
            for j in range(0, len(frame), B):
                ctx.set(base, j)
                ctx.set(first, j == 0)
                ctx.set(data, int.from_bytes(frame[j:j + B], "little"))
                ctx.set(state, st)
                st = ctx.get(nxt)
            ctx.set(state, st)
            assert ctx.get(finished).to_bytes(4, "little") == f[icrc_at:ip_end]

    run_comb(m, testbench)
