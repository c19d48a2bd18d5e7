"""cocotb testbench behind ``stellar --device sim`` (``stellar.host.cli``) and ``make bench``'s
host part (``stellar.sim.bench_host``): the simulated two-host system, and one CLI command run
inside it.

``stellar_pcie2`` holds two PCIe NICs (ports ``a_*`` / ``b_*``, each clocked at 250 MHz by its
own cocotbext-pcie hard-block model). Each has a :class:`~stellar.sim.hosts.SimHost`: a root
complex with its own host memory and the host driver (``stellar.host.verbs``) on it. The switch
model (``stellar.sim.switch``, lossless) joins the two wires.

Parameters (``STELLAR_TB_*``): ``request``, the command as JSON
(``stellar.host.cli.request_from_args``); ``pause``, the probability of a stalled cycle on every
PCIe stream; ``poll`` (default 1), clocks between two polls of the perf routines.
``STELLAR_TB_OUT``: the run folder; the testbench appends progress lines to ``progress.log``
there (the CLI shows them while the simulation runs) and writes the command's result document
to ``result.json``.

A ``bench`` request (``stellar.sim.bench_host``) holds several perf requests (``runs``), each run
on a fresh pair; its document lists their documents.

``info``, ``stats`` and ``qp`` first run a little traffic on a QP pair (:data:`WARMUP`: WRITEs,
a READ, SENDs, every one signaled, over a 1024-byte path MTU), so the counters and QP tables
have something to show; the document's ``warmup`` says what was sent. ``perf`` connects a fresh
pair (A on NIC a, B on NIC b) and runs ``stellar.host.perf`` with :class:`SimClock`: simulated
seconds, and every poll one clock of NIC a.
"""

import json
import logging
import os
from pathlib import Path

import cocotb
from cocotb.triggers import ClockCycles
from cocotb.utils import get_sim_time
from stellar.hdl.flow.fields import PathMtu
from stellar.host.cli import execute, progress_line
from stellar.host.perf import Clock, PerfPair, connect_qps
from stellar.host.verbs import SGE, Access, QPCap, QPInitAttr, RecvWR, SendFlags, SendWR, WrOpcode

from .hosts import SimHost, poll_until
from .switch import LinkConfig, Switch
from .tb import tb_param

__all__ = ["SimClock", "TwoHosts", "WARMUP", "CLOCK_HZ"]

CLOCK_HZ = 250e6                     # the PCIe models' user_clk
MAC_A, IP_A = 0x02_00_00_00_00_0A, "10.0.0.1"
MAC_B, IP_B = 0x02_00_00_00_00_0B, "10.0.0.2"
#: the traffic before info / stats / qp: message sizes per operation, A (NIC a) to B (NIC b)
WARMUP = {"write": [1000, 3000, 64, 5000], "read": [2000], "send": [100, 1500], "mtu": 1024}


class SimClock(Clock):
    """Simulated time for ``stellar.host.perf``: ``now()`` in simulated seconds, ``idle()`` one
    clock of ``clk`` (so completions and memory are polled every cycle), ``hz`` the clock's
    rate, ``timeout`` in simulated seconds."""

    kind = "simulated"

    def __init__(self, clk, hz=CLOCK_HZ, *, poll_cycles=1, timeout=2e-3):
        self.clk, self.hz, self.poll_cycles, self.timeout = clk, hz, poll_cycles, timeout

    def now(self):
        return get_sim_time("ps") * 1e-12

    async def idle(self):
        await ClockCycles(self.clk, self.poll_cycles)


class TwoHosts:
    """Both simulated hosts of ``stellar_pcie2`` and the switch between their NICs."""

    def __init__(self, dut, *, pause=0.0, poll_cycles=1):
        self.a = SimHost(dut, "a", mac=MAC_A, ip=IP_A, pause=pause)
        self.b = SimHost(dut, "b", mac=MAC_B, ip=IP_B, pause=pause)
        self.switch = Switch.from_prefixes(dut, "a", "b", domains=True, config_ab=LinkConfig(),
                                           config_ba=LinkConfig())
        self.clock = SimClock(self.a.clk, poll_cycles=poll_cycles)

    async def start(self):
        tasks = [cocotb.start_soon(h.start(tick_cycles=250)) for h in (self.a, self.b)]
        for t in tasks:
            await t
        self.switch.start()
        return self

    def nics(self):
        """``[(name, device, ctx)]`` for ``stellar.host.cli.execute``."""
        return [(h.name, h.device, h.ctx) for h in (self.a, self.b)]

    async def pair(self, *, region, tx_depth, seed):
        return await PerfPair.create(self.a.ctx, self.b.ctx, addr_a=(MAC_A, IP_A),
                                     addr_b=(MAC_B, IP_B), region=region, tx_depth=tx_depth,
                                     seed=seed)

    async def warmup(self):
        """The traffic of :data:`WARMUP` on a QP pair of its own; every WR signaled, every
        completion awaited, the data checked."""
        a, b = self.a.ctx, self.b.ctx
        pd_a, pd_b = a.alloc_pd(), b.alloc_pd()
        acc = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        mem_a, mem_b = bytearray(os.urandom(1 << 15)), bytearray(1 << 15)
        mr_a, mr_b = await pd_a.reg_mr(mem_a, acc), await pd_b.reg_mr(mem_b, acc)
        cq_a, cq_b = await a.create_cq(64), await b.create_cq(64)
        qa = await a.create_qp(pd_a, QPInitAttr(send_cq=cq_a, recv_cq=cq_a, cap=QPCap(16, 16)))
        qb = await b.create_qp(pd_b, QPInitAttr(send_cq=cq_b, recv_cq=cq_b, cap=QPCap(16, 16)))
        await connect_qps(qa, (MAC_A, IP_A), qb, (MAC_B, IP_B), psn_a=0x123456, psn_b=0xABCDE,
                          mtu=PathMtu.MTU_1024)
        sig = SendFlags.SIGNALED
        off, writes = 0, []
        for i, n in enumerate(WARMUP["write"]):
            writes.append(SendWR(wr_id=i, opcode=WrOpcode.RDMA_WRITE,
                                 sg_list=[SGE(mr_a.addr + off, n, mr_a.lkey)],
                                 remote_addr=mr_b.addr + off, rkey=mr_b.rkey, send_flags=sig))
            off += n
        await qa.post_send(writes)                           # one list: one doorbell
        clk = self.a.clk
        await poll_until(cq_a, len(writes), clk)
        assert mem_b[:off] == mem_a[:off], "warm-up WRITE data"
        (n,) = WARMUP["read"]
        await qa.post_send(SendWR(wr_id=10, opcode=WrOpcode.RDMA_READ,
                                  sg_list=[SGE(mr_a.addr + 16384, n, mr_a.lkey)],
                                  remote_addr=mr_b.addr, rkey=mr_b.rkey, send_flags=sig))
        await poll_until(cq_a, 1, clk)
        assert mem_a[16384:16384 + n] == mem_b[:n], "warm-up READ data"
        sends = WARMUP["send"]
        await qb.post_recv([RecvWR(wr_id=20 + i, sg_list=[SGE(mr_b.addr + 20000 + 2048 * i, 2048,
                                                             mr_b.lkey)])
                            for i in range(len(sends))])
        await qa.post_send([SendWR(wr_id=20 + i, opcode=WrOpcode.SEND,
                                   sg_list=[SGE(mr_a.addr + 100 * i, n, mr_a.lkey)], send_flags=sig)
                            for i, n in enumerate(sends)])
        await poll_until(cq_a, len(sends), clk)
        recvs = await poll_until(cq_b, len(sends), self.b.clk)
        assert [w.byte_len for w in recvs] == sends, recvs
        return WARMUP


class Progress:
    """Progress lines: appended to ``progress.log`` in the run folder (the CLI tails it) and
    logged."""

    def __init__(self, out):
        self.path = None if out is None else Path(out) / "progress.log"
        self.log = logging.getLogger("cocotb.tb")

    def line(self, text):
        self.log.info("%s", text)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(text + "\n")

    def __call__(self, test, size, done, total):
        self.line(progress_line(test, size, done, total))


def pair_maker(hosts, request):
    """The ``make_pair`` of a perf request: a fresh pair (A on NIC a, B on NIC b) whose regions
    hold the largest size."""
    if request["command"] != "perf":
        return None
    region = max(1 << 16, max(request["sizes"]))

    async def make_pair():
        return await hosts.pair(region=region, tx_depth=request["tx_depth"],
                                seed=cocotb.RANDOM_SEED)
    return make_pair


@cocotb.test()
async def cli(dut):
    """One command of ``stellar.host.cli`` on the simulated two-host system."""
    request = json.loads(tb_param("request", str))
    pause = tb_param("pause", float, 0.0)
    out = os.environ.get("STELLAR_TB_OUT")
    progress = Progress(out)
    seed = int(os.environ.get("COCOTB_RANDOM_SEED", "0") or 0)    # what reproduces the run
    progress.line(f"simulation: seed {seed}, PCIe stream pause {pause:g}; "
                  "enumerating both hosts")
    hosts = await TwoHosts(dut, pause=pause, poll_cycles=tb_param("poll", int, 1)).start()
    doc_extra = {}
    t0 = get_sim_time("ns")
    if request["command"] == "bench":
        # stellar.sim.bench_host: several perf requests, each on a fresh pair
        docs = []
        for i, sub in enumerate(request["runs"], 1):
            progress.line(f"[{i}/{len(request['runs'])}] {sub.get('label', sub['test'])}")
            docs.append({"label": sub.get("label"),
                         **await execute(sub, hosts.nics(), make_pair=pair_maker(hosts, sub),
                                         clock=hosts.clock, progress=progress)})
        doc = {"command": "bench", "docs": docs}
    else:
        if request["command"] == "perf":
            progress.line(f"{request['test']}: sizes {', '.join(map(str, request['sizes']))} B, "
                          f"{request['iters']} iterations each")
        else:
            progress.line("warm-up traffic (WRITEs, a READ, SENDs), then "
                          f"`{request['command']}`")
            doc_extra["warmup"] = await hosts.warmup()
        doc = await execute(request, hosts.nics(), make_pair=pair_maker(hosts, request),
                            clock=hosts.clock, progress=progress)
    doc.update(doc_extra, simulated={"seed": seed, "pause": pause,
                                     "clock_hz": CLOCK_HZ, "command_ns": get_sim_time("ns") - t0,
                                     "switch": {k: {n: int(v) for n, v in c.items()}
                                                for k, c in hosts.switch.counters().items()}})
    if out is not None:
        (Path(out) / "result.json").write_text(json.dumps(doc, indent=1) + "\n")
    progress.line(f"finished at {get_sim_time('ns') / 1e3:.1f} us of simulated time")
