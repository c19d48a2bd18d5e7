# Ref: IEEE 802.3-2018 clauses 3, 35; RGMII v2.0
"""``stellar_mac``: the RGMII 1 GbE MAC alone, as a Verilog top for cocotbext-eth's RGMII models.

::

    rgmii_rx* --> RgmiiPhy (modelled DDR pins) --gmii--> MacCore --> m_axis_rx   (clk)
    rgmii_tx* <--                                               <-- s_axis_tx   (clk)
                                                        counters --> count_*     (clk)

The RGMII pins are plain signals with the DDR registers modelled by rising- and falling-edge
flip-flops (``RgmiiPhy()`` without platform ports), so Verilator simulates them and
``RgmiiSource``/``RgmiiSink`` drive and watch them like a PHY would.

Verilog ports (single-underscore names, DESIGN.md):
  ``clk``, ``rst``              the core clock domain (``sync``)
  ``eth_tx_clk``, ``eth_tx_rst``  the 125 MHz transmit clock and its reset (``eth_rx``'s reset is
                                this one, synchronized to ``rgmii_rxc``)
  ``eth_tx90_clk``              ``eth_tx_clk`` delayed by a quarter period (2 ns): drives
                                ``rgmii_txc`` so the data is sampled mid-eye, as a PHY's TX delay
                                or a PLL's 90-degree output would place it
  ``rgmii_txc``, ``rgmii_tx_ctl``, ``rgmii_txd[3:0]``   out, to the PHY
  ``rgmii_rxc``, ``rgmii_rx_ctl``, ``rgmii_rxd[3:0]``   in, from the PHY
  ``s_axis_tx_*``, ``m_axis_rx_*``  AXI4-Stream, ``W``-bit, frames without FCS (``MacCore``)
  ``count_<name>[31:0]``        ``MacCore`` counters (``stellar.hdl.mac.cdc.COUNTERS``), wrapping

``python -m stellar.hdl.top.mac --width 64 -o build/verilog`` writes the Verilog.
"""

from amaranth.back import verilog
from amaranth.hdl import ClockDomain, ClockSignal, Module, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

from ..axil import FlatPorts
from ..axis import AxiStreamSignature
from ..mac.cdc import COUNTERS, MacCore
from ..mac.rgmii import RgmiiPhy, RgmiiPinsSignature
from .cli import verilog_main

__all__ = ["MacTop", "TOP_NAME", "verilog_top", "convert"]

TOP_NAME = "stellar_mac"


class MacTop(wiring.Component):
    """RgmiiPhy (modelled pins) + MacCore with counters; see the module docstring.

    Parameters: ``data_width`` (core side, default 64), ``rx_fifo_bytes`` (receive packet FIFO,
    default 4096), ``max_frame`` (default 1522)."""

    def __init__(self, data_width=64, *, rx_fifo_bytes=4096, max_frame=1522):
        self.data_width = data_width
        self.rx_fifo_bytes = rx_fifo_bytes
        self.max_frame = max_frame
        super().__init__({
            "eth_tx_clk":   In(1),
            "eth_tx_rst":   In(1),
            "eth_tx90_clk": In(1),
            "rgmii":        Out(RgmiiPinsSignature()),
            "s_axis_tx":    In(AxiStreamSignature(data_width)),
            "m_axis_rx":    Out(AxiStreamSignature(data_width)),
            **{f"count_{name}": Out(32) for name in COUNTERS},
        })

    def elaborate(self, platform):
        m = Module()
        m.domains.eth_tx = ClockDomain("eth_tx")
        m.domains.eth_tx90 = ClockDomain("eth_tx90", reset_less=True)
        m.domains.eth_rx = ClockDomain("eth_rx")
        m.submodules.phy = phy = RgmiiPhy(txc_domain="eth_tx90")
        m.submodules.mac = mac = MacCore(self.data_width, rx_fifo_bytes=self.rx_fifo_bytes,
                                         max_frame=self.max_frame)
        m.submodules.eth_rx_rst = ResetSynchronizer(ResetSignal("eth_tx"), domain="eth_rx")
        m.d.comb += [
            ClockSignal("eth_tx").eq(self.eth_tx_clk),
            ResetSignal("eth_tx").eq(self.eth_tx_rst),
            ClockSignal("eth_tx90").eq(self.eth_tx90_clk),
            ClockSignal("eth_rx").eq(phy.rx_clk),
        ]
        wiring.connect(m, wiring.flipped(self.rgmii), phy.pins)
        wiring.connect(m, mac.gmii, phy.gmii)
        wiring.connect(m, wiring.flipped(self.s_axis_tx), mac.s_axis_tx)
        wiring.connect(m, mac.m_axis_rx, wiring.flipped(self.m_axis_rx))
        for name in COUNTERS:
            count = getattr(self, f"count_{name}")
            with m.If(getattr(mac.counters, name)):
                m.d.sync += count.eq(count + 1)
        return m


def verilog_top(width=64, rx_fifo_bytes=4096):
    """The component exported as ``stellar_mac``, with flat port names."""
    return FlatPorts(MacTop(width, rx_fifo_bytes=rx_fifo_bytes))


def convert(data_width=64, rx_fifo_bytes=4096):
    """Verilog text of ``stellar_mac``."""
    return verilog.convert(verilog_top(data_width, rx_fifo_bytes), name=TOP_NAME)


def main(argv=None):
    verilog_main(TOP_NAME, convert, argv, module="stellar.hdl.top.mac", widths=None)


if __name__ == "__main__":
    main()
