# Ref: ARM IHI 0022E (AMBA AXI4), ARM IHI 0051B (AXI4-Stream); stellar.hdl.hostif.formats
"""``stellar_hostq``: the queue engine with its DMA and the AXI4 arbiter, for the Verilator tests.

::

    s_axil --> CSR bank (hostq block) --> HostQueues --m_axis_wr / m_axis_rr--> (transport stand-in)
                                            |   ^  <--s_axis_cq, sq/rq_retire--
                                            |   +--> m_axis_msi
                                 queue Dma (ID 0.., WQE reads, CQE writes) --s0-+
                                                                                 Axi4Arbiter --> m_axi
    s_axis_pwcmd/pwdata, s_axis_prcmd --> payload Dma (the transport's) ------s1-+
                                      <-- m_axis_prdata, pwr_done

The payload ``Dma`` stands for the transport's (in ``NicCore`` it is the transport and the TX
builder that drive it): the testbench moves payload through it so that the arbiter carries both
masters' traffic and the CQE-after-payload ordering is observable in host memory.

Verilog ports (single-underscore AXI names), ``W`` = data width:

    ================================  ====  =================================================
    clk, rst                          in    ``sync`` domain, synchronous active-high reset
    m_axi_*                           --    AXI4 master, 64-bit address, W data, 4-bit ID
    s_axil_*                          --    AXI4-Lite CSR (the whole register map, 16-bit)
    m_axis_wr_*                       out   work requests, 576-bit beats (``WORK_REQUEST``)
    m_axis_rr_*                       out   receive requests, 192-bit beats (``RECV_REQUEST``)
    s_axis_cq_*                       in    completions, 192-bit beats (``COMPLETION``)
    sq_retire, sq_retire_qp           in    one SQ credit back for QP ``sq_retire_qp`` per
                                            clock with ``sq_retire`` high
    rq_retire, rq_retire_qp           in    likewise for the RQ
    m_axis_msi_*                      out   MSI requests, ``tdata`` = 16-bit vector
    s_axis_pwcmd_*, s_axis_prcmd_*    in    payload DMA write / read commands (80 bits:
                                            addr 63:0, len 79:64)
    s_axis_pwdata_*, m_axis_prdata_*  --    their data, lane-0 aligned
    pwr_done                          out   one pulse per completed payload write, in order
    ================================  ====  =================================================

``python -m stellar.hdl.top.hostq --width 64|512 -o build/verilog`` writes the Verilog.
"""

from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..axil import AxiLiteSignature, FlatPorts
from ..axis import AxiStreamSignature, axis_to_stream, stream_to_axis
from ..csr import AxiLiteCsrBank
from ..dma.axi4 import Axi4Signature
from ..dma.engine import Dma
from ..hostif.axi_arbiter import Axi4Arbiter
from ..hostif.queues import HostQueues, connect_queue_dma, queue_dma
from ..regmap import REGMAP
from .cli import verilog_main
from .dma import CmdAxisSignature
from .nic import CQ_BITS, RR_BITS, WR_BITS

__all__ = ["HostqTop", "TOP_NAME", "verilog_top", "convert"]

TOP_NAME = "stellar_hostq"


class HostqTop(wiring.Component):
    """``HostQueues`` + its ``Dma`` + a payload ``Dma`` behind an ``Axi4Arbiter`` (table above).

    Parameters: ``data_width``, ``qps``, ``cqs``, ``sq_depth``, ``rq_depth``, ``max_batch``
    (as for ``HostQueues``). Attributes: ``queues``, ``qdma``, ``pdma``, ``arbiter``.
    """

    def __init__(self, data_width=64, *, qps=8, cqs=4, sq_depth=8, rq_depth=8, max_batch=8):
        self.data_width = data_width
        self.queues = HostQueues(data_width, qps=qps, cqs=cqs, sq_depth=sq_depth,
                                 rq_depth=rq_depth, max_batch=max_batch, out_depth=max_batch)
        self.qdma = queue_dma(data_width, max_batch)
        self.pdma = Dma(data_width, id_width=3)
        self.arbiter = Axi4Arbiter(data_width=data_width, id_width=3)
        super().__init__({
            "m_axi":        Out(Axi4Signature(64, data_width, 4)),
            "s_axil":       In(AxiLiteSignature(16)),
            "m_axis_wr":    Out(AxiStreamSignature(WR_BITS)),
            "m_axis_rr":    Out(AxiStreamSignature(RR_BITS)),
            "s_axis_cq":    In(AxiStreamSignature(CQ_BITS)),
            "sq_retire":    In(1),
            "sq_retire_qp": In(16),
            "rq_retire":    In(1),
            "rq_retire_qp": In(16),
            "m_axis_msi":   Out(AxiStreamSignature(16)),
            "s_axis_pwcmd": In(CmdAxisSignature()),
            "s_axis_pwdata": In(AxiStreamSignature(data_width)),
            "pwr_done":     Out(1),
            "s_axis_prcmd": In(CmdAxisSignature()),
            "m_axis_prdata": Out(AxiStreamSignature(data_width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.queues = hq = self.queues
        m.submodules.qdma = qdma = self.qdma
        m.submodules.pdma = pdma = self.pdma
        m.submodules.arbiter = arb = self.arbiter
        m.submodules.csr = csr = AxiLiteCsrBank(REGMAP)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        wiring.connect(m, hq.csr, csr.hostq)

        # queue engine <-> its DMA
        connect_queue_dma(m, hq, qdma)

        # both DMAs -> arbiter -> host memory
        wiring.connect(m, qdma.m_axi, arb.s0)
        wiring.connect(m, pdma.m_axi, arb.s1)
        wiring.connect(m, arb.m, wiring.flipped(self.m_axi))

        # transport-side streams
        for axis, st in ((self.m_axis_wr, hq.wr), (self.m_axis_rr, hq.rr)):
            m.d.comb += [axis.tvalid.eq(st.valid), axis.tdata.eq(st.payload), axis.tlast.eq(1),
                         axis.tkeep.eq((1 << (len(axis.tdata) // 8)) - 1), st.ready.eq(axis.tready)]
        cq = self.s_axis_cq
        m.d.comb += [hq.cq.valid.eq(cq.tvalid),
                     hq.cq.payload.eq(cq.tdata[:len(hq.cq.payload.as_value())]),
                     cq.tready.eq(hq.cq.ready)]
        m.d.comb += [hq.sq_retire.valid.eq(self.sq_retire), hq.sq_retire.payload.qp.eq(self.sq_retire_qp),
                     hq.rq_retire.valid.eq(self.rq_retire), hq.rq_retire.payload.qp.eq(self.rq_retire_qp)]
        msi = self.m_axis_msi
        m.d.comb += [msi.tvalid.eq(hq.msi.valid), msi.tdata.eq(hq.msi.payload.vector),
                     msi.tlast.eq(1), msi.tkeep.eq(0b11), hq.msi.ready.eq(msi.tready)]

        # payload DMA (the transport's stand-in)
        for axis, cmd in ((self.s_axis_pwcmd, pdma.wr_cmd), (self.s_axis_prcmd, pdma.rd_cmd)):
            m.d.comb += [cmd.valid.eq(axis.tvalid), cmd.payload.eq(axis.tdata),
                         axis.tready.eq(cmd.ready)]
        m.d.comb += axis_to_stream(self.s_axis_pwdata, pdma.wr_data)
        m.d.comb += stream_to_axis(pdma.rd_data, self.m_axis_prdata)
        m.d.comb += self.pwr_done.eq(pdma.wr_done.valid)
        return m


def verilog_top(width=64, **kw):
    return FlatPorts(HostqTop(width, **kw))


def convert(width=64, **kw):
    return verilog.convert(verilog_top(width, **kw), name=TOP_NAME)


def main(argv=None):
    verilog_main(TOP_NAME, convert, argv, module="stellar.hdl.top.hostq")


if __name__ == "__main__":
    main()
