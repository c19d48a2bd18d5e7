"""Store-and-forward packet FIFO that commits or discards each frame at its last beat.

Why by hand: ``amaranth.lib.fifo`` queues words, but a receive path must be able to forget a
frame whose verdict (bad ICRC, bad checksum, ...) arrives with its last beat, after its other
beats were already written. This FIFO keeps a committed write pointer and rolls the write
pointer back to it for a discarded frame; the reader only ever sees committed frames.

Ports:
  ``i``           in   stream of beats (``beat_layout``).
  ``i_drop``      in   sampled with the last beat of a frame: discard the frame.
  ``i_overflow``  out  the frame being written does not fit (it is longer than the FIFO); it
                       is accepted and discarded, and this is high with its last beat.
  ``o``           out  stream of beats of committed frames, in order.

Parameters: ``layout`` (beat layout with a ``last`` field), ``depth`` (power of two, beats),
``out_reg`` (default False): a register behind the memory's read data, fed by nothing else, so
a block RAM's slow unregistered output (5.8 ns on a speed-6 ECP5) reaches a flip-flop in the
same slice before any logic sees it; the memory's own output latch, held while its read enable
is low, serves as the second entry, so throughput stays one beat per clock. ``reg_flags``
(default False): the full and empty-of-committed compares come from flip-flops (computed from
the next pointers), for an input handshake and read enable that start at registers; the full
flag then sees a read a clock late (the writer may wait one clock more on a full FIFO).
Throughput: one beat per clock in and out. Latency: a committed frame's first beat is on ``o``
2 cycles after its last beat was written (3 with ``out_reg``).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["PacketFifo"]


class PacketFifo(wiring.Component):
    def __init__(self, layout, depth, *, out_reg=False, reg_flags=False):
        assert depth >= 2 and depth & (depth - 1) == 0
        self.layout = layout
        self.depth = depth
        self.out_reg = out_reg
        self.reg_flags = reg_flags
        super().__init__({
            "i": In(stream.Signature(layout)),
            "i_drop": In(1),
            "i_overflow": Out(1),
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.depth
        aw = (D - 1).bit_length()
        m.submodules.mem = mem = Memory(shape=self.layout, depth=D, init=[])
        wr = mem.write_port()
        rd = mem.read_port(domain="sync")

        # Pointers carry one extra bit so that full and empty differ.
        wp = Signal(aw + 1)      # next entry to write
        cp = Signal(aw + 1)      # end of the last committed frame
        rp = Signal(aw + 1)      # next entry to read from memory
        wp_n, cp_n, rp_n = Signal.like(wp), Signal.like(cp), Signal.like(rp)   # at the next edge
        m.d.sync += [wp.eq(wp_n), cp.eq(cp_n), rp.eq(rp_n)]
        # Full: same entry, other lap (an XOR and an AND tree, not a carry chain); at_commit:
        # nothing committed is left to read. ``reg_flags`` computes both from the next pointers
        # into flip-flops, so neither the input's ready nor the read enable starts at a 13-bit
        # compare (in the routed ECPIX-5 core, 2026-12-07, the receive buffer's full compare ran
        # through the parser's output handshake into its stage enables, 11.2 ns). Where the
        # input's decisions arrive late (the MAC's FCS verdict drops a frame) the next-pointer
        # compare is the longer path, so the default compares the registered pointers
        # (Colorlight shell, speed 6: eth_rx 133.7 MHz so, 104.6 with the registered flags).
        # Everything stored belongs to the frame still being written: nothing can drain, so a
        # full FIFO means this frame is too long. Accept and discard the rest of it. (Full and
        # nothing committed left to read is the same as wp - cp == D: the write side alone.)
        if self.reg_flags:
            # ``full`` takes the read pointer as it stands, not ``rp_n``: an entry read frees
            # for the writer a clock later (so a full FIFO drained at one beat per clock still
            # takes one per clock), and the reader's handshake stays out of the writer's flags
            # (from the pass/drop queue through the receive buffer's read enable and pointer
            # increment into ``full`` it was -2.88 ns routed on the ECPIX-5 core at ec958a5).
            # wp_n - rp never exceeds D: a write needs ``~full``, which bounds wp - (an older rp).
            full = Signal()
            stuck = Signal()
            at_commit = Signal(init=1)
            m.d.sync += [full.eq((wp_n ^ rp) == D), stuck.eq((wp_n ^ cp_n) == D)]
        else:
            full = (wp ^ rp) == D
            at_commit = rp == cp
            stuck = full & at_commit
        overflow = Signal()

        accept = self.i.valid & self.i.ready
        m.d.comb += [
            self.i.ready.eq(~full | stuck | overflow),
            wr.addr.eq(wp[:aw]),
            wr.data.eq(self.i.payload),
            wr.en.eq(accept & ~full & ~overflow),
            self.i_overflow.eq(overflow | (accept & stuck)),
            wp_n.eq(wp), cp_n.eq(cp),
        ]
        with m.If(accept):
            with m.If(self.i.payload.last):
                m.d.sync += overflow.eq(0)
                with m.If(self.i_drop | self.i_overflow):
                    m.d.comb += wp_n.eq(cp)
                with m.Else():
                    m.d.comb += [wp_n.eq(wp + 1), cp_n.eq(wp + 1)]
            with m.Elif(stuck | overflow):
                m.d.sync += overflow.eq(1)
            with m.Else():
                m.d.comb += wp_n.eq(wp + 1)

        o_valid = Signal()       # rd.data holds a beat (not yet passed on)
        if self.out_reg:
            q = Signal(self.layout)
            q_valid = Signal()
            q_advance = ~q_valid | self.o.ready
            advance = ~o_valid | q_advance
            with m.If(q_advance):
                m.d.sync += [q.eq(rd.data), q_valid.eq(o_valid)]
            m.d.comb += [self.o.valid.eq(q_valid), self.o.payload.eq(q)]
        else:
            advance = ~o_valid | self.o.ready
            m.d.comb += [self.o.valid.eq(o_valid), self.o.payload.eq(rd.data)]
        fetch = advance & ~at_commit
        # ``rp_inc`` is ``rp + 1`` in a register of its own, so ``fetch`` (from the reader's
        # handshake) only chooses between two registers and feeds no carry chain (from the
        # receive pipeline's pass/drop queue through the read enable and ``rp + fetch`` it was
        # -2.44 ns routed on the ECPIX-5 core at c45f3e0).
        rp_inc = Signal(aw + 1, init=1)
        m.d.sync += rp_inc.eq(Mux(fetch, rp_inc + 1, rp_inc))
        m.d.comb += [
            rd.addr.eq(rp[:aw]),
            rd.en.eq(fetch),
            rp_n.eq(Mux(fetch, rp_inc, rp)),
        ]
        if self.reg_flags:
            # both compares made without ``fetch``, which only chooses between them
            m.d.sync += at_commit.eq(Mux(fetch, rp_inc == cp_n, rp == cp_n))
        with m.If(advance):
            m.d.sync += o_valid.eq(fetch)
        return m
