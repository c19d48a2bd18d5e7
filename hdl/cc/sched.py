"""The TX scheduler of the RC transport: strict-priority traffic classes, guaranteed tenants
first inside a class, weighted round robin between QPs, a token-bucket pacer per QP and a cap
and a guarantee token bucket per tenant.

The transport pushes a QP when it has a packet to send (``push``, at most once while the QP is
in the scheduler), takes QPs from ``pop`` when it can send, reports each packet it sends on
``sent`` (a few clocks after the pop) and pushes the QP back if it has more. The scheduler
holds every pushed QP until it pops it: exactly one pop per push, no QP ever dropped.

Structure::

   push --> [attr, rem] --> [ring, front?] --> [write] --+--> ring RAM (2 x classes rings of QPs)
     |                                                   |             |
     |       rotate / move / roll back  <----------------+    SELECT (highest unmasked ring with
     |                  ^                                        QPs), p1 head read, p2 QP index
     |                  +--- d decide <-- p10 ... p4 <-- p3 <--------+
     +-- held QP pushed back -----------------------------^     p3-p6: QP bucket, rate, attr, rem
                        |                                       p5-p10: tenant config, buckets
                        v
                out (pop) register --> pop
   sent --> FIFO (16) --> charge unit (pipelined, one charge every 4 clocks): QP bucket, tenant
                          cap and guarantee buckets

Every RAM output is registered before it is used and every probe stage holds at most one carry
chain or one 18 x 18 multiplier tile; the decision (d) uses registered verdicts only.

Rings and levels
----------------
Each class ``c`` has two rings (ring RAM: ``2 * classes * qps`` QP indexes; head and tail
pointers in registers): ring ``2c + 1`` holds the QPs of tenants that have a guarantee
(``guar_rate != 0`` when the QP is pushed), ring ``2c`` the others. The ring index is the
*level*: higher levels go first (tclass 7 before 6, the guaranteed ring of a class before its
other ring). A push goes to the tail of its ring, or to its head when the QP still has pops
left in its weighted round-robin turn (see below); it is written there 4 clocks after ``push``.

Decisions
---------
SELECT takes the head of the highest-level ring that has QPs, is not masked and is not being
read (a ring is probed at most every other clock), one probe per clock while the pipeline moves;
the probe reads the QP's bucket, rate, attributes and turn, then its tenant's configuration and
buckets, and decides in stage d, ``LATENCY`` - 1 = 11 clocks after SELECT:

- pacer has no tokens: the QP goes to the tail of its ring; ``stall_pacer`` pulses;
- else its tenant is over its cap: tail of its ring; ``stall_tenant`` pulses;
- else the QP is in a guaranteed ring and its tenant is over its guarantee: moved to the tail
  of the other ring of its class, where it competes in round robin with the tenants without
  a guarantee (it returns to the guaranteed ring when it is pushed back after its next pop);
- else it is eligible: it goes to ``out`` (``pop.valid``), waiting there if ``out`` is taken.
A ring is masked once probed; the mask clears when a QP enters ``out`` or when no ring is left
to probe, so every decision probes the heads of the higher rings before taking a lower one.

Strict priority (rule 3) and the hold: from the moment a QP of level L enters ``out`` until it
comes back (or ``SENT_HOLD`` = 5 clocks after its ``sent``, or ``HOLD`` = 16 clocks after its
pop when it comes back neither way), a probe of a ring below level L that reaches the decision
is rolled back to the head of its ring (it keeps its place). The held QP pushed back after its
pop skips its ring: it enters the probe pipeline at p3 (the upper stages wait a clock) and
decides as if it had landed in its ring (first when it goes in front or when its ring is empty
and nothing is on its way there, else rotated to its tail); once it is back the timers stop,
and the hold lasts until it is placed in ``out`` again (a new hold) or written to a ring. So a
backlogged QP of a higher class is never overtaken by a lower class while it is away being
sent. The rings below L are still probed during the hold (*speculatively*): a speculative probe
that reaches the decision after the hold ended decides like any other unless a QP of a higher
ring may still be decided before it (a speculative or returning probe of a higher ring behind
it in the pipeline, a higher ring with QPs, a write or a push on its way to one: then it is
rolled back too), so the lower level is served a few clocks after the held QP's decision
instead of a pipeline later, in priority order. A probe of a higher ring behind it that was
selected after the hold ended does not roll it back (that QP was out of the round: the bound
below). The rollback shadow: a probe rolled back at the decision was not decided in its round,
and every probe of a lower ring selected while it was out of its ring (in the pipeline behind
it, or selected before its rollback write lands) rolls back too; so a higher-level QP whose
probe is rolled back (by the hold, or as a speculative probe) goes before every lower level.
Bound: a QP of level L is placed in ``out`` only if, in the same decision round, the head of
every non-empty ring above L was probed and found ineligible, or became non-empty after its
probe slot (at most the 11 probes in flight, i.e. at most one lower-level pop after a
higher-level QP reaches the head of its ring and is eligible).

Weighted round robin (rule 4): each QP has ``rem`` (pops left in its turn, per-QP RAM). A pop
starts a turn of ``max(weight, 1)`` pops when ``rem`` is 0 and counts one down. While a QP with
pops left in its turn is in ``out`` or away being sent, the hold also covers its own ring (no
other QP of that ring is placed in ``out``); pushed back with ``rem > 0`` it goes to the head of
its ring, so it gets ``weight`` consecutive pops while it stays eligible and comes back within
the hold; then it goes to the tail of its ring.

Work conservation (rule 5): with eligible QPs queued and ``out`` free, a decision round probes
each non-empty ring once (one probe per clock, a clock to clear the mask), and every ineligible
head moves to its ring's tail, so a queued eligible QP at position k of its ring is offered
within about (k + 1) * (rings + 1) + 12 clocks (+ ``HOLD`` after a pop whose QP does not come
back). ``out`` is refilled at the earliest 3 clocks after a pop: at most one pop every 4
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

A charge starts at the earliest 2 clocks after its ``sent`` (one charge every 4 clocks, ``sent``
queued in a 16-entry FIFO: ``sent`` must follow its pop within 64 clocks, with at most one
``sent`` per pop) and lands 7 clocks later in the QP bucket, 9 clocks later in the tenant
buckets; a charge that starts before the previous one wrote the same bucket continues from the
previous one's stamp and tokens (forwarded), so no charge is lost. A probe evaluates the
buckets with the charges landed so far (reading them 3 and 5 clocks after SELECT), and the
pipeline runs ahead of ``out`` (the next QP is decided while the previous one waits in ``out``
for the wire), so a QP or tenant can be found eligible again before the charge of its previous
packets landed: a bucket can be overdrawn by the packets popped between a probe and their
charges (a few packets for a tenant with several QPs: they leave in short bursts). Every charge
lands, so the long-run rates are exact (the tests measure 0.0x-0.8 %, the slope of a few tens
of packets).

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
turn (8); per tenant: configuration (88 bits), buckets (140 bits), guarantee flag (1 bit,
distributed RAM read asynchronously, a copy for the push and one for the probe). Multipliers: 6
products of 20 x 28 bits (3 in the probe, 3 in the charge unit), each 4 tiles of at most 18 x 18
bits (24 multipliers) from registers, their partial sums added in the next stage.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..fanout import on_global
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


def _tiles_eq(x, rate, dv):
    """Assignments of the four tiles (each at most 18 x 18 bits: one multiplier) of ``rate *
    dv`` (20 x 28 bits) to ``x``: ``rate * dv == Cat(x.ll, x.hh) + ((x.m1 + x.m2) << 18)``."""
    rl, rh, dl, dh = rate[:18], rate[18:], dv[:18], dv[18:]
    return [x.ll.eq(rl * dl), x.hh.eq(rh * dh), x.m1.eq(rl * dh), x.m2.eq(rh * dl)]


class TxScheduler(wiring.Component):
    HOLD = 16           # clocks a lower level waits for a popped QP to come back
    SENT_HOLD = 5       # ... or clocks after its ``sent``
    LATENCY = 12        # clocks from SELECT to ``pop.valid``

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
        # the tenant has a guarantee (guar_rate != 0): distributed RAM read asynchronously (as
        # the register of ``tenants`` bits it replaces, whose mux tree spread over the die: p6
        # below), one copy per read port
        m.submodules.t_g = t_g = Memory(shape=1, depth=self.tenants, init=[],
                                        attrs={"ram_style": "distributed"})
        m.submodules.ring = ring = Memory(shape=IB, depth=R * self.qps, init=[],
                                          attrs={"no_rw_check": 1})
        rate_w, attr_w, rem_w = q_rate.write_port(), q_attr.write_port(), q_rem.write_port()
        bkt_w, tcfg_w, tbkt_w = q_bkt.write_port(), t_cfg.write_port(), t_bkt.write_port()
        g_w = t_g.write_port()
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
        for who in ("push", "probe"):
            rp[who, "g"] = t_g.read_port(domain="comb")
        # The probe never reads the word a ring write hits (fronts are written below the head,
        # tails at the tail of a ring that is not full), so no bypass is needed, nor the
        # read-first behaviour of a synchronous read port: an asynchronous read port followed by
        # a flip-flop (``ring_q``, merged into the block RAM as its read register) reads the
        # same, and ``no_rw_check`` spares Yosys its collision emulation (write-address
        # flip-flops, an address compare and a multiplexer behind the RAM output, on the
        # p1 -> ring path: -2.15 ns routed on the ECPIX-5 core at e7458bf).
        ring_r = ring.read_port(domain="comb")
        ring_q = Signal(IB, reset_less=True)

        # ---------------------------------------------------------------- configuration
        m.d.comb += [
            g_w.addr.eq(self.tenant_cfg.p.tenant), g_w.en.eq(self.tenant_cfg.valid),
            g_w.data.eq(self.tenant_cfg.p.guar_rate != 0),
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

        # ---------------------------------------------------------------- ring pointers
        head = Array(Signal(IB + 1, name=f"head{r}") for r in range(R))
        tail = Array(Signal(IB + 1, name=f"tail{r}") for r in range(R))
        # ``nonempty[r]`` (head != tail) is a register, kept with the pointers below (cuts the
        # pointer compares off SELECT: head9 -> nonempty -> cand -> free -> the mask's enable,
        # -0.94 ns routed on the ECPIX-5 core at e7458bf).
        nonempty = Signal(R)

        # One ring write per clock, from a registered request: a push landing (pp3) first, else
        # the decision's write (registered in the clock of the decision).
        w = Signal(data.StructLayout({"v": 1, "front": 1, "ring": RB, "q": IB}))
        w_idx = Mux(w.front, head[w.ring] - 1, tail[w.ring])[:IB]
        m.d.comb += [ring_w.addr.eq(Cat(w_idx, w.ring)), ring_w.data.eq(w.q),
                     ring_w.en.eq(w.v)]

        # ---------------------------------------------------------------- push pipeline
        # pp0: read the QP's attributes and turn; pp1: they are out (registered); pp2: its ring
        # and whether it goes in front; pp3: the write request.
        pa, pr = rp["push", "attr"], rp["push", "rem"]
        pp1 = Signal(data.StructLayout({"v": 1, "q": IB}))
        h_act, h_lvl, h_qp = Signal(), Signal(RB), Signal(IB)
        h_popped, h_timer = Signal(), Signal(range(self.HOLD + 1))
        h_turn = Signal()               # the held QP has pops left in its turn: hold its ring
        # The held QP pushed back goes straight into the probe pipeline (at p3) instead of its
        # ring: its ring and whether it would have been at the head are known at its decision.
        # ``inj_hit`` (pp1 holds the held QP, popped, hold active) is a register, set from the
        # push and the hold's next state (below, with the hold): it gates ``adv_up``, the
        # enable of mask, head, p1 and p2 (cuts pp1.q == h_qp off that enable: -1.70 ns routed
        # on the ECPIX-5 core at ec958a5, 186 failing endpoints).
        inj_hit = Signal()
        pp2 = Signal(data.StructLayout({"v": 1, "q": IB, "tenant": TB, "tcls": 3, "front": 1}))
        pp3 = Signal(data.StructLayout({"v": 1, "q": IB, "ring": RB, "front": 1}))
        pg = rp["push", "g"]
        m.d.comb += [pa.addr.eq(self.push.p.qp), pr.addr.eq(self.push.p.qp),
                     pg.addr.eq(pp2.tenant)]
        m.d.sync += [
            pp1.v.eq(self.push.valid), pp1.q.eq(self.push.p.qp),
            pp2.v.eq(pp1.v & ~inj_hit), pp2.q.eq(pp1.q), pp2.tenant.eq(pa.data.tenant),
            pp2.tcls.eq(Mux(pa.data.tclass >= self.classes, self.classes - 1, pa.data.tclass)),
            pp2.front.eq(pr.data != 0),
            pp3.v.eq(pp2.v), pp3.q.eq(pp2.q), pp3.front.eq(pp2.front),
            pp3.ring.eq(Cat(pg.data, pp2.tcls[:CB])),
        ]

        # ---------------------------------------------------------------- probe pipeline
        # Every stage register moves with ``adv`` (the decision stage is not stalled); every
        # memory output is registered before it is used; each stage holds at most one carry
        # chain or one multiplier tile.
        # the pipeline from p3 on moves (d is not stalled): the decision below, on a global
        # net (it loads some 1,660 flip-flops of the probe stages; ``stellar.hdl.fanout``)
        adv_d = Signal()
        adv = on_global(m, "adv_net", adv_d)
        adv_up = Signal()               # SELECT, p1, p2 move (adv, no QP injected at p3)
        # ``ef``: when the held QP is pushed back, nothing is in or on its way to the ring it
        # was taken from (p1, p2, a push, a write): landing there, it would have been first.
        ij = Signal(data.StructLayout({"v": 1, "q": IB, "ef": 1}))  # injection waiting for adv
        inj_now, ef_hit, inj_ef = Signal(), Signal(), Signal()
        p1 = Signal(data.StructLayout({"v": 1, "ring": RB, "spec": 1, "sh": 1}))
        p2 = Signal(data.StructLayout({"v": 1, "ring": RB, "spec": 1, "sh": 1, "byp": 1,
                                        "bq": IB}))
        m.d.comb += [
            ef_hit.eq(~nonempty.bit_select(h_lvl, 1) & ~pp2.v
                      & ~(pp3.v & (pp3.ring == h_lvl)) & ~(w.v & (w.ring == h_lvl))
                      & ~(p1.v & (p1.ring == h_lvl)) & ~(p2.v & (p2.ring == h_lvl))),
            inj_now.eq(ij.v | inj_hit), inj_ef.eq(Mux(ij.v, ij.ef, ef_hit)),
            adv_up.eq(adv & ~inj_now),
        ]
        with m.If(adv):
            m.d.sync += ij.v.eq(0)
        with m.Else():
            m.d.sync += [ij.v.eq(inj_now), ij.q.eq(Mux(ij.v, ij.q, pp1.q)), ij.ef.eq(inj_ef)]
        qrec = {"v": 1, "ring": RB, "q": IB, "inj": 1, "ef": 1, "spec": 1, "sh": 1}
        tiles = {"ll": 36, "hh": 12, "m1": 28, "m2": 20}
        p3 = Signal(data.StructLayout(qrec))
        p4 = Signal(data.StructLayout(qrec))
        p5 = Signal(data.StructLayout({**qrec, "tenant": TB, "tclass": 3, "weight": 8, "rem": 8,
                                       "rate": RATE_BITS, "tok": signed(TW), "stamp": VW}))
        qv = {**qrec, "front": 1, "turn": 8, "unl": 1, "sat": 1}
        p6 = Signal(data.StructLayout({**qv, "rate": RATE_BITS, "tok": signed(TW), "dv": DW,
                                       "g": 1, "tcls": 3}))
        p7 = Signal(data.StructLayout({**qv, "tok": signed(TW), "x": data.StructLayout(tiles),
                                       "cfg": _tcfg_layout(), "tb": _tbkt_layout()}))
        tb_rec = data.StructLayout({"on": 1, "tok": signed(TW), "sat": 1, "dv": DW,
                                    "rate": RATE_BITS})
        p8 = Signal(data.StructLayout({**qv, "mid": 29, "t2": signed(TW + 14),
                                       "cap": tb_rec, "guar": tb_rec}))
        tx_rec = data.StructLayout({"on": 1, "tok": signed(TW), "sat": 1,
                                    "x": data.StructLayout(tiles)})
        dq = {**qrec, "front": 1, "turn": 8, "ok": 1}
        p9 = Signal(data.StructLayout({**dq, "cap": tx_rec, "guar": tx_rec}))
        ty_rec = data.StructLayout({"on": 1, "sat": 1, "mid": 29, "t2": signed(TW + 14)})
        p10 = Signal(data.StructLayout({**dq, "cap": ty_rec, "guar": ty_rec}))
        d = Signal(data.StructLayout({**dq, "cap_ok": 1, "under": 1, "below": 1, "own": 1}))

        def carry(dst, src, *names):
            m.d.sync += [dst[n].eq(src[n]) for n in names]

        # SELECT: the highest-level ring with QPs that is neither masked nor being read by p1
        # (its head moves at the end of that clock). A held ring is probed too (speculatively,
        # ``spec``): while the hold lasts its probe is rolled back at the decision, but the
        # probes behind the held QP decide as soon as the hold ends.
        mask = Signal(R)
        # ``held`` (h_act & every ring below h_lvl, and h_lvl itself when h_turn) and ``pend``
        # (p1.v & the one-hot of p1.ring) are registers, set with the hold and with p1 (below):
        # no decoding of h_lvl or p1.ring in front of ``free`` and the mask's enable.
        held = Signal(R)
        pend = Signal(R)
        # Only p1.ring takes the selected ring's index ``sel_r`` (a priority encoder): the
        # mask takes it as a one-hot (``top``, the highest candidate), p1.spec, p1.sh and ``hi``
        # compare ``cand`` with masks decoded from registers (sel_r < x: no candidate >= x;
        # sel_r is held: no candidate is free, ``held`` being every ring up to a level). Cuts
        # head -> cand -> sel_r -> decode / bit select -> mask / p1.sh / p1.spec / hi (9.6 to
        # 10.4 ns out of context at ec958a5; the logic behind the routed path into the mask's
        # enable, -1.70 ns on the ECPIX-5 core at ec958a5, with inj_hit above).
        cand = Signal(R)
        m.d.comb += cand.eq(nonempty & ~mask & ~pend)
        top = Signal(R)
        m.d.comb += top.eq(Cat(cand[r] & ~cand[r + 1:].any() if r < R - 1 else cand[r]
                               for r in range(R)))
        sel_r = Signal(RB)
        for r in range(R):                      # last assignment wins: highest ring
            with m.If(cand[r]):
                m.d.comb += sel_r.eq(r)
        free = Signal()                         # a candidate is not held (sel_r is not)
        m.d.comb += free.eq((cand & ~held).any())

        def sel_below(lvl):             # sel_r < lvl (when cand.any())
            return ~(cand & Cat(lvl <= r for r in range(R))).any()

        def sel_above(lvl):             # sel_r > lvl (and cand.any())
            return (cand & Cat(lvl < r for r in range(R))).any()
        sel_go = Signal()
        m.d.comb += sel_go.eq(adv_up & cand.any())
        with m.If(adv_up):
            m.d.sync += [p1.v.eq(cand.any()), p1.ring.eq(sel_r), p1.spec.eq(~free),
                         pend.eq(top)]

        # p1: read the head of the selected ring (its pointer moves at the end of the clock).
        # A front write to that ring in the same clock puts its QP before the word read: the
        # probe takes that QP instead (bypass), the word read stays at the head.
        m.d.comb += ring_r.addr.eq(Cat(head[p1.ring][:IB], p1.ring))
        with m.If(adv_up):
            m.d.sync += ring_q.eq(ring_r.data)
        with m.If(adv_up):
            carry(p2, p1, "v", "ring", "spec")
            m.d.sync += [p2.byp.eq(w.v & w.front & (w.ring == p1.ring)), p2.bq.eq(w.q)]

        # p2: the QP index is out of the ring RAM (or an injected QP takes p3).
        with m.If(adv):
            with m.If(inj_now):
                m.d.sync += [p3.v.eq(1), p3.inj.eq(1), p3.spec.eq(0),
                             p3.q.eq(Mux(ij.v, ij.q, pp1.q)),
                             p3.ring.eq(h_lvl), p3.ef.eq(inj_ef)]
            with m.Else():
                carry(p3, p2, "v", "ring", "spec")
                m.d.sync += [p3.inj.eq(0), p3.q.eq(Mux(p2.byp, p2.bq, ring_q))]

        # p3: read the QP's state.
        for key in ("attr", "rem", "rate", "bkt"):
            m.d.comb += [rp["probe", key].addr.eq(p3.q), rp["probe", key].en.eq(adv)]
        with m.If(adv):
            carry(p4, p3, "v", "ring", "q", "inj", "ef", "spec")

        # p4: the QP's state is out.
        pa4, pb4 = rp["probe", "attr"].data, rp["probe", "bkt"].data
        with m.If(adv):
            carry(p5, p4, "v", "ring", "q", "inj", "ef", "spec")
            m.d.sync += [p5.tenant.eq(pa4.tenant), p5.tclass.eq(pa4.tclass),
                         p5.weight.eq(pa4.weight),
                         p5.rem.eq(rp["probe", "rem"].data), p5.rate.eq(rp["probe", "rate"].data),
                         p5.tok.eq(pb4.tok), p5.stamp.eq(pb4.stamp)]

        # p5: read the tenant's state; the QP pacer's elapsed rate clock; the turn a pop gives;
        # the tenant's guarantee flag and the class (an injected QP's ring, set at p6).
        for key in ("tcfg", "tbkt"):
            m.d.comb += [rp["probe", key].addr.eq(p5.tenant), rp["probe", key].en.eq(adv)]
        m.d.comb += rp["probe", "g"].addr.eq(p5.tenant)
        sat5, dv5 = _elapsed(vnow, p5.stamp)
        with m.If(adv):
            carry(p6, p5, "v", "ring", "q", "inj", "ef", "spec", "rate", "tok")
            m.d.sync += [
                p6.turn.eq(Mux(p5.rem != 0, p5.rem, Mux(p5.weight == 0, 1, p5.weight))),
                p6.unl.eq(p5.rate == RATE_UNLIMITED), p6.sat.eq(sat5), p6.dv.eq(dv5),
                p6.front.eq(p5.rem != 0),
                p6.g.eq(rp["probe", "g"].data),
                p6.tcls.eq(Mux(p5.tclass >= self.classes, self.classes - 1, p5.tclass)),
            ]

        # p6: the tenant's state is out; the QP pacer's product tiles. An injected QP's ring
        # (``ring6``; p6.ring is still the ring it was taken from) and whether it would have
        # been first there, from the flag registered at p5 (read from t_g). Cuts p5.tenant ->
        # mux over a register of ``tenants`` flags -> ring compare -> p6.ring / p6.ef: -3.34 ns
        # routed on the ECPIX-5 core at ec958a5, the worst path of the core.
        # ``higher`` below takes ring6 for p6.
        ring6 = Cat(p6.g, p6.tcls[:CB])
        with m.If(adv):
            carry(p7, p6, "v", "q", "inj", "spec", "front", "turn", "unl", "sat", "tok")
            m.d.sync += [p7.ring.eq(Mux(p6.inj, ring6, p6.ring)),
                         p7.ef.eq(p6.ef & (ring6 == p6.ring))]
            m.d.sync += [p7.cfg.eq(rp["probe", "tcfg"].data), p7.tb.eq(rp["probe", "tbkt"].data)]
            m.d.sync += _tiles_eq(p7.x, p6.rate, p6.dv)

        # p7: the tenant buckets' elapsed rate clocks; the QP product's partial sums.
        with m.If(adv):
            carry(p8, p7, "v", "ring", "q", "inj", "ef", "spec", "front", "turn", "unl", "sat")
            m.d.sync += [p8.mid.eq(p7.x.m1 + p7.x.m2), p8.t2.eq(p7.tok + Cat(p7.x.ll, p7.x.hh))]
            for name, rate in (("cap", p7.cfg.cap_rate), ("guar", p7.cfg.guar_rate)):
                sat, dv = _elapsed(vnow, p7.tb[name].stamp)
                m.d.sync += [p8[name].on.eq(rate != 0), p8[name].tok.eq(p7.tb[name].tok),
                             p8[name].sat.eq(sat), p8[name].dv.eq(dv), p8[name].rate.eq(rate)]

        # p8: the QP pacer's verdict; the tenant buckets' product tiles.
        with m.If(adv):
            carry(p9, p8, "v", "ring", "q", "inj", "ef", "spec", "front", "turn")
            m.d.sync += p9.ok.eq(p8.unl | p8.sat | (p8.t2 + (p8.mid << 18) >= 0))
            for name in ("cap", "guar"):
                b = p8[name]
                m.d.sync += [p9[name].on.eq(b.on), p9[name].tok.eq(b.tok),
                             p9[name].sat.eq(b.sat)]
                m.d.sync += _tiles_eq(p9[name].x, b.rate, b.dv)

        # p9: the tenant products' partial sums.
        with m.If(adv):
            carry(p10, p9, "v", "ring", "q", "inj", "ef", "spec", "front", "turn", "ok")
            for name in ("cap", "guar"):
                b = p9[name]
                m.d.sync += [p10[name].on.eq(b.on), p10[name].sat.eq(b.sat),
                             p10[name].mid.eq(b.x.m1 + b.x.m2),
                             p10[name].t2.eq(b.tok + Cat(b.x.ll, b.x.hh))]

        # p10: the tenant verdicts.
        def allows(b):
            return b.sat | (b.t2 + (b.mid << 18) >= 0)
        with m.If(adv):
            carry(d, p10, "v", "ring", "q", "inj", "ef", "spec", "front", "turn", "ok")
            m.d.sync += [d.cap_ok.eq(~p10.cap.on | allows(p10.cap)),
                         d.under.eq(p10.guar.on & allows(p10.guar))]

        # d: decide, from registered verdicts.
        out_v, out_qp, out_rem = Signal(), Signal(IB), Signal(8)
        since = Signal(2, init=3)       # clocks since the last pop (saturating)
        # An injected QP decides as if it had landed in its ring: at its tail (rotated) unless
        # it goes in front or its ring is empty; its own hold does not roll it back. ``d.below``
        # (its ring is held while the hold lasts) and ``d.own`` (it is the held QP) are
        # registered as the probe enters d, from the hold it will see (a new one if ``place``).
        # A speculative probe (its ring was held when it was selected) also rolls back when a
        # QP of a higher ring may still be decided before it (``hi``, registered): a
        # speculative or injected probe behind it, a higher ring with QPs, or a QP on its way to
        # a higher ring (a write, a push); the hold ended, but the QPs above it go first. (A
        # probe of a higher ring ahead of it that rolls back shadows it, ``sh`` below; a
        # non-speculative one behind it was selected after the hold ended: a later round.)
        hi = Signal()
        behind = (p1, p2, p3, p4, p5, p6, p7, p8, p9)

        def above(s, lvl):              # the ring of probe s is above lvl
            if s is p6:
                return Mux(p6.inj, ring6 > lvl, p6.ring > lvl)
            return s.ring > lvl

        def higher(lvl):
            return (Cat(s.v & (s.spec | s.inj) & above(s, lvl) for s in behind[2:]).any()
                    | Cat(s.v & s.spec & (s.ring > lvl) for s in behind[:2]).any()
                    | Cat(nonempty[r] & (lvl < r) for r in range(R)).any()
                    | (w.v & (w.ring > lvl)) | (pp3.v & (pp3.ring > lvl)) | pp2.v
                    | (pp1.v & ~inj_hit))
        hi_adv = (higher(p10.ring) | (~free & sel_above(p10.ring))
                  | (inj_now & (h_lvl > p10.ring)))
        hi_stay = higher(d.ring) | (p10.v & (p10.spec | p10.inj) & (p10.ring > d.ring))
        m.d.sync += hi.eq(Mux(adv, hi_adv, hi_stay))
        rollback = (h_act & ~d.own & d.below) | (d.spec & hi) | d.sh
        first = ~d.inj | d.front | d.ef
        eligible = d.ok & d.cap_ok & first
        act_out = Signal()
        act_rot = Signal()
        act_move = Signal()
        act_rb = Signal()
        m.d.comb += [
            act_rb.eq(d.v & rollback),
            act_rot.eq(d.v & ~rollback & ~eligible),
            act_move.eq(d.v & ~rollback & eligible & d.ring[0] & ~d.under),
            act_out.eq(d.v & ~rollback & eligible & ~(d.ring[0] & ~d.under)),
        ]
        needs_wr = act_rb | act_rot | act_move
        out_free = ~out_v & (since >= 2)
        place = Signal()
        m.d.comb += [
            adv_d.eq(~(act_out & ~out_free) & ~(needs_wr & pp3.v)),
            place.eq(act_out & out_free),
            self.stall_pacer.eq(act_rot & ~d.ok & adv),
            self.stall_tenant.eq(act_rot & d.ok & ~d.cap_ok & adv),
        ]

        # The rollback shadow: a QP rolled back at d was not decided in this round, and the
        # probes behind it were selected while it was out of its ring (it is back in its ring
        # 2 clocks after its rollback). Every probe of a lower ring already selected then
        # (p1 ... p10, and SELECT until the rollback write lands) is shadowed (``sh``) and rolls
        # back too, so a lower level never overtakes a higher-level QP that was rolled back.
        def shadowed(s, inj=True):
            hit = act_rb & (s.ring < d.ring)
            return s.sh | ((hit & ~s.inj) if inj else hit)
        with m.If(adv_up):          # (p1.sh of an empty slot, p1.v = 0, does not matter)
            m.d.sync += p1.sh.eq((act_rb & sel_below(d.ring))
                                 | (w.v & w.front & sel_below(w.ring)))
            m.d.sync += p2.sh.eq(shadowed(p1, inj=False))
        with m.Else():
            m.d.sync += [p1.sh.eq(shadowed(p1, inj=False)), p2.sh.eq(shadowed(p2, inj=False))]
        with m.If(adv):
            m.d.sync += p3.sh.eq(Mux(inj_now, 0, shadowed(p2, inj=False)))
            for dst, src in ((p4, p3), (p5, p4), (p6, p5), (p7, p6), (p8, p7), (p9, p8),
                             (p10, p9), (d, p10)):
                m.d.sync += dst.sh.eq(shadowed(src))
        with m.Else():
            for s in (p3, p4, p5, p6, p7, p8, p9, p10):
                m.d.sync += s.sh.eq(shadowed(s))

        def below(ring, lvl, turn):
            return (ring < lvl) | ((ring == lvl) & turn)
        with m.If(adv):
            m.d.sync += [
                d.below.eq(Mux(place, below(p10.ring, d.ring, d.turn != 1),
                               below(p10.ring, h_lvl, h_turn))),
                d.own.eq(~place & p10.inj & (p10.q == h_qp)),
            ]

        # Ring write requests.
        with m.If(pp3.v):
            m.d.sync += [w.v.eq(1), w.ring.eq(pp3.ring), w.q.eq(pp3.q), w.front.eq(pp3.front)]
        with m.Elif(needs_wr):
            m.d.sync += [w.v.eq(1), w.q.eq(d.q), w.front.eq(act_rb),
                         w.ring.eq(Mux(act_move, Cat(Const(0, 1), d.ring[1:]), d.ring))]
        with m.Else():
            m.d.sync += w.v.eq(0)
        for r in range(R):
            inc = p1.v & adv_up & (p1.ring == r)
            dec = w.v & w.front & (w.ring == r)
            push_t = w.v & ~w.front & (w.ring == r)
            m.d.sync += head[r].eq(head[r] + inc - dec)
            with m.If(push_t):
                m.d.sync += tail[r].eq(tail[r] + 1)
            # the ring holds tail - head QPs: a write makes it non-empty; a probe read alone
            # (head + 1) empties it when it held one (with a write, the count does not drop)
            m.d.sync += nonempty[r].eq(dec | push_t
                                       | (nonempty[r] & ~(inc & ((head[r] + 1)[:IB + 1] == tail[r]))))

        # The decision round's mask (a speculative probe does not count: its ring is probed
        # again once the hold ends).
        onehot = Signal(R)
        m.d.comb += onehot.eq(Mux(sel_go & free, top, 0))
        with m.If(place):
            m.d.sync += mask.eq(onehot)
        with m.Elif(~free):
            m.d.sync += mask.eq(0)
        with m.Elif(sel_go):
            m.d.sync += mask.eq(mask | onehot)

        # out, pop, and the turn of the popped QP.
        popped = Signal()
        m.d.comb += [
            self.pop.valid.eq(out_v), self.pop.p.qp.eq(out_qp),
            popped.eq(out_v & self.pop.ready),
            self.pops.eq(popped),
            rem_w.addr.eq(out_qp), rem_w.data.eq(out_rem), rem_w.en.eq(popped),
        ]
        with m.If(place):
            m.d.sync += [out_v.eq(1), out_qp.eq(d.q), out_rem.eq(d.turn - 1)]
        with m.Elif(popped):
            m.d.sync += out_v.eq(0)
        with m.If(popped):
            m.d.sync += since.eq(0)
        with m.Elif(since != 3):
            m.d.sync += since.eq(since + 1)

        # The hold: lower levels wait while the QP in out is away. Once the held QP is back (in
        # the pipeline) the timer stops: the hold ends when it is placed again (a new hold) or
        # written to a ring (it is in its ring before any lower probe decides).
        h_back, h_end = Signal(), Signal()
        m.d.comb += h_end.eq((w.v & (w.q == h_qp)) | ((h_timer == 0) & ~h_back & ~inj_hit))
        with m.If(place):
            m.d.sync += [h_act.eq(1), h_lvl.eq(d.ring), h_qp.eq(d.q), h_popped.eq(0),
                         h_back.eq(0), h_timer.eq(self.HOLD), h_turn.eq(d.turn != 1),
                         held.eq(Cat((d.ring > r) | ((d.ring == r) & (d.turn != 1))
                                     for r in range(R)))]
        with m.Elif(h_act & h_popped):
            with m.If(inj_hit):
                m.d.sync += h_back.eq(1)
            with m.If(h_end):
                m.d.sync += [h_act.eq(0), held.eq(0)]
            with m.Elif(self.sent.valid & (self.sent.p.qp == h_qp) & (h_timer > self.SENT_HOLD)):
                m.d.sync += h_timer.eq(self.SENT_HOLD)
            with m.Elif(h_timer != 0):
                m.d.sync += h_timer.eq(h_timer - 1)
        with m.If(popped):
            m.d.sync += h_popped.eq(1)
        # inj_hit next clock: pp1 then holds this push; without ``place`` (a new hold, not yet
        # popped: no hit; ``place`` and ``popped`` exclude each other) h_qp stays, h_popped
        # becomes h_popped | popped and h_act stays unless the hold ends (above).
        m.d.sync += inj_hit.eq(self.push.valid & (self.push.p.qp == h_qp) & ~place
                               & h_act & ~(h_popped & h_end) & (h_popped | popped))

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
        """One ``sent`` every 4 clocks, pipelined (clocks from the start ``a``): a reads the
        QP's bucket, rate and tenant; a+2 the tenant's configuration and buckets; per bucket:
        elapsed rate clock, product tiles, partial sums, refill/charge terms, the written
        tokens (QP bucket written at a+7, tenant buckets at a+9). A charge starting before the
        previous one wrote the same bucket takes the previous charge's stamp (at its elapsed
        stage) and tokens (at its partial-sum stage) instead of the memory's."""
        IB, TB = self.index_bits, self.tenant_bits
        m.submodules.sentq = fifo = SyncFIFOBuffered(width=IB + 16, depth=16)
        m.d.comb += [fifo.w_data.eq(Cat(self.sent.p.qp, self.sent.p.bytes)),
                     fifo.w_en.eq(self.sent.valid)]
        ca, cr, cb = rp["charge", "attr"], rp["charge", "rate"], rp["charge", "bkt"]
        ctc, ctb = rp["charge", "tcfg"], rp["charge", "tbkt"]
        lo = -(1 << (TW - 1))

        cnt = Signal(2)                 # clocks since the last start, modulo 4
        start = Signal()
        m.d.comb += [fifo.r_en.eq(cnt == 0), start.eq(fifo.r_rdy & (cnt == 0))]
        with m.If(start | (cnt != 0)):
            m.d.sync += cnt.eq(cnt + 1)
        # v[k]: a charge is at clock a + k. A register set at a + k holds until a + k + 4 (the
        # next charge sets it then): values needed later are copied down the pipeline.
        v_r = Signal(9)
        m.d.sync += v_r.eq(Cat(start, v_r[:-1]))
        v = Cat(start, v_r)

        # a: read the QP's state.
        c_q, c_bytes, c_vs = Signal(IB), Signal(16), Signal(VW)
        for p in (ca, cr, cb):
            m.d.comb += [p.addr.eq(fifo.r_data[:IB]), p.en.eq(start)]
        with m.If(start):
            m.d.sync += [c_q.eq(fifo.r_data[:IB]), c_bytes.eq(fifo.r_data[IB:]), c_vs.eq(vnow)]
        # Copies for the later stages (a+5 .. a+8).
        c_q2, c_bytes2, c_vs2 = Signal(IB), Signal(16), Signal(VW)
        with m.If(v[4]):
            m.d.sync += [c_q2.eq(c_q), c_bytes2.eq(c_bytes), c_vs2.eq(c_vs)]
        bytes_u = Cat(Const(0, G), c_bytes2)

        # a+1: the QP's state is out.
        # Whether the previous charge wrote (or will write) this QP's bucket: compared here,
        # used at a+2 (``prev_q`` is set at the previous charge's a+2 <= a - 2).
        c_tenant, c_rate = Signal(TB), Signal(RATE_BITS)
        q_tok, q_stamp = Signal(signed(TW)), Signal(VW)
        prev_q, prev_q_ok, prev_vs = Signal(IB), Signal(), Signal(VW)
        fwq_pre = Signal()
        with m.If(v[1]):
            m.d.sync += [c_tenant.eq(ca.data.tenant), c_rate.eq(cr.data),
                         q_tok.eq(cb.data.tok), q_stamp.eq(cb.data.stamp),
                         fwq_pre.eq(prev_q_ok & (prev_q == c_q))]

        # a+2: read the tenant's state. QP bucket: the stamp (the previous charge's if it
        # wrote this bucket), its elapsed rate clock.
        fw_q = Signal()
        q_sat, q_dv, q_wr = Signal(), Signal(DW), Signal()
        for p in (ctc, ctb):
            m.d.comb += [p.addr.eq(c_tenant), p.en.eq(v[2])]
        sat, dv = _elapsed(c_vs, Mux(fwq_pre, prev_vs, q_stamp))
        with m.If(v[2]):
            m.d.sync += [q_sat.eq(sat), q_dv.eq(dv), fw_q.eq(fwq_pre),
                         prev_q.eq(c_q), prev_q_ok.eq(c_rate != RATE_UNLIMITED),
                         prev_vs.eq(c_vs)]

        # a+3: the tenant's state is out. QP bucket: product tiles. Whether the previous charge
        # had this tenant (used at a+4; ``prev_t`` is set at the previous charge's a+4 <= a).
        c_cfg, c_tb = Signal(_tcfg_layout()), Signal(_tbkt_layout())
        q_x = Signal(data.StructLayout({"ll": 36, "hh": 12, "m1": 28, "m2": 20}))
        prev_t, prev_t_ok = Signal(TB), Signal()
        fwt_pre = Signal()
        with m.If(v[3]):
            m.d.sync += [c_cfg.eq(ctc.data), c_tb.eq(ctb.data),
                         q_wr.eq(c_rate != RATE_UNLIMITED),
                         fwt_pre.eq(prev_t_ok & (prev_t == c_tenant))]
            m.d.sync += _tiles_eq(q_x, c_rate, q_dv)

        # a+4: tenant buckets: the stamps (the previous charge's if it had the same tenant),
        # elapsed rate clocks. QP bucket: partial sums, its tokens (forwarded or not).
        Wq_tok = Signal(signed(TW))
        q_mid, q_cat, q_tk = Signal(29), Signal(48), Signal(signed(TW))
        with m.If(v[4]):
            m.d.sync += [q_mid.eq(q_x.m1 + q_x.m2), q_cat.eq(Cat(q_x.ll, q_x.hh)),
                         q_tk.eq(Mux(fw_q, Wq_tok, q_tok))]
        names = ("cap", "guar")
        rates = {"cap": c_cfg.cap_rate, "guar": c_cfg.guar_rate}
        bursts = {"cap": c_cfg.cap_burst, "guar": c_cfg.guar_burst}
        prev_ts = {n: Signal(VW, name=f"prev_stamp_{n}") for n in names}
        fw_t = Signal()
        t_sat = {n: Signal(name=f"c_sat_{n}") for n in names}
        t_dv = {n: Signal(DW, name=f"c_dv_{n}") for n in names}
        t_stamp = {n: Signal(VW, name=f"c_stamp_{n}") for n in names}     # the stamp written
        with m.If(v[4]):
            m.d.sync += [fw_t.eq(fwt_pre), prev_t.eq(c_tenant), prev_t_ok.eq(1)]
            for n in names:
                st = Mux(fwt_pre, prev_ts[n], c_tb[n].stamp)
                sat, dv = _elapsed(c_vs, st)
                wst = Mux(rates[n] != 0, c_vs, st)
                m.d.sync += [t_sat[n].eq(sat), t_dv[n].eq(dv), t_stamp[n].eq(wst),
                             prev_ts[n].eq(wst)]

        # a+5: QP bucket: the product; the refill and charge terms. Tenant buckets: tiles.
        burst_q = Cat(Const(0, G), self.qp_burst)
        q_prod = Signal(48)
        q_a, q_bt, q_bb = Signal(signed(TW + 1)), Signal(signed(TW + 2)), Signal(signed(TW))
        t_x = {n: Signal(data.StructLayout({"ll": 36, "hh": 12, "m1": 28, "m2": 20}),
                         name=f"c_x_{n}") for n in names}
        c_tenant2 = Signal(TB)
        t_on = {n: Signal(name=f"c_on_{n}") for n in names}
        with m.If(v[5]):
            m.d.sync += c_tenant2.eq(c_tenant)
            m.d.sync += [t_on[n].eq(rates[n] != 0) for n in names]
            m.d.sync += [q_prod.eq(q_cat + (q_mid << 18)), q_a.eq(q_tk - bytes_u),
                         q_bt.eq(burst_q - q_tk), q_bb.eq(burst_q - bytes_u)]
            for n in names:
                m.d.sync += _tiles_eq(t_x[n], rates[n], t_dv[n])

        # a+6: QP bucket: full or not; the charged tokens unsaturated. Tenant buckets: partial
        # sums, their tokens (forwarded or not).
        q_full, q_n = Signal(), Signal(signed(TW + 14))
        Wt_tok = {n: Signal(signed(TW), name=f"w_tok_{n}") for n in names}
        t_mid = {n: Signal(29, name=f"c_mid_{n}") for n in names}
        t_cat = {n: Signal(48, name=f"c_cat_{n}") for n in names}
        t_tk = {n: Signal(signed(TW), name=f"c_tok_{n}") for n in names}
        with m.If(v[6]):
            m.d.sync += [q_full.eq(q_sat | (q_prod >= q_bt)), q_n.eq(q_a + q_prod)]
            for n in names:
                m.d.sync += [t_mid[n].eq(t_x[n].m1 + t_x[n].m2),
                             t_cat[n].eq(Cat(t_x[n].ll, t_x[n].hh)),
                             t_tk[n].eq(Mux(fw_t, Wt_tok[n], c_tb[n].tok))]

        # a+7: QP bucket written. Tenant buckets: the product, the refill and charge terms.
        q_new = Mux(q_full, q_bb, Mux(q_n < lo, lo, q_n))[:TW].as_signed()
        m.d.comb += [bkt_w.addr.eq(c_q2), bkt_w.en.eq(v[7] & q_wr),
                     bkt_w.data.tok.eq(q_new), bkt_w.data.stamp.eq(c_vs2)]
        t_prod = {n: Signal(48, name=f"c_prod_{n}") for n in names}
        t_a = {n: Signal(signed(TW + 1), name=f"c_a_{n}") for n in names}
        t_bt = {n: Signal(signed(TW + 2), name=f"c_bt_{n}") for n in names}
        t_bb = {n: Signal(signed(TW), name=f"c_bb_{n}") for n in names}
        # lo - (tokens - bytes): the charged tokens t_a + t_prod are below lo iff t_prod is
        # below this (compared at a+8 beside the sum, so a+9 is a choice only)
        t_lo = {n: Signal(signed(TW + 3), name=f"c_lo_{n}") for n in names}
        with m.If(v[7]):
            m.d.sync += Wq_tok.eq(q_new)
            for n in names:
                bu = Cat(Const(0, G), bursts[n])
                m.d.sync += [t_prod[n].eq(t_cat[n] + (t_mid[n] << 18)),
                             t_a[n].eq(t_tk[n] - bytes_u), t_bt[n].eq(bu - t_tk[n]),
                             t_bb[n].eq(bu - bytes_u), t_lo[n].eq(lo - (t_tk[n] - bytes_u))]

        # a+8: tenant buckets: the charged tokens unsaturated, and which of them, the burst, lo
        # or the old tokens a+9 writes (``t_sel``: 0 old (no rate), 1 burst - bytes (full),
        # 2 lo (saturated), 3 the charged tokens). Cuts the saturation compare off a+9 (into the
        # t_bkt block RAM's data and the forwarded tokens: -0.30 ns routed on the ECPIX-5 core
        # at e7458bf).
        t_sel = {n: Signal(2, name=f"c_sel_{n}") for n in names}
        t_n = {n: Signal(signed(TW + 14), name=f"c_n_{n}") for n in names}
        t_stamp2 = {n: Signal(VW, name=f"c_stamp2_{n}") for n in names}
        with m.If(v[8]):
            for n in names:
                full = t_sat[n] | (t_prod[n] >= t_bt[n])
                low = t_prod[n] < t_lo[n]
                m.d.sync += [t_stamp2[n].eq(t_stamp[n]),
                             t_sel[n].eq(Mux(~t_on[n], 0, Mux(full, 1, Mux(low, 2, 3)))),
                             t_n[n].eq(t_a[n] + t_prod[n])]

        # a+9: tenant buckets written (a bucket without a rate keeps its tokens and stamp). The
        # data is not gated by v[9] (the write enable is; the probe's bypass uses it only then).
        m.d.comb += [tbkt_w.addr.eq(c_tenant2), tbkt_w.en.eq(v[9])]
        for n in names:
            tok = Signal(signed(TW), name=f"c_new_{n}")
            with m.Switch(t_sel[n]):
                with m.Case(0):
                    m.d.comb += tok.eq(t_tk[n])
                with m.Case(1):
                    m.d.comb += tok.eq(t_bb[n])
                with m.Case(2):
                    m.d.comb += tok.eq(lo)
                with m.Case(3):
                    m.d.comb += tok.eq(t_n[n][:TW])
            m.d.comb += [tbkt_w.data[n].tok.eq(tok), tbkt_w.data[n].stamp.eq(t_stamp2[n])]
            with m.If(v[9]):
                m.d.sync += Wt_tok[n].eq(tok)
