"""A two-entry register stage for ``amaranth.lib.stream`` interfaces that cuts every
combinational path through it (valid, ready and payload), for timing closure between blocks.

(``amaranth.lib`` has FIFOs but no register slice; ``SyncFIFOBuffered(depth=2)`` registers
``valid`` and the payload but not ``w_rdy`` towards the producer, and uses memory.)"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """Two-entry FIFO of flip-flops that cuts the combinational paths through it: ``i.ready``
    and ``o.valid`` come from flip-flops, and an accepted ``i.payload`` goes straight into a
    flip-flop (clock enable only, no logic in front: what a block RAM's slow unregistered
    output needs on a speed-6 ECP5). ``o.payload`` is a 2:1 mux of the two entries. One beat
    per clock in and out when ``o`` is never stalled; 1 clock of latency.

    Ports: ``i`` In stream of ``shape``; ``o`` Out stream of ``shape``."""

    def __init__(self, shape):
        self.shape = shape
        super().__init__({
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        entries = [Signal(self.shape, name=f"entry{k}") for k in range(2)]
        wp, rp = Signal(), Signal()
        full, nonempty = Signal(), Signal()
        write = self.i.valid & self.i.ready
        read = self.o.valid & self.o.ready
        m.d.comb += [
            self.i.ready.eq(~full),
            self.o.valid.eq(nonempty),
            self.o.payload.eq(Mux(rp, entries[1], entries[0])),
        ]
        with m.If(write):
            m.d.sync += wp.eq(~wp)
            for k in range(2):
                with m.If(wp == k):
                    m.d.sync += entries[k].eq(self.i.payload)
        with m.If(read):
            m.d.sync += rp.eq(~rp)
        with m.If(write & ~read):
            # One more entry: full when there was one already.
            m.d.sync += [nonempty.eq(1), full.eq(nonempty)]
        with m.Elif(read & ~write):
            m.d.sync += [full.eq(0), nonempty.eq(full)]
        return m
