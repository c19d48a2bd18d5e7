# Ref: stellar.hdl.hostif.formats (rings, CQE owner bit, doorbells); ARM IHI 0022E (AXI4)
"""cocotb testbench of ``stellar_hostq`` (:mod:`stellar.hdl.top.hostq`): the queue engine, its
DMA and the AXI4 arbiter against cocotbext-axi's ``AxiRam`` as host memory.

Structure as in Corundum's testbenches: a TB class binds the BFMs by prefix (``AxiRam`` on
``m_axi``, ``AxiLiteMaster`` on ``s_axil``, stream sources and sinks on the transport-side
ports and the payload DMA), random pauses on every AXI channel and every stream (seeds logged;
rerun with ``COCOTB_RANDOM_SEED=<n>``). The host side is a small driver written from the ring
contract (``stellar.hdl.hostif.formats``, ``stellar.hdl.regmap`` offsets); the transport
stand-in takes work / receive requests, keeps per-QP on-chip queues of the configured depth
(failing on overflow), executes each request by moving payload through the payload DMA (the
second AXI master: writes to the request's buffer, reads checked against memory), and only
after the payload write is done retires the request and emits its completion, as the
transport does. The host checks each CQE it polls against the completion, and that the
payload the completion reports is already in memory when the CQE is visible.

Parameters (``STELLAR_TB_*``): ``width``, ``qps``, ``cqs``, ``sq_depth``, ``rq_depth`` (as
built), ``wqes`` (WQEs posted in the random test), ``pause`` (stall probability).
"""

import logging
import random
from collections import deque

import cocotb
from cocotb.triggers import Event, RisingEdge, with_timeout
from cocotbext.axi import (
    AxiBus,
    AxiLiteBus,
    AxiLiteMaster,
    AxiRam,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)
from stellar.hdl.hostif.formats import CQ_DOORBELL, CQE, RQ_DOORBELL, RQ_WQE, SQ_DOORBELL, SQ_WQE, cqe_owner
from stellar.hdl.regmap import REGMAP, HostqCommand
from stellar.hdl.transport.formats import COMPLETION, RECV_REQUEST, WORK_REQUEST, WrOpcode

from .tb import TB, AxilRegs, pause_generator, tb_param

MEM_SIZE = 1 << 20
SQ, RQ = 0, 1
CQ_AREA = 0x10000          # CQ rings
Q_AREA = 0x20000           # SQ / RQ rings
BUF_AREA = 0x80000         # payload buffers: one 256-byte slot per posted WQE
SLOT = 256


def reg(name):
    return REGMAP[f"hostq.{name}"].offset


class HostqTB(TB):
    def __init__(self, dut, *, pause=None):
        super().__init__(dut)
        self.width = tb_param("width")
        self.qps = tb_param("qps")
        self.cqs = tb_param("cqs")
        self.depth = {SQ: tb_param("sq_depth"), RQ: tb_param("rq_depth")}
        pause = tb_param("pause", float, 0.3) if pause is None else pause
        clk, rst = dut.clk, dut.rst
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi"), clk, rst, size=MEM_SIZE)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), clk, rst)
        self.regs = AxilRegs(self.axil)
        self.wr = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_wr"), clk, rst)
        self.rr = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_rr"), clk, rst)
        self.msi = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_msi"), clk, rst)
        self.cq = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_cq"), clk, rst)
        self.pwcmd = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_pwcmd"), clk, rst)
        self.pwdata = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_pwdata"), clk, rst)
        self.prcmd = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_prcmd"), clk, rst)
        self.prdata = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_prdata"), clk, rst)
        for part in (self.axil.write_if, self.axil.read_if, self.ram.write_if, self.ram.read_if):
            part.log.setLevel(logging.WARNING)      # one line per access otherwise
        if pause:
            for name, bfm in {
                "aw": self.ram.write_if.aw_channel, "w": self.ram.write_if.w_channel,
                "b": self.ram.write_if.b_channel, "ar": self.ram.read_if.ar_channel,
                "r": self.ram.read_if.r_channel, "wr": self.wr, "rr": self.rr, "msi": self.msi,
                "cq": self.cq, "pwcmd": self.pwcmd, "pwdata": self.pwdata, "prcmd": self.prcmd,
                "prdata": self.prdata,
            }.items():
                bfm.set_pause_generator(pause_generator(pause, name=name))
        self.rng = random.Random(cocotb.RANDOM_SEED)
        self.ram.write(0, self.rng.randbytes(MEM_SIZE))
        self.cycle = 0
        self.pwr_done = 0
        self.retire_q = {SQ: deque(), RQ: deque()}
        self.rings = {}            # (kind, qp) -> dict(base, log, pi, delivered)
        self.qcq = {}
        self.cqr = {}              # cq -> dict(base, log, ci)
        self.expect = {}           # (kind, qp) -> deque of request ints
        self.onchip = {}           # (kind, qp) -> deque of requests
        self.max_onchip = 0
        self.expect_cqe = {}       # cq -> deque of (fields, payload check or None)
        self.arms = {}             # cq -> count of arms not answered
        self.msis = 0
        self.delivered = 0
        self.posted = 0
        self.buf_next = 0
        self.progress = Event()
        self.first_wr = None
        self.wr_cycles = []
        for coro in (self._clock(), self._retirer()):
            cocotb.start_soon(coro)

    async def _clock(self):
        while True:
            await RisingEdge(self.dut.clk)
            self.cycle += 1
            if self.dut.pwr_done.value:
                self.pwr_done += 1

    async def _retirer(self):
        """One credit per clock and direction, as the transport's pulses."""
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            for kind, v, q in ((SQ, d.sq_retire, d.sq_retire_qp), (RQ, d.rq_retire, d.rq_retire_qp)):
                if self.retire_q[kind]:
                    v.value = 1
                    q.value = self.retire_q[kind].popleft()
                else:
                    v.value = 0

    # ------------------------------------------------------------------ host driver
    async def command(self, index, words, command):
        for i, w in enumerate(words):
            await self.regs.write32(reg(f"wdata{i}"), w)
        await self.regs.write32(reg("index"), index)
        await self.regs.write32(reg("command"), command)
        for _ in range(100):
            status = await self.regs.read32(reg("status"))
            if not status & 1:
                assert not status & 2, "table command refused"
                return
        raise AssertionError("table command stuck busy")

    async def setup(self, *, sq_log=3, rq_log=3, cq_log=3, mod=(0, 0), start_near_wrap=True):
        rng = self.rng
        base = CQ_AREA
        for cq in range(self.cqs):
            start = (0x10000 - rng.randint(1, 9)) & 0xFFFF if start_near_wrap else 0
            size = 1 << cq_log
            self.cqr[cq] = {"base": base, "log": cq_log, "ci": start}
            self.expect_cqe[cq] = deque()
            self.arms[cq] = 0
            # owner bits of the pass before the NIC's first write at each slot (zero for start 0)
            ring = bytearray(32 * size)
            for i in range(start, start + size):
                ring[(i % size) * 32 + 31] = (1 - cqe_owner(i & 0xFFFF, cq_log)) << 7
            self.ram.write(base, bytes(ring))
            await self.command(cq, [base, 0, cq_log | 1 << 8 | (0x40 + cq) << 16,
                                    mod[0] | start << 16, mod[1]], HostqCommand.WRITE_CQ)
            base += max(64, 32 * size)
        base = Q_AREA
        for qp in range(self.qps):
            for kind, log, entry in ((SQ, sq_log, 64), (RQ, rq_log, 32)):
                start = (0x10000 - rng.randint(1, 20)) & 0xFFFF if start_near_wrap else 0
                cq = rng.randrange(self.cqs)
                size = entry << log
                base = -(-base // size) * size
                self.rings[kind, qp] = {"base": base, "log": log, "entry": entry, "pi": start,
                                        "delivered": start}
                self.qcq[kind, qp] = cq
                self.expect[kind, qp] = deque()
                self.onchip[kind, qp] = deque()
                await self.command(qp, [base, 0, log | 1 << 8 | cq << 16, start, 0],
                                   HostqCommand.WRITE_SQ if kind == SQ else HostqCommand.WRITE_RQ)
                base += max(64, size)

    def free(self, kind, qp):
        r = self.rings[kind, qp]
        return (1 << r["log"]) - ((r["pi"] - r["delivered"]) & 0xFFFF)

    async def post(self, kind, qp, k, *, doorbell=True):
        rng, r = self.rng, self.rings[kind, qp]
        for _ in range(k):
            buf = BUF_AREA + (self.buf_next % ((MEM_SIZE - BUF_AREA) // SLOT)) * SLOT
            self.buf_next += 1
            if kind == SQ:
                inline = rng.random() < 0.25
                length = rng.randint(0, 32 if inline else SLOT)
                op = rng.choice([WrOpcode.SEND, WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ])
                wqe = SQ_WQE.pack(opcode=op, signaled=1, inline=inline, length=length,
                                  wr_id=rng.getrandbits(64), raddr=rng.getrandbits(64),
                                  rkey=rng.getrandbits(32), imm=rng.getrandbits(32),
                                  data=rng.getrandbits(256) if inline else buf)
                f = SQ_WQE.unpack(wqe)
                want = WORK_REQUEST.pack(qp=qp, opcode=op, signaled=1, inline=inline,
                                         wr_id=f["wr_id"], laddr=0 if inline else buf,
                                         length=length, raddr=f["raddr"], rkey=f["rkey"],
                                         imm=f["imm"], inline_data=f["data"] if inline else 0)
            else:
                wqe = RQ_WQE.pack(wr_id=rng.getrandbits(64), addr=buf, length=rng.randint(1, SLOT))
                want = RECV_REQUEST.pack(qp=qp, wr_id=RQ_WQE.unpack(wqe)["wr_id"], addr=buf,
                                         length=RQ_WQE.unpack(wqe)["length"])
            size = 1 << r["log"]
            self.ram.write(r["base"] + (r["pi"] % size) * r["entry"],
                           wqe.to_bytes(r["entry"], "little"))
            self.expect[kind, qp].append(want)
            r["pi"] = (r["pi"] + 1) & 0xFFFF
            self.posted += 1
        if doorbell:
            await self.doorbell(kind, qp)

    async def doorbell(self, kind, qp):
        table, name = (SQ_DOORBELL, "sq_doorbell") if kind == SQ else (RQ_DOORBELL, "rq_doorbell")
        await self.regs.write32(reg(name), table.pack(pi=self.rings[kind, qp]["pi"], qp=qp))

    async def poll_cq(self, cq, *, arm=False):
        """Consume every new CQE of ``cq`` (owner bit), check it and the payload it reports."""
        r = self.cqr[cq]
        size = 1 << r["log"]
        took = 0
        while True:
            raw = self.ram.read(r["base"] + (r["ci"] % size) * 32, 32)
            f = CQE.unpack(int.from_bytes(raw, "little"))
            if f["owner"] != cqe_owner(r["ci"], r["log"]):
                break
            want, check = self.expect_cqe[cq].popleft()
            for k, v in want.items():
                assert f[k] == v, f"CQ {cq} index {r['ci']:#x}: {k} = {f[k]:#x}, expected {v:#x}"
            if check is not None:
                addr, data = check
                assert self.ram.read(addr, len(data)) == data, (
                    f"CQ {cq}: CQE visible before the payload it reports ({addr:#x})")
            r["ci"] = (r["ci"] + 1) & 0xFFFF
            took += 1
        if took or arm:
            if arm:
                self.arms[cq] += 1
            await self.regs.write32(reg("cq_doorbell"), CQ_DOORBELL.pack(ci=r["ci"], cq=cq, arm=arm))
        return took

    # ------------------------------------------------------------------ transport stand-in
    async def take_requests(self, kind):
        sink, table = (self.wr, WORK_REQUEST) if kind == SQ else (self.rr, RECV_REQUEST)
        while True:
            frame = await sink.recv()
            bits = int.from_bytes(bytes(frame.tdata), "little") & ((1 << table.width) - 1)
            qp = table.unpack(bits)["qp"]
            assert self.expect[kind, qp], f"request for QP {qp} that nothing posted"
            want = self.expect[kind, qp].popleft()
            assert bits == want, f"QP {qp}: {table.unpack(bits)} != {table.unpack(want)}"
            q = self.onchip[kind, qp]
            q.append(bits)
            assert len(q) <= self.depth[kind], f"QP {qp} kind {kind}: on-chip queue overflow"
            self.max_onchip = max(self.max_onchip, len(q))
            r = self.rings[kind, qp]
            r["delivered"] = (r["delivered"] + 1) & 0xFFFF
            self.delivered += 1
            self.wr_cycles.append(self.cycle)
            self.progress.set()

    async def execute(self, *, instant=False):
        """Retire on-chip requests in random order over QPs; payload first, then completion."""
        rng = self.rng
        issued = 0
        while True:
            busy = [key for key, q in self.onchip.items() if q]
            if not busy:
                await RisingEdge(self.dut.clk)
                continue
            kind, qp = rng.choice(busy)
            bits = self.onchip[kind, qp].popleft()
            check = None
            if kind == SQ:
                wr = WORK_REQUEST.unpack(bits)
                if not instant and not wr["inline"] and wr["length"]:
                    if wr["opcode"] == WrOpcode.RDMA_READ:       # READ data lands at laddr
                        data = rng.randbytes(wr["length"])
                        await self.pwcmd.send(AxiStreamFrame((wr["laddr"] | len(data) << 64)
                                                             .to_bytes(10, "little")))
                        await self.pwdata.send(AxiStreamFrame(data))
                        issued += 1
                        check = (wr["laddr"], data)
                    else:                                        # SEND/WRITE payload is read
                        await self.prcmd.send(AxiStreamFrame((wr["laddr"] | wr["length"] << 64)
                                                             .to_bytes(10, "little")))
                        got = await self.prdata.recv()
                        assert bytes(got.tdata[:wr["length"]]) == self.ram.read(wr["laddr"],
                                                                                wr["length"])
                fields = {"wr_id": wr["wr_id"], "is_recv": 0}
            else:
                rq = RECV_REQUEST.unpack(bits)
                if not instant:
                    data = rng.randbytes(rng.randint(1, rq["length"]))
                    await self.pwcmd.send(AxiStreamFrame((rq["addr"] | len(data) << 64)
                                                         .to_bytes(10, "little")))
                    await self.pwdata.send(AxiStreamFrame(data))
                    issued += 1
                    check = (rq["addr"], data)
                fields = {"wr_id": rq["wr_id"], "is_recv": 1}
            # the transport completes only after its payload writes are answered
            while self.pwr_done < issued:
                await RisingEdge(self.dut.clk)
            self.retire_q[kind].append(qp)
            cpl = {"qp": qp, "status": rng.getrandbits(5), "opcode": rng.getrandbits(8),
                   "has_imm": rng.getrandbits(1), "has_inv": rng.getrandbits(1),
                   "byte_len": rng.getrandbits(32), "imm": rng.getrandbits(32),
                   "src_qpn": rng.getrandbits(24), **fields}
            self.expect_cqe[self.qcq[kind, qp]].append((cpl, check))
            await self.cq.send(AxiStreamFrame(COMPLETION.pack(cpl).to_bytes(24, "little")))

    async def take_msis(self):
        while True:
            frame = await self.msi.recv()
            vector = int.from_bytes(bytes(frame.tdata), "little")
            cq = vector - 0x40
            # Several arms before a CQE are one arm, and an arm racing the CQE that fires may
            # count for the next one: every MSI answers at least one arm.
            assert cq in self.arms and self.arms[cq] > 0, f"MSI vector {vector:#x} without an arm"
            self.arms[cq] -= 1
            self.msis += 1

    async def counters(self):
        return {r.register: await self.regs.read32(r.offset) for r in REGMAP
                if r.block == "hostq" and r.access == "counter"}


@cocotb.test()
async def random_rings(dut):
    """Random batches on every SQ and RQ (rings starting just below the 16-bit wrap, small
    rings, small on-chip depths), the transport stand-in executing requests in random order
    with payload through the second AXI master, the host polling CQs slowly (CQ full) and
    arming them: every request arrives once and in order, never beyond the credits, every CQE
    is right and never visible before its payload."""
    tb = HostqTB(dut)
    await tb.reset()
    rng = tb.rng
    await tb.setup(sq_log=2, rq_log=2, cq_log=2)
    for coro in (tb.take_requests(SQ), tb.take_requests(RQ), tb.execute(), tb.take_msis()):
        cocotb.start_soon(coro)
    total = tb_param("wqes", int, 200)

    async def host():
        while tb.posted < total:
            kind, qp = rng.choice(sorted(tb.rings))
            free = tb.free(kind, qp)
            if free:
                await tb.post(kind, qp, rng.randint(1, min(free, total - tb.posted)))
            if rng.random() < 0.3:
                await tb.poll_cq(rng.randrange(tb.cqs), arm=rng.random() < 0.3)
            await tb.cycles(rng.randint(0, 20))
        while (any(tb.expect_cqe.values()) or any(tb.onchip.values())
               or tb.delivered < tb.posted):
            for cq in range(tb.cqs):
                await tb.poll_cq(cq, arm=rng.random() < 0.2)
            await tb.cycles(rng.randint(0, 30))

    await with_timeout(host(), 2000, "us")
    await tb.cycles(200)
    c = await tb.counters()
    tb.log.info("posted %d WQEs, %d cycles; max on-chip %d; counters %s", tb.posted, tb.cycle,
                tb.max_onchip, c)
    assert tb.delivered == tb.posted == c["sq_wqes"] + c["rq_wqes"]
    assert c["cqes"] == tb.posted and c["cqe_dropped"] == 0 and c["doorbell_invalid"] == 0
    assert c["msis"] == tb.msis
    assert int(dut.m_axi_bresp.value) == 0


@cocotb.test()
async def figures(dut):
    """No pauses, AxiRam's own latency: cycles from the doorbell write's response to the first
    work request, WQEs per clock with many queued, and from a completion's transfer to its CQE
    write address and to the CQE in memory. Logged (they are figures, not limits); loose
    bounds catch a regression by an order of magnitude."""
    tb = HostqTB(dut, pause=0.0)
    await tb.reset()
    await tb.setup(sq_log=4, rq_log=4, cq_log=6, start_near_wrap=False)
    cocotb.start_soon(tb.take_requests(SQ))
    cocotb.start_soon(tb.take_requests(RQ))

    # 1. doorbell -> first work request (idle engine)
    await tb.post(SQ, 0, 1, doorbell=False)
    t0 = tb.cycle
    await tb.doorbell(SQ, 0)
    t_b = tb.cycle
    await with_timeout(tb.progress.wait(), 10, "us")
    latency = tb.wr_cycles[0] - t_b
    tb.log.info("doorbell (AXI-Lite B response) -> first WR beat: %d cycles (write issued %d "
                "cycles before the B)", latency, t_b - t0)
    tb.onchip[SQ, 0].clear()
    tb.retire_q[SQ].append(0)

    # 2. fetch rate: every QP's SQ filled up to its credits, one doorbell each
    n0 = tb.delivered
    for qp in range(tb.qps):
        await tb.post(SQ, qp, tb.depth[SQ], doorbell=False)
    start_db = tb.cycle
    for qp in range(tb.qps):
        await tb.doorbell(SQ, qp)
    want = n0 + tb.qps * tb.depth[SQ]
    while tb.delivered < want:
        tb.progress.clear()
        try:
            await with_timeout(tb.progress.wait(), 20, "us")
        except Exception:
            for qp in range(tb.qps):
                await tb.regs.write32(reg("index"), qp)
                await tb.regs.write32(reg("command"), HostqCommand.READ_SQ)
                words = [await tb.regs.read32(reg(f"rdata{i}")) for i in range(5)]
                tb.log.error("QP %d SQ: %s; onchip %d", qp, [hex(w) for w in words],
                             len(tb.onchip[SQ, qp]))
            tb.log.error("delivered %d of %d; counters %s", tb.delivered, want, await tb.counters())
            raise
    cyc = tb.wr_cycles[-1] - tb.wr_cycles[n0]
    rate = (want - n0 - 1) / cyc
    tb.log.info("%d WQEs (%d QPs x %d credits): first to last WR beat %d cycles = %.3f WQEs/clock "
                "(%d cycles after the first doorbell)", want - n0, tb.qps, tb.depth[SQ], cyc, rate,
                tb.wr_cycles[-1] - start_db)

    # 3. completion -> CQE write
    d = tb.dut
    aw = []

    async def watch_aw():
        while True:
            await RisingEdge(d.clk)
            if d.m_axi_awvalid.value and d.m_axi_awready.value:
                addr = d.m_axi_awaddr.value.to_unsigned()
                if CQ_AREA <= addr < Q_AREA:
                    aw.append(tb.cycle)
    cocotb.start_soon(watch_aw())
    cq = tb.qcq[SQ, 0]
    cpl = {"qp": 0, "is_recv": 0, "wr_id": 0x1234, "status": 0, "opcode": 0}
    await tb.cq.send(AxiStreamFrame(COMPLETION.pack(cpl).to_bytes(24, "little")))
    await tb.cq.wait()
    t_c = tb.cycle
    r = tb.cqr[cq]
    for _ in range(200):
        await RisingEdge(d.clk)
        raw = tb.ram.read(r["base"] + (r["ci"] % (1 << r["log"])) * 32, 32)
        if CQE.unpack(int.from_bytes(raw, "little"))["owner"] == cqe_owner(r["ci"], r["log"]):
            break
    t_mem = tb.cycle
    assert aw, "no CQE write seen"
    tb.log.info("completion handshake -> CQE AW handshake %d cycles, -> CQE in memory %d cycles",
                aw[0] - t_c, t_mem - t_c)
    assert latency < 60 and rate > 0.04 and aw[0] - t_c < 20
