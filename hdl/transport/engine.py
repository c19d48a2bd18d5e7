# Ref: IBTA Vol 1 ch. 9.7 (RC: requester and responder, PSNs, ACK/NAK, retries), 9.9 (errors),
#      10.8 (work and completion queues); Annex A17 (RoCEv2)
"""The RC transport engine: responder, requester and go-back-N retransmission.

One sequential event machine owns every per-QP transport state and handles one event at a time,
so no two decisions ever race on a QP (the QP context store forwards its own fields; the
transport's RAMs need no forwarding at all)::

   host ctx writes --> initq --+
   rx_meta (pipeline) ---------+--> [event machine] --> tx desc (data packets) ----+--> TxBuilder
   timeout events <- scanner --+     | per-QP RAMs:   --> pdq (gated by DMA writes) |
   wr (work requests) ---------+     | qs, sq, sqd,       +-> ACK/NAK desc --------+
   rr (receive requests) ------+     | rq, txc, timer     +-> READ jobs -> READ response expander
   sched_pop (next QP to send) +     |                    +-> cq (completions)
                                     +--> mover cmds: payload of rx -> DMA write / discard

An event takes 6 clocks (pick, address, load, check, check, decide: CHK1/CHK2 let the decision's
comparisons, differences and sums, registered from the QP state, the WQE and the event's input,
settle in two stages, and the responder's outcome in a third, registered in CHK2) plus 3 per
send-queue entry it walks to complete WQEs on an ACK (load, check, decide) and 2 per entry it
flushes on a fatal error; a response to a request of ours takes
2 more before it is acted on (RX_CHK1/RX_CHK2: its checks, and everything derived from the una it
leaves, are registered from the QP state, the WQE and the packet). The QP state word the deciding
clock computes is written to ``qs`` one clock later, in the IDLE clock that always follows, so the
next event's load reads it; likewise the entries it pushes to ``pdq``, the mover queue and the
invalidation queue land one clock after the decision. A decision that needs room in those queues
checks a registered copy of the room, one clock old: when it waits for a full queue to drain, it
goes one clock after the queue has room. A request packet waits for that room in CHK2, a response
in RX_CHK2 (the clock before the decision), the others where they decide. Packets of 4 KiB carry
64 beats at 512 bits, so the machine has time to spare at line rate.

Semantics (PSNs 24-bit, compared modulo 2**24; ``n`` = packets of a message = max(1, ceil(L/mtu))):

Responder, for a request with PSN p on a QP in RTR/RTS (else dropped):
- p == epsn: opcode sequence and payload length checked (NAK invalid request), memory-region
  failures from the flow pipeline (NAK remote access error), no receive WQE for a SEND or a
  WRITE with immediate (RNR NAK with the QP's min_rnr_timer), SEND longer than the receive buffer
  (NAK invalid request + LOC_LEN_ERR receive completion); else accepted: payload DMA-written
  (WRITE at the MR check's bus address, continuing on MIDDLE/LAST; SEND into the receive WQE),
  epsn += 1 (READ: += n), msn += 1 at LAST/ONLY/READ, ACK on AckReq or every ``ack_coalesce``
  packets, READ answered with READ responses from host memory, receive completions on SEND
  LAST/ONLY and WRITE-with-immediate.
- p behind epsn (duplicate): SEND/WRITE with AckReq re-ACKed with PSN epsn - 1, never re-written;
  READ re-executed from its own RETH.
- p ahead of epsn: one PSN-sequence NAK (PSN epsn) per gap (``nak_sent``), then silent drop until
  the expected PSN arrives. Every NAK sets ``nak_sent``.
ACKs, NAKs, READ responses and completions wait in ``pdq`` until every DMA write issued before
them has its AXI B response: an ACK or completion never overtakes the data it reports.

Requester, per QP: a ring of ``sq_depth`` WQEs (``sq``; inline payload in ``sqd``), ``una``
(oldest unacknowledged PSN), ``npsn`` (next new PSN), ``sq_cur``/``cur_off`` (next packet to
send). A QP with work is pushed (``sched_push``, once while it waits) to the TX scheduler
(``stellar.hdl.cc.sched``: traffic classes, round robin, pacers, tenant buckets), which hands
back the QP that sends next (``sched_pop``); each visit sends one packet if ``npsn - una <
window`` (reported on ``sent``) and pushes the QP back if it has more. AckReq on the last packet
of a message, on the packet that fills the window, and every ``2**ackreq_shift`` PSNs. ACKs
complete WQEs in order (3 clocks per WQE); an ACK covering a READ whose responses did not all
arrive, a PSN-sequence NAK, an ACK timeout, and the end of an RNR wait rewind the QP to ``una``
(go-back-N; the payload is read again from host memory). retry_cnt counts timeouts and sequence
NAKs without progress; rnr_retry counts RNR NAKs (7 = infinite). A remote error NAK or an
exhausted counter is fatal: the WQE completes with REM_INV_REQ_ERR / REM_ACCESS_ERR / REM_OP_ERR
/ RETRY_EXC_ERR / RNR_RETRY_EXC_ERR, every later WQE with WR_FLUSH_ERR, and the QP moves to
ERROR (``set_state``); other QPs are unaffected.

Timers: one RAM word per QP (armed, RNR, deadline in ticks of ``tick_cycles`` clocks: 4.096 us
at the reset value and 250 MHz); the scanner reads one QP per clock and queues expiries, which
the machine re-validates against its own read of the word, so a scan that races a write can only
cost a spurious (ignored) or one-round-late event. The local ACK timeout is 2**timeout + 1 ticks
from the first unacknowledged packet or the last progress; timeout 0 never arms.

Ports
-----
rx_meta     In   stream of ``rx_meta_layout`` from ``RxFlowPipeline.o_meta``
rx          In   payload beats of those packets (``RxFlowPipeline.o``)
wb          Out  QP-context write-back (``QpContextStore.wb``), in the clock ``rx_meta`` is taken
ctx_written In   host writes of QP contexts (index, mask, ctx as written)
set_state   Out  stream ``{index, state}``: QP state changes the transport makes (to ERROR)
wr          In   stream of ``WORK_REQUEST`` (``stellar.hdl.transport.formats``)
rr          In   stream of ``RECV_REQUEST``
cq          Out  stream of ``COMPLETION``
tx          Out  stream of ``tx_desc_layout``: packets to send (to ``TxBuilder.desc``)
sched_push  Out  ``{qp}``, always ready: QP qp has packets to send (at most once while queued),
                 one clock after the deciding state
sched_pop   In   ``{qp}``: the QP to send the next packet of
sent        Out  ``sent_layout``, always ready: a request packet queued for the wire (payload bytes,
                 PSNs in flight after it), in the clock of its push-back
txc_addr, txc_en, txc_data
            In/Out  the builder's read port into the transport's copy of the QP contexts
dma_wcmd    Out  stream ``{addr, len}``: DMA writes of received payload
dma_wdata   Out  their beats
dma_wdone   In   one pulse per completed DMA write command (in order)
sq_retire   Out  ``{qp}``, always ready: one pulse per send-queue credit the QP gets back: a WQE
                 left the on-chip send queue (completed by an ACK or READ response, or flushed
                 after a fatal error), or a work request was taken without entering it (rejected:
                 queue full, QP not in RTS, bad opcode, inline too long, QP in error).
rq_retire   Out  ``{qp}``, always ready: likewise for the receive queue: a receive WQE consumed
                 (SEND last/only, WRITE with immediate, SEND too long for it), or a receive
                 request rejected (queue full, QP in RESET or ERROR).
                 A feeder that posts at most ``sq_depth`` (``rq_depth``) requests per QP more
                 than it has seen pulses for never posts into a full queue. Each pulse comes from
                 one state of the event machine, so there is at most one of each per clock. A
                 host context write that re-initializes the queue (sq_psn / epsn, or state RESET
                 / INIT) empties it without pulses: the feeder's credits are reset with its own
                 queue configuration (``stellar.hdl.hostif.queues``).
csr         Out  the ``transport`` register block (``csr.block_signature``)

Parameters: ``data_width``, ``qps`` (QP indexes, a power of two), ``sq_depth``, ``rq_depth``
(per QP, powers of two). The send and receive queues are on chip here; the host-interface work
moves them into host memory behind a WQE fetcher.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..csr import block_signature
from ..flow.fields import QP_CONTEXT, QpState
from ..flow.layouts import qp_context_layout, struct_layout
from ..flow.rxflow import CORE_RECORD_FIELDS, CORE_WB_FIELDS, rx_meta_layout
from ..net.deparser import frames_span_two_beats
from ..net.layout import beat_layout
from ..regmap import GIDS, REGMAP, transport_config
from .formats import (
    CNP_OPCODE,
    COMPLETION,
    INLINE_MAX,
    RECV_REQUEST,
    WORK_REQUEST,
    NakCode,
    RcOpcode,
    Syndrome,
    WcOpcode,
    WcStatus,
    WrOpcode,
    ack_syndrome,
    nak_syndrome,
    rnr_syndrome,
    rnr_ticks,
)
from .txbuild import PayloadSrc, gid_layout, tx_desc_layout

__all__ = ["RcTransport", "ctx_written_layout", "sent_layout", "set_state_layout"]

O = RcOpcode


def ctx_written_layout(index_bits):
    return data.StructLayout({"index": index_bits, "mask": len(QP_CONTEXT.fields),
                              "ctx": qp_context_layout()})


def sent_layout(index_bits):
    """A request packet the requester queued for the wire (new or resent): what the TX scheduler
    charges to the QP's and tenant's token buckets and the reaction point counts."""
    return data.StructLayout({"qp": index_bits, "bytes": 16, "inflight": 16})


def set_state_layout(index_bits):
    return data.StructLayout({"index": index_bits, "state": 3})


def _regs(prefix, widths):
    """A namespace of registers ``<prefix>_<name>``, one per ``(name, width)`` of ``widths``
    (the event machine's per-clock check stages)."""
    return SimpleNamespace(**{name: Signal(width, name=f"{prefix}_{name}") for name, width in widths})


class _Ev(enum.Enum, shape=3):
    INIT = 0
    RX = 1
    TIMEOUT = 2
    SEND = 3
    POST = 4
    RECV = 5


class _InMsg(enum.Enum, shape=2):
    NONE = 0
    SEND = 1
    WRITE = 2


class RcTransport(wiring.Component):
    def __init__(self, data_width=64, *, qps=16, sq_depth=16, rq_depth=16,
                 record_fields=CORE_RECORD_FIELDS):
        for name, v in (("qps", qps), ("sq_depth", sq_depth), ("rq_depth", rq_depth)):
            if v < 2 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 2, not {v}")
        self.data_width = data_width
        self.qps = qps
        self.sq_depth = sq_depth
        self.rq_depth = rq_depth
        self.index_bits = IB = (qps - 1).bit_length()
        beat = beat_layout(data_width)
        super().__init__({
            "rx_meta":     In(stream.Signature(rx_meta_layout(IB, record_fields))),
            "rx":          In(stream.Signature(beat)),
            "wb":          Out(stream.Signature(data.StructLayout(
                               {"index": IB, "ctx": qp_context_layout()}), always_ready=True)),
            "ctx_written": In(stream.Signature(ctx_written_layout(IB), always_ready=True)),
            "set_state":   Out(stream.Signature(set_state_layout(IB))),
            "mr_invalidate": Out(stream.Signature(data.StructLayout(
                               {"key": 32, "tenant": 8, "pd": 16}))),
            "wr":          In(stream.Signature(struct_layout(WORK_REQUEST))),
            "rr":          In(stream.Signature(struct_layout(RECV_REQUEST))),
            "cq":          Out(stream.Signature(struct_layout(COMPLETION))),
            "tx":          Out(stream.Signature(tx_desc_layout(IB))),
            "sched_push":  Out(stream.Signature(data.StructLayout({"qp": IB}), always_ready=True)),
            "sched_pop":   In(stream.Signature(data.StructLayout({"qp": IB}))),
            "sent":        Out(stream.Signature(sent_layout(IB), always_ready=True)),
            "txc_addr":    In(IB),
            "txc_en":      In(1),
            "txc_data":    Out(qp_context_layout()),
            "gid":         Out(data.ArrayLayout(gid_layout(), GIDS)),
            "dma_wcmd":    Out(stream.Signature(data.StructLayout({"addr": 64, "len": 16}))),
            "dma_wdata":   Out(stream.Signature(beat)),
            "dma_wdone":   In(1),
            "sq_retire":   Out(stream.Signature(data.StructLayout({"qp": IB}), always_ready=True)),
            "rq_retire":   Out(stream.Signature(data.StructLayout({"qp": IB}), always_ready=True)),
            "csr":         Out(block_signature(REGMAP.block("transport"))),
        })

    # ------------------------------------------------------------------ layouts
    def _qs_layout(self):
        S = self.sq_depth.bit_length()      # ring pointers carry one wrap bit
        R = self.rq_depth.bit_length()
        return data.StructLayout({
            "sq_head": S, "sq_tail": S, "sq_cur": S, "cur_off": 32,
            "npsn": 24, "una": 24, "retry_left": 3, "rnr_left": 3,
            "hpsn": 24,     # one past the highest PSN ever sent: ACKs up to it are valid
            "err": 1, "rnr_wait": 1, "queued": 1,
            "rq_head": R, "rq_tail": R, "rq_off": 32,
            "lost_rd": 1,   # rewound for a READ whose responses were lost; cleared by progress
            "nak_sent": 1, "in_msg": _InMsg, "wcur": 64, "wrem": 32, "wlen": 32, "ack_cnt": 8,
        })

    @staticmethod
    def _wqe_layout():
        return data.StructLayout({
            "opcode": 4, "signaled": 1, "inline": 1, "wr_id": 64, "laddr": 64, "length": 32,
            "raddr": 64, "rkey": 32, "imm": 32, "first_psn": 24,
            "last_psn": 24,     # first_psn + max(1, ceil(length / mtu)) - 1 (valid with sent)
            "sent": 1,      # first_psn and last_psn are valid (its first packet has been sent)
        })

    @staticmethod
    def _rqe_layout():
        return data.StructLayout({"wr_id": 64, "addr": 64, "length": 32})

    @staticmethod
    def _timer_layout():
        return data.StructLayout({"armed": 1, "rnr": 1, "deadline": 32})

    def _pd_layout(self):
        """An entry of pdq: an ACK/NAK or READ job and/or a completion, released once the DMA
        writes issued before it are done."""
        return data.StructLayout({
            "wtag": 16,
            "has_tx": 1, "is_read": 1, "has_cqe": 1,
            "qp": self.index_bits, "psn": 24, "syndrome": 8, "msn": 24, "shift": 4,
            "addr": 64, "len": 32,
            "one": 1,       # a READ job of one response packet (len <= the path MTU)
            "cqe": struct_layout(COMPLETION),
        })

    # ------------------------------------------------------------------ elaborate
    def elaborate(self, platform):
        m = Module()
        IB = self.index_bits
        SQ, RQ = self.sq_depth, self.rq_depth
        SQB, RQB = (SQ - 1).bit_length(), (RQ - 1).bit_length()
        B = self.data_width // 8
        csr = self.csr
        qs_l, wqe_l, rqe_l, tmr_l, pd_l = (self._qs_layout(), self._wqe_layout(),
                                           self._rqe_layout(), self._timer_layout(),
                                           self._pd_layout())
        ctx_l = qp_context_layout()

        # ------------------------------------------------------------ memories
        m.submodules.qs_mem = qs_mem = Memory(shape=qs_l, depth=self.qps, init=[])
        m.submodules.sq_mem = sq_mem = Memory(shape=wqe_l, depth=self.qps * SQ, init=[])
        m.submodules.sqd_mem = sqd_mem = Memory(shape=INLINE_MAX * 8, depth=self.qps * SQ, init=[])
        m.submodules.rq_mem = rq_mem = Memory(shape=rqe_l, depth=self.qps * RQ, init=[])
        m.submodules.txc_mem = txc_mem = Memory(shape=ctx_l, depth=self.qps, init=[])
        m.submodules.tmr_mem = tmr_mem = Memory(shape=tmr_l, depth=self.qps, init=[])
        qs_rd, qs_wr = qs_mem.read_port(), qs_mem.write_port()
        sq_rd, sq_wr_p = sq_mem.read_port(), sq_mem.write_port()
        sqd_rd, sqd_wr_p = sqd_mem.read_port(), sqd_mem.write_port()
        rq_rd, rq_wr_p = rq_mem.read_port(), rq_mem.write_port()
        txc_rd, txc_brd, txc_wr = txc_mem.read_port(), txc_mem.read_port(), txc_mem.write_port()
        tmr_rd, tmr_scan, tmr_wr_p = tmr_mem.read_port(), tmr_mem.read_port(), tmr_mem.write_port()

        # The event machine's writes to sq, sqd, rq and tmr are registered, like the qs write:
        # each memory takes the write one clock after the deciding state, in a clock that never
        # reads the word back (the next event's LOAD/GOT reads it at the earliest one clock
        # after that; the timer scanner tolerates a write landing a clock later).
        def registered_write(port, shape, name):
            r = SimpleNamespace(en=Signal(name=f"{name}_we"), addr=Signal(len(port.addr),
                                name=f"{name}_wa"), data=Signal(shape, name=f"{name}_wd"))
            m.d.sync += [port.en.eq(r.en), port.addr.eq(r.addr), port.data.eq(r.data)]
            return r

        sq_wr = registered_write(sq_wr_p, wqe_l, "sq")
        sqd_wr = registered_write(sqd_wr_p, INLINE_MAX * 8, "sqd")
        rq_wr = registered_write(rq_wr_p, rqe_l, "rq")
        tmr_wr = registered_write(tmr_wr_p, tmr_l, "tmr")

        # The builder's read port into the context copy.
        m.d.comb += [txc_brd.addr.eq(self.txc_addr), txc_brd.en.eq(self.txc_en),
                     self.txc_data.eq(txc_brd.data)]

        # Host writes of a context update the copy at once (the builder reads headers from it).
        cw = self.ctx_written
        m.d.comb += [txc_wr.en.eq(cw.valid), txc_wr.addr.eq(cw.payload.index),
                     txc_wr.data.eq(cw.payload.ctx)]
        m.submodules.initq = initq = SyncFIFOBuffered(width=ctx_written_layout(IB).size, depth=4)
        m.d.comb += [initq.w_en.eq(cw.valid), initq.w_data.eq(cw.payload)]
        # (ctx_written pulses at most once per host operation, several clocks apart; a full
        # initq cannot happen while the machine runs, it drains one entry per event.)

        # ------------------------------------------------------------ configuration, GIDs
        for i in range(GIDS):
            m.d.comb += [
                self.gid[i].mac.eq(Cat(getattr(csr, f"gid{i}_mac_lo"), getattr(csr, f"gid{i}_mac_hi"))),
                self.gid[i].ip.eq(Cat(*(getattr(csr, f"gid{i}_ip{j}") for j in range(4)))),
                self.gid[i].ipv6.eq(getattr(csr, f"gid{i}_flags")[0]),
            ]
        m.d.comb += csr.config.eq(transport_config(self.qps, SQ, RQ, self.data_width))

        # ------------------------------------------------------------ time base and timer scan
        now = Signal(32)
        tick_cnt = Signal(24)
        tick = Signal()
        m.d.comb += tick.eq(tick_cnt + 1 >= csr.tick_cycles)
        # now + 1 is kept beside now (now_p1), so a tick only selects it: the tick's compare no
        # longer feeds now's 32-bit adder (tick_cnt -> now: 10 LUT levels out of context at
        # ec958a5, the block's deepest path).
        now_p1 = Signal(32, init=1)
        with m.If(tick):
            m.d.sync += [now.eq(now_p1), now_p1.eq(now_p1 + 1)]
        with m.If(tick):
            m.d.sync += tick_cnt.eq(0)
        with m.Else():
            m.d.sync += tick_cnt.eq(tick_cnt + 1)
        m.d.comb += csr.now.eq(now)

        m.submodules.toq = toq = SyncFIFOBuffered(width=IB, depth=4)
        scan = Signal(IB)
        scan_d = Signal(IB)
        scan_ok = Signal()
        m.d.sync += [scan.eq(scan + 1), scan_d.eq(scan), scan_ok.eq(1)]
        m.d.comb += [tmr_scan.addr.eq(scan)]
        scanned = Signal(tmr_l)
        m.d.comb += scanned.eq(tmr_scan.data)

        def expired(t):
            return t.armed & ((now - t.deadline)[31] == 0)

        m.d.comb += [toq.w_en.eq(scan_ok & expired(scanned)), toq.w_data.eq(scan_d)]

        # ------------------------------------------------------------ queues
        # Short on purpose: every request packet queued here (and in the builder) has left the
        # requester's hands, so a go-back-N rewind waits for it to go out first. Two packets of
        # look-ahead keep the wire busy at 512 bits; more only lengthen loss recovery. When
        # frames span two beats or more (64 bits) one is enough: the builder takes a descriptor
        # every other clock and a frame lasts 8 clocks or more, while the machine makes at most
        # one every 6 (an event); the builder's S1, record queue and the deparser hold three
        # packets after it. One entry is the output register alone (~430 flip-flops and one
        # wide load enable fewer).
        txq_depth = 1 if frames_span_two_beats(self.data_width) else 2
        m.submodules.txq = txq = SyncFIFOBuffered(width=tx_desc_layout(IB).size, depth=txq_depth)
        # (17: 16 entries in its LUT RAM plus the output register; the machine fills it to 16,
        # see pdq_room)
        m.submodules.pdq = pdq = SyncFIFOBuffered(width=pd_l.size, depth=17)
        m.submodules.mvq = mvq = SyncFIFOBuffered(width=1 + 64 + 16, depth=16)
        m.submodules.errq = errq = SyncFIFOBuffered(width=IB, depth=4)
        inv_l = data.StructLayout({"key": 32, "tenant": 8, "pd": 16})
        m.submodules.invq = invq = SyncFIFOBuffered(width=inv_l.size, depth=4)
        m.d.comb += [self.mr_invalidate.valid.eq(invq.r_rdy),
                     self.mr_invalidate.payload.eq(invq.r_data),
                     invq.r_en.eq(self.mr_invalidate.ready)]
        m.d.comb += [self.set_state.valid.eq(errq.r_rdy), self.set_state.payload.index.eq(errq.r_data),
                     self.set_state.payload.state.eq(QpState.ERROR),
                     errq.r_en.eq(self.set_state.ready)]

        # ------------------------------------------------------------ DMA write tags
        wissued = Signal(16)     # DMA write commands queued by the machine
        wdone = Signal(16)       # ... completed (B responses seen)
        m.d.sync += wdone.eq(wdone + self.dma_wdone)

        # ------------------------------------------------------------ RX payload mover
        mv = Signal(data.StructLayout({"write": 1, "addr": 64, "len": 16}))
        m.d.comb += mv.eq(mvq.r_data)
        cmd_sent = Signal()
        rx = self.rx
        with m.If(mvq.r_rdy & mv.write):
            m.d.comb += [
                self.dma_wcmd.valid.eq(~cmd_sent),
                self.dma_wcmd.payload.addr.eq(mv.addr),
                self.dma_wcmd.payload.len.eq(mv.len),
                self.dma_wdata.valid.eq(rx.valid),
                self.dma_wdata.payload.eq(rx.payload),
                rx.ready.eq(self.dma_wdata.ready),
            ]
            with m.If(self.dma_wcmd.valid & self.dma_wcmd.ready):
                m.d.sync += cmd_sent.eq(1)
        with m.Elif(mvq.r_rdy):
            m.d.comb += rx.ready.eq(1)
        rx_end = Signal()
        m.d.comb += [rx_end.eq(mvq.r_rdy & rx.valid & rx.ready & rx.payload.last),
                     mvq.r_en.eq(rx_end)]
        with m.If(rx_end):
            m.d.sync += cmd_sent.eq(0)

        # ------------------------------------------------------------ pdq release and dispatch
        # Responses (ACK/NAKs and READ jobs) share one queue: an ACK must never overtake the
        # READ responses of an earlier READ (the requester would take it for their loss).
        m.submodules.jobq = jobq = SyncFIFOBuffered(width=pd_l.size, depth=8)
        pd = Signal(pd_l)
        m.d.comb += pd.eq(pdq.r_data)
        # ``released`` is registered: the head's DMA writes were all done in the clock before
        # (wdone only grows, so that stays true). The clock after a pop it is 0, the new head
        # not yet compared: at most one pop every other clock, and the machine pushes at most
        # one entry per event. The compare then no longer runs into pdq's read enable and the
        # load enable of its output register (pd.wtag -> pdq: 340 failing endpoints routed on
        # the ECPIX-5 core at 41d0b9a).
        released = Signal()
        go = Signal()
        m.d.sync += released.eq(pdq.r_rdy & ~go & ((wdone - pd.wtag)[15] == 0))
        tx_ok = Signal()
        m.d.comb += tx_ok.eq(~pd.has_tx | jobq.w_rdy)
        cq_ok = Signal()
        m.d.comb += cq_ok.eq(~pd.has_cqe | self.cq.ready)
        m.d.comb += go.eq(released & tx_ok & cq_ok)
        m.d.comb += [
            pdq.r_en.eq(go),
            jobq.w_en.eq(go & pd.has_tx),
            jobq.w_data.eq(pd),
            self.cq.valid.eq(released & pd.has_cqe & tx_ok),
            self.cq.payload.eq(pd.cqe),
            csr.completions_inc.eq(go & pd.has_cqe),
        ]

        # ------------------------------------------------------------ response expander
        # An ACK/NAK job is one packet; a READ job becomes its READ response packets.
        job = Signal(pd_l)
        m.d.comb += job.eq(jobq.r_data)
        ack_desc = Signal(tx_desc_layout(IB))
        m.d.comb += [
            ack_desc.qp.eq(job.qp),
            ack_desc.opcode.eq(O.ACKNOWLEDGE),
            ack_desc.psn.eq(job.psn),
            ack_desc.syndrome.eq(job.syndrome),
            ack_desc.msn.eq(job.msn),
            ack_desc.src.eq(PayloadSrc.NONE),
        ]
        # The job's progress is kept in registers: whether its first packet has gone (r_mid),
        # the bytes left (r_rem_n) and whether they fit in one packet (r_last_n), computed when
        # a packet is taken; the first packet's come from the job itself (len, and ``one``
        # that the event machine decided with it). The take that pops the job (jobq's read
        # enable, the load enable of the job's register) then starts at flip-flops rather than
        # at a 32-bit subtraction and compare (r_off -> jobq read: 11.6 ns routed on the
        # ECPIX-5 core at 41d0b9a).
        r_off = Signal(32)
        rr_desc = Signal(tx_desc_layout(IB))
        r_mtu = Signal(14)
        m.d.comb += r_mtu.eq(1 << job.shift)
        r_mid = Signal()
        r_rem_n = Signal(32)
        r_last_n = Signal()
        r_rem = Signal(32)
        m.d.comb += r_rem.eq(Mux(r_mid, r_rem_n, job.len))
        r_first = Signal()
        r_last = Signal()
        m.d.comb += [r_first.eq(~r_mid), r_last.eq(Mux(r_mid, r_last_n, job.one))]
        with m.If(r_first & r_last):
            m.d.comb += rr_desc.opcode.eq(O.READ_RESP_ONLY)
        with m.Elif(r_first):
            m.d.comb += rr_desc.opcode.eq(O.READ_RESP_FIRST)
        with m.Elif(r_last):
            m.d.comb += rr_desc.opcode.eq(O.READ_RESP_LAST)
        with m.Else():
            m.d.comb += rr_desc.opcode.eq(O.READ_RESP_MIDDLE)
        r_psn = Signal(24)
        m.d.comb += [
            rr_desc.qp.eq(job.qp),
            rr_desc.psn.eq(job.psn + r_psn),
            rr_desc.syndrome.eq(ack_syndrome()),
            rr_desc.msn.eq(job.msn),
            rr_desc.plen.eq(Mux(r_last, r_rem, r_mtu)),
            rr_desc.src.eq(PayloadSrc.DMA),
            rr_desc.addr.eq(job.addr + r_off),
        ]

        # ------------------------------------------------------------ TX arbitration
        # Responses first (they unblock the peer), then requests.
        tx = self.tx
        rr_take = Signal()
        with m.If(jobq.r_rdy & ~job.is_read):
            m.d.comb += [tx.valid.eq(1), tx.payload.eq(ack_desc), jobq.r_en.eq(tx.ready)]
        with m.Elif(jobq.r_rdy):
            m.d.comb += [tx.valid.eq(1), tx.payload.eq(rr_desc), rr_take.eq(tx.ready)]
        with m.Elif(txq.r_rdy):
            m.d.comb += [tx.valid.eq(1), tx.payload.eq(txq.r_data), txq.r_en.eq(tx.ready)]
        with m.If(rr_take):
            with m.If(r_last):
                m.d.sync += [r_off.eq(0), r_psn.eq(0), r_mid.eq(0)]
                m.d.comb += jobq.r_en.eq(1)
            with m.Else():
                # (r_rem - r_mtu <= r_mtu: what is left after this packet fits in the next)
                m.d.sync += [r_off.eq(r_off + r_mtu), r_psn.eq(r_psn + 1), r_mid.eq(1),
                             r_rem_n.eq(r_rem - r_mtu), r_last_n.eq(r_rem <= (r_mtu << 1))]
        m.d.comb += csr.tx_read_responses_inc.eq(rr_take)
        m.d.comb += csr.tx_acks_inc.eq(jobq.r_rdy & ~job.is_read & tx.ready
                                       & (job.syndrome[5:8] == 0))

        # ------------------------------------------------------------ the event machine
        ev = Signal(_Ev)
        qp = Signal(IB)
        # qp_s: the slot shadow's read address, equal to qp outside IDLE (the only state that
        # moves qp); in IDLE it loads in every clock, so Yosys does not merge it with qp and
        # the placer can keep it by the shadow's LUT RAM. Through qp (fanned out over the whole
        # transport) the shadow's read was the core's worst path: 13.10 ns routed on the
        # ECPIX-5 at 245eb29 (seed 1), 9.4 ns of it one 55-tile net.
        qp_s = Signal(IB)
        s = Signal(qs_l)          # working copy of the QP's transport state
        c = Signal(ctx_l)         # its transmit context copy
        t = Signal(tmr_l)         # its timer word
        w = Signal(wqe_l)         # the WQE at hand (sq_cur for SEND, sq_tail otherwise)
        wd = Signal(INLINE_MAX * 8)
        rqe = Signal(rqe_l)
        meta = self.rx_meta.payload
        rec = meta.rec
        ictx = meta.ctx            # live context from the store (responder epsn/msn)
        init = Signal(ctx_written_layout(IB))
        m.d.comb += init.eq(initq.r_data)
        wrq = Signal(struct_layout(WORK_REQUEST))
        m.d.comb += wrq.eq(self.wr.payload)
        rrq = Signal(struct_layout(RECV_REQUEST))
        m.d.comb += rrq.eq(self.rr.payload)

        # memory addresses: qs/txc/tmr by qp, sq/sqd by (qp, slot), rq by (qp, rq_tail). The
        # sq/sqd and rq read addresses come straight from registers (sq_ra, rq_ra), computed a
        # clock ahead (see "slot shadow" below): they fan out to a few dozen block RAMs.
        sq_ra = Signal(SQB + IB)
        rq_ra = Signal(RQB + IB)
        m.d.comb += [
            qs_rd.addr.eq(qp), txc_rd.addr.eq(qp), tmr_rd.addr.eq(qp),
            sq_rd.addr.eq(sq_ra), sqd_rd.addr.eq(sq_ra), rq_rd.addr.eq(rq_ra),
        ]

        # pdq entry assembled by the states below
        pde = Signal(pd_l)
        pd_push = Signal()
        # registered: the entry enters pdq one clock after the deciding state. Only the machine
        # writes pdq and no state that pushes directly follows another that does.
        pde_r = Signal(pd_l)
        pd_wd = Signal(pd_l)
        m.d.sync += [pde_r.eq(pde), pdq.w_en.eq(pd_push)]
        m.d.comb += [pd_wd.eq(pde_r), pd_wd.wtag.eq(wissued), pdq.w_data.eq(pd_wd)]
        # The room of pdq, mvq and invq the deciding states check is registered: it is the room
        # of the clock before, so a decision that waits for room goes one clock after the queue
        # drained. pdq: the entry a state pushes lands a clock later, by which time the entry
        # of a state two clocks before (FLUSH -> FLUSH_LD -> FLUSH) has landed too: the room
        # counts it (w_level + w_en), and keeps 16 entries in use at most. mvq and invq entries
        # land a clock after the decision too (registered), and the states that write them
        # decide at least six clocks apart, so their w_rdy of the clock before the check is
        # still true when the entry lands.
        pdq_room = Signal()
        mvq_room = Signal()
        invq_room = Signal()
        m.d.sync += [pdq_room.eq((pdq.w_level + pdq.w_en) < 16),
                     mvq_room.eq(mvq.w_rdy), invq_room.eq(invq.w_rdy)]
        mve = Signal(mv.shape())
        mv_push = Signal()
        m.d.sync += [mvq.w_data.eq(mve), mvq.w_en.eq(mv_push)]
        inv_push = Signal()
        m.d.sync += [invq.w_en.eq(inv_push),
                     invq.w_data.eq(Cat(rec.ieth_rkey, ictx.tenant, ictx.pd))]
        # wissued counts without an adder after the decision: wissued1 = wissued + 1 is kept
        # beside it. The pdq entry's wtag (the DMA writes it waits for, its own clock's write
        # included) is wissued itself in the clock the entry is written to pdq, one clock after
        # the decision: it then counts that clock's write.
        wissued1 = Signal(16, init=1)
        mv_wr = Signal()            # (mv_push & mve.write, from flip-flops: elaborate, below)
        with m.If(mv_wr):
            m.d.sync += [wissued.eq(wissued1), wissued1.eq(wissued1 + 1)]

        def cqe_for_wqe(cq, wqe, status):
            opc = Signal(8, name="cqe_opc")
            with m.Switch(wqe.opcode):
                with m.Case(WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM):
                    m.d.comb += opc.eq(WcOpcode.RDMA_WRITE)
                with m.Case(WrOpcode.RDMA_READ):
                    m.d.comb += opc.eq(WcOpcode.RDMA_READ)
                with m.Default():
                    m.d.comb += opc.eq(WcOpcode.SEND)
            return [cq.qp.eq(qp), cq.is_recv.eq(0), cq.status.eq(status), cq.opcode.eq(opc),
                    cq.wr_id.eq(wqe.wr_id),
                    cq.byte_len.eq(Mux(wqe.opcode == WrOpcode.RDMA_READ, wqe.length, 0))]

        # registered from c (loaded in GOT): valid from CHK1 on, before any state or check
        # stage uses them
        mtu_shift = Signal(4)      # of the QP at hand (requester: txc copy)
        m.d.sync += mtu_shift.eq(c.pmtu + 7)
        pmtu = Signal(3)            # (mtu_shift - 7)
        m.d.sync += pmtu.eq(c.pmtu)
        assert len(c.pmtu) == 3

        def shl_mtu(x, name):
            """(x << mtu_shift)[:32], a case per value of pmtu (mtu_shift = pmtu + 7): a
            multiplexer by 3 flip-flops rather than a 4-level shifter by mtu_shift (psn_r ->
            rc_off: 27 failing endpoints, -1.65 ns routed on the ECPIX-5 core at ec958a5)."""
            r = Signal(32, name=name)
            with m.Switch(pmtu):
                for k in range(8):
                    with m.Case(k):
                        m.d.comb += r.eq((x << (k + 7))[:32])
            return r
        mtu = Signal(14)
        m.d.sync += mtu.eq(1 << (c.pmtu + 7)[:4])

        def npkts_m1(length, shift, *, lm1_zero=None):
            """max(1, ceil(length / 2**shift)) - 1 for shift 8..12. ``lm1_zero``: (length - 1,
            length == 0) when the caller has them cheaper than from ``length``."""
            # ceil(length / 2**sh) = ((length - 1) >> sh) + 1 for length >= 1; a shift out of
            # range (no case) gives 1 as before
            q = Signal(32, name="npkts_q")
            lm1 = Signal(32, name="npkts_lm1")
            if lm1_zero is None:
                lm1_zero = (length - 1, length == 0)
            m.d.comb += lm1.eq(lm1_zero[0])
            with m.Switch(shift):
                for sh in range(8, 13):
                    with m.Case(sh):
                        m.d.comb += q.eq(lm1 >> sh)
            return Mux(lm1_zero[1], 0, q)

        def npkts(length, shift, *, lm1_zero=None):
            """max(1, ceil(length / 2**shift)) for shift 8..12 (as ``npkts_m1``)."""
            return npkts_m1(length, shift, lm1_zero=lm1_zero) + 1

        outstanding = Signal(24)
        m.d.comb += outstanding.eq(s.npsn - s.una)
        sq_used = Signal(SQB + 1)
        m.d.comb += sq_used.eq(s.sq_head - s.sq_tail)
        sent_any = Signal()   # the WQE at hand has had packets sent
        m.d.comb += sent_any.eq(w.sent)
        sent_span = Signal(24)    # PSNs sent and not acknowledged, counting those a rewind
        m.d.comb += sent_span.eq(s.hpsn - s.una)     # will send again

        # Timer deadlines, registered (exact: now + ... of the clock they are used in) from now
        # and c (valid from CHK1 on). The timer write address is qp always.
        # Two candidates each, from now (now + 1 in the clock after a tick), so the tick
        # decision does not feed the adders: tick_d selects.
        tick_d = Signal()
        m.d.sync += tick_d.eq(tick)
        arm_dl0 = Signal(32)
        arm_dl1 = Signal(32)
        m.d.sync += [arm_dl0.eq(now + (Const(1, 33) << c.timeout)[:32] + 1),
                     arm_dl1.eq(now + (Const(1, 33) << c.timeout)[:32] + 2)]
        arm_dl = Signal(32)         # now + 2**timeout + 1
        m.d.comb += arm_dl.eq(Mux(tick_d, arm_dl1, arm_dl0))
        arm_on = Signal()           # timeout 0 never arms
        m.d.sync += arm_on.eq(c.timeout != 0)
        m.d.comb += tmr_wr.addr.eq(qp)

        def arm_timer(fire):
            """Timer write: (re)arm to now + 2**timeout + 1 ticks (timeout 0: disarm)."""
            return [tmr_wr.en.eq(fire),
                    tmr_wr.data.armed.eq(arm_on), tmr_wr.data.rnr.eq(0),
                    tmr_wr.data.deadline.eq(arm_dl)]

        def disarm_timer(fire):
            return [tmr_wr.en.eq(fire), tmr_wr.data.eq(0)]

        # The TIMEOUT event's check of its timer word (expired(t), exact): registered for now
        # and now + 1 (t holds still from EVAL on), tick_d selects, as arm_dl. From now through
        # the 32-bit compare into the timer write it was -1.03 ns routed on the ECPIX-5 core at
        # ec958a5 (now -> tmr_wr_p__data: 20 failing endpoints).
        t_exp0 = Signal()
        t_exp1 = Signal()
        m.d.sync += [t_exp0.eq(t.armed & ((now - t.deadline)[31] == 0)),
                     t_exp1.eq(t.armed & ((now_p1 - t.deadline)[31] == 0))]
        t_expired = Signal()
        m.d.comb += t_expired.eq(Mux(tick_d, t_exp1, t_exp0))

        # --- responder decision (combinational, used in EVAL for request packets)
        op = rec.bth_opcode
        # The packet's PSN and syndrome, registered every clock (valid from LOAD: the record
        # holds still from IDLE to its take): every check below computes from these flip-flops
        # next to it rather than from the record's, which sit in the receive pipeline (from
        # them through the PSN arithmetic it was up to 11.6 ns routed on the ECPIX-5 core).
        psn = Signal(24, name="psn_r")
        m.d.sync += psn.eq(rec.bth_psn)
        plen = rec.payload_len
        plen_nz = Signal()          # (registered, as psn) the packet has payload to move
        m.d.sync += plen_nz.eq(plen != 0)
        is_send = Signal()
        is_write = Signal()
        is_read = Signal()
        first = Signal()
        middle = Signal()
        last = Signal()
        only = Signal()
        with_imm = Signal()
        with_inv = Signal()
        is_req = Signal()
        is_resp = Signal()
        with m.Switch(op):
            with m.Case(O.SEND_FIRST):
                m.d.comb += [is_send.eq(1), first.eq(1)]
            with m.Case(O.SEND_MIDDLE):
                m.d.comb += [is_send.eq(1), middle.eq(1)]
            with m.Case(O.SEND_LAST):
                m.d.comb += [is_send.eq(1), last.eq(1)]
            with m.Case(O.SEND_LAST_IMM):
                m.d.comb += [is_send.eq(1), last.eq(1), with_imm.eq(1)]
            with m.Case(O.SEND_LAST_INV):
                m.d.comb += [is_send.eq(1), last.eq(1), with_inv.eq(1)]
            with m.Case(O.SEND_ONLY):
                m.d.comb += [is_send.eq(1), only.eq(1)]
            with m.Case(O.SEND_ONLY_IMM):
                m.d.comb += [is_send.eq(1), only.eq(1), with_imm.eq(1)]
            with m.Case(O.SEND_ONLY_INV):
                m.d.comb += [is_send.eq(1), only.eq(1), with_inv.eq(1)]
            with m.Case(O.WRITE_FIRST):
                m.d.comb += [is_write.eq(1), first.eq(1)]
            with m.Case(O.WRITE_MIDDLE):
                m.d.comb += [is_write.eq(1), middle.eq(1)]
            with m.Case(O.WRITE_LAST):
                m.d.comb += [is_write.eq(1), last.eq(1)]
            with m.Case(O.WRITE_LAST_IMM):
                m.d.comb += [is_write.eq(1), last.eq(1), with_imm.eq(1)]
            with m.Case(O.WRITE_ONLY):
                m.d.comb += [is_write.eq(1), only.eq(1)]
            with m.Case(O.WRITE_ONLY_IMM):
                m.d.comb += [is_write.eq(1), only.eq(1), with_imm.eq(1)]
            with m.Case(O.READ_REQUEST):
                m.d.comb += is_read.eq(1)
            with m.Case(O.READ_RESP_FIRST, O.READ_RESP_MIDDLE, O.READ_RESP_LAST,
                        O.READ_RESP_ONLY, O.ACKNOWLEDGE):
                m.d.comb += is_resp.eq(1)
        m.d.comb += is_req.eq(is_send | is_write | is_read)

        needs_rq = Signal()
        m.d.comb += needs_rq.eq((is_send & (first | only)) | (is_write & with_imm & (last | only)))
        msg_end = Signal()
        m.d.comb += msg_end.eq(last | only | is_read)
        # The opcode decode again, registered: a received packet's record holds still from IDLE
        # to DO (LOAD, GOT, EVAL, CHK1, CHK2 between), so the responder's registered checks
        # (below, from GOT on), CHK2 and DO (the decision and the entries it pushes) take these
        # flip-flops instead of decoding the opcode in their own clock: the record's flip-flops
        # sit in the receive pipeline, far from here (from them through the decode to the
        # checks' adders it was 11.6 ns routed on the ECPIX-5 core at 41d0b9a).
        dec_r = {}
        for name, val in (("is_send", is_send), ("is_write", is_write), ("is_read", is_read),
                          ("first", first), ("middle", middle), ("last", last), ("only", only),
                          ("with_imm", with_imm), ("with_inv", with_inv), ("is_req", is_req),
                          ("is_resp", is_resp), ("needs_rq", needs_rq), ("msg_end", msg_end)):
            dec_r[name] = Signal(name=f"{name}_r")
            m.d.sync += dec_r[name].eq(val)

        r_shift = Signal(4)
        m.d.comb += r_shift.eq(ictx.pmtu + 7)
        r_mtu_q = Signal(14)
        m.d.comb += r_mtu_q.eq(1 << r_shift)
        d = Signal(24)
        m.d.comb += d.eq(psn - ictx.epsn)
        expected = Signal()
        behind = Signal()
        ahead = Signal()
        # (the responder's checks below are registered: computed every clock from the packet,
        # s and rqe, which hold still in CHK1/CHK2; DO uses them)
        m.d.sync += [expected.eq(d == 0), behind.eq(d[23]), ahead.eq((d != 0) & ~d[23])]
        st_ok = Signal()
        m.d.sync += st_ok.eq((ictx.state == QpState.RTR) | (ictx.state == QpState.RTS))
        (R_first, R_middle, R_last, R_only, R_is_read, R_is_send, R_is_write) = (
            dec_r[n] for n in ("first", "middle", "last", "only", "is_read", "is_send", "is_write"))
        seq_ok = Signal()
        with m.Switch(s.in_msg):
            with m.Case(_InMsg.NONE):
                m.d.sync += seq_ok.eq(R_first | R_only | R_is_read)
            with m.Case(_InMsg.SEND):
                m.d.sync += seq_ok.eq(R_is_send & (R_middle | R_last))
            with m.Case(_InMsg.WRITE):
                m.d.sync += seq_ok.eq(R_is_write & (R_middle | R_last))
            with m.Default():
                m.d.sync += seq_ok.eq(0)
        len_ok = Signal()
        m.d.sync += len_ok.eq(Mux(R_first | R_middle, plen == r_mtu_q,
                              Mux(R_last, (plen != 0) & (plen <= r_mtu_q),
                              Mux(R_only, plen <= r_mtu_q, plen == 0))))
        wrem_in = Signal(32)       # WRITE bytes left before this packet (stage 1)
        m.d.sync += wrem_in.eq(Mux(R_first | R_only, rec.reth_dma_length, s.wrem))
        wlen_ok = Signal()          # (stage 2)
        m.d.sync += wlen_ok.eq(Mux(R_last | R_only, plen == wrem_in, plen < wrem_in))
        ann = meta.ann
        mr_fail = Signal()
        m.d.sync += mr_fail.eq(
            (ann.mr_kind != 0) & ((ann.mr_reason != 0)
                                  | ((rec.reth_dma_length != 0) & (ann.span < rec.reth_dma_length))))
        rq_avail = Signal()
        m.d.sync += rq_avail.eq(s.rq_head != s.rq_tail)
        send_total = Signal(33)
        m.d.sync += send_total.eq(s.rq_off + plen)
        send_over = Signal()        # (stage 2)
        m.d.sync += send_over.eq(R_is_send & (send_total > rqe.length))
        # (stage 0: reth_dma_length - 1 and == 0 registered from the record; read_n stage 1)
        read_lm1 = Signal(32)
        read_l0 = Signal()
        m.d.sync += [read_lm1.eq(rec.reth_dma_length - 1), read_l0.eq(rec.reth_dma_length == 0)]
        read_n = Signal(24)
        m.d.sync += read_n.eq(npkts(None, r_shift, lm1_zero=(read_lm1, read_l0)))
        read_one = Signal()         # (stage 2) one READ response packet
        m.d.sync += read_one.eq(read_n == 1)
        rsp_epsn = Signal(24)       # the next epsn after an accepted request (stage 2)
        m.d.sync += rsp_epsn.eq(psn + Mux(R_is_read, read_n, 1))
        rsp_wcur = Signal(64)       # WRITE: where the payload after this packet goes
        m.d.sync += rsp_wcur.eq(Mux(R_first | R_only, ann.bus_addr, s.wcur) + plen)
        rsp_saddr = Signal(64)      # SEND: where this packet's payload goes
        m.d.sync += rsp_saddr.eq(rqe.addr + s.rq_off)
        rsp_ack_due = Signal()      # the ack_coalesce count is reached
        m.d.sync += rsp_ack_due.eq((csr.ack_coalesce != 0) & ((s.ack_cnt + 1) >= csr.ack_coalesce))
        new_msn = Signal(24)
        m.d.sync += new_msn.eq(ictx.msn + dec_r["msg_end"])
        # The responder's outcome, registered from the checks (stage 3: valid in DO, CHK2 having
        # the stage-2 checks): one flip-flop per branch of its decision (drop, duplicate, ahead;
        # for the expected PSN: invalid request, remote access error, RNR, too long for the
        # receive buffer, and whether any of these NAKs), so DO chooses among flip-flops. Decided
        # from the checks themselves in DO, the chain ran from them through the decision into
        # the state word and the pdq entry (12.4 ns routed on the ECPIX-5 core at d76ba5e).
        rs = _regs("rs", (("drop", 1), ("dup", 1), ("ahead", 1), ("inv", 1), ("acc", 1),
                          ("rnr", 1), ("over", 1), ("nak", 1)))
        rs_inv = ~seq_ok | ~len_ok | (R_is_write & ~wlen_ok)
        rs_rnr = dec_r["needs_rq"] & ~rq_avail
        m.d.sync += [
            rs.drop.eq(~st_ok), rs.dup.eq(st_ok & behind), rs.ahead.eq(st_ok & ~behind & ahead),
            rs.inv.eq(rs_inv), rs.acc.eq(~rs_inv & mr_fail), rs.rnr.eq(~rs_inv & ~mr_fail & rs_rnr),
            rs.over.eq(~rs_inv & ~mr_fail & ~rs_rnr & send_over),
            rs.nak.eq(rs_inv | mr_fail | rs_rnr | send_over),
        ]

        # --- requester view of a response packet
        syn = Signal(8, name="syn_r")     # (registered, as psn)
        m.d.sync += syn.eq(rec.aeth_syndrome)
        resp_is_ack = Signal()
        m.d.comb += resp_is_ack.eq(op == O.ACKNOWLEDGE)
        p_una = Signal(24)          # (psn - una)
        m.d.comb += p_una.eq(psn - s.una)
        # PSN the walk may complete up to (inclusive): the ACK's PSN; psn - 1 for NAKs and READ
        # responses. ack_none: nothing to complete (psn == una for NAK/READ response).
        walk_to = Signal(24)        # (registered: valid from GOT, before the walk's checks)
        m.d.sync += walk_to.eq(Mux(resp_is_ack & (syn[5:8] == 0), psn, psn - 1))
        walk_span = Signal(24)      # walk_to - una
        m.d.comb += walk_span.eq(walk_to - s.una)
        rnr_tk = Signal(32)         # the RNR NAK's delay in ticks
        with m.Switch(syn[0:5]):
            for code, n in enumerate(rnr_ticks(x) for x in range(32)):
                with m.Case(code):
                    m.d.comb += rnr_tk.eq(n)
        rnr_dl0 = Signal(32)
        rnr_dl1 = Signal(32)
        m.d.sync += [rnr_dl0.eq(now + rnr_tk + 1), rnr_dl1.eq(now + rnr_tk + 2)]
        rnr_dl = Signal(32)         # now + rnr_tk + 1 (exact, as arm_dl)
        m.d.comb += rnr_dl.eq(Mux(tick_d, rnr_dl1, rnr_dl0))
        ack_none = Signal()
        m.d.comb += ack_none.eq(~(resp_is_ack & (syn[5:8] == 0)) & (p_una == 0))
        # The rest of what CHK2, DO and WALK decide on from the packet, registered as psn (valid
        # from LOAD): the opcode's kind with ann.roce, the ACK opcode, the known syndromes, AckReq.
        # From the record's flip-flops in the receive pipeline through the decision to the mover
        # queue's enables it was -2.01 ns routed on the ECPIX-5 core at ec958a5 (bth_opcode ->
        # wissued1, pd_wd.wtag; 16 endpoints, and ev_state).
        req_r = Signal()            # a RoCE request (is_req & ann.roce)
        resp_r = Signal()           # a RoCE response (is_resp & ann.roce)
        ack_r = Signal()            # ACKNOWLEDGE
        cnp_r = Signal()            # a CNP (the reaction point takes it)
        syn_known = Signal()        # ACK, RNR NAK or NAK; reserved syndromes are ignored
        ackreq_r = Signal()
        syn_c = rec.aeth_syndrome
        m.d.sync += [
            req_r.eq(is_req & meta.ann.roce), resp_r.eq(is_resp & meta.ann.roce),
            ack_r.eq(op == O.ACKNOWLEDGE), cnp_r.eq(op == CNP_OPCODE),
            syn_known.eq((op != O.ACKNOWLEDGE) | (syn_c[5:8] == Syndrome.ACK)
                         | (syn_c[5:8] == Syndrome.RNR_NAK) | (syn_c[5:8] == Syndrome.NAK)),
            ackreq_r.eq(rec.bth_ackreq),
        ]
        # The responder's fields of the state word (rq_tail, rq_off, in_msg, nak_sent, wcur,
        # wrem, wlen, ack_cnt), and INIT's reset of them, chosen by flip-flops of their own
        # registered with rs (stage 3, valid in DO: the event, the packet, s, rqe and the init
        # word hold still from LOAD/CHK2 on), one or two per field: DO's word then takes each of
        # these fields through one LUT (select, new value, s's) rather than through the
        # responder's decision and the event flip-flops (do_rx -> rs_drop/rs_inv -> ns.wcur ->
        # ns_do_r: 109 failing endpoints, -4.49 ns, 6 LUT levels routed on the ECPIX-5 core at
        # e7458bf). Outside the event they are 0 (the other events keep s's fields); the word
        # is written only when DO decides, and with the RX event only for a request.
        rx_c = ev == _Ev.RX
        init_rst = (init.mask[QP_CONTEXT.index["state"]]
                    & ((init.ctx.state == QpState.RESET) | (init.ctx.state == QpState.INIT)))
        init_a = Signal()           # INIT re-initializes the requester's fields (LOAD on)
        m.d.sync += init_a.eq(init.mask[QP_CONTEXT.index["sq_psn"]] | init_rst)
        ib_c = (ev == _Ev.INIT) & (init.mask[QP_CONTEXT.index["epsn"]] | init_rst)
        exp_c = st_ok & ~behind & ~ahead            # the expected PSN
        ahd_c = st_ok & ~behind & ahead
        nak_c = rs_inv | mr_fail | rs_rnr | send_over
        over_c = rx_c & exp_c & ~rs_inv & ~mr_fail & ~rs_rnr & send_over
        acc_c = rx_c & exp_c & ~nak_c               # accepted
        R_msg_end, R_with_imm = dec_r["msg_end"], dec_r["with_imm"]
        rsel = _regs("rsel", (("init", 1), ("wc", 1), ("wl", 1), ("rqt", 1), ("rqo_t", 1),
                              ("rqo_0", 1), ("ack0", 1), ("ackinc", 1), ("mvw", 1),
                              ("in_msg", 2), ("nak_sent", 1)))
        rsp_wrem = Signal(32)       # (stage 2) WRITE bytes left after this packet
        rsp_wlen = Signal(32)       # (LOAD on) the RETH's length
        rsp_ack1 = Signal(8)        # (stage 1) s.ack_cnt + 1
        rsp_waddr = Signal(64)      # (stage 1) where a WRITE packet's payload goes
        mv_addr_rx = Signal(64)     # (stage 3) where a request packet's payload goes
        m.d.sync += [
            rsp_wrem.eq(wrem_in - plen),
            rsp_wlen.eq(rec.reth_dma_length),
            rsp_ack1.eq(s.ack_cnt + 1),
            rsp_waddr.eq(Mux(R_first | R_only, ann.bus_addr, s.wcur)),
            mv_addr_rx.eq(Mux(R_is_write, rsp_waddr, rsp_saddr)),
            rsel.init.eq(ib_c),
            rsel.wc.eq(acc_c & R_is_write),
            rsel.wl.eq(acc_c & R_is_write & (R_first | R_only)),
            rsel.rqt.eq(over_c | (acc_c & ((R_is_write & R_with_imm) | (R_is_send & R_msg_end)))),
            rsel.rqo_t.eq(acc_c & R_is_send & ~R_msg_end),
            rsel.rqo_0.eq(ib_c | over_c | (acc_c & R_is_send & R_msg_end)),
            rsel.ack0.eq(ib_c | (rx_c & ((st_ok & behind & ~R_is_read & ackreq_r)
                                         | (ahd_c & ~s.nak_sent) | (exp_c & nak_c)))
                         | (acc_c & ~R_is_read & (ackreq_r | rsp_ack_due))),
            rsel.ackinc.eq(acc_c & ~R_is_read & ~ackreq_r & ~rsp_ack_due),
            rsel.mvw.eq(req_r & acc_c & (R_is_write | R_is_send) & plen_nz),
            rsel.in_msg.eq(Mux(ib_c | over_c, _InMsg.NONE,
                               Mux(acc_c & R_first, Mux(R_is_send, _InMsg.SEND, _InMsg.WRITE),
                                   Mux(acc_c & R_msg_end, _InMsg.NONE, s.in_msg)))),
            rsel.nak_sent.eq(Mux(ib_c, 0, Mux(rx_c & (ahd_c | (exp_c & nak_c)), 1,
                                               Mux(acc_c, 0, s.nak_sent)))),
        ]
        resp_valid = Signal()       # registered (s and the packet hold still from GOT to DO)
        m.d.sync += resp_valid.eq(p_una < sent_span)
        # The walk's checks, registered every clock: stage A from s and the packet, stage B from
        # w and stage A. The walk loads each next WQE (WALK_LD) and gives them a clock (WALK_CHK)
        # before WALK decides; on the first WALK (from DO) they have had CHK1..DO.
        wk = _regs("wk", (("span", 24), ("sent_span", 24), ("ack_none", 1), ("te", 1),
                            ("le", 1), ("lt_sent", 1), ("last1", 24)))
        m.d.sync += [
            # stage A
            wk.span.eq(walk_span),                       # walk_to - una
            wk.sent_span.eq(sent_span),                  # hpsn - una
            wk.ack_none.eq(ack_none),
            wk.te.eq(s.sq_tail == s.sq_head),
            # stage B
            wk.le.eq((w.last_psn - s.una)[:24] <= wk.span),     # w_last - una <= walk_span
            wk.lt_sent.eq(wk.span < wk.sent_span),
            wk.last1.eq(w.last_psn + 1),
        ]

        fatal_status = Signal(5)
        flushing = Signal()         # a fatal error is being flushed
        after = Signal(3)           # what the walk does when it stops (see _After)
        A_NONE, A_ACK, A_SEQ, A_RNR, A_FATAL, A_READ, A_REWIND = range(7)

        A_LOSTREAD = 7
        una0 = Signal(24)           # una when the response arrived (progress detection)

        # --- one-writer signals driven from the states below
        rx_take = Signal()          # the decision; the take itself is a clock later
        rx_taking = Signal()
        m.d.sync += rx_taking.eq(rx_take)
        m.d.comb += self.rx_meta.ready.eq(rx_taking)
        # The push to the scheduler and the sent report leave through flip-flops, a clock after
        # the deciding state (together, as before): the push addressed the scheduler's
        # transparent attribute reads from the machine's qp (9.9 ns routed on the ECPIX-5 core
        # at 41d0b9a). The QP's queued flag lands in qs in that same clock.
        sched_push = Signal()
        m.d.sync += [self.sched_push.valid.eq(sched_push), self.sched_push.payload.qp.eq(qp)]
        sent_v = Signal()
        sent_p = Signal.like(self.sent.payload)
        m.d.sync += [self.sent.valid.eq(sent_v), self.sent.payload.eq(sent_p)]
        # Credits back to the feeder of wr / rr (one state sets each, so one pulse per clock).
        m.d.comb += [self.sq_retire.payload.qp.eq(qp), self.rq_retire.payload.qp.eq(qp)]
        # The state write is registered: qs_mem takes it one clock after the deciding state, in
        # the IDLE clock that always follows; the next event's LOAD addresses qs_mem after that,
        # so it reads the new word (no forwarding needed).
        # The word written comes from one of four sources, selected by a register (qs_src) the
        # clock before the deciding state: the DO state's ns, AFTER_RX's ns_resp, and ns_af
        # (AFTER's rewind, FLUSH's fatal end). The deciding states only raise qs_we.
        # DO's word and the others' are registered apart (ns_do_r, ns_oth_r, every clock) and
        # selected after the flip-flops, in the write clock: the flip-flops then sit by the
        # decision's logic, and the long way to qs_mem's block RAMs starts at them (the last
        # net of the decision, to a single registered word by the block RAMs, was 3.8 of its
        # 12.6 ns routed on the ECPIX-5 core at 41d0b9a).
        qs_we = Signal()
        m.d.sync += [qs_wr.addr.eq(qp), qs_wr.en.eq(qs_we)]
        SRC_DO, SRC_RESP, SRC_REWIND, SRC_FATAL = range(4)
        qs_src = Signal(2)
        ns_do = Signal(qs_l, name="ns")
        ns_resp = Signal(qs_l, name="ns_resp")
        ns_af = Signal(qs_l, name="ns_af")
        ns_do_r = Signal(qs_l)
        ns_oth_r = Signal(qs_l)
        src_do_r = Signal()
        m.d.sync += [ns_do_r.eq(ns_do), ns_oth_r.eq(Mux(qs_src == SRC_RESP, ns_resp, ns_af)),
                     src_do_r.eq(qs_src == SRC_DO)]
        m.d.comb += qs_wr.data.eq(Mux(src_do_r, ns_do_r, ns_oth_r))

        # --- slot shadow: the sq_cur, sq_tail and rq_tail slots of every QP, in a small RAM read
        # without a clock, written with (and like) qs. LOAD reads the event's QP from it and
        # registers the first sq/sqd/rq read address (sq_cur for SEND, else sq_tail; rq_tail),
        # so the WQE and receive WQE are read in GOT as before, from registers; every other
        # clock sq_ra takes (qp, s.sq_tail + 1): the next WQE the walk (WALK -> WALK_LD) and
        # the flush (FLUSH -> FLUSH_LD) read, s.sq_tail being one clock old there (WALK and
        # FLUSH follow a clock that does not move it).
        slot_l = data.StructLayout({"sq_cur": SQB, "sq_tail": SQB, "rq_tail": RQB})
        m.submodules.slot_mem = slot_mem = Memory(shape=slot_l, depth=self.qps, init=[])
        slot_rd, slot_wr = slot_mem.read_port(domain="comb"), slot_mem.write_port()
        # The shadow's write address is a register of its own too, from qp_s (equal to qp in
        # the deciding states, where qs_wr.addr samples qp): as qs_wr.addr (which Yosys shares
        # with rq_ra) it was 182 failing endpoints into the LUT RAM's write side (-1.92 ns).
        slot_wa = Signal(IB)
        m.d.sync += slot_wa.eq(qp_s)
        m.d.comb += [slot_rd.addr.eq(qp_s), slot_wr.en.eq(qs_wr.en), slot_wr.addr.eq(slot_wa),
                     slot_wr.data.sq_cur.eq(qs_wr.data.sq_cur[:SQB]),
                     slot_wr.data.sq_tail.eq(qs_wr.data.sq_tail[:SQB]),
                     slot_wr.data.rq_tail.eq(qs_wr.data.rq_tail[:RQB])]
        sq_ra_load = Signal(SQB + IB)
        m.d.comb += sq_ra_load.eq(Cat(Mux(ev == _Ev.SEND, slot_rd.data.sq_cur,
                                          slot_rd.data.sq_tail), qp_s))
        m.d.sync += rq_ra.eq(Cat(slot_rd.data.rq_tail, qp_s))   # used only in GOT

        # The context write-back to the store and the inline-data write: payload, address and
        # data in every clock (only POST writes sqd; only an accepted request writes back); only
        # wb.valid / sqd_wr.en wait for the decision. wb.valid comes in the clock rx_meta is
        # taken, with the packet's own context (ictx) and the epsn/msn it leaves.
        m.d.comb += [ns_do.eq(s), ns_resp.eq(s)]     # (the states change some fields)
        # NicCore's store keeps only CORE_WB_FIELDS of a write-back; the rest is ictx again.
        wb_new = {"epsn": rsp_epsn,      # psn + (READ: read_n, else 1)
                  "msn": new_msn}
        assert set(wb_new) == set(CORE_WB_FIELDS), "the write-back fields are CORE_WB_FIELDS"
        # The take of rx_meta and the write-back are registered: both come one clock after the
        # deciding state (DO, AFTER_RX), together, as the store's contract wants. Decided in
        # the same clock, the take was a combinational handshake from the record through the
        # transport's decision into the pipeline's record queue; placed on the ECPIX-5 that path
        # had nets of 61 and 59 tiles (18.3 ns, the core's worst, `stellar.sim.sdfpaths`). The
        # packet, its context and everything the write-back is computed from hold still for
        # that clock (the packet is not taken yet, no other write-back can come); the IDLE that
        # follows starts no RX event with the packet still presented.
        wb_go = Signal()            # the decision to write back (in _accept)
        m.d.sync += [self.wb.valid.eq(wb_go), self.wb.payload.ctx.eq(ictx),
                     self.wb.payload.index.eq(qp)]
        m.d.sync += [getattr(self.wb.payload.ctx, f).eq(v) for f, v in wb_new.items()]
        m.d.comb += [
            sqd_wr.addr.eq(Cat(s.sq_head[:SQB], qp)),
            sqd_wr.data.eq(wrq.inline_data),
        ]

        def write_state(ns):
            """Write ns (the source qs_src selects: the caller's own) to qs."""
            return [qs_we.eq(1)]

        def pd_ack(psn_v, syndrome, msn_v):
            return [pde.has_tx.eq(1), pde.is_read.eq(0), pde.qp.eq(qp), pde.psn.eq(psn_v),
                    pde.syndrome.eq(syndrome), pde.msn.eq(msn_v)]

        def pd_read_job(msn_v):
            return [pde.has_tx.eq(1), pde.is_read.eq(1), pde.qp.eq(qp), pde.psn.eq(psn),
                    pde.addr.eq(ann.bus_addr), pde.len.eq(rec.reth_dma_length),
                    pde.msn.eq(msn_v), pde.shift.eq(r_shift), pde.one.eq(read_one)]

        # --- response checks, registered every clock from s, w, c and the packet (valid in
        # AFTER_RX after RX_CHK1/RX_CHK2, where none of them changes). una after the response
        # is one of two values: s.una, or psn + 1 (an accepted READ response): everything
        # AFTER_RX derives from it is computed for both and selected there.
        # rc.off, rem, lastpkt, maddr and rd_ok depend only on the packet, w and c, which hold
        # still from the WQE's load on (EVAL or WALK_LD, at least five clocks before AFTER_RX,
        # w valid from the next): they may take four stages.
        rc = _regs("rc", (("off", 32), ("rem", 32), ("offnz", 1), ("at_una", 1), ("psn1", 24),
                            ("moved_a", 1), ("moved_b", 1), ("past_a", 1), ("past_b", 1),
                            ("cur_off_a", 32), ("cur_off_b", 32), ("idle_a", 1), ("idle_b", 1),
                            ("plen_rem", 1), ("plen_mtu", 1), ("lastpkt", 1), ("maddr", 64),
                            ("cur_ne", 1), ("tail_ne", 1), ("tail1_ne", 1), ("rd_ok", 1),
                            ("done", 1), ("pre_b", 1)))
        rd_starts = Signal()
        m.d.comb += rd_starts.eq((op == O.READ_RESP_FIRST) | (op == O.READ_RESP_ONLY))
        rd_ends = Signal()
        m.d.comb += rd_ends.eq((op == O.READ_RESP_LAST) | (op == O.READ_RESP_ONLY))
        ahead_a = Signal(24)        # s.una - s.npsn
        m.d.comb += ahead_a.eq(s.una - s.npsn)
        ahead_b = Signal(24)        # psn + 1 - s.npsn
        m.d.comb += ahead_b.eq(psn + 1 - s.npsn)
        m.d.sync += [
            # stage 1
            rc.off.eq(shl_mtu((psn - w.first_psn)[:24], "rc_off_c")),
            rc.at_una.eq(psn == s.una),
            rc.psn1.eq(psn + 1),
            rc.moved_a.eq(s.una != una0),
            rc.past_a.eq((ahead_a != 0) & ~ahead_a[23]),    # una acknowledged past npsn
            rc.past_b.eq((ahead_b != 0) & ~ahead_b[23]),    # psn + 1 past npsn
            rc.cur_ne.eq(s.sq_cur != s.sq_head),            # the "more work" tests
            rc.tail_ne.eq(s.sq_tail != s.sq_head),
            rc.tail1_ne.eq((s.sq_tail + 1)[:len(s.sq_tail)] != s.sq_head),
            rc.cur_off_a.eq(shl_mtu((s.una - w.first_psn)[:24], "rc_cur_off_a_c")),
            rc.idle_a.eq(s.una == s.npsn),
            rc.plen_mtu.eq(plen == mtu),
            # stage 2
            rc.rem.eq(w.length - rc.off),
            rc.offnz.eq(rc.off != 0),
            rc.moved_b.eq(rc.psn1 != una0),
            rc.cur_off_b.eq(shl_mtu((rc.psn1 - w.first_psn)[:24], "rc_cur_off_b_c")),
            rc.idle_b.eq(rc.psn1 == s.npsn),
            rc.plen_rem.eq(plen == w.length - rc.off),
            # (stage 2, from stage 1 and after, set by the walk a clock before RX_CHK1)
            # AFTER_RX's done (no rewind, no fatal end) and whether it takes an accepted READ
            # response but for rd_ok (una_b, below): from c.rnr_retry through done into the
            # state word and the timer it was 7 LUT levels (c -> ns_oth_r: 25 failing
            # endpoints, -2.62 ns, c -> tmr_wr_p__data: 17, routed on the ECPIX-5 core at e7458bf)
            rc.done.eq(~(((after == A_SEQ) & rc.at_una) | (after == A_LOSTREAD)
                         | ((after == A_RNR) & rc.at_una & (c.rnr_retry != 7)
                            & (Mux(rc.moved_a, c.rnr_retry, s.rnr_left) == 0))
                         | (after == A_FATAL))),
            rc.pre_b.eq((after == A_READ) & rc.at_una & rc.tail_ne),
            # stage 3 (packet, w and c only)
            rc.lastpkt.eq(rc.rem <= mtu),
            rc.maddr.eq(w.laddr + rc.off),
            # stage 4 (packet and w only). Position: the last bytes come as LAST/ONLY, others
            # as FIRST/MIDDLE, the first byte as FIRST/ONLY; after a re-request from the middle
            # of a READ the responder starts over with FIRST/ONLY, so those are accepted anywhere.
            rc.rd_ok.eq((w.opcode == WrOpcode.RDMA_READ) & sent_any
                        & (rd_ends == rc.lastpkt) & (rc.offnz | rd_starts)
                        & Mux(rc.lastpkt, rc.plen_rem, rc.plen_mtu)),
        ]

        # --- SEND: registered every clock from s, w and c (valid in DO after CHK1/CHK2)
        sd = _regs("sd", (("rem", 32), ("f", 1), ("rd_q", 24), ("rd_wrap", 1),
                            ("out", 24), ("out_nz", 1),
                            ("va", 64), ("addr", 64), ("off_mtu", 32), ("mark", 1),
                            ("after", 25), ("after_ge", 1), ("new_npsn", 24), ("hp_diff", 24),
                            ("lst", 1), ("last", 24), ("cur_ne", 1), ("cur1_ne", 1)))
        # cur_off for stage 1, a copy of s.cur_off of its own (loaded from the qs read in every
        # clock: qs_rd.data holds the event's word from GOT to its decision, so it equals s's
        # from EVAL to DO, where sd is used): s's fans out over the whole machine (s.cur_off ->
        # sd_rd_q: 24 failing endpoints, -1.08 ns routed on the ECPIX-5 core at e7458bf, its
        # first net 69 tiles).
        s_co = Signal(32)
        m.d.sync += s_co.eq(qs_rd.data.cur_off)
        sd_rem_c = Signal(32)
        m.d.comb += sd_rem_c.eq(w.length - s_co)
        assert len(w.length) == len(s.cur_off) == 32
        # The WQE's READ flag is registered (stage 1: w valid from CHK1; stage 2 and DO use it):
        # from w.opcode through it into stage 2's sums it was -0.60 ns routed on the ECPIX-5
        # core at e7458bf (w -> sd_hp_diff: 20 failing endpoints, and sd_after_ge).
        sd_rd = Signal()
        m.d.sync += sd_rd.eq(w.opcode == WrOpcode.RDMA_READ)
        sd_mask = Signal(16)
        m.d.comb += sd_mask.eq((Const(1, 17) << csr.ackreq_shift)[:16] - 1)
        # The READ's packet count rd_n (the rest of the WQE) is registered less one (rd_q), and
        # whether it wraps to 0 in 24 bits (rd_wrap: 2**24 packets, only at a 256-byte MTU):
        # stage 1 then ends at the shift after the subtraction, without the + 1's carry chain
        # (s.cur_off -> sd_rd_n: 47 failing endpoints, -2.13 ns routed on the ECPIX-5 core at
        # ec958a5, its first net 59 tiles). Stage 2 adds the one as the carry into its sums
        # (consumed = rd_n for a READ, else 1: x + consumed = x + sd_b + sd_c).
        sd_lm1 = Signal(32)         # w.length - cur_off - 1 (+ ~cur_off: one carry chain)
        sd_l0 = Signal()
        m.d.comb += [sd_lm1.eq((w.length + ~s_co)[:32]), sd_l0.eq(w.length == s_co)]
        sd_b = Signal(24)
        sd_c = Signal()
        m.d.comb += [sd_b.eq(Mux(sd_rd & ~sd.rd_wrap, sd.rd_q, 0)),
                     sd_c.eq(~(sd_rd & sd.rd_wrap))]

        def plus_consumed(x):
            """x + consumed in len(x) + 1 bits, one carry chain (sd_c the carry in)."""
            return (Cat(sd_c, x) + Cat(Const(1, 1), sd_b))[1:len(x) + 2]

        sd_after_c = Signal(25)
        m.d.comb += sd_after_c.eq(plus_consumed(sd.out))
        sd_new_npsn_c = Signal(24)
        m.d.comb += sd_new_npsn_c.eq(plus_consumed(s.npsn))
        # send_go: the SEND event sends (DO, and it can: ~err, ~rnr_wait, sq_cur != sq_head,
        # npsn - una < window, RTS), a flip-flop set in CHK2 with do_ev. txq's write enable and
        # the sent report take it: gated by in_do and a compare of ev, the write enable ran to
        # the load enables of txq's ~430-bit output register (in_do -> txq r_data: 22 failing
        # endpoints, -1.21 ns routed on the ECPIX-5 core at ec958a5, and on into the builder).
        sd_can_c = Signal()
        m.d.comb += sd_can_c.eq(~s.err & ~s.rnr_wait & (s.sq_cur != s.sq_head)
                                & (outstanding < csr.window) & (c.state == QpState.RTS))
        send_go = Signal()
        m.d.sync += send_go.eq(0)       # (CHK2 sets it for the DO clock; SEND's DO lasts one)
        m.d.sync += [
            # stage 1
            sd.rem.eq(sd_rem_c),
            sd.f.eq(s_co == 0),
            # (length - cur_off - 1 = length + ~cur_off for equal widths: one carry chain)
            sd.rd_q.eq(npkts_m1(sd_rem_c, mtu_shift, lm1_zero=(sd_lm1, sd_l0))),
            sd.rd_wrap.eq((mtu_shift == 8) & (sd_lm1[8:] == 0xFFFFFF) & ~sd_l0),
            sd.out.eq(outstanding),
            # (TIMEOUT's test, in DO: from s through the subtraction into the FSM's next state
            # it was 8.6 LUT levels out of context)
            sd.out_nz.eq(s.npsn != s.una),
            sd.va.eq(w.raddr + s_co),
            sd.addr.eq(w.laddr + s_co),
            sd.off_mtu.eq(s_co + mtu),
            sd.mark.eq((s.npsn[:16] & sd_mask) == sd_mask),
            sd.cur_ne.eq(s.sq_cur != s.sq_head),            # the "more work" tests
            sd.cur1_ne.eq((s.sq_cur + 1)[:len(s.sq_cur)] != s.sq_head),
            # stage 2
            sd.lst.eq(sd_rd | (sd.rem <= mtu)),
            sd.after.eq(sd_after_c),
            sd.after_ge.eq(sd_after_c >= csr.window),
            sd.new_npsn.eq(sd_new_npsn_c),
            sd.hp_diff.eq(sd_new_npsn_c - s.hpsn),
            sd.last.eq(s.npsn + sd.rd_q),    # the WQE's last PSN (first packet: rem = length)
        ]

        # ns_af: AFTER's go-back-N rewind (npsn = una, sq_cur = sq_tail, cur_off of una in the
        # oldest WQE, queued) or FLUSH's end (err, sq_cur = sq_head = sq_tail there, cur_off 0,
        # npsn = una, rnr_wait cleared). sq_tail == sq_head and the offset are registered (rc_*:
        # s and w hold still from the clock before AFTER; FLUSH writes only when they are equal)
        fatal_end = Signal()
        m.d.comb += fatal_end.eq(qs_src == SRC_FATAL)
        m.d.comb += [
            ns_af.eq(s),
            ns_af.npsn.eq(s.una),
            ns_af.sq_cur.eq(s.sq_tail),
            # (an oldest WQE never sent, e.g. posted during an RNR wait after everything before
            # it was acknowledged, starts from its beginning)
            ns_af.cur_off.eq(Mux(~rc.tail_ne | ~w.sent, 0, rc.cur_off_a)),
            ns_af.queued.eq(s.queued | ~fatal_end),
            ns_af.err.eq(s.err | fatal_end),
            ns_af.rnr_wait.eq(s.rnr_wait & ~fatal_end),
        ]

        # --- POST: the work request's status, registered every clock from s, c and wr (valid
        # in DO after CHK1)
        po_known = Signal()
        with m.Switch(wrq.opcode):
            with m.Case(*[int(o) for o in WrOpcode]):
                m.d.comb += po_known.eq(1)
        po_status = Signal(5)
        with m.If(s.err | (c.state == QpState.ERROR)):
            m.d.sync += po_status.eq(WcStatus.WR_FLUSH_ERR)
        with m.Elif((c.state != QpState.RTS) | ~po_known | (sq_used == SQ)):
            m.d.sync += po_status.eq(WcStatus.LOC_QP_OP_ERR)
        with m.Elif(wrq.inline & (wrq.length > INLINE_MAX)):
            m.d.sync += po_status.eq(WcStatus.LOC_LEN_ERR)
        with m.Else():
            m.d.sync += po_status.eq(WcStatus.SUCCESS)

        # The send queue's WQE write (a POST's new WQE at sq_head, or a SEND's first packet
        # recording its PSNs at sq_cur, chosen by the event alone) and the receive queue's (a
        # RECV's at rq_head): address and data in every clock, like the inline data's; only the
        # enables wait for the decision (through it the WQE's ~370 bits ran 10.5 ns routed on
        # the ECPIX-5 core at d76ba5e).
        wq_post = Signal(wqe_l)
        wq_send = Signal(wqe_l)
        m.d.comb += [
            wq_post.opcode.eq(wrq.opcode), wq_post.signaled.eq(wrq.signaled),
            wq_post.inline.eq(wrq.inline), wq_post.wr_id.eq(wrq.wr_id),
            wq_post.laddr.eq(wrq.laddr), wq_post.length.eq(wrq.length),
            wq_post.raddr.eq(wrq.raddr), wq_post.rkey.eq(wrq.rkey), wq_post.imm.eq(wrq.imm),
            wq_send.eq(w), wq_send.first_psn.eq(s.npsn), wq_send.last_psn.eq(sd.last),
            wq_send.sent.eq(1),
            sq_wr.addr.eq(Cat(Mux(ev == _Ev.POST, s.sq_head, s.sq_cur)[:SQB], qp)),
            sq_wr.data.eq(Mux(ev == _Ev.POST, wq_post, wq_send)),
            rq_wr.addr.eq(Cat(s.rq_head[:RQB], qp)),
            rq_wr.data.wr_id.eq(rrq.wr_id), rq_wr.data.addr.eq(rrq.addr),
            rq_wr.data.length.eq(rrq.length),
        ]

        m.d.sync += sq_ra.eq(Cat((s.sq_tail + 1)[:SQB], qp))    # LOAD overrides (below)
        prefer_rx = Signal()
        GO_STAY, GO_IDLE, GO_WALK, GO_AFTER = range(4)
        do_go = Signal(2)           # where DO goes next (its decision, below the FSM)
        in_do = Signal()            # the FSM is in DO
        # do_ev: in_do split by event, one flip-flop each (set with in_do in CHK2, from ev):
        # DO's decisions are gated by their own event's flip-flop rather than by in_do and a
        # compare of ev (ev -> ns_do_r: 84 failing endpoints, -1.40 ns routed on the ECPIX-5
        # core at ec958a5; the compares' outputs fanned out over the whole decision).
        do_ev = {e: Signal(name=f"do_{e.name.lower()}") for e in _Ev}
        in_flush = Signal()         # the FSM is in FLUSH (set on the way in, like in_do)
        # AFTER_RX decides outside the FSM too, under in_arx (set on the way in, like in_do);
        # arx_done says where it goes next (IDLE, else AFTER). Its decision (the state word
        # ns_resp above all) then starts at one flip-flop rather than at a compare of the
        # FSM's state register (rc_moved_b -> ns_oth_r: 25 failing endpoints, -0.99 ns routed on
        # the ECPIX-5 core at ec958a5; from the state register it was 8.6 LUT levels
        # out of context).
        in_arx = Signal()
        arx_done = Signal()
        # w loads in EVAL, WALK_LD and FLUSH_LD: on a flip-flop set on the way in (w_ld), not on
        # a compare of the state register (ev_state -> w's ~200 enables: 84 failing endpoints,
        # -1.71 ns, routed on the ECPIX-5 core at 245eb29).
        w_ld = Signal()
        m.d.sync += w_ld.eq(0)
        with m.If(w_ld):
            m.d.sync += w.eq(sq_rd.data)
        with m.FSM(name="ev"):
            with m.State("IDLE"):
                can_send = Signal()
                m.d.comb += can_send.eq(self.sched_pop.valid & txq.w_rdy)
                others = Signal()
                m.d.comb += others.eq(toq.r_rdy | can_send | self.wr.valid | self.rr.valid)
                m.d.sync += qp_s.eq(rrq.qp)      # (each event below loads its own, as qp)
                with m.If(initq.r_rdy):
                    m.d.sync += [ev.eq(_Ev.INIT), qp.eq(init.index), qp_s.eq(init.index)]
                    m.next = "LOAD"
                with m.Elif(self.rx_meta.valid & ~rx_taking & (prefer_rx | ~others)):
                    m.d.sync += [ev.eq(_Ev.RX), qp.eq(meta.ann.qp), qp_s.eq(meta.ann.qp), prefer_rx.eq(0)]
                    m.next = "LOAD"
                with m.Elif(toq.r_rdy):
                    m.d.comb += toq.r_en.eq(1)
                    m.d.sync += [ev.eq(_Ev.TIMEOUT), qp.eq(toq.r_data), qp_s.eq(toq.r_data), prefer_rx.eq(1)]
                    m.next = "LOAD"
                with m.Elif(can_send):
                    m.d.comb += self.sched_pop.ready.eq(1)
                    pop_qp = self.sched_pop.payload.qp
                    m.d.sync += [ev.eq(_Ev.SEND), qp.eq(pop_qp), qp_s.eq(pop_qp), prefer_rx.eq(1)]
                    m.next = "LOAD"
                with m.Elif(self.wr.valid):
                    m.d.sync += [ev.eq(_Ev.POST), qp.eq(wrq.qp), qp_s.eq(wrq.qp), prefer_rx.eq(1)]
                    m.next = "LOAD"
                with m.Elif(self.rr.valid):
                    m.d.sync += [ev.eq(_Ev.RECV), qp.eq(rrq.qp), qp_s.eq(rrq.qp), prefer_rx.eq(1)]
                    m.next = "LOAD"
                with m.Else():
                    m.d.sync += prefer_rx.eq(1)

            with m.State("LOAD"):
                m.d.sync += sq_ra.eq(sq_ra_load)    # the WQE read in GOT (slot shadow)
                m.next = "GOT"      # qs/txc/tmr read at qp: valid in GOT

            with m.State("GOT"):
                q = Signal(qs_l)
                m.d.comb += q.eq(qs_rd.data)
                m.d.sync += [s.eq(q), c.eq(txc_rd.data), t.eq(tmr_rd.data), flushing.eq(0)]
                # (sq/sqd read at sq_ra, rq at rq_ra, both registered in LOAD: valid in EVAL)
                m.d.sync += w_ld.eq(1)
                m.next = "EVAL"

            with m.State("EVAL"):
                m.d.sync += [wd.eq(sqd_rd.data), rqe.eq(rq_rd.data)]     # (w: w_ld)
                m.next = "CHK1"

            # Two clocks in which s, c, w, rqe and the event's input hold still while the
            # registered checks (responder flags, sd_*) settle: stage 1 from them, stage 2
            # from stage 1; DO decides from the registers.
            with m.State("CHK1"):
                m.next = "CHK2"
            with m.State("CHK2"):
                m.d.sync += qs_src.eq(Mux(ev == _Ev.TIMEOUT, SRC_REWIND, SRC_DO))
                # a request packet waits here for room in pdq, mvq and invq (registered: DO
                # pushes a clock later, and neither CHK1 nor CHK2 pushes)
                with m.If((ev != _Ev.RX) | ~req_r
                          | (pdq_room & mvq_room & invq_room)):
                    m.d.sync += [in_do.eq(1), *(do_ev[e].eq(ev == e) for e in _Ev),
                                 send_go.eq((ev == _Ev.SEND) & sd_can_c)]
                    m.next = "DO"

            with m.State("DO"):
                # (the decision itself is made outside the FSM, below, under in_do)
                with m.Switch(do_go):
                    for go, state in ((GO_IDLE, "IDLE"), (GO_WALK, "WALK"), (GO_AFTER, "AFTER")):
                        with m.Case(go):
                            m.next = state
                m.d.sync += [in_do.eq(do_go == GO_STAY),
                             *(do_ev[e].eq(do_ev[e] & (do_go == GO_STAY)) for e in _Ev)]


            # ---------------------------------------------------- send-queue walk (responses)
            with m.State("WALK"):
                # w = the WQE at sq_tail; complete it if the response covers it.
                unsent = Signal()
                m.d.comb += unsent.eq(~sent_any | wk.te)      # sq_tail == sq_head
                covered = Signal()
                # walk_span's top bit set: una has passed walk_to, nothing more is covered
                m.d.comb += covered.eq(~wk.ack_none & ~unsent & ~wk.span[23] & wk.le)
                # the next WQE (sq_ra = s.sq_tail + 1) is read whether or not this one is
                # covered (WALK_LD loads it only if it is)
                is_rd = Signal()
                m.d.comb += is_rd.eq(w.opcode == WrOpcode.RDMA_READ)
                # the entry WALK pushes (if it does): w's completion (pde outside DO, below)
                with m.If(covered & is_rd):
                    # An ACK/NAK past a READ whose responses are missing: they were lost, resend
                    # from una (once until progress: later ACKs in flight say the same). A READ
                    # response past it: out of sequence, dropped.
                    m.d.sync += after.eq(Mux(ack_r & ~s.lost_rd, A_LOSTREAD, A_NONE))
                    m.next = "RX_CHK1"
                with m.Elif(covered):
                    with m.If(pdq_room):
                        m.d.comb += [pd_push.eq(w.signaled), self.sq_retire.valid.eq(1)]
                        m.d.sync += [s.sq_tail.eq(s.sq_tail + 1), s.una.eq(wk.last1)]
                        with m.If(s.sq_cur == s.sq_tail):
                            # acknowledged beyond a rewound send pointer: skip what needs no resend
                            m.d.sync += [s.sq_cur.eq(s.sq_tail + 1), s.cur_off.eq(0)]
                        m.d.sync += w_ld.eq(1)
                        m.next = "WALK_LD"
                with m.Else():
                    # The response ends inside this WQE (or nothing is left to complete).
                    with m.If(~wk.ack_none & ~unsent & ~is_rd & ack_r
                              & wk.lt_sent):       # walk_span < sent_span
                        m.d.sync += s.una.eq(walk_to + 1)
                    with m.If(ack_r):
                        with m.Switch(syn[5:8]):
                            with m.Case(Syndrome.ACK):
                                m.d.sync += after.eq(A_ACK)
                            with m.Case(Syndrome.RNR_NAK):
                                m.d.sync += after.eq(A_RNR)
                            with m.Case(Syndrome.NAK):
                                with m.If(syn[0:5] == NakCode.PSN_SEQ_ERR):
                                    m.d.sync += after.eq(A_SEQ)
                                with m.Else():
                                    m.d.sync += after.eq(A_FATAL)
                                    with m.Switch(syn[0:5]):
                                        with m.Case(NakCode.INV_REQ):
                                            m.d.sync += fatal_status.eq(WcStatus.REM_INV_REQ_ERR)
                                        with m.Case(NakCode.REM_ACCESS):
                                            m.d.sync += fatal_status.eq(WcStatus.REM_ACCESS_ERR)
                                        with m.Default():
                                            m.d.sync += fatal_status.eq(WcStatus.REM_OP_ERR)
                            with m.Default():
                                m.d.sync += after.eq(A_NONE)
                    with m.Else():
                        m.d.sync += after.eq(A_READ)
                    m.next = "RX_CHK1"

            with m.State("WALK_LD"):
                # w loads here (w_ld), addressed in WALK (sq_tail + 1)
                m.next = "WALK_CHK"
            with m.State("WALK_CHK"):
                m.next = "WALK"      # the wk_* checks of the new WQE settle

            # ---------------------------------------------------- act on a response
            # Two clocks in which s, w and the packet hold still while the rc_* registers
            # (free-running, below) settle: stage 1 from them, stage 2 from stage 1.
            with m.State("RX_CHK1"):
                m.next = "RX_CHK2"
            with m.State("RX_CHK2"):
                m.d.sync += qs_src.eq(SRC_RESP)
                # AFTER_RX pushes pdq and mvq: wait here for room (registered, as in CHK2)
                with m.If(pdq_room & mvq_room):
                    m.d.sync += in_arx.eq(1)
                    m.next = "AFTER_RX"
            with m.State("AFTER_RX"):
                # (the decision itself is made outside the FSM, below, under in_arx)
                m.d.sync += in_arx.eq(0)
                with m.If(arx_done):
                    m.next = "IDLE"
                with m.Else():
                    m.next = "AFTER"

            # ---------------------------------------------------- rewind or fatal
            with m.State("AFTER"):
                with m.If(after == A_FATAL):
                    m.d.sync += [qs_src.eq(SRC_FATAL), in_flush.eq(1)]
                    m.next = "FLUSH"
                with m.Else():
                    # go-back-N: resend from una; w = the oldest WQE (holds una); ns_af
                    m.d.comb += [
                        *write_state(ns_af),
                        sched_push.eq(~s.queued),
                        csr.retransmits_inc.eq(1),
                    ]
                    m.next = "IDLE"

            with m.State("FLUSH"):
                # w = the WQE at sq_tail: the failing one first, then the rest (WR_FLUSH_ERR);
                # the entry it pushes (if it does): pde outside DO, below
                with m.If(~rc.tail_ne):     # sq_tail == sq_head (registered, s holds still)
                    with m.If(errq.w_rdy):
                        m.d.comb += [
                            *write_state(ns_af),
                            errq.w_en.eq(1), errq.w_data.eq(qp), csr.qp_errors_inc.eq(1),
                            *disarm_timer(1),
                        ]
                        m.d.sync += in_flush.eq(0)
                        m.next = "IDLE"
                with m.Elif(pdq_room):
                    m.d.comb += [pd_push.eq(1), self.sq_retire.valid.eq(1)]  # sq_ra = sq_tail + 1
                    m.d.sync += [s.sq_tail.eq(s.sq_tail + 1), flushing.eq(1), in_flush.eq(0)]
                    m.d.sync += w_ld.eq(1)
                    m.next = "FLUSH_LD"
            with m.State("FLUSH_LD"):
                m.d.sync += in_flush.eq(1)      # (w loads: w_ld)
                m.next = "FLUSH"

        # ---------------------------------------------------- the pdq entry outside DO
        # WALK, FLUSH and AFTER_RX push one entry only: the completion of w (success, or in
        # FLUSH the failing WQE's status and WR_FLUSH_ERR after it). It is made here in every
        # clock outside DO, whatever the state (pdq takes it only with pd_push), its status
        # chosen by a flip-flop (in_flush): from the FSM's state register through the state
        # compares to the entry's CQE it was -4.10 ns routed on the ECPIX-5 core at 245eb29.
        with m.If(~in_do):
            m.d.comb += pde.has_cqe.eq(1)

        # ---------------------------------------------------- the pdq entry's completion
        # Likewise the completion in every entry, whatever the decision (pdq's consumers read
        # it only with has_cqe, which the decisions set): w's outside DO (above), and in DO the
        # one its event makes, chosen by the event's flip-flop (do_ev) and, for a received
        # packet, by registered flags (rs.over: the receive WQE completes in error, else it was
        # accepted; the opcode decode). Chosen inside the decision, from the QP state through
        # it into the completion it was -1.31 ns routed on the ECPIX-5 core at ec958a5
        # (ns_do_r -> pde_r.cqe: 49 failing endpoints; is_send_r -> pde_r.cqe.byte_len: 25).
        cqe_l = struct_layout(COMPLETION)
        cqe_w, cqe_rx, cqe_post, cqe_recv = (Signal(cqe_l, name=f"cqe_{n}")
                                             for n in ("w", "rx", "post", "recv"))
        m.d.comb += cqe_for_wqe(cqe_w, w, Mux(in_flush, Mux(flushing, WcStatus.WR_FLUSH_ERR,
                                                            fatal_status),
                                              WcStatus.SUCCESS))
        wq_po = Signal(wqe_l)       # (POST: a work request that fails completes at once)
        m.d.comb += [wq_po.opcode.eq(wrq.opcode), wq_po.wr_id.eq(wrq.wr_id),
                     wq_po.length.eq(wrq.length)]
        m.d.comb += cqe_for_wqe(cqe_post, wq_po, po_status)
        m.d.comb += [       # (RECV: a receive request rejected)
            cqe_recv.qp.eq(qp), cqe_recv.is_recv.eq(1),
            cqe_recv.status.eq(Mux(c.state == QpState.ERROR, WcStatus.WR_FLUSH_ERR,
                                   WcStatus.LOC_QP_OP_ERR)),
            cqe_recv.opcode.eq(WcOpcode.RECV), cqe_recv.wr_id.eq(rrq.wr_id),
        ]
        # RX: a SEND too long for the receive buffer (rs.over: LOC_LEN_ERR, no length, no
        # immediate), or an accepted SEND LAST/ONLY or WRITE with immediate
        rx_ok = ~rs.over
        m.d.comb += [
            cqe_rx.qp.eq(qp), cqe_rx.is_recv.eq(1),
            cqe_rx.status.eq(Mux(rs.over, WcStatus.LOC_LEN_ERR, WcStatus.SUCCESS)),
            cqe_rx.opcode.eq(Mux(R_is_write, WcOpcode.RECV_RDMA_WITH_IMM, WcOpcode.RECV)),
            cqe_rx.wr_id.eq(rqe.wr_id),
            cqe_rx.byte_len.eq(Mux(rx_ok, Mux(R_is_write, Mux(R_only, rec.reth_dma_length,
                                                              s.wlen),
                                              send_total), 0)),
            cqe_rx.has_imm.eq(rx_ok & dec_r["with_imm"]),
            cqe_rx.has_inv.eq(rx_ok & dec_r["with_inv"]),
            cqe_rx.imm.eq(Mux(rx_ok, Mux(dec_r["with_inv"], rec.ieth_rkey, rec.immdt_data), 0)),
            cqe_rx.src_qpn.eq(Mux(rx_ok, ictx.remote_qpn, 0)),
        ]
        m.d.comb += pde.cqe.eq(Mux(do_ev[_Ev.RX], cqe_rx,
                                   Mux(do_ev[_Ev.POST], cqe_post,
                                       Mux(do_ev[_Ev.RECV], cqe_recv, cqe_w))))

        # ---------------------------------------------------- the deciding state (DO)
        # Made outside the FSM, under do_ev (one flip-flop per event, set exactly while the FSM
        # is in DO with that event), so that every decision, the state word above all, is
        # gated by one flip-flop rather than by a compare of the FSM's state register (and of
        # ev); do_go says where DO goes next (GO_STAY: it waits for room). From the state
        # register through the decision to the state word it was 9 LUT levels, 12.6 ns routed
        # on the ECPIX-5 core at 41d0b9a.
        arx_mvw = Signal()          # AFTER_RX moves the READ response's payload
        with m.If(in_arx):
            self._after_rx(m, locals())

        ns = ns_do
        self._send_desc(m, locals())        # (the SEND event's packet, in every clock)
        # ------------------------------------------------ host wrote the context
        with m.If(do_ev[_Ev.INIT]):
            wctx = init.ctx
            with m.If(init_a):      # (registered: sq_psn written, or state RESET / INIT)
                m.d.comb += [
                    ns.sq_head.eq(0), ns.sq_tail.eq(0), ns.sq_cur.eq(0),
                    ns.cur_off.eq(0), ns.npsn.eq(wctx.sq_psn), ns.una.eq(wctx.sq_psn),
                    ns.hpsn.eq(wctx.sq_psn),
                    ns.retry_left.eq(wctx.retry_cnt), ns.rnr_left.eq(wctx.rnr_retry),
                    ns.err.eq(0), ns.rnr_wait.eq(0), ns.lost_rd.eq(0),
                    *disarm_timer(1),
                ]
            with m.If(rsel.init):   # (epsn written, or state RESET / INIT; rsel: below)
                m.d.comb += ns.rq_head.eq(0)
            m.d.comb += [*write_state(ns), initq.r_en.eq(1)]
            m.d.comb += do_go.eq(GO_IDLE)

        # ------------------------------------------------ received packet
        with m.If(do_ev[_Ev.RX]):
            with m.If(req_r):
                # (pdq, mvq and invq have room: checked in CHK2)
                m.d.comb += [rx_take.eq(1), mv_push.eq(1), *write_state(ns)]
                self._respond(m, ns, pde, pd_push, mve, locals())
                m.d.comb += do_go.eq(GO_IDLE)
            with m.Elif(resp_r & (c.state == QpState.RTS) & ~s.err
                        & resp_valid & syn_known):
                m.d.sync += una0.eq(s.una)
                m.d.comb += do_go.eq(GO_WALK)
            with m.Else():
                with m.If(mvq_room):
                    m.d.comb += [rx_take.eq(1), mv_push.eq(1)]     # (mve.write: 0, below)
                    with m.If(resp_r):
                        m.d.comb += csr.rx_stale_inc.eq(1)
                    with m.Elif(cnp_r):
                        pass    # the reaction point took it (stellar.hdl.cc)
                    with m.Else():
                        m.d.comb += csr.rx_drop_state_inc.eq(1)
                    m.d.comb += do_go.eq(GO_IDLE)

        # ------------------------------------------------ timer expiry
        with m.If(do_ev[_Ev.TIMEOUT]):
            with m.If(~t_expired | s.err):
                m.d.comb += do_go.eq(GO_IDLE)      # stale scan result: the word changed since
            with m.Elif(t.rnr):
                m.d.comb += disarm_timer(1)
                with m.If(s.rnr_wait):
                    m.d.sync += [s.rnr_wait.eq(0), after.eq(A_REWIND)]
                    m.d.comb += do_go.eq(GO_AFTER)
                with m.Else():
                    m.d.comb += do_go.eq(GO_IDLE)
            with m.Elif(sd.out_nz):       # outstanding != 0
                m.d.comb += [csr.timeouts_inc.eq(1), *disarm_timer(1)]
                with m.If(s.retry_left == 0):
                    m.d.sync += [fatal_status.eq(WcStatus.RETRY_EXC_ERR),
                                 after.eq(A_FATAL)]
                with m.Else():
                    m.d.sync += [s.retry_left.eq(s.retry_left - 1), after.eq(A_REWIND)]
                m.d.comb += do_go.eq(GO_AFTER)
            with m.Else():
                m.d.comb += disarm_timer(1)
                m.d.comb += do_go.eq(GO_IDLE)

        # ------------------------------------------------ send one packet
        with m.If(do_ev[_Ev.SEND]):
            self._send(m, ns, locals())

        # ------------------------------------------------ post a work request
        with m.If(do_ev[_Ev.POST]):
            self._post(m, ns, locals())

        # ------------------------------------------------ post a receive
        with m.If(do_ev[_Ev.RECV]):
            full = Signal()
            m.d.comb += full.eq((s.rq_head - s.rq_tail) == RQ)
            bad = Signal()
            m.d.comb += bad.eq(full | (c.state == QpState.ERROR)
                               | (c.state == QpState.RESET))
            with m.If(~bad):
                m.d.comb += [
                    rq_wr.en.eq(1),         # (address and data in every clock)
                    ns.rq_head.eq(s.rq_head + 1), *write_state(ns),
                    self.rr.ready.eq(1),
                ]
                m.d.comb += do_go.eq(GO_IDLE)
            with m.Elif(pdq_room):
                m.d.comb += [
                    pd_push.eq(1), pde.has_cqe.eq(1),      # (the completion: cqe_recv)
                    self.rr.ready.eq(1), self.rq_retire.valid.eq(1),
                ]
                m.d.comb += do_go.eq(GO_IDLE)

        # ------------------------------------------------ the responder's fields, the mover entry
        # (after the events: these assignments are the fields' only ones in ns; rsel and the new
        # values are registered, elaborate above)
        m.d.comb += [
            ns.wcur.eq(Mux(rsel.wc, rsp_wcur, Mux(rsel.init, 0, s.wcur))),
            ns.wrem.eq(Mux(rsel.wc, rsp_wrem, Mux(rsel.init, 0, s.wrem))),
            ns.wlen.eq(Mux(rsel.wl, rsp_wlen, Mux(rsel.init, 0, s.wlen))),
            ns.rq_tail.eq(Mux(rsel.rqt, s.rq_tail + 1, Mux(rsel.init, 0, s.rq_tail))),
            ns.rq_off.eq(Mux(rsel.rqo_t, send_total[:32], Mux(rsel.rqo_0, 0, s.rq_off))),
            ns.ack_cnt.eq(Mux(rsel.ack0, 0, Mux(rsel.ackinc, rsp_ack1, s.ack_cnt))),
            ns.in_msg.eq(rsel.in_msg),
            ns.nak_sent.eq(rsel.nak_sent),
        ]
        # The mover entry: a request packet's (DO; written only if accepted, rsel.mvw) or a READ
        # response's (AFTER_RX, in_arx); its address and length in every clock.
        m.d.comb += [
            mve.write.eq(Mux(in_arx, arx_mvw, rsel.mvw)),
            mve.addr.eq(Mux(in_arx, rc.maddr, mv_addr_rx)),
            mve.len.eq(plen),
            mv_wr.eq(Mux(in_arx, arx_mvw, do_ev[_Ev.RX] & rsel.mvw)),
        ]
        return m

    # ------------------------------------------------------------------ decisions
    # The helpers below are parts of ``elaborate`` split out for reading; ``env`` is the
    # elaborate scope (its signals and helper functions).

    def _respond(self, m, ns, pde, pd_push, mve, env):
        """Responder: one request packet (DO state, pdq and mover have room)."""
        v = SimpleNamespace(**{**env, **env["dec_r"]})     # the registered opcode decode
        csr, ictx, s = self.csr, v.ictx, v.s
        psn = v.psn
        nak_syn = Signal(8)
        rs = v.rs       # the outcome, registered (elaborate)
        with m.If(rs.drop):
            m.d.comb += csr.rx_drop_state_inc.eq(1)
        with m.Elif(rs.dup):
            m.d.comb += csr.rx_duplicates_inc.eq(1)
            with m.If(v.is_read):
                # a duplicate READ is executed again from its own RETH (IBTA 9.7.5.1.4)
                m.d.comb += pd_push.eq(~v.mr_fail)
                m.d.comb += v.pd_read_job(ictx.msn)
            with m.Elif(v.ackreq_r):
                m.d.comb += [pd_push.eq(1), *v.pd_ack(ictx.epsn - 1, ack_syndrome(), ictx.msn)]
        with m.Elif(rs.ahead):
            m.d.comb += csr.rx_out_of_sequence_inc.eq(1)
            with m.If(~s.nak_sent):
                m.d.comb += [pd_push.eq(1), *v.pd_ack(ictx.epsn, nak_syndrome(NakCode.PSN_SEQ_ERR),
                                                      ictx.msn),
                             csr.tx_naks_inc.eq(1)]
        with m.Else():
            with m.If(rs.inv):
                m.d.comb += nak_syn.eq(nak_syndrome(NakCode.INV_REQ))
            with m.Elif(rs.acc):
                m.d.comb += nak_syn.eq(nak_syndrome(NakCode.REM_ACCESS))
            with m.Elif(rs.rnr):
                m.d.comb += nak_syn.eq(rnr_syndrome(0) | ictx.min_rnr_timer)
            with m.Elif(rs.over):
                # the message does not fit the receive buffer: the WQE completes in error
                # (the completion's fields: cqe_rx, elaborate)
                m.d.comb += [nak_syn.eq(nak_syndrome(NakCode.INV_REQ)), pde.has_cqe.eq(1),
                             self.rq_retire.valid.eq(1)]
            with m.Else():
                self._accept(m, ns, pde, pd_push, mve, v)
            with m.If(rs.nak):
                m.d.comb += [pd_push.eq(1), *v.pd_ack(psn, nak_syn, ictx.msn),
                             csr.tx_naks_inc.eq(1)]

    def _accept(self, m, ns, pde, pd_push, mve, v):
        """Responder: an in-sequence request that passed every check. (Its fields of the state
        word and the mover entry are chosen by registered selects: rsel, elaborate.)"""
        csr = self.csr
        psn = v.psn
        m.d.comb += [
            csr.rx_requests_inc.eq(1),
            v.wb_go.eq(1),              # the write-back, a clock later with the take (elaborate)
        ]
        with m.If(v.is_write):
            with m.If(v.with_imm):
                m.d.comb += [
                    self.rq_retire.valid.eq(1),
                    pde.has_cqe.eq(1), pd_push.eq(1),     # (the completion: cqe_rx)
                ]
        with m.If(v.is_send):
            with m.If(v.msg_end & v.with_inv):
                # the receiving side invalidates the MR the IETH names (if it is the QP's own)
                m.d.comb += v.inv_push.eq(1)    # (invq's data: rkey, tenant, pd)
            with m.If(v.msg_end):
                m.d.comb += [
                    self.rq_retire.valid.eq(1),
                    pde.has_cqe.eq(1), pd_push.eq(1),     # (the completion: cqe_rx)
                ]
        with m.If(v.is_read):
            m.d.comb += [pd_push.eq(1), *v.pd_read_job(v.new_msn)]
        with m.Else():
            with m.If(v.ackreq_r | v.rsp_ack_due):     # count >= ack_coalesce != 0
                m.d.comb += [pd_push.eq(1), *v.pd_ack(psn, ack_syndrome(), v.new_msn)]

    def _send_desc(self, m, env):
        """Requester: the packet a SEND event sends, made in every clock (txq and the sent
        report take it with send_go, a flip-flop: elaborate)."""
        v = SimpleNamespace(**env)
        csr, s, w, sd, send_go = self.csr, v.s, v.w, v.sd, v.send_go
        # registered: rem = w.length - cur_off; f = cur_off == 0; lst = READ or rem <= mtu
        rem = sd.rem
        rd = v.sd_rd
        f = sd.f
        lst = sd.lst
        opc = Signal(8)
        imm_op = (w.opcode == WrOpcode.SEND_WITH_IMM) | (w.opcode == WrOpcode.RDMA_WRITE_WITH_IMM)
        with m.Switch(w.opcode):
            with m.Case(WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.SEND_WITH_INV):
                only_op = Mux(w.opcode == WrOpcode.SEND_WITH_INV, O.SEND_ONLY_INV,
                              Mux(imm_op, O.SEND_ONLY_IMM, O.SEND_ONLY))
                last_op = Mux(w.opcode == WrOpcode.SEND_WITH_INV, O.SEND_LAST_INV,
                              Mux(imm_op, O.SEND_LAST_IMM, O.SEND_LAST))
                m.d.comb += opc.eq(Mux(f & lst, only_op, Mux(f, O.SEND_FIRST,
                                                             Mux(lst, last_op, O.SEND_MIDDLE))))
            with m.Case(WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM):
                only_op = Mux(imm_op, O.WRITE_ONLY_IMM, O.WRITE_ONLY)
                last_op = Mux(imm_op, O.WRITE_LAST_IMM, O.WRITE_LAST)
                m.d.comb += opc.eq(Mux(f & lst, only_op, Mux(f, O.WRITE_FIRST,
                                                             Mux(lst, last_op, O.WRITE_MIDDLE))))
            with m.Default():
                m.d.comb += opc.eq(O.READ_REQUEST)
        # npsn - una + PSNs this packet takes (READ: the rest of the message, else 1)
        after_out = sd.after
        desc = Signal(tx_desc_layout(self.index_bits))
        m.d.comb += [
            desc.qp.eq(v.qp),
            desc.opcode.eq(opc),
            desc.psn.eq(s.npsn),
            desc.ackreq.eq(lst | sd.after_ge | sd.mark),
            desc.va.eq(sd.va),      # w.raddr + cur_off
            desc.rkey.eq(w.rkey),
            desc.dma_len.eq(Mux(rd, rem, w.length)),
            desc.imm.eq(w.imm),
            desc.plen.eq(Mux(rd, 0, Mux(lst, rem, v.mtu))),
            desc.src.eq(Mux(w.inline, PayloadSrc.INLINE, PayloadSrc.DMA)),
            desc.addr.eq(sd.addr),  # w.laddr + cur_off
            desc.inline.eq(v.wd),
            v.txq.w_en.eq(send_go),
            v.txq.w_data.eq(desc),
            csr.tx_packets_inc.eq(send_go),
            v.sent_v.eq(send_go),
        ]
        with m.If(send_go):
            m.d.comb += [
                v.sent_p.qp.eq(v.qp),
                v.sent_p.bytes.eq(desc.plen),
                v.sent_p.inflight.eq(Mux(after_out[16:] != 0, 0xFFFF, after_out[:16])),
            ]

    def _send(self, m, ns, env):
        """Requester: send the next packet of the QP (DO state of a SEND event; the packet
        itself: ``_send_desc``)."""
        v = SimpleNamespace(**env)
        s, t, sd = v.s, v.t, v.sd
        # ~err, ~rnr_wait, sq_cur != sq_head, npsn - una < window, RTS (registered, with DO)
        with m.If(~v.send_go):
            m.d.comb += [ns.queued.eq(0), *v.write_state(ns)]
            m.d.comb += v.do_go.eq(v.GO_IDLE)
        with m.Else():
            lst = sd.lst
            with m.If(sd.f):
                # (address and data: in every clock, elaborate)
                m.d.comb += v.sq_wr.en.eq(1)
            with m.If(~t.armed):
                m.d.comb += v.arm_timer(1)
            new_npsn = sd.new_npsn      # npsn + the PSNs this packet takes
            with m.If(sd.hp_diff != 0):     # new_npsn - hpsn
                with m.If(~sd.hp_diff[23]):
                    m.d.comb += ns.hpsn.eq(new_npsn)
            m.d.comb += [
                ns.npsn.eq(new_npsn),
                ns.cur_off.eq(Mux(lst, 0, sd.off_mtu)),
                ns.sq_cur.eq(Mux(lst, s.sq_cur + 1, s.sq_cur)),
            ]
            more = Signal()
            # ns.sq_cur != s.sq_head and after_out < window
            m.d.comb += more.eq(Mux(lst, sd.cur1_ne, sd.cur_ne) & ~sd.after_ge)
            m.d.comb += [v.sched_push.eq(more), ns.queued.eq(more), *v.write_state(ns)]
            m.d.comb += v.do_go.eq(v.GO_IDLE)

    def _post(self, m, ns, env):
        """A work request for the send queue (DO state of a POST event)."""
        v = SimpleNamespace(**env)
        s = v.s
        status = v.po_status        # registered (s, c and the request hold still)
        with m.If(status == WcStatus.SUCCESS):
            m.d.comb += [
                v.sq_wr.en.eq(1), v.sqd_wr.en.eq(1),    # (address and data in every clock)
                ns.sq_head.eq(s.sq_head + 1), ns.queued.eq(1), v.sched_push.eq(~s.queued),
                *v.write_state(ns),
                self.wr.ready.eq(1),
            ]
            m.d.comb += v.do_go.eq(v.GO_IDLE)
        with m.Elif(v.pdq_room):
            # (the completion: cqe_post, elaborate)
            m.d.comb += [v.pd_push.eq(1), v.pde.has_cqe.eq(1), self.wr.ready.eq(1),
                         self.sq_retire.valid.eq(1)]
            m.d.comb += v.do_go.eq(v.GO_IDLE)

    def _after_rx(self, m, env):
        """Requester: act on a response once the walk has completed what it covers."""
        v = SimpleNamespace(**env)
        csr, s, c, w, rc = self.csr, v.s, v.c, v.w, v.rc
        # (pdq and mvq have room: checked in RX_CHK2)
        ns = v.ns_resp
        m.d.comb += [v.rx_take.eq(1), v.mv_push.eq(1)]
        # what an accepted READ response moves and (its last) completes, in every clock
        # (and the pdq entry it pushes: w's completion, made outside DO in elaborate)
        # (mve.addr: rc.maddr, mve.len: plen, elaborate)
        at_una = Signal()
        m.d.comb += at_una.eq(rc.at_una)
        una_b = Signal()        # ns.una = psn + 1 (an accepted READ response), else s.una
        tail_inc = Signal()     # ns.sq_tail = s.sq_tail + 1 (that READ completed)
        done = Signal()         # write ns and finish (no rewind / fatal; registered)
        m.d.comb += [done.eq(rc.done), una_b.eq(rc.pre_b & rc.rd_ok),
                     tail_inc.eq(una_b & rc.lastpkt)]
        # a walk that completed WQEs is progress: the retry budget starts afresh
        eff_retry = Signal(3)
        m.d.comb += eff_retry.eq(Mux(rc.moved_a, c.retry_cnt, s.retry_left))
        eff_rnr = Signal(3)
        m.d.comb += eff_rnr.eq(Mux(rc.moved_a, c.rnr_retry, s.rnr_left))
        with m.Switch(v.after):
            with m.Case(v.A_ACK):
                m.d.comb += csr.rx_acks_inc.eq(1)
            with m.Case(v.A_SEQ, v.A_LOSTREAD):
                with m.If(at_una | (v.after == v.A_LOSTREAD)):
                    m.d.comb += [csr.rx_acks_inc.eq(1),
                                 ns.lost_rd.eq(v.after == v.A_LOSTREAD)]
                    with m.If(eff_retry == 0):
                        m.d.sync += [v.fatal_status.eq(WcStatus.RETRY_EXC_ERR),
                                     v.after.eq(v.A_FATAL)]
                    with m.Else():
                        m.d.comb += ns.retry_left.eq(eff_retry - 1)
                        m.d.sync += v.after.eq(v.A_REWIND)
                with m.Else():
                    m.d.comb += csr.rx_stale_inc.eq(1)
            with m.Case(v.A_RNR):
                with m.If(at_una):
                    m.d.comb += csr.rx_acks_inc.eq(1)
                    with m.If(~done):       # (eff_rnr == 0) & (c.rnr_retry != 7)
                        m.d.sync += [v.fatal_status.eq(WcStatus.RNR_RETRY_EXC_ERR),
                                     v.after.eq(v.A_FATAL)]
                    with m.Else():
                        m.d.comb += [
                            ns.rnr_left.eq(Mux(c.rnr_retry == 7, eff_rnr, eff_rnr - 1)),
                            ns.rnr_wait.eq(1),
                            v.tmr_wr.en.eq(1),
                            v.tmr_wr.data.armed.eq(1), v.tmr_wr.data.rnr.eq(1),
                            v.tmr_wr.data.deadline.eq(v.rnr_dl),    # now + RNR ticks + 1
                        ]
                with m.Else():
                    m.d.comb += csr.rx_stale_inc.eq(1)
            with m.Case(v.A_FATAL):
                m.d.comb += csr.rx_acks_inc.eq(1)
            with m.Case(v.A_READ):
                # READ response at una for the oldest WQE, a READ, in position
                lastpkt = Signal()      # w.length - ((psn - first_psn) << mtu_shift) <= mtu
                m.d.comb += lastpkt.eq(rc.lastpkt)
                # rc.rd_ok: w is a READ that has been sent, the packet is in position and its
                # length right (registered, stage 4: packet and w only)
                ok = Signal()
                m.d.comb += ok.eq(una_b)     # at_una & rc.tail_ne & rc.rd_ok
                with m.If(ok):
                    m.d.comb += [
                        csr.rx_acks_inc.eq(1),
                        v.arx_mvw.eq(v.plen_nz),
                        ns.una.eq(rc.psn1),
                        ns.retry_left.eq(c.retry_cnt), ns.rnr_left.eq(c.rnr_retry),
                    ]
                    with m.If(lastpkt):
                        m.d.comb += [ns.sq_tail.eq(s.sq_tail + 1),
                                     self.sq_retire.valid.eq(1),
                                     v.pd_push.eq(w.signaled)]
                with m.Else():
                    m.d.comb += csr.rx_stale_inc.eq(1)
            with m.Default():
                m.d.comb += csr.rx_stale_inc.eq(1)
        moved = Signal()
        m.d.comb += moved.eq(Mux(una_b, rc.moved_b, rc.moved_a))
        with m.If(done):
            # progress: counters refreshed, timer re-armed (or disarmed when idle), and the
            # QP scheduled if the window opened on pending work
            with m.If(moved):
                m.d.comb += [ns.retry_left.eq(c.retry_cnt), ns.lost_rd.eq(0)]
                with m.If(v.after != v.A_RNR):
                    m.d.comb += ns.rnr_left.eq(c.rnr_retry)
                # the timer word holds the RNR delay while an RNR wait runs: leave it
                with m.If((v.after != v.A_RNR) & ~s.rnr_wait):
                    with m.If(Mux(una_b, rc.idle_b, rc.idle_a)):     # ns.una == s.npsn
                        m.d.comb += v.disarm_timer(1)
                    with m.Else():
                        m.d.comb += v.arm_timer(1)
            past = Signal()     # ns.una - s.npsn > 0 (registered for both values of ns.una)
            m.d.comb += past.eq(Mux(una_b, rc.past_b, rc.past_a))
            with m.If(past):
                # acknowledged past the send pointer (ACKs of packets sent before a rewind)
                m.d.comb += [
                    ns.npsn.eq(ns.una), ns.sq_cur.eq(ns.sq_tail),
                    # ((ns.una - w.first_psn) << mtu_shift)
                    ns.cur_off.eq(Mux(w.sent & ~tail_inc,
                                      Mux(una_b, rc.cur_off_b, rc.cur_off_a), 0)),
                ]
            work = Signal()     # ns.sq_cur != s.sq_head, from the registered tests
            m.d.comb += work.eq(Mux(past, Mux(tail_inc, rc.tail1_ne, rc.tail_ne), rc.cur_ne)
                                & ~ns.rnr_wait)
            with m.If(work & ~s.queued):
                m.d.comb += [ns.queued.eq(1), v.sched_push.eq(1)]
            m.d.comb += [*v.write_state(ns), v.arx_done.eq(1)]     # (to IDLE)
        with m.Else():
            # (the fields a rewind or fatal path changes: lost_rd, retry_left)
            m.d.sync += [s.lost_rd.eq(ns.lost_rd), s.retry_left.eq(ns.retry_left),
                         v.qs_src.eq(v.SRC_REWIND)]     # (to AFTER)
