"""A control signal that drives a thousand flip-flops, carried on the FPGA's global network.

A pipeline enable that loads a wide stage (the scheduler's probe advance, a record queue's load)
is one net with a clock-enable pin in every slice the stage is placed in: in general routing it
spreads a tree of wires over the die, where the data paths need them. An ECP5 has 16 global
networks per quadrant, made for clocks, of which nextpnr-ecp5 lets 8 feed logic (clock-enable,
set/reset and LUT inputs) through a ``DCCA`` buffer; only clocks are put there by nextpnr
itself (and the core's reset by the board top, ``hdl/boards/top.py``).

:class:`GlobalNet` is that buffer when the design is built for an ECP5 (the platform says so),
and a wire otherwise (simulation, other tools, the out-of-context timing harness). Its delay on
the ECP5 is the route to the buffer plus the global tree's (not yet measured: no build of the
full core has routed), so it suits a decision that starts at flip-flops a logic level or three
away, not a long combinational path. Written by hand because neither Amaranth nor
amaranth-boards exposes the global buffers as a library element.

How many: nextpnr-ecp5 routes at most 8 globals into logic, and gives a clock the lowest free
global; on the board tops the four clocks (core, Ethernet TX, TX at 90 degrees, RX) take four
of those 8 and the core's reset a fifth, so the core may use ``CORE_GLOBALS`` = 3 (a fourth
would find none and stay in general routing; ``tests/unit/test_fanout.py`` counts them).
"""

from amaranth.hdl import Instance, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["GlobalNet", "on_global", "CORE_GLOBALS"]

CORE_GLOBALS = 3


class GlobalNet(wiring.Component):
    """``o`` follows ``i`` (combinationally); on an ECP5 through a ``DCCA`` onto a global."""

    i: In(1)
    o: Out(1)

    def elaborate(self, platform):
        m = Module()
        if getattr(platform, "family", None) == "ecp5":
            m.submodules.dcc = Instance("DCCA", i_CLKI=self.i, i_CE=1, o_CLKO=self.o)
        else:
            m.d.comb += self.o.eq(self.i)
        return m


def on_global(m, name, value):
    """Add a :class:`GlobalNet` named ``name`` to module ``m`` carrying ``value``; returns its
    output (use it wherever the fanout is: the stage enables)."""
    m.submodules[name] = buf = GlobalNet()
    m.d.comb += buf.i.eq(value)
    return buf.o
