"""cocotb testbench of the host driver (``stellar.host.verbs``) end to end on ``stellar_pcie_usp``:
the driver on cocotbext-pcie's root complex posts work into rings in simulated host memory, the
NIC fetches it by DMA, moves payload, writes CQEs and raises MSIs. The NIC's Ethernet output is
looped back to its input through the switch model (a link with loss), so two QPs of the same NIC
talk RC to each other (a QP may connect to a QP of its own NIC, as on any RoCE device).

Tests (``tests/cocotb/test_verbs.py``):

* ``traffic``: WRITE (a batch of unsignaled WRs with one signaled last, one doorbell), READ,
  SEND / SEND_WITH_IMM / inline SEND into receives posted while the QP was in INIT, WRITE_WITH_IMM;
  data checked byte for byte in the numpy arrays the program registered, completions checked
  field by field; MMIO counted: one write per posted list, zero reads while polling; an armed CQ
  raises its MSI.
* ``errors``: invalid transitions, missing attributes, bad lkeys (unknown, other PD, no
  LOCAL_WRITE), out-of-bounds SGEs, a full send queue, an inline payload too long, a post in the
  wrong state: each raises its typed error with no MMIO access at all; a WRITE with a stale rkey
  completes with REM_ACCESS_ERR, later WRs flush, the QP refuses posts (E4002); the documented
  reset path (RESET, INIT, RTR, RTS) brings it back and traffic flows again; meanwhile another
  connection kept working (the device is not wedged).

Random backpressure (``STELLAR_TB_PAUSE``) on every stream of the PCIe model and on the loop
link's sink and source; seeds are logged.
"""

import logging
import random

import cocotb
import numpy as np
from cocotbext.axi import AxiStreamBus, AxiStreamSink, AxiStreamSource
from stellar.hdl.flow.fields import Access
from stellar.host.errors import (
    InvalidLkey,
    InvalidQpTransition,
    LocalBoundsError,
    QpInErrorState,
    QpStateError,
    QueueFull,
)
from stellar.host.verbs import (
    SGE,
    NotSupported,
    QPAttr,
    QPCap,
    QPInitAttr,
    QpState,
    RecvWR,
    SendFlags,
    SendWR,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
)

from .hosts import ALL_ACCESS, SimHost, connect, poll_until
from .switch import Link, LinkConfig
from .tb import pause_generator, tb_param

MAC, IP = 0x02_00_00_00_00_A1, "10.0.0.1"
SIG = SendFlags.SIGNALED


class Bench:
    def __init__(self, dut, *, loss=0.0):
        self.dut = dut
        self.log = logging.getLogger("cocotb.tb")
        self.pause = tb_param("pause", float, 0.0)
        self.seed = cocotb.RANDOM_SEED
        self.rng = random.Random(self.seed)
        self.np_rng = np.random.default_rng(self.seed)
        self.log.info("verbs bench: seed %d, pause %.2f, loss %.3f", self.seed, self.pause, loss)
        # ``prefix`` "a": host and NIC A of ``stellar_pcie2`` (the same PcieNic as
        # ``stellar_pcie_usp``, ports prefixed ``a_``, its own clock; NIC B's clock never runs),
        # so the bench shares the two-host tests' build.
        prefix = tb_param("prefix", str, "")
        p = f"{prefix}_" if prefix else ""
        self.host = SimHost(dut, prefix, mac=MAC, ip=IP, pause=self.pause, name="host")
        self.clk, rst = self.host.clk, self.host.device.rst
        sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"{p}m_axis_tx"), self.clk, rst)
        source = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"{p}s_axis_rx"), self.clk, rst)
        for bfm in (sink, source):
            bfm.log.setLevel(logging.WARNING)
        if self.pause:
            source.set_pause_generator(pause_generator(self.pause, name="rx"))
        self.link = Link(LinkConfig(drop=loss, delay=40), sink, source, self.clk, name="loop")

    async def start(self):
        await self.host.start(tick_cycles=250)
        self.link.start()
        self.ctx = self.host.ctx
        self.pd = self.ctx.alloc_pd()
        return self.ctx

    def buffer(self, n, fill=True):
        return (self.np_rng.integers(0, 256, n, dtype=np.uint8) if fill
                else np.zeros(n, dtype=np.uint8))

    async def pair(self, cq, *, cap=None, before_rtr=None, psn=None):
        cap = cap or QPCap(32, 32)
        qa = await self.ctx.create_qp(self.pd, QPInitAttr(send_cq=cq, recv_cq=cq, cap=cap))
        qb = await self.ctx.create_qp(self.pd, QPInitAttr(send_cq=cq, recv_cq=cq, cap=cap))
        await self.connect(qa, qb, before_rtr=before_rtr, psn=psn)
        return qa, qb

    async def connect(self, qa, qb, *, before_rtr=None, psn=None):
        psn_a, psn_b = psn or (self.rng.randrange(1 << 24), self.rng.randrange(1 << 24))
        await connect(qa, self.host, qb, self.host, psn_a=psn_a, psn_b=psn_b, timeout=3,
                      before_rtr=before_rtr)

    async def poll(self, cq, n, timeout_cycles=300_000):
        return await poll_until(cq, n, self.clk, timeout_cycles)


def sge(mr, offset, length):
    return [SGE(mr.addr + offset, length, mr.lkey)]


@cocotb.test()
async def traffic(dut):
    b = Bench(dut, loss=0.05)
    ctx = await b.start()
    src, dst, rbuf = b.buffer(1 << 16), b.buffer(1 << 16, False), b.buffer(1 << 14, False)
    mr_src = await b.pd.reg_mr(src, Access.LOCAL_WRITE | Access.REMOTE_READ)
    mr_dst = await b.pd.reg_mr(dst, ALL_ACCESS)
    mr_rbuf = await b.pd.reg_mr(rbuf, Access.LOCAL_WRITE)
    cq = await ctx.create_cq(64)
    rcq = await ctx.create_cq(64)
    qa = await ctx.create_qp(b.pd, QPInitAttr(send_cq=cq, recv_cq=cq, cap=QPCap(32, 16)))
    qb = await ctx.create_qp(b.pd, QPInitAttr(send_cq=cq, recv_cq=rcq, cap=QPCap(32, 16)))
    recv_sizes = [100, 2000, 32, 7, 0]

    async def post_receives():
        # posted in INIT: held in the ring until RTR, then fetched
        wrs, off = [], 0
        for i, n in enumerate(recv_sizes):
            wrs.append(RecvWR(wr_id=0x100 + i, sg_list=sge(mr_rbuf, off, max(n, 1) + 64)))
            off += 3000
        await qb.post_recv(wrs)

    await b.connect(qa, qb, before_rtr=post_receives)
    assert qa.state == qb.state == QpState.RTS

    # WRITE: 8 WRs in one list, only the last signaled -> one doorbell, one completion
    reads0, writes0 = ctx.mmio.snapshot()
    plan, off = [], 0
    for _ in range(8):
        n = b.rng.choice([1, 64, 1000, 1025, 3000, b.rng.randrange(1, 4097)])
        plan.append((off, n))
        off += 4096
    wrs = [SendWR(wr_id=i, opcode=WrOpcode.RDMA_WRITE, sg_list=sge(mr_src, o, n),
                  remote_addr=mr_dst.addr + o + 3, rkey=mr_dst.rkey,
                  send_flags=SIG if i == 7 else SendFlags(0)) for i, (o, n) in enumerate(plan)]
    await qa.post_send(wrs)
    assert ctx.mmio.snapshot() == (reads0, writes0 + 1), "one MMIO write for 8 work requests"
    wcs = await b.poll(cq, 1)
    assert ctx.mmio.reads == reads0, "polling completions read MMIO"
    assert wcs[0].wr_id == 7 and wcs[0].status == WcStatus.SUCCESS, wcs
    assert wcs[0].opcode == WcOpcode.RDMA_WRITE and wcs[0].qp_num == qa.qp_num
    for o, n in plan:
        assert np.array_equal(dst[o + 3:o + 3 + n], src[o:o + n]), f"WRITE at {o}, {n} bytes"
    assert qa.sq_free == 32, "a signaled completion frees the unsignaled WRs before it"
    b.log.info("8 WRITEs (%d bytes) landed; 1 MMIO write, 0 MMIO reads", sum(n for _o, n in plan))

    # READ: qa reads from mr_src (remote) into mr_dst (local, LOCAL_WRITE)
    n = 5000
    await qa.post_send(SendWR(wr_id=0x20, opcode=WrOpcode.RDMA_READ,
                              sg_list=sge(mr_dst, 40000, n), remote_addr=mr_src.addr + 777,
                              rkey=mr_src.rkey, send_flags=SIG))
    (wc,) = await b.poll(cq, 1)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (0x20, WcStatus.SUCCESS,
                                                              WcOpcode.RDMA_READ, n), wc
    assert np.array_equal(dst[40000:40000 + n], src[777:777 + n]), "READ data"

    # SENDs into the receives posted in INIT: plain, with immediate, inline (from an SGE and
    # from bytes), zero length
    sends = [
        SendWR(wr_id=0x30, opcode=WrOpcode.SEND, sg_list=sge(mr_src, 100, 100), send_flags=SIG),
        SendWR(wr_id=0x31, opcode=WrOpcode.SEND_WITH_IMM, sg_list=sge(mr_src, 9000, 2000),
               imm_data=0xCAFEF00D, send_flags=SIG),
        SendWR(wr_id=0x32, opcode=WrOpcode.SEND, sg_list=sge(mr_src, 50, 32),
               send_flags=SIG | SendFlags.INLINE),
        SendWR(wr_id=0x33, opcode=WrOpcode.SEND, inline_data=b"inline!", send_flags=SIG),
        SendWR(wr_id=0x34, opcode=WrOpcode.SEND, send_flags=SIG),
    ]
    await qa.post_send(sends)
    got = await b.poll(cq, len(sends))
    assert [w.wr_id for w in got] == [0x30, 0x31, 0x32, 0x33, 0x34], got
    assert all(w.status == WcStatus.SUCCESS and w.opcode == WcOpcode.SEND for w in got), got
    recvs = await b.poll(rcq, len(sends))
    assert [w.wr_id for w in recvs] == [0x100 + i for i in range(5)], recvs
    assert [w.byte_len for w in recvs] == [100, 2000, 32, 7, 0], recvs
    assert all(w.opcode == WcOpcode.RECV and w.src_qp == qa.qp_num for w in recvs), recvs
    assert recvs[1].wc_flags & WcFlags.WITH_IMM and recvs[1].imm_data == 0xCAFEF00D, recvs[1]
    expect = [src[100:200], src[9000:11000], src[50:82], np.frombuffer(b"inline!", np.uint8)]
    for i, data in enumerate(expect):
        assert np.array_equal(rbuf[i * 3000:i * 3000 + len(data)], data), f"SEND {i} data"
    assert qb.rq_free == 16

    # WRITE_WITH_IMM consumes a receive; the data goes to the RETH address
    await qb.post_recv(RecvWR(wr_id=0x200, sg_list=sge(mr_rbuf, 0, 16)))
    await qa.post_send(SendWR(wr_id=0x40, opcode=WrOpcode.RDMA_WRITE_WITH_IMM,
                              sg_list=sge(mr_src, 20000, 1500), remote_addr=mr_dst.addr + 50000,
                              rkey=mr_dst.rkey, imm_data=0x1234, send_flags=SIG))
    (wc,) = await b.poll(cq, 1)
    assert wc.status == WcStatus.SUCCESS and wc.opcode == WcOpcode.RDMA_WRITE, wc
    (rw,) = await b.poll(rcq, 1)
    assert (rw.wr_id, rw.opcode, rw.imm_data, rw.byte_len) == (0x200, WcOpcode.RECV_RDMA_WITH_IMM,
                                                               0x1234, 1500), rw
    assert np.array_equal(dst[50000:51500], src[20000:21500])

    # interrupts: arm, post, the MSI of the CQ's vector arrives
    for k in range(3):
        await cq.req_notify()
        await qa.post_send(SendWR(wr_id=0x50 + k, opcode=WrOpcode.RDMA_WRITE,
                                  sg_list=sge(mr_src, 0, 256), remote_addr=mr_dst.addr,
                                  rkey=mr_dst.rkey, send_flags=SIG))
        await cq.wait(timeout=200e-6)
        (wc,) = await b.poll(cq, 1)
        assert wc.wr_id == 0x50 + k and wc.status == WcStatus.SUCCESS, wc
    assert b.host.device.irq_count == 3
    regs = {n: await ctx.mmio.read32(ctx.tables.map[f"hostq.{n}"].offset)
            for n in ("sq_wqes", "rq_wqes", "cqes", "msis", "doorbell_invalid", "cqe_dropped")}
    b.log.info("hostq counters: %s; link: %s", regs, b.link.model.counters_dict())
    assert regs["msis"] == 3 and regs["doorbell_invalid"] == 0 and regs["cqe_dropped"] == 0, regs
    assert regs["sq_wqes"] == 8 + 1 + 5 + 1 + 3 and regs["rq_wqes"] == 6, regs


@cocotb.test()
async def errors(dut):
    b = Bench(dut)
    ctx = await b.start()
    src, dst = b.buffer(1 << 15), b.buffer(1 << 15, False)
    mr_src = await b.pd.reg_mr(src, Access.LOCAL_WRITE | Access.REMOTE_READ)
    mr_ro = await b.pd.reg_mr(b.buffer(4096), Access.REMOTE_READ)       # no LOCAL_WRITE
    mr_dst = await b.pd.reg_mr(dst, ALL_ACCESS)
    other_pd = ctx.alloc_pd()
    mr_other = await other_pd.reg_mr(b.buffer(4096), Access.LOCAL_WRITE)
    cq = await ctx.create_cq(128)
    qa, qb = await b.pair(cq, cap=QPCap(8, 8))
    qc, qd = await b.pair(cq)                      # a second connection that must keep working
    fresh = await ctx.create_qp(b.pd, QPInitAttr(send_cq=cq, recv_cq=cq))

    def write(wr_id, off=0, n=256, *, rkey=None, lkey_sge=None, flags=SIG):
        return SendWR(wr_id=wr_id, opcode=WrOpcode.RDMA_WRITE,
                      sg_list=lkey_sge or sge(mr_src, off, n), remote_addr=mr_dst.addr + off,
                      rkey=mr_dst.rkey if rkey is None else rkey, send_flags=flags)

    # host-side errors: typed, and nothing reaches the device
    before = ctx.mmio.snapshot()
    cases = [
        (InvalidQpTransition, qa.modify(QPAttr(qp_state=QpState.RTR))),
        (InvalidQpTransition, fresh.modify(QPAttr(qp_state=QpState.RTS, sq_psn=0, timeout=1,
                                                  retry_cnt=1, rnr_retry=1, max_rd_atomic=1))),
        (InvalidQpTransition, fresh.modify(QPAttr(qp_state=QpState.INIT, port_num=1))),
        (InvalidLkey, qa.post_send(write(1, lkey_sge=[SGE(mr_src.addr, 10, 0x7777)]))),
        (InvalidLkey, qa.post_send(write(1, lkey_sge=sge(mr_other, 0, 10)))),
        (InvalidLkey, qa.post_send(SendWR(wr_id=1, opcode=WrOpcode.RDMA_READ,
                                          sg_list=sge(mr_ro, 0, 64), remote_addr=mr_src.addr,
                                          rkey=mr_src.rkey))),
        (InvalidLkey, qb.post_recv(RecvWR(wr_id=1, sg_list=sge(mr_ro, 0, 64)))),
        (LocalBoundsError, qa.post_send(write(1, lkey_sge=sge(mr_src, (1 << 15) - 8, 9)))),
        (LocalBoundsError, qa.post_send(write(1, lkey_sge=[SGE(mr_src.addr - 1, 4, mr_src.lkey)]))),
        (QueueFull, qa.post_send([write(i, flags=SendFlags(0)) for i in range(9)])),
        (QueueFull, qb.post_recv([RecvWR(wr_id=i, sg_list=sge(mr_dst, 0, 8)) for i in range(9)])),
        (NotSupported, qa.post_send(SendWR(wr_id=1, inline_data=bytes(33)))),
        (NotSupported, qa.post_send(SendWR(wr_id=1, sg_list=sge(mr_src, 0, 8) * 2))),
        (QpStateError, fresh.post_send(write(1))),
        (QpStateError, fresh.post_recv(RecvWR(wr_id=1, sg_list=sge(mr_dst, 0, 8)))),
    ]
    for err, coro in cases:
        try:
            await coro
        except err as e:
            b.log.info("refused as expected: %s", e)
            assert e.code and e.code.startswith("E"), e
        else:
            raise AssertionError(f"no {err.__name__}")
    assert ctx.mmio.snapshot() == before, f"host-side errors touched the device: {before} -> " \
                                          f"{ctx.mmio.snapshot()}"
    assert qa.sq_free == 8 and qb.rq_free == 8

    # a stale rkey: REM_ACCESS_ERR, the WRs after it flush, the QP is in ERROR
    await qa.post_send([write(0x10, rkey=mr_dst.rkey ^ 0x3), write(0x11, flags=SendFlags(0)),
                        write(0x12)])
    await qc.post_send(write(0x90, 4096, 3000))
    got = await b.poll(cq, 4)
    mine = [w for w in got if w.qp_num == qa.qp_num]
    assert [(w.wr_id, w.status) for w in mine] == [(0x10, WcStatus.REM_ACCESS_ERR),
                                                    (0x11, WcStatus.WR_FLUSH_ERR),
                                                    (0x12, WcStatus.WR_FLUSH_ERR)], got
    other = [w for w in got if w.qp_num == qc.qp_num]
    assert [(w.wr_id, w.status) for w in other] == [(0x90, WcStatus.SUCCESS)], got
    assert np.array_equal(dst[4096:7096], src[4096:7096])
    assert qa.state == QpState.ERROR and qa.sq_free == 8
    attr, hw = await qa.query()
    assert attr.qp_state == QpState.ERROR, hw
    try:
        await qa.post_send(write(0x13))
    except QpInErrorState as e:
        b.log.info("refused as expected: %s", e)
    else:
        raise AssertionError("a post to a QP in ERROR was accepted")

    # the documented reset path: both ends to RESET, then connect again
    for qp in (qa, qb):
        await qp.modify(QPAttr(qp_state=QpState.RESET))
    await b.connect(qa, qb)
    await qa.post_send([write(0x20 + i, 8192 * i + 16, 4000, flags=SIG if i == 2 else SendFlags(0))
                        for i in range(3)])
    (wc,) = await b.poll(cq, 1)
    assert (wc.wr_id, wc.status) == (0x22, WcStatus.SUCCESS), wc
    for i in range(3):
        o = 8192 * i + 16
        assert np.array_equal(dst[o:o + 4000], src[o:o + 4000]), f"WRITE {i} after recovery"
    # and the other connection still works
    await qc.post_send(write(0x91, 12000, 100))
    (wc,) = await b.poll(cq, 1)
    assert (wc.wr_id, wc.status) == (0x91, WcStatus.SUCCESS), wc
    b.log.info("recovered: QP %#x back in RTS, data verified", qa.qp_num)
