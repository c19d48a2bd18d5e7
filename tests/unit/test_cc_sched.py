"""stellar.hdl.cc.sched: the TX scheduler in the Amaranth simulator, driven like the RC engine.

``Bench`` plays the transport and the wire: it takes ``pop`` when the simulated wire is free
(``wire`` bytes per clock, so the wire is the bottleneck when nothing limits), reports ``sent``
2..4 clocks after the pop and pushes the QP back in that same clock while it has packets left,
and pushes idle QPs that get new work. It checks the scheduler's contract on every clock: a
popped QP was pushed and not yet popped, a QP is never pushed twice, every push is popped once.

The expectations are written from the specification, not from the RTL: a paced QP sends
``rate / (8 * us_cycles)`` bytes per clock, a capped tenant its cap, strict priority gives a
lower class nothing while a higher one is backlogged and eligible, weights give byte ratios,
a guarantee gives at least its share. Rates are measured between the first and the last pop
of a QP after a warm-up (the initially full buckets burst), as bytes per clock.
"""

import math
from collections import deque

import pytest
from amaranth.hdl import Cat
from amaranth.sim import Simulator
from stellar.hdl.cc.sched import TxScheduler
from stellar.hdl.cc.units import RATE_UNLIMITED, SCALE_BITS, pace_scale
from stellar.sim.amaranth_streams import run_seeds, seeded_rng
from stellar.sim.schedmodel import maxmin, per_clock

QPS = 16
TENANTS = 4


class Bench:
    def __init__(self, dut, rng=None, *, us_cycles=8, qp_burst=2048, wire=8, p_ready=1.0):
        self.dut = dut
        self.rng = rng
        self.us_cycles = us_cycles
        self.qp_burst = qp_burst
        self.wire = wire
        self.p_ready = p_ready
        self.work = {}              # QP -> packets left (math.inf: greedy)
        self.size = {}              # QP -> packet bytes
        self.inside = {}            # QP -> clock it was pushed (in the scheduler)
        self.away = set()           # popped, its sent not yet reported
        self.pushq = deque()
        self.events = {}            # clock -> [(qp, bytes)] sent reports due
        self.cfg = {"rate": deque(), "attr": deque(), "tcfg": deque()}
        self.log = []               # (clock, qp, bytes) per pop
        self.pushes = {}
        self.pops = {}
        self.counters = {"stall_pacer": 0, "stall_tenant": 0, "pops": 0}
        self.wire_free = 0
        self.busy = 0               # clocks the wire carried a packet (from busy_from on)
        self.busy_from = 0
        self.clock = 0
        self.on_clock = None        # hook(bench) called before each clock
        self.watch = None           # hook(bench, pop_valid, ready) after each clock
        d = dut
        self.fields = [             # (value name, signal) in the order of the input bus
            ("push_v", d.push.valid), ("push_qp", d.push.p.qp),
            ("sent_v", d.sent.valid), ("sent_qp", d.sent.p.qp), ("sent_bytes", d.sent.p.bytes),
            ("rate_v", d.rate.valid), ("rate_qp", d.rate.p.qp), ("rate", d.rate.p.rate),
            ("attr_v", d.attr.valid), ("attr_qp", d.attr.p.qp), ("tenant", d.attr.p.tenant),
            ("tclass", d.attr.p.tclass), ("weight", d.attr.p.weight),
            ("tcfg_v", d.tenant_cfg.valid), ("t", d.tenant_cfg.p.tenant),
            ("cap_rate", d.tenant_cfg.p.cap_rate), ("cap_burst", d.tenant_cfg.p.cap_burst),
            ("guar_rate", d.tenant_cfg.p.guar_rate), ("guar_burst", d.tenant_cfg.p.guar_burst),
            ("ready", d.pop.ready), ("qp_burst", d.qp_burst), ("us_cycles", d.us_cycles),
        ]
        self.offsets = {}
        pos = 0
        for name, sig in self.fields:
            self.offsets[name] = (pos, len(sig))
            pos += len(sig)
        self.in_bus = Cat(*(sig for _, sig in self.fields))
        self.out_bus = Cat(d.pop.valid, d.pop.p.qp, d.stall_pacer, d.stall_tenant, d.pops)
        self.ib = dut.index_bits
        self._last = None

    # ---------------------------------------------------------------- configuration
    def set_rate(self, qp, rate):
        self.cfg["rate"].append({"rate_qp": qp, "rate": rate})

    def set_attr(self, qp, tenant=0, tclass=0, weight=1):
        self.cfg["attr"].append({"attr_qp": qp, "tenant": tenant, "tclass": tclass,
                                 "weight": weight})

    def set_tenant(self, t, cap_rate=0, cap_burst=4096, guar_rate=0, guar_burst=4096):
        self.cfg["tcfg"].append({"t": t, "cap_rate": cap_rate, "cap_burst": cap_burst,
                                 "guar_rate": guar_rate, "guar_burst": guar_burst})

    def add_work(self, qp, packets, size=None):
        if size is not None:
            self.size[qp] = size
        idle = self.work.get(qp, 0) == 0 and qp not in self.away
        self.work[qp] = self.work.get(qp, 0) + packets
        if idle and qp not in self.inside and qp not in self.pushq:
            self.pushq.append(qp)

    # ---------------------------------------------------------------- one clock
    def _pack(self, vals):
        v = 0
        for name, x in vals.items():
            off, width = self.offsets[name]
            assert 0 <= x < 1 << width, (name, x)
            v |= x << off
        return v

    async def step(self, ctx):
        n = self.clock
        if self.on_clock:
            self.on_clock(self)
        vals = {"qp_burst": self.qp_burst, "us_cycles": self.us_cycles}
        due = self.events.pop(n, [])
        if len(due) > 1:                       # one sent per clock: the rest a clock later
            self.events.setdefault(n + 1, []).extend(due[1:])
        if due:
            qp, nbytes = due[0]
            vals.update(sent_v=1, sent_qp=qp, sent_bytes=nbytes)
            self.away.discard(qp)
            if self.work[qp] > 0:
                self.pushq.appendleft(qp)       # pushed back with its sent
        if self.pushq:
            qp = self.pushq.popleft()
            assert qp not in self.inside, f"clock {n}: QP {qp} pushed twice"
            self.inside[qp] = n
            self.pushes[qp] = self.pushes.get(qp, 0) + 1
            vals.update(push_v=1, push_qp=qp)
        for kind, q in self.cfg.items():
            if q:
                vals.update(q.popleft())
                vals[kind + "_v"] = 1
        ready = n >= self.wire_free and (self.p_ready >= 1 or self.rng.random() < self.p_ready)
        vals["ready"] = int(ready)
        value = self._pack(vals)
        if value != self._last:
            ctx.set(self.in_bus, value)
            self._last = value
        _, _, out = await ctx.tick().sample(self.out_bus)
        pop_v = out & 1
        qp = (out >> 1) & ((1 << self.ib) - 1)
        rest = out >> (1 + self.ib)
        self.counters["stall_pacer"] += rest & 1
        self.counters["stall_tenant"] += rest >> 1 & 1
        self.counters["pops"] += rest >> 2 & 1
        if pop_v and ready:
            assert qp in self.inside, f"clock {n}: QP {qp} popped but not in the scheduler"
            del self.inside[qp]
            self.pops[qp] = self.pops.get(qp, 0) + 1
            nbytes = self.size[qp]
            self.log.append((n, qp, nbytes))
            self.wire_free = n + math.ceil(nbytes / self.wire)
            self.work[qp] -= 1
            self.away.add(qp)
            delay = 2 + (self.rng.randrange(3) if self.rng else n % 3)
            self.events.setdefault(n + delay, []).append((qp, nbytes))
        if n < self.wire_free and n >= self.busy_from:
            self.busy += 1
        if self.watch:
            self.watch(self, pop_v, ready)
        self.clock += 1

    async def run(self, ctx, clocks):
        for _ in range(clocks):
            await self.step(ctx)

    # ---------------------------------------------------------------- measurements
    def rate(self, qps, t0, t1=None):
        """Bytes per clock of the QPs ``qps`` over their pops in [t0, t1): the least-squares
        slope of their cumulative bytes against time. (Deficit buckets send in bursts of up to
        the look-ahead of the scheduler; the slope does not depend on where a window cuts one.)"""
        qps = set(qps)
        pops = [(t, b) for t, q, b in self.log if q in qps and t >= t0 and (t1 is None or t < t1)]
        assert len(pops) >= 10, f"too few pops of {qps} to measure"
        xs, ys, acc = [], [], 0
        for t, b in pops:
            xs.append(t)
            ys.append(acc)
            acc += b
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        return (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
                / sum((x - mx) ** 2 for x in xs))

    def bytes_of(self, qps, t0, t1):
        qps = set(qps)
        return sum(b for t, q, b in self.log if q in qps and t0 <= t < t1)


def simulate(dut, body):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(body)
    sim.run()


# ---------------------------------------------------------------------------------------------

def test_pace_scale_units():
    """The host's pace_scale keeps the rate error within 0.1 % over the whole range."""
    for us in (1, 8, 10, 50, 125, 250, 333, 1000):
        exact = (1 << SCALE_BITS) / (8 * us)
        assert abs(pace_scale(us) - exact) <= 0.5
        assert abs(pace_scale(us) - exact) / exact <= 0.001 or us < 8


def test_pace_scale_gateware():
    """The divider in the gateware computes the same pace_scale as the host, and the rate
    clock follows a change of us_cycles."""
    dut = TxScheduler(4, tenants=2, classes=1)

    async def body(ctx):
        for us in (8, 1000, 250, 13, 65535, 1):
            ctx.set(dut.us_cycles, us)
            await ctx.tick().repeat(30)
            assert ctx.get(dut.pace_scale) == pace_scale(us), us
    simulate(dut, body)


@pytest.mark.parametrize("rates", [[100], [60, 130], [20, 45, 70, 110]])
def test_pacer_accuracy(rates):
    """QPs paced well below the wire (and below their round-robin share) each get their rate;
    two unlimited QPs in the same class share the rest (max-min fair) and the wire stays busy."""
    dut = TxScheduler(QPS, tenants=TENANTS, classes=8)
    us, size = 8, 128                               # wire: 8 B/clock = 512 Mb/s
    b = Bench(dut, us_cycles=us, qp_burst=1024)
    b.busy_from = 2000
    paced = list(range(len(rates)))
    free = [8, 9]
    clocks, warm = 10000, 2000

    async def body(ctx):
        for q, r in zip(paced, rates, strict=True):
            b.set_rate(q, r)
        for q in paced + free:
            b.set_attr(q, tenant=0, tclass=2, weight=1)
        await b.run(ctx, 40)                        # configuration and the divider
        for q in paced + free:
            b.add_work(q, math.inf, size)
        await b.run(ctx, clocks)
    simulate(dut, body)

    for q, r in zip(paced, rates, strict=True):
        got = b.rate([q], warm)
        want = per_clock(r, us)
        err = got / want - 1
        print(f"QP {q}: {r} Mb/s, {got:.5f} B/clk, expected {want:.5f}: error {err:+.3%}")
        assert abs(err) < 0.01
    fair = maxmin(b.wire, [per_clock(r, us) for r in rates] + [None] * len(free))
    assert fair[:len(rates)] == [per_clock(r, us) for r in rates]   # the rates are reachable
    for q, want in zip(free, fair[len(rates):], strict=True):
        share = b.bytes_of([q], warm, b.clock) / (b.clock - warm)
        print(f"unlimited QP {q}: {share:.3f} B/clk, max-min share {want:.3f}")
        assert abs(share / want - 1) < 0.03
    assert b.busy / (b.clock - b.busy_from) > 0.98
    assert b.counters["stall_pacer"] > 0
    assert b.counters["pops"] == len(b.log)


def test_tenant_cap():
    """Tenant A (3 unpaced QPs) capped at 30 % of the wire gets its cap; tenant B the rest."""
    dut = TxScheduler(QPS, tenants=TENANTS, classes=8)
    us, size = 8, 128
    b = Bench(dut, us_cycles=us)
    cap = 154                                       # Mb/s: 30.1 % of 512
    a_qps, b_qps = [1, 2, 3], [4, 5]
    clocks, warm = 10000, 2000

    async def body(ctx):
        b.set_tenant(1, cap_rate=cap, cap_burst=2048)
        b.set_tenant(2)
        for q in a_qps:
            b.set_attr(q, tenant=1, tclass=4, weight=1)
        for q in b_qps:
            b.set_attr(q, tenant=2, tclass=4, weight=1)
        await b.run(ctx, 40)
        for q in a_qps + b_qps:
            b.add_work(q, math.inf, size)
        await b.run(ctx, clocks)
    simulate(dut, body)

    got = b.rate(a_qps, warm)
    err = got / per_clock(cap, us) - 1
    print(f"tenant A: {got:.4f} B/clk, cap {per_clock(cap, us):.4f}: error {err:+.3%}")
    assert abs(err) < 0.01
    b_share = b.bytes_of(b_qps, warm, b.clock) / (b.clock - warm)
    print(f"tenant B: {b_share:.3f} B/clk")
    assert b_share > (b.wire - per_clock(cap, us)) * 0.98
    assert b.counters["stall_tenant"] > 0


@pytest.mark.parametrize("guarantee", [True, False])
def test_guarantee(guarantee):
    """Tenant B (1 QP) with a 40 % guarantee gets at least 40 % against tenant A's 4 greedy
    QPs; without the guarantee round robin gives it 20 %."""
    dut = TxScheduler(QPS, tenants=TENANTS, classes=8)
    us, size = 8, 128
    b = Bench(dut, us_cycles=us)
    a_qps, b_qp = [1, 2, 3, 4], 7
    clocks, warm = 9000, 1500

    async def body(ctx):
        b.set_tenant(1)
        b.set_tenant(2, guar_rate=205 if guarantee else 0, guar_burst=2048)    # 40 % of 512
        for q in a_qps:
            b.set_attr(q, tenant=1, tclass=5, weight=1)
        b.set_attr(b_qp, tenant=2, tclass=5, weight=1)
        await b.run(ctx, 40)
        for q in a_qps + [b_qp]:
            b.add_work(q, math.inf, size)
        await b.run(ctx, clocks)
    simulate(dut, body)

    share = b.rate([b_qp], warm) / b.wire
    print(f"guarantee {guarantee}: tenant B share {share:.3%} of the wire")
    assert abs(b.rate(a_qps + [b_qp], warm) / b.wire - 1) < 0.005
    if guarantee:
        assert share >= 0.40 - 0.01
    else:
        assert abs(share - 0.20) < 0.01


def _strict_priority(setup7, qps, c7_rate, clocks):
    """Class 7 limited to ``c7_rate`` Mb/s by ``setup7(b, q7)``, class 3 greedy for 110
    packets, class 0 greedy: class 0 gets nothing until class 3 drains, class 7 gets its rate
    meanwhile, and classes 3 then 0 get everything class 7 leaves."""
    dut = TxScheduler(QPS, tenants=TENANTS, classes=8)
    us, size = 8, 256
    b = Bench(dut, us_cycles=us)
    q7, q3, q0 = qps

    async def body(ctx):
        setup7(b, q7)
        b.set_attr(q3, tclass=3)
        b.set_attr(q0, tclass=0)
        await b.run(ctx, 40)
        b.add_work(q7, math.inf, size)
        b.add_work(q3, 110, size)
        b.add_work(q0, math.inf, size)
        await b.run(ctx, clocks)
    simulate(dut, body)

    last3 = max(t for t, q, _ in b.log if q == q3)
    early0 = [t for t, q, _ in b.log if q == q0 and t <= last3]
    print(f"class 3 drained at {last3}, class 0 pops before that: {early0}")
    assert not early0
    got = b.rate([q7], 2000, last3)
    err = got / per_clock(c7_rate, us) - 1
    print(f"class 7: error {err:+.3%} of its rate while class 3 is backlogged")
    assert abs(err) < 0.01
    c3 = b.bytes_of([q3], 2000, last3) / (last3 - 2000)
    assert c3 > (b.wire - per_clock(c7_rate, us)) * 0.97
    c0 = b.bytes_of([q0], last3 + 500, b.clock) / (b.clock - last3 - 500)
    assert c0 > (b.wire - per_clock(c7_rate, us)) * 0.97


def test_strict_priority():
    """Class 7 paced at 50 % of the wire gets it; class 3 (greedy while it has work, ~7000
    clocks at the half wire it gets) gets the rest; class 0 gets nothing until class 3
    drains, then everything class 7 leaves."""
    def pace7(b, q7):
        b.set_rate(q7, 256)
        b.set_attr(q7, tclass=7)
    _strict_priority(pace7, (5, 6, 7), 256, 10000)


def test_strict_priority_capped():
    """The NIC's strict-priority case: class 7 capped through its tenant (40 % of the wire),
    class 3 greedy while it has work (~5900 clocks at the 60 % it gets), class 0 greedy.
    (Class 7's QP is rotated whenever its tenant is over the cap: a class-3 probe rolled back
    ahead of it must still go before class 0.)"""
    cap = 205                            # Mb/s: 40 % of 512

    def cap7(b, q7):
        b.set_tenant(1, cap_rate=cap, cap_burst=4096)
        b.set_attr(q7, tenant=1, tclass=7)
    _strict_priority(cap7, (1, 2, 3), cap, 9000)


def test_wrr():
    """Weights 1 and 3 in one class: bytes in ratio 1:3."""
    dut = TxScheduler(QPS, tenants=TENANTS, classes=8)
    b = Bench(dut, us_cycles=8)
    qa, qb = 3, 11

    async def body(ctx):
        b.set_attr(qa, tclass=1, weight=1)
        b.set_attr(qb, tclass=1, weight=3)
        await b.run(ctx, 40)
        b.add_work(qa, math.inf, 192)
        b.add_work(qb, math.inf, 192)
        await b.run(ctx, 6000)
    simulate(dut, body)
    ratio = b.bytes_of([qb], 0, b.clock) / b.bytes_of([qa], 0, b.clock)
    print(f"WRR 1:3 -> 1:{ratio:.4f}")
    assert abs(ratio / 3 - 1) < 0.02


@pytest.mark.parametrize("seed", run_seeds([1, 2]))
def test_random(seed):
    """Random work, rates, attributes, tenant caps and guarantees, a random wire: every push is
    popped exactly once, nothing is lost, and an eligible QP (unpaced, tenant uncapped) never
    waits for an idle wire longer than the documented bound."""
    rng = seeded_rng("cc-sched-random", seed)
    dut = TxScheduler(QPS, tenants=TENANTS, classes=8)
    b = Bench(dut, rng, us_cycles=rng.choice([8, 20, 50]), p_ready=0.7, qp_burst=512)
    free_tenants = {0, 1}                       # never capped
    limited = set(rng.sample(range(QPS), 6))    # may get pacer rates
    bound = (QPS + 1) * (dut.rings + 1) + dut.LATENCY + dut.HOLD + 8
    wait = {"n": 0, "max": 0}
    clocks = 5000

    def tenant_of(q):
        return rng.choice(sorted(free_tenants)) if q not in limited else rng.randrange(TENANTS)

    def on_clock(b):
        if b.clock >= clocks:
            return
        r = rng.random()
        if r < 0.008:                           # about the wire on average
            q = rng.randrange(QPS)
            b.add_work(q, rng.randint(1, 6), rng.choice([64, 128, 256, 512]))
        elif r < 0.015:
            q = rng.choice(sorted(limited))
            b.set_rate(q, rng.choice([RATE_UNLIMITED, 20, 100, 300]))
        elif r < 0.025:
            q = rng.randrange(QPS)
            b.set_attr(q, tenant_of(q), rng.randrange(8), rng.randrange(5))
        elif r < 0.03:
            t = rng.randrange(TENANTS)
            b.set_tenant(t, cap_rate=0 if t in free_tenants else rng.choice([0, 50, 200]),
                         cap_burst=rng.choice([300, 3000]), guar_rate=rng.choice([0, 0, 100]),
                         guar_burst=1000)

    def watch(b, pop_v, ready):
        # An eligible QP has been in the scheduler for a while and the wire is idle.
        eligible = [q for q, t in b.inside.items() if q not in limited and b.clock - t > 12]
        if eligible and ready and not pop_v:
            wait["n"] += 1
            wait["max"] = max(wait["max"], wait["n"])
            assert wait["n"] < bound, f"clock {b.clock}: eligible {eligible} waited {wait['n']}"
        elif pop_v or not eligible:
            wait["n"] = 0

    async def body(ctx):
        for q in range(QPS):
            b.set_attr(q, tenant_of(q), rng.randrange(8), rng.randrange(5))
        for t in range(TENANTS):
            b.set_tenant(t)
        b.on_clock, b.watch = on_clock, watch
        await b.run(ctx, clocks)
        for q in limited:                      # let every QP drain
            b.set_rate(q, RATE_UNLIMITED)
        for t in range(TENANTS):
            b.set_tenant(t)
        for _ in range(4000):
            await b.step(ctx)
            if not b.inside and not b.pushq and not b.events and not b.away:
                break
    simulate(dut, body)

    print(f"pushes {sum(b.pushes.values())}, pops {len(b.log)}, longest wait {wait['max']} "
          f"(bound {bound}), stalls {b.counters}")
    assert not b.inside, f"QPs left in the scheduler: {b.inside}"
    assert b.pushes == b.pops
    assert all(w == 0 for w in b.work.values())
    assert b.counters["pops"] == len(b.log)
