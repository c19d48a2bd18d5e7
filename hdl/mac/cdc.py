# Ref: IEEE 802.3-2018 clause 3 (MAC frame), clause 35 (GMII); C. E. Cummings, "Simulation and
#      Synthesis Techniques for Asynchronous FIFO Design" (SNUG 2002; amaranth.lib.fifo.AsyncFIFO)
"""``MacCore``: the GMII MAC joined to the core clock domain, with width conversion 8 <-> W bits.

::

    eth_rx:  gmii rx -> GmiiRx (FCS check, packet FIFO) -> BytePacker -> [skid] --+
                                                                        AsyncFIFO --> m_axis_rx  (sync)
    eth_tx:  gmii tx <- GmiiTx <- PacketFifo (store and forward) <- [skid] <- ByteUnpacker <- [skid]
                                                                        <- AsyncFIFO <-- s_axis_tx

Clock domains: ``sync`` (the core), ``eth_rx`` (the PHY's receive clock) and ``eth_tx`` (the
transmit clock), 125 MHz at 1 GbE; none is defined here (``RgmiiPhy`` defines ``eth_rx``, the
board top the others). Any ratio between them works; the core needs W/8 x less than the line
rate's clock to keep up (8 Gb/s at W = 64 and 125 MHz, against 1 Gb/s).

Frames cross whole: the receive side commits a frame to the core only after its FCS checked
good, and a frame that finds no room while arriving (the core back-pressures ``m_axis_rx`` until
every FIFO is full) is dropped whole and counted in ``rx_overruns``; the core never sees a
truncated frame. On the transmit side a frame starts on the wire only once it is entirely in
the ``eth_tx`` packet FIFO, so the GMII transmitter never runs dry mid-frame whatever the core's
clock or stalls. A transmit frame longer than that FIFO is discarded (``tx_dropped``).

Ports
-----
``s_axis_tx``  In   AxiStreamSignature(W), ``sync``: frames to send, without FCS; ``tkeep`` a
                    prefix of ones, full on every beat but a frame's last, never zero (a zero
                    ``tkeep`` counts as one byte). Short frames are padded to 60 bytes.
``m_axis_rx``  Out  AxiStreamSignature(W), ``sync``: received good frames without FCS, same
                    beat rules; lanes past ``tkeep`` carry junk. Shaped like ``NicCore``'s
                    ``s_axis_rx``/``m_axis_tx``: ``connect(m, mac.m_axis_rx, nic.s_axis_rx)``.
``gmii``       Out  GmiiSignature(): ``tx*`` in ``eth_tx``, ``rx*`` in ``eth_rx`` (to ``RgmiiPhy``).
``counters``   Out  one-clock pulses in ``sync``, one per event: ``rx_frames`` (good frames
                    queued for the core), ``rx_fcs_errors``, ``rx_phy_errors`` (RX_ER or no
                    SFD), ``rx_runts``, ``rx_oversize``, ``rx_overruns``, ``tx_frames`` (frames
                    sent on the wire), ``tx_dropped``. The lead maps them onto CSR ``counter``
                    registers (``<name>_inc`` ports of the bank).

Parameters: ``data_width`` W (multiple of 8, default 64), ``max_frame`` (bytes with FCS, default
1522), ``rx_fifo_bytes`` / ``tx_fifo_bytes`` (packet FIFOs in the Ethernet domains, powers of
two >= max_frame; default 4096: two full-size frames, 2 EBRs each on ECP5), ``cdc_depth`` (beats
of each asynchronous FIFO, default 16), ``ifg`` (default 12).

Latency: a received frame is committed 2 eth_rx clocks after RX_DV falls; its first beat then
needs 4 + W/8 eth_rx clocks (packet FIFO output register, byte skid register, packer, beat skid
register), the asynchronous FIFO's pointer synchronizers (about 3 sync clocks) and 1 sync clock
(port register) to reach ``m_axis_rx``. A beat taken on ``s_axis_tx`` passes a sync register,
the asynchronous FIFO and two eth_tx registers (either side of the unpacker) before its bytes
enter the eth_tx packet FIFO; a frame starts its preamble 4 eth_tx clocks after its last byte
entered that FIFO.
Every stage keeps one beat (byte) per clock. The registers are there for timing: all three
domains meet 125 MHz on a speed-6 ECP5 (LFE5U-25F, Colorlight shell).
"""

from amaranth.hdl import Cat, DomainRenamer, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import PulseSynchronizer
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.wiring import In, Out

from ..axis import AxiStreamSignature
from ..net.layout import beat_layout
from ..pktfifo import PacketFifo
from ..skid import SkidBuffer
from .gmii import BYTE_LAYOUT, GmiiRx, GmiiSignature, GmiiTx

__all__ = ["COUNTERS", "CountersSignature", "BytePacker", "ByteUnpacker", "MacCore"]

# (name, source domain, source port)
_COUNTER_SOURCES = (
    ("rx_frames", "rx", "frame"),
    ("rx_fcs_errors", "rx", "fcs_error"),
    ("rx_phy_errors", "rx", "phy_error"),
    ("rx_runts", "rx", "runt"),
    ("rx_oversize", "rx", "oversize"),
    ("rx_overruns", "rx", "overrun"),
    ("tx_frames", "tx", "sent"),
    ("tx_dropped", "tx", "dropped"),
)
COUNTERS = tuple(name for name, _, _ in _COUNTER_SOURCES)


class CountersSignature(wiring.Signature):
    """One ``Out(1)`` pulse per counter name in ``COUNTERS``."""

    def __init__(self):
        super().__init__({name: Out(1) for name in COUNTERS})


class ByteUnpacker(wiring.Component):
    """W-bit beats (``beat_layout``) -> one byte per clock (``BYTE_LAYOUT``), no bubbles between
    beats. ``keep`` is a prefix of ones; the byte at the last kept lane of a ``last`` beat gets
    ``last``. A beat is taken in the clock its final byte leaves (or when nothing is held).

    Ports: ``i`` In stream of ``beat_layout(W)``; ``o`` Out stream of ``BYTE_LAYOUT``."""

    def __init__(self, data_width=64):
        assert data_width % 8 == 0
        self.data_width = data_width
        super().__init__({
            "i": In(stream.Signature(beat_layout(data_width))),
            "o": Out(stream.Signature(BYTE_LAYOUT)),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.data_width // 8
        held = Signal()
        lanes = Signal(self.data_width)     # shifts down a byte per byte sent: lane 0 is next
        last = Signal()
        index = Signal(range(B))
        final_index = Signal(range(B))
        final = index == final_index

        # Last kept lane of the incoming beat (0 for an empty keep: one byte, not a lost end).
        top = Signal(range(B))
        for k in range(B):
            with m.If(self.i.payload.keep[k]):
                m.d.comb += top.eq(k)

        m.d.comb += [
            self.o.valid.eq(held),
            self.o.payload.data.eq(lanes[:8]),
            self.o.payload.last.eq(last & final),
            self.i.ready.eq(~held | (self.o.ready & final)),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [lanes.eq(lanes[8:]), index.eq(index + 1)]
            with m.If(final):
                m.d.sync += held.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                held.eq(1),
                lanes.eq(self.i.payload.data),
                last.eq(self.i.payload.last),
                index.eq(0),
                final_index.eq(Mux(self.i.payload.last, top, B - 1)),
            ]
        return m


class BytePacker(wiring.Component):
    """One byte per clock (``BYTE_LAYOUT``) -> W-bit beats (``beat_layout``): a beat leaves when
    it has W/8 bytes or the frame's last byte, ``keep`` a prefix of ones.

    Ports: ``i`` In stream of ``BYTE_LAYOUT``; ``o`` Out stream of ``beat_layout(W)`` (registered).
    Latency 1 clock from the byte that completes a beat; one byte per clock throughput."""

    def __init__(self, data_width=64):
        assert data_width % 8 == 0
        self.data_width = data_width
        super().__init__({
            "i": In(stream.Signature(BYTE_LAYOUT)),
            "o": Out(stream.Signature(beat_layout(data_width))),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.data_width // 8
        acc = [Signal(8, name=f"acc{k}") for k in range(B)]
        count = Signal(range(B))
        byte = self.i.payload.data
        merged = Cat(*(Mux(count == k, byte, acc[k]) for k in range(B)))

        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            for k in range(B):
                with m.If(count == k):
                    m.d.sync += acc[k].eq(byte)
            with m.If(self.i.payload.last | (count == B - 1)):
                m.d.sync += [
                    self.o.valid.eq(1),
                    self.o.payload.data.eq(merged),
                    self.o.payload.keep.eq(Cat(*(count >= k for k in range(B)))),
                    self.o.payload.last.eq(self.i.payload.last),
                    count.eq(0),
                ]
            with m.Else():
                m.d.sync += count.eq(count + 1)
        return m


class MacCore(wiring.Component):
    """GMII MAC with clock-domain crossing into ``sync`` (see the module docstring)."""

    def __init__(self, data_width=64, *, max_frame=1522, rx_fifo_bytes=4096, tx_fifo_bytes=4096,
                 cdc_depth=16, ifg=12):
        if tx_fifo_bytes < max_frame or tx_fifo_bytes & (tx_fifo_bytes - 1):
            raise ValueError(f"tx_fifo_bytes {tx_fifo_bytes} must be a power of two >= max_frame")
        self.data_width = data_width
        self.max_frame = max_frame
        self.rx_fifo_bytes = rx_fifo_bytes
        self.tx_fifo_bytes = tx_fifo_bytes
        self.cdc_depth = cdc_depth
        self.ifg = ifg
        super().__init__({
            "s_axis_tx": In(AxiStreamSignature(data_width)),
            "m_axis_rx": Out(AxiStreamSignature(data_width)),
            "gmii":      Out(GmiiSignature()),
            "counters":  Out(CountersSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        beat = beat_layout(W)

        # --- receive: eth_rx -> sync ---------------------------------------------------------
        rx = GmiiRx(max_frame=self.max_frame, fifo_depth=self.rx_fifo_bytes)
        m.submodules.rx = rx = DomainRenamer("eth_rx")(rx)
        m.submodules.rx_pack = pack = DomainRenamer("eth_rx")(BytePacker(W))
        m.submodules.rx_cdc = rx_cdc = AsyncFIFO(width=beat.size, depth=self.cdc_depth,
                                                 w_domain="eth_rx", r_domain="sync")
        m.d.comb += [
            rx.rxd.eq(self.gmii.rxd), rx.rx_dv.eq(self.gmii.rx_dv), rx.rx_er.eq(self.gmii.rx_er),
        ]
        # A skid buffer of bytes between the receive packet FIFO and the packer: the FIFO's
        # read (the MAC's room accounting takes it a clock later) then starts at flip-flops by
        # the FIFO instead of at the packer's ready, which the placer puts by the core (from
        # the read across the die to the FIFO's write pointer it was 9.7 ns routed on the
        # ECPIX-5 core at 2c5ea0a, a 132-tile net). 1 eth_rx clock of latency.
        m.submodules.rx_byte_reg = rx_byte_reg = DomainRenamer("eth_rx")(SkidBuffer(BYTE_LAYOUT))
        wiring.connect(m, rx.o, rx_byte_reg.i)
        wiring.connect(m, rx_byte_reg.o, pack.i)
        # Timing: registers in front of the ports in ``sync``, so no path leaves MacCore or runs
        # from one FIFO's read side to the other's write side (the board shell echoes m_axis_rx
        # into s_axis_tx). 1 clock each. (Both packet FIFOs register their block RAM's output:
        # its clock-to-output alone is 5.8 of a speed-6 ECP5's 8 ns.)
        # Only committed frames reach the packer, so back-pressure here is harmless: it fills
        # the receive packet FIFO, where whole frames are dropped.
        # A skid buffer between the packer and the asynchronous FIFO: the FIFO's write side
        # (``w_rdy`` from the gray-code pointer compare) lands in flip-flops instead of running
        # through the packer's ready into the packet FIFO's read side. On the routed ECPIX-5
        # core (2026-12-07) that chain was eth_rx's worst path (10.05 ns, 8.3 of it wire): the
        # FIFO sits by the core, the packet FIFO by its block RAM. 1 eth_rx clock of latency.
        m.submodules.rx_beat_reg = rx_beat_reg = DomainRenamer("eth_rx")(SkidBuffer(beat))
        wiring.connect(m, pack.o, rx_beat_reg.i)
        m.d.comb += [
            rx_cdc.w_data.eq(rx_beat_reg.o.payload),
            rx_cdc.w_en.eq(rx_beat_reg.o.valid),
            rx_beat_reg.o.ready.eq(rx_cdc.w_rdy),
        ]
        m.submodules.rx_axis_reg = rx_axis_reg = SkidBuffer(beat)
        m.d.comb += [
            rx_axis_reg.i.valid.eq(rx_cdc.r_rdy),
            rx_axis_reg.i.payload.eq(rx_cdc.r_data),
            rx_cdc.r_en.eq(rx_axis_reg.i.ready),
        ]
        rx_beat = rx_axis_reg.o.payload
        m.d.comb += [
            self.m_axis_rx.tvalid.eq(rx_axis_reg.o.valid),
            self.m_axis_rx.tdata.eq(rx_beat.data),
            self.m_axis_rx.tkeep.eq(rx_beat.keep),
            self.m_axis_rx.tlast.eq(rx_beat.last),
            rx_axis_reg.o.ready.eq(self.m_axis_rx.tready),
        ]

        # --- transmit: sync -> eth_tx --------------------------------------------------------
        m.submodules.tx_cdc = tx_cdc = AsyncFIFO(width=beat.size, depth=self.cdc_depth,
                                                 w_domain="sync", r_domain="eth_tx")
        m.submodules.tx_axis_reg = tx_axis_reg = SkidBuffer(beat)
        tx_in = tx_axis_reg.i.payload
        m.d.comb += [
            tx_in.data.eq(self.s_axis_tx.tdata),
            tx_in.keep.eq(self.s_axis_tx.tkeep),
            tx_in.last.eq(self.s_axis_tx.tlast),
            tx_axis_reg.i.valid.eq(self.s_axis_tx.tvalid),
            self.s_axis_tx.tready.eq(tx_axis_reg.i.ready),
            tx_cdc.w_data.eq(tx_axis_reg.o.payload),
            tx_cdc.w_en.eq(tx_axis_reg.o.valid),
            tx_axis_reg.o.ready.eq(tx_cdc.w_rdy),
        ]
        # Timing: a skid buffer on each side of the unpacker, so that neither the asynchronous
        # FIFO's read side (pointer increment, gray code, LUT-RAM read) nor the packet FIFO's
        # full check is chained through the unpacker's ready logic (that chain was 11.0 ns on a
        # speed-6 ECP5). Each adds a clock of latency and keeps one byte per clock.
        m.submodules.tx_beat_reg = beat_reg = DomainRenamer("eth_tx")(SkidBuffer(beat))
        m.d.comb += [
            beat_reg.i.valid.eq(tx_cdc.r_rdy),
            beat_reg.i.payload.eq(tx_cdc.r_data),
            tx_cdc.r_en.eq(beat_reg.i.ready),
        ]
        m.submodules.tx_unpack = unpack = DomainRenamer("eth_tx")(ByteUnpacker(W))
        wiring.connect(m, beat_reg.o, unpack.i)
        m.submodules.tx_byte_reg = byte_reg = DomainRenamer("eth_tx")(SkidBuffer(BYTE_LAYOUT))
        wiring.connect(m, unpack.o, byte_reg.i)
        m.submodules.tx_fifo = tx_fifo = DomainRenamer("eth_tx")(
            PacketFifo(BYTE_LAYOUT, self.tx_fifo_bytes, out_reg=True))
        wiring.connect(m, byte_reg.o, tx_fifo.i)
        m.d.comb += tx_fifo.i_drop.eq(0)
        m.submodules.tx = tx = DomainRenamer("eth_tx")(GmiiTx(ifg=self.ifg))
        wiring.connect(m, tx_fifo.o, tx.i)
        m.d.comb += [
            self.gmii.txd.eq(tx.txd), self.gmii.tx_en.eq(tx.tx_en), self.gmii.tx_er.eq(tx.tx_er),
        ]
        tx_dropped = Signal()
        m.d.comb += tx_dropped.eq(tx_fifo.i_overflow & tx_fifo.i.valid & tx_fifo.i.ready
                                  & tx_fifo.i.payload.last)

        # --- counters into sync -------------------------------------------------------------
        # Events are at least a minimum frame apart (84 byte times), far slower than a toggle
        # synchronizer needs.
        sources = {"rx": rx, "tx": tx}
        for name, side, port in _COUNTER_SOURCES:
            domain = "eth_rx" if side == "rx" else "eth_tx"
            ps = PulseSynchronizer(i_domain=domain, o_domain="sync")
            m.submodules[f"cnt_{name}"] = ps
            pulse = tx_dropped if port == "dropped" else getattr(sources[side], port)
            m.d.comb += [ps.i.eq(pulse), getattr(self.counters, name).eq(ps.o)]
        return m
