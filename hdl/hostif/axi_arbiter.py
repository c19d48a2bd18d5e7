# Ref: ARM IHI 0022E "AMBA AXI and ACE Protocol Specification", part A (AXI4): A3.3 (channel
#      dependencies), A5.3 (transaction ordering: only transactions of one ID are ordered),
#      A3.4.4 / A5 (write data follows the order of the write addresses; AXI4 has no WID)
"""Two AXI4 masters onto one AXI4 bus: the queue engine's DMA and the transport's DMA share the
host-memory port.

Hand-written because ``amaranth.lib`` has no AXI interconnect (nor does amaranth-soc have an
AXI4 one); it does only what the two DMA engines need.

::

    s0 (ID i) --+-- AW: round robin -> register -> m.aw (ID {0, i})  + grant order -> W FIFO
                +-- W:  from the master at the head of the W FIFO, until its WLAST
    s1 (ID i) --+-- AR: round robin -> register -> m.ar (ID {1, i})
                +-- B / R: routed back by the top ID bit, the rest of the ID passed through

Rules kept:
- Write data in address order (AXI4 has no WID): every AW grant appends the master's number to
  a FIFO; W beats are taken only from the master at its head, through its burst's WLAST. A
  master whose W arrives before its AW is granted simply waits (AXI allows W before AW; the
  DMA writer never makes AW wait for W, so the grant always comes: no deadlock).
- Responses by ID: the arbiter prepends the master's number to the ID (``m`` IDs are one bit
  wider than ``s0``/``s1`` IDs); the subordinate returns B and R with that ID, and the arbiter
  routes each to its master by that bit with the original ID. Responses of one master keep
  their order (same ID); responses of the two masters may interleave in any way, each master
  sees its own in order.
- Fairness: on AW and on AR, when both masters request in the same clock, the one not granted
  last wins (round robin), so neither starves.
- The arbiter itself never reorders two writes: the subordinate sees AWs in grant order and
  their data in the same order.

Ports: ``s0``, ``s1`` ``In(Axi4Signature(addr_width, data_width, id_width))`` (the masters);
``m`` ``Out(Axi4Signature(addr_width, data_width, id_width + 1))`` (towards the memory).
Parameters: ``addr_width``, ``data_width``, ``id_width`` (of the masters), ``write_order``
(AW grants whose data has not all passed: depth of the W FIFO).
Latency: AW and AR +1 clock (a register); W, B, R combinational (no added cycle).
Throughput: one AW and one AR per clock, W/R/B one beat per clock.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..dma.axi4 import Axi4Signature

__all__ = ["Axi4Arbiter"]

_ADDR_FIELDS = ("addr", "len", "size", "burst", "lock", "cache", "prot")


class Axi4Arbiter(wiring.Component):
    """2:1 AXI4 interconnect (see the module docstring)."""

    def __init__(self, *, addr_width=64, data_width=64, id_width=3, write_order=8):
        if write_order < 1:
            raise ValueError(f"write_order must be at least 1, not {write_order!r}")
        self.id_width = id_width
        self.write_order = write_order
        sig = Axi4Signature(addr_width, data_width, id_width)
        super().__init__({
            "s0": In(sig),
            "s1": In(sig),
            "m":  Out(Axi4Signature(addr_width, data_width, id_width + 1)),
        })

    def _address_channel(self, m, ch, extra_ok):
        """Round-robin grant into an output register; returns (grant fired, granted master)."""
        s0, s1, out = self.s0, self.s1, self.m
        v0, v1 = getattr(s0, f"{ch}valid"), getattr(s1, f"{ch}valid")
        ovalid = Signal(name=f"{ch}_ovalid")
        last = Signal(name=f"{ch}_last")            # master granted last time
        free = ~ovalid | getattr(out, f"{ch}ready")
        pick1 = Signal(name=f"{ch}_pick1")
        m.d.comb += pick1.eq(v1 & (~v0 | ~last))
        fire = Signal(name=f"{ch}_fire")
        m.d.comb += [
            fire.eq(free & extra_ok & (v0 | v1)),
            getattr(s0, f"{ch}ready").eq(free & extra_ok & ~pick1),
            getattr(s1, f"{ch}ready").eq(free & extra_ok & pick1),
            getattr(out, f"{ch}valid").eq(ovalid),
        ]
        with m.If(getattr(out, f"{ch}ready")):
            m.d.sync += ovalid.eq(0)
        with m.If(fire):
            m.d.sync += [ovalid.eq(1), last.eq(pick1),
                         getattr(out, f"{ch}id").eq(Cat(Mux(pick1, getattr(s1, f"{ch}id"),
                                                            getattr(s0, f"{ch}id")), pick1))]
            for f in _ADDR_FIELDS:
                m.d.sync += getattr(out, f"{ch}{f}").eq(
                    Mux(pick1, getattr(s1, f"{ch}{f}"), getattr(s0, f"{ch}{f}")))
        return fire, pick1

    def elaborate(self, platform):
        m = Module()
        s0, s1, out = self.s0, self.s1, self.m
        IW = self.id_width

        # --- AW, and the order in which write data must follow ---
        m.submodules.worder = worder = SyncFIFO(width=1, depth=self.write_order)
        aw_fire, aw_pick = self._address_channel(m, "aw", worder.w_rdy)
        m.d.comb += [worder.w_en.eq(aw_fire), worder.w_data.eq(aw_pick)]

        # --- W from the master at the head of the grant order ---
        sel = worder.r_data
        head = worder.r_rdy
        m.d.comb += [
            out.wvalid.eq(head & Mux(sel, s1.wvalid, s0.wvalid)),
            out.wdata.eq(Mux(sel, s1.wdata, s0.wdata)),
            out.wstrb.eq(Mux(sel, s1.wstrb, s0.wstrb)),
            out.wlast.eq(Mux(sel, s1.wlast, s0.wlast)),
            s0.wready.eq(head & ~sel & out.wready),
            s1.wready.eq(head & sel & out.wready),
            worder.r_en.eq(out.wvalid & out.wready & out.wlast),
        ]

        # --- B back by the ID's top bit ---
        b1 = out.bid[IW]
        m.d.comb += [
            s0.bvalid.eq(out.bvalid & ~b1), s1.bvalid.eq(out.bvalid & b1),
            s0.bid.eq(out.bid[:IW]), s1.bid.eq(out.bid[:IW]),
            s0.bresp.eq(out.bresp), s1.bresp.eq(out.bresp),
            out.bready.eq(Mux(b1, s1.bready, s0.bready)),
        ]

        # --- AR, and R back by the ID's top bit ---
        self._address_channel(m, "ar", 1)
        r1 = out.rid[IW]
        m.d.comb += [
            s0.rvalid.eq(out.rvalid & ~r1), s1.rvalid.eq(out.rvalid & r1),
            out.rready.eq(Mux(r1, s1.rready, s0.rready)),
        ]
        for s in (s0, s1):
            m.d.comb += [s.rid.eq(out.rid[:IW]), s.rdata.eq(out.rdata), s.rresp.eq(out.rresp),
                         s.rlast.eq(out.rlast)]
        return m
