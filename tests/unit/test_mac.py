# Ref: IEEE 802.3-2018 clause 3 (frame format, padding, FCS), 4.4.2 (IFG); RGMII v2.0
"""stellar.hdl.mac: the GMII MAC, the width converters, MacCore's clock-domain crossing and the
RGMII encoding, in the Amaranth simulator.

References are independent of the RTL: ``zlib.crc32`` for the FCS (packed little-endian, as
802.3 sends it), the 802.3 rules written out in Python (preamble, SFD, padding to 60 bytes, gap
>= 12), and a greedy model of the receive FIFO (a frame of n bytes is kept iff the bytes already
queued plus n fit its depth) for overruns. Random tests print their seeds (replay one with
``STELLAR_SEED=<n>``).
"""

import zlib

import pytest
from amaranth.hdl import ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from stellar.hdl.axis import stream_to_axis
from stellar.hdl.mac.cdc import COUNTERS, BytePacker, ByteUnpacker, MacCore
from stellar.hdl.mac.gmii import GmiiRx, GmiiTx
from stellar.hdl.mac.rgmii import RgmiiPhy
from stellar.hdl.net.layout import beat_layout
from stellar.hdl.skid import SkidBuffer
from stellar.sim.amaranth_streams import FrameSink, FrameSource, run_seeds, run_streams, seeded_rng

PRE = bytes([0x55] * 7 + [0xD5])


def fcs(frame):
    return zlib.crc32(frame).to_bytes(4, "little")


def padded(frame):
    return frame + bytes(max(0, 60 - len(frame)))


def wire(frame, *, bad_fcs=False, preamble=PRE):
    """What 802.3 puts on GMII for ``frame`` (no FCS yet): preamble, SFD, padded frame, FCS."""
    body = padded(frame)
    f = fcs(body)
    if bad_fcs:
        f = bytes([f[0] ^ 0x01]) + f[1:]
    return preamble + body + f


# --- GmiiTx ----------------------------------------------------------------------------------

def run_tx(frames, *, ifg=12, gaps=None, hole=None, cycles_after=40):
    """Feed ``frames`` to GmiiTx (every byte offered as soon as the frame starts; ``gaps``:
    idle clocks before each frame; ``hole``: (frame, byte) index whose byte is withheld one
    clock). Returns the per-clock (txd, tx_en, tx_er) trace and the ``sent`` pulse count."""
    dut = GmiiTx(ifg=ifg)
    sim = Simulator(dut)
    sim.add_clock(8e-9)
    trace, sent = [], []
    gaps = gaps or [0] * len(frames)

    async def bench(ctx):
        queue = []
        for n, f in enumerate(frames):
            queue.append(("gap", gaps[n]))
            for k, b in enumerate(f):
                if hole == (n, k):
                    queue.append(("gap", 1))
                queue.append(("byte", b, k == len(f) - 1))
        pos, wait = 0, None
        total = sum(len(f) for f in frames) * 2 + 200 * len(frames) + cycles_after
        for _ in range(total):
            item = queue[pos] if pos < len(queue) else None
            if item and item[0] == "gap":
                if wait is None:
                    wait = item[1]
                if wait == 0:
                    pos, wait = pos + 1, None
                    item = queue[pos] if pos < len(queue) else None
                else:
                    wait -= 1
                    item = None
            if item and item[0] == "byte":
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload.data, item[1])
                ctx.set(dut.i.payload.last, item[2])
            else:
                ctx.set(dut.i.valid, 0)
            _, _, ready, txd, en, er, s = await ctx.tick().sample(dut.i.ready, dut.txd, dut.tx_en,
                                                                  dut.tx_er, dut.sent)
            trace.append((txd, en, er))
            sent.append(s)
            if item and item[0] == "byte" and ready:
                pos += 1

    sim.add_testbench(bench)
    sim.run()
    return trace, sum(sent)


def bursts(trace):
    """Split a GMII trace into (bytes, error flags, idle clocks before it) per TX_EN burst."""
    out, cur, errs, idle, seen = [], None, None, 0, False
    for txd, en, er in trace:
        if en:
            if cur is None:
                cur, errs = bytearray(), []
                out.append((cur, errs, idle if seen else None))
            cur.append(txd)
            errs.append(er)
        else:
            if cur is not None:
                seen, idle = True, 0
            cur = None
            idle += 1
    return out


def test_tx_framing_padding_fcs_ifg():
    """Every frame length around the 60-byte minimum and a few long ones, back to back: each
    burst is preamble + SFD + frame padded with zeros to 60 bytes + zlib CRC-32 FCS; no TX_ER;
    the gap between bursts is exactly 12 clocks when the next frame is already waiting (line
    rate) and never less."""
    frames = [bytes((n * 7 + k) & 0xFF for k in range(n)) for n in (1, 14, 59, 60, 61, 64, 200)]
    trace, sent = run_tx(frames)
    got = bursts(trace)
    assert len(got) == len(frames) and sent == len(frames)
    for n, (f, (data, errs, gap)) in enumerate(zip(frames, got, strict=True)):
        assert bytes(data) == wire(f), f"frame {n} ({len(f)} bytes)"
        assert not any(errs)
        if n:
            assert gap == 12, f"gap before frame {n}: {gap}"


@pytest.mark.parametrize("seed", run_seeds([11, 12]))
def test_tx_random_gaps(seed):
    """Random lengths (1..300) and random idle time between frames (0..30 clocks): every burst
    is exactly the 802.3 encoding of its frame and every gap is >= 12 clocks (exactly 12 when the
    frame was waiting)."""
    rng = seeded_rng("mac-tx-gaps", seed)
    frames = [rng.randbytes(rng.randint(1, 300)) for _ in range(12)]
    gaps = [rng.choice([0, 0, 3, 30]) for _ in frames]
    trace, sent = run_tx(frames, gaps=gaps)
    got = bursts(trace)
    assert [bytes(d) for d, _, _ in got] == [wire(f) for f in frames]
    assert sent == len(frames)
    for n, (_, _, gap) in enumerate(got[1:], 1):
        assert gap >= 12, f"gap before frame {n}: {gap}"


def test_tx_underrun_is_error_symbol():
    """A byte missing mid-frame goes out as an error symbol (TX_EN and TX_ER), so the link
    partner drops the frame; the frame's own bytes still follow."""
    f = bytes(range(80))
    trace, _ = run_tx([f], hole=(0, 30))
    (data, errs, _), = bursts(trace)
    assert sum(errs) == 1 and errs.index(1) == 8 + 30
    assert bytes(data[:38]) + bytes(data[39:]) == wire(f)


# --- GmiiRx ----------------------------------------------------------------------------------

class RxHarness(wiring.Component):
    """GmiiRx with its output counted into sync registers (one per pulse)."""

    def __init__(self, **kw):
        self.rx = GmiiRx(**kw)
        self.names = ("frame", "fcs_error", "phy_error", "runt", "oversize", "overrun")
        super().__init__({
            "rxd": In(8), "rx_dv": In(1), "rx_er": In(1),
            "o": Out(self.rx.o.signature),
            **{f"n_{k}": Out(16) for k in self.names},
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx = rx = self.rx
        m.d.comb += [rx.rxd.eq(self.rxd), rx.rx_dv.eq(self.rx_dv), rx.rx_er.eq(self.rx_er)]
        wiring.connect(m, rx.o, wiring.flipped(self.o))
        for k in self.names:
            with m.If(getattr(rx, k)):
                m.d.sync += getattr(self, f"n_{k}").eq(getattr(self, f"n_{k}") + 1)
        return m


def run_rx(events, *, expect_frames, p_ready=1.0, hold_until=0, rng=None, **kw):
    """Drive GMII per clock from ``events`` (a list of (rxd, rx_dv, rx_er)); collect byte frames
    from ``o`` with ready probability ``p_ready`` (ready held low for the first ``hold_until``
    clocks). Returns (frames, counters)."""
    dut = RxHarness(**kw)
    sim = Simulator(dut)
    sim.add_clock(8e-9)
    frames, counters = [], {}

    async def bench(ctx):
        cur = bytearray()
        n = 0
        while n < len(events) + 40 or len(frames) < expect_frames:
            d, dv, er = events[n] if n < len(events) else (0, 0, 0)
            ready = int(n >= hold_until and (p_ready >= 1.0 or rng.random() < p_ready))
            ctx.set(dut.rxd, d)
            ctx.set(dut.rx_dv, dv)
            ctx.set(dut.rx_er, er)
            ctx.set(dut.o.ready, ready)
            _, _, valid, data, last = await ctx.tick().sample(dut.o.valid, dut.o.payload.data,
                                                              dut.o.payload.last)
            if valid and ready:
                cur.append(data)
                if last:
                    frames.append(bytes(cur))
                    cur = bytearray()
            n += 1
            assert n < len(events) + 200_000, "receiver stopped delivering"
        assert not cur, "a partial frame came out"
        for k in dut.names:
            counters[k] = ctx.get(getattr(dut, f"n_{k}"))

    sim.add_testbench(bench)
    sim.run()
    return frames, counters


def gmii_events(items, ifg=12):
    """GMII clocks for ``items``: (wire bytes, index of a byte with RX_ER or None, gap after)."""
    ev = []
    for data, er_at, *gap in items:
        for k, b in enumerate(data):
            ev.append((b, 1, int(k == er_at)))
        ev += [(0, 0, 0)] * (gap[0] if gap else ifg)
    return ev


def rx_reference(cases, max_frame=1522, depth=None):
    """Spec model: the verdict of each case and the frames delivered. ``cases``: (frame bytes
    after SFD with FCS, rx_er flag). With ``depth`` (reader stalled throughout): greedy FIFO."""
    delivered, verdicts, used = [], [], 0
    for body, er in cases:
        if er:
            v = "phy_error"
        elif len(body) > max_frame:
            v = "oversize"
        elif len(body) < 64:
            v = "runt"
        elif zlib.crc32(body[:-4]).to_bytes(4, "little") != body[-4:]:
            v = "fcs_error"
        elif depth is not None and used + len(body) - 4 > depth:
            v = "overrun"
        else:
            v = "frame"
            used += len(body) - 4
            delivered.append(body[:-4])
        verdicts.append(v)
    return delivered, {k: verdicts.count(k) for k in
                       ("frame", "fcs_error", "phy_error", "runt", "oversize", "overrun")}


def random_rx_cases(rng, n, max_frame):
    """(wire bytes, er index or None, case for the model, gap after) for random frames: good,
    bad FCS, RX_ER, runts, oversize, short preambles."""
    items, cases = [], []
    for _ in range(n):
        kind = rng.choices(["good", "fcs", "er", "runt", "big"], [6, 2, 1, 1, 1])[0]
        length = {"runt": rng.randint(1, 59), "big": rng.randint(max_frame - 3, max_frame + 40)}.get(
            kind, rng.randint(60, 300))
        frame = rng.randbytes(length)
        pre = bytes([0x55] * rng.randint(0, 7) + [0xD5])
        body = frame + fcs(frame)
        if kind == "fcs":
            k = rng.randrange(len(body))
            body = body[:k] + bytes([body[k] ^ (1 << rng.randrange(8))]) + body[k + 1:]
        er_at = len(pre) + rng.randrange(len(body)) if kind == "er" else None
        if kind == "runt" and rng.random() < 0.5:
            body = body[:rng.randint(0, 4)]   # fragments shorter than an FCS, even empty
        items.append((pre + body, er_at, rng.choice([12, 12, 5, 40])))
        cases.append((body, kind == "er"))
    return items, cases


@pytest.mark.parametrize("seed", run_seeds([21, 22]))
def test_rx_random_verdicts(seed):
    """Random mix of good frames, bad FCS, RX_ER, runts (down to empty), oversize frames
    (max_frame = 200 here), short preambles and gaps down to 5 clocks, random backpressure:
    good frames come out byte-exact without FCS, in order, and every frame is counted under
    exactly the reason the model gives."""
    rng = seeded_rng("mac-rx-verdicts", seed)
    max_frame = 200
    items, cases = random_rx_cases(rng, 40, max_frame)
    want, want_counts = rx_reference(cases, max_frame)
    got, counts = run_rx(gmii_events(items), expect_frames=len(want), p_ready=0.7, rng=rng,
                         max_frame=max_frame, fifo_depth=1024)
    assert got == want
    assert counts == want_counts


def test_rx_back_to_back_min_ifg():
    """Thirty minimum-size and longer good frames with the minimum 12-clock gap (and then 1
    clock, which a receiver must also survive) all come out, byte-exact."""
    frames = [bytes([n]) * (60 + 17 * (n % 5)) for n in range(30)]
    items = [(wire(f), None, 12 if n < 20 else 1) for n, f in enumerate(frames)]
    got, counts = run_rx(gmii_events(items), expect_frames=len(frames))
    assert got == frames and counts["frame"] == len(frames)


@pytest.mark.parametrize("seed", run_seeds([31]))
def test_rx_overrun_drops_whole_frames(seed):
    """The reader stalls while 20 frames arrive into a 512-byte FIFO: exactly the frames the
    greedy model fits are kept (a later small frame still fits after a big one was dropped),
    the others are counted as overruns; after the stall the kept frames come out whole."""
    rng = seeded_rng("mac-rx-overrun", seed)
    frames = [rng.randbytes(rng.choice([60, 61, 90, 200, 300])) for _ in range(20)]
    items = [(wire(f), None, 12) for f in frames]
    events = gmii_events(items)
    cases = [(f + fcs(f), False) for f in frames]
    want, want_counts = rx_reference(cases, max_frame=400, depth=512)
    assert want_counts["overrun"] >= 3 and want_counts["frame"] >= 3
    got, counts = run_rx(events, expect_frames=len(want), hold_until=len(events) + 5,
                         max_frame=400, fifo_depth=512)
    assert got == want
    assert counts == want_counts


# --- width converters --------------------------------------------------------------------------

class ConvHarness(wiring.Component):
    """W-bit beats -> ByteUnpacker -> BytePacker -> W-bit beats."""

    def __init__(self, width):
        self.width = width
        super().__init__({"i": In(stream.Signature(beat_layout(width))),
                          "o": Out(stream.Signature(beat_layout(width))),
                          "mid_valid": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.unpack = unpack = ByteUnpacker(self.width)
        m.submodules.pack = pack = BytePacker(self.width)
        wiring.connect(m, wiring.flipped(self.i), unpack.i)
        wiring.connect(m, unpack.o, pack.i)
        wiring.connect(m, pack.o, wiring.flipped(self.o))
        m.d.comb += self.mid_valid.eq(unpack.o.valid)
        return m


@pytest.mark.parametrize("seed", run_seeds([41]))
@pytest.mark.parametrize("width", [64, 512])
def test_width_conversion(width, seed):
    """Frames of every tail length go W -> 8 -> W bits unchanged under random gaps and
    backpressure (null lanes carry junk on the way in)."""
    rng = seeded_rng(f"mac-width-{width}", seed)
    B = width // 8
    frames = [rng.randbytes(rng.randint(1, 3 * B)) for _ in range(25 if width == 64 else 10)]
    dut = ConvHarness(width)
    src = FrameSource(dut.i, frames, rng=rng, p_valid=0.6)
    sink = FrameSink(dut.o, len(frames), rng=rng, p_ready=0.6)
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def bench(ctx):
        await run_streams(ctx, src, sink, tail=20)

    sim.add_testbench(bench)
    sim.run()
    assert [f.data for f in sink.frames] == frames


@pytest.mark.parametrize("seed", run_seeds([41, 42]))
def test_skid_buffer(seed):
    """The two-entry register FIFO between the MAC's FIFOs: values come out in order, none lost
    or doubled, under random valid/ready; with both always high, one per clock after 1 clock."""
    rng = seeded_rng("mac-skid", seed)
    dut = SkidBuffer(8)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sent, got, trace = [], [], []
    values = [rng.randrange(256) for _ in range(300)]

    async def bench(ctx):
        pos = 0
        for n in range(900):
            steady = n < 40            # both sides always ready/valid at first
            v = pos < len(values) and (steady or rng.random() < 0.6)
            r = steady or rng.random() < 0.5
            ctx.set(dut.i.valid, v)
            if v:
                ctx.set(dut.i.payload, values[pos])
            ctx.set(dut.o.ready, r)
            _, _, iready, ovalid, odata = await ctx.tick().sample(dut.i.ready, dut.o.valid,
                                                                 dut.o.payload)
            trace.append((v and iready, ovalid and r))
            if v and iready:
                sent.append(values[pos])
                pos += 1
            if ovalid and r:
                got.append(odata)

    sim.add_testbench(bench)
    sim.run()
    assert got == sent == values
    taken = [t for t, _ in trace[:40]]
    given = [g for _, g in trace[:40]]
    assert all(taken) and given[0] == 0 and all(given[1:]), "not one per clock"


def test_unpacker_no_bubbles():
    """Back-to-back beats leave as one byte per clock: no idle clock between beats or frames."""
    width = 64
    frames = [bytes(range(20)), bytes(range(9)), bytes(range(16))]
    dut = ByteUnpacker(width)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    total = sum(len(f) for f in frames)
    out = []

    async def bench(ctx):
        beats = [b for f in frames for b in _beats(f, width // 8)]
        pos = 0
        ctx.set(dut.o.ready, 1)
        for _ in range(total + 4):
            if pos < len(beats):
                data, keep, last = beats[pos]
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload.data, data)
                ctx.set(dut.i.payload.keep, keep)
                ctx.set(dut.i.payload.last, last)
            else:
                ctx.set(dut.i.valid, 0)
            _, _, taken, ov, od, ol = await ctx.tick().sample(dut.i.ready, dut.o.valid,
                                                             dut.o.payload.data, dut.o.payload.last)
            if taken and pos < len(beats):
                pos += 1
            out.append((ov, od, ol))

    sim.add_testbench(bench)
    sim.run()
    valid = [v for v, _, _ in out]
    first = valid.index(1)
    assert all(valid[first:first + total]), "a bubble between beats"
    assert bytes(d for v, d, _ in out if v) == b"".join(frames)
    assert [n for n, (v, _, l) in enumerate(o for o in out if o[0]) if l] == [19, 28, 44]


def _beats(frame, nbytes):
    chunks = [frame[i:i + nbytes] for i in range(0, len(frame), nbytes)]
    return [(int.from_bytes(c, "little"), (1 << len(c)) - 1, k == len(chunks) - 1)
            for k, c in enumerate(chunks)]


# --- MacCore: loopback through the clock domains -----------------------------------------------

class LoopHarness(wiring.Component):
    """MacCore with GMII tx wired back to rx (eth_rx = eth_tx clock), beat streams on the
    core side and every counter accumulated in sync."""

    def __init__(self, width, **kw):
        self.mac = MacCore(width, **kw)
        super().__init__({"i": In(stream.Signature(beat_layout(width))),
                          "o": Out(stream.Signature(beat_layout(width))),
                          **{f"n_{k}": Out(16) for k in COUNTERS}})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = self.mac
        m.domains.eth_rx = ClockDomain("eth_rx")
        m.d.comb += [ClockSignal("eth_rx").eq(ClockSignal("eth_tx")),
                     ResetSignal("eth_rx").eq(ResetSignal("eth_tx"))]
        # core side
        m.d.comb += stream_to_axis(self.i, mac.s_axis_tx)
        rx = mac.m_axis_rx
        m.d.comb += [self.o.valid.eq(rx.tvalid), self.o.payload.data.eq(rx.tdata),
                     self.o.payload.keep.eq(rx.tkeep), self.o.payload.last.eq(rx.tlast),
                     rx.tready.eq(self.o.ready)]
        # the wire: one register, like a PHY's pipeline
        m.d.eth_tx += [mac.gmii.rxd.eq(mac.gmii.txd), mac.gmii.rx_dv.eq(mac.gmii.tx_en),
                       mac.gmii.rx_er.eq(mac.gmii.tx_er)]
        for k in COUNTERS:
            with m.If(getattr(mac.counters, k)):
                m.d.sync += getattr(self, f"n_{k}").eq(getattr(self, f"n_{k}") + 1)
        return m


def run_loop(width, frames, rng, *, p_valid, p_ready, sync_period, hold=0, **kw):
    dut = LoopHarness(width, **kw)
    sim = Simulator(dut)
    sim.add_clock(sync_period, domain="sync")
    sim.add_clock(8e-9, domain="eth_tx")
    src = FrameSource(dut.i, frames, rng=rng, p_valid=p_valid)
    result = {}

    async def bench(ctx):
        if hold:
            # The core refuses everything until every frame has been sent on the wire.
            ctx.set(dut.o.ready, 0)
            await run_streams(ctx, src)
            ctx.set(dut.i.valid, 0)       # run_streams leaves the last beat driven
            while ctx.get(dut.n_tx_frames) < len(frames):
                await ctx.tick()
            await ctx.tick().repeat(400)
        counts = {k: ctx.get(getattr(dut, f"n_{k}")) for k in COUNTERS}
        expect = len(frames) if not hold else counts["rx_frames"]
        sink = FrameSink(dut.o, expect, rng=rng, p_ready=p_ready)
        await run_streams(ctx, *([] if hold else [src]), sink, tail=200, timeout=50_000)
        result["frames"] = [f.data for f in sink.frames]
        result["counts"] = {k: ctx.get(getattr(dut, f"n_{k}")) for k in COUNTERS}

    sim.add_testbench(bench)
    sim.run()
    return result["frames"], result["counts"]


@pytest.mark.parametrize("seed", run_seeds([51]))
@pytest.mark.parametrize("width,sync_period", [(64, 6.4e-9), (512, 10e-9)])
def test_maccore_loopback(width, sync_period, seed):
    """Core -> AsyncFIFO -> eth_tx (unpack, packet FIFO, GmiiTx) -> wire -> GmiiRx -> pack ->
    AsyncFIFO -> core, with the core clock faster (64 bits) or slower (512 bits) than the
    Ethernet clock, random gaps and backpressure: every frame comes back padded to 60 bytes,
    byte-exact, and counted once as sent and once as received."""
    rng = seeded_rng(f"mac-loop-{width}", seed)
    frames = [rng.randbytes(rng.choice([1, 20, 59, 60, 64, 65, 130, 257])) for _ in range(10)]
    got, counts = run_loop(width, frames, rng, p_valid=0.7, p_ready=0.7, sync_period=sync_period)
    assert got == [padded(f) for f in frames]
    assert counts["tx_frames"] == counts["rx_frames"] == len(frames)
    assert sum(counts.values()) == 2 * len(frames)


@pytest.mark.parametrize("seed", run_seeds([61]))
def test_maccore_overrun_whole_frames(seed):
    """The core refuses received frames while 16 frames loop through a MAC with a 512-byte
    receive FIFO: some are dropped as overruns, and what the core then gets is an in-order
    subsequence of the sent frames, each whole and byte-exact, as many as rx_frames says."""
    rng = seeded_rng("mac-loop-overrun", seed)
    frames = [bytes([n]) + rng.randbytes(rng.choice([80, 150, 300]) - 1) for n in range(16)]
    got, counts = run_loop(64, frames, rng, p_valid=1.0, p_ready=0.8, sync_period=6.4e-9,
                           hold=True, max_frame=400, rx_fifo_bytes=512)
    assert counts["rx_overruns"] > 0 and counts["rx_frames"] > 0
    assert counts["rx_frames"] + counts["rx_overruns"] == len(frames) == counts["tx_frames"]
    assert len(got) == counts["rx_frames"]
    index = [f[0] for f in got]
    assert index == sorted(index)
    for g in got:
        assert g == frames[g[0]]


# --- RGMII encoding -------------------------------------------------------------------------

class RgmiiLoop(wiring.Component):
    """RgmiiPhy (modelled pins) with its TX pins wired to its RX pins, TX_CLK as RX_CLK. TX_CLK
    comes from ``eth_tx90``, a copy of ``eth_tx`` 2 ns late, as a PHY's clock delay would place it:
    with aligned edges the receive flops would sample exactly where the data changes."""

    def __init__(self):
        self.phy = RgmiiPhy(txc_domain="eth_tx90")
        super().__init__({"txd": In(8), "tx_en": In(1), "tx_er": In(1),
                          "rxd": Out(8), "rx_dv": Out(1), "rx_er": Out(1),
                          "pin_d": Out(4), "pin_ctl": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.phy = phy = self.phy
        m.domains.eth_tx90 = ClockDomain("eth_tx90", reset_less=True)
        m.domains.eth_rx = ClockDomain("eth_rx")
        m.d.comb += ClockSignal("eth_rx").eq(phy.rx_clk)
        m.submodules.eth_rx_rst = ResetSynchronizer(ResetSignal("eth_tx"), domain="eth_rx")
        g, p = phy.gmii, phy.pins
        m.d.comb += [g.txd.eq(self.txd), g.tx_en.eq(self.tx_en), g.tx_er.eq(self.tx_er),
                     self.rxd.eq(g.rxd), self.rx_dv.eq(g.rx_dv), self.rx_er.eq(g.rx_er),
                     p.rxd.eq(p.txd), p.rx_ctl.eq(p.tx_ctl), p.rxc.eq(p.txc),
                     self.pin_d.eq(p.txd), self.pin_ctl.eq(p.tx_ctl)]
        return m


def test_rgmii_encoding_and_loop():
    """On the pins, each byte is its low nibble with TX_EN in the clock's high half and its high
    nibble with TX_EN ^ TX_ER in the low half (sampled independently mid-half-period); looped
    back (TX_CLK as RX_CLK), the decoder returns the same (byte, dv, er) sequence 3 clocks later
    (output register, input register, decoder register)."""
    dut = RgmiiLoop()
    sim = Simulator(dut)
    sim.add_clock(8e-9, domain="eth_tx")
    sim.add_clock(8e-9, phase=6e-9, domain="eth_tx90")
    seq = [(b * 37 & 0xFF, int(b % 7 != 0), int(b % 11 == 3)) for b in range(1, 61)]
    pins, decoded = [], []

    async def drive(ctx):
        # eth_rx leaves reset (synchronized from eth_tx's) two of its clocks in.
        for d, en, er in [(0, 0, 0)] * 4 + seq + [(0, 0, 0)] * 6:
            ctx.set(dut.txd, d)
            ctx.set(dut.tx_en, en)
            ctx.set(dut.tx_er, er)
            _, _, rd, dv, rer = await ctx.tick("eth_tx").sample(dut.rxd, dut.rx_dv, dut.rx_er)
            decoded.append((rd, dv, rer))

    async def probe(ctx):
        await ctx.delay(6e-9)                 # mid high half after the first rising edge (4 ns)
        for _ in range(len(seq) + 8):
            hi = (ctx.get(dut.pin_d), ctx.get(dut.pin_ctl))
            await ctx.delay(4e-9)             # mid low half
            lo = (ctx.get(dut.pin_d), ctx.get(dut.pin_ctl))
            await ctx.delay(4e-9)
            pins.append((hi, lo))

    sim.add_testbench(drive)
    sim.add_testbench(probe, background=True)
    sim.run()
    enc = [((d & 0xF, en), (d >> 4, en ^ er)) for d, en, er in seq]
    assert enc[0] in pins, f"first byte's encoding {enc[0]} never on the pins: {pins[:12]}"
    start = pins.index(enc[0])
    assert pins[start:start + len(enc)] == enc
    assert seq[0] in decoded, f"first byte {seq[0]} never decoded: {decoded[:12]}"
    first = decoded.index(seq[0])
    assert decoded[first:first + len(seq)] == seq
    assert first == 4 + 3


def test_rgmii_hardware_buffers_elaborate():
    """With platform ports the PHY uses io.DDRBuffer (checked by building it for an ECP5
    platform's I/O buffers through Amaranth's netlist, without a toolchain)."""
    from amaranth.build import Pins, Resource, Subsignal
    from amaranth.vendor import LatticeECP5Platform

    class Plat(LatticeECP5Platform):
        device, package, speed = "LFE5U-25F", "BG256", "6"
        default_clk = "clk"
        resources = [
            Resource("clk", 0, Pins("P6", dir="i")),
            Resource("eth_rgmii", 0,
                     Subsignal("tx_clk", Pins("A1", dir="o")), Subsignal("tx_ctl", Pins("A2", dir="o")),
                     Subsignal("tx_data", Pins("A3 A4 A5 A6", dir="o")),
                     Subsignal("rx_clk", Pins("B1", dir="i")), Subsignal("rx_ctl", Pins("B2", dir="i")),
                     Subsignal("rx_data", Pins("B3 B4 B5 B6", dir="i"))),
        ]
        connectors = []

    class Top(wiring.Component):
        def __init__(self, rx_delay_taps=0):
            self.rx_delay_taps = rx_delay_taps
            super().__init__({})

        def elaborate(self, platform):
            m = Module()
            m.domains.eth_tx = ClockDomain("eth_tx")
            m.domains.sync = ClockDomain("sync")
            clk = platform.request("clk", 0, dir="-")
            from amaranth.lib import io
            m.submodules.clk = buf = io.Buffer("i", clk)
            m.d.comb += [ClockSignal("eth_tx").eq(buf.i), ClockSignal("sync").eq(buf.i)]
            m.submodules.phy = phy = RgmiiPhy(platform.request("eth_rgmii", 0, dir="-"),
                                              rx_delay_taps=self.rx_delay_taps)
            m.domains.eth_rx = ClockDomain("eth_rx")
            m.d.comb += ClockSignal("eth_rx").eq(phy.rx_clk)
            m.submodules.mac = mac = MacCore()
            wiring.connect(m, mac.gmii, phy.gmii)
            keep = Signal()
            m.d.sync += keep.eq(mac.m_axis_rx.tvalid)
            return m

    plan = Plat().prepare(Top(), name="rgmii_smoke")
    text = plan.files["rgmii_smoke.il"]
    assert text.count("IDDRX1F") == 5 and text.count("ODDRX1F") == 6
    assert "DELAYG" not in text

    # With an RX delay: a DELAYG in front of each of the five DDR inputs, 80 taps each.
    text = Plat().prepare(Top(rx_delay_taps=80), name="rgmii_delay").files["rgmii_delay.il"]
    assert text.count("cell \\DELAYG") == 5 and text.count("cell \\IDDRX1F") == 5
    assert text.count("parameter \\DEL_VALUE 80") == 5
    with pytest.raises(ValueError):
        RgmiiPhy(rx_delay_taps=3)          # no ports: nothing to delay
