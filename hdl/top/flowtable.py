"""``stellar_flowtable``: the flow table alone, with flat Verilog ports, for the Verilator tests.

The stream ports of :class:`stellar.hdl.flow.cuckoo.FlowTable` are flattened into plain signals
named after what they carry; the flow key ``(tenant, qpn)`` is split into its two fields so a
testbench never packs ``FLOW_KEY`` by hand:

    =====================  =====  ===================================================
    port                   dir    width
    =====================  =====  ===================================================
    clk, rst               in     1 (``sync`` domain, synchronous active-high reset)
    lookup_valid           in     1    one lookup per clock, no backpressure
    lookup_tenant          in     TENANT_BITS (8)
    lookup_qpn             in     QPN_BITS (24)
    lookup_tag             in     tag_bits (opaque, returned with the result)
    result_valid           out    1    ``FlowTable.LATENCY`` (4) cycles after lookup_valid
    result_hit             out    1
    result_value           out    value_bits = max(1, ceil(log2(capacity)))
    result_tag             out    tag_bits
    cmd_valid              in     1
    cmd_ready              out    1    high while no command executes (``~busy``)
    cmd_op                 in     2    ``FlowOp``
    cmd_tenant, cmd_qpn    in     8, 24
    cmd_value              in     value_bits
    resp_valid             out    1    one-cycle pulse when a command completes
    resp_status            out    2    ``FlowStatus``
    resp_value             out    value_bits
    resp_cycles            out    16   clocks from the cmd transfer to the pulse (saturating)
    busy                   out    1
    occupancy              out    value_bits + 1
    stash_used             out    bits of range(stash + 1)
    =====================  =====  ===================================================

``tag_bits`` is at least 1 here: a 0-bit Verilog port does not exist, and the testbench uses
the tag to match each result with its lookup.

``python -m stellar.hdl.top.flowtable --capacity 4096 -o build/verilog`` writes the Verilog.
"""

import argparse
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..flow.cuckoo import FlowTable
from ..flow.fields import QPN_BITS, TENANT_BITS

__all__ = ["FlowTableTop", "TOP_NAME", "convert", "verilog_top"]

TOP_NAME = "stellar_flowtable"


class FlowTableTop(wiring.Component):
    """:class:`FlowTable` with flat ports (table above).

    Parameters: ``capacity``, ``ways``, ``stash``, ``max_kicks``, ``seed`` are the flow table's;
    ``tag_bits`` (>= 1) is the width of ``lookup_tag``/``result_tag``.
    Attributes: ``table`` (the wrapped :class:`FlowTable`), ``LATENCY``, ``value_bits``.
    """

    def __init__(self, capacity=4096, *, ways=4, stash=4, tag_bits=8, max_kicks=128, seed=0):
        if tag_bits < 1:
            raise ValueError("tag_bits must be at least 1 at a Verilog top (a 0-bit port does not exist)")
        self.table = FlowTable(capacity, ways=ways, stash=stash, tag_bits=tag_bits,
                               max_kicks=max_kicks, seed=seed)
        self.LATENCY = self.table.LATENCY
        self.value_bits = vb = self.table.value_bits
        stash_shape = self.table.stash_used.shape()
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
            "stash_used":    Out(stash_shape),
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


def verilog_top(capacity=4096, ways=4, stash=4, tag_bits=8, max_kicks=128, seed=0):
    """The component exported as ``stellar_flowtable``."""
    return FlowTableTop(capacity, ways=ways, stash=stash, tag_bits=tag_bits, max_kicks=max_kicks,
                        seed=seed)


def convert(capacity=4096, **kw):
    """Verilog text of ``stellar_flowtable``."""
    return verilog.convert(verilog_top(capacity, **kw), name=TOP_NAME)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.top.flowtable",
                                 description="Write the stellar_flowtable Verilog top.")
    ap.add_argument("--capacity", type=int, default=4096, help="table slots (power of two, >= 16)")
    ap.add_argument("--ways", type=int, default=4)
    ap.add_argument("--stash", type=int, default=4)
    ap.add_argument("--tag-bits", type=int, default=8)
    ap.add_argument("--max-kicks", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0, help="hash seed")
    ap.add_argument("-o", "--output", default="build/verilog", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.output) / f"{TOP_NAME}_c{args.capacity}.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(convert(args.capacity, ways=args.ways, stash=args.stash, tag_bits=args.tag_bits,
                           max_kicks=args.max_kicks, seed=args.seed))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
