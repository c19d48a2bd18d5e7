# Ref: ARM IHI 0022E "AMBA AXI and ACE Protocol Specification", part A (AXI4): A2 (signals),
#      A3.4 (burst: INCR, AxLEN <= 255, no 4 KiB crossing), A3.3 (channel dependencies)
"""AXI4 (full) master bus: the signature of the DMA port ``m_axi`` and its constants.

``Axi4Signature`` is declared from the master's side, like ``stellar.hdl.axil.AxiLiteSignature``:
a master takes ``Out(Axi4Signature(...))``, a subordinate ``In(...)``. Member names are the AXI
signal names that cocotbext-axi's ``AxiBus`` looks for, so a top whose port ``m_axi`` has this
signature, flattened by ``stellar.hdl.axil.FlatPorts``, exports ``m_axi_awid``, ``m_axi_awaddr``,
..., ``m_axi_rready`` and ``AxiBus.from_prefix(dut, "m_axi")`` binds to it. The optional AXI4
signals ``*qos``, ``*region`` and ``*user`` are left out (cocotbext-axi treats them as absent).
"""

from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from ..axil import Resp

__all__ = ["Axi4Signature", "Burst", "Resp", "CACHE_NORMAL", "PROT_DATA", "BOUNDARY"]

BOUNDARY = 4096   # an INCR burst never crosses a 4 KiB address boundary (A3.4.1)

# AxCACHE 0b0011: normal non-cacheable bufferable memory (A4.4), what a DMA into host memory
# behind a PCIe bridge uses. AxPROT 0b010: unprivileged, non-secure, data access (A4.7).
CACHE_NORMAL = 0b0011
PROT_DATA = 0b010


class Burst(enum.Enum, shape=2):
    """``AWBURST`` / ``ARBURST`` encoding."""
    FIXED = 0
    INCR = 1
    WRAP = 2


class Axi4Signature(wiring.Signature):
    """AXI4 bus, master's view.

    Parameters
    ----------
    addr_width : int
        Width of ``awaddr`` / ``araddr`` (byte addresses).
    data_width : int
        Width of ``wdata`` / ``rdata``: a power of two, 8 to 1024; ``wstrb`` has ``data_width // 8``.
    id_width : int
        Width of ``awid`` / ``bid`` / ``arid`` / ``rid`` (at least 1: cocotbext-axi needs them).

    Members
    -------
    awid awaddr awlen awsize awburst awlock awcache awprot awvalid : Out; awready : In
    wdata wstrb wlast wvalid : Out;                                 wready : In
    bid bresp bvalid : In;                                          bready : Out
    arid araddr arlen arsize arburst arlock arcache arprot arvalid : Out; arready : In
    rid rdata rresp rlast rvalid : In;                              rready : Out
    """

    def __init__(self, addr_width=64, data_width=64, id_width=4):
        if not isinstance(addr_width, int) or addr_width < 12:
            raise ValueError(f"address width must be an integer >= 12, not {addr_width!r}")
        if (not isinstance(data_width, int) or data_width < 8 or data_width > 1024
                or data_width & (data_width - 1)):
            raise ValueError(f"AXI4 data width must be a power of two from 8 to 1024, not {data_width!r}")
        if not isinstance(id_width, int) or id_width < 1:
            raise ValueError(f"id width must be a positive integer, not {id_width!r}")
        self._addr_width = addr_width
        self._data_width = data_width
        self._id_width = id_width
        members = {}
        for ch in ("aw", "ar"):
            members.update({
                f"{ch}id":    Out(id_width),
                f"{ch}addr":  Out(addr_width),
                f"{ch}len":   Out(8),
                f"{ch}size":  Out(3),
                f"{ch}burst": Out(Burst),
                f"{ch}lock":  Out(1),
                f"{ch}cache": Out(4),
                f"{ch}prot":  Out(3),
                f"{ch}valid": Out(1),
                f"{ch}ready": In(1),
            })
            if ch == "aw":
                members.update({
                    "wdata":  Out(data_width),
                    "wstrb":  Out(data_width // 8),
                    "wlast":  Out(1),
                    "wvalid": Out(1),
                    "wready": In(1),
                    "bid":    In(id_width),
                    "bresp":  In(Resp),
                    "bvalid": In(1),
                    "bready": Out(1),
                })
        members.update({
            "rid":    In(id_width),
            "rdata":  In(data_width),
            "rresp":  In(Resp),
            "rlast":  In(1),
            "rvalid": In(1),
            "rready": Out(1),
        })
        super().__init__(members)

    @property
    def addr_width(self):
        return self._addr_width

    @property
    def data_width(self):
        return self._data_width

    @property
    def id_width(self):
        return self._id_width

    # Signature subclasses compare by identity unless they say otherwise; two AXI4 buses of the
    # same widths are interchangeable.
    def __eq__(self, other):
        return (type(other) is Axi4Signature and self.addr_width == other.addr_width
                and self.data_width == other.data_width and self.id_width == other.id_width)

    def __hash__(self):
        return hash((Axi4Signature, self.addr_width, self.data_width, self.id_width))

    def __repr__(self):
        return (f"Axi4Signature(addr_width={self.addr_width}, data_width={self.data_width}, "
                f"id_width={self.id_width})")
