"""cocotb testbench of the Endpoint API (``stellar.host.endpoint``) on ``stellar_pcie2``: two
simulated hosts "a" and "b", each the host driver on its own NIC behind its own cocotbext-pcie
root complex, the NICs' Ethernet ports joined by the switch model (a little loss both ways).
Both endpoints run in this event loop and meet through a ``LocalHub`` (the out-of-band channel);
the peer file is YAML written to a temporary directory.

Test (``tests/cocotb/test_endpoint_cocotb.py``): ``endpoint``

* open both from the file (QoS profile ``ai_training`` in tenant 1 on VLAN 101), connect,
  exchange memory; the QP contexts read back from each device carry the profile: sl = class 7,
  DSCP 56 with ECT(0), DCQCN, tenant 1, the VLAN tag, the peer's QPN, the file's MTU/timeout;
* blocking ``rdma_write`` both ways at once, random offsets and lengths, every byte compared
  with the source array (snapshot taken before the transfer);
* ``max_outstanding`` non-blocking writes, one more raises QueueFull (E3008) before reaching
  the device, the handles awaited out of order, data checked; ``rdma_read`` checked;
* barrier: ``a`` leaves non-blocking writes unawaited and enters late; ``b`` does not leave
  before ``a`` entered, and finds the data in its memory when it leaves;
* a corrupted rkey: RemoteAccessError (E2003) from the REM_ACCESS_ERR completion, the target
  memory untouched; the QP refuses further posts (E4002); a remote range past the advertised
  region is refused on the host; ``connect`` again on both ends recovers, traffic flows.

Random backpressure (``STELLAR_TB_PAUSE``) on every stream of both PCIe models and on the
switch's links; seeds are logged.
"""

import dataclasses
import logging
import random
import tempfile
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import Timer
from cocotb.utils import get_sim_time
from stellar.hdl.flow.fields import CcMode, PathMtu, QpState
from stellar.hdl.transport.formats import WcOpcode, WcStatus
from stellar.host.endpoint import Endpoint, LocalHub, Operation
from stellar.host.errors import QpInErrorState, QueueFull, RemoteAccessError

from .pcie import SimPcieDevice
from .switch import LinkConfig, Switch
from .tb import pause_generator, tb_param

PEERS = """\
oob: local
peers:
  a: {{mac: "02:00:00:00:00:a1", ip: 10.0.0.1}}
  b: {{mac: "02:00:00:00:00:b2", ip: 10.0.0.2}}
qos: {{profile: ai_training, tenant: 1, vlan: 101}}
transport: {{mtu: {mtu}, timeout: 4, retry_cnt: 7, rnr_retry: 7, max_send_wr: 16,
            max_outstanding: {outstanding}, op_timeout: 0.02}}
"""
MTU, OUTSTANDING, SIZE = 1024, 6, 1 << 16


async def both(*coros):
    """Run the coroutines concurrently (one per host); their results in order."""
    tasks = [cocotb.start_soon(c) for c in coros]
    return [await t for t in tasks]


class Bench:
    def __init__(self, dut, *, loss=0.02):
        self.dut = dut
        self.log = logging.getLogger("cocotb.tb")
        self.pause = tb_param("pause", float, 0.0)
        self.seed = cocotb.RANDOM_SEED
        self.rng = random.Random(self.seed)
        self.np_rng = np.random.default_rng(self.seed)
        self.log.info("endpoint bench: seed %d, pause %.2f, loss %.3f", self.seed, self.pause, loss)
        self.dev = {p: SimPcieDevice(dut, prefix=p, pause=self.pause) for p in "ab"}
        cfg = LinkConfig(drop=loss, delay=40)
        self.switch = Switch.from_prefixes(dut, "a", "b", domains=True, config_ab=cfg,
                                           config_ba=dataclasses.replace(cfg))
        if self.pause:
            for link in self.switch.links:
                link.source.set_pause_generator(pause_generator(self.pause, name=f"{link.name}.rx"))
                link.sink.set_pause_generator(pause_generator(self.pause, name=f"{link.name}.tx"))
        self.tmp = tempfile.TemporaryDirectory(prefix="stellar-endpoint-")
        self.peers = Path(self.tmp.name) / "peers.yaml"
        self.peers.write_text(PEERS.format(mtu=MTU, outstanding=OUTSTANDING))
        self.hub = LocalHub(sleep=lambda: Timer(1, "us"), interval=1e-6)

    async def start(self):
        await both(*(d.enumerate() for d in self.dev.values()))
        self.switch.start()
        a, b = await both(*(Endpoint.open(self.dev[n], self.peers, n, oob=self.hub,
                                          seed=self.rng.randrange(1 << 32)) for n in "ab"))
        return a, b

    def buffer(self, n, fill=True):
        return (self.np_rng.integers(0, 256, n, dtype=np.uint8) if fill
                else np.zeros(n, dtype=np.uint8))

    def span(self, n_max=6000):
        n = self.rng.choice([1, 63, MTU, MTU + 1, 3 * MTU, self.rng.randrange(1, n_max)])
        return self.rng.randrange(0, SIZE - n), n


def expect_equal(got, want, what):
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)
        raise AssertionError(f"{what}: {bad.size} bytes differ, first at {bad[0]} "
                             f"(got {got[bad[0]]:#x}, want {want[bad[0]]:#x})")


@cocotb.test(timeout_time=200, timeout_unit="ms")
async def endpoint(dut):
    b = Bench(dut)
    ep_a, ep_b = await b.start()
    # buffers: a writes from a_src into b_dst, b from b_src into a_dst; references are copies
    a_src, b_src = b.buffer(SIZE), b.buffer(SIZE)
    a_dst, b_dst = b.buffer(SIZE, False), b.buffer(SIZE, False)
    ref_a, ref_b = a_src.copy(), b_src.copy()
    la_src, la_dst = await ep_a.register_memory(a_src), await ep_a.register_memory(a_dst)
    lb_src, lb_dst = await ep_b.register_memory(b_src), await ep_b.register_memory(b_dst)

    await both(ep_a.connect("b"), ep_b.connect("a"))
    # exchange 0: the destinations, exchange 1: the sources (for READs)
    r_bdst, r_adst = await both(ep_a.exchange_memory("b", la_dst), ep_b.exchange_memory("a", lb_dst))
    r_bsrc, _r_asrc = await both(ep_a.exchange_memory("b", la_src), ep_b.exchange_memory("a", lb_src))
    assert (r_bdst.addr, r_bdst.rkey, r_bdst.length) == (lb_dst.addr, lb_dst.rkey, SIZE), r_bdst
    assert (r_adst.addr, r_adst.rkey, r_adst.length) == (la_dst.addr, la_dst.rkey, SIZE), r_adst
    assert r_bsrc.rkey == lb_src.rkey

    # the QoS profile and the connection, as the devices hold them
    ca, cb = ep_a.connection("b"), ep_b.connection("a")
    for ep, conn, other in ((ep_a, ca, cb), (ep_b, cb, ca)):
        hw = await ep.ctx.tables.read_qp(conn.qp.index)
        b.log.info("%s QP %#x context: %s", ep.name, conn.qp.qp_num,
                   {k: hw[k] for k in ("state", "tenant", "sl", "traffic_class", "cc_mode",
                                       "weight", "tx_vlan", "remote_qpn", "pmtu", "timeout")})
        want = {"state": QpState.RTS, "tenant": 1, "sl": 7, "traffic_class": 56 << 2 | 0b10,
                "cc_mode": CcMode.DCQCN, "weight": 1, "tx_vlan": 1 << 12 | 101,
                "remote_qpn": other.qp.qp_num, "pmtu": PathMtu.MTU_1024, "timeout": 4,
                "retry_cnt": 7, "rnr_retry": 7, "sq_psn": conn.sq_psn, "epsn": other.sq_psn}
        got = {k: hw[k] for k in want}
        assert got == {k: int(v) for k, v in want.items()}, (ep.name, got, want)

    # blocking writes, both directions at once
    async def writes(ep, remote, local, src_ref, dst, n):
        for _ in range(n):
            off, length = b.span()
            roff = b.rng.randrange(0, SIZE - length)
            wc = await ep.rdma_write(remote, local, length, remote_offset=roff, local_offset=off)
            assert wc.status == WcStatus.SUCCESS and wc.opcode == WcOpcode.RDMA_WRITE, wc
            expect_equal(dst[roff:roff + length], src_ref[off:off + length],
                         f"{ep.name}: blocking WRITE [{off}, +{length}) -> {roff}")
        return n
    t0 = get_sim_time("us")
    counts = await both(writes(ep_a, r_bdst, la_src, ref_a, b_dst, 10),
                        writes(ep_b, r_adst, lb_src, ref_b, a_dst, 10))
    b.log.info("blocking: %s WRITEs verified in %.1f us", counts, get_sim_time("us") - t0)

    # non-blocking: OUTSTANDING in flight, one more refused, handles awaited out of order
    b_dst[:] = 0
    plan = [(i * (SIZE // OUTSTANDING), b.rng.randrange(1, SIZE // OUTSTANDING - 64))
            for i in range(OUTSTANDING)]
    ops = []
    for off, length in plan:
        ops.append(await ep_a.rdma_write(r_bdst, la_src, length, non_blocking=True,
                                         remote_offset=off + 7, local_offset=off))
    assert all(isinstance(op, Operation) for op in ops)
    before = ep_a.ctx.mmio.snapshot()
    try:
        await ep_a.rdma_write(r_bdst, la_src, 16, non_blocking=True)
    except QueueFull as e:
        assert e.code == "E3008" and e.outstanding == OUTSTANDING, e
        b.log.info("refused as expected: %s", e)
    else:
        raise AssertionError(f"operation {OUTSTANDING + 1} was accepted")
    assert ep_a.ctx.mmio.snapshot() == before, "the refused operation touched the device"
    order = list(range(OUTSTANDING))
    b.rng.shuffle(order)
    for i in order:
        wc = await ops[i]
        assert wc.status == WcStatus.SUCCESS and ops[i].done(), (i, wc)
    for off, length in plan:
        expect_equal(b_dst[off + 7:off + 7 + length], ref_a[off:off + length],
                     f"non-blocking WRITE [{off}, +{length})")
    assert ca.pending == {}

    # READ: a reads b's source into its destination
    off, length = b.span()
    wc = await ep_a.rdma_read(r_bsrc, la_dst, length, remote_offset=off, local_offset=SIZE - length)
    assert wc.status == WcStatus.SUCCESS and wc.opcode == WcOpcode.RDMA_READ, wc
    expect_equal(a_dst[SIZE - length:], ref_b[off:off + length], f"READ [{off}, +{length})")

    # barrier: a posts non-blocking writes, never awaits them, enters late; b waits for it
    b_dst[:] = 0
    plan = [(b.rng.randrange(0, SIZE - 3000), b.rng.randrange(1, 3000)) for _ in range(4)]
    plan = [(i * 16384 + o % 12000, n) for i, (o, n) in enumerate(plan)]
    entered = {}

    async def side_a():
        for o, n in plan:
            await ep_a.rdma_write(r_bdst, la_src, n, non_blocking=True, remote_offset=o,
                                  local_offset=o)
        await Timer(20, "us")
        entered["a"] = get_sim_time("ns")
        await ep_a.barrier()

    async def side_b():
        entered["b"] = get_sim_time("ns")
        await ep_b.barrier()
        left = get_sim_time("ns")
        assert left >= entered.get("a", float("inf")), (entered, left)
        for o, n in plan:       # a's writes completed before a entered: the data is here
            expect_equal(b_dst[o:o + n], ref_a[o:o + n], f"WRITE [{o}, +{n}) before the barrier")
        return left

    _, left = await both(side_a(), side_b())
    b.log.info("barrier: b entered at %d ns, a at %d ns, b left at %d ns", entered["b"],
               entered["a"], left)

    # a corrupted rkey: the peer refuses, nothing lands, the QP is in ERROR
    b_dst[:] = 0
    bad = dataclasses.replace(r_bdst, rkey=r_bdst.rkey ^ 0x5A)
    try:
        await ep_a.rdma_write(bad, la_src, 2048, remote_offset=100)
    except RemoteAccessError as e:
        assert e.code == "E2003" and e.wc.status == WcStatus.REM_ACCESS_ERR, e
        assert e.rkey == bad.rkey and e.peer == "b", e
        b.log.info("refused as expected: %s", e)
    else:
        raise AssertionError("a WRITE with a corrupted rkey succeeded")
    assert not b_dst.any(), "the refused WRITE changed the peer's memory"
    assert ca.qp.state == QpState.ERROR
    try:
        await ep_a.rdma_write(r_bdst, la_src, 64)
    except QpInErrorState as e:
        b.log.info("refused as expected: %s", e)
    else:
        raise AssertionError("a post to a QP in ERROR was accepted")
    try:
        await ep_a.rdma_write(r_bdst, la_src, 64, remote_offset=SIZE - 63)
    except RemoteAccessError as e:
        assert "outside" in e.cause, e
    else:
        raise AssertionError("a WRITE past the advertised region was posted")

    # recovery: connect again on both ends (RESET -> INIT -> RTR -> RTS, fresh PSNs)
    old_psn = ca.sq_psn
    await both(ep_a.connect("b"), ep_b.connect("a"))
    assert ca.qp.state == cb.qp.state == QpState.RTS and ca.epoch == cb.epoch == 1
    b.log.info("reconnected: PSN %#x -> %#x", old_psn, ca.sq_psn)
    ops = [await ep_a.rdma_write(r_bdst, la_src, 4000, non_blocking=True, remote_offset=o,
                                 local_offset=o) for o in (0, 8192, 16384)]
    for op in ops:
        await op
    for o in (0, 8192, 16384):
        expect_equal(b_dst[o:o + 4000], ref_a[o:o + 4000], f"WRITE at {o} after recovery")
    await both(ep_a.barrier(), ep_b.barrier())

    b.log.info("switch:\n%s", b.switch.summary())
    await both(ep_a.close(), ep_b.close())
    b.tmp.cleanup()
