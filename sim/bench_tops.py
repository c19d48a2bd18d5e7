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

The flow-table bench (:mod:`stellar.sim.bench_flow`) has a top of its own here too:

``FlowTableBench``  :class:`stellar.hdl.flow.cuckoo.FlowTable` with its streams split into flat
                   ports named after what they carry (``lookup_tenant``, ``result_hit``, ...,
                   the same names as the ``stellar_flowtable`` test top), exported as
                   ``stellar_bench_flowtable``. Parameter: ``capacity``; the table's other
                   parameters are those the RX flow pipeline ships with (4 ways, 4 stash
                   entries, 128 kicks, seed 0), plus an 8-bit lookup tag so the bench can pair
                   every result with its lookup and measure the latency exactly.
"""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from stellar.hdl.axil import FlatPorts
from stellar.hdl.axis import AxiStreamSignature, axis_to_stream, stream_to_axis
from stellar.hdl.flow.cuckoo import FlowTable
from stellar.hdl.flow.fields import QPN_BITS, TENANT_BITS
from stellar.hdl.net.deparser import Deparser
from stellar.hdl.net.layout import record_layout
from stellar.hdl.net.parser import Parser
from stellar.hdl.top.pktloop import TOP_NAME, verilog_top

__all__ = ["ParserBench", "DeparserBench", "FlowTableBench", "parser_top", "deparser_top",
           "flowtable_top", "TOPS", "FLOW_TOP_NAME", "FLOW_TAG_BITS"]

FLOW_TOP_NAME = "stellar_bench_flowtable"
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


class FlowTableBench(wiring.Component):
    """The flow table alone, every port flat (directions from the table's side):

    ``lookup_valid``, ``lookup_tenant`` (8), ``lookup_qpn`` (24), ``lookup_tag`` (``tag_bits``)
    in; ``result_valid``, ``result_hit``, ``result_value`` (``value_bits``), ``result_tag`` out;
    ``cmd_valid``, ``cmd_op`` (2, ``FlowOp``), ``cmd_tenant``, ``cmd_qpn``, ``cmd_value`` in,
    ``cmd_ready`` out; ``resp_valid``, ``resp_status`` (2, ``FlowStatus``), ``resp_value``,
    ``resp_cycles`` (16), ``busy``, ``occupancy`` (``value_bits + 1``), ``stash_used`` out.

    The always-ready streams have no ``ready`` port (a constant 1 cannot be a Verilog input),
    which is why :class:`stellar.hdl.axil.FlatPorts` cannot wrap the table directly.
    """

    def __init__(self, capacity=4096, *, tag_bits=FLOW_TAG_BITS, **table):
        self.table = FlowTable(capacity, tag_bits=tag_bits, **table)
        self.LATENCY = self.table.LATENCY
        vb = self.table.value_bits
        super().__init__({
            "lookup_valid":  In(1),
            "lookup_tenant": In(TENANT_BITS),
            "lookup_qpn":    In(QPN_BITS),
            "lookup_tag":    In(tag_bits),
            "result_valid":  Out(1),
            "result_hit":    Out(1),
            "result_value":  Out(vb),
            "result_tag":    Out(tag_bits),
            "cmd_valid":     In(1),
            "cmd_ready":     Out(1),
            "cmd_op":        In(2),
            "cmd_tenant":    In(TENANT_BITS),
            "cmd_qpn":       In(QPN_BITS),
            "cmd_value":     In(vb),
            "resp_valid":    Out(1),
            "resp_status":   Out(2),
            "resp_value":    Out(vb),
            "resp_cycles":   Out(16),
            "busy":          Out(1),
            "occupancy":     Out(vb + 1),
            "stash_used":    Out(self.table.stash_used.shape()),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.table = t = self.table
        lk, res, cmd, resp = t.lookup, t.result, t.cmd, t.resp
        m.d.comb += [
            lk.valid.eq(self.lookup_valid),
            lk.payload.key.tenant.eq(self.lookup_tenant),
            lk.payload.key.qpn.eq(self.lookup_qpn),
            lk.payload.tag.eq(self.lookup_tag),
            self.result_valid.eq(res.valid),
            self.result_hit.eq(res.payload.hit),
            self.result_value.eq(res.payload.value),
            self.result_tag.eq(res.payload.tag),
            cmd.valid.eq(self.cmd_valid),
            self.cmd_ready.eq(cmd.ready),
            cmd.payload.op.eq(self.cmd_op),
            cmd.payload.key.tenant.eq(self.cmd_tenant),
            cmd.payload.key.qpn.eq(self.cmd_qpn),
            cmd.payload.value.eq(self.cmd_value),
            self.resp_valid.eq(resp.valid),
            self.resp_status.eq(resp.payload.status),
            self.resp_value.eq(resp.payload.value),
            self.resp_cycles.eq(resp.payload.cycles),
            self.busy.eq(t.busy),
            self.occupancy.eq(t.occupancy),
            self.stash_used.eq(t.stash_used),
        ]
        return m


def flowtable_top(capacity=4096):
    """``stellar_bench_flowtable``: :class:`FlowTableBench` at ``capacity`` slots."""
    return FlowTableBench(capacity)


# Block name (as the bench reports it) -> (Verilog module name, factory).
TOPS = {
    "parser": ("stellar_bench_parser", parser_top),
    "deparser": ("stellar_bench_deparser", deparser_top),
    "pktloop": (TOP_NAME, verilog_top),
}
