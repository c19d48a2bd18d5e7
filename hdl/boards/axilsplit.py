# Ref: ARM IHI 0022E "AMBA AXI and ACE Protocol Specification", part B (AXI4-Lite), A3.3
#      (channel dependencies: a subordinate may wait for AWVALID and WVALID before WREADY)
"""``AxiLiteSplit``: one AXI4-Lite manager to two subordinates by address window.

A board top puts it between the control bridge and the register space: the ``mac`` and ``wq``
blocks live in the board's own CSR bank, every other address in ``NicCore``'s.

::

    s_axil --+-- address in one of ``windows`` --> m_axil1
             +-- any other address            --> m_axil0

``windows`` is a list of ``(base, size)`` byte ranges (``size`` a power of two, ``base`` a
multiple of it). One write and one read are in flight at a time, each routed by its own address:
a write waits for AW (W is held back until then, as A3.3 allows), is forwarded with its W beat
to the chosen subordinate, and its B response comes back before the next AW is taken; a read
likewise from AR to R. Cost: 1 clock per channel over a direct connection (a UART bridge
access is a thousand times longer). Responses are passed through unchanged.

Ports: ``s_axil`` In(AxiLiteSignature(addr_width)), ``m_axil0`` / ``m_axil1``
Out(AxiLiteSignature(addr_width)).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..axil import AxiLiteSignature

__all__ = ["AxiLiteSplit"]


class AxiLiteSplit(wiring.Component):
    """Address-window split of one AXI4-Lite bus (see the module docstring)."""

    def __init__(self, addr_width, windows):
        for base, size in windows:
            if size < 1 or size & (size - 1) or base % size or base + size > 1 << addr_width:
                raise ValueError(f"window ({base:#x}, {size:#x}) is not an aligned power-of-two "
                                 f"range inside {addr_width} address bits")
        self.windows = tuple(windows)
        sig = AxiLiteSignature(addr_width)
        super().__init__({"s_axil": In(sig), "m_axil0": Out(sig), "m_axil1": Out(sig)})

    def _hit(self, addr):
        hit = 0
        for base, size in self.windows:
            bits = (size - 1).bit_length()
            hit |= addr[bits:] == base >> bits
        return hit

    def elaborate(self, platform):
        m = Module()
        s, t0, t1 = self.s_axil, self.m_axil0, self.m_axil1
        for t in (t0, t1):
            m.d.comb += [t.awaddr.eq(s.awaddr), t.awprot.eq(s.awprot), t.wdata.eq(s.wdata),
                         t.wstrb.eq(s.wstrb), t.araddr.eq(s.araddr), t.arprot.eq(s.arprot)]

        # --- write ----------------------------------------------------------------------------
        w_sel = Signal()
        aw_done, w_done = Signal(), Signal()
        with m.FSM(name="write"):
            with m.State("IDLE"):
                with m.If(s.awvalid):
                    m.d.sync += [w_sel.eq(self._hit(s.awaddr)), aw_done.eq(0), w_done.eq(0)]
                    m.next = "FORWARD"
            with m.State("FORWARD"):
                for k, t in enumerate((t0, t1)):
                    with m.If(w_sel == k):
                        m.d.comb += [
                            t.awvalid.eq(s.awvalid & ~aw_done), s.awready.eq(t.awready & ~aw_done),
                            t.wvalid.eq(s.wvalid & ~w_done), s.wready.eq(t.wready & ~w_done),
                        ]
                with m.If(s.awvalid & s.awready):
                    m.d.sync += aw_done.eq(1)
                with m.If(s.wvalid & s.wready):
                    m.d.sync += w_done.eq(1)
                with m.If((aw_done | (s.awvalid & s.awready)) & (w_done | (s.wvalid & s.wready))):
                    m.next = "RESPONSE"
            with m.State("RESPONSE"):
                for k, t in enumerate((t0, t1)):
                    with m.If(w_sel == k):
                        m.d.comb += [s.bvalid.eq(t.bvalid), s.bresp.eq(t.bresp),
                                     t.bready.eq(s.bready)]
                with m.If(s.bvalid & s.bready):
                    m.next = "IDLE"

        # --- read -----------------------------------------------------------------------------
        r_sel = Signal()
        with m.FSM(name="read"):
            with m.State("IDLE"):
                with m.If(s.arvalid):
                    m.d.sync += r_sel.eq(self._hit(s.araddr))
                    m.next = "FORWARD"
            with m.State("FORWARD"):
                for k, t in enumerate((t0, t1)):
                    with m.If(r_sel == k):
                        m.d.comb += [t.arvalid.eq(s.arvalid), s.arready.eq(t.arready)]
                with m.If(s.arvalid & s.arready):
                    m.next = "RESPONSE"
            with m.State("RESPONSE"):
                for k, t in enumerate((t0, t1)):
                    with m.If(r_sel == k):
                        m.d.comb += [s.rvalid.eq(t.rvalid), s.rresp.eq(t.rresp),
                                     s.rdata.eq(t.rdata), t.rready.eq(s.rready)]
                with m.If(s.rvalid & s.rready):
                    m.next = "IDLE"
        return m
