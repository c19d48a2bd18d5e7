# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.9 (congestion notification, CNP); DCQCN (Zhu et al.,
#      SIGCOMM 2015) section 3 (notification point)
"""Notification point: ECN CE on a received RoCE packet -> a CNP back to the sending QP.

A switch that finds its queue long marks ECN-capable packets CE instead of dropping them. The
receiving NIC (this block, the *notification point*) tells the sender by a Congestion
Notification Packet (BTH opcode 0x81, BECN set, 16 reserved bytes, ICRC) addressed to the QP that
sent the marked packet — on RC that is the local QP's remote QPN, so the CNP is built from the
local QP's context like any other packet. At most one CNP per QP per ``interval_us`` (ConnectX
``min_time_between_cnps``, default 50 us): the sender reacts to the first, later marks inside the
interval carry no news::

    ce {qp} --> ceq (4) --> [read last[qp]] --> [elapsed >= interval?] --> cnp {qp} (cnpq, 4)
                                   ^                  | yes: last[qp] = now
                                   +------------------+

Each CE event takes 2 clocks (read, decide/write); the next event may name the same QP, the write
of the first lands before the second's read. ``last`` is one word per QP in block RAM ({seen,
time in us}); the time compare is modular (``now - last`` as unsigned 32 bits), exact for gaps
below 2**32 us (71 minutes). CE events arrive at most one per received packet (a packet takes at
least 2 clocks of the 512-bit datapath), so ``ceq`` never overflows; when ``cnpq`` is full (the
TX side busy with 4 CNPs) a CNP is suppressed and counted like one inside the interval.

Ports
-----
ce            In   stream ``{qp}``: a RoCE packet marked CE arrived for local QP ``qp``
now_us        In   microseconds since reset (the congestion-control time base)
interval_us   In   minimum spacing of CNPs per QP
cnp           Out  stream ``{qp}``: send a CNP for QP ``qp`` (to the TX arbiter)
sent_inc      Out  one-clock pulse per CNP queued
suppressed_inc Out one-clock pulse per CE event that queued no CNP
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["NotificationPoint"]


class NotificationPoint(wiring.Component):
    def __init__(self, qps):
        if qps < 2 or qps & (qps - 1):
            raise ValueError(f"qps must be a power of two >= 2, not {qps}")
        self.qps = qps
        self.index_bits = IB = (qps - 1).bit_length()
        qp_l = data.StructLayout({"qp": IB})
        super().__init__({
            "ce":             In(stream.Signature(qp_l, always_ready=True)),
            "now_us":         In(32),
            "interval_us":    In(16),
            "cnp":            Out(stream.Signature(qp_l)),
            "sent_inc":       Out(1),
            "suppressed_inc": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        IB = self.index_bits
        last_l = data.StructLayout({"seen": 1, "t": 32})
        m.submodules.ceq = ceq = SyncFIFOBuffered(width=IB, depth=4)
        m.submodules.cnpq = cnpq = SyncFIFOBuffered(width=IB, depth=4)
        m.submodules.last = last = Memory(shape=last_l, depth=self.qps, init=[])
        rd, wr = last.read_port(), last.write_port()

        m.d.comb += [ceq.w_en.eq(self.ce.valid), ceq.w_data.eq(self.ce.payload.qp),
                     self.cnp.valid.eq(cnpq.r_rdy), self.cnp.payload.qp.eq(cnpq.r_data),
                     cnpq.r_en.eq(self.cnp.ready)]

        qp = Signal(IB)
        word = Signal(last_l)
        m.d.comb += [rd.addr.eq(ceq.r_data), word.eq(rd.data)]
        with m.FSM():
            with m.State("IDLE"):
                with m.If(ceq.r_rdy):
                    # the read issued now (addr = head of ceq) is valid in DECIDE
                    m.d.comb += ceq.r_en.eq(1)
                    m.d.sync += qp.eq(ceq.r_data)
                    m.next = "DECIDE"
            with m.State("DECIDE"):
                due = Signal()
                m.d.comb += due.eq(~word.seen | ((self.now_us - word.t)[:32] >= self.interval_us))
                with m.If(due & cnpq.w_rdy):
                    m.d.comb += [
                        cnpq.w_en.eq(1), cnpq.w_data.eq(qp), self.sent_inc.eq(1),
                        wr.en.eq(1), wr.addr.eq(qp), wr.data.seen.eq(1), wr.data.t.eq(self.now_us),
                    ]
                with m.Else():
                    m.d.comb += self.suppressed_inc.eq(1)
                m.next = "IDLE"
        return m
