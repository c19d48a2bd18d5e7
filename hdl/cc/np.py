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

Each CE event passes four stages, one clock each: issue (the RAM is addressed), read (the RAM word
is registered), decide (the interval test at the ``now_us`` of this clock, registered), enqueue
(queue the CNP, write ``last``; ``sent_inc`` / ``suppressed_inc`` pulse), so a CNP enters ``cnpq``
4 clocks after its CE event left ``ceq``. Events issue every 2 clocks (the next issues while this
one decides) and may name the same QP: the write is forwarded to it. ``last`` is one word per QP
in block RAM ({seen, time in us}); the time compare is modular (``now - last`` as unsigned 32
bits), exact for gaps below 2**32 us (71 minutes). CE events arrive at most one per received
packet (a packet takes at least 2 clocks of the 512-bit datapath), so ``ceq`` never overflows;
when ``cnpq`` is full (the TX side busy with 4 CNPs) a CNP is suppressed and counted like one
inside the interval.

The stages are set by ECP5 timing at 125 MHz (``python -m stellar.sim.timing np``): a block RAM's
clock-to-out (~5.6 ns) leaves room for nothing but a flip-flop behind it, and the interval test
(a 32-bit subtraction and a compare) for nothing else in its clock.

Ports
-----
ce            In   stream ``{qp}``: a RoCE packet marked CE arrived for local QP ``qp``
now_us        In   microseconds since reset (the congestion-control time base)
interval_us   In   minimum spacing of CNPs per QP
cnp           Out  stream ``{qp}``: send a CNP for QP ``qp`` (to the TX arbiter)
sent_inc      Out  one-clock pulse per CNP queued
suppressed_inc Out one-clock pulse per CE event that queued no CNP
"""

from amaranth.hdl import Module, Mux, Signal
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
        # An asynchronous read port and the flip-flop ``r_word`` behind it, which Yosys merges
        # into the block RAM's read register. Reading this way (not ``read_port()``) lets
        # ``no_rw_check`` tell Yosys that a read colliding with the write of the same clock may
        # return anything (this block never uses such a read: see the forwarding below), so it
        # adds no read-first emulation (a delayed write and a bypass multiplexer behind the RAM).
        m.submodules.last = last = Memory(shape=last_l, depth=self.qps, init=[],
                                          attrs={"no_rw_check": 1})
        rd, wr = last.read_port(domain="comb"), last.write_port()
        r_word = Signal(last_l, reset_less=True)
        m.d.sync += r_word.eq(rd.data)

        m.d.comb += [ceq.w_en.eq(self.ce.valid), ceq.w_data.eq(self.ce.payload.qp),
                     self.cnp.valid.eq(cnpq.r_rdy), self.cnp.payload.qp.eq(cnpq.r_data),
                     cnpq.r_en.eq(self.cnp.ready)]

        # Four stages, one event every 2 clocks:
        #   I (issue): the head of ceq addresses the RAM;
        #   R: the RAM word lands in a register (an ECP5 block RAM's clock-to-out is ~5.6 ns:
        #      nothing but a flip-flop fits behind it at 125 MHz);
        #   D: the interval test (a 32-bit subtraction and a compare), registered;
        #   E: queue the CNP and write ``last``, or count the suppression.
        # The next event issues while this one is in D or E, so its read does not see this
        # event's write when E comes in its R clock (the write lands after the read) or in its
        # issue clock (both at the same edge: a block RAM's cross-port collision is undefined).
        # Writes come at most every 2 clocks, so one of these at most: I and R register whether
        # E writes its QP, and D then takes the written time instead of the RAM's word.
        r_v, r_qp, r_fwd = Signal(), Signal(IB), Signal()
        d_v, d_qp, d_fwd = Signal(), Signal(IB), Signal()
        # No reset and no enable: a flip-flop right behind the RAM, nothing between them.
        d_ram = Signal(last_l, reset_less=True)
        e_v, e_qp, e_due, e_now = Signal(), Signal(IB), Signal(), Signal(32)
        issue = Signal()
        write = Signal()
        m.d.comb += [issue.eq(ceq.r_rdy & ~r_v), ceq.r_en.eq(issue), rd.addr.eq(ceq.r_data),
                     write.eq(e_v & e_due & cnpq.w_rdy)]
        m.d.sync += [r_v.eq(issue), d_v.eq(r_v), e_v.eq(d_v)]
        with m.If(issue):
            m.d.sync += [r_qp.eq(ceq.r_data), r_fwd.eq(write & (e_qp == ceq.r_data))]
        with m.If(r_v):
            m.d.sync += [d_qp.eq(r_qp), d_fwd.eq(r_fwd | (write & (e_qp == r_qp)))]
        m.d.sync += d_ram.eq(r_word)

        # Both interval tests, then the choice: the forwarded time (e_now still holds it) or the
        # RAM's (a forwarded word is always a seen one). Choosing after the compare keeps the
        # fan-out of d_fwd off the carry chains.
        def elapsed(t):
            return (self.now_us - t)[:32] >= self.interval_us
        with m.If(d_v):
            m.d.sync += [e_qp.eq(d_qp), e_now.eq(self.now_us),
                         e_due.eq(Mux(d_fwd, elapsed(e_now), ~d_ram.seen | elapsed(d_ram.t)))]
        m.d.comb += [
            cnpq.w_en.eq(write), cnpq.w_data.eq(e_qp), self.sent_inc.eq(write),
            self.suppressed_inc.eq(e_v & ~write),
            wr.en.eq(write), wr.addr.eq(e_qp), wr.data.seen.eq(1), wr.data.t.eq(e_now),
        ]
        return m
