"""stellar.hdl.cc.rp: the reaction point (DCQCN, FlowMatrix) in the Amaranth simulator, against
the reference model ``stellar.sim.ccmodel`` (written from the specification, not the RTL).

How the comparison works: every clock the bench drives the three input streams and ``now_us`` and
samples ``trace`` and ``rate``. Each traced event is replayed into the model at once; the model's
answer (a rate, or none) must be on ``rate`` in the same clock, for the same QP. The trace itself
is checked against what was driven: INIT, CNP and SENT entries come in the order their stream
delivered them with the same fields, TIMER entries only name QPs, every entry carries the
``now_us`` of its issue clock (5 clocks before it, 7 for a CNP of a DCQCN QP, 14 for a FlowMatrix
update: the documented latency), and nothing is lost. At the end ``now_us`` stands still while the
scanner fires every due timer: no QP may be left with a due timer (scanner liveness), and every
QP's state read through the ``dbg`` port must equal the model's.

Random runs print their seeds (``STELLAR_SEED=<n>`` replays one). Directed tests check the
DCQCN arithmetic a second time with numbers worked out by hand from the formulas.
"""

import random
from collections import Counter, deque
from itertools import pairwise

import pytest
from amaranth.hdl import Cat
from amaranth.sim import Simulator
from stellar.hdl.cc import params as P
from stellar.hdl.cc.rp import ReactionPoint, rp_params_layout, rp_state_layout, rp_trace_layout
from stellar.hdl.cc.sigmoid import fm_norm, sigma0, sigmoid_index, sigmoid_table
from stellar.sim.amaranth_streams import run_seeds, seeded_rng
from stellar.sim.ccmodel import RpModel, elapsed_due, model_sigmoid_table

DEFAULTS = dict(P.RP_DEFAULTS)
NONE, DCQCN, FM = P.MODE_NONE, P.MODE_DCQCN, P.MODE_FLOWMATRIX


def _fields(layout):
    return [(name, f.offset, f.width) for name, f in layout]


def _unpack(fields, v):
    return {name: (v >> off) & ((1 << w) - 1) for name, off, w in fields}


# ---------------------------------------------------------------------------- bench

class Bench:
    """Drives one ReactionPoint with a per-clock stimulus and checks it against RpModel.

    ``cycles``: a list, one entry per clock, of ``(now, init, cnp, sent)`` where ``init`` is
    ``(qp, mode)``, ``cnp`` is ``qp``, ``sent`` is ``(qp, bytes, inflight)`` or None."""

    def __init__(self, qps, params):
        self.qps = qps
        self.params = dict(params)
        self.dut = ReactionPoint(qps)
        self.model = RpModel(qps, params)
        self.trace_fields = _fields(rp_trace_layout(self.dut.index_bits))
        self.state_fields = _fields(rp_state_layout())
        self.traces = []            # (edge, kind, qp, mode, now, rate or None)
        self.rates = []
        self.lost = 0
        self.stats = Counter()
        self.final_state = None

    def _bus(self):
        d = self.dut
        parts = [d.init.valid, d.init.payload.as_value(), d.cnp.valid, d.cnp.payload.as_value(),
                 d.sent.valid, d.sent.payload.as_value(), d.now_us]
        return parts

    def run(self, cycles, *, settle=400, expect_lost=False):
        d = self.dut
        ib = d.index_bits
        bus = Cat(*self._bus())
        pending = {0: deque(), 1: deque(), 2: deque()}
        nows = []
        sim = Simulator(d)
        sim.add_clock(1e-8)

        def encode(now, init, cnp, sent):
            v, sh = 0, 0
            if init is not None:
                v |= 1 | (init[0] << 1) | (init[1] << (1 + ib))
            sh = 1 + ib + 2
            if cnp is not None:
                v |= (1 | (cnp << 1)) << sh
            sh += 1 + ib
            if sent is not None:
                v |= (1 | (sent[0] << 1) | (sent[1] << (1 + ib)) | (sent[2] << (17 + ib))) << sh
            sh += 1 + ib + 32
            return v | (now << sh)

        async def tb(ctx):
            ctx.set(d.params, rp_params_layout().const(self.params))
            ctx.set(bus, encode(cycles[0][0] if cycles else 0, None, None, None))
            await ctx.tick().repeat(4)          # parameters through their register stages
            last_now = cycles[-1][0] if cycles else 0
            total = len(cycles) + settle
            driven = None
            for edge in range(total):
                if edge < len(cycles):
                    now, init, cnp, sent = cycles[edge]
                else:
                    now, init, cnp, sent = last_now, None, None, None
                nows.append(now)
                v = encode(now, init, cnp, sent)
                if v != driven:
                    ctx.set(bus, v)
                    driven = v
                if init is not None:
                    pending[0].append(init)
                if cnp is not None:
                    pending[1].append(cnp)
                if sent is not None:
                    pending[2].append(sent)
                _, _, tv, tp, rv, rp, lost = await ctx.tick().sample(
                    d.trace.valid, d.trace.payload.as_value(), d.rate.valid,
                    d.rate.payload.as_value(), d.lost)
                if lost:
                    self.lost += 1
                    assert expect_lost, f"edge {edge}: an event was lost (FIFO full)"
                if rv:
                    self.rates.append((edge, rp & ((1 << ib) - 1), rp >> ib))
                if tv:
                    self._check_event(edge, _unpack(self.trace_fields, tp), rv, rp, nows, pending,
                                      expect_lost)
                elif rv:
                    raise AssertionError(f"edge {edge}: rate without an event")
            if not expect_lost:
                for k, q in pending.items():
                    assert not q, f"{len(q)} events of kind {k} never processed: {list(q)[:5]}"
            # Scanner liveness: with now_us frozen for `settle` clocks every due timer fired.
            for qp in range(self.qps):
                assert not self.model.timer_due(qp, last_now), \
                    f"QP {qp}: timer due at the end and never fired: {self.model.state[qp]}"
            # Final state through the dbg port (data one clock after the address).
            got = []
            ctx.set(d.dbg_addr, 0)
            for qp in range(self.qps + 1):
                if qp < self.qps:
                    ctx.set(d.dbg_addr, qp)
                _, _, dv = await ctx.tick().sample(d.dbg_data.as_value())
                if qp:
                    got.append(_unpack(self.state_fields, dv))
            self.final_state = got

        sim.add_testbench(tb)
        sim.run()
        # the sampled dbg value at edge qp is the word of qp - 1 (set one clock before)
        for qp in range(self.qps):
            assert self.final_state[qp] == self.model.state[qp], \
                f"QP {qp}: state {self.final_state[qp]} != model {self.model.state[qp]}"
        return self

    def _check_event(self, edge, t, rv, rp, nows, pending, expect_lost):
        m = self.model
        ib = self.dut.index_bits
        kind, qp = t["kind"], t["qp"]
        s = m.state[qp]
        mode_before = s["mode"]
        if kind == P.EV_INIT:
            exp_in = pending[0].popleft()
            assert (qp, t["mode"]) == exp_in, f"edge {edge}: INIT {qp, t['mode']} != driven {exp_in}"
        else:
            assert t["mode"] == mode_before, f"edge {edge}: traced mode {t['mode']} != {mode_before}"
        if kind == P.EV_CNP:
            exp_in = pending[1].popleft()
            assert qp == exp_in, f"edge {edge}: CNP qp {qp} != driven {exp_in}"
        if kind == P.EV_SENT:
            exp_in = pending[2].popleft()
            assert (qp, t["bytes"], t["inflight"]) == exp_in, f"edge {edge}: SENT {t} != {exp_in}"
        fm_update = mode_before == FM and (
            kind == P.EV_CNP or (kind == P.EV_TIMER and elapsed_due(t["now"], s["t_fm"],
                                                                    self.params["fm_period"])))
        lat = 14 if fm_update else 7 if kind == P.EV_CNP and mode_before == DCQCN else 5
        assert t["now"] == nows[edge - lat], \
            f"edge {edge}: event used now {t['now']}, issue clock {edge - lat} had {nows[edge - lat]}"
        self._classify(kind, qp, t)
        exp = m.event(kind, qp, t["now"], mode=t["mode"], nbytes=t["bytes"], inflight=t["inflight"])
        self.traces.append((edge, kind, qp, t["mode"], t["now"], exp))
        if exp is None:
            assert not rv, f"edge {edge}: rate {rp >> ib} for {t}, model emits nothing"
        else:
            assert rv, f"edge {edge}: no rate for {t}, model emits {exp}"
            assert (rp & ((1 << ib) - 1), rp >> ib) == (qp, exp), \
                f"edge {edge}: rate (qp, rate) {(rp & ((1 << ib) - 1), rp >> ib)} != {(qp, exp)} for {t}"

    def _classify(self, kind, qp, t):
        """Coverage: which rules the event exercises (from the model's state before it)."""
        s, p = self.model.state[qp], self.params
        self.stats[("kind", kind)] += 1
        if s["mode"] == DCQCN and kind in (P.EV_SENT, P.EV_TIMER) and s["active"]:
            fires = (kind == P.EV_SENT and s["byte_cnt"] + t["bytes"] >= p["byte_reset"]) or \
                    (kind == P.EV_TIMER and elapsed_due(t["now"], s["t_rate"], p["time_reset"]))
            if fires:
                it = min(s["it"] + (kind == P.EV_TIMER), 255)
                ib = min(s["ib"] + (kind == P.EV_SENT), 255)
                F = p["threshold"]
                self.stats["fast" if max(it, ib) < F else "hyper" if min(it, ib) >= F
                           else "additive"] += 1
                if (min(p["max_rate"], s["rt"]) + s["rc"] + 1) // 2 >= p["max_rate"]:
                    self.stats["recovered"] += 1
        if s["mode"] == DCQCN and kind == P.EV_CNP:
            self.stats["dcqcn_cnp"] += 1
        if s["mode"] == FM and kind in (P.EV_CNP, P.EV_TIMER):
            d = (s["infl_last"] - s["infl_prev"]) % 65536
            if 0 < d < 32768:
                self.stats["fm_trend"] += 1
            self.stats["fm_event"] += 1


# ---------------------------------------------------------------------------- stimulus

def random_params(rng, flavour):
    p = dict(DEFAULTS)
    if flavour == "defaults":
        return p
    if flavour == "small":          # short timers and byte counter: every rule fires often
        p.update(
            max_rate=rng.choice([16000, rng.randint(200, 100000)]),
            min_rate=rng.randint(0, 50),
            ai_rate=rng.randint(0, 400), hai_rate=rng.randint(0, 3000),
            gd=rng.choice([11, rng.randint(0, 15)]), min_dec_fac=rng.choice([50, rng.randint(0, 127)]),
            threshold=rng.randint(2, 6), g_shift=rng.randint(0, 12),
            initial_alpha=rng.randint(0, 1023), time_reset=rng.randint(1, 40),
            byte_reset=rng.randint(0, 6000), alpha_period=rng.randint(1, 30),
            fm_a=rng.randint(0, 65535), fm_b=rng.randint(0, 2000),
            fm_c=rng.randint(-1500, 1500), fm_period=rng.randint(1, 30),
            fm_cnp_gain=rng.randint(0, 2000), fm_trend_gain=rng.randint(0, 400),
        )
        p["fm_norm"] = fm_norm(p["fm_c"])
        return p
    # "wild": every field random over its whole width (overflow and saturation corners)
    for name, w, signed in P.RP_PARAM_FIELDS:
        v = rng.getrandbits(w)
        p[name] = v - (1 << w) if signed and v >> (w - 1) else v
    p["time_reset"] = rng.randint(0, 60)
    p["alpha_period"] = rng.randint(0, 60)
    p["fm_period"] = rng.randint(0, 60)
    p["max_rate"] = rng.choice([p["max_rate"], (1 << 20) - 1])
    if rng.random() < 0.5:
        p["fm_norm"] = fm_norm(p["fm_c"])
    return p


def random_cycles(rng, qps, n_events, *, big_jump):
    """Random clocks: INIT/CNP/SENT within the documented spacing, now_us in random steps from
    just below the 2**32 wrap, idle gaps, rare large jumps (one of 2**31 or more if big_jump).

    Spacing (ReactionPoint's docstring): SENT at most one per 4 clocks; INIT and CNP events
    drawn from a budget of machine time that grows by 1/4 clock per clock up to 11, an INIT
    costing 3 and a CNP 11 (as if every CNP hit a FlowMatrix QP)."""
    cycles = []
    now = (1 << 32) - rng.randint(200, 3000)
    modes = [NONE] * qps
    infl = [0] * qps
    last = {"init": -100, "cnp": -100, "sent": -100}
    budget = 11.0
    events = 0
    c = 0

    def pick_mode():
        return rng.choices([DCQCN, FM, NONE, 3], [45, 35, 15, 5])[0]

    # set most QPs up first (some stay as reset: mode NONE, never initialised)
    setup = [qp for qp in range(qps) if rng.random() < 0.9]
    jump_at = rng.randint(n_events // 3, 2 * n_events // 3) if big_jump else -1
    busy_until = 0
    idle_until = 0
    while events < n_events or setup:
        init = cnp = sent = None
        if c >= busy_until and c >= idle_until:
            if rng.random() < 0.3:
                idle_until = c + rng.randint(5, 250)
            else:
                busy_until = c + rng.randint(20, 500)
        busy = c < busy_until
        budget = min(11.0, budget + 0.25)
        if setup and c - last["init"] >= 6:
            qp = setup.pop()
            modes[qp] = pick_mode()
            init = (qp, modes[qp])
        elif busy and events < n_events:
            if budget >= 3 and rng.random() < 0.004:
                qp = rng.randrange(qps)
                modes[qp] = pick_mode()
                init = (qp, modes[qp])
                budget -= 3
            if budget >= 11 and rng.random() < 0.06:
                cnp = rng.choice([q for q in range(qps) if modes[q] != NONE] or [0])
                budget -= 11
            if c - last["sent"] >= 4 and rng.random() < 0.6:
                qp = rng.randrange(qps)
                r = rng.random()
                infl[qp] = (infl[qp] + (rng.randint(0, 6) if r < 0.6 else -rng.randint(0, 8)
                                        if r < 0.95 else rng.getrandbits(16))) % 65536
                nbytes = rng.choice([64, 1100, 4178, rng.randint(0, 65535), rng.randint(0, 9000)])
                sent = (qp, nbytes, infl[qp])
        for k, v in (("init", init), ("cnp", cnp), ("sent", sent)):
            if v is not None:
                last[k] = c
                events += 1
        r = rng.random()
        if events >= jump_at >= 0:
            now += (1 << 31) + rng.randint(0, 1 << 30)
            jump_at = -1
        elif r < 0.5:
            pass
        elif r < 0.8:
            now += 1
        elif r < 0.995:
            now += rng.randint(2, 6)
        else:
            now += rng.randint(50, 20000)
        now %= 1 << 32
        cycles.append((now, init, cnp, sent))
        c += 1
    return cycles


# ---------------------------------------------------------------------------- tests

def test_sigmoid_table():
    """The shared table equals the model's own, is monotone, and fm_norm brings the
    uncongested rate exactly to max_rate (and nothing lighter than one step above sigma0)."""
    t = sigmoid_table()
    assert t == model_sigmoid_table()
    assert len(t) == 256 and all(a <= b for a, b in pairwise(t))
    assert t[128] == 32768 and t[0] == 22 and t[255] == 65512
    for c in range(-2100, 2100, 7):
        s0 = t[sigmoid_index(c)]
        assert s0 == sigma0(c) == sigma0(c & 0xFFFF)
        n = fm_norm(c)
        assert n < 1 << 32
        assert (65536 - s0) * n >= 1 << 32 > (65536 - s0 - 1) * n
    assert sigmoid_index(-100000) == 0 and sigmoid_index(100000) == 255
    assert P.RP_DEFAULTS["fm_norm"] == fm_norm(128)


@pytest.mark.parametrize("flavour,n_events,big_jump,seed", [
    ("small", 4500, False, 1),
    ("defaults", 1200, False, 2),
    ("wild", 1200, True, 3),
])
def test_random_vs_model(flavour, n_events, big_jump, seed):
    for s in run_seeds([seed]):
        rng = seeded_rng(f"cc-rp-{flavour}", s)
        params = random_params(rng, flavour)
        print("params:", params)
        cycles = random_cycles(rng, 16, n_events, big_jump=big_jump)
        b = Bench(16, params).run(cycles)
        print(f"{len(cycles)} clocks, {len(b.traces)} events, {len(b.rates)} rates, {dict(b.stats)}")
        assert len(b.traces) >= n_events
        if flavour == "small":
            for what in ("fast", "additive", "hyper", "recovered", "dcqcn_cnp", "fm_trend",
                         ("kind", P.EV_TIMER)):
                assert b.stats[what] > 0, f"the run never exercised {what}"


def _direct(params, script, qps=4, settle=100):
    """Run a script of ``(clocks to wait, now, event)`` (see ``_expand``)."""
    return Bench(qps, params).run(_expand(script), settle=settle)


def _rates(b, qp):
    return [r for _e, q, r in b.rates if q == qp]


def test_dcqcn_trajectory_defaults():
    """Default parameters, two CNPs, then the timer alone: fast recovery for F = 5 stages, then
    additive increase; then byte-counter expiries push the byte stage to F too: hyper
    increase. Every number below is worked out by hand from the DCQCN formulas."""
    p = dict(DEFAULTS)
    script = [(0, 1000, ("init", 1, DCQCN)), (5, 1000, ("cnp", 1)), (5, 1000, ("cnp", 1)),
              (10, 1000, None)]
    # timer only: 300 us per stage; keep clear of the byte counter. 7 stages.
    now = 1000
    for _ in range(7):
        now += 300
        script.append((40, now, None))
    # six packets of byte_reset bytes (32767): ib 1..6, each an increase
    for _ in range(6):
        script.append((8, now, ("sent", 1, 32767, 0)))
    b = _direct(p, script)
    # INIT: 16000. CNP 1 (alpha = 1023 << 10 = 1047552, a10 = 1023):
    #   dec = 16000 * 1023 >> 11 = 7992, floor = 16000 * 50 * 1311 >> 17 = 8001 -> rc 8008, rt 16000
    #   alpha = 1047552 + (1024 >> 8) = 1047556
    # CNP 2 (a10 = 1047556 >> 10 = 1023): dec = 8008 * 1023 >> 11 = 4000,
    #   floor = 8008 * 50 * 1311 >> 17 = 4004 -> rc 4008, rt 8008; alpha = 1047556 + (1020 >> 8)
    # timer stages it = 1..4 (fast recovery, rt 8008): rc = ceil((8008 + rc) / 2)
    #   6008, 7008, 7508, 7758
    # it = 5, 6, 7 (additive, ib = 0 < F): rt 8013 -> rc ceil(15771/2) = 7886;
    #   rt 8018 -> ceil(15904/2) = 7952; rt 8023 -> ceil(15975/2) = 7988
    # bytes: ib = 1..4: additive (it = 7 >= F, ib < F): rt 8028 -> 8008; 8033 -> 8021;
    #   8038 -> 8030; 8043 -> 8037
    # ib = 5: hyper, min(7, 5) - 5 + 1 = 1: rt 8093 -> ceil(16130/2) = 8065
    # ib = 6: hyper x2: rt 8193 -> ceil(16258/2) = 8129
    expect = [16000, 8008, 4008, 6008, 7008, 7508, 7758, 7886, 7952, 7988,
              8008, 8021, 8030, 8037, 8065, 8129]
    assert _rates(b, 1) == expect
    st = b.final_state[1]
    assert (st["rt"], st["rc"], st["it"], st["ib"], st["active"]) == (8193, 8129, 7, 6, 1)
    alpha = 1047556 + ((1 << 20) - 1047556 >> 8)
    # alpha decays by alpha >> 8 every 55 us after the last CNP: 2100 us -> 38 periods (the
    # timer visits at the scan's now steps, each step 300 us here: 7 visits, 7 decays)
    for _ in range(7):
        alpha -= alpha >> 8
    assert st["alpha"] == alpha


def test_dcqcn_floors():
    """min_dec_fac floor (90 %) and min_rate floor on a CNP, worked out by hand."""
    p = dict(DEFAULTS, min_dec_fac=90)
    b = _direct(p, [(0, 50, ("init", 0, DCQCN)), (5, 50, ("cnp", 0))])
    # dec leaves 8008; floor = 16000 * 90 * 1311 >> 17 = 14403
    assert _rates(b, 0) == [16000, 14403]
    p = dict(DEFAULTS, min_rate=9000)
    b = _direct(p, [(0, 50, ("init", 0, DCQCN)), (5, 50, ("cnp", 0))])
    assert _rates(b, 0) == [16000, 9000]
    # a tiny line rate: 3 * 1023 >> 11 = 1, floor 3 * 50 * 1311 >> 17 = 1 -> 2; again: the
    # decrease 2 * 1023 >> 11 rounds to 0 -> 2
    p = dict(DEFAULTS, max_rate=3, min_rate=1)
    b = _direct(p, [(0, 50, ("init", 0, DCQCN)), (5, 50, ("cnp", 0)), (5, 50, ("cnp", 0))])
    assert _rates(b, 0) == [3, 2, 2]
    # min_dec_fac 127 % at the largest rate: floor = 1048575 * 127 * 1311 >> 17 = 1331924 does
    # not fit 20 bits: the rate saturates at 2**20 - 1
    p = dict(DEFAULTS, max_rate=(1 << 20) - 1, min_dec_fac=127)
    b = _direct(p, [(0, 50, ("init", 0, DCQCN)), (5, 50, ("cnp", 0))])
    assert _rates(b, 0) == [(1 << 20) - 1] * 2
    # gd = 9: the decrease 3 * 1023 >> 9 = 5 exceeds the rate; no floor: min_rate (1, then 0)
    for lo in (1, 0):
        p = dict(DEFAULTS, max_rate=3, min_rate=lo, gd=9, min_dec_fac=0)
        b = _direct(p, [(0, 50, ("init", 0, DCQCN)), (5, 50, ("cnp", 0))])
        assert _rates(b, 0) == [3, lo]


def test_dcqcn_large_steps():
    """Rate steps wider than 18 bits (ai_rate, hai_rate * factor >= 2**18 Mb/s) below a
    max_rate that does not cap them: the bench checks every rate against the model, the first
    ones are also worked out by hand."""
    M = (1 << 20) - 1
    p = dict(DEFAULTS, max_rate=M, min_rate=1000, ai_rate=300000, hai_rate=270000, gd=1,
             min_dec_fac=0, threshold=2, time_reset=10, alpha_period=1000, byte_reset=100)
    script = [(0, 0, ("init", 1, DCQCN)), (5, 0, ("cnp", 1)), (5, 0, ("cnp", 1))]
    now = 0
    # (the second CNP waits for the machine into now = 10: t_rate = 10)
    for _ in range(4):                  # timer from now = 20: fast (it = 1), additive (it = 2, 3)
        now += 10
        script.append((40, now, None))
    script.append((0, now, ("cnp", 1)))
    for _ in range(4):                  # bytes: ib = 1..4 (it = 0): fast, then additive
        script.append((6, now, ("sent", 1, 150, 0)))
    for _ in range(3):                  # timer: it = 1 (additive), 2 and 3 (hyper, ib = 4)
        now += 10
        script.append((40, now, None))
    b = _direct(p, script)
    r = _rates(b, 1)
    # CNPs: dec = (rc * 1023) >> 1 > rc, so rc = min_rate (rt = M, then 1000); increases:
    # (1000 + 300000 + 1000 + 1) >> 1, (601000 + 151000 + 1) >> 1
    assert r[:6] == [M, 1000, 1000, 1000, 151000, 376000]
    assert max(r[7:]) < M
    assert sum(1 for r1, r2 in pairwise(r[6:]) if r2 - r1 >= 1 << 17) >= 3, r


def test_dcqcn_increase_at_the_cap():
    """Additive increases that take rt to max_rate - 1, max_rate, max_rate + 1 and + 2: the cap
    min(rt + inc, max_rate) at its edge (rates and the final state checked against the model)."""
    for off in (-1, 0, 1, 2):
        # two CNPs: rt = the rate after the first, 8008 with the defaults; F = 1: the first
        # timer's increase is additive
        p = dict(DEFAULTS, threshold=1, time_reset=10, alpha_period=1000, ai_rate=16000 - 8008 + off)
        b = _direct(p, [(0, 0, ("init", 0, DCQCN)), (5, 0, ("cnp", 0)), (10, 0, ("cnp", 0)),
                        (5, 0, None), (40, 10, None)])
        assert _rates(b, 0)[1] == 8008 and len(_rates(b, 0)) == 4
        assert b.final_state[0]["rt"] == min(16000, 8008 + p["ai_rate"])


def test_dcqcn_stages_saturate():
    """ib and it run to 255 and stay there while the QP keeps increasing (hyper, factor up to
    256 - F): every rate and the final state are checked against the model."""
    p = dict(DEFAULTS, max_rate=(1 << 20) - 1, min_rate=1000, ai_rate=1, hai_rate=1, gd=1,
             min_dec_fac=0, threshold=1, time_reset=1, alpha_period=60000, byte_reset=10)
    script = [(0, 0, ("init", 0, DCQCN)), (5, 0, ("cnp", 0)), (10, 0, ("cnp", 0)), (5, 0, None)]
    script += [(5, 0, ("sent", 0, 20, 0))] * 260        # ib: 1 .. 255, then 255
    script += [(12, now, None) for now in range(1, 261)]   # it: 1 .. 255, then 255
    b = _direct(p, script)
    st = b.final_state[0]
    assert (st["it"], st["ib"], st["active"]) == (255, 255, 1)
    assert len(_rates(b, 0)) == 3 + 260 + 260


def test_dcqcn_recovers_and_goes_inactive():
    """After a CNP the timer alone brings the rate back to max_rate; then the QP is inactive:
    no more timer events nor rates for it, SENT ignored."""
    p = dict(DEFAULTS, time_reset=10, alpha_period=1000)
    script = [(0, 0, ("init", 2, DCQCN)), (5, 0, ("cnp", 2))]
    now = 0
    for _ in range(20):
        now += 10
        script.append((25, now, None))
    script.append((10, now, ("sent", 2, 60000, 3)))
    script.append((30, now + 5000, None))
    b = _direct(p, script)
    r = _rates(b, 2)
    # rt = 16000: rc = ceil((16000 + rc) / 2) from 8008: 12004, 14002, 15001, 15501, 15751,
    # 15876, 15938, 15969, 15985, 15993, 15997, 15999, 16000
    assert r == [16000, 8008, 12004, 14002, 15001, 15501, 15751, 15876, 15938, 15969, 15985,
                 15993, 15997, 15999, 16000]
    st = b.final_state[2]
    assert st["active"] == 0 and st["rc"] == 16000 and st["byte_cnt"] == 0
    last_rate_edge = max(e for e, q, _r in b.rates if q == 2)
    # (the scanner may have read the word before the last write landed: its test is 3 clocks
    # behind the read, a write lands 5 clocks after the issue, and with 4 QPs the scanner reads
    # each every 4 clocks, so up to two stale TIMERs follow, traced 4 and 8 clocks after the
    # last rate: no-ops)
    assert not [t for t in b.traces if t[2] == 2 and t[1] == P.EV_TIMER and t[0] > last_rate_edge + 8]


def test_flowmatrix_directed():
    """FlowMatrix with the defaults: INIT leaves W = sigma0 and the line rate; a CNP cuts the
    rate at once; growing in-flight counts cut it at the next period (early warning); with no
    signal W returns to sigma0 and the rate to max_rate. Numbers from the formulas by hand."""
    p = dict(DEFAULTS)
    s0 = 40793                      # table[136] = round(65535 / (1 + e^-0.5))
    b = _direct(p, [(0, 100, ("init", 0, FM)), (5, 100, ("cnp", 0))], settle=30)
    # CNP: cnps = 1, Q = 256, x = 77 * 256 >> 8 + 128 = 205 -> index 140 (x = 0.75):
    #   round(65535 / (1 + e^-0.75)) = 44510; W = (45875 * 40793 + 19661 * 44510) >> 16 = 41908
    #   rate = 16000 * (65536 - 41908) * 173584 >> 32 = 15279
    assert sigmoid_table()[140] == 44510
    assert _rates(b, 0) == [16000, 15279]
    assert b.final_state[0]["w"] == 41908
    assert b.final_state[0]["cnps"] == 1        # the period is still open
    # early warning: in flight 0 -> 40 in one period: Q = 32 * 40 = 1280, x = 385 + 128 = 513
    # -> index 160 (x = 2.0): 57723; W = (45875 * 40793 + 19661 * 57723) >> 16 = 45872
    #   rate = 16000 * (65536 - 45872) * 173584 >> 32 = 12715
    b = _direct(p, [(0, 100, ("init", 0, FM)), (5, 100, ("sent", 0, 1000, 40)),
                    (20, 111, None)], settle=30)
    assert sigmoid_table()[160] == 57723
    assert _rates(b, 0) == [16000, 12715]
    assert b.final_state[0]["w"] == 45872
    assert b.final_state[0]["infl_prev"] == 40 and b.final_state[0]["cnps"] == 0
    # recovery: after the CNP, periods without signal bring W back to sigma0, rate to 16000
    script = [(0, 100, ("init", 0, FM)), (5, 100, ("cnp", 0))]
    for k in range(1, 40):
        script.append((12, 100 + 10 * k, None))
    b = _direct(p, script, settle=30)
    r = _rates(b, 0)
    # the first period's update still counts the CNP (cnps = 1): W = (45875 * 41908 + 19661 *
    # 44510) >> 16 = 42688 -> 14774; then no signal: W = (45875 * 42688 + 19661 * 40793) >> 16
    # = 42119 -> 15142, ... monotone back to sigma0 and 16000
    assert r[:4] == [16000, 15279, 14774, 15142]
    assert r[-1] == 16000 and b.final_state[0]["w"] == s0
    assert all(a <= c for a, c in pairwise(r[2:]))


def test_throughput():
    """A continuous stream issues one event per 3 clocks, rate 5 clocks after the issue; a CNP
    of a DCQCN QP holds the machine 5 clocks (rate 7 clocks after the issue), a FlowMatrix
    update 12 (rate 14 clocks after the issue)."""
    p = dict(DEFAULTS, byte_reset=1000)
    qps = 8
    setup = [(0, 10, ("init", q, DCQCN)) for q in range(qps)]
    setup = [(5, 10, e[2]) for e in setup] + [(5, 10, ("cnp", q)) for q in range(qps)]
    setup.append((30, 10, None))
    cycles_setup = len(_expand(setup))
    script = list(setup)
    rng = random.Random("cc-rp-throughput")
    n = 240
    for i in range(n):
        # one SENT per 3 clocks (faster than the NIC's one per 4), some on one QP back to back
        qp = 0 if i % 5 < 2 else rng.randrange(qps)
        script.append((2, 10, ("sent", qp, rng.randint(0, 1500), 0)))
    b = _direct(p, script, qps=qps, settle=40)
    edges = [t[0] for t in b.traces if t[0] >= cycles_setup]
    assert len(edges) == n
    gaps = Counter(e2 - e1 for e1, e2 in pairwise(edges))
    assert gaps == {3: n - 1}, gaps
    # a burst filling every FIFO (8 SENT, 8 CNP, 4 INIT in 8 clocks): back to back, 3 clocks
    # apart, 5 after a CNP of a DCQCN QP (QPs 0..3; CNPs of QPs 4..7, in mode NONE, are 3-clock
    # no-ops); a DCQCN CNP is traced 7 clocks after its issue, the others 5
    cycles = [(10, (q, DCQCN) if q < 4 else None, q % qps, (q, 100, 0)) for q in range(8)]
    bb = Bench(qps, p).run(cycles, settle=100)
    e = [t[0] for t in bb.traces]
    kinds = [t[1] for t in bb.traces]
    assert kinds[:20] == [0] * 4 + [1] * 8 + [2] * 8        # priority init > cnp > sent
    assert [b2 - b1 for b1, b2 in pairwise(e[:20])] == [3] * 3 + [5] * 4 + [3] * 12
    assert e[0] == 6      # FIFO write at edge 0, issue at 1, rate at 6
    # FlowMatrix: a CNP (update) followed by queued SENTs: 12 clocks, then 3
    cyc = [(10, (0, FM), None, None)] + [(10, None, None, None)] * 10 + \
          [(10, None, 0, None)] + [(10, None, None, (1, 10, 0))] + [(10, None, None, None)] * 3 + \
          [(10, None, None, (1, 10, 0))]
    bf = Bench(qps, p).run(cyc, settle=60)
    e = [t[0] for t in bf.traces]
    assert [t[1] for t in bf.traces] == [0, 1, 2, 2]
    # CNP in the FIFO at edge 11, issued at 12, traced at 26; the SENT waits until 12 + 12 = 24
    # (traced 29); the next SENT (FIFO at 16) is issued 3 clocks later, at 27 (traced 32)
    assert e[1:] == [26, 29, 32]


def _expand(script):
    cycles = []
    for wait, now, ev in script:
        cycles += [(now, None, None, None)] * wait
        init = cnp = sent = None
        if ev is not None:
            if ev[0] == "init":
                init = ev[1:]
            elif ev[0] == "cnp":
                cnp = ev[1]
            else:
                sent = ev[1:]
        cycles.append((now, init, cnp, sent))
    return cycles


def test_fifo_overflow_counted():
    """CNPs on every clock overflow the 8-deep CNP FIFO: ``lost`` pulses, and every CNP is
    either processed or lost."""
    p = dict(DEFAULTS)
    cycles = [(10, (0, DCQCN), None, None)] + [(10, None, None, None)] * 5
    cycles += [(10, None, 0, None)] * 20
    b = Bench(4, p).run(cycles, settle=100, expect_lost=True)
    cnps = sum(1 for t in b.traces if t[1] == P.EV_CNP)
    assert b.lost > 0 and cnps + b.lost == 20 and cnps >= 8
