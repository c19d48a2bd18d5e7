# Ref: IBTA Vol 1 Annex A17 (RoCEv2); IEEE 802.3-2018 clauses 3, 35; RGMII v2.0
"""cocotb testbench of ``stellar_board`` (``stellar.hdl.boards.top``, the board top with
modelled pins): RoCE frames in and out over RGMII (cocotbext-eth's ``RgmiiSource`` /
``RgmiiSink``), the host driver's register accesses over the UART control bridge
(``stellar.host.uartbus.UartBus`` on a bit-level UART model of the pins), block-RAM device
memory behind the core's DMA port, and the ``wq`` register queues.

The golden models are independent of the gateware: scapy builds and checks the RoCE frames and
their ICRC (``stellar.sim.rcpackets``), ``zlib.crc32`` the FCS, ``stellar.host.tables`` and the
field tables of ``stellar.hdl.transport.formats`` the register contents.

Clocks: ``clk`` (core) 6.4 ns, ``eth_tx_clk`` 8 ns with ``eth_tx90_clk`` 2 ns behind it,
``rgmii_rxc`` 8 ns at an unrelated phase. The UART runs at ``STELLAR_TB_DIVISOR`` core clocks
per bit (default 8, the divisor the Verilog was built with).
Seeds come from cocotb's ``RANDOM_SEED`` (printed by the runner).
"""

import random
import zlib

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, Timer, with_timeout
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource
from stellar.hdl.flow.fields import Access, PathMtu, QpState
from stellar.hdl.regmap import FEATURE_MAC, FEATURE_WQ, MAGIC, REGMAP, decode_feature
from stellar.hdl.transport.formats import COMPLETION, WORK_REQUEST, WcOpcode, WcStatus, WrOpcode
from stellar.host.tables import Tables
from stellar.host.uartbus import SimTransport, UartBus

from .rcmodel import Aeth, Packet, Reth
from .rcpackets import from_frame, to_frame
from .tb import tb_param
from .verbs import Opcode

CLK_NS = 6.4
NIC_MAC, NIC_IP = 0x02_00_00_00_00_01, 0x0A_00_00_01        # rcpackets.to_frame's defaults
PEER_MAC, PEER_IP = 0x02_00_00_00_00_C0, 0x0A_00_00_63
QP_INDEX, LOCAL_QPN, REMOTE_QPN = 2, 0x000123, 0x000456
MR_INDEX, MR_TAG = 1, 0x5A
DEVMEM = 16 * 1024


class UartPins:
    """8N1 on the bridge's pins at ``divisor`` core clocks per bit: ``write`` drives
    ``uart_rx``, a monitor collects bytes from ``uart_tx`` (sampled mid-bit; a low stop bit is
    an error)."""

    def __init__(self, dut, divisor):
        self.dut, self.divisor = dut, divisor
        self.received = bytearray()
        dut.uart_rx.value = 1
        cocotb.start_soon(self._monitor())

    async def write(self, data):
        for byte in data:
            for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [1]:
                self.dut.uart_rx.value = bit
                await ClockCycles(self.dut.clk, self.divisor)

    async def _monitor(self):
        tx, clk, d = self.dut.uart_tx, self.dut.clk, self.divisor
        while True:
            await FallingEdge(tx)
            await ClockCycles(clk, d // 2)
            assert tx.value == 0, "UART start bit shorter than half a bit"
            byte = 0
            for i in range(8):
                await ClockCycles(clk, d)
                byte |= int(tx.value) << i
            await ClockCycles(clk, d)
            assert tx.value == 1, f"UART stop bit low after byte {byte:#04x}"
            self.received.append(byte)

    async def read(self, count, timeout):
        waited, step = 0.0, self.divisor * 10 * CLK_NS * 1e-9
        while len(self.received) < count and waited < timeout:
            await ClockCycles(self.dut.clk, self.divisor * 10)
            waited += step
        out = bytes(self.received[:count])
        del self.received[:count]
        return out

    async def sleep(self, seconds):
        await Timer(round(seconds * 1e9), "ns")

    async def discard(self):
        self.received.clear()

    def transport(self):
        return SimTransport(write=self.write, read=self.read, sleep=self.sleep,
                            discard_input=self.discard)


class BoardTB:
    def __init__(self, dut):
        self.dut = dut
        self.log = dut._log
        dut.rst.value = 1
        dut.eth_tx_rst.value = 1
        Clock(dut.clk, CLK_NS, unit="ns").start()
        Clock(dut.eth_tx_clk, 8, unit="ns").start()
        cocotb.start_soon(self._delayed_clock(dut.eth_tx90_clk, 2))
        cocotb.start_soon(self._delayed_clock(dut.rgmii_rxc, 3))
        self.source = RgmiiSource(dut.rgmii_rxd, dut.rgmii_rx_ctl, dut.rgmii_rxc)
        self.sink = RgmiiSink(dut.rgmii_txd, dut.rgmii_tx_ctl, dut.rgmii_txc)
        divisor = tb_param("divisor", int, 8)
        self.uart = UartPins(dut, divisor)
        baud = 1e9 / (CLK_NS * divisor)
        self.bus = UartBus(self.uart.transport(), baudrate=baud)
        self.tables = Tables(self.bus)
        self.rkey = None

    @staticmethod
    async def _delayed_clock(signal, delay_ns):
        signal.value = 0
        await Timer(delay_ns, "ns")
        Clock(signal, 8, unit="ns").start()

    async def reset(self):
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        self.dut.eth_tx_rst.value = 0
        await ClockCycles(self.dut.clk, 16)

    async def reg(self, name):
        return await self.bus.read32(REGMAP[name].offset)

    async def set_reg(self, name, value):
        await self.bus.write32(REGMAP[name].offset, value)

    async def counters(self, block):
        return {r.name: await self.reg(f"{block}.{r.name}")
                for r in REGMAP.block(block).registers if r.access == "counter"}

    async def setup_qp(self, *, sq_psn, rq_psn, index=QP_INDEX, qpn=LOCAL_QPN):
        """Local address, one MR over all device memory, QP ``index`` (number ``qpn``) in RTS
        towards the peer (what stellar.sim.nic.SimNic does over AXI4-Lite, here over the UART).
        The tests of one simulator run share the tables (a reset does not clear block RAM), so
        each uses a QP of its own."""
        await self.set_reg("transport.gid0_mac_lo", NIC_MAC & 0xFFFFFFFF)
        await self.set_reg("transport.gid0_mac_hi", NIC_MAC >> 32)
        await self.set_reg("transport.gid0_ip0", NIC_IP)
        access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        self.rkey = await self.tables.write_mr(MR_INDEX, tag=MR_TAG, tenant=0, pd=0, access=access,
                                               va=0, length=DEVMEM, bus_base=0)
        await self.tables.insert_flow(0, qpn, index)
        await self.tables.write_qp(
            index, state=QpState.RTS, tenant=0, pd=0, pmtu=int(PathMtu.MTU_1024), ipv6=0,
            dst_mac=PEER_MAC, dst_ip=PEER_IP, sgid_index=0, remote_qpn=REMOTE_QPN,
            sq_psn=sq_psn, epsn=rq_psn, msn=0, timeout=20, retry_cnt=7, rnr_retry=7,
            min_rnr_timer=1, pkey=0xFFFF, traffic_class=0, hop_limit=64, flow_label=0,
            udp_sport=0xC000, sl=0, tx_vlan=0, cc_mode=0, weight=0)

    async def wire_in(self, frame, *, corrupt_fcs=False):
        g = GmiiFrame.from_payload(frame + bytes(max(0, 60 - len(frame))))
        if corrupt_fcs:
            g.data[-1] ^= 0x01
        await self.source.send(g)
        await self.source.wait()

    async def wire_out(self, timeout_us=200):
        """The next frame the board sends: preamble, FCS and padding checked, returned without
        FCS."""
        g = await with_timeout(self.sink.recv(), timeout_us, "us")
        data = bytes(g.data)
        assert data[:8] == bytes([0x55] * 7 + [0xD5]), f"preamble {data[:8].hex()}"
        body = data[8:-4]
        assert len(body) >= 60, f"frame of {len(body)} bytes below the minimum"
        assert data[-4:] == zlib.crc32(body).to_bytes(4, "little"), "FCS of a transmitted frame"
        return body


def peer_frame(pkt, qpn=LOCAL_QPN):
    return to_frame(pkt, dest_qp=qpn, src_mac=PEER_MAC, dst_mac=NIC_MAC, src_ip=PEER_IP,
                    dst_ip=NIC_IP)


@cocotb.test()
async def driver_over_uart(dut):
    """The host driver finds the device through the UART bridge: ident.id is the magic, the
    feature list names the mac and wq blocks at their bases, scratch reads back, and a QP
    context written through stellar.host.tables reads back field by field."""
    tb = BoardTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED)
    assert await tb.reg("ident.id") == MAGIC
    n = await tb.reg("ident.feature_count")
    feats = {}
    for i in range(n):
        fid, _version, base = decode_feature(await tb.reg(f"ident.feature{i}"))
        feats[fid] = base
    assert feats.get(FEATURE_MAC) == REGMAP.block("mac").base, feats
    assert feats.get(FEATURE_WQ) == REGMAP.block("wq").base, feats
    pattern = rng.getrandbits(32)
    await tb.set_reg("ident.scratch", pattern)
    assert await tb.reg("ident.scratch") == pattern
    want = dict(state=int(QpState.RTS), tenant=0, remote_qpn=rng.getrandbits(24),
                sq_psn=rng.getrandbits(24), epsn=rng.getrandbits(24), dst_ip=rng.getrandbits(32),
                dst_mac=rng.getrandbits(48), udp_sport=rng.getrandbits(16))
    await tb.tables.write_qp(5, **want)
    got = await tb.tables.read_qp(5)
    assert {k: got[k] for k in want} == want, (got, want)
    # the wq block answers through the split (depths), the core's bank does not hold it
    assert await tb.reg("wq.config") == 4 | (4 << 8) | (16 << 16)


@cocotb.test()
async def roce_over_rgmii(dut):
    """RDMA WRITE in over RGMII lands in device memory and is ACKed over RGMII; an RDMA READ
    returns the bytes; a WRITE with a bad FCS is dropped by the MAC, counted in
    mac.rx_fcs_errors and changes no memory (the next READ returns the old bytes)."""
    tb = BoardTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED + 1)
    psn = rng.randrange(1 << 23)
    await tb.setup_qp(sq_psn=0x100, rq_psn=psn)
    va, length = 0x40 * rng.randrange(1, 64), rng.randrange(16, 200)
    data = bytes(rng.randrange(256) for _ in range(length))

    write = Packet(Opcode.WRITE_ONLY, psn, ackreq=True, payload=data,
                   reth=Reth(va, tb.rkey, length))
    await tb.wire_in(peer_frame(write))
    ack = from_frame(await tb.wire_out())
    assert ack.icrc_ok and ack.dest_qp == REMOTE_QPN, ack
    assert ack.pkt.opcode == Opcode.ACKNOWLEDGE and ack.pkt.psn == psn, ack.pkt
    assert ack.pkt.aeth.syndrome >> 5 == 0, f"AETH syndrome {ack.pkt.aeth.syndrome:#x} is no ACK"

    # the same WRITE with other bytes and a corrupted FCS: dropped before the core
    bad = Packet(Opcode.WRITE_ONLY, (psn + 1) & 0xFFFFFF, ackreq=True,
                 payload=bytes(b ^ 0xFF for b in data), reth=Reth(va, tb.rkey, length))
    await tb.wire_in(peer_frame(bad), corrupt_fcs=True)

    read = Packet(Opcode.READ_REQUEST, (psn + 1) & 0xFFFFFF, ackreq=True,
                  reth=Reth(va, tb.rkey, length))
    await tb.wire_in(peer_frame(read))
    resp = from_frame(await tb.wire_out())
    assert resp.icrc_ok and resp.dest_qp == REMOTE_QPN, resp
    assert resp.pkt.opcode == Opcode.READ_RESP_ONLY and resp.pkt.psn == read.psn, resp.pkt
    assert resp.pkt.payload == data, "READ response bytes differ from the WRITE's"

    mac = await tb.counters("mac")
    assert mac["rx_fcs_errors"] == 1 and mac["rx_frames"] == 2 and mac["tx_frames"] == 2, mac
    assert sum(mac.values()) == 5, mac
    assert (await tb.counters("pktengine"))["rx_frames"] == 2


@cocotb.test()
async def work_request_through_registers(dut):
    """A signaled inline RDMA WRITE pushed through the wq registers goes out over RGMII with its
    bytes; the peer's ACK completes it, and the completion is read from cq_data and popped;
    a pop of the empty queue and a push's counters are counted."""
    tb = BoardTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED + 2)
    sq_psn = rng.randrange(1 << 23)
    index, qpn = QP_INDEX + 1, LOCAL_QPN + 1
    await tb.setup_qp(sq_psn=sq_psn, rq_psn=0, index=index, qpn=qpn)
    inline = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 33)))
    wr_id, raddr, rkey = rng.getrandbits(64), rng.getrandbits(48), rng.getrandbits(32)
    word = WORK_REQUEST.pack(qp=index, opcode=int(WrOpcode.RDMA_WRITE), signaled=1, inline=1,
                             wr_id=wr_id, laddr=0, length=len(inline), raddr=raddr, rkey=rkey,
                             imm=0, inline_data=int.from_bytes(inline.ljust(32, b"\0"), "little"))
    for i in range(18):
        await tb.set_reg(f"wq.wr_data{i}", (word >> (32 * i)) & 0xFFFFFFFF)
    await tb.set_reg("wq.wr_push", 1)

    out = from_frame(await tb.wire_out())
    assert out.icrc_ok and out.dest_qp == REMOTE_QPN, out
    assert out.pkt.opcode == Opcode.WRITE_ONLY and out.pkt.psn == sq_psn, out.pkt
    assert out.pkt.reth == Reth(raddr, rkey, len(inline)), out.pkt.reth
    assert out.pkt.payload == inline
    assert await tb.reg("wq.cq_level") == 0                    # not complete before the ACK

    ack = Packet(Opcode.ACKNOWLEDGE, sq_psn, aeth=Aeth(0x1F, 1))   # ACK, no credit limit, MSN 1
    await tb.wire_in(peer_frame(ack, qpn))
    for _ in range(20):
        if await tb.reg("wq.cq_level"):
            break
    assert await tb.reg("wq.cq_level") == 1
    words = [await tb.reg(f"wq.cq_data{i}") for i in range(6)]
    cqe = COMPLETION.unpack(sum(w << (32 * i) for i, w in enumerate(words)))
    assert cqe["qp"] == index and cqe["wr_id"] == wr_id and not cqe["is_recv"], cqe
    assert WcStatus(cqe["status"]) == WcStatus.SUCCESS, cqe
    assert WcOpcode(cqe["opcode"]) == WcOpcode.RDMA_WRITE, cqe
    await tb.set_reg("wq.cq_pop", 1)
    assert await tb.reg("wq.cq_level") == 0
    assert [await tb.reg(f"wq.cq_data{i}") for i in range(6)] == [0] * 6
    await tb.set_reg("wq.cq_pop", 1)                            # nothing to pop
    c = await tb.counters("wq")
    assert c == {"wr_pushed": 1, "rr_pushed": 0, "cq_popped": 1, "push_full": 0, "pop_empty": 1}, c
