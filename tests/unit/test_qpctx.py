"""stellar.hdl.flow.qpctx: the QP context store in the Amaranth simulator.

The reference model is the obvious one: the memory is a list of context integers updated in
program order by every write (a ``wb`` at the edge it is valid; a host WRITE at the edge its
``host_resp`` pulses, merged with ``QP_CONTEXT.merge``). Every cycle ``resp`` is valid its
``ctx`` must equal the model *before* that cycle's writes (the consistency contract), every
host READ returns the model and every host WRITE returns the merge of the model; responses and
host completions come in issue order; ``user`` and ``index`` travel with their request; the
final memory equals the model. The consumer writes back a modified context in the same cycle
it takes a packet, so runs of one QP chain read-modify-writes through the forwarding paths.

A store built with ``wb_fields`` (as NicCore builds it: the transport writes back ``epsn`` and
``msn``) keeps only those fields of a write-back: the model merges a ``wb`` with that field
mask, and the write-backs here change other fields too (junk the store must ignore).
"""

from collections import deque

import pytest
from amaranth.hdl import Cat
from amaranth.sim import Simulator
from stellar.hdl.flow.fields import QP_CONTEXT
from stellar.hdl.flow.qpctx import QpContextStore, QpHostOp
from stellar.sim.amaranth_streams import run_seeds, seeded_rng

W = QP_CONTEXT.width
FULL_MASK = (1 << len(QP_CONTEXT.fields)) - 1
OTHER_FIELDS = [f for f in QP_CONTEXT.fields if f.name not in ("epsn", "msn")]
CORE_WB = ("epsn", "msn")      # what RcTransport writes back (RcTransport.WB_FIELDS)


def modify(rng, c):
    """What a transport does to a context: next expected PSN, MSN moves on, some other fields
    change at random."""
    f = QP_CONTEXT.unpack(c)
    f["epsn"] = (f["epsn"] + 1) % (1 << 24)
    f["msn"] = (f["msn"] + rng.randint(0, 3)) % (1 << 24)
    for fld in rng.sample(OTHER_FIELDS, rng.randint(0, 2)):
        f[fld.name] = rng.getrandbits(fld.width)
    return QP_CONTEXT.pack(f)


def random_mask(rng):
    r = rng.random()
    if r < 0.2:
        return FULL_MASK
    if r < 0.4:
        return QP_CONTEXT.mask(["epsn"])
    if r < 0.5:
        return 0
    return rng.getrandbits(len(QP_CONTEXT.fields))


class Harness:
    """Drives one clock at a time, checks the outputs against the memory model and keeps the
    model, the issue order and the timestamps (edge numbers, as in ``amaranth_streams``)."""

    def __init__(self, dut, rng):
        self.dut = dut
        self.rng = rng
        self.ib = dut.index_bits
        self.uw = dut.user_width
        self.model = [0] * dut.depth
        self.wb_mask = QP_CONTEXT.mask(dut.wb_fields)
        self.inflight = deque()      # issued tokens in order: ("pkt", index, user, edge) / ("host", ...)
        self.edge = 0
        self.req_edges = []          # edge of each req transfer
        self.resp_log = []           # (edge, index, user, ctx) of each resp transfer
        self.host_log = []           # (edge issued, edge done, op, index, ctx returned)
        self.resp_valid_cycles = 0
        self.wb_count = 0
        self._held = None            # (index, user) of a resp offered and not taken
        self._last_in = self._last_wb = None
        d = dut
        self.in_bus = Cat(d.req.payload.as_value(), d.req.valid, d.host.payload.as_value(),
                          d.host.valid, d.resp.ready)
        self.obs = Cat(d.resp.valid, d.resp.payload.as_value(), d.req.ready, d.host.ready,
                       d.req_ok)
        self.wb_bus = Cat(d.wb.payload.as_value(), d.wb.valid)
        self.host_obs = Cat(d.host_resp.valid, d.host_resp.payload.as_value())
        self.req_bits = len(d.req.payload.as_value())
        self.host_bits = len(d.host.payload.as_value())
        self.wb_bits = len(d.wb.payload.as_value())

    def _req_value(self, req):
        if req is None:
            return self.rng.getrandbits(self.req_bits)          # junk while valid is low
        index, user = req
        return (index | user << self.ib) | 1 << self.req_bits

    def _host_value(self, host):
        if host is None:
            return self.rng.getrandbits(self.host_bits)
        op, index, ctx, mask = host
        bits = int(op) | index << 1 | ctx << (1 + self.ib) | mask << (1 + self.ib + W)
        return bits | 1 << self.host_bits

    async def cycle(self, ctx, req=None, host=None, ready=True, consume=None, junk=True):
        """One clock. ``req``: (index, user) offered, ``host``: (op, index, ctx, mask) offered,
        ``ready``: resp.ready, ``consume(resp)``: called with (index, ctx, user) of the packet
        taken this cycle (or None), returns the write-back (index, ctx) or None.
        Returns (req taken, host taken)."""
        ib, uw = self.ib, self.uw
        if req is None and host is None and not junk:
            value = ready << (self.req_bits + self.host_bits + 2)
        else:
            value = (self._req_value(req) | self._host_value(host) << (self.req_bits + 1)
                     | int(ready) << (self.req_bits + self.host_bits + 2))
        if value != self._last_in:
            ctx.set(self.in_bus, value)
            self._last_in = value
        obs = ctx.get(self.obs)
        resp_valid = obs & 1
        p = obs >> 1
        r_index, r_ctx, r_user = p & ((1 << ib) - 1), (p >> ib) & ((1 << W) - 1), p >> (ib + W)
        r_user &= (1 << uw) - 1
        rest = obs >> (1 + ib + W + uw)
        req_ready, host_ready = rest & 1, rest >> 1 & 1
        if req is not None:
            assert rest >> 2 & 1 == req_ready, f"edge {self.edge}: req_ok is not req.ready"

        taken = None
        if self._held is not None:
            assert resp_valid and (r_index, r_user) == self._held, (
                f"edge {self.edge}: a response offered and not taken was withdrawn or changed")
        self._held = None
        if resp_valid:
            self.resp_valid_cycles += 1
            assert r_ctx == self.model[r_index], (
                f"edge {self.edge}: resp ctx of QP {r_index} misses a write:\n"
                f"  got      {QP_CONTEXT.unpack(r_ctx)}\n  expected {QP_CONTEXT.unpack(self.model[r_index])}")
            if ready:
                taken = (r_index, r_ctx, r_user)
                assert self.inflight and self.inflight[0][0] == "pkt", (
                    f"edge {self.edge}: a response out of order (expected {self.inflight[:1]})")
                _, e_index, e_user, _ = self.inflight.popleft()
                assert (r_index, r_user) == (e_index, e_user), f"edge {self.edge}: wrong response"
                self.resp_log.append((self.edge, r_index, r_user, r_ctx))
            else:
                self._held = (r_index, r_user)

        wb = consume(taken) if consume else None
        wb_value = (self.rng.getrandbits(self.wb_bits) if junk else 0) if wb is None else (
            wb[0] | wb[1] << ib | 1 << self.wb_bits)
        if wb_value != self._last_wb:
            ctx.set(self.wb_bus, wb_value)
            self._last_wb = wb_value
        hobs = ctx.get(self.host_obs)
        if hobs & 1:
            h_ctx = hobs >> 1
            assert self.inflight and self.inflight[0][0] == "host", (
                f"edge {self.edge}: host completion out of order")
            _, op, index, data, mask, issued = self.inflight.popleft()
            expect = QP_CONTEXT.merge(self.model[index], data, mask if op == QpHostOp.WRITE else 0)
            assert h_ctx == expect, (
                f"edge {self.edge}: host {op.name} of QP {index}:\n  got      "
                f"{QP_CONTEXT.unpack(h_ctx)}\n  expected {QP_CONTEXT.unpack(expect)}")
            if op == QpHostOp.WRITE:
                assert wb is None, f"edge {self.edge}: host write done in the cycle of a write-back"
                self.model[index] = expect
            self.host_log.append((issued, self.edge, op, index, h_ctx))
        if wb is not None:
            self.model[wb[0]] = QP_CONTEXT.merge(self.model[wb[0]], wb[1], self.wb_mask)
            self.wb_count += 1

        req_taken = req is not None and bool(req_ready)
        host_taken = host is not None and bool(host_ready)
        assert not (req_taken and host_taken), f"edge {self.edge}: two tokens issued in one clock"
        if host is not None and host_ready:
            assert not req_ready, f"edge {self.edge}: req ready while the host is taken"
        if req_taken:
            self.inflight.append(("pkt", req[0], req[1], self.edge))
            self.req_edges.append(self.edge)
        if host_taken:
            self.inflight.append(("host", QpHostOp(host[0]), host[1], host[2], host[3], self.edge))
        await ctx.tick()
        self.edge += 1
        return req_taken, host_taken

    async def drain(self, ctx, limit=200):
        for _ in range(limit):
            if not self.inflight:
                return
            await self.cycle(ctx, ready=True)
        raise AssertionError(f"tokens left in the store: {list(self.inflight)}")

    def check_memory(self, ctx):
        d = self.dut
        got = [d.context(ctx.get(d.mem_data[i]), ctx.get(d.host_mem_data[i]) if d.host_fields else 0)
               for i in range(d.depth)]
        bad = [i for i in range(self.dut.depth) if got[i] != self.model[i]]
        assert not bad, f"memory differs from the model at QPs {bad}"


def simulate(dut, body):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(body)
    sim.run()


async def run_traffic(h, ctx, packets, host_ops, *, p_req=1.0, p_host=1.0, p_ready=1.0,
                      p_spont=0.0, qps=None, timeout=2000):
    """Offers ``packets`` (index, user) and ``host_ops`` with random gaps, random resp
    backpressure, a consumer that writes back every packet it takes in the same cycle, and
    now and then (``p_spont``) a write-back to a random QP of ``qps`` in a cycle without a
    take (a consumer writing back late)."""
    rng = h.rng
    qps = qps or list(range(h.dut.depth))

    def consume(taken):
        if taken is not None:
            return taken[0], modify(rng, taken[1])
        if rng.random() < p_spont:
            return rng.choice(qps), rng.getrandbits(W)
        return None

    pi = hi = 0
    req_off = host_off = None
    still = 0
    while pi < len(packets) or hi < len(host_ops) or h.inflight:
        if req_off is None and pi < len(packets) and rng.random() < p_req:
            req_off = packets[pi]
        if host_off is None and hi < len(host_ops) and rng.random() < p_host:
            host_off = host_ops[hi]
        ready = rng.random() < p_ready
        n_before = len(h.resp_log) + len(h.host_log)
        rt, ht = await h.cycle(ctx, req_off, host_off, ready, consume)
        if rt:
            pi, req_off = pi + 1, None
        if ht:
            hi, host_off = hi + 1, None
        progress = rt or ht or len(h.resp_log) + len(h.host_log) > n_before
        still = 0 if progress else still + 1
        assert still < timeout, f"no progress for {timeout} clocks at edge {h.edge}"


def random_host_ops(rng, n, qps):
    ops = []
    for _ in range(n):
        op = QpHostOp.WRITE if rng.random() < 0.6 else QpHostOp.READ
        ops.append((op, rng.choice(qps), rng.getrandbits(W), random_mask(rng)))
    return ops


async def preload(h, ctx):
    """Every QP gets a random context through host WRITEs with the full mask; with nothing
    ahead of it, each one is done ``LATENCY`` clocks after its transfer."""
    ops = [(QpHostOp.WRITE, i, h.rng.getrandbits(W), FULL_MASK) for i in range(h.dut.depth)]
    first = len(h.host_log)
    await run_traffic(h, ctx, [], ops)
    assert h.model == [op[2] for op in ops]
    assert all(done - issued == h.dut.LATENCY for issued, done, *_ in h.host_log[first:])


# ---------------------------------------------------------------------------------------------
# Random traffic against the model

PATTERNS = {
    # name: (QPs the packets use, p_req, p_ready, p_host, p_spont)
    "one_qp": (lambda depth, rng: [rng.randrange(depth)], 0.9, 0.8, 0.08, 0.1),
    "few_qps": (lambda depth, rng: rng.sample(range(depth), 3), 0.8, 0.6, 0.08, 0.15),
    "all_qps": (lambda depth, rng: list(range(depth)), 0.7, 0.5, 0.1, 0.2),
}


@pytest.mark.parametrize("seed", run_seeds([1, 2, 3]))
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("depth,user_width,queue,wb_fields", [
    (16, 5, 4, None), (64, 0, 4, None), (16, 3, 2, None), (16, 3, 1, None),
    (16, 5, 4, CORE_WB), (64, 0, 4, CORE_WB), (16, 3, 2, CORE_WB)])
def test_random_traffic(depth, user_width, queue, wb_fields, pattern, seed):
    """Packets (runs on one QP, a few QPs or all of them) with idle cycles, random resp
    backpressure, a same-cycle write-back of every packet, late write-backs to random QPs, and
    host READs and masked WRITEs interleaved at random: every resp ctx (in every cycle it is
    valid), every host result and the final memory match the model; order, index and user
    are kept; a final host READ of every QP returns the model. Also with a queue of 1 and 2
    entries (not full rate, still exact), and with the write-back limited to ``epsn``/``msn``
    (the other fields of every write-back are changed at random and must be ignored)."""
    tag = "" if wb_fields is None else "-core"
    rng = seeded_rng(f"qpctx-random-{depth}-{queue}-{pattern}{tag}", seed)
    pick, p_req, p_ready, p_host, p_spont = PATTERNS[pattern]
    qps = pick(depth, rng)
    dut = QpContextStore(depth, user_width=user_width, queue=queue, wb_fields=wb_fields)
    h = Harness(dut, rng)
    n = 700 if queue >= 4 else 300
    packets = [(rng.choice(qps), rng.getrandbits(user_width)) for _ in range(n)]
    host_ops = random_host_ops(rng, 60, qps)

    async def body(ctx):
        await preload(h, ctx)
        await run_traffic(h, ctx, packets, host_ops, p_req=p_req, p_host=p_host, p_ready=p_ready,
                          p_spont=p_spont, qps=qps)
        await run_traffic(h, ctx, [], [(QpHostOp.READ, i, rng.getrandbits(W), rng.getrandbits(23))
                                       for i in range(depth)], p_host=0.7)
        h.check_memory(ctx)

    simulate(dut, body)
    assert len(h.resp_log) == n and len(h.host_log) == 2 * depth + len(host_ops)
    # The test did exercise the interesting cases.
    back_to_back = sum(1 for a, b in zip(h.resp_log, h.resp_log[1:], strict=False)
                       if b[0] == a[0] + 1 and b[1] == a[1])
    print(f"{h.edge} clocks, {n} packets, {back_to_back} back to back on one QP, "
          f"{h.wb_count} write-backs, {len(host_ops)} host ops")
    if queue >= 3:
        assert back_to_back > {"one_qp": n // 4, "few_qps": 20, "all_qps": 0}[pattern]


# ---------------------------------------------------------------------------------------------
# Throughput and latency


@pytest.mark.parametrize("wb_fields", [None, CORE_WB], ids=["all", "core"])
@pytest.mark.parametrize("queue", [3, 4])
@pytest.mark.parametrize("pattern", ["one_qp", "two_qps_alternating", "random_qps"])
def test_one_packet_per_clock(pattern, queue, wb_fields):
    """req always valid, resp always ready, no host ops: one req transfer per clock, one resp
    per clock without a bubble, each exactly LATENCY clocks after its req, and on one QP every
    packet sees the epsn its predecessor wrote back in the previous cycle."""
    rng = seeded_rng(f"qpctx-rate-{pattern}-{queue}", 7)
    depth = 16
    dut = QpContextStore(depth, user_width=4, queue=queue, wb_fields=wb_fields)
    assert dut.LATENCY == 2
    h = Harness(dut, rng)
    n = 200
    if pattern == "one_qp":
        idx = [5] * n
    elif pattern == "two_qps_alternating":
        idx = [3 + (i & 1) * 8 for i in range(n)]
    else:
        idx = [rng.randrange(depth) for _ in range(n)]
    packets = [(i, n_ % 16) for n_, i in enumerate(idx)]

    async def body(ctx):
        await preload(h, ctx)
        h.req_edges.clear()
        h.resp_log.clear()
        await run_traffic(h, ctx, packets, [])
        h.check_memory(ctx)

    simulate(dut, body)
    req_edges = h.req_edges
    resp_edges = [r[0] for r in h.resp_log]
    assert req_edges == list(range(req_edges[0], req_edges[0] + n)), "req stalled"
    assert resp_edges == list(range(resp_edges[0], resp_edges[0] + n)), "bubble on resp"
    assert [b - a for a, b in zip(req_edges, resp_edges, strict=True)] == [dut.LATENCY] * n
    rate = n / (resp_edges[-1] - resp_edges[0] + 1)
    print(f"queue={queue} {pattern}: {rate:.3f} packets per clock, latency {dut.LATENCY}")
    if pattern == "one_qp":
        epsn = [QP_CONTEXT.unpack(r[3])["epsn"] for r in h.resp_log]
        assert epsn == [(epsn[0] + k) % (1 << 24) for k in range(n)], "an update was not forwarded"


@pytest.mark.parametrize("queue", [1, 2, 3, 4, 6])
def test_queue_absorbs_stall(queue):
    """With resp stalled, req keeps flowing until ``queue`` responses are held, then stops; the
    held responses come out in order once resp is ready, then one per clock again."""
    rng = seeded_rng(f"qpctx-queue-{queue}", 3)
    dut = QpContextStore(16, user_width=4, queue=queue)
    h = Harness(dut, rng)
    n = 30

    async def body(ctx):
        k = 0
        consume = lambda t: (t[0], modify(rng, t[1])) if t else None   # noqa: E731
        while k < n:
            assert h.edge < 200
            rt, _ = await h.cycle(ctx, (k % 2, k % 16), None, ready=h.edge >= 12, consume=consume)
            k += rt
        await h.drain(ctx)

    simulate(dut, body)
    assert h.req_edges[:queue] == list(range(queue)) and all(e >= 12 for e in h.req_edges[queue:])
    assert len(h.resp_log) == n
    assert h.resp_log[0][0] == 12
    if queue >= 3:
        tail = [r[0] for r in h.resp_log]
        assert tail == list(range(12, 12 + n)), "not one response per clock after the stall"


# ---------------------------------------------------------------------------------------------
# Forwarding


@pytest.mark.parametrize("wb_fields", [None, CORE_WB], ids=["all", "core"])
@pytest.mark.parametrize("same_qp", [True, False])
@pytest.mark.parametrize("offset", [-2, -1, 0, 1, 2, 3])
def test_forwarding_write_around_read(offset, same_qp, wb_fields):
    """A write-back ``offset`` clocks after the edge at which the memory samples a request's
    address (0: the same edge -- a read-during-write collision the store must not leave to the
    block RAM; 1: while the read is in flight; 2, 3: while the response waits in the queue,
    resp stalled until clock 5): the response carries it exactly when it is to the same QP and
    at an edge before the cycle (checked in every cycle the response is valid)."""
    rng = seeded_rng(f"qpctx-fwd-{offset}-{same_qp}", 11)
    dut = QpContextStore(16, user_width=2, wb_fields=wb_fields)
    h = Harness(dut, rng)
    qp, other = 6, 9
    new = rng.getrandbits(W)

    async def body(ctx):
        await preload(h, ctx)
        old = h.model[qp]
        base = h.edge + 3
        while h.edge < base + 8:
            t = h.edge - base
            req = (qp, 1) if t == 0 else None
            wb_qp = qp if same_qp else other
            consume = (lambda _t, q=wb_qp: (q, new)) if t == offset else None
            await h.cycle(ctx, req, None, ready=t >= 5, consume=consume)
        assert h.req_edges[-1] == base
        (edge, index, user, got), = h.resp_log
        assert (edge, index, user) == (base + 5, qp, 1)
        assert got == (QP_CONTEXT.merge(old, new, h.wb_mask) if same_qp else old)

    simulate(dut, body)


@pytest.mark.parametrize("wb_fields", [None, CORE_WB], ids=["all", "core"])
def test_forwarding_same_edge_every_position(wb_fields):
    """A write to QP q at the same edge as a read of q, on every clock of a run where the
    memory is read back to back (one QP, resp always ready, consumer writes back every packet
    and an extra write-back lands on the QP of the read being issued). Without the registered
    last write the simulator's memory returns the old word and the model check fails."""
    rng = seeded_rng("qpctx-fwd-edge", 5)
    dut = QpContextStore(16, user_width=0, wb_fields=wb_fields)
    h = Harness(dut, rng)

    async def body(ctx):
        await preload(h, ctx)
        # Cycles alternate: a req of QP 2 that is issued while a late write-back to QP 2 (not
        # from a take) lands at the same edge, then a take with its same-cycle write-back.
        for k in range(40):
            req = (2, 0)

            def consume(taken):
                return (2, modify(rng, taken[1])) if taken else (2, rng.getrandbits(W))
            await h.cycle(ctx, req if k % 3 else None, None, ready=True, consume=consume)
        await h.drain(ctx)
        h.check_memory(ctx)

    simulate(dut, body)
    assert len(h.resp_log) > 20


# ---------------------------------------------------------------------------------------------
# Host operations


@pytest.mark.parametrize("wb_fields", [None, CORE_WB], ids=["all", "core"])
def test_host_write_waits_for_writeback(wb_fields):
    """A host WRITE at the head while write-backs arrive every clock: the head holds (one
    memory write per clock), the write completes in the first clock without a write-back and
    merges into the latest written context; the packets queued behind it see the merge."""
    rng = seeded_rng("qpctx-host-hold", 2)
    dut = QpContextStore(16, user_width=3, wb_fields=wb_fields)
    h = Harness(dut, rng)
    qp = 4
    data = rng.getrandbits(W)
    mask = QP_CONTEXT.mask(["state", "pd", "dst_ip", "timeout"])

    async def body(ctx):
        await preload(h, ctx)
        start = h.edge
        host = (QpHostOp.WRITE, qp, data, mask)
        # Late write-backs to the QP for 10 clocks, while the host op and then packets enter.
        for t in range(20):
            late = (qp, rng.getrandbits(W)) if t < 10 else None
            ht = await h.cycle(ctx, (qp, t % 8), host, ready=True,
                               consume=lambda taken, late=late: (
                                   (taken[0], modify(rng, taken[1])) if taken else late))
            if ht[1]:
                host = None
        await h.drain(ctx)
        (issued, done, op, index, got), = h.host_log[dut.depth:]
        # The host op is seen a clock after its valid rises (QpContextStore: host_seen), so it
        # issues at start + 1; with host fields the packet waiting after the preload's last
        # host op goes first, in that same clock's stead, and the host op follows it.
        assert issued == start + 1 and done == start + 10, (issued, done)
        assert QP_CONTEXT.unpack(got)["dst_ip"] == QP_CONTEXT.unpack(data)["dst_ip"]
        h.check_memory(ctx)

    simulate(dut, body)


@pytest.mark.parametrize("wb_fields", [None, CORE_WB], ids=["all", "core"])
def test_host_priority_and_in_order(wb_fields):
    """Host and req both valid: the host token is taken (req.ready low in that clock); one host
    op in flight at a time; a host WRITE issued before packets of its QP is seen by them, and
    a packet issued before a host READ has its write-back in the READ's result. With host
    fields (``wb_fields``), packets wait while a host op is in flight, and one waiting packet
    issues between two host ops."""
    rng = seeded_rng("qpctx-host-prio", 4)
    dut = QpContextStore(16, user_width=3, wb_fields=wb_fields)
    h = Harness(dut, rng)
    ops = random_host_ops(rng, 30, [1, 2])

    async def body(ctx):
        await preload(h, ctx)
        i = 0
        offered_at = None
        for _ in range(400):
            if i >= len(ops):
                break
            if offered_at is None:
                offered_at = h.edge
            rt, ht = await h.cycle(ctx, (rng.choice([1, 2]), 0), ops[i], ready=True,
                                   consume=lambda t: (t[0], modify(rng, t[1])) if t else None)
            if ht:
                # Taken as soon as the previous host op is done (never starved by req).
                prev_done = h.host_log[-1][1]     # (the preload's last op, for the first one)
                # With host fields, a waiting packet issues first after a host op is done. An
                # op is seen a clock after it is offered (QpContextStore: host_seen).
                turn = 0 if wb_fields is None else 1
                assert h.edge - 1 <= max(offered_at + 1, prev_done + 1 + turn), "host op starved"
                i, offered_at = i + 1, None
        await h.drain(ctx)
        h.check_memory(ctx)

    simulate(dut, body)
    assert len(h.host_log) == dut.depth + len(ops)
    # Packets were issued between host ops (the store interleaves them; with host fields,
    # one packet after each host op while host ops keep coming).
    if wb_fields is None:
        assert len(h.resp_log) > len(ops)
    else:
        assert len(h.resp_log) >= len(ops)
