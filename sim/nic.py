"""A simulated NIC core as a testbench sees it: host memory, CSR access through the host
driver's table code, and the work-request / receive-request / completion streams.

``SimNic(dut, "a")`` binds the ``a_*`` ports of ``stellar_nic2`` (or, with ``prefix=""``, the
ports of ``stellar_nic``) by prefix, as Corundum's testbenches do: cocotbext-axi's AXI4-Lite
master on ``s_axil``, a :class:`~stellar.sim.hostmem.RecordingAxiRam` on ``m_axi`` (the host
memory, recording every DMA write), AXI-Stream source/sink on ``s_axis_wr``, ``s_axis_rr`` and
``m_axis_cq``. QPs and memory regions are set up through :class:`stellar.host.tables.Tables`,
the same code the host driver uses.
"""

import functools
import logging
import random
from dataclasses import dataclass

from cocotbext.axi import (
    AxiBus,
    AxiLiteBus,
    AxiLiteMaster,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)
from stellar.hdl.flow.fields import Access, PathMtu, QpState
from stellar.hdl.regmap import REGMAP
from stellar.hdl.transport.formats import COMPLETION, RECV_REQUEST, WORK_REQUEST

from .hostmem import RecordingAxiRam
from .tb import AxilRegs, pause_generator
from .verbs import Completion, WcOpcode, WcStatus

__all__ = ["SimNic", "QpConfig", "AxilRegs", "MR_INDEX", "MR_TAG", "pair_verilog"]

MR_INDEX = 1
MR_TAG = 0x5A
WR_BYTES, RR_BYTES, CQ_BYTES = 72, 24, 24


@dataclass
class QpConfig:
    """What both ends of an RC connection agree on (exchanged out of band in real life)."""
    pmtu: PathMtu = PathMtu.MTU_1024
    timeout: int = 2            # 4.096 us * 2**timeout
    retry_cnt: int = 7
    rnr_retry: int = 7
    min_rnr_timer: int = 1      # 10 us
    traffic_class: int = 0x02   # ECT(0): switches may mark CE


@functools.cache
def pair_verilog(width, qps=16):
    """The ``stellar_nic2`` Verilog the two-NIC testbenches run (exported once per process and
    cached on disk by ``stellar.sim.verilog``)."""
    from stellar.hdl.top.nic import PAIR_NAME, verilog_top
    from stellar.sim.verilog import export_verilog
    return export_verilog(PAIR_NAME, functools.partial(verilog_top, two=True),
                          {"width": width, "qps": qps})


def _tables():
    from stellar.host.tables import Tables
    return Tables


class SimNic:
    def __init__(self, dut, prefix="a", *, mem_size=1 << 22, pause=0.0, seed=0):
        p = f"{prefix}_" if prefix else ""
        clk, rst = dut.clk, dut.rst
        self.name = prefix or "nic"
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, f"{p}s_axil"), clk, rst)
        for part in (self.axil.write_if, self.axil.read_if):
            part.log.setLevel(logging.WARNING)      # one line per register access otherwise
        self.mem = RecordingAxiRam(AxiBus.from_prefix(dut, f"{p}m_axi"), clk, rst, size=mem_size,
                                   window=(0, mem_size), log=False)
        for part in (self.mem.write_if, self.mem.read_if):
            part.log.setLevel(logging.WARNING)      # one line per burst otherwise
        self.wr_source = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"{p}s_axis_wr"), clk, rst)
        self.rr_source = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"{p}s_axis_rr"), clk, rst)
        self.cq_sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"{p}m_axis_cq"), clk, rst)
        if pause:
            for i, ch in enumerate((self.mem.write_if.aw_channel, self.mem.write_if.w_channel,
                                    self.mem.write_if.b_channel, self.mem.read_if.ar_channel,
                                    self.mem.read_if.r_channel)):
                ch.set_pause_generator(pause_generator(pause, name=f"{self.name}.axi{i}"))
            self.wr_source.set_pause_generator(pause_generator(pause, name=f"{self.name}.wr"))
            self.rr_source.set_pause_generator(pause_generator(pause, name=f"{self.name}.rr"))
            self.cq_sink.set_pause_generator(pause_generator(pause, name=f"{self.name}.cq"))
        self.tables = _tables()(AxilRegs(self.axil))
        self.regs = AxilRegs(self.axil)
        self.mem_size = mem_size
        self.rng = random.Random(seed)
        self.mac = 0x02_00_00_00_00_00 | (0xA0 if prefix == "a" else 0xB0)
        self.ip = 0x0A_00_00_01 if prefix != "b" else 0x0A_00_00_02
        self.rkey = None

    # ------------------------------------------------------------------ registers
    async def write_reg(self, name, value):
        await self.regs.write32(REGMAP[name].offset, value)

    async def read_reg(self, name):
        return await self.regs.read32(REGMAP[name].offset)

    async def counters(self, block="transport"):
        out = {}
        for r in REGMAP.block(block).registers:
            if r.access == "counter":
                out[r.name] = await self.read_reg(f"{block}.{r.name}")
        return out

    async def setup(self, *, tick_cycles=None):
        """Local address (GID 0) and one memory region over all host memory (va = bus address,
        every remote access), the way a test harness registers "device memory"."""
        await self.write_reg("transport.gid0_mac_lo", self.mac & 0xFFFFFFFF)
        await self.write_reg("transport.gid0_mac_hi", self.mac >> 32)
        await self.write_reg("transport.gid0_ip0", self.ip)
        if tick_cycles is not None:
            await self.write_reg("transport.tick_cycles", tick_cycles)
        access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        self.rkey = await self.tables.write_mr(MR_INDEX, tag=MR_TAG, tenant=0, pd=0, access=access,
                                               va=0, length=self.mem_size, bus_base=0)

    async def create_qp(self, index, qpn, *, peer, remote_qpn, cfg: QpConfig, sq_psn, rq_psn,
                        udp_sport=0xC000, tenant=0, vlan=None, sl=0, cc_mode=0, weight=0):
        """An RC QP in RTS: flow entry (``tenant``, ``qpn``) -> ``index`` and its context; sends
        tagged with VLAN ``vlan`` (None: untagged), traffic class ``sl``, rate control
        ``cc_mode`` (``CcMode``) and round-robin ``weight``."""
        await self.tables.insert_flow(tenant, qpn, index)
        await self.tables.write_qp(
            index, state=QpState.RTS, tenant=tenant, pd=0, pmtu=int(cfg.pmtu), ipv6=0,
            dst_mac=peer.mac, dst_ip=peer.ip, sgid_index=0, remote_qpn=remote_qpn,
            sq_psn=sq_psn, epsn=rq_psn, msn=0, timeout=cfg.timeout, retry_cnt=cfg.retry_cnt,
            rnr_retry=cfg.rnr_retry, min_rnr_timer=cfg.min_rnr_timer, pkey=0xFFFF,
            traffic_class=cfg.traffic_class, hop_limit=64, flow_label=0,
            udp_sport=udp_sport + index, sl=sl, tx_vlan=0 if vlan is None else (1 << 12) | vlan,
            cc_mode=int(cc_mode), weight=weight)

    async def register_tenant(self, tenant, vlan, mr_index):
        """Tenant ``tenant`` arrives on VLAN ``vlan`` and owns an MR (index ``mr_index``) over all
        host memory like the one of ``setup``; returns its rkey."""
        await self.tables.map_vlan(vlan, tenant)
        access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        return await self.tables.write_mr(mr_index, tag=MR_TAG, tenant=tenant, pd=0, access=access,
                                          va=0, length=self.mem_size, bus_base=0)

    # ------------------------------------------------------------------ queues
    async def post_send(self, wr):
        inline = wr.inline or b""
        word = WORK_REQUEST.pack(
            qp=wr.qp, opcode=int(wr.opcode), signaled=int(wr.signaled),
            inline=int(wr.inline is not None), wr_id=wr.wr_id, laddr=wr.laddr,
            length=len(inline) if wr.inline is not None else wr.length, raddr=wr.raddr,
            rkey=wr.rkey, imm=(wr.invalidate_rkey if int(wr.opcode) == 9 else wr.imm),
            inline_data=int.from_bytes(inline.ljust(32, b"\0"), "little"))
        await self.wr_source.send(AxiStreamFrame(word.to_bytes(WR_BYTES, "little")))

    async def post_recv(self, rr):
        word = RECV_REQUEST.pack(qp=rr.qp, wr_id=rr.wr_id, addr=rr.addr, length=rr.length)
        await self.rr_source.send(AxiStreamFrame(word.to_bytes(RR_BYTES, "little")))

    async def poll(self):
        """The next completion (waits for it)."""
        frame = await self.cq_sink.recv()
        f = COMPLETION.unpack(int.from_bytes(bytes(frame.tdata), "little"))
        return decode_completion(f)

    def poll_nowait(self):
        out = []
        while not self.cq_sink.empty():
            frame = self.cq_sink.recv_nowait()
            out.append(decode_completion(COMPLETION.unpack(int.from_bytes(bytes(frame.tdata),
                                                                          "little"))))
        return out


def decode_completion(f):
    status = WcStatus(f["status"])
    opcode = WcOpcode(f["opcode"])
    return Completion(
        qp=f["qp"], wr_id=f["wr_id"], status=status, opcode=opcode, byte_len=f["byte_len"],
        imm=f["imm"] if f["has_imm"] else None,
        invalidated_rkey=f["imm"] if f["has_inv"] else None, is_recv=bool(f["is_recv"]))
