"""stellar.hdl.csr: the AXI4-Lite CSR bank in the Amaranth simulator, and its Verilog port names."""

import os
import random
import re

import pytest
from amaranth.back import verilog
from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from stellar.hdl.axil import AxiLiteSignature, FlatPorts, Resp
from stellar.hdl.csr import AxiLiteCsrBank, block_signature
from stellar.hdl.regmap import (
    MAGIC,
    REGMAP,
    Block,
    Register,
    RegisterMap,
    decode_feature,
    pktengine_config,
)

# Fixed seeds keep CI reproducible; STELLAR_SEED=<n> replays (or explores) one seed.
SEEDS = [int(os.environ["STELLAR_SEED"])] if "STELLAR_SEED" in os.environ else [1, 2, 3, 4]


class AxiLiteMaster:
    """Cycle-level AXI4-Lite manager for the Amaranth simulator, with protocol checks.

    Every channel runs independently: a request is presented after a random delay
    (``p_valid`` per clock), held with stable payload until its handshake, and random junk is
    driven on address/data while valid is low. ``bready``/``rready`` are high with probability
    ``p_ready`` per clock. Checks: a pending B/R response stays valid and unchanged until taken,
    no response arrives for a request not yet accepted, and nothing is left over at the end.
    """

    def __init__(self, bus, *, rng=None, p_valid=1.0, p_ready=1.0, timeout=20_000):
        self.bus = bus
        self.rng = rng or random.Random(0)
        self.p_valid = p_valid
        self.p_ready = p_ready
        self.timeout = timeout
        self.addr_width = len(bus.awaddr)

    def _chance(self, p):
        return p >= 1.0 or self.rng.random() < p

    async def run(self, ctx, writes=(), reads=()):
        """``writes``: ``(addr, data, strb)``; ``reads``: addresses. Both lists are issued
        concurrently. Returns ``(bresps, [(rdata, rresp), ...])`` in issue order."""
        bus, rng = self.bus, self.rng
        writes, reads = list(writes), list(reads)
        assert not ctx.get(bus.bvalid) and not ctx.get(bus.rvalid), "response without a request"
        aw_i = w_i = ar_i = 0
        aw_on = w_on = ar_on = False
        bresps, rresults = [], []
        held_b = held_r = None  # response seen but not taken last clock: must persist unchanged
        for _ in range(self.timeout):
            if len(bresps) == len(writes) and len(rresults) == len(reads):
                break
            # Once raised, valid stays high until the handshake (AXI A3.2.1).
            aw_on = aw_on or (aw_i < len(writes) and self._chance(self.p_valid))
            w_on = w_on or (w_i < len(writes) and self._chance(self.p_valid))
            ar_on = ar_on or (ar_i < len(reads) and self._chance(self.p_valid))
            bready, rready = self._chance(self.p_ready), self._chance(self.p_ready)

            ctx.set(bus.awvalid, aw_on)
            ctx.set(bus.awaddr, writes[aw_i][0] if aw_on else rng.getrandbits(self.addr_width))
            ctx.set(bus.awprot, rng.getrandbits(3))
            ctx.set(bus.wvalid, w_on)
            ctx.set(bus.wdata, writes[w_i][1] if w_on else rng.getrandbits(32))
            ctx.set(bus.wstrb, writes[w_i][2] if w_on else rng.getrandbits(4))
            ctx.set(bus.arvalid, ar_on)
            ctx.set(bus.araddr, reads[ar_i] if ar_on else rng.getrandbits(self.addr_width))
            ctx.set(bus.arprot, rng.getrandbits(3))
            ctx.set(bus.bready, bready)
            ctx.set(bus.rready, rready)

            b = (ctx.get(bus.bresp),) if ctx.get(bus.bvalid) else None
            r = (ctx.get(bus.rdata), ctx.get(bus.rresp)) if ctx.get(bus.rvalid) else None
            if held_b is not None:
                assert b == held_b, f"B response dropped or changed under backpressure: {held_b} -> {b}"
            if held_r is not None:
                assert r == held_r, f"R response dropped or changed under backpressure: {held_r} -> {r}"
            aw_fire = aw_on and ctx.get(bus.awready)
            w_fire = w_on and ctx.get(bus.wready)
            ar_fire = ar_on and ctx.get(bus.arready)
            if b is not None and bready:
                assert len(bresps) < min(aw_i, w_i), "B response for a write not yet accepted"
                bresps.append(b[0])
            if r is not None and rready:
                assert len(rresults) < ar_i, "R response for a read not yet accepted"
                rresults.append(r)
            held_b = b if b is not None and not bready else None
            held_r = r if r is not None and not rready else None

            await ctx.tick()
            if aw_fire:
                aw_on, aw_i = False, aw_i + 1
            if w_fire:
                w_on, w_i = False, w_i + 1
            if ar_fire:
                ar_on, ar_i = False, ar_i + 1
        else:
            raise AssertionError(f"bus hung: {len(bresps)}/{len(writes)} B, {len(rresults)}/{len(reads)} R")
        for sig in (bus.awvalid, bus.wvalid, bus.arvalid, bus.bready, bus.rready):
            ctx.set(sig, 0)
        assert not ctx.get(bus.bvalid) and not ctx.get(bus.rvalid), "extra response"
        return bresps, rresults

    async def write(self, ctx, addr, data, strb=0xF):
        (resp,), _ = await self.run(ctx, writes=[(addr, data, strb)])
        return resp

    async def read(self, ctx, addr):
        _, ((data, resp),) = await self.run(ctx, reads=[addr])
        return data, resp


def simulate(dut, *benches):
    sim = Simulator(dut)
    sim.add_clock(10e-9)
    for bench in benches:
        sim.add_testbench(bench)
    sim.run()


def addr(name, regmap=REGMAP):
    return regmap[name].offset


def make_test_map():
    """A map with every access kind and odd widths, plus a second block of counters."""
    test = Block("test", 0x100, 1, "test block", [
        Register("ctrl", 0x00, 32, "rw", "32-bit control", init=0x12345678),
        Register("narrow", 0x04, 12, "rw", "12-bit control", init=0xABC),
        Register("flag", 0x08, 1, "rw", "1-bit control", init=1),
        Register("status", 0x0C, 20, "ro", "20-bit status"),
        Register("events", 0x10, 32, "counter", "events"),
        Register("drops", 0x14, 32, "counter", "drops"),
        Register("clear", 0x18, 1, "clear", "clears events and drops"),
        Register("go", 0x1C, 10, "command", "10-bit command"),
    ], feature=0x7E)
    other = Block("other", 0x200, 1, "other block", [
        Register("hits", 0x00, 32, "counter", "hits"),
        Register("clear", 0x04, 1, "clear", "clears hits"),
    ], feature=0x7F)
    return RegisterMap([test, other])


# --- identification and discovery ---------------------------------------------------------

def test_ident_and_feature_walk():
    dut = AxiLiteCsrBank()

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        assert await bus.read(ctx, 0x00) == (MAGIC, Resp.OKAY)
        assert await bus.read(ctx, 0x04) == (0x000100, Resp.OKAY)
        count, resp = await bus.read(ctx, 0x0C)
        assert resp == Resp.OKAY and count == REGMAP["ident.feature_count"].init >= 1
        found = []
        for i in range(count):
            word, resp = await bus.read(ctx, 0x10 + 4 * i)
            assert resp == Resp.OKAY
            found.append(decode_feature(word))
        assert found == [(b.feature, b.version, b.base) for b in REGMAP.blocks[1:]]
        # Bits 1:0 of the address are ignored: every access is a whole word.
        assert await bus.read(ctx, 0x02) == (MAGIC, Resp.OKAY)

    simulate(dut, bench)


def test_ro_register_reads_its_port():
    dut = AxiLiteCsrBank()

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        for width in (64, 512):
            ctx.set(dut.pktengine.config, pktengine_config(width))
            assert await bus.read(ctx, addr("pktengine.config")) == (width // 8, Resp.OKAY)

    simulate(dut, bench)


# --- rw registers -------------------------------------------------------------------------

def test_scratch_round_trip():
    dut = AxiLiteCsrBank()

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        scratch = addr("ident.scratch")
        assert await bus.read(ctx, scratch) == (0, Resp.OKAY)
        for pattern in (0xFFFFFFFF, 0xA5A55A5A, 0x00000001, 0x80000000, 0):
            assert await bus.write(ctx, scratch, pattern) == Resp.OKAY
            assert ctx.get(dut.ident.scratch) == pattern
            assert await bus.read(ctx, scratch) == (pattern, Resp.OKAY)
        # The register next to it did not move.
        assert await bus.read(ctx, 0x00) == (MAGIC, Resp.OKAY)

    simulate(dut, bench)


def test_wstrb_byte_lanes():
    dut = AxiLiteCsrBank()

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        scratch = addr("ident.scratch")
        for strb in range(16):
            assert await bus.write(ctx, scratch, 0xFFFFFFFF) == Resp.OKAY
            assert await bus.write(ctx, scratch, 0x11223344, strb) == Resp.OKAY
            mask = sum(0xFF << (8 * i) for i in range(4) if strb >> i & 1)
            expected = (0x11223344 & mask) | (0xFFFFFFFF & ~mask)
            assert await bus.read(ctx, scratch) == (expected, Resp.OKAY), f"wstrb={strb:04b}"

    simulate(dut, bench)


@pytest.mark.parametrize("shadow_rw", [8, 1], ids=["registers", "copy"])
def test_rw_width_and_init(shadow_rw):
    regmap = make_test_map()
    dut = AxiLiteCsrBank(regmap, shadow_rw=shadow_rw)   # 1: the test group reads from its copy

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        # Reset values reach both the bus and the output ports.
        for name, init in (("ctrl", 0x12345678), ("narrow", 0xABC), ("flag", 1)):
            assert await bus.read(ctx, addr(f"test.{name}", regmap)) == (init, Resp.OKAY)
            assert ctx.get(getattr(dut.test, name)) == init
        # Bits beyond the width are dropped on write and read as 0.
        for name, mask in (("ctrl", 0xFFFFFFFF), ("narrow", 0xFFF), ("flag", 1)):
            assert await bus.write(ctx, addr(f"test.{name}", regmap), 0xFFFFFFFF) == Resp.OKAY
            assert await bus.read(ctx, addr(f"test.{name}", regmap)) == (mask, Resp.OKAY)
            assert ctx.get(getattr(dut.test, name)) == mask
        # A lane-1-only write touches bits 11:8 of the 12-bit register, nothing of the 1-bit one.
        await bus.write(ctx, addr("test.narrow", regmap), 0)
        assert await bus.write(ctx, addr("test.narrow", regmap), 0x0000_0500, 0b0010) == Resp.OKAY
        assert await bus.read(ctx, addr("test.narrow", regmap)) == (0x500, Resp.OKAY)
        assert await bus.write(ctx, addr("test.flag", regmap), 0, 0b1110) == Resp.OKAY
        assert await bus.read(ctx, addr("test.flag", regmap)) == (1, Resp.OKAY)
        ctx.set(dut.test.status, 0xFEDCB)
        assert await bus.read(ctx, addr("test.status", regmap)) == (0xFEDCB, Resp.OKAY)

    simulate(dut, bench)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_every_rw_register_reads_back_and_resets(seed):
    """Every rw register of REGMAP (the transport's and congestion control's read from their
    LUT RAM copies) reads back what was written, masked to its width, and drives it on its
    port; after a reset every one reads and drives its reset value again."""
    print(f"seed {seed} (replay with STELLAR_SEED={seed})")
    rng = random.Random(seed)
    rw = [(b, r) for b in REGMAP.blocks for r in b.registers if r.access == "rw"]
    assert sum(b.name in ("transport", "cc") for b, _r in rw) >= 16     # both groups copied
    rst = Signal()
    bank = AxiLiteCsrBank()
    dut = ResetInserter(rst)(bank)

    async def check(ctx, master, expect):
        _, back = await master.run(ctx, reads=[b.base + r.offset for b, r in rw])
        for (b, r), got in zip(rw, back, strict=True):
            assert got == (expect[b.name, r.name], Resp.OKAY), f"{b.name}.{r.name}"
            assert ctx.get(getattr(getattr(bank, b.name), r.name)) == expect[b.name, r.name]

    async def bench(ctx):
        init = {(b.name, r.name): r.init for b, r in rw}
        master = AxiLiteMaster(bank.s_axil, rng=rng, p_valid=0.5, p_ready=0.5)
        model = dict(init)
        writes = []
        for b, r in rw:
            data, strb = rng.getrandbits(32), rng.choice([0xF, rng.getrandbits(4)])
            writes.append((b.base + r.offset, data, strb))
            lanes = sum(0xFF << (8 * i) for i in range(4) if strb >> i & 1)
            old = model[b.name, r.name]
            model[b.name, r.name] = ((old & ~lanes) | (data & lanes)) & ((1 << r.width) - 1)
        rng.shuffle(writes)     # each register written once: the order does not matter
        bresps, _ = await master.run(ctx, writes=writes)
        assert bresps == [Resp.OKAY] * len(writes)
        await check(ctx, master, model)
        ctx.set(rst, 1)
        await ctx.tick()
        ctx.set(rst, 0)
        await check(ctx, master, init)

    simulate(dut, bench)


# --- write channel ordering ---------------------------------------------------------------

@pytest.mark.parametrize("first", ["aw", "w"])
def test_write_channels_in_either_order(first):
    dut = AxiLiteCsrBank()
    bus = dut.s_axil
    scratch = addr("ident.scratch")

    async def bench(ctx):
        ctx.set(bus.bready, 1)
        lead, lag = ((bus.awvalid, bus.wvalid) if first == "aw" else (bus.wvalid, bus.awvalid))
        ctx.set(bus.awaddr, scratch)
        ctx.set(bus.wdata, 0xCAFEF00D)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(lead, 1)
        await ctx.tick()
        ctx.set(lead, 0)
        # Only half a write: it must wait for the other channel, however long that takes.
        for _ in range(5):
            assert not ctx.get(bus.bvalid)
            await ctx.tick()
        assert ctx.get(dut.ident.scratch) == 0
        ctx.set(lag, 1)
        await ctx.tick()
        ctx.set(lag, 0)
        await ctx.tick().until(bus.bvalid)
        assert ctx.get(bus.bresp) == Resp.OKAY
        await ctx.tick()
        ctx.set(bus.bready, 0)
        assert ctx.get(dut.ident.scratch) == 0xCAFEF00D

    simulate(dut, bench)


# --- counters -----------------------------------------------------------------------------

def test_counters_count_their_own_pulses():
    dut = AxiLiteCsrBank()
    rng = random.Random(7)
    names = [r.name for r in REGMAP.block("pktengine").counters]
    # A different density per counter so that a crossed wire shows up as a wrong count.
    patterns = {n: [rng.random() < (i + 1) / (len(names) + 1) for _ in range(300)]
                for i, n in enumerate(names)}

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        for n in names:
            assert await bus.read(ctx, addr(f"pktengine.{n}")) == (0, Resp.OKAY)
        for cycle in range(300):
            for n in names:
                ctx.set(getattr(dut.pktengine, f"{n}_inc"), patterns[n][cycle])
            await ctx.tick()
        for n in names:
            ctx.set(getattr(dut.pktengine, f"{n}_inc"), 0)
        for n in names:
            assert await bus.read(ctx, addr(f"pktengine.{n}")) == (sum(patterns[n]), Resp.OKAY), n

    simulate(dut, bench)


def test_counters_count_during_bus_traffic():
    dut = AxiLiteCsrBank()
    state = {"pulses": 0, "done": False}

    async def pulser(ctx):
        rng = random.Random(11)
        for _ in range(400):
            bit = rng.random() < 0.5
            ctx.set(dut.pktengine.rx_frames_inc, bit)
            state["pulses"] += bit
            await ctx.tick()
        ctx.set(dut.pktengine.rx_frames_inc, 0)
        state["done"] = True

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil, rng=random.Random(12), p_valid=0.5, p_ready=0.5)
        i = 0
        while not state["done"]:
            i += 1
            await bus.write(ctx, addr("ident.scratch"), i)
            data, resp = await bus.read(ctx, addr("pktengine.rx_frames"))
            assert resp == Resp.OKAY and data <= state["pulses"]
        assert await bus.read(ctx, addr("pktengine.rx_frames")) == (state["pulses"], Resp.OKAY)

    simulate(dut, pulser, bench)


@pytest.mark.parametrize("seed", SEEDS)
def test_counter_reads_are_exact_while_every_counter_counts(seed):
    """Every counter of the map counts its own random pulses, one clock after another, while
    reads of random counters run back to back with random gaps: each read returns exactly the
    pulses of the clocks up to 2 before the one after its AR handshake (the documented
    latency), whatever the counter RAM's flush is doing (the reads land on every phase of it,
    including a flush of the counter read being in flight)."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    dut = AxiLiteCsrBank()
    regs = [(b, r) for b in REGMAP.blocks for r in b.counters]
    density = {r: rng.random() for r in regs}
    history = {r: [] for r in regs}       # history[r][c]: the pulse driven in clock c

    async def bench(ctx):
        bus = dut.s_axil
        clock = 0

        async def tick():
            nonlocal clock
            for b, r in regs:
                bit = rng.random() < density[b, r]
                ctx.set(getattr(getattr(dut, b.name), f"{r.name}_inc"), bit)
                history[b, r].append(bit)
            await ctx.tick()
            clock += 1

        for _ in range(rng.randrange(5, 80)):
            await tick()
        for _ in range(3 * len(regs)):
            b, r = rng.choice(regs)
            ctx.set(bus.araddr, b.base + r.offset)
            ctx.set(bus.arvalid, 1)
            while True:
                taken = ctx.get(bus.arready)
                a = clock
                await tick()
                if taken:
                    break
            ctx.set(bus.arvalid, 0)
            ctx.set(bus.rready, 1)
            while not ctx.get(bus.rvalid):
                await tick()
            got, resp = ctx.get(bus.rdata), ctx.get(bus.rresp)
            await tick()
            ctx.set(bus.rready, 0)
            want = sum(history[b, r][:a])         # clocks 0 .. a - 1
            assert (got, resp) == (want, Resp.OKAY), f"{b.name}.{r.name} read at clock {a}"
            for _ in range(rng.randrange(0, 7)):
                await tick()

    simulate(dut, bench)


def test_counter_clear_is_per_block_and_needs_bit0():
    regmap = make_test_map()
    dut = AxiLiteCsrBank(regmap)
    counters = [(dut.test.events_inc, "test.events", 5), (dut.test.drops_inc, "test.drops", 9),
                (dut.other.hits_inc, "other.hits", 13)]

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)

        async def pulse_all():
            for inc, _name, n in counters:
                ctx.set(inc, 1)
                await ctx.tick().repeat(n)
                ctx.set(inc, 0)

        async def values():
            return [(await bus.read(ctx, addr(name, regmap)))[0] for _inc, name, _n in counters]

        await pulse_all()
        assert await values() == [5, 9, 13]
        # Writes that are not "1 in bit 0 with lane 0 enabled" do not clear.
        assert await bus.write(ctx, addr("test.clear", regmap), 0xFFFFFFFE) == Resp.OKAY
        assert await bus.write(ctx, addr("test.clear", regmap), 1, strb=0b1110) == Resp.OKAY
        assert await values() == [5, 9, 13]
        # Clearing "test" zeroes both of its counters and leaves "other" alone.
        assert await bus.write(ctx, addr("test.clear", regmap), 1) == Resp.OKAY
        assert await values() == [0, 0, 13]
        assert await bus.read(ctx, addr("test.clear", regmap)) == (0, Resp.OKAY)
        await pulse_all()
        assert await values() == [5, 9, 26]
        assert await bus.write(ctx, addr("other.clear", regmap), 1) == Resp.OKAY
        assert await values() == [5, 9, 0]

    simulate(dut, bench)


def test_counter_clear_keeps_simultaneous_event():
    dut = AxiLiteCsrBank()
    bus = dut.s_axil
    inc = dut.pktengine.rx_frames_inc

    async def bench(ctx):
        master = AxiLiteMaster(bus)
        ctx.set(inc, 1)
        await ctx.tick().repeat(20)
        # Issue the clear by hand to know its clock: the write takes effect on the same edge
        # that raises bvalid. inc is high on that edge and dropped right after it.
        ctx.set(bus.awaddr, addr("pktengine.counters_clear"))
        ctx.set(bus.wdata, 1)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        await ctx.tick()
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        while not ctx.get(bus.bvalid):
            await ctx.tick()
        ctx.set(inc, 0)
        ctx.set(bus.bready, 1)
        await ctx.tick()
        ctx.set(bus.bready, 0)
        assert await master.read(ctx, addr("pktengine.rx_frames")) == (1, Resp.OKAY)

    simulate(dut, bench)


# --- errors -------------------------------------------------------------------------------

def test_unmapped_and_read_only_accesses():
    dut = AxiLiteCsrBank()
    holes = [0x0FFC, 0x0F00, 0xFFFC,
             REGMAP.block("pktengine").base + 0x08,                     # gap inside a block
             0x10 + 4 * REGMAP["ident.feature_count"].init]             # past the feature list

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        for a in holes:
            assert REGMAP.at(a) is None
            assert await bus.read(ctx, a) == (0, Resp.SLVERR), f"{a:#x}"
            assert await bus.write(ctx, a, 0xDEADBEEF) == Resp.SLVERR, f"{a:#x}"
        # Read-only and counter registers refuse writes and keep their value.
        ctx.set(dut.pktengine.tx_frames_inc, 1)
        await ctx.tick().repeat(3)
        ctx.set(dut.pktengine.tx_frames_inc, 0)
        for name, value in (("ident.id", MAGIC), ("ident.version", 0x000100),
                            ("pktengine.tx_frames", 3)):
            assert await bus.write(ctx, addr(name), 0) == Resp.SLVERR, name
            assert await bus.read(ctx, addr(name)) == (value, Resp.OKAY), name
        assert await bus.read(ctx, addr("ident.scratch")) == (0, Resp.OKAY)

    simulate(dut, bench)


# --- random traffic -----------------------------------------------------------------------

@pytest.mark.parametrize("shadow_rw", [8, 1], ids=["registers", "copy"])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_traffic_with_backpressure(seed, shadow_rw):
    print(f"seed {seed} (replay with STELLAR_SEED={seed})")
    rng = random.Random(seed)
    regmap = make_test_map()
    dut = AxiLiteCsrBank(regmap, shadow_rw=shadow_rw)
    rw = {"test.ctrl": 32, "test.narrow": 12, "test.flag": 1}
    readonly = {"ident.id": MAGIC, "ident.version": 0x000100, "test.status": 0x5A5A5}
    unmapped = [0x1C0, 0x300, 0x2FC]

    async def bench(ctx):
        ctx.set(dut.test.status, readonly["test.status"])
        model = {name: regmap[name].init for name in rw}
        for phase in range(3):
            p_valid, p_ready = rng.choice([0.2, 0.5, 0.9]), rng.choice([0.1, 0.5, 0.9])
            master = AxiLiteMaster(dut.s_axil, rng=rng, p_valid=p_valid, p_ready=p_ready)
            writes, expected_b = [], []
            for _ in range(40):
                kind = rng.random()
                if kind < 0.8:
                    name = rng.choice(list(rw))
                    data, strb = rng.getrandbits(32), rng.getrandbits(4)
                    writes.append((addr(name, regmap), data, strb))
                    mask = sum(0xFF << (8 * i) for i in range(4) if strb >> i & 1)
                    model[name] = ((model[name] & ~mask) | (data & mask)) & ((1 << rw[name]) - 1)
                    expected_b.append(Resp.OKAY)
                elif kind < 0.9:
                    writes.append((addr(rng.choice(list(readonly)), regmap), rng.getrandbits(32), 0xF))
                    expected_b.append(Resp.SLVERR)
                else:
                    writes.append((rng.choice(unmapped), rng.getrandbits(32), 0xF))
                    expected_b.append(Resp.SLVERR)
            # Reads issued concurrently target registers the writes cannot change, so their
            # results do not depend on how the two channels interleave.
            reads, expected_r = [], []
            for _ in range(30):
                if rng.random() < 0.8:
                    name = rng.choice(list(readonly))
                    reads.append(addr(name, regmap))
                    expected_r.append((readonly[name], Resp.OKAY))
                else:
                    reads.append(rng.choice(unmapped))
                    expected_r.append((0, Resp.SLVERR))
            bresps, rresults = await master.run(ctx, writes, reads)
            assert bresps == expected_b, f"phase {phase}"
            assert rresults == expected_r, f"phase {phase}"
            # Read back every rw register under backpressure.
            names = list(rw)
            _, back = await master.run(ctx, reads=[addr(n, regmap) for n in names])
            assert back == [(model[n], Resp.OKAY) for n in names], f"phase {phase}"
            for n in names:
                assert ctx.get(getattr(dut.test, n.split(".")[1])) == model[n]

    simulate(dut, bench)


# --- integration helpers ------------------------------------------------------------------

def test_block_signature_connects_to_bank():
    """A block that declares block_signature() plugs into the bank with one connect()."""
    sig = block_signature(REGMAP.block("pktengine"))

    class Engine(wiring.Component):
        csr: Out(sig)
        frame: In(1)

        def elaborate(self, platform):
            m = Module()
            m.d.comb += [self.csr.rx_frames_inc.eq(self.frame), self.csr.config.eq(pktengine_config(64))]
            return m

    class Top(wiring.Component):
        s_axil: In(AxiLiteSignature(16))
        frame: In(1)

        def __init__(self):
            super().__init__()
            self.bank = AxiLiteCsrBank()

        def elaborate(self, platform):
            m = Module()
            m.submodules.engine = engine = Engine()
            m.submodules.bank = self.bank
            wiring.connect(m, wiring.flipped(self.s_axil), self.bank.s_axil)
            wiring.connect(m, engine.csr, self.bank.pktengine)
            m.d.comb += engine.frame.eq(self.frame)
            return m

    top = Top()

    async def bench(ctx):
        bus = AxiLiteMaster(top.s_axil)
        ctx.set(top.frame, 1)
        await ctx.tick().repeat(4)
        ctx.set(top.frame, 0)
        await ctx.tick()    # a pulse reaches the counter 2 clocks later (increment registered)
        assert await bus.read(ctx, addr("pktengine.rx_frames")) == (4, Resp.OKAY)
        assert await bus.read(ctx, addr("pktengine.config")) == (8, Resp.OKAY)
        assert await bus.read(ctx, addr("ident.id")) == (MAGIC, Resp.OKAY)

    simulate(top, bench)


def test_map_must_fit_address_width():
    with pytest.raises(ValueError, match="address"):
        AxiLiteCsrBank(addr_width=8)


AXIL_PORTS = {
    "s_axil_awaddr": ("input", 16), "s_axil_awprot": ("input", 3), "s_axil_awvalid": ("input", 1),
    "s_axil_awready": ("output", 1), "s_axil_wdata": ("input", 32), "s_axil_wstrb": ("input", 4),
    "s_axil_wvalid": ("input", 1), "s_axil_wready": ("output", 1), "s_axil_bresp": ("output", 2),
    "s_axil_bvalid": ("output", 1), "s_axil_bready": ("input", 1), "s_axil_araddr": ("input", 16),
    "s_axil_arprot": ("input", 3), "s_axil_arvalid": ("input", 1), "s_axil_arready": ("output", 1),
    "s_axil_rdata": ("output", 32), "s_axil_rresp": ("output", 2), "s_axil_rvalid": ("output", 1),
    "s_axil_rready": ("input", 1),
}


def _module_ports(text, module):
    """``{port: (direction, width)}`` of one module of Yosys-written Verilog."""
    start = text.index(f"module {module}(")
    body = text[start:text.index("endmodule", start)]
    ports = {}
    for direction, msb, name in re.findall(r"^\s*(input|output)\s+(?:wire\s+)?(?:\[(\d+):0\]\s+)?(\w+);",
                                           body, re.M):
        ports[name] = (direction, int(msb) + 1 if msb else 1)
    return ports


def test_verilog_top_has_single_underscore_axil_ports():
    class Top(wiring.Component):
        s_axil: In(AxiLiteSignature(16))
        rx_frames: In(1)
        scratch: Out(32)

        def elaborate(self, platform):
            m = Module()
            m.submodules.csr = csr = AxiLiteCsrBank()
            wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
            m.d.comb += [csr.pktengine.rx_frames_inc.eq(self.rx_frames), self.scratch.eq(csr.ident.scratch)]
            return m

    text = verilog.convert(FlatPorts(Top()), name="stellar_csr_top")
    ports = _module_ports(text, "stellar_csr_top")
    assert {n: p for n, p in ports.items() if n.startswith("s_axil")} == AXIL_PORTS
    assert ports["clk"] == ("input", 1) and ports["rst"] == ("input", 1)
    assert ports["rx_frames"] == ("input", 1) and ports["scratch"] == ("output", 32)
    assert not [n for n in ports if "__" in n]


def test_flat_ports_of_bank_itself():
    ports = _module_ports(verilog.convert(FlatPorts(AxiLiteCsrBank()), name="csr"), "csr")
    assert {n: p for n, p in ports.items() if n.startswith("s_axil")} == AXIL_PORTS
    assert ports["pktengine_rx_frames_inc"] == ("input", 1)
    assert ports["pktengine_config"] == ("input", 32)
    assert ports["ident_scratch"] == ("output", 32)


def test_flat_ports_rejects_colliding_names():
    class Clash(wiring.Component):
        a_b: In(1)
        a: In(wiring.Signature({"b": Out(1)}))

        def elaborate(self, platform):
            return Module()

    clash = Clash()
    clash._MustUse__silence = True  # built only to be rejected; Amaranth would warn it is unused
    with pytest.raises(NameError, match="a_b"):
        FlatPorts(clash)


def test_command_register_pulses_with_each_write():
    """A command write presents its value with a one-clock ``_stb`` pulse every time (also when
    the value repeats); lanes not strobed are 0; reads return 0."""
    regmap = make_test_map()
    dut = AxiLiteCsrBank(regmap)
    seen = []

    async def watcher(ctx):
        async for _clk, _rst, stb, value in ctx.tick().sample(dut.test.go_stb, dut.test.go):
            if stb:
                seen.append(value)

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        assert await bus.write(ctx, addr("test.go", regmap), 0x2A5) == Resp.OKAY
        assert await bus.write(ctx, addr("test.go", regmap), 0x2A5) == Resp.OKAY
        assert await bus.write(ctx, addr("test.go", regmap), 0x3FF, strb=0b0001) == Resp.OKAY
        assert await bus.write(ctx, addr("test.ctrl", regmap), 5) == Resp.OKAY  # not a command
        assert await bus.read(ctx, addr("test.go", regmap)) == (0, Resp.OKAY)
        for _ in range(4):
            await ctx.tick()
        assert seen == [0x2A5, 0x2A5, 0xFF]

    sim = Simulator(dut)
    sim.add_clock(10e-9)
    sim.add_process(watcher)
    sim.add_testbench(bench)
    sim.run()


# --- wo registers -------------------------------------------------------------------------

def test_wo_register_drives_its_port_and_reads_zero():
    """A ``wo`` register is written like ``rw`` (byte lanes, the port holds the value) but a
    read returns 0 with OKAY, and it is not in the read multiplexer's port list."""
    regmap = RegisterMap([Block("test", 0x100, 1, "test block", [
        Register("win", 0x00, 32, "wo", "operand word"),
        Register("narrow", 0x04, 12, "wo", "narrow operand"),
        Register("ctrl", 0x08, 32, "rw", "control"),
    ], feature=0x7E)])
    dut = AxiLiteCsrBank(regmap)

    async def bench(ctx):
        bus = AxiLiteMaster(dut.s_axil)
        win, narrow = addr("test.win", regmap), addr("test.narrow", regmap)
        assert await bus.write(ctx, win, 0xA5A55A5A) == Resp.OKAY
        assert ctx.get(dut.test.win) == 0xA5A55A5A
        assert await bus.read(ctx, win) == (0, Resp.OKAY)
        assert await bus.write(ctx, win, 0x11223344, strb=0b0101) == Resp.OKAY
        assert ctx.get(dut.test.win) == 0xA5225A44
        assert await bus.write(ctx, narrow, 0xFFFFFFFF) == Resp.OKAY
        assert ctx.get(dut.test.narrow) == 0xFFF
        assert await bus.read(ctx, narrow) == (0, Resp.OKAY)
        assert await bus.write(ctx, addr("test.ctrl", regmap), 7) == Resp.OKAY
        assert await bus.read(ctx, addr("test.ctrl", regmap)) == (7, Resp.OKAY)
        assert ctx.get(dut.test.win) == 0xA5225A44

    simulate(dut, bench)

