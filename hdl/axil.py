# Ref: ARM IHI 0022E "AMBA AXI and ACE Protocol Specification", part B (AXI4-Lite).
"""AXI4-Lite: the signature of the CSR bus, and single-underscore port names at Verilog tops.

``AxiLiteSignature`` is declared from the manager's (master's) side, like the Amaranth standard
library's bus signatures; a subordinate takes ``In(AxiLiteSignature(...))``. A component member
named ``s_axil`` of that signature flattens to the paths ``("s_axil", "awaddr")``, ...

Amaranth's ``verilog.convert`` joins such paths with a double underscore (``s_axil__awaddr``),
while cocotbext-axi and cocotbext-pcie bind by prefix and expect ``s_axil_awaddr``. Tops keep
their natural nested interfaces and are wrapped at export time::

    verilog.convert(FlatPorts(top), name="stellar_top")

``FlatPorts`` re-exposes every port of ``top`` under the path joined with single underscores
(``s_axil_awaddr``, ..., ``s_axil_rready``), so the naming rule lives in one place instead of in
every top's port list.
"""

from amaranth.hdl import Const, Module, ValueCastable
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Resp", "AxiLiteSignature", "FlatPorts"]


class Resp(enum.Enum, shape=2):
    """``BRESP`` / ``RRESP`` encoding."""
    OKAY   = 0
    EXOKAY = 1  # exclusive access; never used by AXI4-Lite subordinates
    SLVERR = 2
    DECERR = 3


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite bus, manager's view.

    Parameters
    ----------
    addr_width : int
        Width of ``awaddr`` / ``araddr`` (byte addresses).
    data_width : int
        32 or 64 (AXI4-Lite allows only these); ``wstrb`` has ``data_width // 8`` bits.

    Members
    -------
    awaddr, awprot, awvalid : Out;  awready : In        write address channel
    wdata, wstrb, wvalid : Out;     wready : In         write data channel
    bresp, bvalid : In;             bready : Out        write response channel
    araddr, arprot, arvalid : Out;  arready : In        read address channel
    rdata, rresp, rvalid : In;      rready : Out        read data channel
    """

    def __init__(self, addr_width, data_width=32):
        if not isinstance(addr_width, int) or addr_width < 1:
            raise TypeError(f"address width must be a positive integer, not {addr_width!r}")
        if data_width not in (32, 64):
            raise ValueError(f"AXI4-Lite data width must be 32 or 64, not {data_width!r}")
        self._addr_width = addr_width
        self._data_width = data_width
        super().__init__({
            "awaddr":  Out(addr_width),
            "awprot":  Out(3),
            "awvalid": Out(1),
            "awready": In(1),
            "wdata":   Out(data_width),
            "wstrb":   Out(data_width // 8),
            "wvalid":  Out(1),
            "wready":  In(1),
            "bresp":   In(Resp),
            "bvalid":  In(1),
            "bready":  Out(1),
            "araddr":  Out(addr_width),
            "arprot":  Out(3),
            "arvalid": Out(1),
            "arready": In(1),
            "rdata":   In(data_width),
            "rresp":   In(Resp),
            "rvalid":  In(1),
            "rready":  Out(1),
        })

    @property
    def addr_width(self):
        return self._addr_width

    @property
    def data_width(self):
        return self._data_width

    # Signature subclasses compare by identity unless they say otherwise; two AXI4-Lite buses of
    # the same widths are interchangeable.
    def __eq__(self, other):
        return (type(other) is AxiLiteSignature and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    def __hash__(self):
        return hash((AxiLiteSignature, self.addr_width, self.data_width))

    def __repr__(self):
        return f"AxiLiteSignature(addr_width={self.addr_width}, data_width={self.data_width})"


class FlatPorts(wiring.Component):
    """Wrap ``component`` so that every port is named by its path joined with ``_``.

    Meant for Verilog export only: ``verilog.convert(FlatPorts(top), name=...)``. A member
    ``s_axil`` of ``AxiLiteSignature`` comes out as ``s_axil_awaddr``, ..., ``s_axil_rready``;
    array elements get their index (``lane_0``). ``clk`` and ``rst`` are added by ``convert``
    as usual. An input the component ties to a constant (the ``ready`` of an ``Out`` stream
    with ``always_ready``, the ``valid`` of an ``In`` stream with ``always_valid``) gets no
    port: there is nothing to drive. Raises ``NameError`` if two paths join to the same name
    (e.g. members ``a_b`` and ``a.b``), rather than silently merging ports.

    Parameters
    ----------
    component : wiring.Component
        The top to export; it becomes the wrapper's only submodule, named ``inner``.
    """

    def __init__(self, component):
        self._inner = component
        self._paths = {}
        members = {}
        for path, member, value in component.signature.flatten(component):
            if member.flow == In and isinstance(value, Const):
                continue
            name = "_".join(map(str, path))
            if name in members:
                self._MustUse__silence = True  # a wrapper that failed to build is not "unused"
                raise NameError(f"ports {'.'.join(map(str, self._paths[name]))} and "
                                f"{'.'.join(map(str, path))} both flatten to {name!r}")
            self._paths[name] = path
            flow = In if member.flow == In else Out
            members[name] = flow(member.shape, init=member.init)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = self._inner
        values = {path: value for path, _member, value in self._inner.signature.flatten(self._inner)}
        for name, member in self.signature.members.items():
            inner, outer = values[self._paths[name]], getattr(self, name)
            if isinstance(inner, ValueCastable):
                inner = inner.as_value()
            if isinstance(outer, ValueCastable):
                outer = outer.as_value()
            if member.flow == In:
                m.d.comb += inner.eq(outer)
            else:
                m.d.comb += outer.eq(inner)
        return m

