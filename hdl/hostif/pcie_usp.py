# Ref: Xilinx PG213 "UltraScale+ Devices Integrated Block for PCI Express" (v1.3): ch. 3
#      "Designing with the Core": completer request (CQ) and completer completion (CC)
#      descriptors, requester request (RQ) and requester completion (RC) descriptors, the
#      64-bit DWORD-aligned AXI4-Stream mode, MSI through cfg_interrupt_msi_*;
#      PCI Express Base Specification 3.0 section 2.2.9 (completion byte count and lower
#      address) and 2.3.1.1 (read completion boundary); ARM IHI 0022E (AXI4) A3.4, A5.3.
"""The PCIe adapter: the core behind the UltraScale+ PCIe hard block.

::

    s_axis_cq --> Completer (MMIO: one AXI4-Lite access per DWORD) --> m_axil (CSR bank)
    m_axis_cc <--    "      (completions for reads)
    s_axi (AW/W) --> WriteRequester (store and forward per burst, split at MPS) --+
    s_axi (AR)   --> ReadRequester  (split at MRRS / slot size, one tag each)   --+--> RqArbiter --> m_axis_rq
    s_axi (R)    <-- ReadRequester  (tag-indexed reorder buffer, in-order R) <-- s_axis_rc
    s_axi (B)    <-- WriteRequester (when the burst's last TLP went to RQ)
    msi (vector) --> MsiSender --> cfg_interrupt_msi_int, waits for _sent / _fail

Port names are the user logic's, as in Corundum's ``pcie_us_*`` modules and example designs,
so cocotbext-pcie's ``UltraScalePlusPcieDevice`` binds them by prefix at a Verilog top.

Interface width
---------------
``data_width`` is a parameter, but only 64 is built: the NIC core's DMA port is 64 bits wide
at 64-bit datapath, the 64-bit PCIe interface carries a whole AXI beat per clock (16 Gb/s at
250 MHz, Gen3 x2 or Gen2 x4), and it needs no width converter. 256 / 512 would need a beat
gearbox on four streams plus straddle handling on RC; they raise ``ValueError`` for now.
The stream layout used is DWORD-aligned, no straddling, no parity (PG213 defaults).

Completer (MMIO, BAR0)
----------------------
BAR0 maps the 16-bit CSR space (make BAR0 64 KiB; the offset is the request's address bits
15:0). Each DWORD of a memory request becomes one AXI4-Lite access, in order:

* memory writes (any length) to BAR0: one write per DWORD with ``wstrb`` = the first / last
  byte enables (middle DWORDs 0xF); DWORDs whose enables are all 0 are skipped. Posted, so a
  write the CSR bank refuses (SLVERR) is dropped silently.
* memory reads of 1 or 2 DWORDs from BAR0: one read per DWORD, then one completion with
  status SC and the data, or with status CA (completer abort, no data) if the CSR bank
  answered SLVERR or DECERR to any of them (unmapped register). Read requests of more than
  2 DWORDs (a CPU never issues them to uncached MMIO) are answered UR.
* other non-posted requests (I/O, atomics, locked reads) and reads of BARs other than 0 are
  answered UR (unsupported request, no data); other posted requests are dropped.

``pcie_cq_np_req`` is held at 1: the adapter processes requests in arrival order and never
blocks for long (an AXI4-Lite access), so it never needs to hold back non-posted requests.

Requester writes (AXI4 AW/W -> memory write TLPs)
-------------------------------------------------
A burst is stored whole (data FIFO of ``wr_buffer`` beats, at least one 256-beat burst) before
its first TLP leaves, because the TLP length is in the first descriptor beat and only the last
W beat's strobes say where the burst ends. The burst then goes out as memory writes cut at
multiples of the max payload size (``cfg_max_payload``; AXI bursts never cross 4 KiB, so no TLP
does), with first / last DWORD byte enables from the start address and the last beat's
strobes. Strobes must be contiguous from the start address to the last strobed byte (as the
DMA engine issues them): the adapter writes every byte in between.
**B is returned when the burst's last TLP has been handed to the RQ interface** (accepted by
``m_axis_rq_tready``): a posted write needs no completion, and PCIe ordering keeps a later
read of the same address (a TLP issued after it on the same RQ interface) behind it, which is
all the DMA engine relies on. It is not a guarantee that the data reached host memory.

Requester reads (AXI4 AR -> memory read TLPs, RC -> R)
------------------------------------------------------
A burst is read as the 8-byte-aligned range of its beats (``araddr & ~7`` for ``arlen + 1``
beats): reads of host memory have no side effects, and every completion then starts on an
8-byte boundary. The range is cut into requests at multiples of ``min(max read request size,
slot)`` (``slot`` = ``slot_bytes``, 512 by default), each with its own tag from ``tags``
(16 by default; tags ``0..tags-1``), so ``tags`` requests may be in flight. Completions, cut
anywhere on the completer's read completion boundary and returned in any order across tags,
are written into the tag's slot of a ``tags x slot_bytes`` buffer at the offset their lower
address gives. Tags are allocated round robin and freed in allocation order: the R channel
waits for the oldest request's "request completed" completion, streams its slot out and frees
its tag. R therefore returns bursts in AR order (whatever their IDs: stricter than AXI's
per-ID order, which is what the DMA engine, ID 0 only, needs).
A completion with an error (status not SC, poisoned, or a non-zero PG213 error code such as
completion timeout) marks the request; its bursts' beats come back with RRESP = SLVERR. A
completion whose tag is outside ``0..tags-1`` or that starts on an odd DWORD is dropped.

MSI
---
``msi`` takes vector numbers, one at a time: the vector (modulo the number of vectors the
host enabled, ``cfg_interrupt_msi_mmenable``) is pulsed on ``cfg_interrupt_msi_int`` for one
clock, then the sender waits for ``cfg_interrupt_msi_sent`` or ``_fail`` before it accepts the
next. Vectors arriving while MSI is disabled (``cfg_interrupt_msi_enable[0]`` low) are
dropped: the driver finds completions by polling memory; the interrupt is only a wake-up.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..axil import AxiLiteSignature, Resp
from ..dma.axi4 import Axi4Signature

__all__ = ["UspAxisSignature", "PcieUsp", "Completer", "WriteRequester", "ReadRequester",
           "RqArbiter", "MsiSender", "USER_WIDTHS", "ReqType", "CplStatus", "usp_members"]

# tuser widths of the 64/128/256-bit interfaces (PG213 tables 2-x; Corundum's USP widths).
USER_WIDTHS = {"cq": 88, "cc": 33, "rq": 62, "rc": 75}


def usp_members():
    """The ports facing the hard block (named from the user logic's side, as Corundum's), for
    the adapter and for the Verilog tops that pass them through."""
    return {
        "s_axis_cq":                  In(UspAxisSignature(64, USER_WIDTHS["cq"])),
        "m_axis_cc":                  Out(UspAxisSignature(64, USER_WIDTHS["cc"])),
        "m_axis_rq":                  Out(UspAxisSignature(64, USER_WIDTHS["rq"])),
        "s_axis_rc":                  In(UspAxisSignature(64, USER_WIDTHS["rc"])),
        "cfg_max_payload":            In(3),
        "cfg_max_read_req":           In(3),
        "cfg_interrupt_msi_enable":   In(4),
        "cfg_interrupt_msi_mmenable": In(12),
        "cfg_interrupt_msi_int":      Out(32),
        "cfg_interrupt_msi_sent":     In(1),
        "cfg_interrupt_msi_fail":     In(1),
        "pcie_cq_np_req":             Out(2),
    }


class ReqType:
    """PG213 request type field (CQ / RQ descriptor DW2 bits 14:11)."""
    MEM_READ = 0
    MEM_WRITE = 1
    IO_READ = 2
    IO_WRITE = 3
    MEM_READ_LOCKED = 7


class CplStatus:
    """Completion status (PCIe base spec table 2-34)."""
    SC = 0
    UR = 1
    CA = 4


class UspAxisSignature(wiring.Signature):
    """One of the four PG213 AXI4-Stream interfaces, from the transmitter's side: ``tdata``,
    ``tkeep`` (one bit per DWORD), ``tlast``, ``tuser``, ``tvalid`` out; ``tready`` in."""

    def __init__(self, data_width, user_width):
        self.data_width, self.user_width = data_width, user_width
        super().__init__({
            "tdata":  Out(data_width),
            "tkeep":  Out(data_width // 32),
            "tlast":  Out(1),
            "tuser":  Out(user_width),
            "tvalid": Out(1),
            "tready": In(1),
        })

    def __eq__(self, other):
        return (isinstance(other, UspAxisSignature) and other.data_width == self.data_width
                and other.user_width == self.user_width)

    def __hash__(self):
        return hash((UspAxisSignature, self.data_width, self.user_width))


def rq_beat_layout():
    """An RQ beat inside the adapter (64-bit interface): first/last byte enables travel in
    ``user`` on every beat (PG213 samples them on the first)."""
    return data.StructLayout({"data": 64, "keep": 2, "last": 1, "first_be": 4, "last_be": 4})


def _lowest(be):
    """Index of the lowest set bit of a 4-bit byte enable (0 when none)."""
    return Mux(be[0], 0, Mux(be[1], 1, Mux(be[2], 2, Mux(be[3], 3, 0))))


def _highest(be):
    """Index of the highest set bit of a 4-bit byte enable (0 when none)."""
    return Mux(be[3], 3, Mux(be[2], 2, Mux(be[1], 1, 0)))


def _highest8(strb):
    """Index of the highest set bit of an 8-bit strobe (7 when none: a beat without strobes at
    the end of a burst is taken as full, see the module docstring)."""
    out = Const(7, 3)
    for i in range(8):          # later (higher) bits win
        out = Mux(strb[i], Const(i, 3), out)
    return Mux(strb == 0, Const(7, 3), out)


class Completer(wiring.Component):
    """CQ -> AXI4-Lite -> CC: MMIO to the CSR bank (see the module docstring).

    Ports: ``s_axis_cq`` (In ``UspAxisSignature(64, 88)``), ``m_axis_cc`` (Out
    ``UspAxisSignature(64, 33)``), ``m_axil`` (Out ``AxiLiteSignature(16)``).
    """

    MAX_READ_DW = 2

    def __init__(self):
        super().__init__({
            "s_axis_cq": In(UspAxisSignature(64, USER_WIDTHS["cq"])),
            "m_axis_cc": Out(UspAxisSignature(64, USER_WIDTHS["cc"])),
            "m_axil":    Out(AxiLiteSignature(16)),
        })

    def elaborate(self, platform):
        m = Module()
        cq, cc, axil = self.s_axis_cq, self.m_axis_cc, self.m_axil

        addr = Signal(64)
        first_be, last_be = Signal(4), Signal(4)
        dw_count = Signal(11)
        req_type = Signal(4)
        req_id = Signal(16)
        tag = Signal(8)
        func = Signal(8)
        tc, attr = Signal(3), Signal(3)
        status = Signal(3)
        idx = Signal(11)          # DWORD of the request being worked on
        lane = Signal(1)          # its lane in the current CQ beat (writes)
        rbuf = [Signal(32, name=f"rbuf{i}") for i in range(self.MAX_READ_DW)]
        rerr = Signal()
        aw_done, w_done = Signal(), Signal()

        # byte count and lower address of the completion (PCIe 2.2.9), from the request
        lo = _lowest(first_be)
        byte_count = Signal(13)
        with m.If(dw_count == 1):
            m.d.comb += byte_count.eq(Mux(first_be == 0, 1, _highest(first_be) - lo + 1))
        with m.Else():
            m.d.comb += byte_count.eq((dw_count << 2) - lo - (3 - _highest(last_be)))
        lower_addr = Cat(lo[:2], addr[2:7])

        # the DWORD index ``idx``: its byte enables and CSR address
        strb = Mux(idx == 0, first_be, Mux(idx == dw_count - 1, last_be, 0xF))
        csr_addr = Cat(Const(0, 2), (addr[2:16] + idx)[:14])

        beat = Signal(2)          # CC beat being sent
        cc_dws = Signal(2)        # data DWORDs in the completion (0 for UR / CA)

        dw0 = Cat(lower_addr, Const(0, 9), byte_count, Const(0, 3))
        dw1 = Cat(cc_dws, Const(0, 9), status, Const(0, 2), req_id)   # poisoned 0, bit 15 reserved
        dw2 = Cat(tag, func, Const(0, 8), Const(0, 1), tc, attr, Const(0, 1))

        is_np = req_type.matches(ReqType.MEM_READ, ReqType.IO_READ, ReqType.IO_WRITE, 4, 5, 6,
                                 ReqType.MEM_READ_LOCKED)

        m.d.comb += [axil.awprot.eq(0b010), axil.arprot.eq(0b010)]

        with m.FSM():
            with m.State("HDR0"):
                m.d.comb += cq.tready.eq(1)
                with m.If(cq.tvalid):
                    m.d.sync += [addr.eq(Cat(Const(0, 2), cq.tdata[2:64])),
                                 first_be.eq(cq.tuser[0:4]), last_be.eq(cq.tuser[4:8])]
                    with m.If(~cq.tlast):
                        m.next = "HDR1"
            with m.State("HDR1"):
                m.d.comb += cq.tready.eq(1)
                d2, d3 = cq.tdata[0:32], cq.tdata[32:64]
                bar_id = d3[16:19]
                n = d2[0:11]
                rt = d2[11:15]
                with m.If(cq.tvalid):
                    m.d.sync += [dw_count.eq(n), req_type.eq(rt), req_id.eq(d2[16:32]),
                                 tag.eq(d3[0:8]), func.eq(d3[8:16]), tc.eq(d3[25:28]),
                                 attr.eq(d3[28:31]), idx.eq(0), lane.eq(0), rerr.eq(0)]
                    rd_ok = (rt == ReqType.MEM_READ) & (bar_id == 0) & (n >= 1) & \
                            (n <= self.MAX_READ_DW)
                    wr_ok = (rt == ReqType.MEM_WRITE) & (bar_id == 0)
                    np = rt.matches(ReqType.MEM_READ, ReqType.IO_READ, ReqType.IO_WRITE, 4, 5, 6,
                                    ReqType.MEM_READ_LOCKED)
                    with m.If(cq.tlast):
                        with m.If(rd_ok):
                            m.next = "RD_ADDR"
                        with m.Elif(np):
                            m.d.sync += [status.eq(CplStatus.UR), cc_dws.eq(0), beat.eq(0)]
                            m.next = "CPL"
                        with m.Else():
                            m.next = "HDR0"
                    with m.Elif(wr_ok):
                        m.d.sync += [aw_done.eq(0), w_done.eq(0)]
                        m.next = "WR"
                    with m.Else():
                        m.next = "DRAIN"

            with m.State("DRAIN"):
                # payload of a request the adapter does not serve
                m.d.comb += cq.tready.eq(1)
                with m.If(cq.tvalid & cq.tlast):
                    with m.If(is_np):
                        m.d.sync += [status.eq(CplStatus.UR), cc_dws.eq(0), beat.eq(0)]
                        m.next = "CPL"
                    with m.Else():
                        m.next = "HDR0"

            with m.State("WR"):
                # DWORD ``idx`` sits in lane ``lane`` of the CQ beat on the bus (held, not taken,
                # until both of its DWORDs are done)
                with m.If(cq.tvalid):
                    with m.If(strb == 0):
                        m.next = "WR_NEXT"
                    with m.Else():
                        m.d.comb += [axil.awaddr.eq(csr_addr), axil.awvalid.eq(~aw_done),
                                     axil.wdata.eq(cq.tdata.word_select(lane, 32)),
                                     axil.wstrb.eq(strb), axil.wvalid.eq(~w_done)]
                        aw_now = aw_done | axil.awready
                        w_now = w_done | axil.wready
                        m.d.sync += [aw_done.eq(aw_now), w_done.eq(w_now)]
                        with m.If(aw_now & w_now):
                            m.next = "WR_RESP"
            with m.State("WR_RESP"):
                m.d.comb += axil.bready.eq(1)
                with m.If(axil.bvalid):
                    m.next = "WR_NEXT"
            with m.State("WR_NEXT"):
                # one clock per DWORD between accesses; takes the CQ beat after its last DWORD
                more = (idx + 1 < dw_count)
                done_beat = (lane == 1) | ~more
                with m.If(done_beat):
                    m.d.comb += cq.tready.eq(1)
                    with m.If(cq.tvalid):
                        m.d.sync += [idx.eq(idx + 1), lane.eq(~lane), aw_done.eq(0), w_done.eq(0)]
                        with m.If(cq.tlast):
                            m.next = "HDR0"
                        with m.Elif(~more):
                            m.next = "DRAIN"    # payload longer than its length field says
                        with m.Else():
                            m.next = "WR"
                with m.Else():
                    m.d.sync += [idx.eq(idx + 1), lane.eq(~lane), aw_done.eq(0), w_done.eq(0)]
                    m.next = "WR"

            with m.State("RD_ADDR"):
                m.d.comb += [axil.araddr.eq(csr_addr), axil.arvalid.eq(1)]
                with m.If(axil.arready):
                    m.next = "RD_DATA"
            with m.State("RD_DATA"):
                m.d.comb += axil.rready.eq(1)
                with m.If(axil.rvalid):
                    for i, r in enumerate(rbuf):
                        with m.If(idx == i):
                            m.d.sync += r.eq(axil.rdata)
                    err = (axil.rresp != Resp.OKAY)
                    m.d.sync += [idx.eq(idx + 1), rerr.eq(rerr | err)]
                    with m.If(idx + 1 < dw_count):
                        m.next = "RD_ADDR"
                    with m.Else():
                        m.d.sync += [status.eq(Mux(rerr | err, CplStatus.CA, CplStatus.SC)),
                                     cc_dws.eq(Mux(rerr | err, 0, dw_count)), beat.eq(0)]
                        m.next = "CPL"

            with m.State("CPL"):
                # DW0 DW1 | DW2 data0 | data1: 64-bit DWORD-aligned CC (PG213)
                m.d.comb += cc.tvalid.eq(1)
                with m.Switch(beat):
                    with m.Case(0):
                        m.d.comb += [cc.tdata.eq(Cat(dw0, dw1)), cc.tkeep.eq(0b11)]
                    with m.Case(1):
                        m.d.comb += [cc.tdata.eq(Cat(dw2, rbuf[0])),
                                     cc.tkeep.eq(Mux(cc_dws == 0, 0b01, 0b11)),
                                     cc.tlast.eq(cc_dws <= 1)]
                    with m.Default():
                        m.d.comb += [cc.tdata.eq(Cat(rbuf[1], Const(0, 32))), cc.tkeep.eq(0b01),
                                     cc.tlast.eq(1)]
                with m.If(cc.tready):
                    m.d.sync += beat.eq(beat + 1)
                    with m.If(cc.tlast):
                        m.next = "HDR0"
        return m


def _rq_desc(addr, dw_count, req_type, tag):
    """The two 64-bit beats of a 4-DWORD RQ memory request descriptor (PG213 RQ descriptor):
    DW0-1 the DWORD address (AT = 0, untranslated), DW2 length / type / requester ID (0: the
    core fills in its own, ``requester_id_enable`` = 0), DW3 tag / completer ID / TC 0 / attr 0."""
    beat0 = Cat(Const(0, 2), addr[2:64])
    beat1 = Cat(dw_count[:11], Const(req_type, 4), Const(0, 1), Const(0, 16),
                tag[:8], Const(0, 16), Const(0, 1), Const(0, 3), Const(0, 3), Const(0, 1))
    return beat0, beat1


class WriteRequester(wiring.Component):
    """AXI4 write channels -> memory write TLPs (see the module docstring).

    Parameters: ``buffer`` (W beats stored, at least the largest burst: 256), ``bursts`` (AW
    entries and completed bursts waiting). Ports: ``aw``/``w``/``b`` members of ``s_axi`` (In
    ``Axi4Signature(64, 64, 4)``; the read channels are ignored), ``rq`` (Out stream of
    ``rq_beat_layout()``), ``mps`` (In(3): ``cfg_max_payload``, payload 128 << mps bytes).
    """

    def __init__(self, *, buffer=512, bursts=4, id_width=4):
        if buffer < 256:
            raise ValueError("the write buffer must hold a whole 256-beat burst")
        self._buffer, self._bursts, self._id_width = buffer, bursts, id_width
        super().__init__({
            "s_axi": In(Axi4Signature(64, 64, id_width)),
            "rq":    Out(stream.Signature(rq_beat_layout())),
            "mps":   In(3),
        })

    def elaborate(self, platform):
        m = Module()
        axi, rq = self.s_axi, self.rq
        IW = self._id_width

        m.submodules.aw_fifo = aw_fifo = SyncFIFOBuffered(width=IW + 64 + 8, depth=self._bursts)
        m.submodules.w_fifo = w_fifo = SyncFIFOBuffered(width=64, depth=self._buffer)
        # the last beat's strobe of every burst whose beats are all in w_fifo
        m.submodules.l_fifo = l_fifo = SyncFIFOBuffered(width=8, depth=max(4, self._bursts * 4))
        m.submodules.b_fifo = b_fifo = SyncFIFOBuffered(width=IW, depth=self._bursts)

        m.d.comb += [
            aw_fifo.w_data.eq(Cat(axi.awid, axi.awaddr, axi.awlen)),
            aw_fifo.w_en.eq(axi.awvalid),
            axi.awready.eq(aw_fifo.w_rdy),
            w_fifo.w_data.eq(axi.wdata),
            axi.wready.eq(w_fifo.w_rdy & l_fifo.w_rdy),
            w_fifo.w_en.eq(axi.wvalid & axi.wready),
            l_fifo.w_data.eq(axi.wstrb),
            l_fifo.w_en.eq(axi.wvalid & axi.wready & axi.wlast),
            axi.bvalid.eq(b_fifo.r_rdy),
            axi.bid.eq(b_fifo.r_data),
            axi.bresp.eq(Resp.OKAY),
            b_fifo.r_en.eq(axi.bready),
        ]
        aw_id = aw_fifo.r_data[0:IW]
        aw_addr = aw_fifo.r_data[IW:IW + 64]
        aw_len = aw_fifo.r_data[IW + 64:IW + 72]

        cur = Signal(64)          # next byte to send
        end = Signal(64)          # one past the burst's last byte
        bid = Signal(IW)
        held = Signal(64)         # the W beat holding the current payload DWORD (odd start)
        shift = Signal()          # the TLP starts on an odd DWORD: payload = W beats moved by one
        left = Signal(11)         # payload DWORDs still to send in this TLP
        tlp_bytes = Signal(13)
        dw_count = Signal(11)
        first_be, last_be = Signal(4), Signal(4)

        # cut at the next multiple of the max payload size (<= 1 KiB at 2 bits, <= 4 KiB at 3)
        mps_bytes = Signal(14)
        m.d.comb += mps_bytes.eq(Const(128, 14) << self.mps.as_unsigned()[:3])
        to_boundary = Signal(14)
        m.d.comb += to_boundary.eq(mps_bytes - (cur[:13] & (mps_bytes - 1)[:13]))
        rem = Signal(64)
        m.d.comb += rem.eq(end - cur)
        n_bytes = Signal(13)
        m.d.comb += n_bytes.eq(Mux(rem < to_boundary, rem, to_boundary))
        tlp_last = Signal(2)
        m.d.comb += tlp_last.eq((cur[:2] + n_bytes - 1)[:2])

        beat0, beat1 = _rq_desc(cur, dw_count, ReqType.MEM_WRITE, Const(0, 8))
        m.d.comb += [rq.payload.first_be.eq(first_be), rq.payload.last_be.eq(last_be)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(aw_fifo.r_rdy & l_fifo.r_rdy & b_fifo.w_rdy):
                    base = Cat(Const(0, 3), aw_addr[3:64])
                    m.d.sync += [cur.eq(aw_addr), bid.eq(aw_id),
                                 end.eq(base + (aw_len << 3) + _highest8(l_fifo.r_data) + 1)]
                    m.d.comb += [aw_fifo.r_en.eq(1), l_fifo.r_en.eq(1)]
                    with m.If(aw_addr[2]):
                        m.next = "PREFETCH"
                    with m.Else():
                        m.next = "SETUP"
            with m.State("PREFETCH"):
                # the first DWORD is the upper half of the first W beat: hold that beat
                with m.If(w_fifo.r_rdy):
                    m.d.comb += w_fifo.r_en.eq(1)
                    m.d.sync += held.eq(w_fifo.r_data)
                    m.next = "SETUP"
            with m.State("SETUP"):
                n_dw = (cur[:2] + n_bytes + 3) >> 2
                fbe = (Const(0xF, 4) << cur[:2])[:4]
                lbe = (Const(0xF, 4) >> (~tlp_last)[:2])[:4]      # ~x = 3 - x on 2 bits
                m.d.sync += [tlp_bytes.eq(n_bytes), dw_count.eq(n_dw), left.eq(n_dw),
                             shift.eq(cur[2]),
                             first_be.eq(Mux(n_dw == 1, fbe & lbe, fbe)),
                             last_be.eq(Mux(n_dw == 1, 0, lbe))]
                m.next = "DESC0"
            with m.State("DESC0"):
                m.d.comb += [rq.valid.eq(1), rq.payload.data.eq(beat0), rq.payload.keep.eq(0b11)]
                with m.If(rq.ready):
                    m.next = "DESC1"
            with m.State("DESC1"):
                m.d.comb += [rq.valid.eq(1), rq.payload.data.eq(beat1), rq.payload.keep.eq(0b11)]
                with m.If(rq.ready):
                    m.next = "DATA"
            with m.State("DATA"):
                two = left >= 2
                final = left <= 2
                with m.If(shift):
                    # payload DWORDs 2k, 2k+1 = held.hi, next beat.lo
                    m.d.comb += [rq.payload.data.eq(Cat(held[32:64], w_fifo.r_data[0:32])),
                                 rq.valid.eq(~two | w_fifo.r_rdy)]
                    with m.If(rq.valid & rq.ready & two):
                        m.d.comb += w_fifo.r_en.eq(1)
                        m.d.sync += held.eq(w_fifo.r_data)
                with m.Else():
                    m.d.comb += [rq.payload.data.eq(w_fifo.r_data), rq.valid.eq(w_fifo.r_rdy)]
                    with m.If(rq.valid & rq.ready):
                        m.d.comb += w_fifo.r_en.eq(1)
                m.d.comb += [rq.payload.keep.eq(Mux(two, 0b11, 0b01)), rq.payload.last.eq(final)]
                with m.If(rq.valid & rq.ready):
                    m.d.sync += left.eq(left - 2)
                    with m.If(final):
                        m.d.sync += cur.eq(cur + tlp_bytes)
                        with m.If(cur + tlp_bytes == end):
                            m.d.comb += [b_fifo.w_en.eq(1), b_fifo.w_data.eq(bid)]
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "SETUP"
        return m


class ReadRequester(wiring.Component):
    """AXI4 read channels -> memory read TLPs; completions -> reorder buffer -> R (see the
    module docstring).

    Parameters: ``tags`` (requests in flight, a power of two <= 32: tags without the extended
    tag field), ``slot_bytes`` (largest request, a power of two 128..4096; the buffer is
    ``tags * slot_bytes``). Ports: the ``ar``/``r`` members of ``s_axi``; ``rq`` (Out stream of
    ``rq_beat_layout()``); ``s_axis_rc`` (In ``UspAxisSignature(64, 75)``); ``mrrs`` (In(3):
    ``cfg_max_read_req``, 128 << mrrs bytes); ``in_flight`` (Out: requests without their last
    completion, for tests and counters).
    """

    def __init__(self, *, tags=16, slot_bytes=512, id_width=4):
        exact_log2(tags)
        exact_log2(slot_bytes)
        if not 2 <= tags <= 32 or not 128 <= slot_bytes <= 4096:
            raise ValueError("tags must be 2..32 and slot_bytes 128..4096")
        self._tags, self._slot, self._id_width = tags, slot_bytes, id_width
        super().__init__({
            "s_axi":     In(Axi4Signature(64, 64, id_width)),
            "rq":        Out(stream.Signature(rq_beat_layout())),
            "s_axis_rc": In(UspAxisSignature(64, USER_WIDTHS["rc"])),
            "mrrs":      In(3),
            "in_flight": Out(range(tags + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        axi, rq, rc = self.s_axi, self.rq, self.s_axis_rc
        T, IW = self._tags, self._id_width
        TB = exact_log2(T)
        ROWS = self._slot // 8                      # 8-byte rows per slot
        RB = exact_log2(ROWS)

        # ---------------------------------------------------------------- requests
        m.submodules.ar_fifo = ar_fifo = SyncFIFOBuffered(width=IW + 64 + 8, depth=2)
        m.d.comb += [ar_fifo.w_data.eq(Cat(axi.arid, axi.araddr, axi.arlen)),
                     ar_fifo.w_en.eq(axi.arvalid), axi.arready.eq(ar_fifo.w_rdy)]
        ar_id = ar_fifo.r_data[0:IW]
        ar_addr = ar_fifo.r_data[IW:IW + 64]
        ar_len = ar_fifo.r_data[IW + 64:IW + 72]

        # one entry per request in flight, in tag order (= issue order = R order)
        req_layout = data.StructLayout({"rows": RB + 1, "last": 1, "id": IW})
        m.submodules.inflight = inflight = SyncFIFOBuffered(width=req_layout.size, depth=T)
        # bits 11:3 of each tag's request address: where its completions' lower address points
        m.submodules.start_mem = start_mem = Memory(shape=9, depth=T, init=[])
        start_w = start_mem.write_port()
        start_r = start_mem.read_port(domain="comb")

        head = Signal(TB)         # next tag to issue
        tail = Signal(TB)         # oldest tag in flight
        m.d.comb += self.in_flight.eq(inflight.level)

        cur = Signal(64)
        end = Signal(64)
        rid = Signal(IW)
        req_bytes = Signal(13)
        req_last = Signal()
        chunk = Signal(13)
        m.d.comb += chunk.eq(Mux(self.mrrs.as_unsigned() >= exact_log2(self._slot // 128),
                                 self._slot, Const(128, 13) << self.mrrs.as_unsigned()[:3]))
        to_boundary = Signal(14)
        m.d.comb += to_boundary.eq(chunk - (cur[:13] & (chunk - 1)[:13]))
        rem = Signal(64)
        m.d.comb += rem.eq(end - cur)

        beat0, beat1 = _rq_desc(cur, (req_bytes >> 2)[:11], ReqType.MEM_READ, head)
        m.d.comb += [rq.payload.first_be.eq(0xF), rq.payload.last_be.eq(0xF)]
        entry = Signal(req_layout)

        with m.FSM(name="req"):
            with m.State("IDLE"):
                with m.If(ar_fifo.r_rdy):
                    base = Cat(Const(0, 3), ar_addr[3:64])
                    m.d.sync += [cur.eq(base), end.eq(base + ((ar_len + 1) << 3)), rid.eq(ar_id)]
                    m.d.comb += ar_fifo.r_en.eq(1)
                    m.next = "SETUP"
            with m.State("SETUP"):
                n = Mux(rem < to_boundary, rem, to_boundary)
                m.d.sync += [req_bytes.eq(n), req_last.eq(rem <= to_boundary)]
                m.next = "DESC0"
            with m.State("DESC0"):
                # a free tag (the in-flight queue has room) before the request goes out
                m.d.comb += [rq.valid.eq(inflight.w_rdy), rq.payload.data.eq(beat0),
                             rq.payload.keep.eq(0b11)]
                with m.If(rq.valid & rq.ready):
                    m.next = "DESC1"
            with m.State("DESC1"):
                m.d.comb += [rq.valid.eq(1), rq.payload.data.eq(beat1),
                             rq.payload.keep.eq(0b11), rq.payload.last.eq(1)]
                m.d.comb += [entry.rows.eq(req_bytes >> 3), entry.last.eq(req_last),
                             entry.id.eq(rid)]
                with m.If(rq.ready):
                    m.d.comb += [inflight.w_en.eq(1), inflight.w_data.eq(entry.as_value()),
                                 start_w.en.eq(1), start_w.addr.eq(head),
                                 start_w.data.eq(cur[3:12])]
                    m.d.sync += [head.eq(head + 1), cur.eq(cur + req_bytes)]
                    with m.If(req_last):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "SETUP"

        # ---------------------------------------------------------------- completions
        # buffer: tag t owns rows t*ROWS .. t*ROWS+ROWS-1; written per DWORD lane
        m.submodules.buf = buf = Memory(shape=64, depth=T * ROWS, init=[])
        wp = buf.write_port(granularity=32)
        rp = buf.read_port()
        done = Signal(T)          # the tag's "request completed" completion has been written
        err = Signal(T)           # one of its completions reported an error
        set_done = Signal(T)
        set_err = Signal(T)
        clr = Signal(T)
        m.d.sync += [done.eq((done | set_done) & ~clr), err.eq((err | set_err) & ~clr)]

        ctag = Signal(8)
        crow = Signal(RB)
        cbad = Signal()
        ccompleted = Signal()
        cerr = Signal()
        prev = Signal(32)         # payload DWORD waiting for its row's upper half
        d0 = rc.tdata[0:32]
        d1 = rc.tdata[32:64]

        def finish():
            ok_tag = ctag < T
            return [set_done.eq(Mux(ok_tag & ccompleted, 1 << ctag[:TB], 0)),
                    set_err.eq(Mux(ok_tag & (cerr | cbad), 1 << ctag[:TB], 0))]

        m.d.comb += wp.addr.eq(Cat(crow, ctag[:TB]))
        with m.FSM(name="cpl"):
            with m.State("H0"):
                m.d.comb += rc.tready.eq(1)
                with m.If(rc.tvalid):
                    # DW0: lower address 11:0, error code 15:12, byte count, request completed 30
                    # DW1: DWORD count 10:0, status 13:11, poisoned 14
                    m.d.sync += [crow.eq(d0[3:12]), ccompleted.eq(d0[30]),
                                 cerr.eq((d0[12:16] != 0) | (d1[11:14] != CplStatus.SC) | d1[14]),
                                 cbad.eq(d0[2])]        # odd DWORD start: see the docstring
                    with m.If(~rc.tlast):
                        m.next = "H1"
            with m.State("H1"):
                # DW2: tag 7:0; DW3 (lane 1): the first payload DWORD, if any
                m.d.comb += [rc.tready.eq(1), start_r.addr.eq(d0[:TB])]
                with m.If(rc.tvalid):
                    row = (crow - start_r.data)[:RB]
                    bad = cbad | cerr | (d0[0:8] >= T)
                    m.d.sync += [ctag.eq(d0[0:8]), crow.eq(row), prev.eq(d1), cbad.eq(bad)]
                    with m.If(rc.tlast):
                        with m.If(rc.tkeep[1] & ~bad):
                            m.next = "FLUSH"
                        with m.Else():
                            m.d.comb += [set_done.eq(Mux((d0[0:8] < T) & ccompleted,
                                                         1 << d0[:TB], 0)),
                                         set_err.eq(Mux((d0[0:8] < T) & bad, 1 << d0[:TB], 0))]
                            m.next = "H0"
                    with m.Else():
                        m.next = "DATA"
            with m.State("DATA"):
                # row = {this beat's lane 0, previous beat's lane 1}
                m.d.comb += rc.tready.eq(1)
                with m.If(rc.tvalid):
                    m.d.comb += [wp.data.eq(Cat(prev, d0)),
                                 wp.en.eq(Mux(cbad, 0, Cat(Const(1, 1), rc.tkeep[0])))]
                    m.d.sync += [prev.eq(d1), crow.eq(crow + 1)]
                    with m.If(rc.tlast):
                        with m.If(rc.tkeep[1] & ~cbad):
                            m.next = "FLUSH"
                        with m.Else():
                            m.d.comb += finish()
                            m.next = "H0"
            with m.State("FLUSH"):
                # the completion's last DWORD is the lower half of a row of its own
                m.d.comb += [wp.data.eq(Cat(prev, Const(0, 32))), wp.en.eq(0b01)]
                m.d.comb += finish()
                m.next = "H0"

        # ---------------------------------------------------------------- R, in tag order
        cur_req = Signal(req_layout)
        m.d.comb += cur_req.eq(inflight.r_data)
        rrow = Signal(RB + 1)     # next row of the oldest request to read
        out_valid = Signal()
        out_last = Signal()
        out_err = Signal()
        out_id = Signal(IW)
        advance = ~out_valid | axi.rready
        ready_now = inflight.r_rdy & (done >> tail)[0]
        issue = advance & ready_now
        final_row = rrow + 1 == cur_req.rows
        m.d.comb += [rp.en.eq(advance), rp.addr.eq(Cat(rrow[:RB], tail))]
        with m.If(advance):
            m.d.sync += [out_valid.eq(ready_now), out_last.eq(cur_req.last & final_row),
                         out_err.eq((err >> tail)[0]), out_id.eq(cur_req.id)]
        with m.If(issue):
            with m.If(final_row):
                m.d.sync += [rrow.eq(0), tail.eq(tail + 1)]
                m.d.comb += [inflight.r_en.eq(1), clr.eq(1 << tail)]
            with m.Else():
                m.d.sync += rrow.eq(rrow + 1)
        m.d.comb += [axi.rvalid.eq(out_valid), axi.rdata.eq(rp.data), axi.rlast.eq(out_last),
                     axi.rid.eq(out_id), axi.rresp.eq(Mux(out_err, Resp.SLVERR, Resp.OKAY))]
        return m


class RqArbiter(wiring.Component):
    """Two TLP streams (``rq_beat_layout()``) onto the RQ interface, one whole TLP at a time,
    alternating priority so neither direction starves the other. Ports: ``a``, ``b`` (In
    streams), ``m_axis_rq`` (Out ``UspAxisSignature(64, 62)``)."""

    def __init__(self):
        super().__init__({
            "a":         In(stream.Signature(rq_beat_layout())),
            "b":         In(stream.Signature(rq_beat_layout())),
            "m_axis_rq": Out(UspAxisSignature(64, USER_WIDTHS["rq"])),
        })

    def elaborate(self, platform):
        m = Module()
        rq = self.m_axis_rq
        busy = Signal()           # inside a TLP of ``sel``
        sel = Signal()            # 0: a, 1: b
        prefer_b = Signal()
        pick = Mux(busy, sel, Mux(self.a.valid & self.b.valid, prefer_b, self.b.valid))
        beat = Mux(pick, self.b.payload.as_value(), self.a.payload.as_value())
        p = Signal(rq_beat_layout())
        m.d.comb += [
            p.eq(beat),
            rq.tvalid.eq(Mux(pick, self.b.valid, self.a.valid)),
            rq.tdata.eq(p.data), rq.tkeep.eq(p.keep), rq.tlast.eq(p.last),
            # tuser: first_be 3:0, last_be 7:4; no TPH, no discontinue, seq_num 0, parity unused
            rq.tuser.eq(Cat(p.first_be, p.last_be)),
            self.a.ready.eq(rq.tready & ~pick),
            self.b.ready.eq(rq.tready & pick),
        ]
        with m.If(rq.tvalid & rq.tready):
            m.d.sync += [busy.eq(~p.last), sel.eq(pick)]
            with m.If(p.last):
                m.d.sync += prefer_b.eq(~pick)
        return m


class MsiSender(wiring.Component):
    """Vector numbers -> ``cfg_interrupt_msi_*`` (see the module docstring).

    Ports: ``msi`` (In stream of 5-bit vector numbers), ``cfg_interrupt_msi_enable`` (In(4)),
    ``cfg_interrupt_msi_mmenable`` (In(12)), ``cfg_interrupt_msi_int`` (Out(32)),
    ``cfg_interrupt_msi_sent`` / ``_fail`` (In(1)), ``sent`` / ``failed`` / ``dropped`` (Out(1),
    one-clock pulses for counters).
    """

    def __init__(self):
        super().__init__({
            "msi":                        In(stream.Signature(5)),
            "cfg_interrupt_msi_enable":   In(4),
            "cfg_interrupt_msi_mmenable": In(12),
            "cfg_interrupt_msi_int":      Out(32),
            "cfg_interrupt_msi_sent":     In(1),
            "cfg_interrupt_msi_fail":     In(1),
            "sent":                       Out(1),
            "failed":                     Out(1),
            "dropped":                    Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        # vectors the host enabled for function 0: 2 ** mmenable[2:0]
        mme = self.cfg_interrupt_msi_mmenable[0:3]
        mask = Signal(5)
        m.d.comb += mask.eq((Const(1, 6) << Mux(mme > 5, 5, mme)) - 1)
        pulse = Signal(32)
        m.d.comb += self.cfg_interrupt_msi_int.eq(pulse)
        m.d.sync += pulse.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.msi.ready.eq(1)
                with m.If(self.msi.valid):
                    with m.If(self.cfg_interrupt_msi_enable[0]):
                        m.d.sync += pulse.eq(Const(1, 32) << (self.msi.payload & mask))
                        m.next = "WAIT"
                    with m.Else():
                        m.d.comb += self.dropped.eq(1)
            with m.State("WAIT"):
                with m.If(self.cfg_interrupt_msi_sent):
                    m.d.comb += self.sent.eq(1)
                    m.next = "IDLE"
                with m.Elif(self.cfg_interrupt_msi_fail):
                    m.d.comb += self.failed.eq(1)
                    m.next = "IDLE"
        return m


class PcieUsp(wiring.Component):
    """The adapter: UltraScale+ PCIe hard-block user interface on one side, the core's CSR bus,
    DMA bus and interrupt requests on the other (see the module docstring).

    Parameters: ``data_width`` (PCIe interface width; 64 only, see the module docstring),
    ``tags`` / ``slot_bytes`` (read requests in flight and the largest one), ``wr_buffer`` (W
    beats stored), ``id_width`` (AXI ID width of ``s_axi``).

    Ports (user logic's view, Corundum names)::

        s_axis_cq  In  UspAxisSignature(64, 88)   completer requests (MMIO)
        m_axis_cc  Out UspAxisSignature(64, 33)   completer completions
        m_axis_rq  Out UspAxisSignature(64, 62)   requester requests (DMA)
        s_axis_rc  In  UspAxisSignature(64, 75)   requester completions
        cfg_max_payload In(3), cfg_max_read_req In(3)
        cfg_interrupt_msi_enable In(4), _mmenable In(12), _int Out(32), _sent In(1), _fail In(1)
        pcie_cq_np_req Out(2) (held at 1)
        m_axil     Out AxiLiteSignature(16)       to the CSR bank
        s_axi      In  Axi4Signature(64, 64, id)  from the DMA engine
        msi        In  stream of 5-bit vector numbers
        rd_in_flight Out                          read requests in flight
        msi_sent / msi_failed / msi_dropped Out(1) one-clock pulses
    """

    def __init__(self, data_width=64, *, tags=16, slot_bytes=512, wr_buffer=512, id_width=4):
        if data_width != 64:
            raise ValueError(f"PCIe interface width {data_width}: only 64 is built (the core's "
                             f"64-bit DMA port needs no width converter; see the module docstring)")
        self.data_width = data_width
        self.completer = Completer()
        self.writer = WriteRequester(buffer=wr_buffer, id_width=id_width)
        self.reader = ReadRequester(tags=tags, slot_bytes=slot_bytes, id_width=id_width)
        self.arbiter = RqArbiter()
        self.msi_sender = MsiSender()
        super().__init__({
            **usp_members(),
            "m_axil":                     Out(AxiLiteSignature(16)),
            "s_axi":                      In(Axi4Signature(64, 64, id_width)),
            "msi":                        In(stream.Signature(5)),
            "rd_in_flight":               Out(range(tags + 1)),
            "msi_sent":                   Out(1),
            "msi_failed":                 Out(1),
            "msi_dropped":                Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.completer = cpl = self.completer
        m.submodules.writer = wr = self.writer
        m.submodules.reader = rd = self.reader
        m.submodules.arbiter = arb = self.arbiter
        m.submodules.msi = msi = self.msi_sender

        wiring.connect(m, wiring.flipped(self.s_axis_cq), cpl.s_axis_cq)
        wiring.connect(m, cpl.m_axis_cc, wiring.flipped(self.m_axis_cc))
        wiring.connect(m, cpl.m_axil, wiring.flipped(self.m_axil))
        m.d.comb += self.pcie_cq_np_req.eq(1)

        # AXI4 subordinate: write channels to the writer, read channels to the reader
        axi = self.s_axi
        for name in ("awid", "awaddr", "awlen", "awvalid", "wdata", "wstrb", "wlast", "wvalid",
                     "bready"):
            m.d.comb += getattr(wr.s_axi, name).eq(getattr(axi, name))
        for name in ("awready", "wready", "bid", "bresp", "bvalid"):
            m.d.comb += getattr(axi, name).eq(getattr(wr.s_axi, name))
        for name in ("arid", "araddr", "arlen", "arvalid", "rready"):
            m.d.comb += getattr(rd.s_axi, name).eq(getattr(axi, name))
        for name in ("arready", "rid", "rdata", "rresp", "rlast", "rvalid"):
            m.d.comb += getattr(axi, name).eq(getattr(rd.s_axi, name))
        m.d.comb += [wr.mps.eq(self.cfg_max_payload), rd.mrrs.eq(self.cfg_max_read_req),
                     self.rd_in_flight.eq(rd.in_flight)]

        # reads first on a tie at start: they are two beats and unblock the R channel sooner
        wiring.connect(m, rd.rq, arb.a)
        wiring.connect(m, wr.rq, arb.b)
        wiring.connect(m, arb.m_axis_rq, wiring.flipped(self.m_axis_rq))
        wiring.connect(m, wiring.flipped(self.s_axis_rc), rd.s_axis_rc)

        wiring.connect(m, wiring.flipped(self.msi), msi.msi)
        m.d.comb += [msi.cfg_interrupt_msi_enable.eq(self.cfg_interrupt_msi_enable),
                     msi.cfg_interrupt_msi_mmenable.eq(self.cfg_interrupt_msi_mmenable),
                     self.cfg_interrupt_msi_int.eq(msi.cfg_interrupt_msi_int),
                     msi.cfg_interrupt_msi_sent.eq(self.cfg_interrupt_msi_sent),
                     msi.cfg_interrupt_msi_fail.eq(self.cfg_interrupt_msi_fail),
                     self.msi_sent.eq(msi.sent), self.msi_failed.eq(msi.failed),
                     self.msi_dropped.eq(msi.dropped)]
        return m
