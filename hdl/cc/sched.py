"""The TX scheduler of the RC transport: strict-priority traffic classes, guaranteed tenants
first inside a class, weighted round robin between QPs, a token-bucket pacer per QP and a cap
and a guarantee token bucket per tenant.

The transport pushes a QP when it has a packet to send (``push``, at most once while the QP is
in the scheduler), takes QPs from ``pop`` when it can send, reports each packet it sends on
``sent`` (a few clocks after the pop) and pushes the QP back if it has more. The scheduler
holds every pushed QP until it pops it: exactly one pop per push, no QP ever dropped.

Structure::

   push --> [attr, rem read] --> [ring, front?] --+--> ring RAM (2 x classes rings of QP indexes)
                                                  |            |
             rotate / move / roll back  <---------+   SELECT (highest unmasked ring with QPs)
                        ^                                      v
                        +--- S5 decide <-- S4 <-- S3 <-- S2 <-- S1   (probe pipeline)
                                  |        QP bucket, rate, attr, rem / tenant config, buckets
                                  v
                          out (pop) register --> pop
   sent --> FIFO (16) --> charge unit: QP bucket, tenant cap and guarantee buckets (4 clocks)

Rings and levels
----------------
Each class ``c`` has two rings (ring RAM: ``2 * classes * qps`` QP indexes; head and tail
pointers in registers): ring ``2c + 1`` holds the QPs of tenants that have a guarantee
(``guar_rate != 0`` when the QP is pushed), ring ``2c`` the others. The ring index is the
*level*: higher levels go first (tclass 7 before 6, the guaranteed ring of a class before its
other ring). A push goes to the tail of its ring, or to its head when the QP still has pops
left in its weighted round-robin turn (see below).

Decisions
---------
SELECT takes the head of the highest-level ring that has QPs, is not masked and is not held,
one probe per clock while the pipeline moves; the probe reads the QP's bucket, rate, attributes
and turn, then its tenant's configuration and buckets, and decides 5 clocks later (S5):

- pacer has no tokens: the QP goes to the tail of its ring; ``stall_pacer`` pulses;
- else its tenant is over its cap: tail of its ring; ``stall_tenant`` pulses;
- else the QP is in a guaranteed ring and its tenant is over its guarantee: moved to the tail
  of the other ring of its class, where it competes in round robin with the tenants without
  a guarantee (it returns to the guaranteed ring when it is pushed back after its next pop);
- else it is eligible: it goes to ``out`` (``pop.valid``), waiting there if ``out`` is taken.
A ring is masked once probed; the mask clears when a QP enters ``out`` or when no ring is left
to probe, so every decision probes the heads of the higher rings before taking a lower one.

Strict priority (rule 3) and the hold: from the moment a QP of level L enters ``out`` until its
push-back lands in its ring (or 3 clocks after its ``sent``, or ``HOLD`` = 16 clocks after its
pop when it comes back neither way), rings below level L are not probed, and a probe of a lower
ring already in the pipeline is rolled back to the head of its ring (it keeps its place). So a
backlogged QP of a higher class is never overtaken by a lower class while it is away being
sent. Bound: a QP of level L is placed in ``out`` only if, in the same decision round, the head
of every non-empty ring above L was probed and found ineligible, or became non-empty after its
probe slot (at most the 5 probes in flight, i.e. at most one lower-level pop after a
higher-level QP reaches the head of its ring and is eligible).

Weighted round robin (rule 4): each QP has ``rem`` (pops left in its turn, per-QP RAM). A pop
starts a turn of ``max(weight, 1)`` pops when ``rem`` is 0 and counts one down. While a QP with
pops left in its turn is in ``out`` or away being sent, the hold also covers its own ring (no
other QP of that ring is placed in ``out``); pushed back with ``rem > 0`` it goes to the head of
its ring, so it gets ``weight`` consecutive pops while it stays eligible and comes back within
the hold; then it goes to the tail of its ring.

Work conservation (rule 5): with eligible QPs queued and ``out`` free, a decision round probes
each non-empty, unheld ring once (one probe per clock, a clock to clear the mask), and every
ineligible head moves to its ring's tail, so a queued eligible QP at position k of its ring is
offered within about (k + 1) * (rings + 1) + 6 clocks (+ ``HOLD`` after a pop whose QP does not
come back). ``out`` is refilled at the earliest 3 clocks after a pop: at most one pop every 4
clocks, one every 4 clocks when all QPs are eligible (the pipeline runs ahead of ``out``).

Token buckets (rule 1, 2)
-------------------------
Deficit buckets: a QP or tenant may send while its tokens are >= 0; the packet's bytes are
subtracted when ``sent`` reports it (tokens go negative: the debt delays the next packet);
refill at the bucket's rate up to its burst (``qp_burst`` for every QP pacer, ``cap_burst`` /
``guar_burst`` per tenant, bytes). A QP is eligible when its pacer (``rate`` ==
``RATE_UNLIMITED`` always passes and is never charged) and its tenant's cap bucket
(``cap_rate`` 0: uncapped) allow; its tenant is *under its guarantee* when ``guar_rate != 0``
and the guarantee bucket allows. A charge counts towards all three buckets.

Representation (``stellar.hdl.cc.units``): a global rate clock ``V`` (bytes earned by a 1 Mb/s
flow, 24 fraction bits) advances by ``pace_scale = round(2**24 / (8 * us_cycles))`` per cycle,
computed here by a serial divider whenever ``us_cycles`` changes (26 clocks; V stands still
while ``us_cycles`` is 0). Each bucket keeps signed tokens (2**-10 bytes, 36 bits) and the stamp
of V (10 fraction bits) at its last charge; its tokens now are ``min(burst, tokens + rate *
(V - stamp))``, computed lazily (a 20 x 28-bit product) by the probe and by the charge, which
writes back the charged tokens with the new stamp. Rate error: ``0.5 / pace_scale`` (<= 0.024 %
for ``us_cycles`` <= 1000); the stamps telescope, so truncation loses no credit over time.
A bucket not charged for 2**18 bytes-per-Mb/s (2**18 * 8 us = 2.1 s) counts as full whatever its
rate (bounds the product); V wraps after 2**24 * 8 us (134 s): a bucket idle exactly a multiple
of that sees too little elapsed time and waits at most its own debt longer. A rate change
applies from the bucket's last charge (the credit since then is earned at the new rate).
Tokens saturate at -2**25 bytes.

Charges land 5 clocks after ``sent`` (4 clocks per charge, ``sent`` queued in a 16-entry FIFO:
``sent`` must follow its pop within 64 clocks, with at most one ``sent`` per pop). A probe
evaluates the buckets with the charges landed so far, and the pipeline runs ahead of ``out``
(the next QP is decided while the previous one waits in ``out`` for the wire), so a QP or tenant
can be found eligible again before the charge of its previous packets landed: a bucket can be
overdrawn by the packets popped between a probe and their charges (in practice <= 3 packets
for a tenant with several QPs: they leave in short bursts). Every charge lands, so the long-run
rates are exact (the tests measure 0.0x-0.2 %).

Attributes (``tenant``, ``tclass``, ``weight``) are read when the QP is pushed (its ring) and at
each probe and charge (tenant, weight); a QP already queued stays in its ring when they change.

Ports (``IB = log2(qps)``, ``TB = log2(tenants)``)
--------------------------------------------------
push         In   stream {qp: IB}, always ready: QP qp has a packet to send
pop          Out  stream {qp: IB}: the next QP to send one packet
sent         In   stream {qp: IB, bytes: 16}, always ready: a packet of qp went to the wire
rate         In   stream {qp: IB, rate: 20}, always ready: pacer rate (Mb/s) of qp; reset value
                  of every QP: ``RATE_UNLIMITED``
attr         In   stream {qp: IB, tenant: TB, tclass: 3, weight: 8}, always ready (tclass >=
                  ``classes`` counts as ``classes - 1``; weight 0 as 1)
tenant_cfg   In   stream {tenant: TB, cap_rate: 20, cap_burst: 24, guar_rate: 20,
                  guar_burst: 24}, always ready
qp_burst     In   24 bits: depth in bytes of every QP pacer bucket
us_cycles    In   16 bits: clock cycles per microsecond
pace_scale   Out  22 bits: ``units.pace_scale(us_cycles)`` once the divider is done
stall_pacer, stall_tenant, pops
             Out  one-clock pulses: a probed QP skipped for its pacer / its tenant's cap; a pop

Parameters: ``qps``, ``tenants`` (powers of two >= 2), ``classes`` (1, 2, 4 or 8). Memories:
ring ``2 * classes * qps`` x IB; per QP: bucket (70 bits), rate (20), attributes (TB + 11),
turn (8); per tenant: configuration (88 bits), buckets (140 bits). Multipliers: 6 of 20 x 28
bits (3 in the probe, 3 in the charge unit), all from registers.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .units import RATE_BITS, RATE_UNLIMITED, SAT_BITS, SCALE_BITS, STAMP_FRAC, STAMP_INT, TOKEN_BITS

__all__ = ["TxScheduler", "qp_layout", "sent_layout", "rate_layout", "attr_layout",
           "tenant_cfg_layout"]

G = STAMP_FRAC
VW = STAMP_INT + STAMP_FRAC         # stamp width
DW = SAT_BITS + STAMP_FRAC          # unsaturated elapsed rate-clock width
TW = TOKEN_BITS


def _bits(n):
    return max(1, (n - 1).bit_length())


def qp_layout(ib):
    return data.StructLayout({"qp": ib})


def sent_layout(ib):
    return data.StructLayout({"qp": ib, "bytes": 16})


def rate_layout(ib):
    return data.StructLayout({"qp": ib, "rate": RATE_BITS})


def attr_layout(ib, tb):
    return data.StructLayout({"qp": ib, "tenant": tb, "tclass": 3, "weight": 8})


def tenant_cfg_layout(tb):
    return data.StructLayout({"tenant": tb, "cap_rate": RATE_BITS, "cap_burst": 24,
                              "guar_rate": RATE_BITS, "guar_burst": 24})


def _qattr_layout(tb):
    return data.StructLayout({"tenant": tb, "tclass": 3, "weight": 8})


def _bucket_layout():
    return data.StructLayout({"tok": signed(TW), "stamp": VW})


def _tcfg_layout():
    return data.StructLayout({"cap_rate": RATE_BITS, "cap_burst": 24,
                              "guar_rate": RATE_BITS, "guar_burst": 24})


def _tbkt_layout():
    return data.StructLayout({"cap": _bucket_layout(), "guar": _bucket_layout()})


def _elapsed(vnow, stamp):
    """(saturated, elapsed) of the rate clock since ``stamp``."""
    d = (vnow - stamp)[:VW]
    return d[DW:].any(), d[:DW]


def _allows(tok, sat, prod):
    """A deficit bucket allows sending when its refilled tokens are >= 0."""
    return sat | (tok + prod >= 0)


def _charged(tok, sat, prod, burst, nbytes):
    """Tokens after refilling up to ``burst`` bytes and charging ``nbytes`` bytes."""
    burst_u = Cat(Const(0, G), burst)
    s = tok + prod
    filled = Mux(sat | (s >= burst_u), burst_u, s)
    new = filled - Cat(Const(0, G), nbytes)
    lo = -(1 << (TW - 1))
    return Mux(new < lo, lo, new)[:TW].as_signed()


class TxScheduler(wiring.Component):
    HOLD = 16           # clocks a lower level waits for a popped QP to come back
    LATENCY = 6         # clocks from SELECT to ``pop.valid``

    def __init__(self, qps, tenants=256, classes=8):
        for name, v in (("qps", qps), ("tenants", tenants)):
            if v < 2 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 2, not {v}")
        if classes not in (1, 2, 4, 8):
            raise ValueError(f"classes must be 1, 2, 4 or 8, not {classes}")
        self.qps = qps
        self.tenants = tenants
        self.classes = classes
        self.rings = 2 * classes
        self.index_bits = IB = _bits(qps)
        self.tenant_bits = TB = _bits(tenants)
        super().__init__({
            "push":         In(stream.Signature(qp_layout(IB), always_ready=True)),
            "pop":          Out(stream.Signature(qp_layout(IB))),
            "sent":         In(stream.Signature(sent_layout(IB), always_ready=True)),
            "rate":         In(stream.Signature(rate_layout(IB), always_ready=True)),
            "attr":         In(stream.Signature(attr_layout(IB, TB), always_ready=True)),
            "tenant_cfg":   In(stream.Signature(tenant_cfg_layout(TB), always_ready=True)),
            "qp_burst":     In(24),
            "us_cycles":    In(16),
            "pace_scale":   Out(22),
            "stall_pacer":  Out(1),
            "stall_tenant": Out(1),
            "pops":         Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        vnow = self._rate_clock(m)
        IB, TB, R = self.index_bits, self.tenant_bits, self.rings
        RB = _bits(R)
        CB = _bits(self.classes) if self.classes > 1 else 0

        # ---------------------------------------------------------------- memories
        m.submodules.q_rate = q_rate = Memory(shape=RATE_BITS, depth=self.qps,
                                              init=[RATE_UNLIMITED] * self.qps)
        m.submodules.q_attr = q_attr = Memory(shape=_qattr_layout(TB), depth=self.qps, init=[])
        m.submodules.q_rem = q_rem = Memory(shape=8, depth=self.qps, init=[])
        m.submodules.q_bkt = q_bkt = Memory(shape=_bucket_layout(), depth=self.qps, init=[])
        m.submodules.t_cfg = t_cfg = Memory(shape=_tcfg_layout(), depth=self.tenants, init=[])
        m.submodules.t_bkt = t_bkt = Memory(shape=_tbkt_layout(), depth=self.tenants, init=[])
        m.submodules.ring = ring = Memory(shape=IB, depth=R * self.qps, init=[])
        rate_w, attr_w, rem_w = q_rate.write_port(), q_attr.write_port(), q_rem.write_port()
        bkt_w, tcfg_w, tbkt_w = q_bkt.write_port(), t_cfg.write_port(), t_bkt.write_port()
        ring_w = ring.write_port()
        # Read ports that can meet a write to the same word in the same clock are transparent
        # (Yosys builds the bypass: an ECP5 block RAM's cross-port collision is undefined).
        rp = {}
        for who in ("push", "probe", "charge"):
            rp[who, "attr"] = q_attr.read_port(transparent_for=(attr_w,))
        rp["push", "rem"] = q_rem.read_port(transparent_for=(rem_w,))
        rp["probe", "rem"] = q_rem.read_port(transparent_for=(rem_w,))
        for who in ("probe", "charge"):
            rp[who, "rate"] = q_rate.read_port(transparent_for=(rate_w,))
            rp[who, "bkt"] = q_bkt.read_port(transparent_for=(bkt_w,))
            rp[who, "tcfg"] = t_cfg.read_port(transparent_for=(tcfg_w,))
            rp[who, "tbkt"] = t_bkt.read_port(transparent_for=(tbkt_w,))
        # The probe never reads the word a ring write hits (fronts are written below the head,
        # tails at the tail of a ring that is not full), so no bypass is needed.
        ring_r = ring.read_port()

        # ---------------------------------------------------------------- configuration
        gflag = Signal(self.tenants)      # tenant has a guarantee (guar_rate != 0)
        m.d.comb += [
            rate_w.addr.eq(self.rate.p.qp), rate_w.data.eq(self.rate.p.rate),
            rate_w.en.eq(self.rate.valid),
            attr_w.addr.eq(self.attr.p.qp), attr_w.en.eq(self.attr.valid),
            attr_w.data.tenant.eq(self.attr.p.tenant), attr_w.data.tclass.eq(self.attr.p.tclass),
            attr_w.data.weight.eq(self.attr.p.weight),
            tcfg_w.addr.eq(self.tenant_cfg.p.tenant), tcfg_w.en.eq(self.tenant_cfg.valid),
            tcfg_w.data.cap_rate.eq(self.tenant_cfg.p.cap_rate),
            tcfg_w.data.cap_burst.eq(self.tenant_cfg.p.cap_burst),
            tcfg_w.data.guar_rate.eq(self.tenant_cfg.p.guar_rate),
            tcfg_w.data.guar_burst.eq(self.tenant_cfg.p.guar_burst),
        ]
        with m.If(self.tenant_cfg.valid):
            m.d.sync += gflag.bit_select(self.tenant_cfg.p.tenant, 1).eq(
                self.tenant_cfg.p.guar_rate != 0)

        # ---------------------------------------------------------------- ring pointers
        head = Array(Signal(IB + 1, name=f"head{r}") for r in range(R))
        tail = Array(Signal(IB + 1, name=f"tail{r}") for r in range(R))
        nonempty = Signal(R)
        m.d.comb += nonempty.eq(Cat(head[r] != tail[r] for r in range(R)))

        # One ring write per clock: a push landing (pp2) first, else the decision's write.
        wr_v, wr_front = Signal(), Signal()
        wr_ring, wr_qp = Signal(RB), Signal(IB)
        wr_idx = Mux(wr_front, head[wr_ring] - 1, tail[wr_ring])[:IB]
        m.d.comb += [ring_w.addr.eq(Cat(wr_idx, wr_ring)), ring_w.data.eq(wr_qp),
                     ring_w.en.eq(wr_v)]

        # ---------------------------------------------------------------- push pipeline
        # pp0: read the QP's attributes and turn; pp1: its ring and whether it goes in front;
        # pp2: write the ring.
        pa, pr = rp["push", "attr"], rp["push", "rem"]
        pp1_v, pp1_q = Signal(), Signal(IB)
        pp2_v, pp2_q, pp2_ring, pp2_front = Signal(), Signal(IB), Signal(RB), Signal()
        m.d.comb += [pa.addr.eq(self.push.p.qp), pr.addr.eq(self.push.p.qp)]
        m.d.sync += [pp1_v.eq(self.push.valid), pp1_q.eq(self.push.p.qp)]
        tcls = Signal(3)
        m.d.comb += tcls.eq(Mux(pa.data.tclass >= self.classes, self.classes - 1,
                                pa.data.tclass))
        m.d.sync += [pp2_v.eq(pp1_v), pp2_q.eq(pp1_q), pp2_front.eq(pr.data != 0),
                     pp2_ring.eq(Cat(gflag.bit_select(pa.data.tenant, 1), tcls[:CB]))]

        # ---------------------------------------------------------------- probe pipeline
        adv = Signal()                  # the whole probe pipeline moves (S5 is not stalled)
        s1 = Signal(data.StructLayout({"v": 1, "ring": RB}))
        qrec = data.StructLayout({"v": 1, "ring": RB, "q": IB})
        s2 = Signal(qrec)
        s3 = Signal(data.StructLayout({
            "v": 1, "ring": RB, "q": IB, "weight": 8, "rem": 8, "rate": RATE_BITS,
            "tok": signed(TW), "sat": 1, "dv": DW}))
        tb_rec = data.StructLayout({"tok": signed(TW), "sat": 1, "dv": DW, "rate": RATE_BITS})
        s4 = Signal(data.StructLayout({
            "v": 1, "ring": RB, "q": IB, "weight": 8, "rem": 8, "ok": 1,
            "tok": signed(TW), "sat": 1, "unl": 1, "prod": RATE_BITS + DW,
            "cap": tb_rec, "guar": tb_rec}))
        tp_rec = data.StructLayout({"on": 1, "tok": signed(TW), "sat": 1,
                                    "prod": RATE_BITS + DW})
        s5 = Signal(data.StructLayout({
            "v": 1, "ring": RB, "q": IB, "weight": 8, "rem": 8, "ok": 1,
            "cap": tp_rec, "guar": tp_rec}))

        # SELECT: the highest-level ring with QPs that is neither masked nor held, and whose
        # head does not move down this clock (a front write).
        mask = Signal(R)
        h_act, h_lvl, h_qp = Signal(), Signal(RB), Signal(IB)
        h_popped, h_timer = Signal(), Signal(range(self.HOLD + 1))
        h_turn = Signal()               # the held QP has pops left in its turn: hold its ring
        held = Signal(R)
        front_hit = Signal(R)
        m.d.comb += [
            held.eq(Cat(h_act & ((h_lvl > r) | ((h_lvl == r) & h_turn)) for r in range(R))),
            front_hit.eq(Cat(wr_v & wr_front & (wr_ring == r) for r in range(R))),
        ]
        cand = Signal(R)
        m.d.comb += cand.eq(nonempty & ~mask & ~held & ~front_hit)
        sel_r = Signal(RB)
        for r in range(R):                      # last assignment wins: highest ring
            with m.If(cand[r]):
                m.d.comb += sel_r.eq(r)
        sel_go = Signal()
        m.d.comb += [
            sel_go.eq(adv & cand.any()),
            ring_r.addr.eq(Cat(head[sel_r][:IB], sel_r)),
            ring_r.en.eq(adv),
        ]
        with m.If(adv):
            m.d.sync += [s1.v.eq(sel_go), s1.ring.eq(sel_r)]

        # S1: the QP index is out of the ring RAM; read its per-QP state.
        q1 = ring_r.data
        for key in ("attr", "rem", "rate", "bkt"):
            m.d.comb += [rp["probe", key].addr.eq(q1), rp["probe", key].en.eq(adv)]
        with m.If(adv):
            m.d.sync += [s2.v.eq(s1.v), s2.ring.eq(s1.ring), s2.q.eq(q1)]

        # S2: per-QP state out; read the tenant's; elapsed rate clock of the QP pacer.
        pa2, pb2 = rp["probe", "attr"].data, rp["probe", "bkt"].data
        for key in ("tcfg", "tbkt"):
            m.d.comb += [rp["probe", key].addr.eq(pa2.tenant), rp["probe", key].en.eq(adv)]
        sat2, dv2 = _elapsed(vnow, pb2.stamp)
        with m.If(adv):
            m.d.sync += [
                s3.v.eq(s2.v), s3.ring.eq(s2.ring), s3.q.eq(s2.q),
                s3.weight.eq(pa2.weight), s3.rem.eq(rp["probe", "rem"].data),
                s3.rate.eq(rp["probe", "rate"].data), s3.tok.eq(pb2.tok),
                s3.sat.eq(sat2), s3.dv.eq(dv2),
            ]

        # S3: tenant state out: its elapsed rate clocks; the QP pacer's refill product.
        tc3, tb3 = rp["probe", "tcfg"].data, rp["probe", "tbkt"].data
        with m.If(adv):
            m.d.sync += [
                s4.v.eq(s3.v), s4.ring.eq(s3.ring), s4.q.eq(s3.q), s4.weight.eq(s3.weight),
                s4.rem.eq(s3.rem), s4.tok.eq(s3.tok), s4.sat.eq(s3.sat),
                s4.unl.eq(s3.rate == RATE_UNLIMITED), s4.prod.eq(s3.rate * s3.dv),
            ]
            for name, rate in (("cap", tc3.cap_rate), ("guar", tc3.guar_rate)):
                sat, dv = _elapsed(vnow, tb3[name].stamp)
                m.d.sync += [s4[name].tok.eq(tb3[name].tok), s4[name].sat.eq(sat),
                             s4[name].dv.eq(dv), s4[name].rate.eq(rate)]

        # S4: QP pacer verdict; the tenant buckets' refill products.
        with m.If(adv):
            m.d.sync += [
                s5.v.eq(s4.v), s5.ring.eq(s4.ring), s5.q.eq(s4.q), s5.weight.eq(s4.weight),
                s5.rem.eq(s4.rem), s5.ok.eq(s4.unl | _allows(s4.tok, s4.sat, s4.prod)),
            ]
            for name in ("cap", "guar"):
                b = s4[name]
                m.d.sync += [s5[name].on.eq(b.rate != 0), s5[name].tok.eq(b.tok),
                             s5[name].sat.eq(b.sat), s5[name].prod.eq(b.rate * b.dv)]

        # S5: decide.
        out_v, out_qp, out_rem = Signal(), Signal(IB), Signal(8)
        since = Signal(2, init=3)       # clocks since the last pop (saturating)
        cap_ok = ~s5.cap.on | _allows(s5.cap.tok, s5.cap.sat, s5.cap.prod)
        under = s5.guar.on & _allows(s5.guar.tok, s5.guar.sat, s5.guar.prod)
        rollback = h_act & ((s5.ring < h_lvl) | ((s5.ring == h_lvl) & h_turn))
        eligible = s5.ok & cap_ok
        act_out = Signal()
        act_rot = Signal()
        act_move = Signal()
        act_rb = Signal()
        m.d.comb += [
            act_rb.eq(s5.v & rollback),
            act_rot.eq(s5.v & ~rollback & ~eligible),
            act_move.eq(s5.v & ~rollback & eligible & s5.ring[0] & ~under),
            act_out.eq(s5.v & ~rollback & eligible & ~(s5.ring[0] & ~under)),
        ]
        needs_wr = act_rb | act_rot | act_move
        out_free = ~out_v & (since >= 2)
        place = Signal()
        m.d.comb += [
            adv.eq(~(act_out & ~out_free) & ~(needs_wr & pp2_v)),
            place.eq(act_out & out_free),
            self.stall_pacer.eq(act_rot & ~s5.ok & adv),
            self.stall_tenant.eq(act_rot & s5.ok & adv),
        ]

        # Ring writes.
        with m.If(pp2_v):
            m.d.comb += [wr_v.eq(1), wr_ring.eq(pp2_ring), wr_qp.eq(pp2_q),
                         wr_front.eq(pp2_front)]
        with m.Elif(needs_wr):
            m.d.comb += [wr_v.eq(1), wr_qp.eq(s5.q), wr_front.eq(act_rb),
                         wr_ring.eq(Mux(act_move, Cat(Const(0, 1), s5.ring[1:]), s5.ring))]
        for r in range(R):
            inc = sel_go & (sel_r == r)
            dec = wr_v & wr_front & (wr_ring == r)
            m.d.sync += head[r].eq(head[r] + inc - dec)
            with m.If(wr_v & ~wr_front & (wr_ring == r)):
                m.d.sync += tail[r].eq(tail[r] + 1)

        # The decision round's mask.
        onehot = Signal(R)
        m.d.comb += onehot.eq(Mux(sel_go, 1 << sel_r, 0))
        with m.If(place):
            m.d.sync += mask.eq(onehot)
        with m.Elif(sel_go):
            m.d.sync += mask.eq(mask | onehot)
        with m.Elif(~cand.any()):
            m.d.sync += mask.eq(0)

        # out, pop, and the turn of the popped QP.
        popped = Signal()
        turn = Mux(s5.rem != 0, s5.rem, Mux(s5.weight == 0, 1, s5.weight))
        m.d.comb += [
            self.pop.valid.eq(out_v), self.pop.p.qp.eq(out_qp),
            popped.eq(out_v & self.pop.ready),
            self.pops.eq(popped),
            rem_w.addr.eq(out_qp), rem_w.data.eq(out_rem), rem_w.en.eq(popped),
        ]
        with m.If(place):
            m.d.sync += [out_v.eq(1), out_qp.eq(s5.q), out_rem.eq(turn - 1)]
        with m.Elif(popped):
            m.d.sync += out_v.eq(0)
        with m.If(popped):
            m.d.sync += since.eq(0)
        with m.Elif(since != 3):
            m.d.sync += since.eq(since + 1)

        # The hold: lower levels wait while the QP in out is away.
        with m.If(place):
            m.d.sync += [h_act.eq(1), h_lvl.eq(s5.ring), h_qp.eq(s5.q), h_popped.eq(0),
                         h_timer.eq(self.HOLD), h_turn.eq(turn != 1)]
        with m.Elif(h_act & h_popped):
            with m.If((pp2_v & (pp2_q == h_qp)) | (h_timer == 0)):
                m.d.sync += h_act.eq(0)
            with m.Elif(self.sent.valid & (self.sent.p.qp == h_qp) & (h_timer > 3)):
                m.d.sync += h_timer.eq(3)
            with m.Else():
                m.d.sync += h_timer.eq(h_timer - 1)
        with m.If(popped):
            m.d.sync += h_popped.eq(1)

        self._charge_unit(m, vnow, rp, bkt_w, tbkt_w)
        return m

    # ------------------------------------------------------------------ rate clock
    def _rate_clock(self, m):
        """``pace_scale`` from ``us_cycles`` (restoring division, one bit per clock) and the
        rate clock V; returns V with the stamp precision."""
        S = SCALE_BITS
        NB = S + 1                          # 2**24 + 4 * us_cycles < 2**25
        busy, cnt = Signal(), Signal(range(NB + 1))
        u_seen = Signal(16)
        num, quo = Signal(NB), Signal(NB)
        den, rem = Signal(19), Signal(19)
        with m.If(~busy & (self.us_cycles != u_seen)):
            m.d.sync += u_seen.eq(self.us_cycles)
            with m.If(self.us_cycles == 0):
                m.d.sync += self.pace_scale.eq(0)
            with m.Else():
                m.d.sync += [busy.eq(1), cnt.eq(NB), num.eq((1 << S) + (self.us_cycles << 2)),
                             den.eq(self.us_cycles << 3), rem.eq(0), quo.eq(0)]
        with m.If(busy):
            r2 = Cat(num[-1], rem)
            bit = r2 >= den
            q2 = Cat(bit, quo[:-1])
            m.d.sync += [num.eq(num << 1), quo.eq(q2), cnt.eq(cnt - 1),
                         rem.eq(Mux(bit, r2 - den, r2))]
            with m.If(cnt == 1):
                m.d.sync += [busy.eq(0), self.pace_scale.eq(q2)]
        v = Signal(STAMP_INT + S)
        m.d.sync += v.eq(v + self.pace_scale)
        vnow = Signal(VW)
        m.d.comb += vnow.eq(v[S - G:])
        return vnow

    # ------------------------------------------------------------------ charges
    def _charge_unit(self, m, vnow, rp, bkt_w, tbkt_w):
        """One ``sent`` every 4 clocks: C0 reads the QP's bucket, rate and tenant; C1 the
        tenant's configuration and buckets; C2 multiplies; C3 writes the QP bucket; the clock
        after C3 writes the tenant buckets (overlapping the next C0)."""
        IB = self.index_bits
        m.submodules.sentq = fifo = SyncFIFOBuffered(width=IB + 16, depth=16)
        m.d.comb += [fifo.w_data.eq(Cat(self.sent.p.qp, self.sent.p.bytes)),
                     fifo.w_en.eq(self.sent.valid)]
        ca, cr, cb = rp["charge", "attr"], rp["charge", "rate"], rp["charge", "bkt"]
        ctc, ctb = rp["charge", "tcfg"], rp["charge", "tbkt"]
        state = Signal(2)
        c_q, c_bytes, c_v = Signal(IB), Signal(16), Signal(VW)
        c_tenant, c_rate = Signal(self.tenant_bits), Signal(RATE_BITS)
        c_tok, c_sat, c_dv, c_prod = Signal(signed(TW)), Signal(), Signal(DW), \
            Signal(RATE_BITS + DW)
        c_cfg = Signal(_tcfg_layout())
        c_tb = Signal(_tbkt_layout())
        c_tsat = Signal(2)
        c_tdv = [Signal(DW, name="c_dv_cap"), Signal(DW, name="c_dv_guar")]
        c_tprod = [Signal(RATE_BITS + DW, name="c_prod_cap"),
                   Signal(RATE_BITS + DW, name="c_prod_guar")]
        twrite = Signal()

        for p in (ca, cr, cb):
            m.d.comb += [p.addr.eq(fifo.r_data[:IB]), p.en.eq(state == 0)]
        for p in (ctc, ctb):
            m.d.comb += [p.addr.eq(ca.data.tenant), p.en.eq(state == 1)]

        with m.Switch(state):
            with m.Case(0):
                m.d.comb += fifo.r_en.eq(1)
                with m.If(fifo.r_rdy):
                    m.d.sync += [c_q.eq(fifo.r_data[:IB]), c_bytes.eq(fifo.r_data[IB:]),
                                 state.eq(1)]
            with m.Case(1):
                sat, dv = _elapsed(vnow, cb.data.stamp)
                m.d.sync += [c_v.eq(vnow), c_tenant.eq(ca.data.tenant), c_rate.eq(cr.data),
                             c_tok.eq(cb.data.tok), c_sat.eq(sat), c_dv.eq(dv), state.eq(2)]
            with m.Case(2):
                m.d.sync += [c_cfg.eq(ctc.data), c_tb.eq(ctb.data), c_prod.eq(c_rate * c_dv),
                             state.eq(3)]
                for i, name in enumerate(("cap", "guar")):
                    sat, dv = _elapsed(c_v, ctb.data[name].stamp)
                    m.d.sync += [c_tsat[i].eq(sat), c_tdv[i].eq(dv)]
            with m.Case(3):
                m.d.sync += [c_tprod[0].eq(c_cfg.cap_rate * c_tdv[0]),
                             c_tprod[1].eq(c_cfg.guar_rate * c_tdv[1]),
                             twrite.eq(1), state.eq(0)]
                m.d.comb += [
                    bkt_w.addr.eq(c_q), bkt_w.en.eq(c_rate != RATE_UNLIMITED),
                    bkt_w.data.tok.eq(_charged(c_tok, c_sat, c_prod, self.qp_burst, c_bytes)),
                    bkt_w.data.stamp.eq(c_v),
                ]
        with m.If(twrite):
            m.d.sync += twrite.eq(0)
        m.d.comb += [tbkt_w.addr.eq(c_tenant), tbkt_w.en.eq(twrite)]
        for i, (name, rate, burst) in enumerate((
                ("cap", c_cfg.cap_rate, c_cfg.cap_burst),
                ("guar", c_cfg.guar_rate, c_cfg.guar_burst))):
            old = c_tb[name]
            m.d.comb += [
                tbkt_w.data[name].tok.eq(Mux(rate != 0, _charged(old.tok, c_tsat[i],
                                             c_tprod[i], burst, c_bytes), old.tok)),
                tbkt_w.data[name].stamp.eq(Mux(rate != 0, c_v, old.stamp)),
            ]
