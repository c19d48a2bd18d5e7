# Ref: IBTA Vol 1 Annex A17 (RoCEv2)
"""``stellar_pktloop``: the packet engine in loopback, the contract later tests rely on.

    s_axis_rx -> Parser -> PacketFifo (drop on verdict) -> Deparser -> m_axis_tx
                    |         record FIFO ------------------^
                    +-> counters (CSR bank on s_axil)

A valid RoCEv2 frame is parsed into a header record and a payload stream and rebuilt by the
deparser: what leaves is the frame that entered, byte for byte, with lengths, IPv4 checksum and
ICRC recomputed. A non-RoCE frame leaves unchanged. A frame the parser marks (bad ICRC, bad IPv4
checksum, malformed, unknown opcode) is dropped and counted. The receive buffer is store and
forward (a frame is only sent once its verdict is known), so the loopback latency is the frame
length plus a constant; the parser and deparser themselves have fixed latency.

Verilog ports (single-underscore AXI names, DESIGN.md): ``clk``, ``rst``,
``s_axis_rx_{tdata,tkeep,tlast,tvalid,tready}``, ``m_axis_tx_{...}``, ``s_axil_*`` (AXI4-Lite,
32-bit data, 16-bit address; register map in ``stellar.hdl.regmap``).

``python -m stellar.hdl.top.pktloop --width 64|512 -o build/verilog`` writes the Verilog.
"""

from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..axil import AxiLiteSignature, FlatPorts
from ..axis import AxiStreamSignature, axis_to_stream, stream_to_axis
from ..csr import AxiLiteCsrBank
from ..net.deparser import Deparser
from ..net.layout import beat_layout, record_layout
from ..net.parser import Parser, count_rx
from ..pktfifo import PacketFifo
from ..regmap import RegisterMap, pktengine_block, pktengine_config
from .cli import verilog_main

__all__ = ["PacketLoopback", "TOP_NAME", "RX_BUFFER_BYTES", "PKTLOOP_REGMAP", "convert", "verilog_top"]

TOP_NAME = "stellar_pktloop"
RX_BUFFER_BYTES = 32768   # two 9000-byte jumbo frames: one leaving while the next arrives
# Header records waiting with their frames. Input and output run at the same rate, so the
# backlog a jumbo frame leaves behind never drains under full load: every minimum-size frame
# that arrives while a 9000-byte frame leaves needs a record slot (141 at 64 bytes per beat).
RECORDS = 256
# The loopback implements only the packet engine: its ident block lists just that feature, so a
# driver never looks for a flow table that is not there.
PKTLOOP_REGMAP = RegisterMap([pktengine_block()])


class PacketLoopback(wiring.Component):
    """Parser -> drop-on-verdict receive buffer -> deparser, with the pktengine counters.

    Ports: ``s_axis_rx`` (In AXI4-Stream), ``m_axis_tx`` (Out AXI4-Stream), ``s_axil``
    (AXI4-Lite CSR bus). Parameters: ``data_width`` (64 or 512).
    """

    def __init__(self, data_width=64):
        self.data_width = data_width
        super().__init__({
            "s_axis_rx": In(AxiStreamSignature(data_width)),
            "m_axis_tx": Out(AxiStreamSignature(data_width)),
            "s_axil": In(AxiLiteSignature(16)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        m.submodules.parser = parser = Parser(W)
        m.submodules.rxbuf = rxbuf = PacketFifo(beat_layout(W), RX_BUFFER_BYTES // (W // 8))
        m.submodules.records = records = SyncFIFOBuffered(width=record_layout().size,
                                                          depth=RECORDS)
        m.submodules.deparser = deparser = Deparser(W)
        m.submodules.csr = csr = AxiLiteCsrBank(PKTLOOP_REGMAP)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)

        m.d.comb += axis_to_stream(self.s_axis_rx, parser.i)

        meta = parser.o_meta
        last = parser.o.valid & parser.o.ready & parser.o.payload.last
        m.d.comb += [
            # A frame's record is queued with its last beat, so a beat moves only when both the
            # buffer and the record FIFO have room (valid and ready both gated: no duplicates).
            rxbuf.i.valid.eq(parser.o.valid & records.w_rdy),
            rxbuf.i.payload.eq(parser.o.payload),
            rxbuf.i_drop.eq(meta.drop),
            parser.o.ready.eq(rxbuf.i.ready & records.w_rdy),
            records.w_en.eq(last & ~meta.drop & ~rxbuf.i_overflow),
            records.w_data.eq(meta),
        ]
        wiring.connect(m, rxbuf.o, deparser.i)
        m.d.comb += [
            deparser.i_meta.valid.eq(records.r_rdy),
            deparser.i_meta.payload.eq(records.r_data),
            records.r_en.eq(deparser.i_meta.ready),
        ]
        m.d.comb += stream_to_axis(deparser.o, self.m_axis_tx)

        count_rx(m, csr.pktengine, meta, last, rxbuf.i_overflow)
        m.d.comb += [
            csr.pktengine.config.eq(pktengine_config(W)),
            csr.pktengine.tx_frames_inc.eq(self.m_axis_tx.tvalid & self.m_axis_tx.tready
                                           & self.m_axis_tx.tlast),
        ]
        return m


def verilog_top(width=64):
    """The component exported as ``stellar_pktloop``: the loopback with flat AXI port names."""
    return FlatPorts(PacketLoopback(width))


def convert(data_width=64):
    """Verilog text of ``stellar_pktloop`` at ``data_width``."""
    return verilog.convert(verilog_top(data_width), name=TOP_NAME)


def main(argv=None):
    verilog_main(TOP_NAME, convert, argv, module="stellar.hdl.top.pktloop")


if __name__ == "__main__":
    main()
