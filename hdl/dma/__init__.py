"""DMA engine: AXI4 master reads and writes of host memory for the RC transport.

``axi4``: the AXI4 bus signature (``m_axi`` at a Verilog top). ``engine``: ``DmaWriter``
(stream -> memory), ``DmaReader`` (memory -> stream), ``Dma`` (both on one master port).
"""

from .axi4 import Axi4Signature
from .engine import Dma, DmaReader, DmaWriter, cmd_layout, connect_axi, done_layout

__all__ = ["Axi4Signature", "Dma", "DmaReader", "DmaWriter", "cmd_layout", "connect_axi",
           "done_layout"]
