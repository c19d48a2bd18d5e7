# Ref: IBTA Vol 1 Annex A17 (RoCEv2); IBTA Vol 1 ch. 9.7 (RC transport)
r"""``stellar_nic``: one complete RoCEv2 RC NIC core, and ``stellar_nic2``: two of them, for
simulations where NIC A and NIC B talk through a network model.

::

    s_axis_rx -> RxFlowPipeline --o_meta/o--> RcTransport --tx--> TxBuilder -> Deparser -> m_axis_tx
                 (parser, ICRC,    <---wb---   |  ^  |             |  ^  ^
                  tenants, flow,               |  |  +-- dma write  |  |  +-- CNPs
                  MR check, QP ctx)            |  |        \\        /  |
                                  s_axis_wr ---+  |         Dma (AXI4 master) --> m_axi (host memory)
                                  s_axis_rr ---+  +--> m_axis_cq
                 rx_meta tap, ctx writes, packets sent, QPs with work
                       --> CongestionControl --> next QP to send, CNPs, class markings
    s_axil -> CSR bank (ident, pktengine, flow, qpctx, mr, transport, cc)

Ports (single-underscore AXI names, DESIGN.md): ``clk``, ``rst``; ``s_axis_rx_*`` / ``m_axis_tx_*``
(Ethernet frames without FCS, ``W``-bit); ``m_axi_*`` (AXI4 master, 64-bit addresses, ``W``-bit
data, the host memory); ``s_axil_*`` (AXI4-Lite CSR, 16-bit addresses); ``s_axis_wr_*``
(work requests, one 576-bit beat each: ``stellar.hdl.transport.formats.WORK_REQUEST``),
``s_axis_rr_*`` (receive requests, 192-bit beats: ``RECV_REQUEST``), ``m_axis_cq_*``
(completions, 192-bit beats: ``COMPLETION``). ``stellar_nic2`` has the same ports twice, prefixed
``a_`` and ``b_``.

The receive and transmit beats pass a register slice (``SkidBuffer``) at the core's ports, and
the builder's payload one on its way to the deparser (a clock of latency each); so do the
transport's QP state changes and MR invalidations on their way to the pipeline.

The work-request, receive-request and completion streams stand for the host queues until the
host interface (DMA-fetched rings, doorbells) exists; tests drive them directly.

``python -m stellar.hdl.top.nic --width 64|512 --qps N [--two] -o build/verilog`` writes the
Verilog.
"""

import argparse
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..axil import AxiLiteSignature, FlatPorts
from ..axis import AxiStreamSignature, axis_to_stream, stream_to_axis
from ..cc.block import CongestionControl
from ..csr import AxiLiteCsrBank
from ..dma.axi4 import Axi4Signature
from ..dma.engine import Dma
from ..flow.rxflow import CORE_RECORD_FIELDS, CORE_WB_FIELDS, RxFlowPipeline
from ..hostif.axi_arbiter import Axi4Arbiter
from ..hostif.queues import HostQueues, connect_queue_dma, queue_dma
from ..net.deparser import Deparser
from ..net.layout import beat_layout
from ..regmap import REGMAP
from ..skid import SkidBuffer
from ..transport.engine import RcTransport
from ..transport.formats import CNP_OPCODE, COMPLETION, RECV_REQUEST, WORK_REQUEST
from ..transport.txbuild import PayloadSrc, TxBuilder, tx_desc_layout

__all__ = ["NicCore", "NicPair", "TOP_NAME", "PAIR_NAME", "WR_BITS", "RR_BITS", "CQ_BITS",
           "verilog_top", "convert"]

TOP_NAME = "stellar_nic"
PAIR_NAME = "stellar_nic2"


def _bytes_bits(width):
    return -(-width // 64) * 64


WR_BITS = _bytes_bits(WORK_REQUEST.width)      # 576
RR_BITS = _bytes_bits(RECV_REQUEST.width)      # 192
CQ_BITS = _bytes_bits(COMPLETION.width)        # 192


def nic_signature(data_width, host_queues=False):
    members = {
        "s_axis_rx": In(AxiStreamSignature(data_width)),
        "m_axis_tx": Out(AxiStreamSignature(data_width)),
        "m_axi":     Out(Axi4Signature(64, data_width, 4)),
        "s_axil":    In(AxiLiteSignature(16)),
    }
    if host_queues:
        members["msi"] = Out(stream.Signature(data.StructLayout({"vector": 16})))
    else:
        members.update({
            "s_axis_wr": In(AxiStreamSignature(WR_BITS)),
            "s_axis_rr": In(AxiStreamSignature(RR_BITS)),
            "m_axis_cq": Out(AxiStreamSignature(CQ_BITS)),
        })
    return members


class NicCore(wiring.Component):
    """One NIC core (see the module docstring).

    Parameters: ``data_width`` (64 or 512), ``qps`` (QP indexes: flow-table capacity, contexts,
    transport state), ``sq_depth`` / ``rq_depth`` (work requests per QP), ``mr_entries``,
    ``mr_pages``; ``host_queues``: False -- the transport's work-request, receive-request and
    completion streams are ports (``s_axis_wr``, ``s_axis_rr``, ``m_axis_cq``: transport-level
    testbenches drive them); True -- the queue engine (``HostQueues``, one CQ per QP index)
    serves them from rings in host memory through ``m_axi`` (its DMA and the payload DMA share
    the port through ``Axi4Arbiter``: AXI IDs 0-7 the queue engine's, 8-15 the payload's) and
    raises ``msi`` (the vector of the CQ's configuration).
    """

    def __init__(self, data_width=64, *, qps=16, sq_depth=16, rq_depth=16, mr_entries=64,
                 mr_pages=64, host_queues=False, max_batch=8):
        self.data_width = data_width
        self.qps = qps
        self.sq_depth = sq_depth
        self.rq_depth = rq_depth
        self.mr_entries = mr_entries
        self.mr_pages = mr_pages
        self.host_queues = host_queues
        self.max_batch = max_batch
        super().__init__(nic_signature(data_width, host_queues))

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        m.submodules.pipe = pipe = RxFlowPipeline(W, qps=self.qps, mr_entries=self.mr_entries,
                                                  mr_pages=self.mr_pages, pass_mr_failures=True,
                                                  record_fields=CORE_RECORD_FIELDS,
                                                  wb_fields=CORE_WB_FIELDS)
        m.submodules.transport = tp = RcTransport(W, qps=self.qps, sq_depth=self.sq_depth,
                                                  rq_depth=self.rq_depth)
        m.submodules.builder = tb = TxBuilder(W, tp.index_bits)
        m.submodules.cc = cc = CongestionControl(W, qps=self.qps)
        m.submodules.deparser = dep = Deparser(W)
        m.submodules.dma = dma = Dma(W, id_width=3 if self.host_queues else 4)
        m.submodules.csr = csr = AxiLiteCsrBank(REGMAP)

        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        for block in ("pktengine", "flow", "qpctx", "mr"):
            wiring.connect(m, getattr(pipe, block), getattr(csr, block))
        wiring.connect(m, tp.csr, csr.transport)
        wiring.connect(m, cc.csr, csr.cc)

        # Register slices where a stream enters and leaves the core and between the builder's
        # payload multiplexer and the deparser: the far ends (the MAC's FIFOs, the DMA's read
        # data) and the near ones then meet only through flip-flops on both sides, so the
        # handshakes that enable whole pipeline stages (the deparser's emit stage, the parser's
        # input) start at a register next to them, not at the far block's decision.
        m.submodules.rx_reg = rx_reg = SkidBuffer(beat_layout(W))
        m.submodules.tx_reg = tx_reg = SkidBuffer(beat_layout(W))
        m.submodules.payload_reg = payload_reg = SkidBuffer(beat_layout(W))
        # Between the receive pipeline's payload gate and the transport: the transport's ready
        # (from the DMA writer's state) no longer runs into the receive buffer's block RAM read
        # enable (13.4 ns routed on the ECPIX-5 core, 2026-12-07).
        # Two of them in a row: the pipeline and the transport sit far apart on the die, and with
        # one slice the placer put it by the transport, 83 tiles from the receive buffer's
        # read enable that its ready drives (10.2 ns routed at 41d0b9a); with two, one can sit
        # by each block.
        m.submodules.rx_payload_reg = rx_payload_reg = SkidBuffer(beat_layout(W))
        m.submodules.rx_payload_out = rx_payload_out = SkidBuffer(beat_layout(W))

        # receive: wire -> pipeline -> transport
        m.d.comb += axis_to_stream(self.s_axis_rx, rx_reg.i)
        wiring.connect(m, rx_reg.o, pipe.i)
        wiring.connect(m, pipe.o_meta, tp.rx_meta)
        wiring.connect(m, pipe.o, rx_payload_out.i)
        wiring.connect(m, rx_payload_out.o, rx_payload_reg.i)
        wiring.connect(m, rx_payload_reg.o, tp.rx)
        wiring.connect(m, tp.wb, pipe.wb)
        m.d.comb += [tp.ctx_written.valid.eq(pipe.ctx_written.valid),
                     tp.ctx_written.payload.eq(pipe.ctx_written.payload),
                     cc.ctx_written.valid.eq(pipe.ctx_written.valid),
                     cc.ctx_written.payload.eq(pipe.ctx_written.payload)]
        # The transport's state changes and MR invalidations reach the pipeline's host ports
        # (the QP context store's and the MR table's) through a register slice each: the store
        # takes a host operation with one load enable on ~500 flip-flops, which then starts at
        # a register next to them rather than at the transport's error queue.
        m.submodules.set_state_reg = set_state_reg = SkidBuffer(tp.set_state.payload.shape())
        m.submodules.mr_inv_reg = mr_inv_reg = SkidBuffer(tp.mr_invalidate.payload.shape())
        wiring.connect(m, tp.set_state, set_state_reg.i)
        wiring.connect(m, set_state_reg.o, pipe.set_state)
        wiring.connect(m, tp.mr_invalidate, mr_inv_reg.i)
        wiring.connect(m, mr_inv_reg.o, pipe.mr_invalidate)
        m.d.comb += pipe.dropped.ready.eq(1)     # dropped frames are counted by the pipeline

        # congestion control: taps of what the transport takes and sends; it schedules the QPs
        m.d.comb += [cc.rx_tap.valid.eq(pipe.o_meta.valid & tp.rx_meta.ready),
                     cc.rx_tap.payload.eq(pipe.o_meta.payload)]
        wiring.connect(m, tp.sent, cc.sent)
        wiring.connect(m, tp.sched_push, cc.sched_push)
        wiring.connect(m, cc.sched_pop, tp.sched_pop)
        m.d.comb += [tb.tc_mark.eq(cc.tc_mark), tb.cnp_mark.eq(cc.cnp_mark)]

        # transmit: transport and CNPs -> builder -> deparser -> wire. A CNP is one header-only
        # descriptor; it goes first (descriptors are whole packets, any interleaving is valid).
        cnp_desc = Signal(tx_desc_layout(tp.index_bits))
        m.d.comb += [cnp_desc.qp.eq(cc.cnp.payload.qp), cnp_desc.opcode.eq(CNP_OPCODE),
                     cnp_desc.src.eq(PayloadSrc.NONE)]
        with m.If(cc.cnp.valid):
            m.d.comb += [tb.desc.valid.eq(1), tb.desc.payload.eq(cnp_desc),
                         cc.cnp.ready.eq(tb.desc.ready)]
        with m.Else():
            m.d.comb += [tb.desc.valid.eq(tp.tx.valid), tb.desc.payload.eq(tp.tx.payload),
                         tp.tx.ready.eq(tb.desc.ready)]
        m.d.comb += [tp.txc_addr.eq(tb.ctx_addr), tp.txc_en.eq(tb.ctx_en),
                     tb.ctx_data.eq(tp.txc_data), tb.gid.eq(tp.gid)]
        wiring.connect(m, tb.o_meta, dep.i_meta)
        wiring.connect(m, tb.o, payload_reg.i)
        wiring.connect(m, payload_reg.o, dep.i)
        wiring.connect(m, dep.o, tx_reg.i)
        m.d.comb += stream_to_axis(tx_reg.o, self.m_axis_tx)
        m.d.comb += pipe.tx_frame.eq(self.m_axis_tx.tvalid & self.m_axis_tx.tready
                                     & self.m_axis_tx.tlast)

        # host memory
        wiring.connect(m, tb.dma_cmd, dma.rd_cmd)
        wiring.connect(m, dma.rd_data, tb.dma_data)
        wiring.connect(m, tp.dma_wcmd, dma.wr_cmd)
        # A register slice on the received payload's way to the DMA writer: the writer's ready
        # (from its beat count) no longer runs through the transport's mover into its queue's
        # read (10.1 ns routed on the ECPIX-5 core at d76ba5e).
        m.submodules.wdata_reg = wdata_reg = SkidBuffer(beat_layout(W))
        wiring.connect(m, tp.dma_wdata, wdata_reg.i)
        wiring.connect(m, wdata_reg.o, dma.wr_data)
        m.d.comb += tp.dma_wdone.eq(dma.wr_done.valid)
        # Work and receive requests reach the transport through a one-entry register slice
        # each: the event machine takes a request in its deciding clock, and that take ran into
        # the producer's queue, its read enable and its ~500 output flip-flops' load enable
        # (9.8 ns routed on the ECPIX-5 core at 41d0b9a). One entry takes a request every other
        # clock; the machine takes at most one per event (6 clocks or more).
        wr_in = self._request_slice(m, "wr_reg", tp.wr)
        rr_in = self._request_slice(m, "rr_reg", tp.rr)
        if self.host_queues:
            self._host_queues(m, tp, dma, csr, wr_in, rr_in)
            return m
        wiring.connect(m, dma.m_axi, wiring.flipped(self.m_axi))

        # the transport's queues as ports (transport-level testbenches)
        for axis, st in ((self.s_axis_wr, wr_in), (self.s_axis_rr, rr_in)):
            m.d.comb += [st.valid.eq(axis.tvalid), st.payload.eq(axis.tdata[:len(st.payload.as_value())]),
                         axis.tready.eq(st.ready)]
        cq = self.m_axis_cq
        m.d.comb += [cq.tvalid.eq(tp.cq.valid), cq.tdata.eq(tp.cq.payload), cq.tlast.eq(1),
                     cq.tkeep.eq((1 << (CQ_BITS // 8)) - 1), tp.cq.ready.eq(cq.tready)]
        return m

    @staticmethod
    def _request_slice(m, name, sink):
        """A one-entry register slice (``SyncFIFOBuffered`` of depth 1: ready, valid and the
        payload from flip-flops) in front of the stream ``sink``; returns its input stream."""
        shape = sink.payload.shape()
        m.submodules[name] = reg = SyncFIFOBuffered(width=data.Layout.cast(shape).size, depth=1)
        src = stream.Signature(shape).flip().create(path=(name, "i"))
        m.d.comb += [reg.w_en.eq(src.valid), reg.w_data.eq(src.payload), src.ready.eq(reg.w_rdy),
                     sink.valid.eq(reg.r_rdy), sink.payload.eq(reg.r_data), reg.r_en.eq(sink.ready)]
        return src

    def _host_queues(self, m, tp, dma, csr, wr_in, rr_in):
        """The queue engine between the rings in host memory and the transport (its work and
        receive requests through the slices ``wr_in`` and ``rr_in``)."""
        W = self.data_width
        m.submodules.hostq = hq = HostQueues(W, qps=self.qps, cqs=self.qps, sq_depth=self.sq_depth,
                                             rq_depth=self.rq_depth, max_batch=self.max_batch,
                                             out_depth=self.max_batch)
        m.submodules.qdma = qdma = queue_dma(W, self.max_batch)
        m.submodules.arbiter = arb = Axi4Arbiter(data_width=W, id_width=3)
        wiring.connect(m, hq.csr, csr.hostq)
        wiring.connect(m, hq.wr, wr_in)
        wiring.connect(m, hq.rr, rr_in)
        wiring.connect(m, tp.cq, hq.cq)
        wiring.connect(m, tp.sq_retire, hq.sq_retire)
        wiring.connect(m, tp.rq_retire, hq.rq_retire)
        wiring.connect(m, hq.msi, wiring.flipped(self.msi))
        connect_queue_dma(m, hq, qdma)
        wiring.connect(m, qdma.m_axi, arb.s0)
        wiring.connect(m, dma.m_axi, arb.s1)
        wiring.connect(m, arb.m, wiring.flipped(self.m_axi))


class NicPair(wiring.Component):
    """Two ``NicCore``s with their ports prefixed ``a_`` and ``b_`` (nothing joins them: the
    network between them is the testbench's switch model)."""

    def __init__(self, data_width=64, **kw):
        self.data_width = data_width
        self.a = NicCore(data_width, **kw)
        self.b = NicCore(data_width, **kw)
        members = {}
        for side in ("a", "b"):
            for name, member in nic_signature(data_width).items():
                members[f"{side}_{name}"] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.a = self.a
        m.submodules.b = self.b
        for side, core in (("a", self.a), ("b", self.b)):
            for name, member in core.signature.members.items():
                outer = getattr(self, f"{side}_{name}")
                inner = getattr(core, name)
                if member.flow == In:
                    wiring.connect(m, wiring.flipped(outer), inner)
                else:
                    wiring.connect(m, inner, wiring.flipped(outer))
        return m


def verilog_top(width=64, *, two=False, **kw):
    return FlatPorts((NicPair if two else NicCore)(width, **kw))


def convert(width=64, *, two=False, **kw):
    return verilog.convert(verilog_top(width, two=two, **kw), name=PAIR_NAME if two else TOP_NAME)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.top.nic",
                                 description="Write the stellar_nic (or stellar_nic2) Verilog top.")
    ap.add_argument("--width", type=int, default=64, choices=(64, 512), help="data width in bits")
    ap.add_argument("--qps", type=int, default=16, help="QP indexes")
    ap.add_argument("--two", action="store_true", help="two cores (stellar_nic2)")
    ap.add_argument("-o", "--output", default="build/verilog", help="output folder")
    args = ap.parse_args(argv)
    name = PAIR_NAME if args.two else TOP_NAME
    out = Path(args.output) / f"{name}_w{args.width}_q{args.qps}.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(convert(args.width, two=args.two, qps=args.qps))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
