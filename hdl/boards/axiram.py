# Ref: ARM IHI 0022E "AMBA AXI and ACE Protocol Specification", part A (AXI4): A3.4 (bursts),
#      A3.3 (channel dependencies), A3.4.4 (responses)
"""``Axi4Ram``: on-chip memory (block RAM) behind an AXI4 subordinate port, the "device memory"
a board top gives ``NicCore.m_axi`` in place of host memory.

Why hand-written: ``amaranth.lib`` has no AXI4 memory, and the repository's other AXI4 memory
(``stellar.sim.hostmem``) is a cocotb model.

The memory is ``size`` bytes at byte address ``base`` (both powers of two, ``base`` a multiple of
``size``), ``W``-bit words (``W`` = the bus data width), one ``amaranth.lib.memory.Memory`` with a
byte-granular write port and a synchronous read port (block RAM: EBR on ECP5).

Port
----
``s_axi``  In(Axi4Signature(addr_width, W, id_width)): the subordinate side.

Behaviour
---------
* Bursts INCR and FIXED, ``AxLEN`` 0..255, ``AxSIZE`` up to the bus width (a narrower beat is
  written through ``WSTRB``; the address advances by ``2**AxSIZE`` per INCR beat, words by the
  aligned address). WRAP is served as INCR (the DMA engine never issues it).
* An access whose first address is outside ``[base, base + size)`` is answered ``SLVERR``: reads
  return zeros, writes change nothing. A burst that starts inside wraps inside the memory
  (the DMA engine never crosses a 4 KiB boundary, and ``size`` is a multiple of 4 KiB or more).
* One write burst and one read burst are in progress at a time, independently; reads stream
  one beat per clock (``rvalid`` 1 clock after ``arvalid & arready``), writes take a beat per
  clock, and the B response is given 1 clock after ``wlast`` is taken. The next AW is accepted
  once the B response of the previous burst has been taken.
* ``awlock``/``arlock``, ``*cache`` and ``*prot`` are ignored. IDs are returned as received.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from ..axil import Resp
from ..dma.axi4 import Axi4Signature, Burst

__all__ = ["Axi4Ram"]


class Axi4Ram(wiring.Component):
    """AXI4 subordinate over block RAM (see the module docstring).

    Parameters: ``size`` (bytes, power of two, at least one bus word), ``base`` (byte address,
    multiple of ``size``, default 0), ``data_width`` (default 64), ``addr_width`` (default 64),
    ``id_width`` (default 4), ``init`` (optional initial words).
    """

    def __init__(self, size, *, base=0, data_width=64, addr_width=64, id_width=4, init=()):
        word_bytes = data_width // 8
        if size < word_bytes or size & (size - 1):
            raise ValueError(f"memory size {size} must be a power of two of at least {word_bytes} bytes")
        if base % size:
            raise ValueError(f"memory base {base:#x} is not a multiple of its size {size:#x}")
        if base + size > 1 << addr_width:
            raise ValueError(f"memory [{base:#x}, {base + size:#x}) is beyond a {addr_width}-bit address")
        self.size = size
        self.base = base
        self.data_width = data_width
        self._init = init
        super().__init__({"s_axi": In(Axi4Signature(addr_width, data_width, id_width))})

    def elaborate(self, platform):
        m = Module()
        bus = self.s_axi
        W = self.data_width
        word_bytes = W // 8
        depth = self.size // word_bytes
        offset_bits = (word_bytes - 1).bit_length()          # byte address bits inside a word
        size_bits = (self.size - 1).bit_length()

        m.submodules.mem = mem = Memory(shape=W, depth=depth, init=self._init)
        wr = mem.write_port(granularity=8)
        rd = mem.read_port()

        def inside(addr):
            return addr[size_bits:] == self.base >> size_bits

        def step(addr, size, burst):
            # INCR (and WRAP, served as INCR) advance by the beat size; FIXED stays.
            return Mux(burst == Burst.FIXED, addr, (addr + (1 << size))[:len(addr)])

        # --- write: AW -> W beats -> B ----------------------------------------------------
        w_active = Signal()
        w_addr = Signal(size_bits)          # byte address inside the memory
        w_size = Signal(3)
        w_burst = Signal(2)
        w_ok = Signal()
        m.d.comb += [
            bus.awready.eq(~w_active & ~bus.bvalid),
            bus.wready.eq(w_active),
            wr.addr.eq(w_addr[offset_bits:]),
            wr.data.eq(bus.wdata),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [
                w_active.eq(1), w_addr.eq(bus.awaddr[:size_bits]), w_size.eq(bus.awsize),
                w_burst.eq(bus.awburst), w_ok.eq(inside(bus.awaddr)), bus.bid.eq(bus.awid),
            ]
        with m.If(bus.wvalid & bus.wready):
            m.d.comb += wr.en.eq(Mux(w_ok, bus.wstrb, 0))
            m.d.sync += w_addr.eq(step(w_addr, w_size, w_burst))
            with m.If(bus.wlast):
                m.d.sync += [w_active.eq(0), bus.bvalid.eq(1),
                             bus.bresp.eq(Mux(w_ok, Resp.OKAY, Resp.SLVERR))]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)

        # --- read: AR -> R beats, one per clock ----------------------------------------------
        # The read port only advances when its word is taken (or none is shown), so rdata holds
        # under back-pressure without a skid buffer.
        r_active = Signal()
        r_addr = Signal(size_bits)
        r_size = Signal(3)
        r_burst = Signal(2)
        r_left = Signal(8)                  # beats still to issue after this one
        r_ok = Signal()
        r_id = Signal(len(bus.arid))        # kept apart from rid: the last beat may still show
        issue = Signal()
        m.d.comb += [
            bus.arready.eq(~r_active),
            issue.eq(r_active & (~bus.rvalid | bus.rready)),
            rd.addr.eq(r_addr[offset_bits:]),
            rd.en.eq(issue),
        ]
        r_shown_ok = Signal()
        m.d.comb += bus.rdata.eq(Mux(r_shown_ok, rd.data, 0))
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [
                r_active.eq(1), r_addr.eq(bus.araddr[:size_bits]), r_size.eq(bus.arsize),
                r_burst.eq(bus.arburst), r_left.eq(bus.arlen), r_ok.eq(inside(bus.araddr)),
                r_id.eq(bus.arid),
            ]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(issue):
            m.d.sync += [
                bus.rvalid.eq(1), bus.rlast.eq(r_left == 0), r_shown_ok.eq(r_ok), bus.rid.eq(r_id),
                bus.rresp.eq(Mux(r_ok, Resp.OKAY, Resp.SLVERR)),
                r_addr.eq(step(r_addr, r_size, r_burst)), r_left.eq(r_left - 1),
            ]
            with m.If(r_left == 0):
                m.d.sync += r_active.eq(0)
        return m
