"""stellar.hdl.boards in the Amaranth simulator: the block-RAM AXI4 subordinate (``Axi4Ram``), the
AXI4-Lite address split, the ``wq`` register queues behind a CSR bank, the PLL divider search
and the build report parser.

References are independent of the gateware: a ``bytearray`` memory updated by the AXI4 rules
(A3.4: INCR/FIXED addresses, WSTRB lanes; SLVERR outside the memory changes nothing), the
register map (``stellar.hdl.regmap``) for offsets, the ``WORK_REQUEST``/``COMPLETION`` field
tables for queue contents, the ECP5 PLL equations (``f = fin / CLKI_DIV * CLKFB_DIV`` with
feedback from CLKOP) for the divider search. Random tests print their seeds.
"""

import random

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator
from stellar.hdl.axil import Resp
from stellar.hdl.boards.axilsplit import AxiLiteSplit
from stellar.hdl.boards.axiram import Axi4Ram
from stellar.hdl.boards.build import nextpnr_options, parse_log_fmax, parse_report, summarize
from stellar.hdl.boards.top import BOARDS, ETH_HZ, pll_config
from stellar.hdl.boards.wq import RegisterQueues
from stellar.hdl.csr import AxiLiteCsrBank
from stellar.hdl.regmap import REGMAP, RegisterMap

SEEDS = (1, 2)


# ------------------------------------------------------------------------------------- Axi4Ram

async def _axi_write(ctx, bus, rng, addr, size, burst, beats, wid, stall):
    data = [rng.getrandbits(64) for _ in range(beats)]
    strb = [rng.getrandbits(8) for _ in range(beats)]
    ctx.set(bus.awaddr, addr)
    ctx.set(bus.awlen, beats - 1)
    ctx.set(bus.awsize, size)
    ctx.set(bus.awburst, burst)
    ctx.set(bus.awid, wid)
    ctx.set(bus.awvalid, 1)
    await ctx.tick().until(bus.awready)
    ctx.set(bus.awvalid, 0)
    for k in range(beats):
        while rng.random() < stall:
            await ctx.tick()
        ctx.set(bus.wdata, data[k])
        ctx.set(bus.wstrb, strb[k])
        ctx.set(bus.wlast, k == beats - 1)
        ctx.set(bus.wvalid, 1)
        await ctx.tick().until(bus.wready)
        ctx.set(bus.wvalid, 0)
    while rng.random() < stall:
        await ctx.tick()
    ctx.set(bus.bready, 1)
    bid, bresp = await ctx.tick().sample(bus.bid, bus.bresp).until(bus.bvalid)
    ctx.set(bus.bready, 0)
    return data, strb, bid, Resp(bresp)


async def _axi_read(ctx, bus, rng, addr, size, burst, beats, rid, stall):
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arlen, beats - 1)
    ctx.set(bus.arsize, size)
    ctx.set(bus.arburst, burst)
    ctx.set(bus.arid, rid)
    ctx.set(bus.arvalid, 1)
    await ctx.tick().until(bus.arready)
    ctx.set(bus.arvalid, 0)
    out = []
    while True:
        ctx.set(bus.rready, rng.random() >= stall)
        _, _, valid, ready, data, resp, last, got_id = await ctx.tick().sample(
            bus.rvalid, bus.rready, bus.rdata, bus.rresp, bus.rlast, bus.rid)
        if valid and ready:
            out.append((data, Resp(resp), last, got_id))
            if last:
                break
    ctx.set(bus.rready, 0)
    return out


def _beat_addrs(addr, size, burst, beats):
    step = 0 if burst == 0 else 1 << size
    return [addr + k * step for k in range(beats)]


@pytest.mark.parametrize("seed", SEEDS)
def test_axi4ram_random_bursts(seed):
    """Random INCR/FIXED bursts of 1..32 beats, full and narrow sizes, random WSTRB, random
    stalls on W, B and R, some outside the memory: every read equals the byte-array model,
    responses and IDs are right, a write outside changes nothing."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    size, base = 4096, 0x10000
    dut = Axi4Ram(size, base=base)
    model = bytearray(size)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    bus = dut.s_axi

    async def bench(ctx):
        for _ in range(60):
            beats = rng.choice([1, 1, 2, 5, 16, 32])
            asize = rng.choice([3, 3, 3, 2])
            burst = rng.choice([1, 1, 1, 0])
            outside = rng.random() < 0.15
            start = rng.randrange(0, size - beats * 8) & ~((1 << asize) - 1)
            addr = (base + size if outside else base) + start
            xid = rng.randrange(16)
            stall = rng.choice([0.0, 0.4])
            if rng.random() < 0.5:
                data, strb, bid, bresp = await _axi_write(ctx, bus, rng, addr, asize, burst,
                                                          beats, xid, stall)
                assert bid == xid
                assert bresp == (Resp.SLVERR if outside else Resp.OKAY)
                if not outside:
                    for a, d, s in zip(_beat_addrs(start, asize, burst, beats), data, strb,
                                       strict=True):
                        word = a & ~7
                        for lane in range(8):
                            if s >> lane & 1:
                                model[word + lane] = (d >> (8 * lane)) & 0xFF
            else:
                got = await _axi_read(ctx, bus, rng, addr, asize, burst, beats, xid, stall)
                assert len(got) == beats
                for k, (a, (data, resp, last, rid)) in enumerate(
                        zip(_beat_addrs(start, asize, burst, beats), got, strict=True)):
                    assert rid == xid and last == (k == beats - 1)
                    if outside:
                        assert resp == Resp.SLVERR and data == 0
                    else:
                        word = a & ~7
                        want = int.from_bytes(model[word:word + 8], "little")
                        assert resp == Resp.OKAY and data == want, (hex(a), hex(data), hex(want))

    sim.add_testbench(bench)
    sim.run()


def test_axi4ram_reads_one_beat_per_clock():
    """A 16-beat read with rready always high takes 16 consecutive clocks of rvalid."""
    dut = Axi4Ram(1024)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    bus = dut.s_axi

    async def bench(ctx):
        ctx.set(bus.araddr, 0)
        ctx.set(bus.arlen, 15)
        ctx.set(bus.arsize, 3)
        ctx.set(bus.arburst, 1)
        ctx.set(bus.arvalid, 1)
        ctx.set(bus.rready, 1)
        await ctx.tick().until(bus.arready)
        ctx.set(bus.arvalid, 0)
        trace = []
        for _ in range(20):
            _, _, valid, last = await ctx.tick().sample(bus.rvalid, bus.rlast)
            trace.append((valid, last))
        beats = [i for i, (v, _) in enumerate(trace) if v]
        assert len(beats) == 16 and beats == list(range(beats[0], beats[0] + 16)), trace
        assert trace[beats[-1]][1] == 1

    sim.add_testbench(bench)
    sim.run()


# ------------------------------------------------------------------- split + bank + queues

class _Harness:
    """AxiLiteSplit -> (m_axil0: a plain CSR bank of the whole map, m_axil1: the board's bank of
    the mac and wq blocks), RegisterQueues on the board bank's wq ports."""

    def __init__(self):
        self.m = m = Module()
        windows = [(REGMAP.block(b).base, 0x100) for b in ("mac", "wq")]
        m.submodules.split = self.split = AxiLiteSplit(16, windows)
        m.submodules.core = self.core = AxiLiteCsrBank(REGMAP)
        m.submodules.board = self.board = AxiLiteCsrBank(
            RegisterMap([REGMAP.block("mac"), REGMAP.block("wq")]))
        m.submodules.queues = self.queues = RegisterQueues(wr_depth=2, rr_depth=2, cq_depth=4)
        from amaranth.lib import wiring
        wiring.connect(m, self.split.m_axil0, self.core.s_axil)
        wiring.connect(m, self.split.m_axil1, self.board.s_axil)
        wiring.connect(m, self.queues.csr, self.board.wq)


async def _lite_write(ctx, bus, addr, value):
    ctx.set(bus.awaddr, addr)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wdata, value)
    ctx.set(bus.wstrb, 0xF)
    ctx.set(bus.wvalid, 1)
    aw = w = False
    while not (aw and w):
        _, _, awr, wr = await ctx.tick().sample(bus.awready, bus.wready)
        aw, w = aw or awr, w or wr
        if aw:
            ctx.set(bus.awvalid, 0)
        if w:
            ctx.set(bus.wvalid, 0)
    ctx.set(bus.bready, 1)
    (resp,) = await ctx.tick().sample(bus.bresp).until(bus.bvalid)
    ctx.set(bus.bready, 0)
    return Resp(resp)


async def _lite_read(ctx, bus, addr):
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arvalid, 1)
    await ctx.tick().until(bus.arready)
    ctx.set(bus.arvalid, 0)
    ctx.set(bus.rready, 1)
    data, resp = await ctx.tick().sample(bus.rdata, bus.rresp).until(bus.rvalid)
    ctx.set(bus.rready, 0)
    return data, Resp(resp)


def test_split_routes_and_queues():
    """Through the split: ident and scratch come from the core's bank, wq registers from the
    board's (a write to wq.config is refused there, SLVERR); pushed work and receive requests
    leave on the streams bit-exact in order; a push into a full queue and a pop of an empty one
    are counted and change nothing; completions show oldest first and pop in order."""
    h = _Harness()
    sim = Simulator(h.m)
    sim.add_clock(1e-8)
    bus, q = h.split.s_axil, h.queues
    rng = random.Random(3)
    print("seed 3")
    wrs = [rng.getrandbits(576) for _ in range(3)]
    rr = rng.getrandbits(192)
    cqes = [rng.getrandbits(192) for _ in range(3)]
    off = {name: REGMAP[name].offset for name in (
        "ident.id", "ident.scratch", "wq.config", "wq.wr_push", "wq.rr_push", "wq.cq_pop",
        "wq.wr_level", "wq.cq_level", "wq.wr_pushed", "wq.rr_pushed", "wq.push_full",
        "wq.pop_empty", "wq.cq_popped")}

    async def bench(ctx):
        assert await _lite_read(ctx, bus, off["ident.id"]) == (REGMAP["ident.id"].init, Resp.OKAY)
        assert await _lite_write(ctx, bus, off["ident.scratch"], 0x1234) == Resp.OKAY
        assert ctx.get(h.core.ident.scratch) == 0x1234
        assert await _lite_read(ctx, bus, off["wq.config"]) == (2 | 2 << 8 | 4 << 16, Resp.OKAY)
        assert await _lite_write(ctx, bus, off["wq.config"], 1) == Resp.SLVERR
        # three pushes into a 2-deep queue the core does not drain: the third is refused
        for wr in wrs:
            for i in range(18):
                await _lite_write(ctx, bus, REGMAP[f"wq.wr_data{i}"].offset, (wr >> 32 * i) & 0xFFFFFFFF)
            await _lite_write(ctx, bus, off["wq.wr_push"], 1)
        for i in range(6):
            await _lite_write(ctx, bus, REGMAP[f"wq.rr_data{i}"].offset, (rr >> 32 * i) & 0xFFFFFFFF)
        await _lite_write(ctx, bus, off["wq.rr_push"], 1)
        assert (await _lite_read(ctx, bus, off["wq.wr_level"]))[0] == 2
        assert (await _lite_read(ctx, bus, off["wq.push_full"]))[0] == 1
        assert (await _lite_read(ctx, bus, off["wq.wr_pushed"]))[0] == 2
        assert (await _lite_read(ctx, bus, off["wq.rr_pushed"]))[0] == 1
        got = []
        ctx.set(q.m_axis_wr.tready, 1)
        ctx.set(q.m_axis_rr.tready, 1)
        rr_got = []
        for _ in range(8):
            _, _, v, d, rv, rd = await ctx.tick().sample(q.m_axis_wr.tvalid, q.m_axis_wr.tdata,
                                                         q.m_axis_rr.tvalid, q.m_axis_rr.tdata)
            if v:
                got.append(d)
            if rv:
                rr_got.append(rd)
        assert got == wrs[:2] and rr_got == [rr]
        # completions: pop of an empty queue first, then three in, popped in order
        await _lite_write(ctx, bus, off["wq.cq_pop"], 1)
        assert (await _lite_read(ctx, bus, off["wq.pop_empty"]))[0] == 1
        for c in cqes:
            ctx.set(q.s_axis_cq.tdata, c)
            ctx.set(q.s_axis_cq.tvalid, 1)
            await ctx.tick().until(q.s_axis_cq.tready)
        ctx.set(q.s_axis_cq.tvalid, 0)
        for k, c in enumerate(cqes):
            assert (await _lite_read(ctx, bus, off["wq.cq_level"]))[0] == 3 - k
            words = [(await _lite_read(ctx, bus, REGMAP[f"wq.cq_data{i}"].offset))[0] for i in range(6)]
            assert sum(w << 32 * i for i, w in enumerate(words)) == c
            await _lite_write(ctx, bus, off["wq.cq_pop"], 1)
        assert (await _lite_read(ctx, bus, off["wq.cq_level"]))[0] == 0
        for i in range(6):      # an empty queue shows zeros, not the last entry
            assert (await _lite_read(ctx, bus, REGMAP[f"wq.cq_data{i}"].offset))[0] == 0
        assert (await _lite_read(ctx, bus, off["wq.cq_popped"]))[0] == 3
        assert (await _lite_read(ctx, bus, off["wq.pop_empty"]))[0] == 1

    sim.add_testbench(bench)
    sim.run()


# ----------------------------------------------------------------------------------- PLL

@pytest.mark.parametrize("fin, core", [(100e6, 125e6), (25e6, 125e6), (25e6, 100e6),
                                       (100e6, 110e6), (25e6, 150e6)])
def test_pll_config_meets_ecp5_limits(fin, core):
    """125 MHz exactly on CLKOP from the board clock, VCO 400..800 MHz, phase detector >= 10 MHz,
    dividers in range, and the core clock the nearest a divider of the VCO gives."""
    p = pll_config(fin, core)
    assert fin / p.clki_div * p.clkfb_div == ETH_HZ            # feedback from CLKOP
    assert 400e6 <= p.vco_hz <= 800e6 and p.vco_hz == ETH_HZ * p.op_div
    assert fin / p.clki_div >= 10e6 and 1 <= p.clki_div <= 128 and 1 <= p.clkfb_div <= 80
    assert p.core_hz == p.vco_hz / p.os2_div
    best = min(abs(v / d - core) for v in (ETH_HZ * k for k in range(1, 129)) if 400e6 <= v <= 800e6
               for d in range(1, 129))
    assert abs(p.core_hz - core) == pytest.approx(best)


# ---------------------------------------------------------------------------- build report

def test_parse_report_maps_domains_and_verdicts():
    report = {
        "utilization": {"TRELLIS_COMB": {"used": 30000, "available": 83640},
                        "TRELLIS_FF": {"used": 20000, "available": 83640},
                        "DP16KD": {"used": 100, "available": 208},
                        "MULT18X18D": {"used": 2, "available": 156}},
        "fmax": {"clk_core": {"achieved": 131.2, "constraint": 125.0},
                 "clk_eth_tx": {"achieved": 200.0, "constraint": 125.0},
                 "phy.rx_clk": {"achieved": 110.0, "constraint": 125.0}},
    }
    p = parse_report(report)
    assert p["resources"]["LUT4"] == (30000, 83640) and p["resources"]["EBR"] == (100, 208)
    assert p["resources"]["DSP"] == (2, 156) and p["resources"]["LUTRAM"] == (0, 0)
    assert p["clocks"]["sync"]["met"] and p["clocks"]["eth_tx"]["met"]
    assert not p["clocks"]["eth_rx"]["met"] and p["clocks"]["eth_rx"]["fmax_mhz"] == 110.0


def test_nextpnr_options_pick_placer_and_router():
    """The core builds place with nextpnr's static placer and route with router2; the shell keeps
    HeAP and router1; an explicit choice wins; --place-only writes the placed SDF and netlist, a
    routed build the routed ones."""
    from dataclasses import replace

    def opts(config, **kw):
        words = nextpnr_options(config, **kw).split()
        return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}, words

    core = BOARDS["ecpix5"].config
    shell = replace(BOARDS["colorlight_5a75b"].config, core=False)
    assert core.core
    o, words = opts(core, seed=3)
    assert (o["--placer"], o["--router"], o["--seed"]) == ("static", "router2", "3")
    assert "--timing-allow-fail" in words and "--no-route" not in words
    assert o["--sdf"] == "routed.sdf" and o["--write"] == "routed.json"
    o, _ = opts(shell)
    assert (o["--placer"], o["--router"]) == ("heap", "router1")
    o, words = opts(core, placer="heap", router="router1", place_only=True)
    assert (o["--placer"], o["--router"]) == ("heap", "router1")
    assert "--no-route" in words and o["--sdf"] == "placed.sdf" and o["--write"] == "placed.json"


def test_pll_phases_match_ecppll():
    """CPHASE/FPHASE against prjtrellis' ecppll for 100 MHz in, 125 MHz out, a 90-degree copy
    and a 125 MHz third output (``ecppll -i 100 -o 125 --clkout1 125 --phase1 90 --clkout2
    125``: CLKI_DIV 4, CLKFB_DIV 5, every DIV 5, CLKOP_CPHASE 2, CLKOS_CPHASE 3 / FPHASE 2,
    CLKOS2_CPHASE 2)."""
    from amaranth.hdl import Signal
    from stellar.hdl.boards.top import PllConfig, _pll_instance
    cfg = PllConfig(clki_div=4, clkfb_div=5, op_div=5, os2_div=5, vco_hz=625e6, core_hz=125e6)
    inst = _pll_instance(cfg, 100e6, *(Signal() for _ in range(5)))
    p = inst.parameters
    assert (p["CLKI_DIV"], p["CLKFB_DIV"], p["CLKOP_DIV"], p["CLKOS_DIV"], p["CLKOS2_DIV"]) == (4, 5, 5, 5, 5)
    assert (p["CLKOP_CPHASE"], p["CLKOP_FPHASE"]) == (2, 0)
    assert (p["CLKOS_CPHASE"], p["CLKOS_FPHASE"]) == (3, 2)
    assert (p["CLKOS2_CPHASE"], p["CLKOS2_FPHASE"]) == (2, 0)
    assert p["FEEDBK_PATH"] == "CLKOP"


def test_parse_log_fmax_takes_placement_estimates():
    log = """Info: Max frequency for clock '$glbnet$bank.clk': 51.40 MHz (FAIL at 125.00 MHz)
Info: Max frequency for clock          '$glbnet$eth_tx_clk': 176.77 MHz (PASS at 125.00 MHz)
Info: Running simulated annealing placer for refinement.
Info: Max frequency for clock '$glbnet$bank.clk': 54.56 MHz (FAIL at 125.00 MHz)
Info: Max frequency for clock '$glbnet$phy.rx_ctl.eth_rx_clk': 99.11 MHz (FAIL at 125.00 MHz)
"""
    clocks = parse_log_fmax(log)
    assert clocks["sync"] == {"net": "$glbnet$bank.clk", "fmax_mhz": 54.56, "constraint_mhz": 125.0,
                              "met": False, "estimated": True}     # the last line wins
    assert clocks["eth_tx"]["met"] and clocks["eth_rx"]["fmax_mhz"] == 99.11
    assert not parse_log_fmax(log + "Info: Running router2...\n")["sync"]["estimated"]

    class Board:
        name, device = "ecpix5", "LFE5UM5G-85F"

    class Config:
        def describe(self):
            return "256 QPs"
    text = summarize(Board(), Config(), {"resources": {}, "clocks": clocks}, 60)
    assert "54.56 MHz  constraint  125.00 MHz  FAILED (estimated after placement)" in text


# ---------------------------------------------------------------------------- routing watchdog

# router2's lines as nextpnr-ecp5 0.11 prints them (the ECPIX-5 core, 2026-12-06, iterations
# 6-14 without timing-driven routing: the lowest overuse at 10, rising from there)
ROUTER2_LOG = """Info: Device utilisation:
Info: \t              DP16KD:     202/    208    97%
Info: \t          MULT18X18D:      42/    156    26%
Info: \t          TRELLIS_FF:   42149/  83640    50%
Info: \t        TRELLIS_COMB:   51999/  83640    62%
Info: \t        TRELLIS_RAMW:     763/  10455     7%
Info: Max frequency for clock '$glbnet$bank.clk': 53.36 MHz (FAIL at 125.00 MHz)
Info: Running router2...
Info:     iter=6 wires=1232545 overused=12765 overuse=12896 archfail=NA
Info:     iter=7 wires=1239416 overused=10936 overuse=11041 archfail=NA
Info:     iter=8 wires=1245419 overused=9629 overuse=9720 archfail=NA
Info:     iter=9 wires=1250834 overused=9005 overuse=9074 archfail=NA
Info:     iter=10 wires=1256201 overused=8761 overuse=8828 archfail=NA
Info:     iter=11 wires=1261384 overused=8830 overuse=8898 archfail=NA
Info:     iter=12 wires=1266477 overused=8965 overuse=9034 archfail=NA
Info:     iter=13 wires=1270930 overused=9362 overuse=9431 archfail=NA
Info:     iter=14 wires=1276062 overused=9946 overuse=10022 archfail=NA
"""


def test_route_progress_and_stall():
    from stellar.hdl.boards.build import route_progress, route_stalled
    progress = route_progress(ROUTER2_LOG)
    assert progress[0] == (6, 12765) and progress[4] == (10, 8761) and len(progress) == 9
    # lowest at iteration 10: four iterations since
    assert route_stalled(progress, 4) and not route_stalled(progress, 5)
    assert not route_stalled(progress, 0)                   # 0: never stop
    assert not route_stalled(progress[:5], 1)               # a new low in the last iteration
    # an equal count later is no new low
    assert route_stalled([(1, 500), (2, 400), (3, 400), (4, 400)], 2)
    # near convergence (lowest below NEAR_OVERUSE) it waits NEAR_PATIENCE times longer
    near = [(1, 500), (2, 2)] + [(3 + k, 3) for k in range(8)]
    assert not route_stalled(near, 8)
    assert route_stalled(near + [(11 + k, 3) for k in range(24)], 8)
    assert not route_stalled(near + [(11 + k, 3) for k in range(23)], 8)
    assert not route_stalled([], 3) and not route_stalled([(1, 9)], 1)


def test_parse_log_utilisation():
    from stellar.hdl.boards.build import parse_log_utilisation
    util = parse_log_utilisation(ROUTER2_LOG)
    assert util["LUT4"] == (51999, 83640) and util["EBR"] == (202, 208)
    assert util["FF"] == (42149, 83640) and util["DSP"] == (42, 156) and util["IO"] == (0, 0)


def test_nextpnr_options_heatmap():
    o = nextpnr_options(BOARDS["ecpix5"].config, heatmap=True).split()
    assert o[o.index("--router2-heatmap") + 1] == "heat"
    assert "--router2-heatmap" not in nextpnr_options(BOARDS["ecpix5"].config, heatmap=True,
                                                      router="router1")


def test_build_stops_a_route_that_does_not_converge(tmp_path, monkeypatch):
    """The whole build() around stand-in tools: the 'nextpnr' writes router2 iterations whose
    overuse stops falling and would then run for an hour; the build stops it after --patience
    iterations without a new low, fails with exit 1 and says why in its summary."""
    import sys as _sys

    from stellar.hdl.boards import build as b
    fake = tmp_path / "fake_nextpnr.py"
    fake.write_text(f"""import sys, time
log = sys.argv[sys.argv.index("--log") + 1]
lines = {ROUTER2_LOG!r}.splitlines(keepends=True)
with open(log, "w") as f:
    for line in lines:
        f.write(line); f.flush(); time.sleep(0.05)
    time.sleep(3600)
""")
    (tmp_path / "nextpnr").write_text(f"#!/bin/sh\nexec {_sys.executable} {fake} \"$@\"\n")
    (tmp_path / "yosys").write_text("#!/bin/sh\nsleep 1\n")     # the watcher looks meanwhile
    for tool in ("nextpnr", "yosys"):
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("NEXTPNR_ECP5", str(tmp_path / "nextpnr"))
    monkeypatch.setenv("YOSYS", str(tmp_path / "yosys"))
    monkeypatch.setattr(b, "POLL_S", 0.2)
    from dataclasses import replace
    board = BOARDS["colorlight_5a75b"]
    config = replace(board.config, core=False)
    out = tmp_path / "out"
    out.mkdir()
    # an earlier build's log, already stalled for 4 iterations: not this build's
    (out / f"stellar_{board.name}.tim").write_text("".join(
        f"Info:     iter={i} wires=9 overused={o} overuse={o} archfail=NA\n"
        for i, o in ((1, 900), (2, 500), (3, 600), (4, 600), (5, 600), (6, 700))))
    (out / "heat_congestion_by_net_3.csv").write_text("nic.x,1\n")
    t0 = __import__("time").monotonic()
    status, summary = b.build(board, config, out, router="router2", patience=3)
    assert not (out / "heat_congestion_by_net_3.csv").exists()
    assert __import__("time").monotonic() - t0 < 120
    assert status == 1 and summary["routing"]["converged"] is False
    # stopped once iteration 13 showed three without a new low (14 may be in the log by then)
    assert summary["routing"]["iterations"][-1][0] in (13, 14)
    assert min(it[1] for it in summary["routing"]["iterations"]) == 8761
    assert summary["resources"]["LUT4"] == (51999, 83640)
    assert summary["clocks"]["sync"]["estimated"] and summary["clocks"]["sync"]["fmax_mhz"] == 53.36
    assert (tmp_path / "out" / "summary.json").exists()
