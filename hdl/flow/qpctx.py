# Ref: IBTA Vol 1 ch. 9.7 (RC transport: per-QP PSN and MSN state, read and updated per packet)
"""QP context store: one block-RAM word per QP index, read for every packet, written back by
the transport, with hazard forwarding so that back-to-back packets of one QP chain their
updates at one packet per clock.

The store is an in-order pipeline::

    req / host --> [issue: memory read] --> [s1: read in flight] --> [queue (registers)] --> resp
                                                                         head: host ops run here

A token (a packet request, or a host operation) enters at *issue*, where the memory read port
samples its index; one clock later (*s1*) the memory word is out, and the token moves into the
response *queue* of ``queue`` registers: a head register that drives ``resp`` and a ring behind it.
Writes come from the consumer (``wb``) and from host WRITEs executed at the head; there is one
memory write port and so at most one write per clock.

Consistency contract:

- The ``ctx`` presented on ``resp`` in a cycle includes every write (``wb`` or host) performed
  at any clock edge before that cycle. Every copy of a context held inside the store -- the
  memory read in flight (``s1``) and each queue entry -- snoops every write and replaces its
  ``wb_fields`` when the index matches (the host fields: see below). The memory's own
  read-during-write behaviour is never used (a collision on a true-dual-port ECP5 EBR is
  undefined): the last write is registered and overrides the memory output for the token
  whose read was sampled at that same edge.
- The consumer takes packet i (``resp`` transfer) and may write it back in the SAME cycle
  (``wb.valid`` together with ``resp.ready``), computing the new context from ``resp.ctx``;
  packet i+1 of the same QP, presented in the next cycle, then already carries that update,
  so one packet per clock can chain read-modify-writes on one QP. A consumer that writes back
  later than the cycle it took the packet must forward its own pending updates to the packets
  it takes in between: what it took before its write-back carries the context without it.
- Host operations travel through the same in-order pipeline as packets: a host token enters
  like a request (with priority over ``req``, so the host is never starved; one host operation
  is in flight at a time), snoops writes like every other copy, and is executed by the store
  itself when it reaches the head. READ returns the current context; WRITE merges the fields
  selected by ``mask`` into the current context and writes the result. Host tokens never
  appear on ``resp``. So a host masked write never loses a transport update and a transport
  write-back that follows a host write in the pipeline order is computed from the host's
  result. A host WRITE at the head in a cycle with ``wb.valid``: only one memory write per
  clock, so the head holds (the host write waits and re-merges next cycle); neither is dropped.
- With host fields (``wb_fields`` not all), no packet issues while a host operation waits
  on ``host`` or is in the pipeline, up to and including the clock its write lands: packets
  behind a host operation read the host memory after its write, so the host fields need no
  forwarding. Packets then wait for a host operation to be done, not only for its slot; a
  packet waiting when one is done issues before the next host operation.
- Full throughput: with ``resp`` always ready and no host operations, one ``req`` per clock
  with no bubbles (for ``queue >= 3``; ``req.ready`` does not depend on ``resp.ready``, so a
  smaller queue is exact but not full rate). A host operation takes one slot of the pipeline
  (one cycle without a ``resp``) and pulses ``host_resp`` ``LATENCY`` cycles after its
  transfer when nothing is queued ahead of it (later when packets ahead wait on ``resp``).

Ports (``I`` = ``index_bits``, ``U`` = ``user_width``, ``ctx`` = ``qp_context_layout()``,
``N`` = ``len(QP_CONTEXT.fields)``):
  ``req``        in   stream ``{index: I, user: U}``: look up the context of QP ``index``;
                      ``user`` is carried unchanged to the response.
  ``resp``       out  stream ``{index: I, ctx, user: U}``: responses in request order.
  ``wb``         in   stream ``{index: I, ctx}``, always ready: write the fields
                      ``wb_fields`` of the new context of QP ``index`` (from the consumer
                      of ``resp``); its other fields are ignored.
  ``host``       in   stream ``{op: 1 (QpHostOp), index: I, ctx, mask: N}``: READ returns the
                      context; WRITE replaces the fields whose ``mask`` bit i (field i of
                      ``QP_CONTEXT``) is set with those of ``ctx``.
  ``host_resp``  out  stream ``{ctx}``, always ready: one-cycle pulse when a host operation is
                      done: READ -> the context; WRITE -> the context as written (merged).
  ``req_ok``     out  ``req.ready`` as it is while ``req.valid`` is high, without looking at
                      ``req.valid``: a producer may take its read enable from it.
  ``host_hold``  in   1: while high, a host operation at the head waits (tie low if unused). A
                      consumer that holds packets it took, or writes back later, keeps it high
                      until their write-backs have reached ``wb``, so that a host operation
                      still follows every packet ahead of it (``RxFlowPipeline``).

Parameters: ``depth`` (number of QPs, a power of two), ``user_width`` (sideband bits),
``queue`` (responses held in registers, so ``req`` keeps flowing under short ``resp`` stalls),
``wb_fields`` (names of the ``QP_CONTEXT`` fields ``wb`` writes; ``None``: all of them).
Attributes: ``index_bits``, ``LATENCY`` (2: cycles from a ``req`` transfer to its ``resp``
being valid when nothing stalls), ``wb_fields`` and ``host_fields`` (the rest, in context
order). Memory: one ``lib.memory.Memory`` of ``depth`` words holding the ``wb_fields``
(``mem_data``) and, when some fields are the host's only, a second one holding those
(``host_mem_data``); both all zeros after configuration, each with one synchronous read port
(packets and host reads, at the same address) and one write port. ``context(w, h)`` joins a
word of each into the context integer.

Why the split: the transport writes back two fields (``epsn``, ``msn``: 48 bits) of 475. Only
the fields ``wb`` writes need the forwarding paths (the registered last write, the snoop of
every queue entry, the write-port multiplexer); the host's fields are loaded once per token
and never compared. In NicCore this is most of the store's logic (see
``RxFlowPipeline(wb_fields=...)``).
"""

from amaranth.hdl import Cat, MemoryData, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..fanout import on_global
from .fields import QP_CONTEXT
from .layouts import qp_context_layout

__all__ = ["QpContextStore", "QpHostOp"]


class QpHostOp(enum.IntEnum, shape=1):
    READ = 0
    WRITE = 1


class QpContextStore(wiring.Component):
    LATENCY = 2

    def __init__(self, depth=4096, *, user_width=0, queue=4, wb_fields=None):
        assert depth >= 2 and depth & (depth - 1) == 0, "depth must be a power of two"
        assert queue >= 1
        names = [f.name for f in QP_CONTEXT.fields]
        wb_fields = tuple(names if wb_fields is None else wb_fields)
        unknown = set(wb_fields) - set(names)
        assert not unknown, f"no QP context field(s) {sorted(unknown)}"
        self.depth = depth
        self.user_width = user_width
        self.queue = queue
        self.index_bits = (depth - 1).bit_length()
        # In QP_CONTEXT order, so that the words of the two memories are the context's bits in
        # order with the other part's fields left out.
        self.wb_fields = tuple(n for n in names if n in wb_fields)
        self.host_fields = tuple(n for n in names if n not in wb_fields)
        ctx = qp_context_layout()
        ib = self.index_bits
        self.mem_data = MemoryData(shape=self._width(self.wb_fields), depth=depth, init=[])
        self.host_mem_data = (MemoryData(shape=self._width(self.host_fields), depth=depth, init=[])
                              if self.host_fields else None)
        super().__init__({
            "req": In(stream.Signature(data.StructLayout({"index": ib, "user": user_width}))),
            "resp": Out(stream.Signature(data.StructLayout({"index": ib, "ctx": ctx,
                                                            "user": user_width}))),
            "wb": In(stream.Signature(data.StructLayout({"index": ib, "ctx": ctx}),
                                      always_ready=True)),
            "host": In(stream.Signature(data.StructLayout({
                "op": QpHostOp, "index": ib, "ctx": ctx, "mask": len(QP_CONTEXT.fields)}))),
            "host_resp": Out(stream.Signature(data.StructLayout({"ctx": ctx}), always_ready=True)),
            "host_hold": In(1),
            "req_ok": Out(1),
        })

    @staticmethod
    def _width(names):
        return sum(QP_CONTEXT[n].width for n in names)

    @staticmethod
    def _part(value, names):
        """The bits of the fields ``names`` of a context (a Value), in order."""
        return Cat(*(value[QP_CONTEXT.offsets[n]:QP_CONTEXT.offsets[n] + QP_CONTEXT[n].width]
                     for n in names))

    def context(self, wb_word, host_word=0):
        """The whole context (an int) from a word of ``mem_data`` and one of ``host_mem_data``."""
        out = 0
        for names, word in ((self.wb_fields, wb_word), (self.host_fields, host_word)):
            pos = 0
            for n in names:
                f = QP_CONTEXT[n]
                out |= (word >> pos & ((1 << f.width) - 1)) << QP_CONTEXT.offsets[n]
                pos += f.width
        return out

    def elaborate(self, platform):
        m = Module()
        Q = self.queue
        ib = self.index_bits
        WD = self._width(self.wb_fields)
        WH = self._width(self.host_fields)
        split = bool(self.host_fields)
        # Queue entries: a token and its context, in two parts: the fields ``wb`` writes (they
        # snoop every write) and the host's fields (written only by host WRITEs, which no
        # token is in flight behind: they need no snooping). ``host`` marks a host operation
        # (its op, data and mask wait in the host registers: one host operation is in flight
        # at a time).
        token = data.StructLayout({"index": ib, "user": self.user_width, "host": 1})
        entry = data.StructLayout({"tok": token, "ctx": WD, "hctx": WH})

        def whole(wb_part, host_part):
            ctx = Signal(QP_CONTEXT.width)
            for names, part in ((self.wb_fields, wb_part), (self.host_fields, host_part)):
                pos = 0
                for n in names:
                    w, off = QP_CONTEXT[n].width, QP_CONTEXT.offsets[n]
                    m.d.comb += ctx[off:off + w].eq(part[pos:pos + w])
                    pos += w
            return ctx

        # ``no_rw_check``: yosys need not emulate read-during-write (it would add a register
        # and bypass of its own); the store never uses the memory word of a collision.
        m.submodules.mem = mem = Memory(data=self.mem_data, attrs={"no_rw_check": 1})
        wr = mem.write_port()
        rd = mem.read_port(domain="sync")
        if split:
            m.submodules.host_mem = hmem = Memory(data=self.host_mem_data,
                                                  attrs={"no_rw_check": 1})
            hwr = hmem.write_port()
            hrd = hmem.read_port(domain="sync")
            m.d.comb += [hrd.addr.eq(rd.addr), hrd.en.eq(rd.en)]

        # ------------------------------------------------------------ the one write per clock
        w_en = Signal()
        w_addr = Signal(ib)
        w_data = Signal(WD)
        m.d.comb += [wr.en.eq(w_en), wr.addr.eq(w_addr), wr.data.eq(w_data)]
        # The write the copies snoop (``s_*``). With host fields it is the write-back alone: a
        # host WRITE lands when no token is in flight behind it and no read samples at its edge
        # (nothing issues while a host operation is in the pipeline, up to and including the
        # clock its write lands; see the consistency contract), so no copy can hold its QP's
        # old context. The snoops then start at ``wb``'s flip-flops, not at the host operation's
        # done decision (``host_hold``, the write-back's valid again) and the write port's
        # multiplexer: from the registered write-back valid through host_done, the write enable
        # and the snoop hit to the head it was -2.85 ns, 170 failing endpoints, routed on the
        # ECPIX-5 core at c45f3e0. Without host fields a host write is snooped like a write-back.
        s_en = Signal()
        s_addr = Signal(ib)
        s_data = Signal(WD)

        # The last write, registered: it overrides the memory output for a read sampled at the
        # same edge as the write (undefined on the EBR, so never looked at). The snooped write
        # is enough: no read samples at the edge of a host write that is not snooped.
        lw_valid = Signal()
        lw_addr = Signal(ib)
        lw_data = Signal(WD)
        m.d.sync += lw_valid.eq(s_en)
        with m.If(s_en):
            m.d.sync += [lw_addr.eq(s_addr), lw_data.eq(s_data)]

        # ------------------------------------------------------------ state
        level = Signal(range(Q + 1))         # valid queue entries (the head's included)
        R = Q - 1                            # entries of the ring behind the head register
        rp = Signal(range(max(R, 1)))        # the ring's oldest entry
        wp = Signal(range(max(R, 1)))        # next ring entry to load
        r_level = Signal(range(R + 1))       # valid ring entries
        q = [Signal(entry, name=f"q{k}") for k in range(R)]
        s1_valid = Signal()                  # a token whose memory read is in flight
        s1 = Signal(token)
        host_busy = Signal()                 # a host token is in the pipeline
        h_write = Signal()
        h_ctx = Signal(QP_CONTEXT.width)
        h_mask = Signal(len(QP_CONTEXT.fields))   # zero for a READ: the merge is the identity

        # ------------------------------------------------------------ issue
        # Credits: the token in s1 always moves into the queue at the next edge, so a token
        # issues only while queue + s1 leave room for it. Pops are not counted, so that
        # req.ready does not depend on resp.ready; with queue >= 3 the steady state at one
        # packet per clock (one entry at the head, one in s1) still has room.
        # With host fields, no packet issues while a host operation waits or is in flight
        # (including its last clock, when its write lands): a packet's read of the host
        # memory then always follows every host write before it, and none can be in flight
        # behind one.
        room = Signal()
        host_done = Signal()
        host_take = Signal()
        req_take = Signal()
        issue = Signal()
        # A host operation is seen a clock after host.valid rises (host_seen, a flip-flop
        # here): the packets' issue (req.ready, the load enable of the producer's queue
        # output) then does not wait on the host port's valid, which comes from the command
        # slots across the pipeline (4.3 ns of wire at the start of a 10.7 ns path routed on the
        # ECPIX-5 core at d76ba5e). A host operation takes a clock longer to start.
        host_seen = Signal()
        m.d.sync += host_seen.eq(self.host.valid)
        if split:
            # A waiting packet goes first after a host operation (else back-to-back host
            # operations would starve the packets).
            pkt_turn = Signal()      # from a host op's end until a packet issues or none waits
            with m.If(host_done):
                m.d.sync += pkt_turn.eq(1)
            with m.Elif(issue | ~self.req.valid):
                m.d.sync += pkt_turn.eq(0)
            pkt_first = pkt_turn & self.req.valid
            m.d.comb += [
                self.host.ready.eq(room & ~host_busy & ~pkt_first & host_seen),
                self.req.ready.eq(room & ~host_busy & ~(host_seen & ~pkt_first)),
                # req.ready with req.valid high: the producer's read enable (RxFlowPipeline's
                # annq, whose output register's ~130 clock enables it drives) then does not
                # wait on the valid through pkt_first (from host_busy through pkt_first and
                # req.ready into those enables it was -0.94 ns routed on the ECPIX-5 core at
                # c45f3e0).
                self.req_ok.eq(room & ~host_busy & (~host_seen | pkt_turn)),
            ]
        else:
            m.d.comb += [
                self.host.ready.eq(room & ~host_busy & host_seen),
                self.req.ready.eq(room & ~(host_seen & ~host_busy)),
                self.req_ok.eq(self.req.ready),
            ]
        m.d.comb += [
            room.eq(level + s1_valid < Q),
            host_take.eq(self.host.valid & self.host.ready),
            req_take.eq(self.req.valid & self.req.ready),
            issue.eq(host_take | req_take),
            rd.addr.eq(Mux(host_take, self.host.payload.index, self.req.payload.index)),
            rd.en.eq(issue),
        ]
        # s1 loads in every clock, not only with a token (``s1_valid`` says when it holds
        # one): its enable was the issue decision, fanned out over the whole register (in the
        # routed ECPIX-5 core a 63-tile net at the end of a 12.4 ns path, 2026-12-07).
        m.d.sync += [
            s1_valid.eq(issue),
            s1.index.eq(rd.addr),
            s1.user.eq(self.req.payload.user),
            s1.host.eq(host_take),
        ]
        with m.If(host_take):
            m.d.sync += host_busy.eq(1)
        # The host registers follow the host port while no host operation is in the pipeline
        # and hold from the edge that takes one (host.ready needs ~host_busy) until it is done;
        # nothing reads them before. So their ~500 flip-flops load on a flip-flop (~host_busy),
        # carried on a global net (``stellar.hdl.fanout``), not on the take decision.
        h_load = on_global(m, "h_load_net", ~host_busy)
        with m.If(h_load):
            is_write = self.host.payload.op == QpHostOp.WRITE
            m.d.sync += [
                h_write.eq(is_write),
                h_ctx.eq(self.host.payload.ctx),
                h_mask.eq(Mux(is_write, self.host.payload.mask, 0)),
            ]

        # ------------------------------------------------------------ s1: memory word out
        # Forwarding: a write at the edge that sampled the read (lw_*) replaces the memory
        # word; a write at the coming edge (w_*) replaces it on its way into the queue.
        lw_hit = Signal()
        w_hit_s1 = Signal()
        s1_ctx = Signal(WD)
        incoming = Signal(entry)
        m.d.comb += [
            lw_hit.eq(lw_valid & (lw_addr == s1.index)),
            w_hit_s1.eq(s_en & (s_addr == s1.index)),
            s1_ctx.eq(Mux(lw_hit, lw_data, rd.data)),
            incoming.tok.eq(s1),
            incoming.ctx.eq(Mux(w_hit_s1, s_data, s1_ctx)),
        ]
        if split:
            m.d.comb += incoming.hctx.eq(hrd.data)

        # ------------------------------------------------------------ head
        # The head is a register of its own, not the ring entry at the read pointer: ``resp``
        # then comes straight from flip-flops. Behind a multiplexer on the read pointer it was
        # the start of 1,400 failing paths of the routed ECPIX-5 core (2026-12-07), the
        # consumer's decode of the context running through it.
        head = Signal(entry)
        head_valid = Signal()
        head_ctx = whole(head.ctx, head.hctx)
        # The context a host operation merges into and returns. Its host fields come straight
        # from the host memory's read port: nothing else issues while a host operation is in
        # the pipeline, so the port holds the host token's word until it is done. The queue's
        # copies of the host fields then feed ``resp`` alone, and in NicCore synthesis drops
        # those nobody downstream reads.
        cur_ctx = whole(head.ctx, hrd.data) if split else head_ctx
        head_host = Signal()
        merged = Signal(QP_CONTEXT.width)
        pop = Signal()
        bit_mask = Signal(QP_CONTEXT.width)
        m.d.comb += [
            bit_mask.eq(Cat(*(h_mask[i].replicate(f.width) for i, f in enumerate(QP_CONTEXT.fields)))),
            head_host.eq(head_valid & head.tok.host),
            self.resp.valid.eq(head_valid & ~head.tok.host),
            self.resp.payload.index.eq(head.tok.index),
            self.resp.payload.user.eq(head.tok.user),
            self.resp.payload.ctx.eq(head_ctx),
            # A READ has an all-zero mask: ``merged`` is then the context itself.
            merged.eq((cur_ctx & ~bit_mask) | (h_ctx & bit_mask)),
            # A host WRITE yields the write port to a write-back of the same cycle and holds.
            host_done.eq(head_host & ~self.host_hold & ~(h_write & self.wb.valid)),
            self.host_resp.valid.eq(host_done),
            self.host_resp.payload.ctx.eq(merged),
            pop.eq((self.resp.valid & self.resp.ready) | host_done),
            w_en.eq(self.wb.valid | (host_done & h_write)),
            w_addr.eq(Mux(self.wb.valid, self.wb.payload.index, head.tok.index)),
            w_data.eq(Mux(self.wb.valid, self._part(self.wb.payload.ctx.as_value(), self.wb_fields),
                          self._part(merged, self.wb_fields))),
        ]
        if split:
            m.d.comb += [hwr.en.eq(host_done & h_write), hwr.addr.eq(head.tok.index),
                         hwr.data.eq(self._part(merged, self.host_fields)),
                         s_en.eq(self.wb.valid), s_addr.eq(self.wb.payload.index),
                         s_data.eq(self._part(self.wb.payload.ctx.as_value(), self.wb_fields))]
        else:
            m.d.comb += [s_en.eq(w_en), s_addr.eq(w_addr), s_data.eq(w_data)]
        with m.If(host_done):
            m.d.sync += host_busy.eq(0)

        # ------------------------------------------------------------ queue
        # The head register and a ring of Q - 1 entries behind it. The head takes the ring's
        # oldest entry when it is empty or popped, or the incoming token when the ring is
        # empty; so it is valid exactly when the queue holds an entry, and a token reaches
        # ``resp`` in the same clock as before. A ring entry never moves, so each bit only
        # chooses between the incoming token (load), the write of this edge (snoop hit) and
        # itself (clock enable); the head's input pays the R:1 multiplexer. Every copy snoops
        # the write of the edge it loads at. The host fields only load.
        def advance(ptr):
            return Mux(ptr == R - 1, 0, ptr + 1)

        head_free = Signal()
        ring_read = Signal()
        ring_write = Signal()
        m.d.comb += [
            head_free.eq(~head_valid | pop),
            ring_read.eq(head_free & (r_level != 0)),
            ring_write.eq(s1_valid & ~(head_free & (r_level == 0))),
        ]
        # The oldest entry as the head takes it: its snoop hit is the entry's own (``q{k}_hit``,
        # chosen by the read pointer like the entry), not a compare behind the R:1 multiplexer.
        hits = [Signal(name=f"q{k}_hit") for k in range(R)]
        oldest = Signal(entry)
        oldest_hit = Signal()
        if R == 1:
            m.d.comb += [oldest.eq(q[0]), oldest_hit.eq(hits[0])]
        elif R > 1:
            with m.Switch(rp):
                for k in range(R):
                    with m.Case(k):
                        m.d.comb += [oldest.eq(q[k]), oldest_hit.eq(hits[k])]
        oldest_snooped = Signal(entry)
        m.d.comb += [oldest_snooped.eq(oldest),
                     oldest_snooped.ctx.eq(Mux(oldest_hit, s_data, oldest.ctx))]
        with m.If(ring_read):
            m.d.sync += head.eq(oldest_snooped)
        with m.Elif(head_free):
            m.d.sync += head.eq(incoming)
        with m.Elif(s_en & (s_addr == head.tok.index)):
            m.d.sync += head.ctx.eq(s_data)
        with m.If(head_free):
            m.d.sync += head_valid.eq((r_level != 0) | s1_valid)
        for k in range(R):
            hit = hits[k]
            load = Signal(name=f"q{k}_load")
            # An incoming token is loaded at wp whether it enters the ring or goes straight to
            # the head (then wp does not move and the entry stays outside the queue): the
            # ring's load enables then do not wait for the head's pop, which comes from the
            # consumer's ready (from the head through the consumer's room and the pop to the
            # ring's ~500 load enables it was 9.9 ns routed on the ECPIX-5 core at 2c5ea0a).
            # The entry at wp is never in the queue when a token comes in: the ring is not
            # full then, or the head takes the oldest entry in that same clock.
            m.d.comb += [
                hit.eq(s_en & (s_addr == q[k].tok.index)),
                load.eq(s1_valid & (wp == k)),
            ]
            # Entries outside the queue snoop too: harmless, and no valid bit is needed.
            with m.If(load):
                m.d.sync += q[k].eq(incoming)
            with m.Elif(hit):
                m.d.sync += q[k].ctx.eq(s_data)
        if R:
            with m.If(ring_write):
                m.d.sync += wp.eq(advance(wp))
            with m.If(ring_read):
                m.d.sync += rp.eq(advance(rp))
            m.d.sync += r_level.eq(r_level + ring_write - ring_read)
        m.d.sync += level.eq(level + s1_valid - pop)
        return m
