# Ref: ARM IHI 0051B "AMBA 4 AXI4-Stream Protocol Specification"
"""AXI4-Stream edge of the design and its adapters to ``amaranth.lib.stream`` beats.

Inside, Stellar moves ``stream.Signature(beat_layout(w))`` (``data``, ``keep``, ``last``); at a
Verilog top the same beats cross as AXI4-Stream (``tdata``, ``tkeep``, ``tlast``, ``tvalid``,
``tready``) so cocotbext-axi and vendor IP bind by prefix (``s_axis_rx_*``, ``m_axis_tx_*``).
"""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AxiStreamSignature", "axis_to_stream", "stream_to_axis"]


class AxiStreamSignature(wiring.Signature):
    """AXI4-Stream from the transmitter's side: ``tdata``, ``tkeep``, ``tlast``, ``tvalid`` out,
    ``tready`` in. Parameters: ``data_width`` in bits (a multiple of 8)."""

    def __init__(self, data_width):
        assert data_width % 8 == 0
        self.data_width = data_width
        super().__init__({
            "tdata": Out(data_width),
            "tkeep": Out(data_width // 8),
            "tlast": Out(1),
            "tvalid": Out(1),
            "tready": In(1),
        })

    def __eq__(self, other):
        return isinstance(other, AxiStreamSignature) and other.data_width == self.data_width

    def __hash__(self):
        return hash((AxiStreamSignature, self.data_width))

    def __repr__(self):
        return f"AxiStreamSignature({self.data_width})"


def axis_to_stream(axis, beats):
    """Statements driving the ``stream`` interface ``beats`` from the AXI4-Stream ``axis``."""
    return [
        beats.valid.eq(axis.tvalid),
        beats.payload.data.eq(axis.tdata),
        beats.payload.keep.eq(axis.tkeep),
        beats.payload.last.eq(axis.tlast),
        axis.tready.eq(beats.ready),
    ]


def stream_to_axis(beats, axis):
    """Statements driving the AXI4-Stream ``axis`` from the ``stream`` interface ``beats``."""
    return [
        axis.tvalid.eq(beats.valid),
        axis.tdata.eq(beats.payload.data),
        axis.tkeep.eq(beats.payload.keep),
        axis.tlast.eq(beats.payload.last),
        beats.ready.eq(axis.tready),
    ]
