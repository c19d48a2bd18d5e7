# Ref: IEEE 802.3-2018 clauses 3, 35; RGMII v2.0
"""cocotb testbench of ``stellar_mac`` (``stellar.hdl.top.mac``): the RGMII MAC on Verilator
with cocotbext-eth's RGMII models on the pins and cocotbext-axi on the core-side streams.

Structure as in Corundum's testbenches: a TB class with the clocks, the reset and the BFMs
bound by prefix; scapy builds the frames (the golden model), ``zlib.crc32`` the FCS
(cocotbext-eth's ``GmiiFrame.from_payload`` for the receive side, our own check on the transmit
side); random idle gaps on the wire and random backpressure on both core-side streams.

Clocks: ``clk`` (core) 6.4 ns, ``eth_tx_clk`` 8 ns with ``eth_tx90_clk`` 2 ns behind it (it
drives ``rgmii_txc``, which the sink samples on), ``rgmii_rxc`` 8 ns at an unrelated phase.

Parameters (environment, ``stellar.sim.tb.tb_param``): ``STELLAR_TB_WIDTH`` (core side, 64),
``STELLAR_TB_FRAMES`` (frames per direction, default 24), ``STELLAR_TB_PAUSE`` (stall
probability on the AXI streams, default 0.3). Seeds come from cocotb's ``RANDOM_SEED``
(printed by the runner; the pause generators log theirs).
"""

import random
import zlib

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Timer, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw
from stellar.hdl.mac.cdc import COUNTERS

from .tb import pause_generator, tb_param

PREAMBLE = bytes([0x55] * 7 + [0xD5])


class MacTB:
    def __init__(self, dut, *, pause=None):
        self.dut = dut
        self.log = dut._log
        dut.rst.value = 1
        dut.eth_tx_rst.value = 1
        Clock(dut.clk, 6.4, unit="ns").start()
        Clock(dut.eth_tx_clk, 8, unit="ns").start()
        cocotb.start_soon(self._delayed_clock(dut.eth_tx90_clk, 2))
        cocotb.start_soon(self._delayed_clock(dut.rgmii_rxc, 3))
        self.source = RgmiiSource(dut.rgmii_rxd, dut.rgmii_rx_ctl, dut.rgmii_rxc)
        self.sink = RgmiiSink(dut.rgmii_txd, dut.rgmii_tx_ctl, dut.rgmii_txc)
        self.axis_tx = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_tx"), dut.clk, dut.rst)
        self.axis_rx = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_rx"), dut.clk, dut.rst)
        if pause is None:
            pause = tb_param("pause", float, 0.3)
        if pause:
            self.axis_tx.set_pause_generator(pause_generator(pause, name="tx"))
            self.axis_rx.set_pause_generator(pause_generator(pause, name="rx"))

    @staticmethod
    async def _delayed_clock(signal, delay_ns):
        signal.value = 0
        await Timer(delay_ns, "ns")
        Clock(signal, 8, unit="ns").start()

    async def reset(self):
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        self.dut.eth_tx_rst.value = 0
        await ClockCycles(self.dut.clk, 8)

    def counters(self):
        return {name: getattr(self.dut, f"count_{name}").value.to_unsigned() for name in COUNTERS}

    async def send_wire(self, frames, rng, *, idle_max=40):
        """Frames (with their FCS and preamble as GmiiFrames) into rgmii_rx*, each after a
        random idle time."""
        for f in frames:
            if rng.random() < 0.5:
                await ClockCycles(self.dut.rgmii_rxc, rng.randint(0, idle_max))
            await self.source.send(f)
        await self.source.wait()

    async def recv_core(self, count, timeout_us=400):
        out = []
        for _ in range(count):
            frame = await with_timeout(self.axis_rx.recv(), timeout_us, "us")
            out.append(bytes(frame.tdata))
        return out

    async def quiet(self, us=3):
        """Wait, then return whatever else reached the core (must be nothing)."""
        await Timer(us, "us")
        extra = []
        while not self.axis_rx.empty():
            extra.append(bytes(self.axis_rx.recv_nowait().tdata))
        return extra


def scapy_frame(rng):
    """A random Ethernet frame from scapy: UDP/IPv4, sometimes VLAN-tagged, 0..400 bytes of
    payload (short ones below the 60-byte minimum are padded by the MAC)."""
    eth = Ether(src=f"02:00:00:00:00:{rng.randrange(256):02x}", dst="02:00:00:00:01:02")
    l3 = IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=rng.randrange(65536), dport=4791)
    payload = Raw(bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 5, 18, 64, 200, 400]))))
    if rng.random() < 0.3:
        eth = eth / Dot1Q(vlan=rng.randrange(1, 4095))
    pkt = eth / l3 / payload
    return bytes(pkt)


def raw_frame(rng, length):
    return bytes(rng.randrange(256) for _ in range(length))


def check_wire(got: GmiiFrame, want: bytes):
    """A transmitted GMII frame: preamble + SFD, ``want`` padded to 60 bytes, zlib FCS."""
    data = bytes(got.data)
    assert data[:8] == PREAMBLE, f"preamble {data[:8].hex()}"
    body = want + bytes(max(0, 60 - len(want)))
    assert data[8:-4] == body, f"frame body differs: got {data[8:40].hex()}..., want {body[:32].hex()}..."
    assert data[-4:] == zlib.crc32(body).to_bytes(4, "little"), "FCS"
    assert not any(got.error or []), "TX_ER on a transmitted frame"


@cocotb.test()
async def frames_both_ways(dut):
    """scapy frames in over RGMII come out of m_axis_rx byte-exact without FCS, and frames on
    s_axis_tx leave over RGMII with preamble, padding and FCS, both directions at once, with
    random idle gaps on the wire and random backpressure on the core side."""
    tb = MacTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED)
    n = tb_param("frames", int, 24)
    rx_frames = [scapy_frame(rng) for _ in range(n)]
    rx_frames = [f + bytes(max(0, 60 - len(f))) for f in rx_frames]   # the wire carries >= 60
    tx_frames = [scapy_frame(rng) for _ in range(n)]

    async def transmit():
        for f in tx_frames:
            await tb.axis_tx.send(AxiStreamFrame(f))

    cocotb.start_soon(transmit())
    sender = cocotb.start_soon(tb.send_wire([GmiiFrame.from_payload(f) for f in rx_frames], rng))
    got = await tb.recv_core(len(rx_frames))
    for k, (g, w) in enumerate(zip(got, rx_frames, strict=True)):
        assert g == w, f"received frame {k}: got {g[:32].hex()}..., want {w[:32].hex()}..."
    for k, f in enumerate(tx_frames):
        wire = await with_timeout(tb.sink.recv(), 400, "us")
        try:
            check_wire(wire, f)
        except AssertionError as exc:
            raise AssertionError(f"transmitted frame {k}: {exc}") from None
    await sender
    assert await tb.quiet() == []
    c = tb.counters()
    assert c["rx_frames"] == len(rx_frames) and c["tx_frames"] == len(tx_frames), c
    assert sum(c.values()) == len(rx_frames) + len(tx_frames), c


@cocotb.test()
async def errors_dropped_and_counted(dut):
    """Frames with a corrupted FCS or payload byte, with RX_ER on one byte, runts and frames
    above 1522 bytes are dropped and counted under their reason; the good frames between them
    arrive byte-exact and in order."""
    tb = MacTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED + 1)
    sent, want, expect = [], [], {name: 0 for name in COUNTERS}
    for _ in range(tb_param("frames", int, 24)):
        kind = rng.choice(["good", "good", "fcs", "payload", "er", "runt", "big"])
        frame = scapy_frame(rng) if kind != "big" else raw_frame(rng, rng.randint(1519, 1540))
        frame = frame + bytes(max(0, 60 - len(frame)))
        if kind == "runt":
            frame = frame[:rng.randint(14, 59)]
            g = GmiiFrame.from_payload(frame, min_len=0)
        else:
            g = GmiiFrame.from_payload(frame)
        if kind in ("fcs", "payload"):
            # flip one bit in the FCS, or in the frame (after the 8 preamble bytes)
            pos = len(g.data) - rng.randint(1, 4) if kind == "fcs" else 8 + rng.randrange(len(frame))
            g.data[pos] ^= 1 << rng.randrange(8)
        if kind == "er":
            g.error = [0] * len(g.data)
            g.error[8 + rng.randrange(len(frame))] = 1
        sent.append(g)
        counter = {"good": "rx_frames", "fcs": "rx_fcs_errors", "payload": "rx_fcs_errors",
                   "er": "rx_phy_errors", "runt": "rx_runts", "big": "rx_oversize"}[kind]
        expect[counter] += 1
        if kind == "good":
            want.append(frame)
    await tb.send_wire(sent, rng, idle_max=10)
    got = await tb.recv_core(len(want))
    assert got == want
    assert await tb.quiet() == []
    c = tb.counters()
    assert c == expect, f"counters {c}, expected {expect}"


@cocotb.test()
async def overrun_drops_whole_frames(dut):
    """The core refuses received frames while 40 frames arrive back to back: the MAC's buffers
    fill, later frames are dropped whole and counted as overruns; once the core reads again it
    gets a subsequence of the sent frames in order, each byte-exact, as many as rx_frames says,
    and rx_frames + rx_overruns is every frame sent."""
    tb = MacTB(dut, pause=0.0)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED + 2)
    frames = []
    for k in range(40):
        f = bytes([k]) + raw_frame(rng, rng.choice([59, 150, 400, 700]))
        frames.append(f)
    tb.axis_rx.pause = True
    await tb.send_wire([GmiiFrame.from_payload(f) for f in frames], rng, idle_max=0)
    await Timer(2, "us")
    c = tb.counters()
    assert c["rx_overruns"] > 0, c
    assert c["rx_frames"] + c["rx_overruns"] == len(frames), c
    tb.axis_rx.set_pause_generator(pause_generator(0.3, name="rx-drain"))
    tb.axis_rx.pause = False
    got = await tb.recv_core(c["rx_frames"])
    assert await tb.quiet() == []
    order = [g[0] for g in got]
    assert order == sorted(order) and len(set(order)) == len(order)
    for g in got:
        assert g == frames[g[0]], f"frame {g[0]} differs"
