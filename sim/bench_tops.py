# Ref: IBTA Vol 1 Annex A17 (RoCEv2); ARM IHI 0051B (AXI4-Stream)
"""Bench-only Verilog tops that put each half of the packet engine alone on flat ports.

``make bench`` (:mod:`stellar.sim.bench`) measures the parser and the deparser each on its own
top, not through the loopback, because the loopback cannot show either block's rate honestly:

* Its receive buffer is store and forward and the deparser can only start a frame once the
  parser has delivered that frame's record (with its last beat), so the deparser's output rate
  there is bounded by the parser and the buffer, not by the deparser.
* The parser drops the headers, so its output carries fewer beats than its input; a chain behind
  it sees a thinned stream and would hide any stall of the block after it.

So each block gets a top whose inputs the testbench drives directly, every cycle, and whose
outputs are never stalled (``tready`` tied high by the testbench):

``ParserBench``    ``s_axis_*`` (frames in) -> Parser -> ``m_axis_*`` (payload out) and
                   ``m_meta`` (the whole header record, valid with the last payload beat).
                   Measured: beats accepted per cycle and bubbles on ``s_axis``; latency from a
                   frame's first ``s_axis`` beat to its first ``m_axis`` beat.
``DeparserBench``  ``s_meta_{payload,valid,ready}`` (records) and ``s_axis_*`` (payload) ->
                   Deparser -> ``m_axis_*`` (frames). Measured: beats per cycle and bubbles on
                   ``m_axis``; latency from a record's acceptance to its frame's first beat.
``pktloop``        the real ``stellar_pktloop`` (``stellar.hdl.top.pktloop.verilog_top``), as
                   shipped; measured end to end (first rx beat -> first tx beat, which includes
                   the store-and-forward receive buffer).

Every output of a block is a port of its bench top (the full record too), so synthesizing a
bench top (``bench.py`` runs ``synth_ecp5`` on them) keeps all of the block's logic: nothing is
trimmed as unobserved. Ports follow the AXI single-underscore naming of DESIGN.md through
``FlatPorts``; ``clk`` and ``rst`` come from the ``sync`` domain.

Parameter of every packet-engine factory: ``width``, the data width in bits (64 or 512).

The flow-table bench (:mod:`stellar.sim.bench_flow`) measures the shipped ``stellar_flowtable``
top (:mod:`stellar.hdl.top.flowtable`) through ``flowtable_top(capacity)``: the table's other
parameters are those the RX flow pipeline ships with (4 ways, 4 stash entries, 128 kicks, seed
0), plus an 8-bit lookup tag so the bench pairs every result with its lookup and measures the
latency exactly.
"""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from stellar.hdl.axil import FlatPorts
from stellar.hdl.axis import AxiStreamSignature, axis_to_stream, stream_to_axis
from stellar.hdl.net.deparser import Deparser
from stellar.hdl.net.layout import record_layout
from stellar.hdl.net.parser import Parser
from stellar.hdl.top.flowtable import TOP_NAME as FLOWTABLE_TOP_NAME
from stellar.hdl.top.flowtable import verilog_top as flowtable_verilog_top
from stellar.hdl.top.pktloop import TOP_NAME, verilog_top

__all__ = ["ParserBench", "DeparserBench", "parser_top", "deparser_top",
           "flowtable_top", "TOPS", "FLOW_TOP_NAME", "FLOW_TAG_BITS"]

FLOW_TOP_NAME = FLOWTABLE_TOP_NAME
FLOW_TAG_BITS = 8       # results are paired with lookups by a tag: the cycle number mod 256


class ParserBench(wiring.Component):
    """The parser alone. Ports: ``s_axis`` (In AXI4-Stream, frames), ``m_axis`` (Out AXI4-Stream,
    payload), ``m_meta`` (Out, ``record_layout()``: valid while the last ``m_axis`` beat is)."""

    def __init__(self, data_width=64):
        self.data_width = data_width
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "m_meta": Out(record_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.parser = parser = Parser(self.data_width)
        m.d.comb += axis_to_stream(self.s_axis, parser.i)
        m.d.comb += stream_to_axis(parser.o, self.m_axis)
        m.d.comb += self.m_meta.eq(parser.o_meta)
        return m


class DeparserBench(wiring.Component):
    """The deparser alone. Ports: ``s_meta`` (In stream of ``record_layout()`` records),
    ``s_axis`` (In AXI4-Stream, payload aligned to lane 0), ``m_axis`` (Out AXI4-Stream, frames)."""

    def __init__(self, data_width=64):
        self.data_width = data_width
        super().__init__({
            "s_meta": In(stream.Signature(record_layout())),
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.deparser = deparser = Deparser(self.data_width)
        wiring.connect(m, wiring.flipped(self.s_meta), deparser.i_meta)
        m.d.comb += axis_to_stream(self.s_axis, deparser.i)
        m.d.comb += stream_to_axis(deparser.o, self.m_axis)
        return m


def parser_top(width=64):
    """``stellar_bench_parser``: :class:`ParserBench` with single-underscore port names."""
    return FlatPorts(ParserBench(width))


def deparser_top(width=64):
    """``stellar_bench_deparser``: :class:`DeparserBench` with single-underscore port names."""
    return FlatPorts(DeparserBench(width))


def flowtable_top(capacity=4096):
    """The flow table alone at ``capacity`` slots: the shipped ``stellar_flowtable`` top
    (:mod:`stellar.hdl.top.flowtable`) with an 8-bit lookup tag (results are paired with their
    lookups by the cycle number mod 256)."""
    return flowtable_verilog_top(capacity, tag_bits=FLOW_TAG_BITS)


# Block name (as the bench reports it) -> (Verilog module name, factory).
TOPS = {
    "parser": ("stellar_bench_parser", parser_top),
    "deparser": ("stellar_bench_deparser", deparser_top),
    "pktloop": (TOP_NAME, verilog_top),
}
