# Ref: IBTA Vol 1 Annex A17 (RoCEv2: ICRC A17.8); RFC 3168 (ECN); RFC 791 (IPv4 checksum)
"""cocotb testbench of the switch model (``stellar.sim.switch``) and the recording host memory
(``stellar.sim.hostmem``) on a stand-in DUT, ``switch_loop`` (``tests/cocotb/test_switch_cocotb.py``).

The DUT replaces the two NIC cores with FIFOs, so frames can be put on and taken off the
network ports the real cores will have::

    a_s_axis_in -> FIFO (held while a_hold) -> a_m_axis_tx ==Link a->b==> b_s_axis_rx
        b_s_axis_rx -> FIFO (input stalled while b_rx_stall) -> b_m_axis_out
    (and the mirror b -> a);  s_axi -> wires -> m_axi (AXI4 pass-through)

``a_hold`` lets a test queue frames and release them as one back-to-back burst, so the link's
queue builds up and departures are serialized by the wire; ``b_rx_stall`` back-pressures the
link on purpose (a real MAC cannot be stalled). The input sources and output sinks run with
random idle cycles and backpressure; the link's own ports do not (the wire neither pauses a
transmitter nor inserts idle beats into a frame), except where a test stalls them.

Stream monitors on the link ports number edges with the links' :class:`ClockTimebase`, so
what they measure is compared to the model's log directly: arrival = edge the last beat left
``a_m_axis_tx``, departure = first edge ``b_s_axis_rx_tvalid`` was high for the frame.

Golden checks are scapy (ECN field, IPv4 checksum recomputed, ICRC recomputed by
``scapy.contrib.roce``), never the switch's own header walk.
"""

import logging
import math
import random
from fractions import Fraction

import cocotb
from cocotb.triggers import RisingEdge, Timer, with_timeout
from cocotbext.axi import (
    AxiBus,
    AxiMaster,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from . import packets
from .hostmem import RecordingAxiRam
from .switch import LinkConfig, Switch
from .tb import TB, pause_generator, tb_param

SIDES = ("a", "b")


# --------------------------------------------------------------------------------------------
# scapy golden checks (also used by tests/unit/test_switch.py)
# --------------------------------------------------------------------------------------------

def _ip_layer(frame):
    p = Ether(bytes(frame))
    if IP in p:
        return p, p[IP]
    if IPv6 in p:
        return p, p[IPv6]
    return p, None


def ip_ecn(frame):
    """ECN field as scapy dissects it (None: not IP)."""
    _, ip = _ip_layer(frame)
    if ip is None:
        return None
    return (ip.tos if isinstance(ip, IP) else ip.tc) & 3


def ipv4_checksum_ok(frame):
    """The IPv4 header checksum equals the one scapy computes for the header (True for IPv6)."""
    p, ip = _ip_layer(frame)
    if not isinstance(ip, IP):
        return True
    stored = ip.chksum
    ip = ip.copy()
    ip.remove_payload()
    del ip.chksum
    return IP(bytes(ip)).chksum == stored


def icrc_ok(frame):
    """The ICRC at the end of the IP packet equals the one scapy computes (A17.8)."""
    p, ip = _ip_layer(frame)
    end = len(p) - len(ip) + (ip.len if isinstance(ip, IP) else 40 + ip.plen)
    # Without the Ethernet padding: scapy would hang it under the BTH and cover it.
    q = Ether(bytes(frame)[:end])
    if ScapyBTH not in q:
        return False
    return q[ScapyBTH].compute_icrc(b"") == bytes(frame)[end - 4:end]


# --------------------------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------------------------

def tagged_frame(rng, seq, *, qp=0x11, ecn=2, length=None, roce=True):
    """A valid RoCEv2 RC SEND_ONLY (or a plain UDP frame) whose payload starts with ``seq``:
    random IPv4 (maybe with options) or IPv6, maybe VLAN-tagged. ``length``: payload bytes."""
    n = length if length is not None else rng.choice([rng.randint(4, 64), rng.randint(65, 400)])
    payload = seq.to_bytes(4, "big") + rng.randbytes(max(0, n - 4))
    ipv6 = rng.random() < 0.3
    vlan = (rng.randrange(8), rng.randrange(1, 4095)) if rng.random() < 0.3 else None
    opts = b"" if ipv6 or rng.random() < 0.6 else packets.ip_options_of_length(4 * rng.randint(1, 3), rng)
    if not roce:
        from scapy.layers.inet import UDP
        ip = (IPv6(src="fd00::1", dst="fd00::2", tc=ecn) if ipv6
              else IP(src="10.0.0.1", dst="10.0.0.2", tos=ecn))
        f = bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") / ip
                  / UDP(sport=1234, dport=5000) / payload)
        return f + bytes(max(0, 60 - len(f)))
    return packets.roce_frame(0x04, ipv6=ipv6, vlan=vlan, payload=payload, ecn=ecn, ip_options=opts,
                              bth={"dest_qp": qp, "psn": seq & 0xFFFFFF})


# --------------------------------------------------------------------------------------------
# Testbench
# --------------------------------------------------------------------------------------------

class StreamMonitor:
    """Per clock edge: for every frame on an AXI-Stream port, the edge it was first offered
    (``tvalid`` high), the edges its first and its last beat were taken, the edge its last beat
    was first offered, and its beats; and the number of edges ``tvalid`` was high with
    ``tready`` low (``stalls``)."""

    def __init__(self, dut, prefix, timebase):
        self.valid = getattr(dut, f"{prefix}_tvalid")
        self.ready = getattr(dut, f"{prefix}_tready")
        self.last = getattr(dut, f"{prefix}_tlast")
        self.clk = dut.clk
        self.timebase = timebase
        self.frames = []        # dicts: offered, first, last, beats
        self.stalls = 0
        cocotb.start_soon(self._run())

    async def _run(self):
        await self.timebase.measure()
        cur = beat_offered = None
        while True:
            await RisingEdge(self.clk)
            if not self.valid.value:
                continue
            edge = self.timebase.cycle()
            if cur is None:
                cur = {"offered": edge, "first": None, "last": None, "beats": 0}
            if beat_offered is None:
                beat_offered = edge
            if not self.ready.value:
                self.stalls += 1
                continue
            if cur["first"] is None:
                cur["first"] = edge
            cur["beats"] += 1
            if self.last.value:
                cur["last"] = edge
                cur["last_offered"] = beat_offered
                self.frames.append(cur)
                cur = None
            beat_offered = None


class SwitchTB(TB):
    def __init__(self, dut, config_ab=None, config_ba=None, pause=0.3):
        super().__init__(dut)
        self.width = len(dut.a_s_axis_in_tdata)
        self.nbytes = self.width // 8
        self.fifo_beats = tb_param("fifo_beats")
        self.inputs, self.outputs = {}, {}
        for x in SIDES:
            getattr(dut, f"{x}_hold").value = 0
            getattr(dut, f"{x}_rx_stall").value = 0
            src = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"{x}_s_axis_in"), dut.clk, dut.rst)
            sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"{x}_m_axis_out"), dut.clk, dut.rst)
            src.log.setLevel(logging.WARNING)       # no line per frame
            sink.log.setLevel(logging.WARNING)
            if pause:
                src.set_pause_generator(pause_generator(pause, name=f"{x}_in"))
                sink.set_pause_generator(pause_generator(pause * 2 / 3, name=f"{x}_out"))
            self.inputs[x], self.outputs[x] = src, sink
        self.switch = Switch.from_prefixes(dut, "a", "b", config_ab=config_ab or LinkConfig(),
                                           config_ba=config_ba or LinkConfig())
        tb_ab = self.switch.ab.timebase
        self.mon_tx = {"a": StreamMonitor(dut, "a_m_axis_tx", tb_ab),
                       "b": StreamMonitor(dut, "b_m_axis_tx", tb_ab)}
        self.mon_rx = {"b": StreamMonitor(dut, "b_s_axis_rx", tb_ab),
                       "a": StreamMonitor(dut, "a_s_axis_rx", tb_ab)}

    async def start(self):
        await self.reset()
        self.switch.start()

    async def send(self, side, frames):
        for f in frames:
            await self.inputs[side].send(AxiStreamFrame(f))

    async def trickle(self, side, frames, gap):
        """Send ``frames`` one at a time, ``gap`` cycles after each left the source."""
        for f in frames:
            await self.send(side, [f])
            await self.inputs[side].wait()
            await self.cycles(gap)

    async def burst(self, side, frames):
        """Queue ``frames`` in the DUT's TX FIFO, release them back to back, and return once
        the last one left ``{side}_m_axis_tx``."""
        beats = sum(-(-len(f) // self.nbytes) for f in frames)
        if beats > self.fifo_beats:
            raise ValueError(f"a burst of {beats} beats does not fit the {self.fifo_beats}-beat FIFO")
        hold = getattr(self.dut, f"{side}_hold")
        hold.value = 1
        before = len(self.mon_tx[side].frames)
        await self.send(side, frames)
        await with_timeout(self.inputs[side].wait(), 100, "us")
        await self.cycles(8)
        hold.value = 0
        for _ in range(10 * beats + 100):
            if len(self.mon_tx[side].frames) == before + len(frames):
                return
            await RisingEdge(self.dut.clk)
        raise TimeoutError("the burst did not leave the TX FIFO")

    async def collect(self, side, count, timeout_us=200):
        """``count`` frames from ``{side}_m_axis_out``, then anything more within 2 us."""
        out = []
        for _ in range(count):
            f = await with_timeout(self.outputs[side].recv(), timeout_us, "us")
            out.append(bytes(f.tdata))
        await Timer(2, "us")
        while not self.outputs[side].empty():
            out.append(bytes(self.outputs[side].recv_nowait().tdata))
        return out


def expected_departures(arrivals, lengths, delay, bpc, lanes, overhead=24, observed=None):
    """The wire schedule restated independently: frame i starts on the wire at
    ``s_i = max(s_{i-1} + (L_{i-1} + overhead) / B, a_i + delay, d_{i-1} + beats_{i-1})`` and is
    first offered at edge ``d_i = ceil(s_i)``.

    With a receiver that stalls, ``observed`` gives per frame what the monitor saw of the one
    before: ``(edge its last beat was first offered, edge it was taken)``. Then the stream term
    is ``last offered + 1`` (the source drives the next frame right after driving a last
    beat), the frame cannot be offered before ``last taken + 1``, and a frame offered later than
    scheduled starts the wire over at the edge it was offered.

    Returns the ``d_i``, which term set each ``s_i`` (``"arrival"``, ``"wire"``, ``"stream"``;
    ties go to the earlier name) and the summed lateness."""
    out, why = [], []
    s = w = beats = None
    late = 0
    for i, (a, n) in enumerate(zip(arrivals, lengths, strict=True)):
        cands = [(Fraction(a + delay), "arrival")]
        if s is not None:
            stream = out[-1] + beats if observed is None else observed[i - 1][0] + 1
            cands += [(s + w, "wire"), (Fraction(stream), "stream")]
        s = max(c for c, _ in cands)
        why.append(next(name for c, name in cands if c == s))
        d = math.ceil(s)
        if observed is not None and i > 0 and observed[i - 1][1] + 1 > d:
            late += observed[i - 1][1] + 1 - d
            d = observed[i - 1][1] + 1
            s = Fraction(d)
        w = Fraction(n + overhead, bpc)
        beats = -(-n // lanes)
        out.append(d)
    return out, why, late


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------

@cocotb.test()
async def wire_timing(dut):
    """A burst queues at the link: departures follow the exact wire schedule (fractional wire
    time, stream-limited frames at 512 bits); sparse frames leave exactly ``delay`` cycles after
    they arrive; jitter stays within its bound and keeps the order. Frames arrive intact."""
    delay = 20
    tb = SwitchTB(dut, LinkConfig(delay=delay, seed=1), LinkConfig(delay=delay, seed=2))
    await tb.start()
    rng = random.Random(cocotb.RANDOM_SEED)
    link = tb.switch.ab
    B = tb.nbytes
    # Lengths from minimum frames (stream-limited at 512 bits: 65..100 bytes need 2 beats in
    # fewer than 2 cycles of wire) to a few hundred bytes, including every residue modulo 8.
    burst = [tagged_frame(rng, i, length=rng.choice([10, 40, 50, 60, 70, 80, 200, 333]) + i % 8)
             for i in range(40)]
    await tb.burst("a", burst)
    await tb.switch.wait_idle()
    # Sparse frames: each finds the wire idle.
    sparse = [tagged_frame(rng, 100 + i, length=rng.randint(10, 100)) for i in range(12)]
    await tb.trickle("a", sparse, gap=60)
    await tb.switch.wait_idle()
    frames = burst + sparse
    got = await tb.collect("b", len(frames))
    assert got == frames, "frames changed or reordered on an unimpaired link"

    tx, rx = tb.mon_tx["a"].frames, tb.mon_rx["b"].frames
    assert len(tx) == len(rx) == len(frames)
    assert tb.mon_rx["b"].stalls == 0, "the DUT stalled the link; the exact check needs it not to"
    arrivals = [f["last"] for f in tx]
    departs = [f["offered"] for f in rx]
    want, why, _ = expected_departures(arrivals, [len(f) for f in frames], delay, B, B)
    assert departs == want, "\n".join(
        f"frame {i}: len {len(frames[i])} arrived {a} left {d}, expected {w}"
        for i, (a, d, w) in enumerate(zip(arrivals, departs, want, strict=True)) if d != w)
    # The model's log says the same.
    hist = list(link.history)
    assert [r.cycle_in for r in hist] == arrivals and [r.cycle_out for r in hist] == departs
    # Not vacuous: most of the burst queued behind the wire (fractional wire times), the sparse
    # frames met an idle wire, and at 512 bits short frames waited for the stream.
    # (At 512 bits the stream, whole beats per frame, is slower than the wire for most lengths.)
    queued = len(why) - why.count("arrival")
    idle = sum(1 for a, d in zip(arrivals, departs, strict=True) if d == a + delay)
    assert queued >= 30 and idle >= 12, (queued, idle)
    assert any(Fraction(len(f) + 24, B).denominator > 1 for f in burst)
    assert why.count("wire") >= (25 if B == 8 else 2) and why.count("stream") >= (0 if B == 8 else 5), why
    assert link.wire_busy_cycles == sum(Fraction(len(f) + 24, B) for f in frames)
    c = link.counters
    assert (c.frames_in, c.frames_out, c.bytes_in, c.bytes_out) == (
        len(frames), len(frames), sum(map(len, frames)), sum(map(len, frames)))

    # Jitter: every frame leaves within [arrival + delay, arrival + delay + jitter] when the
    # wire is idle, in order.
    link.set_config(LinkConfig(delay=delay, jitter=9))
    more = [tagged_frame(rng, 200 + i, length=rng.randint(10, 60)) for i in range(16)]
    await tb.trickle("a", more, gap=60)
    await tb.switch.wait_idle()
    assert await tb.collect("b", len(more)) == more
    waits = [r["offered"] - t["last"]
             for t, r in zip(tb.mon_tx["a"].frames[-16:], tb.mon_rx["b"].frames[-16:], strict=True)]
    assert all(delay <= w <= delay + 9 for w in waits), waits
    assert len(set(waits)) >= 3, f"jitter drew too few distinct delays: {waits}"
    tb.log.info("wire timing: %d queued, %d idle departures, starts set by %s; jitter waits %s",
                queued, idle, {k: why.count(k) for k in set(why)}, waits)
    tb.log.info("\n%s", tb.switch.summary(tb.switch.ab.timebase.cycle()))


def classify(out, inputs):
    """Match an output frame to its input: ``(input index, ecn_marked, corrupted)`` or None.

    Allowed differences: the IP ECN bits set to CE (with the IPv4 checksum word), and one
    flipped bit anywhere else; decided with scapy's view of the input."""
    for i, f in enumerate(inputs):
        if len(f) != len(out):
            continue
        diff = [k for k in range(len(f)) if f[k] != out[k]]
        if not diff:
            return i, False, False
        if len(diff) > 4:
            continue
        p, ip = _ip_layer(f)
        ecn_pos = set()
        if ip is not None:
            o = len(p) - len(ip)
            ecn_pos = {o + 1, o + 10, o + 11} if isinstance(ip, IP) else {o + 1}
        flips = [k for k in diff if k not in ecn_pos]
        ecn = ip_ecn(out) != ip_ecn(f)
        if len(flips) > 1 or (flips and bin(f[flips[0]] ^ out[flips[0]]).count("1") != 1):
            continue
        if not ecn and not flips and any(k in ecn_pos for k in diff):
            continue
        return i, ecn, bool(flips)
    return None


@cocotb.test()
async def impairments(dut):
    """Both directions at once with every impairment: each output frame is an input frame,
    unchanged, ECN-marked (CE, IPv4 checksum and ICRC still valid per scapy) or corrupted (one
    bit, ICRC wrong per scapy); dropped frames are missing, duplicates arrive twice, only held
    frames are overtaken, nothing leaves before arrival + delay; the scapy counts equal the
    link's counters."""
    cfg = {"ab": LinkConfig(drop=0.1, duplicate=0.1, reorder=0.1, corrupt=0.15, ecn_mark=0.4,
                            delay=30, jitter=6, reorder_depth=3, reorder_timeout=400, seed=11),
           "ba": LinkConfig(drop=0.15, duplicate=0.15, reorder=0.15, corrupt=0.1, ecn_mark=0.3,
                            delay=12, reorder_depth=2, reorder_timeout=300, seed=12)}
    tb = SwitchTB(dut, cfg["ab"], cfg["ba"])
    await tb.start()
    rng = random.Random(cocotb.RANDOM_SEED)
    n = 70
    sent = {}
    for x in SIDES:
        # Every 7th frame is plain UDP (never corrupted), every 5th Not-ECT (never marked).
        sent[x] = [tagged_frame(rng, i, roce=i % 7 != 3, ecn=0 if i % 5 == 1 else rng.choice((1, 2)))
                   for i in range(n)]
    await cocotb.triggers.Combine(cocotb.start_soon(tb.send("a", sent["a"])),
                                  cocotb.start_soon(tb.send("b", sent["b"])))
    for x in SIDES:
        await tb.inputs[x].wait()
    await tb.switch.wait_idle()
    for x, y, link in (("a", "b", tb.switch.ab), ("b", "a", tb.switch.ba)):
        c = link.counters
        got = await tb.collect(y, c.frames_out)
        assert len(got) == c.frames_out == n - c.dropped + c.duplicated, c
        seen = {}
        ecn = cor = 0
        order = []
        for k, g in enumerate(got):
            m = classify(g, sent[x])
            assert m is not None, f"{x}->{y} output {k} matches no input: {g[:64].hex()}"
            i, marked, corrupted = m
            seen[i] = seen.get(i, 0) + 1
            order.append(i)
            if marked:
                ecn += 1
                assert ip_ecn(g) == 3 and ip_ecn(sent[x][i]) in (1, 2)
                assert ipv4_checksum_ok(g), f"ECN-marked frame {i}: IPv4 checksum broken"
                if not corrupted and i % 7 != 3:
                    assert icrc_ok(g), f"ECN-marked frame {i}: ICRC broken"
            if corrupted:
                cor += 1
                assert i % 7 != 3 and not icrc_ok(g), f"corrupted frame {i} passes its ICRC"
            elif i % 7 != 3:
                assert icrc_ok(g)
        # Marked/corrupted counts are per input frame; a duplicate shows both copies.
        hist = [r for r in link.history if r.copy == 0]
        dup = {r.seq for r in hist if "dup" in r.action}
        dropped = {r.seq for r in hist if r.action == "drop"}
        assert ecn == sum(1 + (r.seq in dup) for r in hist if "ecn" in r.action) and ecn
        assert cor == sum(1 + (r.seq in dup) for r in hist if "corrupt" in r.action) and cor
        assert {i for i in range(n) if i not in seen} == dropped and dropped
        assert {i for i, k in seen.items() if k == 2} == dup and dup and max(seen.values()) == 2
        assert c.ecn_marked == len({r.seq for r in hist if "ecn" in r.action})
        assert not any(ip_ecn(sent[x][i]) == 0 and "ecn" in r.action for i, r in enumerate(hist))
        # Only held frames are overtaken: the rest leave in arrival order.
        held = {r.seq for r in hist if "reorder" in r.action or "held" in r.action}
        plain = [i for i in order if i not in held]
        assert plain == sorted(plain), f"{x}->{y}: unheld frames reordered: {plain}"
        overtaken = {i for k, i in enumerate(order) if any(j > i for j in order[:k])}
        assert overtaken <= held and overtaken and c.reordered >= len(overtaken)
        # Nothing leaves before arrival + delay (monitor edges, in arrival/departure order).
        tx, rx = tb.mon_tx[x].frames, tb.mon_rx[y].frames
        assert len(tx) == n and len(rx) == len(got)
        for k, i in enumerate(order):
            assert rx[k]["offered"] >= tx[i]["last"] + cfg[x + y].delay
        tb.log.info("%s->%s: %s", x, y, c)
    tb.log.info("\n%s", tb.switch.summary())


@cocotb.test()
async def cut_restore(dut):
    """``cut(predicate)`` black-holes one destination QP and nothing else; ``cut()`` everything;
    ``restore()`` brings the link back."""
    tb = SwitchTB(dut, LinkConfig(seed=3), LinkConfig(seed=4))
    await tb.start()
    rng = random.Random(cocotb.RANDOM_SEED)
    link = tb.switch.ab
    from .switch import bth_dest_qp
    phases = [[tagged_frame(rng, 10 * p + i, qp=(0x22 if i % 3 == 0 else 0x11))
               for i in range(9)] for p in range(3)]
    want = []
    for p, frames in enumerate(phases):
        if p == 1:
            link.cut(lambda f: bth_dest_qp(f) == 0x22)
        elif p == 2:
            link.restore()
        await tb.send("a", frames)
        await tb.inputs["a"].wait()
        await tb.switch.wait_idle()
        want += [f for f in frames if p != 1 or bth_dest_qp(f) != 0x22]
    link.cut()
    await tb.send("a", phases[0])
    await tb.inputs["a"].wait()
    await tb.switch.wait_idle()
    link.restore()
    got = await tb.collect("b", len(want))
    assert got == want
    assert link.counters.cut_dropped == 3 + 9
    assert [r.action for r in link.history][9:18] == ["cut" if i % 3 == 0 else "pass" for i in range(9)]


@cocotb.test()
async def backpressure(dut):
    """The receiving DUT stalls the link at random: frames still arrive intact and in order;
    each leaves exactly when the wire schedule says, or the edge after the receiver took the
    frame before it when that is later, and the wire restarts there; the link adds up the
    lateness in ``late_cycles``."""
    delay = 8
    tb = SwitchTB(dut, LinkConfig(delay=delay, seed=5), LinkConfig(seed=6))
    await tb.start()
    rng = random.Random(cocotb.RANDOM_SEED)
    stall_rng = random.Random(cocotb.RANDOM_SEED + 1)

    async def stall():
        # Stalls while the first half of the burst goes through; the rest drains at wire rate
        # behind the lateness the stalls left. Random stalls alone can leave no frame late
        # (seed 1740910991: 207 stalled edges, none past a departure), so after the third frame
        # the receiver also stalls for 64 clocks in a row, longer than the frames behind it
        # take on the wire.
        solid = 0
        while len(tb.mon_rx["b"].frames) < 20:
            await RisingEdge(dut.clk)
            if len(tb.mon_rx["b"].frames) == 3 and solid < 64:
                solid += 1
                dut.b_rx_stall.value = 1
            else:
                dut.b_rx_stall.value = int(stall_rng.random() < 0.3)
        dut.b_rx_stall.value = 0

    cocotb.start_soon(stall())
    frames = [tagged_frame(rng, i, length=rng.choice([10, 30, 100, 300])) for i in range(40)]
    await tb.burst("a", frames)
    await tb.switch.wait_idle()
    got = await tb.collect("b", len(frames))
    assert got == frames
    tx, rx = tb.mon_tx["a"].frames, tb.mon_rx["b"].frames
    observed = [(f["last_offered"], f["last"]) for f in rx]
    want, why, late = expected_departures([f["last"] for f in tx], [len(f) for f in frames], delay,
                                          tb.nbytes, tb.nbytes, observed=observed)
    departs = [f["offered"] for f in rx]
    assert departs == want, [(i, d, w) for i, (d, w) in enumerate(zip(departs, want, strict=True))
                             if d != w]
    link = tb.switch.ab
    assert [r.cycle_out for r in link.history] == departs
    assert link.counters.late_cycles == late
    # Not vacuous: the receiver stalled, frames left late, and the wire still set most starts.
    assert tb.mon_rx["b"].stalls > 0 and late > 0 and why.count("wire") >= 5, why
    tb.log.info("backpressure: %d stalled edges, %d late cycles, starts set by %s",
                tb.mon_rx["b"].stalls, late, {k: why.count(k) for k in set(why)})


@cocotb.test()
async def ram_writes(dut):
    """cocotbext-axi's AxiMaster writes through the DUT's AXI pass-through into a
    RecordingAxiRam: per-byte write counts, memory contents and the log match a reference that
    replays the same writes; back-door writes are not recorded; writes outside the counting
    window are counted apart and reported as stray."""
    tb = TB(dut)
    for x in SIDES:
        getattr(dut, f"{x}_hold").value = 0
        getattr(dut, f"{x}_rx_stall").value = 0
    master = AxiMaster(AxiBus.from_prefix(dut, "s_axi"), dut.clk, dut.rst)
    ram = RecordingAxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=1 << 20,
                          window=(0x1000, 0x8000))
    for ch, gen in ((master.write_if.aw_channel, "aw"), (master.write_if.w_channel, "w"),
                    (master.write_if.b_channel, "b"), (ram.write_if.aw_channel, "ram_aw"),
                    (ram.write_if.w_channel, "ram_w"), (ram.write_if.b_channel, "ram_b")):
        ch.set_pause_generator(pause_generator(0.3, name=gen))
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED)
    ref = bytearray(ram.fill_random(0, 0x10000, rng))     # back door: recorded nowhere
    ram.write(0x2000, b"\xAA" * 16)
    ref[0x2000:0x2010] = b"\xAA" * 16
    assert ram.write_map() == {} and ram.written_bytes_count() == 0
    counts = [0] * 0x10000
    total = 0
    ops = [(0x1000, 4096)]                                  # one exactly-once region
    ops += [(rng.randrange(0x2000, 0x8E00), rng.randint(1, 300)) for _ in range(25)]
    ops += [(0x9000 - 5, 12)]                               # straddles the window's end
    for addr, n in ops:
        data = rng.randbytes(n)
        await master.write(addr, data)
        ref[addr:addr + n] = data
        for a in range(addr, addr + n):
            counts[a] += 1
        total += n
    assert ram.read(0, 0x10000) == bytes(ref)
    assert ram.snapshot(0x1000, 4096) == bytes(ref[0x1000:0x2000])
    want_map = {a: min(c, 255) for a, c in enumerate(counts) if c}
    assert ram.write_map() == want_map
    assert ram.write_counts(0x1000, 0x8000) == bytes(min(c, 255) for c in counts[0x1000:0x9000])
    assert ram.written_bytes_count() == len(want_map)
    assert ram.bytes_written == total
    assert ram.write_faults(0x1000, 4096) == []
    assert ram.outside == {a: 1 for a in range(0x9000, 0x9007)}
    allowed = [(0x1000, 0x1000), (0x3000, 0x4000)]
    stray = [a for a, c in enumerate(counts)
             if c and not any(s <= a < s + k for s, k in allowed)]
    runs = []
    for a in stray:
        if runs and runs[-1][1] == a:
            runs[-1][1] = a + 1
        else:
            runs.append([a, a + 1])
    assert ram.writes_outside(allowed) == [tuple(r) for r in runs] and runs[-1] == [0x8FFB, 0x9007]
    # Replaying the log on the initial image gives the final one; its times never go back.
    img = bytearray(ref)
    for w in ram.writes:
        img[w.address:w.address + len(w.data)] = w.data
    assert img == ref and sum(len(w.data) for w in ram.writes) == total
    cycles = [w.cycle for w in ram.writes]
    assert None not in cycles and cycles == sorted(cycles)
    # A rewrite is reported as a fault with its count.
    a0 = 0x1800
    await master.write(a0, b"\x01\x02\x03")
    assert ram.write_faults(0x1000, 4096) == [(a0, a0 + 3, 2)]
    ram.clear_record()
    assert ram.write_map() == {} and ram.writes == []
