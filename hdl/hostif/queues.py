# Ref: stellar.hdl.hostif.formats (the ring contract); rdma-core libibverbs (ibv_post_send /
#      ibv_post_recv / ibv_poll_cq / ibv_req_notify_cq semantics); PCI Express Base 4.0 2.4.1
#      (posted writes stay in order), 6.1.4 (MSI is a posted memory write)
"""The queue engine: send, receive and completion rings in host memory, doorbells and MSI
moderation, between the host and the RC transport's work-request / receive-request /
completion streams.

::

    csr doorbells --+-> doorbell RAMs (index stored at once) --> kick FIFO --+
                    |                                                      v
    csr table cmds -+--------------------------------------------> [fetch machine] <-- sq/rq_retire
                                                                   | active FIFO (round robin)
      dma_rcmd <------------------------------------------------- +  per-queue RAMs
      dma_rdata --> 32-byte chunks --> WQE assembly --> wr FIFO --> wr   (RcTransport.wr)
                                                    --> rr FIFO --> rr   (RcTransport.rr)
      cq (RcTransport.cq) --> [completion machine] --> dma_wcmd, dma_wdata (one CQE each)
                     CQ doorbells / timers ------^  --> MSI FIFO (released by dma_wdone) --> msi

Host side (the contract is ``stellar.hdl.hostif.formats``): rings of ``2**log`` entries at a bus
address aligned to the ring's size, free-running 16-bit indexes. The host configures each ring
through the ``hostq`` table window (``stellar.hdl.regmap.hostq_block``), posts WQEs with one
doorbell write per batch, polls CQEs by their owner bit, and returns CQEs (and arms the CQ)
with the CQ doorbell.

Doorbells. A doorbell write stores its index in a per-queue RAM in the clock its CSR strobe
arrives (one write port owned by the doorbell path: nothing can refuse it), so no index is
ever lost. SQ/RQ doorbells also push the queue's number into a ``kick_depth``-entry FIFO that
wakes the fetch machine; when that FIFO is full the kick is dropped, counted
(``doorbell_overflows``) and a rescan of every queue is scheduled, which finds the stored index.
The CSR write response is never stalled. The CQ doorbell stores the consumer index and, with
``arm``, sets the CQ's arm request (a toggle ``req`` against the completion machine's ``ack``:
several arms before the next CQE are one arm). The CSR bank performs at most one write every
other clock (``AxiLiteCsrBank``), which the doorbell path's two-clock read-modify-write of the
CQ doorbell RAM relies on.

After a reset both machines first clear their state RAMs (``2 * qps`` and ``cqs`` clocks): every
ring is disabled until the host configures it again (table commands wait meanwhile).

Fetch machine (one event at a time, 3 clocks each: pick, read, decide). Events, by priority:
a table command for an SQ/RQ; a kick (or the next queue of a rescan): if the queue has posted
WQEs it joins the round-robin FIFO of active queues (once: a ``queued`` bit); a visit: the queue
at the head of the active FIFO reads ``n = min(posted - fetched, credits, room, to ring end,
max_batch)`` WQEs with ONE DMA read and goes back to the tail while it has posted WQEs left, so
active queues take turns, a batch each. ``credits = depth - (sent - returned)``: ``sent``
counts WQEs the machine has read for the queue (counted when the read is issued), ``returned``
the transport's ``sq_retire`` / ``rq_retire`` pulses (counted by a read-modify-write pipeline
per direction, one pulse per clock, with forwarding), so the engine never has more than
``sq_depth`` / ``rq_depth`` requests of a QP in the transport and its pipeline, and never posts
into a full on-chip queue. ``room`` is space reserved in the ``out_depth``-entry output FIFO,
so read data never waits for the transport and never blocks the DMA reader. A queue without
credits or room stays in the round robin and is visited again (3 clocks per visit, no bus
traffic) until a credit returns.

WQE conversion: the read data is cut into 32-byte chunks (4 beats at 64 bits, half a beat at
512); an SQ WQE (two chunks) becomes one ``WORK_REQUEST`` beat with the QP index added, ``laddr``
= ``data[63:0]`` and ``inline_data`` = 0, or for an inline WQE ``inline_data`` = ``data`` and
``laddr`` = 0; an RQ WQE (one chunk) becomes one ``RECV_REQUEST``. The transport checks the
opcode, lengths and QP state (a bad WQE completes in error there).

Completion machine (one event at a time): a table command for a CQ; a completion from ``cq``:
the QP's send or receive CQ is looked up (``is_recv``), then the CQ's state: CQ out of range
or not enabled -> the completion is dropped and counted; CQ full (``producer - consumer >=
size``, the consumer index being the last CQ doorbell's) -> the completion waits (counted once
in ``cq_full``) and is retried after every other event, so a CQ doorbell frees it (meanwhile it
blocks the completion stream, which is shared by every CQ); else the 32-byte CQE (``CQE``,
``owner = cqe_owner(producer, log)``) is written by one DMA write at ``base + (producer % size)
* 32`` and the producer advances. The CQE writes of all CQs go out in completion order.

MSI moderation, per CQ: ``count`` (``wdata3``, 0 as 1) and ``time`` (``wdata4``, clocks, 0 =
none). An arm (CQ doorbell with ``arm``) makes the next CQEs count: the first CQE after it
starts the timer; the interrupt is raised at the ``count``-th CQE or when the timer runs out
(the timers are scanned one CQ per clock, so up to ``cqs`` clocks late), whichever is first,
and the CQ is disarmed. Only CQEs written after the arm count (the host polls once more after
arming, as with ``ibv_req_notify_cq``). An MSI request (``msi``: the CQ's vector) leaves only
after every CQE write issued before it has its write response (``dma_wdone``): the interrupt
is a separate path in a PCIe core and must not overtake the CQE it announces.

Ordering of a completion's CQE after the payload of its work request: the transport emits a
completion only after every DMA write it issued before it has its B response (its ``pdq``),
and this engine issues the CQE write after taking the completion, so the payload writes are
complete (answered) before the CQE's write address even exists. Whatever the interconnect
(``axi_arbiter``) or the PCIe adapter does with two writes in flight, they are never in flight
together; and a PCIe adapter answering B when it queues a posted TLP still keeps the order
(PCIe posted writes are not reordered among themselves).

DMA sharing (``stellar.hdl.top.hostq``): the engine has its own ``Dma`` (small bursts and read
buffer) and shares the AXI4 master with the transport's ``Dma`` through
``axi_arbiter.Axi4Arbiter`` rather than arbitrating the transport's ``Dma`` commands. The DMA
reader returns data in command order, so a shared reader would make a WQE fetch wait behind
payload reads that drain at wire speed (the transmit builder consumes them), and a shared
writer would queue CQE data behind received payload; separate engines keep each path's
latency its own and the AXI IDs keep the responses apart.

QP / CQ reset: a table write of a ring resets it (indexes to the start index it gives, credits
full, CQ disarmed); do it while the ring is idle. The transport empties its on-chip queues
without ``*_retire`` pulses when the host re-initializes a QP context (sq_psn / epsn, RESET /
INIT), so the driver rewrites the QP's SQ/RQ configuration when it resets a QP. A CQ started at
an index other than 0 needs each slot's owner bit preset to the pass before the NIC's first
write there (zeroing is right for start 0).

Ports
-----
csr        Out  the ``hostq`` register block (``block_signature(hostq_block())``)
wr         Out  stream of ``WORK_REQUEST`` (to ``RcTransport.wr``)
rr         Out  stream of ``RECV_REQUEST`` (to ``RcTransport.rr``)
cq         In   stream of ``COMPLETION`` (from ``RcTransport.cq``)
sq_retire  In   ``{qp}``, always ready (from ``RcTransport.sq_retire``): one SQ credit back
rq_retire  In   ``{qp}``, always ready: one RQ credit back
msi        Out  stream ``{vector: 16}``: raise this MSI / MSI-X vector
dma_rcmd   Out  stream ``{addr, len}``: WQE reads (to ``Dma.rd_cmd``)
dma_rdata  In   their data (``Dma.rd_data``)
dma_wcmd   Out  stream ``{addr, len}``: CQE writes (to ``Dma.wr_cmd``), 32 bytes each
dma_wdata  Out  their data (``Dma.wr_data``)
dma_wdone  In   one pulse per completed DMA write command, in order (``Dma.wr_done.valid``)

Parameters: ``data_width`` (64..512, power of two), ``qps`` (QP indexes, power of two >= 2),
``cqs`` (CQs, power of two >= 2), ``sq_depth`` / ``rq_depth`` (the transport's on-chip queue
depths: the credits per QP), ``max_batch`` (WQEs per DMA read), ``out_depth`` (entries of each
output FIFO, >= max_batch), ``kick_depth`` (doorbell kick FIFO).

Latency (64-bit, no stalls, memory read latency L clocks): doorbell strobe to the DMA read
command about 10 clocks (kick FIFO, doorbell event, visit event); the WQE's ``wr`` beat 8 data
beats plus about 6 clocks after its first read beat. Completion beat to CQE write command 4
clocks (pick, CQ lookup, CQ read, decide); the CQE's 32 bytes follow at the writer's rate.
Measured figures are in the cocotb test's log (``tests/cocotb/test_hostq_cocotb.py``).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..csr import block_signature
from ..dma.engine import Dma, cmd_layout
from ..flow.layouts import struct_layout
from ..net.layout import beat_layout
from ..regmap import HOSTQ_WORDS, HostqCommand, hostq_block, hostq_config
from ..transport.formats import COMPLETION, RECV_REQUEST, WORK_REQUEST
from .formats import (
    CQ_DOORBELL,
    CQE,
    CQE_BYTES,
    INDEX_BITS,
    RQ_WQE,
    RQ_WQE_BYTES,
    SQ_DOORBELL,
    SQ_WQE,
    SQ_WQE_BYTES,
)

__all__ = ["HostQueues", "CHUNK_BITS", "queue_dma", "connect_queue_dma"]

CHUNK_BITS = 256            # 32 bytes: an RQ WQE, half an SQ WQE, a CQE
BASE_SHIFT = 6              # rings are aligned to at least 64 bytes: bases are stored >> 6
MAX_LOG = 15                # 2**15 entries at most: 16-bit indexes still tell full from empty
TIME_BITS = 24


def _pow2(name, v, lo=2):
    if not isinstance(v, int) or v < lo or v & (v - 1):
        raise ValueError(f"{name} must be a power of two >= {lo}, not {v!r}")


class HostQueues(wiring.Component):
    """The queue engine (see the module docstring)."""

    def __init__(self, data_width=64, *, qps=16, cqs=16, sq_depth=16, rq_depth=16, max_batch=8,
                 out_depth=8, kick_depth=16):
        _pow2("data_width", data_width, 64)
        if data_width > 512:
            raise ValueError(f"data_width must be at most 512, not {data_width}")
        for name, v in (("qps", qps), ("cqs", cqs), ("sq_depth", sq_depth),
                        ("rq_depth", rq_depth)):
            _pow2(name, v)
        if qps > 1 << 16 or cqs > 1 << 15:
            raise ValueError("at most 2**16 QPs and 2**15 CQs (doorbell fields)")
        if not 1 <= max_batch <= out_depth:
            raise ValueError(f"max_batch ({max_batch}) must be in 1..out_depth ({out_depth})")
        self.data_width = data_width
        self.qps, self.cqs = qps, cqs
        self.sq_depth, self.rq_depth = sq_depth, rq_depth
        self.max_batch, self.out_depth, self.kick_depth = max_batch, out_depth, kick_depth
        self.index_bits = IB = exact_log2(qps)
        self.cq_bits = exact_log2(cqs)
        super().__init__({
            "csr":       Out(block_signature(hostq_block())),
            "wr":        Out(stream.Signature(struct_layout(WORK_REQUEST))),
            "rr":        Out(stream.Signature(struct_layout(RECV_REQUEST))),
            "cq":        In(stream.Signature(struct_layout(COMPLETION))),
            "sq_retire": In(stream.Signature(data.StructLayout({"qp": IB}), always_ready=True)),
            "rq_retire": In(stream.Signature(data.StructLayout({"qp": IB}), always_ready=True)),
            "msi":       Out(stream.Signature(data.StructLayout({"vector": 16}))),
            "dma_rcmd":  Out(stream.Signature(cmd_layout())),
            "dma_rdata": In(stream.Signature(beat_layout(data_width))),
            "dma_wcmd":  Out(stream.Signature(cmd_layout())),
            "dma_wdata": Out(stream.Signature(beat_layout(data_width))),
            "dma_wdone": In(1),
        })

    # ------------------------------------------------------------------ layouts
    @staticmethod
    def _qst_layout():
        """Per-queue state (SQ of QP q at q, RQ at qps + q), owned by the fetch machine."""
        return data.StructLayout({
            "base": 64 - BASE_SHIFT, "log": 4, "en": 1, "cq": 16,
            "fetched": INDEX_BITS,     # ring index of the next WQE to read
            "sent": 16,                # WQEs read for the transport (credits taken)
            "queued": 1,               # in the active FIFO
        })

    @staticmethod
    def _cqst_layout():
        """Per-CQ state, owned by the completion machine."""
        return data.StructLayout({
            "base": 64 - BASE_SHIFT, "log": 4, "en": 1, "vector": 16, "mod_count": 16,
            "mod_time": TIME_BITS, "pi": INDEX_BITS, "armed": 1, "count": 16, "ack": 1,
        })

    # ------------------------------------------------------------------ elaborate
    def elaborate(self, platform):
        m = Module()
        IB, CB = self.index_bits, self.cq_bits
        QN = 2 * self.qps                      # queues: SQs then RQs
        csr = self.csr
        qst_l, cqst_l = self._qst_layout(), self._cqst_layout()
        m.d.comb += csr.config.eq(hostq_config(self.qps, self.cqs, self.sq_depth, self.rq_depth))

        def qid(qp, kind):
            return Cat(qp[:IB], kind)

        # ------------------------------------------------------------ memories
        m.submodules.qst_mem = qst_mem = Memory(shape=qst_l, depth=QN, init=[])
        m.submodules.qpi_mem = qpi_mem = Memory(shape=INDEX_BITS, depth=QN, init=[])
        m.submodules.qcq_mem = qcq_mem = Memory(shape=16, depth=QN, init=[])
        m.submodules.sret_mem = sret_mem = Memory(shape=16, depth=self.qps, init=[])
        m.submodules.rret_mem = rret_mem = Memory(shape=16, depth=self.qps, init=[])
        m.submodules.cqst_mem = cqst_mem = Memory(shape=cqst_l, depth=self.cqs, init=[])
        cqdb_l = data.StructLayout({"ci": INDEX_BITS, "req": 1})
        m.submodules.cqdb_mem = cqdb_mem = Memory(shape=cqdb_l, depth=self.cqs, init=[])
        m.submodules.ack_mem = ack_mem = Memory(shape=1, depth=self.cqs, init=[])
        tmr_l = data.StructLayout({"run": 1, "deadline": 32})
        m.submodules.tmr_mem = tmr_mem = Memory(shape=tmr_l, depth=self.cqs, init=[])

        qst_rd, qst_wr = qst_mem.read_port(), qst_mem.write_port()
        qpi_rd, qpi_wr = qpi_mem.read_port(), qpi_mem.write_port()
        qcq_rd, qcq_wr = qcq_mem.read_port(), qcq_mem.write_port()
        cqst_rd, cqst_wr = cqst_mem.read_port(), cqst_mem.write_port()
        cqdb_rd, cqdb_rmw, cqdb_wr = cqdb_mem.read_port(), cqdb_mem.read_port(), cqdb_mem.write_port()
        ack_rd, ack_wr = ack_mem.read_port(), ack_mem.write_port()
        tmr_rd, tmr_scan, tmr_wr = tmr_mem.read_port(), tmr_mem.read_port(), tmr_mem.write_port()

        # ------------------------------------------------------------ table commands
        busy = Signal()
        cmd = Signal(3)
        cmd_idx = Signal(16)
        is_cq_cmd = (cmd == HostqCommand.WRITE_CQ) | (cmd == HostqCommand.READ_CQ)
        cmd_error = Signal()
        m.d.comb += csr.status.eq(Cat(busy, cmd_error))
        new = csr.command
        new_cq = (new == HostqCommand.WRITE_CQ) | (new == HostqCommand.READ_CQ)
        new_q = ((new == HostqCommand.WRITE_SQ) | (new == HostqCommand.WRITE_RQ)
                 | (new == HostqCommand.READ_SQ) | (new == HostqCommand.READ_RQ))
        in_range = Mux(new_cq, (csr.index >> CB) == 0, (csr.index >> IB) == 0)
        accept = Signal()
        m.d.comb += accept.eq(csr.command_stb & ~busy & (new_cq | new_q) & in_range)
        with m.If(csr.command_stb):
            m.d.sync += cmd_error.eq(~accept)
        with m.If(accept):
            m.d.sync += [busy.eq(1), cmd.eq(new), cmd_idx.eq(csr.index)]
        rdata = [Signal(32, name=f"rdata{i}") for i in range(HOSTQ_WORDS)]
        for i in range(HOSTQ_WORDS):
            m.d.comb += getattr(csr, f"rdata{i}").eq(rdata[i])
        wd = [getattr(csr, f"wdata{i}") for i in range(HOSTQ_WORDS)]
        cfg_base = Signal(64 - BASE_SHIFT)
        m.d.comb += cfg_base.eq(Cat(wd[0], wd[1])[BASE_SHIFT:])
        cfg_log = Signal(4)
        m.d.comb += cfg_log.eq(Mux(wd[2][:4] > MAX_LOG, MAX_LOG, wd[2][:4]))

        # ------------------------------------------------------------ doorbells
        sq_stb, rq_stb, cq_stb = csr.sq_doorbell_stb, csr.rq_doorbell_stb, csr.cq_doorbell_stb
        dbw = Signal(data.StructLayout({"pi": INDEX_BITS, "qp": 16}))
        m.d.comb += dbw.eq(Mux(rq_stb, csr.rq_doorbell, csr.sq_doorbell))
        assert SQ_DOORBELL.offsets["qp"] == 16 and CQ_DOORBELL.offsets["arm"] == 31
        db_ok = Signal()
        m.d.comb += db_ok.eq((dbw.qp >> IB) == 0)
        m.submodules.kickq = kickq = SyncFIFOBuffered(width=IB + 1, depth=self.kick_depth)
        rescan_req = Signal()
        qdb = (sq_stb | rq_stb) & db_ok
        m.d.comb += [kickq.w_data.eq(qid(dbw.qp, rq_stb)), kickq.w_en.eq(qdb),
                     csr.doorbells_inc.eq(sq_stb | rq_stb | cq_stb),
                     csr.doorbell_overflows_inc.eq(qdb & ~kickq.w_rdy)]
        with m.If(qdb & ~kickq.w_rdy):
            m.d.sync += rescan_req.eq(1)
        # The doorbell owns qpi's write port; a configuration write resets the index through it
        # too (the bank never strobes a doorbell and a command in the same clock).
        cmd_wq = accept & ((new == HostqCommand.WRITE_SQ) | (new == HostqCommand.WRITE_RQ))
        with m.If(qdb):
            m.d.comb += [qpi_wr.en.eq(1), qpi_wr.addr.eq(qid(dbw.qp, rq_stb)),
                         qpi_wr.data.eq(dbw.pi)]
        with m.Elif(cmd_wq):
            m.d.comb += [qpi_wr.en.eq(1),
                         qpi_wr.addr.eq(qid(csr.index, new == HostqCommand.WRITE_RQ)),
                         qpi_wr.data.eq(wd[3][:INDEX_BITS])]

        # CQ doorbell: read-modify-write of {ci, req} (req := ~ack to arm), two clocks.
        cdb = Signal(data.StructLayout({"ci": INDEX_BITS, "cq": 15, "arm": 1}))
        m.d.comb += cdb.eq(csr.cq_doorbell)
        cdb_ok = (cdb.cq >> CB) == 0
        cdb_go = Signal()
        cdb_d = Signal.like(cdb)
        m.d.comb += [cqdb_rmw.addr.eq(cdb.cq[:CB]), ack_rd.addr.eq(cdb.cq[:CB])]
        m.d.sync += [cdb_go.eq(cq_stb & cdb_ok), cdb_d.eq(cdb)]
        cmd_wcq = accept & (new == HostqCommand.WRITE_CQ)
        cdb_new = Signal(cqdb_l)
        m.d.comb += [cdb_new.ci.eq(cdb_d.ci),
                     cdb_new.req.eq(Mux(cdb_d.arm, ~ack_rd.data, cqdb_rmw.data.req))]
        with m.If(cdb_go):
            m.d.comb += [cqdb_wr.en.eq(1), cqdb_wr.addr.eq(cdb_d.cq[:CB]), cqdb_wr.data.eq(cdb_new)]
        with m.Elif(cmd_wcq):
            m.d.comb += [cqdb_wr.en.eq(1), cqdb_wr.addr.eq(csr.index[:CB]),
                         cqdb_wr.data.ci.eq(wd[3][16:16 + INDEX_BITS]), cqdb_wr.data.req.eq(0)]

        # ------------------------------------------------------------ returned credits
        # One read-modify-write per clock per direction: the count read in the clock after the
        # pulse misses only the write of the clock before, which is forwarded.
        rets = []
        for name, mem, pulse in (("sret", sret_mem, self.sq_retire),
                                 ("rret", rret_mem, self.rq_retire)):
            rd, wr, fsm_rd = mem.read_port(), mem.write_port(), mem.read_port()
            go = Signal(name=f"{name}_go")
            addr = Signal(IB, name=f"{name}_addr")
            last_en = Signal(name=f"{name}_last_en")
            last_addr = Signal(IB, name=f"{name}_last_addr")
            last_val = Signal(16, name=f"{name}_last_val")
            cur = Signal(16, name=f"{name}_cur")
            m.d.comb += rd.addr.eq(pulse.payload.qp)
            m.d.sync += [go.eq(pulse.valid), addr.eq(pulse.payload.qp),
                         last_en.eq(wr.en), last_addr.eq(wr.addr), last_val.eq(wr.data)]
            m.d.comb += [cur.eq(Mux(last_en & (last_addr == addr), last_val, rd.data)),
                         wr.en.eq(go), wr.addr.eq(addr), wr.data.eq(cur + 1)]
            rets.append(fsm_rd)

        # ------------------------------------------------------------ fetch machine
        m.submodules.activeq = activeq = SyncFIFOBuffered(width=IB + 1, depth=QN)
        desc_l = data.StructLayout({"kind": 1, "qp": IB, "n": 16})
        m.submodules.descq = descq = SyncFIFOBuffered(width=desc_l.size, depth=4)
        reserved = [Signal(range(self.out_depth + 1), name=f"reserved_{k}") for k in ("sq", "rq")]
        out_pop = [Signal(name="wr_pop"), Signal(name="rr_pop")]

        fq = Signal(IB + 1)                 # the queue at hand
        fkind = fq[IB]
        fev = Signal(2)                     # 0 command, 1 doorbell (kick / rescan), 2 visit
        from_kick = Signal()
        rescanning = Signal()
        rescan_pos = Signal(IB + 1)
        m.d.comb += [qst_rd.addr.eq(fq), qpi_rd.addr.eq(fq), rets[0].addr.eq(fq[:IB]),
                     rets[1].addr.eq(fq[:IB]), qst_wr.addr.eq(fq)]
        q = Signal(qst_l)
        m.d.comb += q.eq(qst_rd.data)
        pi = qpi_rd.data
        returned = Mux(fkind, rets[1].data, rets[0].data)
        size = Signal(INDEX_BITS + 1)
        m.d.comb += size.eq(Const(1, INDEX_BITS + 1) << q.log)
        pending = Signal(INDEX_BITS)
        m.d.comb += pending.eq(pi - q.fetched)
        sane = Signal()
        m.d.comb += sane.eq(q.en & (pending <= size))
        work = Signal(INDEX_BITS)
        m.d.comb += work.eq(Mux(sane, pending, 0))
        depth = Mux(fkind, self.rq_depth, self.sq_depth)
        inflight = Signal(16)
        m.d.comb += inflight.eq(q.sent - returned)
        credits = Signal(16)
        m.d.comb += credits.eq(Mux(inflight >= depth, 0, depth - inflight))
        room = Signal(range(self.out_depth + 1))
        m.d.comb += room.eq(self.out_depth - Mux(fkind, reserved[1], reserved[0]))
        slot = Signal(INDEX_BITS)
        m.d.comb += slot.eq(q.fetched & (size - 1))
        to_end = Signal(INDEX_BITS + 1)
        m.d.comb += to_end.eq(size - slot)

        def vmin(*vals):
            out = vals[0]
            for v in vals[1:]:
                out = Mux(v < out, v, out)
            return out
        n = Signal(16)
        m.d.comb += n.eq(vmin(work, credits, room, to_end, Const(self.max_batch, 16)))

        stale = Signal()
        with m.FSM(name="fetch", init="CLEAR"):
            with m.State("CLEAR"):
                # After a reset the RAMs keep their contents but the FIFOs are empty: every
                # queue is disabled and leaves the round robin (2 * qps clocks).
                m.d.comb += [qst_wr.en.eq(1), qst_wr.data.eq(0)]
                m.d.sync += fq.eq(fq + 1)
                with m.If(fq == QN - 1):
                    m.next = "IDLE"
            with m.State("IDLE"):
                with m.If(busy & ~is_cq_cmd):
                    m.d.sync += [fev.eq(0), fq.eq(qid(cmd_idx, (cmd == HostqCommand.WRITE_RQ)
                                                     | (cmd == HostqCommand.READ_RQ)))]
                    m.next = "READ"
                with m.Elif(kickq.r_rdy):
                    m.d.comb += kickq.r_en.eq(1)
                    m.d.sync += [fev.eq(1), fq.eq(kickq.r_data), from_kick.eq(1)]
                    m.next = "READ"
                with m.Elif(rescanning):
                    m.d.sync += [fev.eq(1), fq.eq(rescan_pos), from_kick.eq(0),
                                 rescan_pos.eq(rescan_pos + 1)]
                    with m.If(rescan_pos == QN - 1):
                        m.d.sync += rescanning.eq(0)
                    m.next = "READ"
                with m.Elif(rescan_req):
                    # Every queue once, from 0; a kick dropped during the rescan asks for
                    # another one.
                    m.d.sync += [rescan_req.eq(0), rescanning.eq(1), rescan_pos.eq(0)]
                with m.Elif(activeq.r_rdy):
                    m.d.comb += activeq.r_en.eq(1)
                    m.d.sync += [fev.eq(2), fq.eq(activeq.r_data)]
                    m.next = "READ"
            with m.State("READ"):
                m.next = "DO"               # qst, qpi, returned counts read at fq
            with m.State("DO"):
                nq = Signal(qst_l)
                m.d.comb += [nq.eq(q), qst_wr.data.eq(nq)]
                with m.Switch(fev):
                    with m.Case(0):
                        with m.If((cmd == HostqCommand.WRITE_SQ) | (cmd == HostqCommand.WRITE_RQ)):
                            # queued is kept: the queue may still sit in the active FIFO
                            m.d.comb += [
                                nq.base.eq(cfg_base), nq.log.eq(cfg_log), nq.en.eq(wd[2][8]),
                                nq.cq.eq(wd[2][16:]), nq.fetched.eq(wd[3][:INDEX_BITS]),
                                nq.sent.eq(returned),
                                qst_wr.en.eq(1),
                                qcq_wr.en.eq(1), qcq_wr.addr.eq(fq), qcq_wr.data.eq(wd[2][16:]),
                            ]
                        with m.Else():
                            m.d.sync += [
                                rdata[0].eq(Cat(Const(0, BASE_SHIFT), q.base)[:32]),
                                rdata[1].eq(Cat(Const(0, BASE_SHIFT), q.base)[32:]),
                                rdata[2].eq(Cat(q.log, Const(0, 4), q.en, Const(0, 7), q.cq)),
                                rdata[3].eq(Cat(pi, q.fetched)),
                                rdata[4].eq(Cat(q.sent, returned)),
                            ]
                        m.d.sync += busy.eq(0)
                        m.next = "IDLE"
                    with m.Case(1):
                        with m.If(work != 0):
                            with m.If(~q.queued):
                                m.d.comb += [activeq.w_en.eq(1), activeq.w_data.eq(fq),
                                             nq.queued.eq(1), qst_wr.en.eq(1)]
                        with m.Elif(from_kick & (pending != 0)):
                            m.d.comb += stale.eq(1)     # disabled ring or index too far ahead
                        m.next = "IDLE"
                    with m.Case(2):
                        with m.If(n == 0):
                            # nothing posted: leave the round robin; no credit or room: stay
                            with m.If(work == 0):
                                m.d.comb += [nq.queued.eq(0), qst_wr.en.eq(1)]
                            with m.Else():
                                m.d.comb += [activeq.w_en.eq(1), activeq.w_data.eq(fq)]
                            m.next = "IDLE"
                        with m.Else():
                            ebytes = Mux(fkind, RQ_WQE_BYTES, SQ_WQE_BYTES)
                            eshift = Mux(fkind, exact_log2(RQ_WQE_BYTES), exact_log2(SQ_WQE_BYTES))
                            addr = Signal(64)
                            m.d.comb += addr.eq(Cat(Const(0, BASE_SHIFT), q.base)
                                                + (slot << eshift))
                            go = Signal()
                            m.d.comb += [
                                self.dma_rcmd.valid.eq(descq.w_rdy),
                                self.dma_rcmd.payload.addr.eq(addr),
                                self.dma_rcmd.payload.len.eq(n * ebytes),
                                go.eq(self.dma_rcmd.valid & self.dma_rcmd.ready),
                            ]
                            dsc = Signal(desc_l)
                            m.d.comb += [dsc.kind.eq(fkind), dsc.qp.eq(fq[:IB]), dsc.n.eq(n),
                                         descq.w_data.eq(dsc)]
                            with m.If(go):
                                more = (work - n) != 0
                                m.d.comb += [
                                    descq.w_en.eq(1),
                                    nq.fetched.eq(q.fetched + n), nq.sent.eq(q.sent + n),
                                    nq.queued.eq(more), qst_wr.en.eq(1),
                                    activeq.w_en.eq(more), activeq.w_data.eq(fq),
                                    csr.wqe_reads_inc.eq(1),
                                ]
                                m.next = "IDLE"
        m.d.comb += csr.doorbell_invalid_inc.eq(((sq_stb | rq_stb) & ~db_ok) | (cq_stb & ~cdb_ok)
                                                | stale)

        # Output reservations: taken when a read is issued, freed when a request leaves.
        issued_n = Mux(descq.w_en, n, 0)
        for k in range(2):
            m.d.sync += reserved[k].eq(reserved[k] + Mux(fkind == k, issued_n, 0) - out_pop[k])

        # ------------------------------------------------------------ WQE data path
        chunk = stream.Signature(CHUNK_BITS).create(path=("chunk",))
        self._chunker(m, self.dma_rdata, chunk)
        m.submodules.wrq = wrq = SyncFIFOBuffered(width=struct_layout(WORK_REQUEST).size,
                                                  depth=self.out_depth)
        m.submodules.rrq = rrq = SyncFIFOBuffered(width=struct_layout(RECV_REQUEST).size,
                                                  depth=self.out_depth)
        d = Signal(desc_l)
        m.d.comb += d.eq(descq.r_data)
        half = Signal()                 # the first chunk of an SQ WQE is held
        lo = Signal(CHUNK_BITS)
        cnt = Signal(16)                # WQEs of the read at the head done
        sq_w = Signal(struct_layout(SQ_WQE))
        m.d.comb += sq_w.eq(Cat(lo, chunk.payload))
        rq_w = Signal(struct_layout(RQ_WQE))
        m.d.comb += rq_w.eq(chunk.payload)
        wr_v = Signal(struct_layout(WORK_REQUEST))
        m.d.comb += [
            wr_v.qp.eq(d.qp), wr_v.opcode.eq(sq_w.opcode), wr_v.signaled.eq(sq_w.signaled),
            wr_v.inline.eq(sq_w.inline), wr_v.wr_id.eq(sq_w.wr_id),
            wr_v.laddr.eq(Mux(sq_w.inline, 0, sq_w.data[:64])), wr_v.length.eq(sq_w.length),
            wr_v.raddr.eq(sq_w.raddr), wr_v.rkey.eq(sq_w.rkey), wr_v.imm.eq(sq_w.imm),
            wr_v.inline_data.eq(Mux(sq_w.inline, sq_w.data, 0)),
            wrq.w_data.eq(wr_v),
        ]
        rr_v = Signal(struct_layout(RECV_REQUEST))
        m.d.comb += [rr_v.qp.eq(d.qp), rr_v.wr_id.eq(rq_w.wr_id), rr_v.addr.eq(rq_w.addr),
                     rr_v.length.eq(rq_w.length), rrq.w_data.eq(rr_v)]
        wqe_done = Signal()
        with m.If(descq.r_rdy & chunk.valid):
            with m.If(d.kind):
                m.d.comb += [chunk.ready.eq(rrq.w_rdy), rrq.w_en.eq(rrq.w_rdy),
                             wqe_done.eq(rrq.w_rdy)]
            with m.Elif(~half):
                m.d.comb += chunk.ready.eq(1)
                m.d.sync += [lo.eq(chunk.payload), half.eq(1)]
            with m.Else():
                m.d.comb += [chunk.ready.eq(wrq.w_rdy), wrq.w_en.eq(wrq.w_rdy),
                             wqe_done.eq(wrq.w_rdy)]
                with m.If(wrq.w_rdy):
                    m.d.sync += half.eq(0)
        with m.If(wqe_done):
            with m.If(cnt + 1 == d.n):
                m.d.sync += cnt.eq(0)
                m.d.comb += descq.r_en.eq(1)
            with m.Else():
                m.d.sync += cnt.eq(cnt + 1)
        m.d.comb += [csr.sq_wqes_inc.eq(wrq.w_en), csr.rq_wqes_inc.eq(rrq.w_en)]
        for fifo, port, pop in ((wrq, self.wr, out_pop[0]), (rrq, self.rr, out_pop[1])):
            m.d.comb += [port.valid.eq(fifo.r_rdy), port.payload.eq(fifo.r_data),
                         fifo.r_en.eq(port.ready), pop.eq(port.valid & port.ready)]

        # ------------------------------------------------------------ completion machine
        now = Signal(32)
        m.d.sync += now.eq(now + 1)

        # Timer scan: one CQ per clock; expiries are queued and re-checked by the machine.
        m.submodules.toq = toq = SyncFIFOBuffered(width=CB, depth=4)
        scan = Signal(CB)
        scan_d = Signal(CB)
        scan_ok = Signal()
        m.d.sync += [scan.eq(scan + 1), scan_d.eq(scan), scan_ok.eq(1)]
        m.d.comb += tmr_scan.addr.eq(scan)
        scanned = Signal(tmr_l)
        m.d.comb += scanned.eq(tmr_scan.data)

        def expired(t):
            return t.run & ((now - t.deadline)[31] == 0)
        m.d.comb += [toq.w_en.eq(scan_ok & expired(scanned)), toq.w_data.eq(scan_d)]

        # MSI requests wait until the CQE writes issued before them are answered.
        wissued = Signal(16)
        wdone = Signal(16)
        m.d.sync += wdone.eq(wdone + self.dma_wdone)
        msi_l = data.StructLayout({"vector": 16, "wtag": 16})
        m.submodules.msiq = msiq = SyncFIFOBuffered(width=msi_l.size, depth=4)
        mh = Signal(msi_l)
        m.d.comb += mh.eq(msiq.r_data)
        m.d.comb += [
            self.msi.valid.eq(msiq.r_rdy & ((wdone - mh.wtag)[15] == 0)),
            self.msi.payload.vector.eq(mh.vector),
            msiq.r_en.eq(self.msi.valid & self.msi.ready),
            csr.msis_inc.eq(self.msi.valid & self.msi.ready),
        ]

        # CQE data: one 32-byte entry per write command, cut into beats.
        m.submodules.cqeq = cqeq = SyncFIFOBuffered(width=CHUNK_BITS, depth=2)
        self._cqe_beats(m, cqeq, self.dma_wdata)

        cpl = Signal(struct_layout(COMPLETION))
        m.d.comb += cpl.eq(self.cq.payload)
        cev = Signal(2)                     # 0 command, 1 completion, 2 timer
        ci_ = Signal(CB)                    # the CQ at hand
        cq_num = Signal(16)                 # its number as the QP table gives it
        stalled = Signal()                  # the completion at hand was counted in cq_full
        prefer_tmr = Signal()
        rd_addr = Signal(CB)
        m.d.comb += [cqst_rd.addr.eq(rd_addr), cqdb_rd.addr.eq(rd_addr), tmr_rd.addr.eq(rd_addr),
                     qcq_rd.addr.eq(qid(cpl.qp, cpl.is_recv))]
        m.d.comb += rd_addr.eq(ci_)
        st = Signal(cqst_l)
        m.d.comb += st.eq(cqst_rd.data)
        db = Signal(cqdb_l)
        m.d.comb += db.eq(cqdb_rd.data)
        tm = Signal(tmr_l)
        m.d.comb += tm.eq(tmr_rd.data)
        nst = Signal(cqst_l)
        m.d.comb += [nst.eq(st), cqst_wr.addr.eq(ci_), cqst_wr.data.eq(nst),
                     ack_wr.addr.eq(ci_), ack_wr.data.eq(nst.ack), tmr_wr.addr.eq(ci_)]
        csize = Signal(INDEX_BITS + 1)
        m.d.comb += csize.eq(Const(1, INDEX_BITS + 1) << st.log)
        used = Signal(INDEX_BITS)
        m.d.comb += used.eq(st.pi - db.ci)
        full = Signal()
        m.d.comb += full.eq(used >= csize)

        cqe = Signal(struct_layout(CQE))
        m.d.comb += [
            cqe.wr_id.eq(cpl.wr_id), cqe.byte_len.eq(cpl.byte_len), cqe.imm.eq(cpl.imm),
            cqe.qp.eq(cpl.qp), cqe.src_qpn.eq(cpl.src_qpn), cqe.status.eq(cpl.status),
            cqe.opcode.eq(cpl.opcode), cqe.is_recv.eq(cpl.is_recv), cqe.has_imm.eq(cpl.has_imm),
            cqe.has_inv.eq(cpl.has_inv),
            cqe.owner.eq(~(st.pi >> st.log)[0]),
        ]
        assert CQE_BYTES * 8 == CHUNK_BITS
        cqe_addr = Signal(64)
        m.d.comb += cqe_addr.eq(Cat(Const(0, BASE_SHIFT), st.base)
                                + ((st.pi & (csize - 1)) << exact_log2(CQE_BYTES)))

        with m.FSM(name="complete", init="CLEAR"):
            with m.State("CLEAR"):
                # every CQ disabled, disarmed, its timer stopped (cqs clocks after a reset)
                m.d.comb += [cqst_wr.en.eq(1), cqst_wr.data.eq(0), tmr_wr.en.eq(1),
                             tmr_wr.data.eq(0), ack_wr.en.eq(1), ack_wr.data.eq(0)]
                m.d.sync += ci_.eq(ci_ + 1)
                with m.If(ci_ == self.cqs - 1):
                    m.next = "IDLE"
            with m.State("IDLE"):
                cmd_here = busy & is_cq_cmd
                with m.If(cmd_here):
                    m.d.sync += [cev.eq(0), ci_.eq(cmd_idx[:CB])]
                    m.next = "READ"
                with m.Elif(toq.r_rdy & (prefer_tmr | ~self.cq.valid)):
                    m.d.comb += toq.r_en.eq(1)
                    m.d.sync += [cev.eq(2), ci_.eq(toq.r_data), prefer_tmr.eq(0)]
                    m.next = "READ"
                with m.Elif(self.cq.valid):
                    # qcq is read at the completion's (qp, is_recv) in this clock
                    m.d.sync += [cev.eq(1), prefer_tmr.eq(1)]
                    m.next = "LOOKUP"
            with m.State("LOOKUP"):
                m.d.sync += cq_num.eq(qcq_rd.data)
                m.d.comb += rd_addr.eq(qcq_rd.data[:CB])
                m.d.sync += ci_.eq(qcq_rd.data[:CB])
                m.next = "DO"               # CQ state read at the looked-up CQ
            with m.State("READ"):
                m.next = "DO"
            with m.State("DO"):
                with m.Switch(cev):
                    with m.Case(0):
                        with m.If(cmd == HostqCommand.WRITE_CQ):
                            m.d.comb += [
                                nst.base.eq(cfg_base), nst.log.eq(cfg_log), nst.en.eq(wd[2][8]),
                                nst.vector.eq(wd[2][16:]), nst.mod_count.eq(wd[3][:16]),
                                nst.mod_time.eq(wd[4][:TIME_BITS]),
                                nst.pi.eq(wd[3][16:16 + INDEX_BITS]),
                                nst.armed.eq(0), nst.count.eq(0), nst.ack.eq(0),
                                cqst_wr.en.eq(1), ack_wr.en.eq(1),
                                tmr_wr.en.eq(1), tmr_wr.data.eq(0),
                            ]
                        with m.Else():
                            m.d.sync += [
                                rdata[0].eq(Cat(Const(0, BASE_SHIFT), st.base)[:32]),
                                rdata[1].eq(Cat(Const(0, BASE_SHIFT), st.base)[32:]),
                                rdata[2].eq(Cat(st.log, Const(0, 4), st.en, Const(0, 7), st.vector)),
                                rdata[3].eq(Cat(st.pi, db.ci)),
                                rdata[4].eq(Cat(st.armed | (db.req != st.ack), tm.run,
                                                Const(0, 14), st.count)),
                            ]
                        m.d.sync += busy.eq(0)
                        m.next = "IDLE"
                    with m.Case(1):
                        bad = ((cq_num >> CB) != 0) | ~st.en | ((cpl.qp >> IB) != 0)
                        with m.If(bad):
                            m.d.comb += [self.cq.ready.eq(1), csr.cqe_dropped_inc.eq(1)]
                            m.d.sync += stalled.eq(0)
                            m.next = "IDLE"
                        with m.Elif(full):
                            m.d.comb += csr.cq_full_inc.eq(~stalled)
                            m.d.sync += stalled.eq(1)
                            m.next = "IDLE"     # retried after any other event
                        with m.Else():
                            # moderation: an arm seen now (req != ack) counts from this CQE
                            arm_new = db.req != st.ack
                            armed = st.armed | arm_new
                            count = Signal(17)
                            m.d.comb += count.eq(Mux(st.armed, st.count, 0) + 1)
                            limit = Mux(st.mod_count == 0, 1, st.mod_count)
                            fire = armed & (count >= limit)
                            ok = cqeq.w_rdy & msiq.w_rdy
                            m.d.comb += [self.dma_wcmd.valid.eq(ok),
                                         self.dma_wcmd.payload.addr.eq(cqe_addr),
                                         self.dma_wcmd.payload.len.eq(CQE_BYTES)]
                            with m.If(self.dma_wcmd.valid & self.dma_wcmd.ready):
                                m.d.comb += [
                                    self.cq.ready.eq(1), cqeq.w_en.eq(1), cqeq.w_data.eq(cqe),
                                    csr.cqes_inc.eq(1),
                                    nst.pi.eq(st.pi + 1), nst.ack.eq(db.req),
                                    cqst_wr.en.eq(1), ack_wr.en.eq(1),
                                ]
                                m.d.sync += [wissued.eq(wissued + 1), stalled.eq(0)]
                                with m.If(fire):
                                    m.d.comb += [
                                        nst.armed.eq(0), nst.count.eq(0),
                                        msiq.w_en.eq(1), msiq.w_data.eq(Cat(st.vector, (wissued + 1)[:16])),
                                        tmr_wr.en.eq(1), tmr_wr.data.eq(0),
                                    ]
                                with m.Elif(armed):
                                    m.d.comb += [nst.armed.eq(1), nst.count.eq(count)]
                                    with m.If((count == 1) & (st.mod_time != 0)):
                                        m.d.comb += [tmr_wr.en.eq(1), tmr_wr.data.run.eq(1),
                                                     tmr_wr.data.deadline.eq(now + st.mod_time)]
                                m.next = "IDLE"
                    with m.Case(2):
                        with m.If(expired(tm) & st.armed):
                            with m.If(msiq.w_rdy):
                                m.d.comb += [
                                    nst.armed.eq(0), nst.count.eq(0), cqst_wr.en.eq(1),
                                    msiq.w_en.eq(1), msiq.w_data.eq(Cat(st.vector, wissued)),
                                    tmr_wr.en.eq(1), tmr_wr.data.eq(0),
                                ]
                                m.next = "IDLE"
                        with m.Else():
                            with m.If(expired(tm)):
                                m.d.comb += [tmr_wr.en.eq(1), tmr_wr.data.eq(0)]
                            m.next = "IDLE"
        return m

    # ------------------------------------------------------------------ helpers
    def _chunker(self, m, src, chunk):
        """``src`` (lane-0 aligned read beats, whole 32-byte entries per command) -> 32-byte
        chunks, lane 0 first, one per clock."""
        W = self.data_width
        if W <= CHUNK_BITS:
            R = CHUNK_BITS // W
            acc = Signal(CHUNK_BITS)
            k = Signal(range(R))
            cvalid = Signal()
            free = ~cvalid | chunk.ready
            full = Cat(acc[W:], src.payload.data) if R > 1 else src.payload.data
            m.d.comb += [src.ready.eq((k != R - 1) | free), chunk.valid.eq(cvalid)]
            with m.If(chunk.ready):
                m.d.sync += cvalid.eq(0)
            with m.If(src.valid & src.ready):
                m.d.sync += acc.eq(full)
                with m.If(k == R - 1):
                    m.d.sync += [k.eq(0), cvalid.eq(1), chunk.payload.eq(full)]
                with m.Else():
                    m.d.sync += k.eq(k + 1)
        else:
            C = W // CHUNK_BITS
            hv = Signal()
            hdata = Signal(W)
            hkeep = Signal(W // 8)
            ph = Signal(range(C))
            last_chunk = Signal()
            m.d.comb += [
                last_chunk.eq((ph == C - 1) | ~hkeep.bit_select((ph + 1) * (CHUNK_BITS // 8), 1)),
                chunk.valid.eq(hv),
                chunk.payload.eq(hdata.word_select(ph, CHUNK_BITS)),
                src.ready.eq(~hv | (chunk.ready & last_chunk)),
            ]
            with m.If(chunk.valid & chunk.ready):
                with m.If(last_chunk):
                    m.d.sync += [hv.eq(0), ph.eq(0)]
                with m.Else():
                    m.d.sync += ph.eq(ph + 1)
            with m.If(src.valid & src.ready):
                m.d.sync += [hv.eq(1), hdata.eq(src.payload.data), hkeep.eq(src.payload.keep),
                             ph.eq(0)]

    def _cqe_beats(self, m, fifo, out):
        """Each 32-byte entry of ``fifo`` as the write data beats of one 32-byte command."""
        W = self.data_width
        B = W // 8
        if W >= CHUNK_BITS:
            m.d.comb += [
                out.valid.eq(fifo.r_rdy), out.payload.data.eq(fifo.r_data),
                out.payload.keep.eq((1 << (CHUNK_BITS // 8)) - 1), out.payload.last.eq(1),
                fifo.r_en.eq(out.ready),
            ]
        else:
            R = CHUNK_BITS // W
            k = Signal(range(R))
            m.d.comb += [
                out.valid.eq(fifo.r_rdy), out.payload.data.eq(fifo.r_data.word_select(k, W)),
                out.payload.keep.eq((1 << B) - 1), out.payload.last.eq(k == R - 1),
            ]
            with m.If(out.valid & out.ready):
                with m.If(k == R - 1):
                    m.d.sync += k.eq(0)
                    m.d.comb += fifo.r_en.eq(1)
                with m.Else():
                    m.d.sync += k.eq(k + 1)


def queue_dma(data_width, max_batch):
    """The queue engine's own ``Dma``: its transfers are short (a batch of WQEs, one CQE), so
    small bursts and a read buffer of two batches are plenty. IDs 0-7 (``id_width`` 3), to share
    an AXI4 port through ``Axi4Arbiter``."""
    return Dma(data_width, id_width=3, max_burst=16, outstanding=4,
               buffer=max(32, 2 * max_batch * 64 * 8 // data_width), wr_outstanding=4)


def connect_queue_dma(m, hq, qdma):
    """Join ``HostQueues`` ``hq`` and its ``Dma`` ``qdma`` in module ``m``."""
    wiring.connect(m, hq.dma_rcmd, qdma.rd_cmd)
    wiring.connect(m, qdma.rd_data, hq.dma_rdata)
    wiring.connect(m, hq.dma_wcmd, qdma.wr_cmd)
    wiring.connect(m, hq.dma_wdata, qdma.wr_data)
    m.d.comb += hq.dma_wdone.eq(qdma.wr_done.valid)
