# Ref: ARM IHI 0022E (AMBA AXI4), ARM IHI 0051B (AXI4-Stream)
"""``stellar_dma``: the DMA engine alone, its streams at AXI-Stream ports, for the Verilator tests.

    s_axis_wcmd  --> DmaWriter --+                         m_axi_aw*, m_axi_w*, m_axi_b*
    s_axis_wdata -->             +--> m_axi (one AXI4 master)
    s_axis_rcmd  --> DmaReader --+                         m_axi_ar*, m_axi_r*
    m_axis_rdata <--

Verilog ports (single-underscore AXI names, DESIGN.md), ``W`` = data width:

    ===============================  ====  ==================================================
    port                             dir   what
    ===============================  ====  ==================================================
    clk, rst                         in    ``sync`` domain, synchronous active-high reset
    m_axi_*                          --    AXI4 master, 64-bit address, W data, 4-bit ID
                                           (``stellar.hdl.dma.axi4.Axi4Signature``)
    s_axis_wcmd_{tdata,tvalid,       in    write commands: ``tdata`` 80 bits = ``addr`` (bits
      tready}                              0..63, bytes 0..7) and ``len`` (bits 64..79)
    s_axis_wdata_{tdata,tkeep,       in    the bytes to write, lane 0 aligned,
      tlast,tvalid,tready}                 ``max(1, ceil(len / B))`` beats per command
    wr_done                          out   one-cycle pulse per write command, in order, once
                                           all its B responses are in
    wr_done_error                    out   with ``wr_done``: a B response of it was not OKAY
    wr_error, wr_errors              out   sticky flag, 16-bit count of non-OKAY B responses
    s_axis_rcmd_{tdata,tvalid,       in    read commands, packed like ``s_axis_wcmd``
      tready}
    m_axis_rdata_{tdata,tkeep,       out   the bytes read, lane 0 aligned, ``tlast`` on each
      tlast,tvalid,tready}                 command's last beat (``tkeep == 0`` for len 0)
    rd_error, rd_errors              out   sticky flag, 16-bit count of non-OKAY R beats
    ===============================  ====  ==================================================

``python -m stellar.hdl.top.dma --width 64|512 -o build/verilog`` writes the Verilog.
"""

import argparse
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..axil import FlatPorts
from ..axis import AxiStreamSignature, axis_to_stream, stream_to_axis
from ..dma.axi4 import Axi4Signature
from ..dma.engine import Dma, cmd_layout

__all__ = ["DmaTop", "TOP_NAME", "CMD_BITS", "convert", "verilog_top"]

TOP_NAME = "stellar_dma"
CMD_BITS = cmd_layout().size      # 80: addr (64) then len (16), least significant first


class CmdAxisSignature(wiring.Signature):
    """A command stream at the edge: ``tdata``, ``tvalid`` out, ``tready`` in (one beat per
    command, so no ``tkeep`` / ``tlast``)."""

    def __init__(self):
        super().__init__({"tdata": Out(CMD_BITS), "tvalid": Out(1), "tready": In(1)})

    def __eq__(self, other):
        return type(other) is CmdAxisSignature

    def __hash__(self):
        return hash(CmdAxisSignature)


class DmaTop(wiring.Component):
    """:class:`stellar.hdl.dma.Dma` with AXI-Stream command and data ports (table above).

    Parameters: ``data_width`` (64 or 512), ``max_burst``, ``outstanding`` (reads and writes),
    ``buffer`` (reader, beats; default four maximal bursts). Attribute: ``dma``.
    """

    def __init__(self, data_width=64, *, max_burst=256, outstanding=16, buffer=None):
        self.data_width = data_width
        self.dma = Dma(data_width, max_burst=max_burst, outstanding=outstanding, buffer=buffer,
                       wr_outstanding=outstanding)
        super().__init__({
            "m_axi":         Out(Axi4Signature(64, data_width, 4)),
            "s_axis_wcmd":   In(CmdAxisSignature()),
            "s_axis_wdata":  In(AxiStreamSignature(data_width)),
            "wr_done":       Out(1),
            "wr_done_error": Out(1),
            "wr_error":      Out(1),
            "wr_errors":     Out(16),
            "s_axis_rcmd":   In(CmdAxisSignature()),
            "m_axis_rdata":  Out(AxiStreamSignature(data_width)),
            "rd_error":      Out(1),
            "rd_errors":     Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = dma = self.dma
        wiring.connect(m, dma.m_axi, wiring.flipped(self.m_axi))
        for axis, cmd in ((self.s_axis_wcmd, dma.wr_cmd), (self.s_axis_rcmd, dma.rd_cmd)):
            m.d.comb += [
                cmd.valid.eq(axis.tvalid),
                cmd.payload.eq(axis.tdata),
                axis.tready.eq(cmd.ready),
            ]
        m.d.comb += axis_to_stream(self.s_axis_wdata, dma.wr_data)
        m.d.comb += stream_to_axis(dma.rd_data, self.m_axis_rdata)
        m.d.comb += [
            self.wr_done.eq(dma.wr_done.valid),
            self.wr_done_error.eq(dma.wr_done.payload.error),
            self.wr_error.eq(dma.wr_error),
            self.wr_errors.eq(dma.wr_errors),
            self.rd_error.eq(dma.rd_error),
            self.rd_errors.eq(dma.rd_errors),
        ]
        return m


def verilog_top(width=64, max_burst=256, outstanding=16):
    """The component exported as ``stellar_dma``: :class:`DmaTop` with flat AXI port names."""
    return FlatPorts(DmaTop(width, max_burst=max_burst, outstanding=outstanding))


def convert(data_width=64, max_burst=256, outstanding=16):
    """Verilog text of ``stellar_dma``."""
    return verilog.convert(verilog_top(data_width, max_burst, outstanding), name=TOP_NAME)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.top.dma",
                                 description="Write the stellar_dma Verilog top.")
    ap.add_argument("--width", type=int, default=64, choices=(64, 512), help="data width in bits")
    ap.add_argument("--max-burst", type=int, default=256, help="longest AXI burst, beats")
    ap.add_argument("--outstanding", type=int, default=16, help="bursts in flight per direction")
    ap.add_argument("-o", "--output", default="build/verilog", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.output) / f"{TOP_NAME}_w{args.width}.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(convert(args.width, args.max_burst, args.outstanding))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
