"""stellar.hdl.dma: the AXI4 DMA engine in the Amaranth simulator, against a Python AXI4 slave.

The slave model (:class:`AxiSlave`) is a byte-array memory behind the five AXI4 channels, with
random ready/valid stalls on every channel and a random latency before each B response and each
read burst. On every AW/AR it checks the burst rules (INCR, full-width size, at most
``max_burst`` beats, no 4 KiB crossing, inside the memory), on every channel that a valid once
offered stays offered and unchanged until taken, that WLAST marks exactly the last beat of each
burst and that no byte below an unaligned start address is strobed. The references are
independent of the design: the memory after the run equals the initial random contents with
each command's bytes copied in command order (so no byte outside a written range changed); the
AW and AR sequences equal the bursts of a direct computation (beats cut at multiples of the
largest burst); each read returns the bytes of the memory; ``done`` pulses once per command,
in order, each after the last B response of its command, with the error flag of its bursts.
"""

from collections import deque

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from stellar.hdl.axil import FlatPorts
from stellar.hdl.dma import Axi4Signature, Dma
from stellar.hdl.dma.engine import cmd_layout
from stellar.hdl.net.layout import beat_layout
from stellar.sim.amaranth_streams import (
    FrameSink,
    FrameSource,
    ItemSource,
    pack_struct,
    run_seeds,
    run_streams,
    seeded_rng,
)

AXI_NAMES = ("awid awaddr awlen awsize awburst awlock awcache awprot awvalid awready wdata wstrb wlast "
             "wvalid wready bid bresp bvalid bready arid araddr arlen arsize arburst arlock arcache "
             "arprot arvalid arready rid rdata rresp rlast rvalid rready").split()
MASTER_IN = {"awready", "wready", "bid", "bresp", "bvalid", "arready", "rid", "rdata", "rresp",
             "rlast", "rvalid"}
OKAY, SLVERR = 0, 2


def expected_bursts(addr, length, nbytes, max_burst):
    """(address, beats) of each burst of one command: its address-aligned beats cut at every
    multiple of the largest burst (``max_burst`` beats, at most 4 KiB); the first burst keeps
    the command's byte address."""
    if length == 0:
        return []
    cb = min(max_burst, 4096 // nbytes)
    first, end = addr // nbytes, (addr + length - 1) // nbytes + 1
    out, beat = [], first
    while beat < end:
        stop = min(end, (beat // cb + 1) * cb)
        out.append((addr if beat == first else beat * nbytes, stop - beat))
        beat = stop
    return out


class AxiSlave:
    """AXI4 subordinate over a ``bytearray`` at bus address ``base``; a driver for
    ``run_streams`` (drives the ready and response signals, samples the rest each edge).

    ``p_ready``: probability of AWREADY / WREADY / ARREADY in a cycle; ``p_valid``: of offering
    a B response / R beat that is due; ``latency``: (lo, hi) cycles from the last W beat (or
    the AR) to the earliest B response (first R beat); ``p_error``: of a SLVERR on a B response
    or an R beat (writes still land, reads still return the data). ``max_writes`` /
    ``max_reads``: bursts the master may have outstanding (AW accepted, B not yet taken / AR
    accepted, last R not yet taken); ``rready_always``: the master promised never to hold off
    an R beat (its read buffer space is reserved at AR issue).
    """

    def __init__(self, axi, mem, base, *, rng, max_burst, p_ready=1.0, p_valid=1.0,
                 latency=(1, 1), p_error=0.0, max_writes=None, max_reads=None,
                 rready_always=True):
        self.axi, self.mem, self.base, self.rng = axi, mem, base, rng
        self.nbytes = len(axi.wdata) // 8
        self.max_burst = max_burst
        self.p_ready, self.p_valid, self.latency, self.p_error = p_ready, p_valid, latency, p_error
        self.max_writes, self.max_reads, self.rready_always = max_writes, max_reads, rready_always
        self.peak_writes = self.peak_reads = 0
        self.drives = (axi.awready, axi.wready, axi.arready, axi.bvalid, axi.bresp.as_value(),
                       axi.rvalid, axi.rresp.as_value(), axi.rlast, axi.rdata)
        self.samples = (axi.awvalid, axi.awaddr, axi.awlen, axi.awsize, axi.awburst.as_value(),
                        axi.awid, axi.wvalid, axi.wdata, axi.wstrb, axi.wlast, axi.bready,
                        axi.arvalid, axi.araddr, axi.arlen, axi.arsize, axi.arburst.as_value(),
                        axi.arid, axi.rready)
        self.done = True           # passive: the run ends when the streams are done
        self.edge = 0
        self.aw_log, self.ar_log = [], []          # (edge, addr, beats)
        self.w_edges, self.b_log = [], []          # W handshakes; (edge, resp) of each B
        self.r_errors = 0
        self._aw, self._w = deque(), deque()       # accepted, not yet matched
        self._b = deque()                          # [due edge, resp]
        self._r = deque()                          # [due edge, addr, beats, sent]
        self._drv = None
        self._held = {}                            # channel -> payload offered and not taken
        self._b_offer = self._r_offer = None

    @property
    def progress(self):
        return len(self.aw_log) + len(self.w_edges) + len(self.b_log) + len(self.ar_log)

    def idle(self):
        return not (self._aw or self._w or self._b or self._r or self._b_offer or self._r_offer)

    def _chance(self, p):
        return p >= 1.0 or self.rng.random() < p

    def drive(self):
        aw, w, ar = (self._chance(self.p_ready) for _ in range(3))
        if self._b_offer is None and self._b and self._b[0][0] <= self.edge and self._chance(self.p_valid):
            self._b_offer = self._b[0][1]
        if self._r_offer is None and self._r and self._r[0][0] <= self.edge and self._chance(self.p_valid):
            due, addr, beats, sent = self._r[0]
            at = addr // self.nbytes * self.nbytes + sent * self.nbytes - self.base
            data = int.from_bytes(self.mem[at:at + self.nbytes], "little")
            resp = SLVERR if self.p_error and self.rng.random() < self.p_error else OKAY
            self._r_offer = (data, resp, sent == beats - 1)
        bv, bresp = (0, 0) if self._b_offer is None else (1, self._b_offer)
        rv, (rdata, rresp, rlast) = (0, (0, 0, 0)) if self._r_offer is None else (1, self._r_offer)
        fields = (aw, w, ar, bv, bresp, rv, rresp, rlast, rdata)
        value, shift = 0, 0
        for sig, v in zip(self.drives, fields, strict=True):
            value |= int(v) << shift
            shift += len(sig)
        self._drv = fields
        return value

    def _stable(self, channel, valid, ready, payload):
        held = self._held.pop(channel, None)
        if held is not None:
            assert valid and payload == held, (
                f"edge {self.edge}: {channel} offered and not taken was withdrawn or changed: "
                f"{held} -> {payload if valid else 'valid low'}")
        if valid and not ready:
            self._held[channel] = payload

    def _check_burst(self, ch, addr, length, size, burst, ident):
        beats = length + 1
        nb = self.nbytes
        assert size == nb.bit_length() - 1, f"{ch} size {size} is not the bus width"
        assert burst == 1, f"{ch} burst type {burst} is not INCR"
        assert ident == 0, f"{ch} id {ident}"
        assert beats <= self.max_burst, f"{ch} {beats} beats > max_burst {self.max_burst}"
        aligned = addr // nb * nb
        assert aligned % 4096 + beats * nb <= 4096, f"{ch} {addr:#x}+{beats} beats crosses 4 KiB"
        assert self.base <= aligned and aligned + beats * nb <= self.base + len(self.mem), (
            f"{ch} {addr:#x} outside the memory")

    def sampled(self, edge, values):
        (awvalid, awaddr, awlen, awsize, awburst, awid, wvalid, wdata, wstrb, wlast, bready,
         arvalid, araddr, arlen, arsize, arburst, arid, rready) = values
        aw, w, ar, *_ = self._drv
        self._stable("AW", awvalid, aw, (awaddr, awlen, awsize, awburst, awid))
        self._stable("W", wvalid, w, (wdata, wstrb, wlast))
        self._stable("AR", arvalid, ar, (araddr, arlen, arsize, arburst, arid))
        if awvalid and aw:
            self._check_burst("AW", awaddr, awlen, awsize, awburst, awid)
            self.aw_log.append((edge, awaddr, awlen + 1))
            self._aw.append([awaddr, awlen + 1, 0])
        if wvalid and w:
            self.w_edges.append(edge)
            self._w.append((wdata, wstrb, wlast))
        while self._aw and self._w:
            self._write_beat(*self._w.popleft())
        if self._b_offer is not None and bready:
            self.b_log.append((edge, self._b_offer))
            self._b.popleft()
            self._b_offer = None
        if arvalid and ar:
            self._check_burst("AR", araddr, arlen, arsize, arburst, arid)
            self.ar_log.append((edge, araddr, arlen + 1))
            self._r.append([edge + self.rng.randint(*self.latency), araddr, arlen + 1, 0])
        assert not (self.rready_always and self._r_offer is not None and not rready), (
            f"edge {edge}: RREADY low with an R beat offered")
        writes = len(self.aw_log) - len(self.b_log)
        reads = len(self._r)
        self.peak_writes, self.peak_reads = max(self.peak_writes, writes), max(self.peak_reads, reads)
        assert self.max_writes is None or writes <= self.max_writes, f"edge {edge}: {writes} writes out"
        assert self.max_reads is None or reads <= self.max_reads, f"edge {edge}: {reads} reads out"
        if self._r_offer is not None and rready:
            self.r_errors += self._r_offer[1] != OKAY
            head = self._r[0]
            head[3] += 1
            if head[3] == head[2]:
                self._r.popleft()
            self._r_offer = None
        self.edge = edge + 1

    def _write_beat(self, data, strb, last):
        head = self._aw[0]
        addr, beats, n = head
        nb = self.nbytes
        at = addr // nb * nb + n * nb - self.base
        if n == 0:
            assert strb & ((1 << addr % nb) - 1) == 0, (
                f"edge {self.edge}: strobe {strb:#x} below the start address {addr:#x}")
        raw = data.to_bytes(nb, "little")
        for lane in range(nb):
            if strb >> lane & 1:
                self.mem[at + lane] = raw[lane]
        assert bool(last) == (n == beats - 1), (
            f"edge {self.edge}: WLAST {last} on beat {n} of a {beats}-beat burst")
        head[2] += 1
        if head[2] == beats:
            self._aw.popleft()
            resp = SLVERR if self.p_error and self.rng.random() < self.p_error else OKAY
            self._b.append([self.edge + self.rng.randint(*self.latency), resp])


class DoneWatch:
    """Records the edge and error flag of every ``done`` pulse (an always-ready stream)."""
    drives = ()

    def __init__(self, done, count):
        self.samples = (done.valid, done.payload.error)
        self.count = count
        self.pulses = []
        self.done = count == 0

    @property
    def progress(self):
        return len(self.pulses)

    def sampled(self, edge, values):
        if values[0]:
            self.pulses.append((edge, values[1]))
            assert len(self.pulses) <= self.count, f"edge {edge}: more done pulses than commands"
            self.done = len(self.pulses) == self.count


def random_commands(rng, nbytes, region, budget, *, aligned=False, min_len=0, max_len=9000):
    """(addr offset in the region, len) pairs: a mix of empty, short and long commands at
    random (or bus-aligned) offsets, about ``budget`` bytes in all."""
    cmds, total = [], 0
    while total < budget:
        r = rng.random()
        if r < 0.08:
            length = 0
        elif r < 0.4:
            length = rng.randint(1, 3 * nbytes)
        elif r < 0.8:
            length = rng.randint(1, min(1500, max_len))
        else:
            length = rng.randint(min(4000, max_len), max_len)
        length = max(length, min_len)
        start = rng.randrange(0, region - length + 1)
        if aligned:
            start = start // nbytes * nbytes
        if rng.random() < 0.15 and length <= 4096:     # straddle a 4 KiB boundary on purpose
            page = rng.randrange(1, region // 4096)
            start = page * 4096 - rng.randint(1, max(1, length - 1)) if length > 1 else start
        cmds.append((start, length))
        total += length
    # Always an empty command and one of the longest kind, somewhere in the run.
    for length in (0, max_len):
        if not any(n == length for _, n in cmds):
            cmds.insert(rng.randrange(len(cmds) + 1), (rng.randrange(0, region - length + 1), length))
    return cmds


class Bench:
    """A :class:`Dma` with a slave over a ``2 * region`` memory at a high bus address: writes
    go to the first half, reads come from the second (static) half."""

    BASE = 0x7FF0_0000_0000_0000 | 0x1234_5000_0000  # exercises the upper address bits

    def __init__(self, width, max_burst, rng, *, region=1 << 16, outstanding=16, buffer=None,
                 wr_outstanding=16):
        self.width, self.nbytes, self.max_burst, self.rng = width, width // 8, max_burst, rng
        self.region = region
        self.outstanding, self.wr_outstanding = outstanding, wr_outstanding
        self.dut = Dma(width, max_burst=max_burst, outstanding=outstanding, buffer=buffer,
                       wr_outstanding=wr_outstanding)
        self.mem = bytearray(rng.randbytes(2 * region))
        self.initial = bytes(self.mem)

    def run(self, wcmds, rcmds, *, p_ready=0.7, p_valid=0.7, latency=(1, 12), p_error=0.0,
            p_src=0.7, p_sink=0.6, timeout=5_000, lying_stream=False):
        """``lying_stream``: the write data carries random ``keep`` and ``last`` bits and junk
        in every lane past the command's bytes (the engine must go by ``len`` alone)."""
        dut, rng = self.dut, self.rng
        self.wcmds, self.rcmds = wcmds, rcmds
        self.payloads = [rng.randbytes(n) for _, n in wcmds]
        layout = cmd_layout()
        witems = [pack_struct(layout, {"addr": self.BASE + a, "len": n}) for a, n in wcmds]
        ritems = [pack_struct(layout, {"addr": self.BASE + self.region + a, "len": n})
                  for a, n in rcmds]
        self.slave = AxiSlave(dut.m_axi, self.mem, self.BASE, rng=rng, max_burst=self.max_burst,
                              p_ready=p_ready, p_valid=p_valid, latency=latency, p_error=p_error,
                              max_writes=self.wr_outstanding, max_reads=self.outstanding)
        self.wcmd_src = ItemSource(dut.wr_cmd, witems, rng=rng, p_valid=p_src)
        if lying_stream:
            beat, nb = beat_layout(self.width), self.nbytes
            beats = []
            for payload in self.payloads:
                for at in range(0, max(1, len(payload)), nb):
                    chunk = payload[at:at + nb]
                    data = int.from_bytes(chunk + rng.randbytes(nb - len(chunk)), "little")
                    beats.append(pack_struct(beat, {"data": data}, rng=rng))   # keep, last random
            self.wdata_src = ItemSource(dut.wr_data, beats, rng=rng, p_valid=p_src)
        else:
            self.wdata_src = FrameSource(dut.wr_data, self.payloads, rng=rng, p_valid=p_src)
        self.rcmd_src = ItemSource(dut.rd_cmd, ritems, rng=rng, p_valid=p_src)
        self.sink = FrameSink(dut.rd_data, len(rcmds), rng=rng, p_ready=p_sink, empty_ok=True)
        self.watch = DoneWatch(dut.wr_done, len(wcmds))
        drivers = (self.slave, self.wcmd_src, self.wdata_src, self.rcmd_src, self.sink, self.watch)
        sim = Simulator(dut)
        sim.add_clock(1e-8)
        out = {}

        async def bench(ctx):
            out["clocks"] = await run_streams(ctx, *drivers, timeout=timeout, tail=8)
            # Let the slave finish anything still in flight (there must be nothing).
            for _ in range(64):
                if self.slave.idle():
                    break
                await ctx.tick()
            out.update(wr_error=ctx.get(dut.wr_error), wr_errors=ctx.get(dut.wr_errors),
                       rd_error=ctx.get(dut.rd_error), rd_errors=ctx.get(dut.rd_errors))

        sim.add_testbench(bench)
        sim.run()
        self.out = out
        print(f"Dma({self.width}, max_burst={self.max_burst}): {out['clocks']} clocks, "
              f"{len(wcmds)} writes / {sum(n for _, n in wcmds)} B, {len(rcmds)} reads / "
              f"{sum(n for _, n in rcmds)} B, W beats {len(self.slave.w_edges)}, "
              f"o beats {sum(len(f.beats) for f in self.sink.frames)}, outstanding writes "
              f"{self.slave.peak_writes}, reads {self.slave.peak_reads}")
        return out

    def check(self):
        nb, mb, s = self.nbytes, self.max_burst, self.slave
        assert s.idle(), "transactions left in flight at the end"
        # Memory: the initial contents with every write applied in command order.
        ref = bytearray(self.initial)
        for (a, n), payload in zip(self.wcmds, self.payloads, strict=True):
            ref[a:a + n] = payload
        if self.mem != ref:
            bad = next(i for i in range(len(ref)) if self.mem[i] != ref[i])
            raise AssertionError(f"memory differs first at offset {bad:#x}: "
                                 f"{self.mem[bad]:#04x} != {ref[bad]:#04x}")
        # Bursts: exactly those of the direct computation, in command order.
        w_bursts = [expected_bursts(self.BASE + a, n, nb, mb) for a, n in self.wcmds]
        assert [(a, n) for _, a, n in s.aw_log] == [b for bs in w_bursts for b in bs]
        r_bursts = [expected_bursts(self.BASE + self.region + a, n, nb, mb) for a, n in self.rcmds]
        assert [(a, n) for _, a, n in s.ar_log] == [b for bs in r_bursts for b in bs]
        assert len(s.w_edges) == sum(n for bs in w_bursts for _, n in bs)
        # done: one per command, in order, after its last B, with the error of its bursts.
        assert len(self.watch.pulses) == len(self.wcmds)
        b_iter = iter(s.b_log)
        prev_edge = -1
        for k, ((edge, err), bursts) in enumerate(zip(self.watch.pulses, w_bursts, strict=True)):
            resps = [next(b_iter) for _ in bursts]
            if resps:
                assert edge > resps[-1][0], f"done of command {k} before its last B response"
            assert err == any(r != OKAY for _, r in resps), f"done error flag of command {k}"
            assert edge > prev_edge
            prev_edge = edge
        n_berr = sum(r != OKAY for _, r in s.b_log)
        assert self.out["wr_errors"] == n_berr and self.out["wr_error"] == (n_berr > 0)
        assert self.out["rd_errors"] == s.r_errors and self.out["rd_error"] == (s.r_errors > 0)
        # Reads: the memory's bytes, max(1, ceil(len/B)) beats each.
        assert len(self.sink.frames) == len(self.rcmds)
        for k, ((a, n), got) in enumerate(zip(self.rcmds, self.sink.frames, strict=True)):
            start = self.region + a
            assert got.data == self.initial[start:start + n], f"read {k} ({a:#x}+{n}) data"
            assert len(got.beats) == max(1, -(-n // nb)), f"read {k}: {len(got.beats)} beats"


# --- the bus signature -----------------------------------------------------------------------

def test_signature_names_flows_and_equality():
    sig = Axi4Signature(64, 512, 4)
    assert list(sig.members) == AXI_NAMES
    for name, member in sig.members.items():
        assert member.flow == (In if name in MASTER_IN else Out), name
    widths = {name: member.shape for name, member in sig.members.items()}
    assert (widths["awaddr"], widths["wdata"], widths["wstrb"], widths["rid"]) == (64, 512, 64, 4)
    assert Axi4Signature(64, 512, 4) == sig and hash(Axi4Signature(64, 512, 4)) == hash(sig)
    assert Axi4Signature(64, 64, 4) != sig and Axi4Signature(48, 512, 4) != sig
    assert Axi4Signature(64, 512, 2) != sig
    for bad in ({"data_width": 48}, {"id_width": 0}, {"addr_width": 8}):
        with pytest.raises(ValueError):
            Axi4Signature(**bad)


def test_flat_ports_export_m_axi():
    """A top with ``m_axi: Out(Axi4Signature)`` exports ``m_axi_<name>`` for every member, and
    the writer's always-ready ``done`` needs no ready port."""
    class Top(wiring.Component):
        m_axi: Out(Axi4Signature(64, 64, 4))

        def elaborate(self, platform):
            return Module()                     # only the ports matter here

    flat = FlatPorts(Top())
    assert sorted(flat.signature.members) == sorted(f"m_axi_{n}" for n in AXI_NAMES)
    dma = FlatPorts(Dma(64))
    names = set(dma.signature.members)
    assert {f"m_axi_{n}" for n in AXI_NAMES} <= names
    assert "wr_done_valid" in names and "wr_done_ready" not in names


@pytest.mark.parametrize("addr,length,nbytes,max_burst,expect", [
    (0, 0, 8, 256, []),
    (0x0FFF, 2, 8, 256, [(0x0FFF, 1), (0x1000, 1)]),
    (0x0FF8, 16, 64, 256, [(0x0FF8, 1), (0x1000, 1)]),
    (0x1000, 4096, 64, 256, [(0x1000, 64)]),
    (0x1001, 4096, 64, 256, [(0x1001, 64), (0x2000, 1)]),
    (0x10, 9000, 8, 256, [(0x10, 254), (0x800, 256), (0x1000, 256), (0x1800, 256),
                          (0x2000, 103)]),
    (0x3, 100, 8, 4, [(0x3, 4), (0x20, 4), (0x40, 4), (0x60, 1)]),
])
def test_expected_bursts_reference(addr, length, nbytes, max_burst, expect):
    """The reference splitting itself, on hand-computed cases."""
    assert expected_bursts(addr, length, nbytes, max_burst) == expect
    assert sum(n for _, n in expect) == (-(-(addr % nbytes + length) // nbytes) if length else 0)


# --- random traffic --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", run_seeds([1, 2]))
@pytest.mark.parametrize("width,max_burst,budget", [(64, 256, 40_000), (64, 16, 12_000),
                                                    (512, 256, 160_000)])
def test_random_traffic(width, max_burst, budget, seed):
    """Random stalls on every channel, random latencies, SLVERR on some responses; random
    lengths 0..9000 at random (also 4 KiB-straddling) addresses, reads and writes at once."""
    rng = seeded_rng(f"dma-random-{width}-{max_burst}", seed)
    bench = Bench(width, max_burst, rng)
    wcmds = random_commands(rng, width // 8, bench.region, budget)
    rcmds = random_commands(rng, width // 8, bench.region, budget)
    bench.run(wcmds, rcmds, p_error=0.05)
    bench.check()
    assert bench.out["wr_errors"] > 0 and bench.out["rd_errors"] > 0   # the error paths ran


@pytest.mark.parametrize("width,max_burst", [(16, 256), (32, 4), (128, 256), (256, 2), (1024, 256)])
def test_other_widths(width, max_burst):
    """Every power-of-two width from 16 to 1024 bits, short and long bursts, same checks."""
    rng = seeded_rng(f"dma-width-{width}", 9)
    bench = Bench(width, max_burst, rng, region=1 << 14)
    budget = min(5000, 100 * width)          # narrow buses take many beats per byte
    bench.run(random_commands(rng, width // 8, bench.region, budget, max_len=budget),
              random_commands(rng, width // 8, bench.region, budget, max_len=budget), p_error=0.05)
    bench.check()


@pytest.mark.parametrize("seed", run_seeds([7]))
@pytest.mark.parametrize("width", [64, 512])
def test_backpressured_output_small_buffer(width, seed):
    """The reader's output almost always stalled, with a buffer of one burst and two bursts
    outstanding: reads issue only into buffer space (RREADY never low under an R beat), never
    more than two at once, nothing is lost or deadlocks. The writer with two bursts outstanding
    and slow B responses likewise stays within its bound."""
    rng = seeded_rng(f"dma-stall-{width}", seed)
    nb = width // 8
    bench = Bench(width, 8, rng, region=1 << 14, outstanding=2, buffer=8, wr_outstanding=2)
    rcmds = random_commands(rng, nb, bench.region, 60 * nb, max_len=40 * nb)
    wcmds = random_commands(rng, nb, bench.region, 60 * nb, max_len=40 * nb)
    bench.run(wcmds, rcmds, p_sink=0.15, latency=(0, 3))
    bench.check()
    assert bench.slave.peak_reads == 2 and bench.slave.peak_writes == 2


@pytest.mark.parametrize("width", [64, 512])
def test_writer_goes_by_len_not_keep(width):
    """Write data whose ``keep`` and ``last`` are random and whose lanes past the command's
    bytes are junk: memory still gets exactly each command's ``len`` bytes, nothing else."""
    rng = seeded_rng(f"dma-lying-{width}", 5)
    bench = Bench(width, 256, rng, region=1 << 14)
    wcmds = random_commands(rng, width // 8, bench.region, 12_000, max_len=3000)
    bench.run(wcmds, [], lying_stream=True)
    bench.check()


# --- throughput and latency ------------------------------------------------------------------

@pytest.mark.parametrize("width", [64, 512])
def test_line_rate_and_latency(width):
    """Aligned back-to-back commands, a slave that never stalls: the W channel and ``o`` carry
    a beat in every cycle from their first beat to their last, across command boundaries; the
    first AW/AR and data come at the documented latencies."""
    rng = seeded_rng(f"dma-rate-{width}", 3)
    nb = width // 8
    bench = Bench(width, 256, rng)
    # Long and short commands, then a run of one-beat commands (one burst per clock).
    lengths = [1, nb, nb + 1, 5, 3 * nb, 2 * nb - 1, 7, 700, 1, 1, 4096, 33, 2 * nb, 1500, 1125]
    lengths += [rng.randint(1, nb) for _ in range(20)]
    wcmds = [(rng.randrange(0, bench.region - n) // nb * nb, n) for n in lengths]
    rcmds = [(rng.randrange(0, bench.region - n) // nb * nb, n) for n in reversed(lengths)]
    bench.run(wcmds, rcmds, p_ready=1.0, p_valid=1.0, latency=(2, 2), p_src=1.0, p_sink=1.0)
    bench.check()
    s = bench.slave
    w = s.w_edges
    assert len(w) == w[-1] - w[0] + 1, f"W: {len(w)} beats in {w[-1] - w[0] + 1} cycles"
    o = [c for f in bench.sink.frames for c in f.cycles]
    assert len(o) == o[-1] - o[0] + 1, f"o: {len(o)} beats in {o[-1] - o[0] + 1} cycles"
    # Latency from the first command transfer (see the DmaWriter / DmaReader docstrings).
    assert s.aw_log[0][0] - bench.wcmd_src.transfers[0].cycle == 2
    assert w[0] - bench.wcmd_src.transfers[0].cycle == 4
    assert s.ar_log[0][0] - bench.rcmd_src.transfers[0].cycle == 3
    first_r = s.ar_log[0][0] + 2                    # the slave's fixed read latency
    assert o[0] - first_r == 3
    # done: one cycle after the B response of each command's last burst.
    b_edges = [e for e, _ in s.b_log]
    lasts, k = [], 0
    for a, n in wcmds:
        k += len(expected_bursts(a, n, nb, 256))
        lasts.append(b_edges[k - 1])
    assert [e for e, _ in bench.watch.pulses] == [e + 1 for e in lasts]


@pytest.mark.parametrize("width", [64, 512])
def test_zero_length_latency(width):
    """Zero-length commands alone: no bus traffic, the writer's ``done`` 4 cycles and the
    reader's empty beat 5 cycles after the command transfer."""
    rng = seeded_rng(f"dma-zero-{width}", 8)
    bench = Bench(width, 256, rng, region=1 << 14)
    bench.run([(100, 0)], [(200, 0)], p_ready=1.0, p_valid=1.0, p_src=1.0, p_sink=1.0)
    bench.check()
    assert not (bench.slave.aw_log or bench.slave.ar_log or bench.slave.w_edges)
    assert bench.watch.pulses[0][0] - bench.wcmd_src.transfers[0].cycle == 4
    assert bench.sink.frames[0].cycles[0] - bench.rcmd_src.transfers[0].cycle == 5


@pytest.mark.parametrize("latency", [2, 10])
def test_line_rate_under_latency(latency):
    """The documented in-flight bounds for a slave answering ``latency`` cycles late: with
    ``outstanding = L + 2`` (reads) / ``L + 4`` (writes) one-beat commands run at one beat per
    clock, and so do long reads with a buffer of ``L + 3 + b`` beats for ``b``-beat bursts;
    one less of each falls short, so the bounds are tight."""
    def rate(outstanding, wr_outstanding, buffer, lengths):
        rng = seeded_rng(f"dma-latency-{latency}", 6)
        bench = Bench(64, 8, rng, region=1 << 14, outstanding=outstanding, buffer=buffer,
                      wr_outstanding=wr_outstanding)
        cmds = [(rng.randrange(0, bench.region - n) // 8 * 8, n) for n in lengths]
        bench.run(cmds, cmds, p_ready=1.0, p_valid=1.0, latency=(latency, latency), p_src=1.0,
                  p_sink=1.0)
        bench.check()
        o = [c for f in bench.sink.frames for c in f.cycles]
        w = bench.slave.w_edges
        return len(o) / (o[-1] - o[0] + 1), len(w) / (w[-1] - w[0] + 1)

    L = latency
    assert rate(L + 2, L + 4, 64, [8] * 60) == (1.0, 1.0)
    r_rate, w_rate = rate(L + 1, L + 3, 64, [8] * 60)
    assert r_rate < 1.0 and w_rate < 1.0
    assert rate(64, 64, L + 3 + 8, [512] * 6)[0] == 1.0
    assert rate(64, 64, L + 2 + 8, [512] * 6)[0] < 1.0


@pytest.mark.parametrize("width", [64, 512])
def test_unaligned_costs_at_most_one_cycle(width):
    """Unaligned commands back to back, no stalls: the writer's W channel spends at most one
    extra beat per command (the beats the bytes span on the bus), the reader at most one extra
    cycle per command."""
    rng = seeded_rng(f"dma-unaligned-{width}", 4)
    nb = width // 8
    bench = Bench(width, 256, rng)
    cmds = []
    for _ in range(24):
        n = rng.choice([1, nb - 1, nb, nb + 3, 5 * nb, rng.randint(1, 2000)])
        cmds.append((rng.randrange(0, bench.region - n - nb) // nb * nb + rng.randint(1, nb - 1), n))
    bench.run(cmds, cmds, p_ready=1.0, p_valid=1.0, latency=(2, 2), p_src=1.0, p_sink=1.0)
    bench.check()
    w = bench.slave.w_edges
    bus_beats = sum(-(-(a % nb + n) // nb) for a, n in cmds)
    assert len(w) == bus_beats and w[-1] - w[0] + 1 == bus_beats
    o = [c for f in bench.sink.frames for c in f.cycles]
    assert o[-1] - o[0] + 1 <= len(o) + len(cmds)
