"""cocotb testbench of ``stellar_pcie_usp``: the NIC core behind the UltraScale+ PCIe adapter,
driven through cocotbext-pcie's RootComplex and hard-block model (``stellar.sim.pcie``).

Tests (``tests/cocotb/test_pcie.py`` launches them):

* ``mmio``: enumeration; BAR0 reads of the ident block (magic, version, feature list) and the
  table sizes through the driver's table code (``stellar.host.tables.Tables`` over the device);
  scratch writes read back; a read of an unmapped register is refused (completion status CA
  -> ``PcieError``); MMIO read latency through the adapter (CQ request to CC completion).
* ``dma``: one QP and one memory region over a host-memory buffer set up over MMIO; RDMA
  WRITE packets (scapy-built, unaligned, longer than the max payload size) on ``s_axis_rx``
  land in the root complex's host memory; an RDMA READ request makes READ responses on
  ``m_axis_tx`` carrying the host-memory bytes (decoded with scapy, ICRC checked).

MSI (completion events) and the queues in host memory are tested through the host driver in
``stellar.sim.tb_verbs`` (same top).

Random backpressure (``STELLAR_TB_PAUSE``) on every stream the bench drives or takes: the
model's CQ / RC sources and RQ / CC sinks, ``s_axis_rx`` and ``m_axis_tx``. Seeds are logged.
"""

import logging
import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource
from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether
from stellar.hdl.flow.fields import Access, PathMtu, QpState
from stellar.hdl.regmap import MAGIC, REGMAP, VERSION, decode_feature, encode_version
from stellar.host.tables import Tables

from .pcie import PcieError, SimPcieDevice
from .rcmodel import Packet, Reth
from .rcpackets import from_frame, to_frame
from .tb import pause_generator, tb_param
from .verbs import Opcode

LOCAL_MAC, LOCAL_IP = 0x02_00_00_00_00_01, 0x0A_00_00_01      # rcpackets.to_frame's defaults
PEER_MAC, PEER_IP = 0x02_00_00_00_00_C0, 0x0A_00_00_63
QP_INDEX, QPN, REMOTE_QPN = 3, 0x0ABC, 0x0DEF
MR_INDEX, MR_TAG = 1, 0x5A
MR_VA = 0x1000_0000
HOST_BYTES = 1 << 16


class Bench:
    def __init__(self, dut):
        self.dut = dut
        self.log = logging.getLogger("cocotb.tb")
        self.pause = tb_param("pause", float, 0.0)
        self.seed = cocotb.RANDOM_SEED
        self.rng = random.Random(self.seed)
        self.log.info("pcie bench: seed %d, pause %.2f", self.seed, self.pause)
        # ``prefix`` "a": the bench runs on NIC A of ``stellar_pcie2`` (the same PcieNic as
        # ``stellar_pcie_usp``, its ports prefixed ``a_``, in its own clock domain; NIC B's clock
        # never runs), so it shares the two-host tests' build.
        prefix = tb_param("prefix", str, "")
        self.p = f"{prefix}_" if prefix else ""
        self.host = SimPcieDevice(dut, prefix=prefix, mps=256, mrrs=512, rcb_split=True,
                                  pause=self.pause)
        self.clk, self.rst = self.host.clk, self.host.rst
        self.rx = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"{self.p}s_axis_rx"), self.clk,
                                  self.rst)
        self.tx = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"{self.p}m_axis_tx"), self.clk,
                                self.rst)
        for lg in (self.rx.log, self.tx.log):
            lg.setLevel(logging.WARNING)
        if self.pause:
            self.rx.set_pause_generator(pause_generator(self.pause, name="rx"))
            self.tx.set_pause_generator(pause_generator(self.pause, name="tx"))
        self.cc_latency = []
        cocotb.start_soon(self._watch_mmio())

    async def start(self):
        await self.host.enumerate()
        return self.host

    async def _watch_mmio(self):
        """Clocks from each CQ request's first beat to its completion's first beat."""
        cq_valid, cq_ready, cq_last, cc_valid, cc_ready, cc_last = (
            getattr(self.dut, f"{self.p}{name}")
            for name in ("s_axis_cq_tvalid", "s_axis_cq_tready", "s_axis_cq_tlast",
                         "m_axis_cc_tvalid", "m_axis_cc_tready", "m_axis_cc_tlast"))
        t = 0
        start = None
        cq_first = True
        cc_first = True
        while True:
            await RisingEdge(self.clk)
            t += 1
            if cq_valid.value and cq_ready.value:
                if cq_first:
                    start = t
                cq_first = bool(cq_last.value)
            if cc_valid.value and cc_ready.value:
                if cc_first and start is not None:
                    self.cc_latency.append(t - start)
                    start = None
                cc_first = bool(cc_last.value)

    async def reg(self, name):
        return await self.host.read32(REGMAP[name].offset)

    async def set_reg(self, name, value):
        await self.host.write32(REGMAP[name].offset, value)


@cocotb.test()
async def mmio(dut):
    b = Bench(dut)
    dev = await b.start()
    assert await b.reg("ident.id") == MAGIC
    assert await b.reg("ident.version") == encode_version(*VERSION)
    count = await b.reg("ident.feature_count")
    assert count == REGMAP["ident.feature_count"].init
    for i in range(count):
        word = await b.reg(f"ident.feature{i}")
        assert word == REGMAP[f"ident.feature{i}"].init, f"feature{i}: {word:#x}"
        feature, version, base = decode_feature(word)
        b.log.info("feature %d: id %d version %d at %#06x", i, feature, version, base)
    # the driver's table code over the PCIe device
    cfg = await Tables(dev).config()
    assert cfg["qps"] == 16, cfg
    # writes (posted) then reads: PCIe keeps the read behind the write
    for _ in range(8):
        v = b.rng.getrandbits(32)
        await b.set_reg("ident.scratch", v)
        assert await b.reg("ident.scratch") == v
    # several writes back to back, one read
    for v in (1, 2, 0xDEAD_BEEF):
        await b.set_reg("ident.scratch", v)
    assert await b.reg("ident.scratch") == 0xDEAD_BEEF
    # an unmapped register: the CSR bank answers SLVERR, the adapter completes with CA
    try:
        await dev.read32(0xFFFC)
    except PcieError as e:
        b.log.info("unmapped read refused as expected: %s", e)
    else:
        raise AssertionError("read of an unmapped register was not refused")
    # and the device still answers
    assert await b.reg("ident.id") == MAGIC
    lat = sorted(b.cc_latency)
    b.log.info("MMIO read latency through the adapter (CQ first beat -> CC first beat): "
               "min %d, median %d, max %d clocks over %d reads", lat[0], lat[len(lat) // 2],
               lat[-1], len(lat))


async def setup_qp(b, dev, buf):
    t = Tables(dev)
    await b.set_reg("transport.gid0_mac_lo", LOCAL_MAC & 0xFFFFFFFF)
    await b.set_reg("transport.gid0_mac_hi", LOCAL_MAC >> 32)
    await b.set_reg("transport.gid0_ip0", LOCAL_IP)
    access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
    rkey = await t.write_mr(MR_INDEX, tag=MR_TAG, tenant=0, pd=0, access=access, va=MR_VA,
                            length=len(buf), bus_base=buf.bus_addr)
    await t.insert_flow(0, QPN, QP_INDEX)
    await t.write_qp(
        QP_INDEX, state=QpState.RTS, tenant=0, pd=0, pmtu=int(PathMtu.MTU_1024), ipv6=0,
        dst_mac=PEER_MAC, dst_ip=PEER_IP, sgid_index=0, remote_qpn=REMOTE_QPN, sq_psn=0,
        epsn=0, msn=0, timeout=2, retry_cnt=7, rnr_retry=7, min_rnr_timer=1, pkey=0xFFFF,
        traffic_class=0, hop_limit=64, flow_label=0, udp_sport=0xC000, sl=0,
        tx_vlan=0, cc_mode=0, weight=0)
    return rkey


async def wait_for(b, cond, limit, what):
    for _ in range(limit // 16):
        if cond():
            return
        await ClockCycles(b.clk, 16)
    raise AssertionError(f"timeout after {limit} clocks waiting for {what}")


@cocotb.test()
async def dma(dut):
    b = Bench(dut)
    dev = await b.start()
    # the program's own array, registered zero-copy (the seed's register_memory(x.numpy()))
    host = np.zeros(HOST_BYTES, dtype=np.uint8)
    buf = dev.map_dma(host)
    junk = bytes(b.rng.getrandbits(8) for _ in range(HOST_BYTES))
    buf.view[:] = junk
    assert host.tobytes() == junk, "map_dma must not copy"
    rkey = await setup_qp(b, dev, buf)
    b.log.info("MR over host memory %#x (+%d bytes), rkey %#x", buf.bus_addr, len(buf), rkey)

    # RDMA WRITEs: device -> host memory by memory-write TLPs (unaligned, > max payload size)
    psn = 0
    expect = bytearray(junk)
    for offset, length in ((0x105, 700), (0x2002, 1024), (0x3FF8, 13), (0x5000, 256)):
        data = bytes(b.rng.getrandbits(8) for _ in range(length))
        pkt = Packet(Opcode.WRITE_ONLY, psn, ackreq=True, payload=data,
                     reth=Reth(MR_VA + offset, rkey, length))
        await b.rx.send(AxiStreamFrame(to_frame(pkt, dest_qp=QPN)))
        expect[offset:offset + length] = data
        psn += 1
        ack = from_frame((await b.tx.recv()).tdata)
        assert ack.pkt.opcode == Opcode.ACKNOWLEDGE and ack.icrc_ok, ack
        await wait_for(b, lambda o=offset, n=length: bytes(buf.view[o:o + n]) == expect[o:o + n],
                       20_000, f"the WRITE at +{offset:#x} to land in host memory")
    # nothing else changed: the B response came after the write TLPs; give them time anyway
    await ClockCycles(b.clk, 200)
    assert host.tobytes() == bytes(expect), "host memory differs outside the written ranges"
    b.log.info("4 RDMA WRITEs landed in host memory, nothing else changed")

    # RDMA READ: host memory -> device by memory-read TLPs and completions -> READ responses
    for offset, length in ((0x105, 1500), (0x4003, 200)):
        pkt = Packet(Opcode.READ_REQUEST, psn, ackreq=True,
                     reth=Reth(MR_VA + offset, rkey, length))
        await b.rx.send(AxiStreamFrame(to_frame(pkt, dest_qp=QPN)))
        got = bytearray()
        while len(got) < length:
            frame = bytes((await b.tx.recv()).tdata)
            parsed = from_frame(frame)
            assert parsed.icrc_ok and parsed.dest_qp == REMOTE_QPN, parsed
            scapy_bth = Ether(frame)[BTH]
            assert scapy_bth.opcode == int(parsed.pkt.opcode)
            assert parsed.pkt.opcode in (Opcode.READ_RESP_FIRST, Opcode.READ_RESP_MIDDLE,
                                         Opcode.READ_RESP_LAST, Opcode.READ_RESP_ONLY)
            got += parsed.pkt.payload
        assert bytes(got) == bytes(buf.view[offset:offset + length]), "READ response bytes"
        psn += (length + 1023) // 1024
        b.log.info("RDMA READ of %d bytes at +%#x answered with host-memory bytes", length, offset)
    # the transport counted no error
    assert await b.reg("transport.rx_requests") >= 6
