# Ref: IBTA Vol 1 Annex A17 (RoCEv2)
"""``stellar_rxflow``: the receive flow pipeline with an observable output, for tests and ``make sim``.

    s_axis_rx -> RxFlowPipeline -> o_meta.rec + o -> Deparser -> m_axis_tx   (passed frames)
                      |            o_meta / dropped  -> annotation word -> m_axis_ann (every frame)
                      +-> CSR bank on s_axil (pktengine, flow, qpctx, mr blocks)

What leaves ``m_axis_tx`` is every frame the pipeline passed, rebuilt by the deparser from its
header record: byte for byte the frame that entered. ``m_axis_ann`` carries one 32-byte word per
frame that reached the lookups (passed or dropped there), in arrival order, laid out by
``ANN_WORD``: verdict, tenant, QP index, the MR answer (bus address) and what the packet saw of
its QP context.

The transport is the next block to come; until then this top consumes each passed packet with a
small stand-in that exercises the QP context store's read-modify-write path: in the clock it
takes a RoCE packet it writes the context back with ``epsn`` = the packet's PSN + 1 and ``msn``
+ 1 (mod 2**24). A run of packets on one QP therefore shows, in its annotation words, the
context each packet saw: the update of the packet just before it, back to back.

Verilog ports (single-underscore AXI names, DESIGN.md): ``clk``, ``rst``,
``s_axis_rx_{tdata,tkeep,tlast,tvalid,tready}``, ``m_axis_tx_{...}``, ``m_axis_ann_{...}``
(256-bit ``tdata``, one beat per frame), ``s_axil_*`` (AXI4-Lite, 16-bit address).

``python -m stellar.hdl.top.rxflow --width 64|512 --qps N -o build/verilog`` writes the Verilog.
"""

import argparse
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..axil import AxiLiteSignature, FlatPorts
from ..axis import AxiStreamSignature, axis_to_stream, stream_to_axis
from ..csr import AxiLiteCsrBank
from ..flow.fields import FieldTable
from ..flow.layouts import struct_layout
from ..flow.rxflow import RxFlowPipeline
from ..net.deparser import Deparser
from ..regmap import REGMAP

__all__ = ["RxFlowTop", "TOP_NAME", "ANN_WORD", "ANN_BYTES", "convert", "verilog_top"]

TOP_NAME = "stellar_rxflow"
ANN_BYTES = 32

# One annotation word per frame on m_axis_ann (least significant bit first, as FieldTable packs).
ANN_WORD = FieldTable("ann_word", [
    ("passed", 1, "1: the frame went on (to m_axis_tx); 0: dropped by the flow pipeline"),
    ("reason", 3, "FlowVerdict: 0 none, 1 tenant, 2 unknown QP, 3 rkey, 4 access, 5 bounds"),
    ("roce", 1, "a RoCEv2 frame (else only passed is meaningful)"),
    ("mr_kind", 2, "MrKind checked: 0 none, 1 RDMA WRITE, 2 RDMA READ, 3 atomic"),
    ("mr_reason", 3, "MrReason of the MR check"),
    ("tenant", 8, "tenant from the VLAN map"),
    ("qp", 16, "QP index found (0 when not found)"),
    ("opcode", 8, "BTH opcode"),
    ("dest_qp", 24, "BTH destination QP"),
    ("psn", 24, "BTH PSN"),
    ("ctx_state", 3, "QP state in the context the packet saw"),
    ("ctx_epsn", 24, "epsn in the context the packet saw"),
    ("ctx_msn", 24, "msn in the context the packet saw"),
    ("reserved", 19, "zero"),
    ("bus_addr", 64, "MR check: bus address of the first byte"),
    ("span", 32, "MR check: bytes contiguous from bus_addr"),
], "m_axis_ann word")
assert ANN_WORD.width == ANN_BYTES * 8


class RxFlowTop(wiring.Component):
    """RX flow pipeline + deparser + annotation stream + CSR bank (see the module docstring).

    Parameters: ``data_width`` (64 or 512), ``qps`` (flow-table capacity and QP contexts),
    ``mr_entries``, ``mr_pages``.
    """

    def __init__(self, data_width=64, *, qps=4096, mr_entries=1024, mr_pages=1024):
        self.data_width = data_width
        self.qps = qps
        self.mr_entries = mr_entries
        self.mr_pages = mr_pages
        super().__init__({
            "s_axis_rx":  In(AxiStreamSignature(data_width)),
            "m_axis_tx":  Out(AxiStreamSignature(data_width)),
            "m_axis_ann": Out(AxiStreamSignature(ANN_BYTES * 8)),
            "s_axil":     In(AxiLiteSignature(16)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        m.submodules.pipe = pipe = RxFlowPipeline(W, qps=self.qps, mr_entries=self.mr_entries,
                                                  mr_pages=self.mr_pages)
        m.submodules.deparser = deparser = Deparser(W)
        m.submodules.csr = csr = AxiLiteCsrBank(REGMAP)
        m.submodules.annq = annq = SyncFIFOBuffered(width=ANN_WORD.width, depth=16)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        for block in ("pktengine", "flow", "qpctx", "mr"):
            wiring.connect(m, getattr(pipe, block), getattr(csr, block))

        m.d.comb += axis_to_stream(self.s_axis_rx, pipe.i)
        wiring.connect(m, pipe.o, deparser.i)
        m.d.comb += stream_to_axis(deparser.o, self.m_axis_tx)
        m.d.comb += pipe.tx_frame.eq(self.m_axis_tx.tvalid & self.m_axis_tx.tready & self.m_axis_tx.tlast)

        # A passed frame's meta goes to the deparser and its annotation word to annq in the same
        # clock; a dropped one only to annq.
        meta = pipe.o_meta
        took = meta.valid & meta.ready
        m.d.comb += [
            deparser.i_meta.payload.eq(meta.payload.rec),
            deparser.i_meta.valid.eq(meta.valid & annq.w_rdy),
            meta.ready.eq(deparser.i_meta.ready & annq.w_rdy),
            pipe.dropped.ready.eq(annq.w_rdy),
        ]
        ann = Signal(struct_layout(ANN_WORD))
        src = Signal.like(meta.payload)
        with m.If(pipe.dropped.valid):
            m.d.comb += src.eq(pipe.dropped.payload)
        with m.Else():
            m.d.comb += src.eq(meta.payload)
        m.d.comb += [
            ann.passed.eq(~pipe.dropped.valid),
            ann.reason.eq(src.ann.reason),
            ann.roce.eq(src.ann.roce),
            ann.mr_kind.eq(src.ann.mr_kind),
            ann.mr_reason.eq(src.ann.mr_reason),
            ann.tenant.eq(src.ann.tenant),
            ann.qp.eq(src.ann.qp),
            ann.opcode.eq(src.rec.bth_opcode),
            ann.dest_qp.eq(src.rec.bth_dest_qp),
            ann.psn.eq(src.rec.bth_psn),
            ann.ctx_state.eq(Mux(pipe.dropped.valid, 0, src.ctx.state)),
            ann.ctx_epsn.eq(Mux(pipe.dropped.valid, 0, src.ctx.epsn)),
            ann.ctx_msn.eq(Mux(pipe.dropped.valid, 0, src.ctx.msn)),
            ann.bus_addr.eq(src.ann.bus_addr),
            ann.span.eq(src.ann.span),
            annq.w_data.eq(ann),
            annq.w_en.eq(took | (pipe.dropped.valid & pipe.dropped.ready)),
        ]
        m.d.comb += [
            self.m_axis_ann.tvalid.eq(annq.r_rdy),
            self.m_axis_ann.tdata.eq(annq.r_data),
            self.m_axis_ann.tkeep.eq((1 << ANN_BYTES) - 1),
            self.m_axis_ann.tlast.eq(1),
            annq.r_en.eq(self.m_axis_ann.tready),
        ]

        # Transport stand-in: write the context back in the clock the packet is taken.
        ctx = meta.payload.ctx
        m.d.comb += [
            pipe.wb.valid.eq(took & meta.payload.ann.roce),
            pipe.wb.payload.index.eq(meta.payload.ann.qp),
            pipe.wb.payload.ctx.eq(ctx),
            pipe.wb.payload.ctx.epsn.eq(meta.payload.rec.bth_psn + 1),
            pipe.wb.payload.ctx.msn.eq(ctx.msn + 1),
        ]
        return m


def verilog_top(width=64, qps=4096, mr_entries=1024, mr_pages=1024):
    """The component exported as ``stellar_rxflow``, with flat AXI port names."""
    return FlatPorts(RxFlowTop(width, qps=qps, mr_entries=mr_entries, mr_pages=mr_pages))


def convert(width=64, **kw):
    return verilog.convert(verilog_top(width, **kw), name=TOP_NAME)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.top.rxflow",
                                 description="Write the stellar_rxflow Verilog top.")
    ap.add_argument("--width", type=int, default=64, choices=(64, 512), help="data width in bits")
    ap.add_argument("--qps", type=int, default=4096, help="flow-table capacity / QP contexts")
    ap.add_argument("-o", "--output", default="build/verilog", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.output) / f"{TOP_NAME}_w{args.width}_q{args.qps}.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(convert(args.width, qps=args.qps))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
