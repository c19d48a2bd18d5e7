"""cocotb tests of two NIC cores (``stellar_nic2``) talking RC through the switch model.

NIC A and NIC B each have their own host memory (a recording AXI RAM) and CSR bus; the
testbench sets up QP pairs through the host driver's table code, posts work requests on both
sides, and the :class:`~stellar.sim.scoreboard.Scoreboard` proves from host memory and
completions alone that every WRITE, SEND and READ landed exactly once with the right bytes.

Parameters (``STELLAR_TB_*``): ``width``; ``loss`` (drop probability per frame and direction),
``dup``, ``reorder``, ``corrupt``; ``pairs`` (QP pairs in parallel), ``messages`` (per pair and
direction), ``max_len``; ``pmtu``.
"""

import random

import cocotb
from cocotb.triggers import ClockCycles, SimTimeoutError, with_timeout
from stellar.hdl.flow.fields import PathMtu, QpState

from .nic import QpConfig, SimNic
from .scoreboard import Scoreboard
from .switch import LinkConfig, Switch
from .tb import TB, pause_generator, tb_param
from .verbs import RecvRequest, WcStatus, WorkRequest, WrOpcode

QPN_BASE = {"a": 0x100, "b": 0x200}
REGION = 1 << 18          # per-QP host memory region
SRC, WDST, RBUF, RDST = 0, 1 << 16, 2 << 16, 3 << 16   # areas inside a region


class Harness(TB):
    """Two NICs, the switch between them, QP pairs (index i on both sides) and a scoreboard."""

    def __init__(self, dut, *, pause=0.1, link=None, back=None, seed=None):
        super().__init__(dut)
        self.width = len(dut.a_s_axis_rx_tdata)
        self.rng = random.Random(cocotb.RANDOM_SEED if seed is None else seed)
        self.log.info("harness seed %d", cocotb.RANDOM_SEED if seed is None else seed)
        self.nic = {"a": SimNic(dut, "a", pause=pause), "b": SimNic(dut, "b", pause=pause)}
        link = link or LinkConfig()
        self.switch = Switch.from_prefixes(dut, "a", "b", config_ab=link, config_ba=back or link)
        if pause:
            for ln in self.switch.links:
                ln.sink.set_pause_generator(pause_generator(pause / 2, name=f"{ln.name}.tx"))
        self.sb = Scoreboard(self.nic["a"].mem, self.nic["b"].mem)
        self.pairs = []
        self.next_id = {}
        self.alloc = {}
        self.expected = {"a": 0, "b": 0}
        self.cqes = {"a": [], "b": []}

    async def start(self, pairs, cfg, *, tick_cycles=None, window=None):
        await self.reset()
        self.switch.start()
        for nic in self.nic.values():
            await nic.setup(tick_cycles=tick_cycles)
            if window is not None:
                await nic.write_reg("transport.window", window)
        for i in range(1, pairs + 1):
            psn = {"a": self.rng.randrange(1 << 24), "b": self.rng.randrange(1 << 24)}
            for side, peer in (("a", "b"), ("b", "a")):
                await self.nic[side].create_qp(
                    i, QPN_BASE[side] + i, peer=self.nic[peer], remote_qpn=QPN_BASE[peer] + i,
                    cfg=cfg, sq_psn=psn[side], rq_psn=psn[peer])
                base = i * REGION
                self.nic[side].mem.fill_random(base, REGION, self.rng)
                self.sb.watch(side, base, REGION)
                self.alloc[(side, i)] = {SRC: base + SRC, WDST: base + WDST, RBUF: base + RBUF,
                                         RDST: base + RDST}
            self.sb.connect(i, i)
            self.pairs.append(i)
        self.sb.snapshot()

    def _take(self, side, qp, area, n):
        a = self.alloc[(side, qp)]
        addr = a[area]
        a[area] = addr + max(n, 1)
        assert a[area] <= qp * REGION + area + (1 << 16), "test region exhausted"
        return addr

    def wr_id(self, side, qp):
        k = (side, qp)
        self.next_id[k] = self.next_id.get(k, 0) + 1
        return (qp << 32) | self.next_id[k]

    async def post(self, side, wr):
        self.sb.post_send(side, wr)
        if wr.signaled:
            self.expected[side] += 1
        await self.nic[side].post_send(wr)

    async def post_recv(self, side, rr):
        self.sb.post_recv(side, rr)
        self.expected[side] += 1
        await self.nic[side].post_recv(rr)

    def random_wr(self, side, qp, max_len, ops=(WrOpcode.RDMA_WRITE, WrOpcode.SEND,
                                               WrOpcode.RDMA_READ, WrOpcode.RDMA_WRITE_WITH_IMM,
                                               WrOpcode.SEND_WITH_IMM), min_len=0):
        """One random work request and, for the peer, the receive it needs (or None); its length
        is in [min_len, max_len]."""
        peer = "b" if side == "a" else "a"
        op = self.rng.choice(ops)
        n = self.rng.choice([0, 1, 7, 64, 255, 256, 1000, 1024, 1025, 2048, 4096, 5000,
                             self.rng.randrange(1, max_len + 1)])
        n = max(min(n, max_len), min_len)
        rkey = self.nic[peer].rkey
        wr = WorkRequest(qp=qp, wr_id=self.wr_id(side, qp), opcode=op, rkey=rkey,
                         imm=self.rng.randrange(1 << 32))
        sends = (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.SEND_WITH_INV)
        if op in sends and n <= 32 and self.rng.random() < 0.5:
            wr.inline = bytes(self.rng.randrange(256) for _ in range(n))
        else:
            wr.length = n
            wr.laddr = self._take(side, qp, RDST if op == WrOpcode.RDMA_READ else SRC, n)
        recv = None
        if op in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM):
            wr.raddr = self._take(peer, qp, WDST, n)
        elif op == WrOpcode.RDMA_READ:
            wr.raddr = self._take(peer, qp, SRC, n)
        if op in (*sends, WrOpcode.RDMA_WRITE_WITH_IMM):
            size = n if op == WrOpcode.RDMA_WRITE_WITH_IMM else n + self.rng.choice([0, 0, 5, 100])
            recv = RecvRequest(qp=qp, wr_id=self.wr_id(peer, qp) | (1 << 31),
                               addr=self._take(peer, qp, RBUF, max(size, 1)), length=size)
        return wr, recv

    async def collect(self, timeout_cycles):
        """Poll both completion streams until every expected completion arrived."""
        async def side(s):
            while len(self.cqes[s]) < self.expected[s]:
                c = await self.nic[s].poll()
                self.cqes[s].append(c)
                self.sb.completion(s, c)
        for s in ("a", "b"):
            try:
                await with_timeout(side(s), timeout_cycles * self.period_ns, "ns")
            except SimTimeoutError:
                await self.report()
                for q in ("a", "b"):
                    for i in self.pairs:
                        self.log.info("NIC %s QP %d context: %s", q, i,
                                      await self.nic[q].tables.read_qp(i))
                raise AssertionError(
                    f"NIC {s}: {len(self.cqes[s])} of {self.expected[s]} completions after "
                    f"{timeout_cycles} cycles; last: {self.cqes[s][-3:]}") from None

    async def report(self):
        for s in ("a", "b"):
            self.log.info("NIC %s transport counters: %s", s, await self.nic[s].counters())
        self.log.info("switch: %s", self.switch.counters())


def _link_from_params():
    return LinkConfig(drop=tb_param("loss", float, 0.0), duplicate=tb_param("dup", float, 0.0),
                      reorder=tb_param("reorder", float, 0.0),
                      corrupt=tb_param("corrupt", float, 0.0), delay=40)


@cocotb.test()
async def rc_traffic(dut):
    """Random WRITE / SEND / READ (with and without immediate, inline SENDs) on several QP pairs
    in both directions through a lossy switch; the scoreboard checks data and completions."""
    pairs = tb_param("pairs", int, 2)
    messages = tb_param("messages", int, 12)
    max_len = tb_param("max_len", int, 6000)
    # The timer tick is scaled down (256 cycles instead of 4.096 us = 1024) to keep simulated
    # time short; timeout 5 (33 ticks) still covers draining three windows of 16 packets.
    cfg = QpConfig(pmtu=PathMtu(tb_param("pmtu", int, int(PathMtu.MTU_1024))), timeout=5)
    h = Harness(dut, link=_link_from_params())
    await h.start(pairs, cfg, tick_cycles=tb_param("tick", int, 256), window=16)
    for _ in range(messages):
        for qp in h.pairs:
            for side in ("a", "b"):
                wr, recv = h.random_wr(side, qp, max_len)
                if recv is not None:
                    await h.post_recv("b" if side == "a" else "a", recv)
                await h.post(side, wr)
    await h.collect(tb_param("timeout_cycles", int, 2_000_000))
    await h.report()
    h.sb.check()
    for s in ("a", "b"):
        assert all(c.status == WcStatus.SUCCESS for c in h.cqes[s])
        st = await h.nic[s].tables.read_qp(1)
        assert st["state"] == QpState.RTS


@cocotb.test()
async def retry_exhausted(dut):
    """QP 1's traffic is cut in both directions: its WRITEs end with RETRY_EXC_ERR within
    (retry_cnt + 1) local ACK timeouts and the QP goes to ERROR (later WQEs flushed), while QP 2
    on the same NICs keeps moving data."""
    from .switch import bth_dest_qp
    cfg = QpConfig(timeout=2, retry_cnt=3)
    h = Harness(dut, pause=0.05)
    await h.start(2, cfg)          # default tick: 4.096 us at 250 MHz (1024 cycles)
    cut = {QPN_BASE["a"] + 1, QPN_BASE["b"] + 1}
    for ln in h.switch.links:
        ln.cut(lambda f: bth_dest_qp(f) in cut)
    t0 = cocotb.utils.get_sim_time("ns")
    for _k in range(3):
        wr, _ = h.random_wr("a", 1, 3000, ops=(WrOpcode.RDMA_WRITE,))
        await h.post("a", wr)
    h.sb.expect_error("a", 1, WcStatus.RETRY_EXC_ERR)
    for _k in range(8):
        wr, _ = h.random_wr("a", 2, 3000, ops=(WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ))
        await h.post("a", wr)
    await h.collect(400_000)
    h.sb.check()
    errs = [c for c in h.cqes["a"] if c.qp == 1]
    assert errs[0].status == WcStatus.RETRY_EXC_ERR
    assert all(c.status == WcStatus.WR_FLUSH_ERR for c in errs[1:])
    t_err = cocotb.utils.get_sim_time("ns")
    tick_ns = 1024 * h.period_ns
    budget = (cfg.retry_cnt + 1) * ((1 << cfg.timeout) + 2) * tick_ns + 2 * h.switch.ab.config.delay
    h.log.info("RETRY_EXC_ERR after %.0f ns (budget %.0f ns)", t_err - t0, budget)
    assert t_err - t0 <= budget * 1.1
    st = await h.nic["a"].tables.read_qp(1)
    assert st["state"] == QpState.ERROR
    assert all(c.status == WcStatus.SUCCESS for c in h.cqes["a"] if c.qp == 2)
    # a post to the errored QP completes with a flush error, never wedges the device
    wr, _ = h.random_wr("a", 1, 100, ops=(WrOpcode.RDMA_WRITE,))
    await h.post("a", wr)
    await h.collect(10_000)
    assert h.cqes["a"][-1].status == WcStatus.WR_FLUSH_ERR
    await h.report()


@cocotb.test()
async def remote_errors(dut):
    """A WRITE with a wrong rkey gets NAK remote access -> REM_ACCESS_ERR and a flush; a SEND
    without a posted receive on a QP with rnr_retry 1 ends in RNR_RETRY_EXC_ERR (after RNR NAKs
    and waits); a SEND longer than its receive buffer ends in REM_INV_REQ_ERR at the sender and
    LOC_LEN_ERR at the receiver; a SEND with Invalidate invalidates the receiver's MR, so a
    later WRITE with that rkey fails with REM_ACCESS_ERR."""
    cfg = QpConfig(timeout=3, rnr_retry=1, min_rnr_timer=1)
    h = Harness(dut, pause=0.05)
    await h.start(4, cfg)
    # QP 4: a SEND longer than the receive buffer: NAK invalid request -> REM_INV_REQ_ERR at the
    # sender, LOC_LEN_ERR for the receive WQE
    wr, recv = h.random_wr("a", 4, 3000, ops=(WrOpcode.SEND,))
    wr.inline, wr.length, wr.laddr = None, 3000, h._take("a", 4, SRC, 3000)
    recv.length = 1000
    h.sb.expect_error("a", 4, WcStatus.REM_INV_REQ_ERR)
    await h.post_recv("b", recv)
    await h.post("a", wr)
    # QP 1: bad rkey
    # (at least 1 byte: a zero-length WRITE carries no R_Key check, IBA C9-88, and completes
    # successfully -- CI drew length 0 once, seed 563689229)
    wr, _ = h.random_wr("a", 1, 2000, ops=(WrOpcode.RDMA_WRITE,), min_len=1)
    wr.rkey ^= 0x3          # stale tag
    h.sb.expect_error("a", 1, WcStatus.REM_ACCESS_ERR)
    await h.post("a", wr)
    wr2, _ = h.random_wr("a", 1, 100, ops=(WrOpcode.RDMA_WRITE,))
    await h.post("a", wr2)
    # QP 2: SEND, no receive, rnr_retry 1
    wr, _recv = h.random_wr("a", 2, 500, ops=(WrOpcode.SEND,))
    h.sb.expect_error("a", 2, WcStatus.RNR_RETRY_EXC_ERR)
    await h.post("a", wr)
    await h.collect(200_000)
    h.sb.check()
    for qp in (1, 2, 4):
        assert (await h.nic["a"].tables.read_qp(qp))["state"] == QpState.ERROR
    assert any(c.status == WcStatus.LOC_LEN_ERR and c.qp == 4 for c in h.cqes["b"])
    # QP 3: SEND with Invalidate naming B's memory region; a WRITE with that rkey afterwards is
    # refused (NAK remote access error) because B invalidated the region on receipt.
    wr, recv = h.random_wr("a", 3, 200, ops=(WrOpcode.SEND_WITH_INV,))
    wr.invalidate_rkey = h.nic["b"].rkey
    await h.post_recv("b", recv)
    await h.post("a", wr)
    await h.collect(50_000)
    assert await h.nic["b"].read_reg("mr.rx_invalidations") == 1
    assert h.cqes["b"][-1].invalidated_rkey == h.nic["b"].rkey
    wr, _ = h.random_wr("a", 3, 500, ops=(WrOpcode.RDMA_WRITE,), min_len=1)
    h.sb.expect_error("a", 3, WcStatus.REM_ACCESS_ERR)
    await h.post("a", wr)
    await h.collect(100_000)
    h.sb.check()
    await h.report()


@cocotb.test()
async def smoke(dut):
    """One WRITE, one SEND and one READ from A to B, checked by the scoreboard."""
    cfg = QpConfig(timeout=3)
    h = Harness(dut, pause=0.0)
    await h.start(1, cfg)
    for op in (WrOpcode.RDMA_WRITE, WrOpcode.SEND, WrOpcode.RDMA_READ):
        wr, recv = h.random_wr("a", 1, 3000, ops=(op,))
        if recv is not None:
            await h.post_recv("b", recv)
        await h.post("a", wr)
    await ClockCycles(dut.clk, 3000)
    await h.report()
    for s in ("a", "b"):
        h.log.info("pktengine %s: %s", s, await h.nic[s].counters("pktengine"))
        h.log.info("flow %s: %s", s, await h.nic[s].counters("flow"))
        h.log.info("cq %s: %s", s, h.nic[s].poll_nowait())


@cocotb.test()
async def demo(dut):
    """``make sim``: two NICs exchange WRITE / SEND / READ traffic through a lossy switch; the
    scoreboard checks it; a summary lands in ``STELLAR_TB_OUT/summary.json``."""
    import json
    import os
    from collections import Counter
    loss = tb_param("loss", float, 0.01)
    pairs = tb_param("pairs", int, 2)
    messages = tb_param("messages", int, 10)
    link = LinkConfig(drop=loss, duplicate=loss / 2, reorder=loss, corrupt=loss / 4, delay=40)
    cfg = QpConfig(pmtu=PathMtu.MTU_1024, timeout=5)
    h = Harness(dut, pause=0.05, link=link)
    await h.start(pairs, cfg, tick_cycles=256, window=16)
    t0 = cocotb.utils.get_sim_time("ns")
    posted = Counter()
    nbytes = 0
    for _ in range(messages):
        for qp in h.pairs:
            for side in ("a", "b"):
                wr, recv = h.random_wr(side, qp, 12000)
                if recv is not None:
                    await h.post_recv("b" if side == "a" else "a", recv)
                await h.post(side, wr)
                posted[wr.opcode.name] += 1
                nbytes += wr.size
    await h.collect(1_000_000)
    t1 = cocotb.utils.get_sim_time("ns")
    h.sb.check()
    summary = {
        "width": h.width, "pairs": pairs, "loss": loss, "posted": dict(posted), "bytes": nbytes,
        "cycles": round((t1 - t0) / h.period_ns), "completions": {s: len(h.cqes[s]) for s in "ab"},
        "statuses": dict(Counter(c.status.name for s in "ab" for c in h.cqes[s])),
        "transport": {s: await h.nic[s].counters() for s in "ab"},
        "pktengine": {s: await h.nic[s].counters("pktengine") for s in "ab"},
        "switch": {k: {n: (float(v) if not isinstance(v, int) else v) for n, v in c.items()}
                   for k, c in h.switch.counters().items()},
        "scoreboard": h.sb.report(),
    }
    out = os.environ.get("STELLAR_TB_OUT")
    if out:
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
