"""``RegisterQueues``: the ``wq`` register block (``stellar.hdl.regmap.wq_block``) in gateware,
feeding ``NicCore``'s work-request / receive-request streams and draining its completions, for
board tops whose host reaches the core only through the control bridge.

::

    csr wr_data0..17 --wr_push--> SyncFIFOBuffered(wr_depth) --> m_axis_wr  (NicCore.s_axis_wr)
    csr rr_data0..5  --rr_push--> SyncFIFOBuffered(rr_depth) --> m_axis_rr  (NicCore.s_axis_rr)
    csr cq_data0..5  <--head---  SyncFIFOBuffered(cq_depth) <-- s_axis_cq  (NicCore.m_axis_cq)
                         cq_pop removes the head

A push copies the data words (as last written: the bank holds them) into the FIFO in the clock
of its strobe; the words can be rewritten for the next request at once. A push into a full FIFO
or a pop of an empty one changes nothing and pulses ``push_full`` / ``pop_empty``. Completions
the FIFO cannot take wait on ``s_axis_cq`` (back-pressure into the core, which holds them).
``cq_data`` shows the head entry, zeros when ``cq_level`` is 0; a pop shows the next entry
2 clocks after the pop's write is accepted by the bank (bank 1, FIFO 1), well inside the time
a bridge needs for its next access.

Ports
-----
``csr``        Out(block_signature(wq_block())): joined to ``AxiLiteCsrBank.wq``.
``m_axis_wr``  Out(AxiStreamSignature(wr_bits)): one beat per work request, ``tlast`` 1.
``m_axis_rr``  Out(AxiStreamSignature(rr_bits)): one beat per receive request, ``tlast`` 1.
``s_axis_cq``  In(AxiStreamSignature(cq_bits)): completions, one beat each (``tkeep``/``tlast``
               ignored).

Parameters: ``wr_bits`` / ``rr_bits`` / ``cq_bits`` (stream widths, at most 32 x the data words
of the block), ``wr_depth`` / ``rr_depth`` / ``cq_depth`` (FIFO entries, 1..255).
"""

from amaranth.hdl import Cat, Module, Mux
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..axis import AxiStreamSignature
from ..csr import block_signature
from ..regmap import WQ_CQ_WORDS, WQ_RR_WORDS, WQ_WR_WORDS, wq_block, wq_config

__all__ = ["RegisterQueues"]


class RegisterQueues(wiring.Component):
    """The ``wq`` block's queues (see the module docstring)."""

    def __init__(self, *, wr_bits=576, rr_bits=192, cq_bits=192, wr_depth=4, rr_depth=4,
                 cq_depth=16):
        for name, bits, words in (("wr", wr_bits, WQ_WR_WORDS), ("rr", rr_bits, WQ_RR_WORDS),
                                  ("cq", cq_bits, WQ_CQ_WORDS)):
            if bits > 32 * words:
                raise ValueError(f"{name} entries of {bits} bits do not fit {words} registers")
        self.config = wq_config(wr_depth, rr_depth, cq_depth)   # checks the depths
        self.wr_bits, self.rr_bits, self.cq_bits = wr_bits, rr_bits, cq_bits
        self.wr_depth, self.rr_depth, self.cq_depth = wr_depth, rr_depth, cq_depth
        super().__init__({
            "csr":       Out(block_signature(wq_block())),
            "m_axis_wr": Out(AxiStreamSignature(wr_bits)),
            "m_axis_rr": Out(AxiStreamSignature(rr_bits)),
            "s_axis_cq": In(AxiStreamSignature(cq_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        csr = self.csr
        m.d.comb += csr.config.eq(self.config)

        full = []
        for name, bits, depth, words, axis in (
                ("wr", self.wr_bits, self.wr_depth, WQ_WR_WORDS, self.m_axis_wr),
                ("rr", self.rr_bits, self.rr_depth, WQ_RR_WORDS, self.m_axis_rr)):
            fifo = m.submodules[f"{name}_fifo"] = SyncFIFOBuffered(width=bits, depth=depth)
            push = getattr(csr, f"{name}_push_stb")
            data = Cat(*(getattr(csr, f"{name}_data{i}") for i in range(words)))
            m.d.comb += [
                fifo.w_data.eq(data[:bits]),
                fifo.w_en.eq(push),
                getattr(csr, f"{name}_pushed_inc").eq(push & fifo.w_rdy),
                getattr(csr, f"{name}_level").eq(fifo.level),
                axis.tvalid.eq(fifo.r_rdy),
                axis.tdata.eq(fifo.r_data),
                axis.tkeep.eq((1 << (bits // 8)) - 1),
                axis.tlast.eq(1),
                fifo.r_en.eq(axis.tready),
            ]
            full.append(push & ~fifo.w_rdy)
        m.d.comb += csr.push_full_inc.eq(full[0] | full[1])

        m.submodules.cq_fifo = cq = SyncFIFOBuffered(width=self.cq_bits, depth=self.cq_depth)
        head = Mux(cq.r_rdy, cq.r_data, 0)                       # zeros when empty
        m.d.comb += [
            cq.w_data.eq(self.s_axis_cq.tdata),
            cq.w_en.eq(self.s_axis_cq.tvalid),
            self.s_axis_cq.tready.eq(cq.w_rdy),
            cq.r_en.eq(csr.cq_pop_stb),
            csr.cq_popped_inc.eq(csr.cq_pop_stb & cq.r_rdy),
            csr.pop_empty_inc.eq(csr.cq_pop_stb & ~cq.r_rdy),
            csr.cq_level.eq(cq.level),
        ]
        for i in range(WQ_CQ_WORDS):
            m.d.comb += getattr(csr, f"cq_data{i}").eq(head[32 * i:32 * i + 32])
        return m
