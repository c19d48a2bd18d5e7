# Ref: DCQCN (Zhu et al., SIGCOMM 2015); IBTA Vol 1 Annex A17.9 (RoCEv2 congestion control)
"""Congestion control and QoS of one NIC core: notification point, reaction point, TX scheduler.

The block sits beside the RC transport; the transport only tells it what happens (a request
packet queued for the wire, a QP with work) and asks it which QP sends next::

    rx_meta (tap) --CE?--> NotificationPoint --cnp {qp}--> (NicCore: CNP descriptor -> TxBuilder)
                  --CNP?-> ReactionPoint <--sent-- transport (request packets, new or resent)
    ctx_written ---------> ReactionPoint (INIT: cc_mode) ---rate {qp}---+
                 --------> TxScheduler attributes (tenant, class = sl, weight)
    transport sched_push -> TxScheduler (classes, WRR, QP pacers, tenant buckets) -> sched_pop
    CSR block ``cc`` -----> parameters, tenant buckets, class markings, counters, QP window

Conventions (the contract with the driver, ``stellar.host.qos``):

* Time: ``now_us`` counts microseconds, one per ``cc.us_cycles`` clocks; rates are Mb/s (bits per
  microsecond). ``cc.max_rate`` = 0 stands for the datapath's rate, data width x us_cycles.
* A host write of a QP context whose mask includes ``cc_mode`` or ``sq_psn`` (a QP set up or
  re-initialized) starts the QP's reaction point over (INIT: rate = max_rate) in its mode. Every
  context write refreshes the scheduler's copy of the QP's tenant, traffic class (``sl``) and
  weight.
* A reaction-point rate at or above max_rate — every QP in mode NONE, a DCQCN QP that recovered
  fully — reaches the pacer as "unlimited": the QP is then held only by its class and tenant.
* CE: a RoCE packet other than a CNP, for a local QP, with IP ECN = 0b11. CNP: BTH opcode 0x81.
* Bytes charged per request packet (pacers, tenant buckets, DCQCN byte counter): payload +
  ``cc.pace_overhead`` (82: the headers and the Ethernet framing on the wire). READ responses,
  ACKs and CNPs are not paced (the transport sends them at once).
* ``cnp_stamp`` / ``rate_stamp``: the cycle the reaction point took the last CNP, and the cycle
  the rate it computed for that QP reached the scheduler.

Ports
-----
rx_tap       In   ``rx_meta_layout``: the transport's ``rx_meta`` handshake (valid = taken)
ctx_written  In   host writes of QP contexts (``ctx_written_layout``)
sent         In   ``sent_layout``: request packets the transport queued for the wire
sched_push   In   ``{qp}``: the transport has work for QP qp (replaces its round-robin FIFO)
sched_pop    Out  ``{qp}``: the QP that sends next
cnp          Out  ``{qp}``: send a CNP for QP qp
tc_mark      Out  per traffic class DSCP/PCP marking (to ``TxBuilder.tc_mark``)
cnp_mark     Out  CNP marking (to ``TxBuilder.cnp_mark``)
csr          Out  the ``cc`` register block
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..csr import block_signature
from ..flow.fields import QP_CONTEXT, TENANT_BITS
from ..flow.rxflow import CORE_RECORD_FIELDS, rx_meta_layout
from ..regmap import CC_CLASSES, REGMAP, cc_config
from ..transport.engine import ctx_written_layout, sent_layout
from ..transport.formats import CNP_OPCODE
from ..transport.txbuild import marking_layout
from .np import NotificationPoint
from .rp import ReactionPoint
from .sched import TxScheduler
from .units import RATE_UNLIMITED

__all__ = ["CongestionControl"]

_FIELD_BIT = {f.name: i for i, f in enumerate(QP_CONTEXT.fields)}


class CongestionControl(wiring.Component):
    def __init__(self, data_width=64, *, qps=16, tenants=1 << TENANT_BITS,
                 record_fields=CORE_RECORD_FIELDS):
        self.data_width = data_width
        self.qps = qps
        self.tenants = tenants
        self.index_bits = IB = (qps - 1).bit_length()
        qp_l = data.StructLayout({"qp": IB})
        super().__init__({
            "rx_tap":      In(stream.Signature(rx_meta_layout(IB, record_fields), always_ready=True)),
            "ctx_written": In(stream.Signature(ctx_written_layout(IB), always_ready=True)),
            "sent":        In(stream.Signature(sent_layout(IB), always_ready=True)),
            "sched_push":  In(stream.Signature(qp_l, always_ready=True)),
            "sched_pop":   Out(stream.Signature(qp_l)),
            "cnp":         Out(stream.Signature(qp_l)),
            "tc_mark":     Out(data.ArrayLayout(marking_layout(), CC_CLASSES)),
            "cnp_mark":    Out(marking_layout()),
            "csr":         Out(block_signature(REGMAP.block("cc"))),
        })

    def elaborate(self, platform):
        m = Module()
        csr = self.csr
        IB = self.index_bits
        m.submodules.np = np_ = NotificationPoint(self.qps)
        m.submodules.rp = rp = ReactionPoint(self.qps)
        m.submodules.sched = sch = TxScheduler(self.qps, tenants=self.tenants, classes=CC_CLASSES)
        m.d.comb += csr.config.eq(cc_config(self.qps, self.tenants, CC_CLASSES))

        # ---------------------------------------------------------------- time base
        cycle = Signal(32)
        us_div = Signal(16)
        now_us = Signal(32)
        m.d.sync += cycle.eq(cycle + 1)
        with m.If(us_div + 1 >= csr.us_cycles):
            m.d.sync += [us_div.eq(0), now_us.eq(now_us + 1)]
        with m.Else():
            m.d.sync += us_div.eq(us_div + 1)
        m.d.comb += csr.cycle.eq(cycle)

        line_rate = Signal(20)
        m.d.sync += line_rate.eq(Mux(csr.max_rate != 0, csr.max_rate,
                                     (csr.us_cycles * self.data_width)[:20]))

        # ---------------------------------------------------------------- receive taps
        tap = self.rx_tap.payload
        rec = tap.rec
        ecn = Signal(2)
        m.d.comb += ecn.eq(Mux(rec.ipv6, rec.ipv6_ecn, rec.ipv4_ecn))
        is_cnp = Signal()
        m.d.comb += is_cnp.eq(tap.ann.roce & (rec.bth_opcode == CNP_OPCODE))
        ce = Signal()
        m.d.comb += ce.eq(self.rx_tap.valid & tap.ann.roce & ~is_cnp & (ecn == 0b11))
        m.d.comb += [
            np_.ce.valid.eq(ce), np_.ce.payload.qp.eq(tap.ann.qp),
            np_.now_us.eq(now_us), np_.interval_us.eq(csr.cnp_interval_us),
            csr.rx_ce_inc.eq(ce), csr.cnp_sent_inc.eq(np_.sent_inc),
            csr.cnp_suppressed_inc.eq(np_.suppressed_inc),
        ]
        wiring.connect(m, np_.cnp, wiring.flipped(self.cnp))

        cnp_in = Signal()
        m.d.comb += [
            cnp_in.eq(self.rx_tap.valid & is_cnp),
            rp.cnp.valid.eq(cnp_in), rp.cnp.payload.qp.eq(tap.ann.qp),
            csr.cnp_received_inc.eq(cnp_in),
        ]

        # ---------------------------------------------------------------- reaction point
        p = rp.params
        for name in ("min_rate", "ai_rate", "hai_rate", "gd", "min_dec_fac", "threshold",
                     "g_shift", "initial_alpha", "time_reset", "byte_reset", "alpha_period",
                     "fm_a", "fm_b", "fm_c", "fm_period", "fm_cnp_gain", "fm_trend_gain",
                     "fm_norm"):
            m.d.comb += getattr(p, name).eq(getattr(csr, name))
        m.d.comb += [p.max_rate.eq(line_rate), rp.now_us.eq(now_us)]

        cw = self.ctx_written
        init = Signal()
        m.d.comb += [
            init.eq(cw.valid & (cw.payload.mask[_FIELD_BIT["cc_mode"]]
                                | cw.payload.mask[_FIELD_BIT["sq_psn"]])),
            rp.init.valid.eq(init), rp.init.payload.qp.eq(cw.payload.index),
            rp.init.payload.mode.eq(cw.payload.ctx.cc_mode),
        ]
        charge = Signal(16)
        m.d.comb += charge.eq(self.sent.payload.bytes + csr.pace_overhead)
        m.d.comb += [
            rp.sent.valid.eq(self.sent.valid), rp.sent.payload.qp.eq(self.sent.payload.qp),
            rp.sent.payload.bytes.eq(charge), rp.sent.payload.inflight.eq(self.sent.payload.inflight),
        ]

        # QP window (the host reads a QP's reaction-point state)
        m.d.comb += rp.dbg_addr.eq(csr.qp_index[:IB])
        st = rp.dbg_data
        m.d.comb += [
            csr.qp_rate.eq(st.rc), csr.qp_target.eq(st.rt),
            csr.qp_alpha.eq(Mux(st.mode == 2, st.w, st.alpha)),
            csr.qp_flags.eq(st.mode | (st.active << 2) | (st.it << 8) | (st.ib << 16)),
        ]

        # ---------------------------------------------------------------- scheduler
        m.d.comb += [
            sch.rate.valid.eq(rp.rate.valid), sch.rate.payload.qp.eq(rp.rate.payload.qp),
            sch.rate.payload.rate.eq(Mux(rp.rate.payload.rate >= line_rate, RATE_UNLIMITED,
                                         rp.rate.payload.rate)),
            csr.rate_updates_inc.eq(rp.rate.valid),
            sch.attr.valid.eq(cw.valid), sch.attr.payload.qp.eq(cw.payload.index),
            sch.attr.payload.tenant.eq(cw.payload.ctx.tenant),
            sch.attr.payload.tclass.eq(cw.payload.ctx.sl),
            sch.attr.payload.weight.eq(cw.payload.ctx.weight),
            sch.sent.valid.eq(self.sent.valid), sch.sent.payload.qp.eq(self.sent.payload.qp),
            sch.sent.payload.bytes.eq(charge),
            sch.push.valid.eq(self.sched_push.valid), sch.push.payload.qp.eq(self.sched_push.payload.qp),
            sch.tenant_cfg.valid.eq(csr.tenant_command_stb & csr.tenant_command[0]),
            sch.tenant_cfg.payload.tenant.eq(csr.tenant_index),
            sch.tenant_cfg.payload.cap_rate.eq(csr.tenant_cap_rate),
            sch.tenant_cfg.payload.cap_burst.eq(csr.tenant_cap_burst),
            sch.tenant_cfg.payload.guar_rate.eq(csr.tenant_guar_rate),
            sch.tenant_cfg.payload.guar_burst.eq(csr.tenant_guar_burst),
            sch.qp_burst.eq(csr.qp_burst), sch.us_cycles.eq(csr.us_cycles),
            csr.stall_pacer_inc.eq(sch.stall_pacer), csr.stall_tenant_inc.eq(sch.stall_tenant),
            csr.sched_pops_inc.eq(self.sched_pop.valid & self.sched_pop.ready),
        ]
        wiring.connect(m, sch.pop, wiring.flipped(self.sched_pop))

        # ---------------------------------------------------------------- CNP-to-rate stamps
        watch = Signal(IB)
        watching = Signal()
        with m.If(cnp_in):
            m.d.sync += [csr.cnp_stamp.eq(cycle), watch.eq(tap.ann.qp), watching.eq(1)]
        with m.Elif(watching & rp.rate.valid & (rp.rate.payload.qp == watch)):
            m.d.sync += [csr.rate_stamp.eq(cycle), watching.eq(0)]

        # ---------------------------------------------------------------- markings
        for i in range(CC_CLASSES):
            tc = getattr(csr, f"tc{i}")
            m.d.comb += [self.tc_mark[i].dscp.eq(tc[0:6]), self.tc_mark[i].pcp.eq(tc[6:9]),
                         self.tc_mark[i].en.eq(tc[9])]
        m.d.comb += [self.cnp_mark.dscp.eq(csr.cnp_marking[0:6]),
                     self.cnp_mark.pcp.eq(csr.cnp_marking[8:11]), self.cnp_mark.en.eq(1)]
        return m
