"""cocotb testbench of two simulated hosts (``stellar_pcie2``): each host runs the host driver
(``stellar.host.verbs``) on its own Stellar NIC behind its own PCIe root complex and host memory;
the NICs' Ethernet ports meet in the switch model (loss, duplicates, reordering, corruption).
This is ``make sim`` (``stellar.sim.twohost_sim``) and ``tests/cocotb/test_twohost.py``.

``demo``:

1. Both hosts enumerate their NIC, open it with the driver, set their address, register numpy
   arrays as memory regions, create CQs and ``pairs`` RC QPs, and connect them pairwise (RESET ->
   INIT -> RTR -> RTS with the peer's QPN, PSN, MAC and IP, as an out-of-band exchange would).
2. Both sides post ``messages`` random work requests per QP -- RDMA WRITE (in lists: one doorbell
   per list, one signaled WR at the end), RDMA READ, SEND (into posted receives), SEND with
   immediate, inline SEND, WRITE with immediate -- every one to its own region.
3. Every byte is checked against the source arrays (the independent reference), every
   completion against its work request (status, opcode, length, immediate).
4. A latency probe: single signaled 64-byte WRITEs, doorbell to CQE in host memory, in cycles.
5. ``STELLAR_TB_OUT/summary.json``: bandwidth, latency, MMIO per work request, the transport,
   queue-engine and switch counters.

Random backpressure (``STELLAR_TB_PAUSE``) on every PCIe stream of both hosts; seeds logged.
"""

import json
import logging
import os
import random
from collections import Counter
from pathlib import Path

import cocotb
import numpy as np
from cocotb.utils import get_sim_time
from stellar.hdl.flow.fields import Access
from stellar.hdl.regmap import REGMAP
from stellar.host.verbs import (
    SGE,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendFlags,
    SendWR,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
)

from .hosts import ALL_ACCESS, SimHost, connect, poll_until
from .switch import LinkConfig, Switch
from .tb import tb_param

CLOCK_NS = 4                 # the PCIe user clock: 250 MHz
MEM = 1 << 20                # bytes per host and buffer kind
RECV_SLOT = 8192             # every message is shorter
SIG = SendFlags.SIGNALED


class Side:
    def __init__(self, host):
        self.host = host
        self.qps = []
        self.regions = 0        # next free offset in the destination / source areas
        self.expect = []        # (description, check callable)


class TwoHosts:
    def __init__(self, dut, *, loss, pause):
        self.dut = dut
        self.log = logging.getLogger("cocotb.tb")
        self.seed = cocotb.RANDOM_SEED
        self.rng = random.Random(self.seed)
        self.np_rng = np.random.default_rng(self.seed & 0xFFFF_FFFF)
        self.log.info("two hosts: seed %d, loss %.3f, pause %.2f", self.seed, loss, pause)
        self.hosts = {"a": SimHost(dut, "a", mac=0x02_00_00_00_00_A1, ip="10.0.0.1", pause=pause),
                      "b": SimHost(dut, "b", mac=0x02_00_00_00_00_B2, ip="10.0.0.2", pause=pause)}
        link = LinkConfig(drop=loss, duplicate=loss / 2, reorder=loss, corrupt=loss / 4, delay=100)
        self.switch = Switch.from_prefixes(dut, "a", "b", config_ab=link, config_ba=link,
                                           domains=True)

    async def start(self, pairs):
        for h in self.hosts.values():
            await h.start(tick_cycles=250)
        self.switch.start()
        self.side = {}
        for name, h in self.hosts.items():
            s = Side(h)
            ctx = h.ctx
            s.pd = ctx.alloc_pd()
            s.src = self.np_rng.integers(0, 256, MEM, dtype=np.uint8)
            s.dst = np.zeros(MEM, dtype=np.uint8)
            s.rbuf = np.zeros(MEM, dtype=np.uint8)
            s.mr_src = await s.pd.reg_mr(s.src, Access.LOCAL_WRITE | Access.REMOTE_READ)
            s.mr_dst = await s.pd.reg_mr(s.dst, ALL_ACCESS)
            s.mr_rbuf = await s.pd.reg_mr(s.rbuf, Access.LOCAL_WRITE)
            s.cq = await ctx.create_cq(256)
            s.rcq = await ctx.create_cq(256)
            self.side[name] = s
        a, b = self.side["a"], self.side["b"]
        for _ in range(pairs):
            qa = await a.host.ctx.create_qp(a.pd, QPInitAttr(a.cq, a.rcq, cap=QPCap(64, 64)))
            qb = await b.host.ctx.create_qp(b.pd, QPInitAttr(b.cq, b.rcq, cap=QPCap(64, 64)))
            await connect(qa, a.host, qb, b.host, psn_a=self.rng.randrange(1 << 24),
                          psn_b=self.rng.randrange(1 << 24), timeout=4)
            a.qps.append((qa, qb))
            b.qps.append((qb, qa))

    def take(self, s, n):
        off = s.regions
        s.regions += -(-max(n, 1) // 64) * 64 + 64
        assert s.regions <= MEM, "demo ran out of memory regions: fewer messages"
        return off


async def traffic(tb, messages):
    """Random work requests on every QP, both directions; returns (send WRs, signaled, recvs)."""
    posted = Counter()
    tb.posted_by = Counter()
    want = {"a": Counter(), "b": Counter()}       # completions expected per CQ kind
    recv_checks = []
    for name, peer_name in (("a", "b"), ("b", "a")):
        s, p = tb.side[name], tb.side[peer_name]
        for qp, peer_qp in s.qps:
            batch = []
            for k in range(messages):
                op = tb.rng.choice([WrOpcode.RDMA_WRITE] * 3 + [WrOpcode.RDMA_READ, WrOpcode.SEND,
                                   WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM])
                n = tb.rng.choice([0, 1, 64, 1000, 1024, 1025, 4096, tb.rng.randrange(1, 8192)])
                wr_id = (qp.index << 16) | k
                signaled = op != WrOpcode.RDMA_WRITE or tb.rng.random() < 0.3 or k == messages - 1
                wr = SendWR(wr_id=wr_id, opcode=op, send_flags=SIG if signaled else SendFlags(0),
                            imm_data=tb.rng.getrandbits(32))
                if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM) and n <= 32 and tb.rng.random() < 0.5:
                    wr.inline_data = bytes(s.src[:n])
                    src = s.src[:n]
                else:
                    so = tb.rng.randrange(0, MEM - n)
                    src = s.src[so:so + n]
                    if op == WrOpcode.RDMA_READ:
                        lo = tb.take(s, n)
                        wr.sg_list = [SGE(s.mr_dst.addr + lo, n, s.mr_dst.lkey)]
                        ro = tb.rng.randrange(0, MEM - n)
                        wr.remote_addr, wr.rkey = p.mr_src.addr + ro, p.mr_src.rkey
                        s.expect.append((f"READ {wr_id:#x}", s.dst, lo, p.src[ro:ro + n].copy()))
                    else:
                        wr.sg_list = [SGE(s.mr_src.addr + so, n, s.mr_src.lkey)]
                if op in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM):
                    ro = tb.take(p, n)
                    wr.remote_addr, wr.rkey = p.mr_dst.addr + ro, p.mr_dst.rkey
                    p.expect.append((f"WRITE {wr_id:#x}", p.dst, ro, src.copy()))
                if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM):
                    slot = len(recv_checks)
                    assert (slot + 1) * RECV_SLOT <= MEM, "demo ran out of receive slots"
                    await peer_qp.post_recv(RecvWR(wr_id=slot, sg_list=[SGE(
                        p.mr_rbuf.addr + slot * RECV_SLOT, RECV_SLOT, p.mr_rbuf.lkey)]))
                    recv_checks.append((peer_name, op, n, wr.imm_data, src.copy(), qp.qp_num))
                    want[peer_name]["recv"] += 1
                posted[op.name] += 1
                tb.posted_by[name] += 1
                if signaled:
                    want[name]["send"] += 1
                batch.append((wr, signaled))
                if len(batch) == 4 or k == messages - 1:
                    await qp.post_send([w for w, _ in batch])
                    batch = []
    return posted, want, recv_checks


async def collect(tb, want, timeout_cycles):
    got = {}
    for name in ("a", "b"):
        s = tb.side[name]
        got[name] = {"send": await poll_until(s.cq, want[name]["send"], s.host.clk, timeout_cycles),
                     "recv": await poll_until(s.rcq, want[name]["recv"], s.host.clk, timeout_cycles)}
    return got


def check(tb, got, recv_checks):
    problems = []
    for name in ("a", "b"):
        s = tb.side[name]
        for wc in got[name]["send"] + got[name]["recv"]:
            if wc.status != WcStatus.SUCCESS:
                problems.append(f"{name}: {wc}")
        for what, arr, off, data in s.expect:
            if not np.array_equal(arr[off:off + len(data)], data):
                problems.append(f"{name}: {what}: {len(data)} bytes at {off:#x} differ")
    by_slot = {(name, wc.wr_id): wc for name in ("a", "b") for wc in got[name]["recv"]}
    for slot, (name, op, n, imm, data, src_qp) in enumerate(recv_checks):
        wc = by_slot.get((name, slot))
        if wc is None:
            problems.append(f"{name}: receive {slot} never completed")
            continue
        if op == WrOpcode.RDMA_WRITE_WITH_IMM:
            ok = wc.opcode == WcOpcode.RECV_RDMA_WITH_IMM and wc.imm_data == imm
        else:
            rb = tb.side[name].rbuf
            ok = (wc.opcode == WcOpcode.RECV and wc.byte_len == n and wc.src_qp == src_qp
                  and np.array_equal(rb[slot * RECV_SLOT:slot * RECV_SLOT + n], data)
                  and (op != WrOpcode.SEND_WITH_IMM
                       or (wc.wc_flags & WcFlags.WITH_IMM and wc.imm_data == imm)))
        if not ok:
            problems.append(f"{name}: receive {slot} ({op.name}, {n} B): {wc}")
    return problems


async def latency_probe(tb, count=8):
    """Doorbell write to the CQE in host memory for single signaled 64-byte WRITEs, in cycles."""
    s, p = tb.side["a"], tb.side["b"]
    qp, _ = s.qps[0]
    out = []
    for k in range(count):
        t0 = get_sim_time("ns")
        await qp.post_send(SendWR(wr_id=0xF000 + k, opcode=WrOpcode.RDMA_WRITE,
                                  sg_list=[SGE(s.mr_src.addr, 64, s.mr_src.lkey)],
                                  remote_addr=p.mr_dst.addr + MEM - 64, rkey=p.mr_dst.rkey,
                                  send_flags=SIG))
        (wc,) = await poll_until(s.cq, 1, s.host.clk, 100_000, step=1)
        assert wc.status == WcStatus.SUCCESS, wc
        out.append(round((get_sim_time("ns") - t0) / CLOCK_NS))
    return out


async def counters(ctx, block):
    out = {}
    for r in REGMAP.block(block).registers:
        if r.access == "counter":
            out[r.name] = await ctx.mmio.read32(REGMAP[f"{block}.{r.name}"].offset)
    return out


@cocotb.test()
async def demo(dut):
    loss = tb_param("loss", float, 0.01)
    pairs = tb_param("pairs", int, 2)
    messages = tb_param("messages", int, 12)
    pause = tb_param("pause", float, 0.0)
    tb = TwoHosts(dut, loss=loss, pause=pause)
    await tb.start(pairs)
    mmio0 = {n: s.host.ctx.mmio.snapshot() for n, s in tb.side.items()}
    t0 = get_sim_time("ns")
    posted, want, recv_checks = await traffic(tb, messages)
    got = await collect(tb, want, 2_000_000)
    t1 = get_sim_time("ns")
    problems = check(tb, got, recv_checks)
    mmio = {n: tuple(b - a for a, b in zip(mmio0[n], s.host.ctx.mmio.snapshot(), strict=True))
            for n, s in tb.side.items()}
    # the counters of the traffic above, then the latency probe
    transport = {n: await counters(s.host.ctx, "transport") for n, s in tb.side.items()}
    hostq = {n: await counters(s.host.ctx, "hostq") for n, s in tb.side.items()}
    lat = await latency_probe(tb)
    nbytes = sum(len(d) for s in tb.side.values() for _w, _a, _o, d in s.expect) \
        + sum(n for _s, op, n, *_ in recv_checks if op != WrOpcode.RDMA_WRITE_WITH_IMM)
    wrs = sum(posted.values())
    summary = {
        "seed": tb.seed, "loss": loss, "pairs": pairs, "messages": messages, "pause": pause,
        "posted": dict(posted), "posted_by": dict(tb.posted_by), "work_requests": wrs, "bytes": nbytes,
        "cycles": round((t1 - t0) / CLOCK_NS), "seconds": (t1 - t0) * 1e-9,
        "gbps": nbytes * 8 / (t1 - t0), "completions": {n: {k: len(v) for k, v in g.items()}
                                                          for n, g in got.items()},
        "mmio": {n: {"reads": r, "writes": w} for n, (r, w) in mmio.items()},
        "mmio_writes_per_wr": sum(w for _r, w in mmio.values()) / wrs,
        "latency_cycles": lat, "problems": problems,
        "transport": transport, "hostq": hostq,
        "switch": {k: {c: int(v) for c, v in d.items() if not isinstance(v, dict)}
                   for k, d in tb.switch.counters().items()},
    }
    tb.log.info("summary: %s", json.dumps({k: summary[k] for k in ("posted", "bytes", "cycles",
                                                                       "gbps", "mmio",
                                                                       "latency_cycles")}))
    out = os.environ.get("STELLAR_TB_OUT")
    if out:
        Path(out, "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    assert not problems, "\n".join(problems[:20])
    assert all(m["reads"] == 0 for m in summary["mmio"].values()), \
        f"MMIO reads on the fast path: {summary['mmio']}"
