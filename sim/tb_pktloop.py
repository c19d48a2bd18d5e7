# Ref: IBTA Vol 1 Annex A17 (RoCEv2)
"""cocotb testbench of ``stellar_pktloop`` (the packet engine in loopback).

Structure as in Corundum's testbenches: a TB class binds the BFMs by prefix (cocotbext-axi
``AxiStreamSource`` on ``s_axis_rx``, ``AxiStreamSink`` on ``m_axis_tx``, ``AxiLiteMaster`` on
``s_axil``), random idle cycles and backpressure on every stream, scapy as the golden model.

Parameters (environment, see ``stellar.sim.tb.tb_param``): ``STELLAR_TB_WIDTH`` (64 or 512),
``STELLAR_TB_FRAMES`` (size of the random trace), ``STELLAR_TB_PAUSE`` (stall probability on
each stream, default 0.3). ``sim_trace`` (the ``make sim`` job) also reads
``STELLAR_TB_TRACE`` (a pcap to send) and ``STELLAR_TB_OUT`` (folder for tx.pcap and
summary.json) and runs without stalls so its beats-per-cycle figure is the design's own.
"""

import json
import os
import random
from pathlib import Path

import cocotb
from cocotb.triggers import RisingEdge, Timer, with_timeout
from cocotbext.axi import (
    AxiLiteBus,
    AxiLiteMaster,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)
from stellar.hdl.regmap import MAGIC
from stellar.hdl.top.pktloop import PKTLOOP_REGMAP as REGMAP

from . import packets
from .captures import is_rocev2, load_captures
from .packets import Expect
from .tb import TB, pause_generator, tb_param

COUNTERS = [r.name for r in REGMAP.block("pktengine").registers
            if r.access == "counter"]
DROP_COUNTER = {
    Expect.ICRC: "rx_drop_icrc",
    Expect.IP_CHECKSUM: "rx_drop_ip_checksum",
    Expect.MALFORMED: "rx_drop_malformed",
    Expect.OPCODE: "rx_drop_opcode",
}


class PktloopTB(TB):
    def __init__(self, dut, pause=None):
        super().__init__(dut)
        self.width = tb_param("width")
        self.nbytes = self.width // 8
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_rx"), dut.clk, dut.rst)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_tx"), dut.clk, dut.rst)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        if pause is None:
            pause = tb_param("pause", float, 0.3)
        if pause:
            self.source.set_pause_generator(pause_generator(pause, name="rx"))
            self.sink.set_pause_generator(pause_generator(pause, name="tx"))
            # The CSR bus gets its own random stalls too (read address and data channels).
            self.axil.read_if.ar_channel.set_pause_generator(pause_generator(pause, name="ar"))
            self.axil.read_if.r_channel.set_pause_generator(pause_generator(pause, name="r"))

    async def counters(self):
        out = {}
        for name in COUNTERS:
            out[name] = await self.axil.read_dword(REGMAP[f"pktengine.{name}"].offset)
        return out

    async def collect(self, count, timeout_us):
        """Receive ``count`` frames, then anything else that leaks out within 2 us."""
        out = []
        for _ in range(count):
            frame = await with_timeout(self.sink.recv(), timeout_us, "us")
            out.append(bytes(frame.tdata))
        await Timer(2, "us")
        while not self.sink.empty():
            out.append(bytes(self.sink.recv_nowait().tdata))
        return out

    def timeout_for(self, frames):
        beats = sum(-(-len(f) // self.nbytes) + 4 for f in frames)
        # Generous: every beat may stall on both sides; 4 ns clock.
        return 100 + beats * 40 * 4 // 1000   # whole microseconds (cocotb timer precision)


async def run_and_check(tb, frames, expects, descs=None):
    """Send frames with their expected outcomes; check output bytes and every counter."""
    descs = descs or [""] * len(frames)
    before = await tb.counters()
    for f in frames:
        await tb.source.send(AxiStreamFrame(f))
    kept = [i for i, e in enumerate(expects) if e in (Expect.PASS, Expect.NON_ROCE)]
    wanted = [frames[i] for i in kept]
    got = await tb.collect(len(wanted), tb.timeout_for(frames))
    for n, (g, w) in enumerate(zip(got, wanted, strict=False)):
        i = kept[n]
        assert g == w, f"input frame {i} ({expects[i]}, {descs[i]}): " + frame_diff(n, g, w)
    assert len(got) == len(wanted), (
        f"{len(got)} frames left the loopback, {len(wanted)} expected; first extra: "
        f"{got[len(wanted)][:80].hex()}")
    after = await tb.counters()
    delta = {k: (after[k] - before[k]) & 0xFFFFFFFF for k in COUNTERS}
    n = {e: sum(1 for x in expects if x == e) for e in Expect}
    assert delta["rx_frames"] == len(frames), delta
    assert delta["tx_frames"] == len(wanted), delta
    for e, counter in DROP_COUNTER.items():
        assert delta[counter] == n[e], f"{counter}: {delta[counter]} != {n[e]} expected"
    assert delta["rx_drop_overflow"] == 0
    assert delta["rx_roce"] + delta["rx_non_roce"] == len(frames)
    # Frames the golden model calls RoCEv2 and that are not malformed are counted as RoCE.
    roce_clear = sum(1 for f, e in zip(frames, expects, strict=True)
                     if e != Expect.MALFORMED and is_rocev2(f))
    nonroce_clear = sum(1 for e in expects if e == Expect.NON_ROCE)
    assert delta["rx_roce"] >= roce_clear and delta["rx_non_roce"] >= nonroce_clear, delta
    ce = sum(1 for f, e in zip(frames, expects, strict=True)
             if e == Expect.PASS and is_rocev2(f) and _ecn(f) == 3)
    assert delta["rx_ecn_ce"] == ce, delta
    return delta


def frame_diff(index, got, want):
    """A short description of where two frames differ (whole jumbo frames drown a log)."""
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
              min(len(got), len(want)))
    lo = max(0, at - 16)
    return (f"output frame {index} differs at byte {at} (got {len(got)} bytes, want {len(want)}):\n"
            f"  got  [{lo}:] {got[lo:at + 32].hex()}\n  want [{lo}:] {want[lo:at + 32].hex()}\n"
            f"  want header {want[:64].hex()}")


def random_frame(rng, **kw):
    return packets.roce_frame(**packets.random_roce(rng, **kw))


def _ecn(frame):
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    p = Ether(frame)
    if IP in p:
        return p[IP].tos & 3
    if IPv6 in p:
        return p[IPv6].tc & 3
    return 0


@cocotb.test()
async def ident_registers(dut):
    """The CSR bank answers: magic, version, feature list naming the packet engine."""
    tb = PktloopTB(dut)
    await tb.reset()
    assert await tb.axil.read_dword(REGMAP["ident.id"].offset) == MAGIC
    assert await tb.axil.read_dword(REGMAP["pktengine.config"].offset) & 0xFFFF == tb.nbytes
    await tb.axil.write_dword(REGMAP["ident.scratch"].offset, 0x5A5A1234)
    assert await tb.axil.read_dword(REGMAP["ident.scratch"].offset) == 0x5A5A1234


@cocotb.test()
async def mixed_trace(dut):
    """The scapy mixed trace: valid RoCE of every kind byte for byte, non-RoCE unchanged, every
    corrupted frame dropped and counted under its reason."""
    tb = PktloopTB(dut)
    await tb.reset()
    trace = packets.mixed_trace(cocotb.RANDOM_SEED, tb_param("frames", int, 120))
    await run_and_check(tb, [t.frame for t in trace], [t.expect for t in trace],
                        [t.desc for t in trace])


@cocotb.test()
async def captures(dut):
    """Every frame of the real captures (hardware RoCE NIC, soft-RoCE, ConnectX CNP) passes
    byte for byte; every RoCEv2 frame among them is counted in rx_roce."""
    tb = PktloopTB(dut)
    await tb.reset()
    frames = [f for fs in load_captures().values() for f in fs]
    expects = [Expect.PASS if is_rocev2(f) else Expect.NON_ROCE for f in frames]
    delta = await run_and_check(tb, frames, expects)
    assert delta["rx_roce"] == sum(1 for e in expects if e == Expect.PASS)
    assert delta["rx_roce"] == 131, delta


@cocotb.test()
async def random_roundtrip(dut):
    """Property: random valid RoCEv2 frames (any opcode, IPv4 with options or IPv6, VLAN or not,
    random field values and lengths) round-trip exactly."""
    tb = PktloopTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED)
    frames = [random_frame(rng) for _ in range(tb_param("frames", int, 120))]
    await run_and_check(tb, frames, [Expect.PASS] * len(frames))


@cocotb.test()
async def random_corruption(dut):
    """Property: one corrupted byte in a valid frame drops it under the counter the corrupted
    region implies (any IPv4 header byte other than version/IHL/length/protocol/fragment ->
    IP checksum; BTH PSN/QPN, extension headers, payload or ICRC -> ICRC), and changes nothing
    else: the valid frames around it still pass byte for byte."""
    tb = PktloopTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED)
    frames, expects = [], []
    for _ in range(tb_param("frames", int, 120) // 2):
        f = bytearray(random_frame(rng, ipv6=False, ip_options=b""))
        ip = packets.ip_offset(bytes(f))
        ihl = (f[ip] & 0xF) * 4
        bth = ip + ihl + 8
        ip_end = ip + int.from_bytes(f[ip + 2:ip + 4], "big")
        if rng.random() < 0.5:
            # TOS, ID, TTL, checksum, src, dst: the IPv4 checksum catches all of them.
            pos = ip + rng.choice([1, 4, 5, 8, 10, 11] + list(range(12, ihl)))
            expect = Expect.IP_CHECKSUM
        else:
            # BTH PSN/dest QP bytes, everything after the BTH up to the end of the ICRC.
            pos = rng.choice([bth + 5, bth + 6, bth + 7, bth + 9, bth + 10, bth + 11]
                             + list(range(bth + 12, ip_end)))
            expect = Expect.ICRC
        f[pos] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
        frames.append(bytes(f))
        expects.append(expect)
        frames.append(random_frame(rng))
        expects.append(Expect.PASS)
    await run_and_check(tb, frames, expects)


@cocotb.test(skip=os.environ.get("STELLAR_TB_TRACE") is None)
async def sim_trace(dut):
    """The ``make sim`` job: send a pcap without stalls, write tx.pcap and summary.json."""
    tb = PktloopTB(dut, pause=0.0)
    await tb.reset()
    frames = packets.read_pcap(os.environ["STELLAR_TB_TRACE"])
    out_dir = Path(os.environ["STELLAR_TB_OUT"])
    stats = {"rx_beats": 0, "tx_beats": 0, "first_rx": [], "first_tx": [], "last_rx": 0,
             "rx_stall": 0}

    async def monitor():
        # One sample per clock edge: exact cycle counts for beats per cycle and latency.
        rx_first, tx_first, cycle = True, True, 0
        d = tb.dut
        while True:
            await RisingEdge(d.clk)
            cycle += 1
            if d.s_axis_rx_tvalid.value and not d.s_axis_rx_tready.value:
                stats["rx_stall"] += 1
            if d.s_axis_rx_tvalid.value and d.s_axis_rx_tready.value:
                stats["rx_beats"] += 1
                stats["last_rx"] = cycle
                if rx_first:
                    stats["first_rx"].append(cycle)
                rx_first = bool(d.s_axis_rx_tlast.value)
            if d.m_axis_tx_tvalid.value and d.m_axis_tx_tready.value:
                stats["tx_beats"] += 1
                if tx_first:
                    stats["first_tx"].append(cycle)
                tx_first = bool(d.m_axis_tx_tlast.value)

    cocotb.start_soon(monitor())
    for f in frames:
        await tb.source.send(AxiStreamFrame(f))
    out = []
    while True:
        try:
            frame = await with_timeout(tb.sink.recv(), tb.timeout_for(frames), "us")
        except Exception:
            break
        out.append(bytes(frame.tdata))
        if len(out) == len(frames):
            break
        if tb.sink.empty() and tb.source.empty() and not tb.source.active:
            await Timer(5, "us")
            if tb.sink.empty():
                break
    packets.write_pcap(out_dir / "tx.pcap", out)
    summary = {
        "width": tb.width,
        "frames_in": len(frames),
        "frames_out": len(out),
        "counters": await tb.counters(),
        "rx_beats": stats["rx_beats"],
        "rx_stall_cycles": stats["rx_stall"],
        "rx_cycles": stats["last_rx"] - stats["first_rx"][0] + 1 if stats["first_rx"] else 0,
        "tx_beats": stats["tx_beats"],
        "first_rx_cycles": stats["first_rx"],
        "first_tx_cycles": stats["first_tx"],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
