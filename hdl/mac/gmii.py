# Ref: IEEE 802.3-2018 clause 3 (MAC frame: preamble, SFD, minimum size, FCS), clause 4.4.2
#      (interFrameGap 96 bit times), clause 35 (GMII: TXD/TX_EN/TX_ER, RXD/RX_DV/RX_ER)
"""GMII Ethernet MAC, 8 bits per clock: framing, padding, FCS and the receive-side drop logic.

Both halves are written for the ``sync`` domain; ``stellar.hdl.mac.cdc.MacCore`` renames them
into the PHY's clock domains (``eth_tx``, ``eth_rx``), 125 MHz at 1 GbE (one byte per clock).

Frames are ``BYTE_LAYOUT`` streams (``data`` 8 bits, ``last`` on a frame's final byte) carrying
the Ethernet frame from the destination address to the end of the payload, without FCS.

``GmiiTx``: a frame on ``i`` goes out as 7 x 0x55 + 0xD5 (preamble, SFD), the frame's bytes,
zero padding up to 60 bytes, the FCS (CRC-32 of frame and padding, ``amaranth.lib.crc``
catalog ``CRC32_ETHERNET``, least significant byte first), then ``ifg`` idle clocks (>= 12 byte
times) before the next preamble.
  ``i``            In   stream of ``BYTE_LAYOUT``. Once a frame's first byte is taken the
                        source must offer one byte per clock until ``last`` (MacCore feeds it
                        from a store-and-forward FIFO, so it always does). A missing byte is
                        sent as an error symbol (TX_EN and TX_ER high) so the link partner
                        discards the frame, and ``underrun`` pulses.
  ``txd``, ``tx_en``, ``tx_er``   Out   GMII transmit, registered.
  ``sent``         Out  one-clock pulse per frame, with its last FCS byte.
  ``underrun``     Out  one-clock pulse per missing byte (see ``i``).
Latency: the first preamble byte is on ``txd`` 1 clock after ``i.valid`` rises (when idle).

``GmiiRx``: bytes after the SFD while RX_DV is high form a frame (its last 4 bytes the FCS).
The preamble may be short (any number of 0x55, even none, before 0xD5). Frames come out of a
store-and-forward packet FIFO (``stellar.hdl.pktfifo.PacketFifo``), so a frame is delivered
whole, without its FCS, or not at all. Each frame received ends in exactly one of these
one-clock pulses (priority in this order when several apply):
  ``phy_error``    RX_ER during the frame, or RX_DV without a valid preamble/SFD
  ``oversize``     more than ``max_frame`` bytes (FCS included)
  ``runt``         fewer than 64 bytes (FCS included)
  ``fcs_error``    FCS mismatch
  ``overrun``      good, but the FIFO had no room for it (the reader is back-pressured)
  ``frame``        good and queued for ``o``.
Pulses come 2 clocks after RX_DV falls (input register included).
  ``rxd``, ``rx_dv``, ``rx_er``   In   GMII receive (registered here before use).
  ``o``            Out  stream of ``BYTE_LAYOUT``: good frames without FCS, in order.
The wire cannot be stalled: when ``o`` is back-pressured long enough for the FIFO to fill, the
frame being received is dropped whole (``overrun``); frames already queued are untouched. A
frame of n bytes (without FCS) is kept exactly when the bytes queued and not yet read plus n fit
in ``fifo_depth``, so a short frame may still fit after a long one was dropped.
Parameters: ``max_frame`` (bytes with FCS, default 1522: 1500-byte payload with a VLAN tag),
``fifo_depth`` (bytes, power of two, >= ``max_frame``). Latency: a frame's first byte is on ``o``
4 clocks after RX_DV falls at its end (store and forward; the FIFO's output register included).
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.lib.wiring import In, Out

from ..pktfifo import PacketFifo

__all__ = ["BYTE_LAYOUT", "PREAMBLE", "SFD", "MIN_FRAME", "GmiiSignature", "GmiiTx", "GmiiRx"]

BYTE_LAYOUT = data.StructLayout({"data": 8, "last": 1})
PREAMBLE = 0x55
SFD = 0xD5
MIN_FRAME = 64      # bytes with FCS; a shorter frame is padded (TX) or a runt (RX)
FCS_BYTES = 4


class GmiiSignature(wiring.Signature):
    """GMII seen from the MAC: ``txd`` (8), ``tx_en``, ``tx_er`` out; ``rxd`` (8), ``rx_dv``,
    ``rx_er`` in. The transmit signals belong to the transmit clock domain, the receive signals
    to the receive clock domain (at 1 GbE the PHY's RX_CLK)."""

    def __init__(self):
        super().__init__({
            "txd":   Out(8),
            "tx_en": Out(1),
            "tx_er": Out(1),
            "rxd":   In(8),
            "rx_dv": In(1),
            "rx_er": In(1),
        })


class GmiiTx(wiring.Component):
    """GMII transmitter (see the module docstring). Parameter: ``ifg``, idle clocks between
    frames (default 12, the minimum 802.3 allows)."""

    i:        In(stream.Signature(BYTE_LAYOUT))
    txd:      Out(8)
    tx_en:    Out(1)
    tx_er:    Out(1)
    sent:     Out(1)
    underrun: Out(1)

    def __init__(self, *, ifg=12):
        if ifg < 12:
            raise ValueError(f"an inter-frame gap of {ifg} byte times is below the 802.3 minimum of 12")
        self.ifg = ifg
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC32_ETHERNET(8).create()

        data_min = MIN_FRAME - FCS_BYTES          # 60 bytes of frame + padding
        length = Signal(range(data_min + 1))      # bytes sent so far, saturating at 60
        count = Signal(range(max(8, self.ifg)))   # preamble, FCS and gap position
        long_enough = length >= data_min - 1      # the byte going out now reaches 60

        m.d.sync += [self.sent.eq(0), self.underrun.eq(0)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += [self.tx_en.eq(0), self.tx_er.eq(0), self.txd.eq(0)]
                with m.If(self.i.valid):
                    m.d.sync += [self.tx_en.eq(1), self.txd.eq(PREAMBLE), count.eq(1)]
                    m.next = "PREAMBLE"
            with m.State("PREAMBLE"):
                m.d.sync += [self.txd.eq(Mux(count == 7, SFD, PREAMBLE)), count.eq(count + 1),
                             length.eq(0)]
                m.d.comb += crc.start.eq(1)
                with m.If(count == 7):
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.comb += [crc.valid.eq(1), crc.data.eq(self.i.payload.data)]
                    m.d.sync += [self.txd.eq(self.i.payload.data), self.tx_er.eq(0)]
                    with m.If(~long_enough):
                        m.d.sync += length.eq(length + 1)
                    with m.If(self.i.payload.last):
                        m.d.sync += count.eq(0)
                        with m.If(long_enough):
                            m.next = "FCS"
                        with m.Else():
                            m.next = "PAD"
                with m.Else():
                    # Error propagation (802.3 35.2.2.5): the partner drops the frame.
                    m.d.sync += [self.txd.eq(0), self.tx_er.eq(1), self.underrun.eq(1)]
            with m.State("PAD"):
                m.d.comb += [crc.valid.eq(1), crc.data.eq(0)]
                m.d.sync += [self.txd.eq(0), length.eq(length + 1)]
                with m.If(long_enough):
                    m.next = "FCS"
            with m.State("FCS"):
                # The CRC register holds the CRC of everything fed so far (1 clock latency).
                m.d.sync += [self.txd.eq(crc.crc.word_select(count[:2], 8)), count.eq(count + 1)]
                with m.If(count == FCS_BYTES - 1):
                    m.d.sync += [count.eq(0), self.sent.eq(1)]
                    m.next = "GAP"
            with m.State("GAP"):
                m.d.sync += [self.tx_en.eq(0), self.tx_er.eq(0), self.txd.eq(0),
                             count.eq(count + 1)]
                with m.If(count == self.ifg - 1):
                    m.next = "IDLE"
        return m


class GmiiRx(wiring.Component):
    """GMII receiver (see the module docstring)."""

    rxd:       In(8)
    rx_dv:     In(1)
    rx_er:     In(1)
    o:         Out(stream.Signature(BYTE_LAYOUT))
    frame:     Out(1)
    fcs_error: Out(1)
    phy_error: Out(1)
    runt:      Out(1)
    oversize:  Out(1)
    overrun:   Out(1)

    def __init__(self, *, max_frame=1522, fifo_depth=4096):
        if max_frame < MIN_FRAME:
            raise ValueError(f"max_frame {max_frame} is below the {MIN_FRAME}-byte minimum frame")
        if fifo_depth < max_frame or fifo_depth & (fifo_depth - 1):
            raise ValueError(f"fifo_depth {fifo_depth} must be a power of two >= max_frame {max_frame}")
        self.max_frame = max_frame
        self.fifo_depth = fifo_depth
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC32_ETHERNET(8).create()
        # out_reg: the FIFO's block RAM output goes into a register first (timing).
        m.submodules.fifo = fifo = PacketFifo(BYTE_LAYOUT, self.fifo_depth, out_reg=True)
        wiring.connect(m, fifo.o, wiring.flipped(self.o))

        # Input register: the GMII pins (or the RGMII decoder) feed nothing else.
        d, dv, er = Signal(8), Signal(), Signal()
        m.d.sync += [d.eq(self.rxd), dv.eq(self.rx_dv), er.eq(self.rx_er)]

        # The FCS is only recognisable once RX_DV falls, so bytes leave through a 5-byte delay
        # line: when RX_DV falls, the oldest byte held is the frame's last one before the FCS
        # and goes into the FIFO with `last` and the verdict.
        delay = [Signal(8, name=f"delay{k}") for k in range(FCS_BYTES + 1)]
        oldest = delay[-1]
        count = Signal(range(self.max_frame + 1))   # bytes after the SFD, FCS included (saturating)
        bad_er = Signal()          # RX_ER seen in this frame
        big = Signal()             # more than max_frame bytes
        ovr = Signal()             # a byte of this frame found no room: the frame is lost
        written = Signal()         # bytes of this frame are in the FIFO, uncommitted

        for name in ("frame", "fcs_error", "phy_error", "runt", "oversize", "overrun"):
            m.d.sync += getattr(self, name).eq(0)

        # count >= FCS_BYTES + 1 and count >= MIN_FRAME as flags set when count gets there,
        # rather than compares in front of the FIFO's write pointer (timing).
        filled = Signal()          # the delay line is full: count >= FCS_BYTES + 1
        long_enough = Signal()     # count >= MIN_FRAME
        in_data = Signal()
        slot = in_data & dv & filled   # a byte leaves the delay line
        end = in_data & ~dv
        runt = ~long_enough
        fcs_bad = ~crc.match_detected
        bad = bad_er | big | runt | fcs_bad

        # Room is tracked here rather than taken from the FIFO's `ready`: `used` counts
        # committed bytes not yet read out, `pend` this frame's uncommitted ones. A byte is
        # written only while one entry stays free after it, so the frame's closing write (commit,
        # or `last` with drop to roll the write pointer back over a lost frame's bytes) always
        # finds room, and a lost frame gives its space back at once. A frame of n bytes is thus
        # kept exactly when used + n <= fifo_depth.
        #
        # Timing (125 MHz on a speed-6 ECP5): `room` is not computed from `used + pend` in the
        # clock it is needed (adder, compare, then the FIFO's write pointer: 10.1 ns). Instead
        # the sum of the previous clock is compared against three thresholds into registers,
        # and the clock's own change (a byte written, a byte read, both or neither, also
        # registered) picks the right one: used + pend now = previous sum + written - read, so
        # the answer is the exact one, one LUT after flip-flops. The identity does not hold in
        # the clocks right after a frame's end (commit, pend cleared), but no byte is written
        # then: the next write needs an SFD and 5 bytes in the delay line first. The commit
        # itself is registered as well and added to `used` a clock later (pend is still held
        # then), out of the way of the FCS verdict.
        D = self.fifo_depth
        used = Signal(range(D + 1))
        pend = Signal(range(D + 1))
        level = Signal(range(2 * D + 1))
        m.d.comb += level.eq(used + pend)
        le_d3, le_d2, le_d1 = Signal(), Signal(), Signal()   # previous level <= D - 3/2/1
        m.d.sync += [le_d3.eq(level <= D - 3), le_d2.eq(level <= D - 2), le_d1.eq(level <= D - 1)]
        wrote, was_read = Signal(), Signal()
        room = Signal()
        m.d.comb += room.eq(Mux(wrote, Mux(was_read, le_d2, le_d3), Mux(was_read, le_d1, le_d2)))
        read = fifo.o.valid & fifo.o.ready
        commit = Signal()
        commit_r = Signal()
        end_write = end & filled & (written | ~(ovr | big))
        m.d.comb += fifo.i.payload.data.eq(oldest)
        m.d.sync += [wrote.eq(0), was_read.eq(read), commit_r.eq(commit)]
        with m.If(slot & ~ovr & ~big):
            with m.If(room):
                m.d.comb += fifo.i.valid.eq(1)
                m.d.sync += [written.eq(1), pend.eq(pend + 1), wrote.eq(1)]
            with m.Else():
                m.d.sync += ovr.eq(1)
        with m.If(end_write):
            m.d.comb += [fifo.i.valid.eq(1), fifo.i.payload.last.eq(1),
                         fifo.i_drop.eq(bad | ovr), commit.eq(~(bad | ovr))]
        m.d.sync += used.eq(used + Mux(commit_r, pend + 1, 0) - read)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(dv):
                    with m.If(er):
                        m.next = "SKIP"
                    with m.Elif(d == SFD):
                        m.next = "DATA"
                    with m.Elif(d == PREAMBLE):
                        m.next = "PREAMBLE"
                    with m.Else():
                        m.next = "SKIP"
            with m.State("PREAMBLE"):
                with m.If(~dv):
                    m.d.sync += self.phy_error.eq(1)
                    m.next = "IDLE"
                with m.Elif(er):
                    m.next = "SKIP"
                with m.Elif(d == SFD):
                    m.next = "DATA"
                with m.Elif(d != PREAMBLE):
                    m.next = "SKIP"
            with m.State("SKIP"):
                with m.If(~dv):
                    m.d.sync += self.phy_error.eq(1)
                    m.next = "IDLE"
            with m.State("DATA"):
                m.d.comb += in_data.eq(1)
                with m.If(dv):
                    m.d.comb += [crc.valid.eq(1), crc.data.eq(d)]
                    m.d.sync += [Cat(*delay).eq(Cat(d, *delay[:-1])), bad_er.eq(bad_er | er)]
                    with m.If(count >= self.max_frame):
                        m.d.sync += big.eq(1)
                    with m.Else():
                        m.d.sync += count.eq(count + 1)
                        with m.If(count == FCS_BYTES):
                            m.d.sync += filled.eq(1)
                        with m.If(count == MIN_FRAME - 1):
                            m.d.sync += long_enough.eq(1)
                with m.Else():
                    lost = ovr
                    with m.If(bad_er):
                        m.d.sync += self.phy_error.eq(1)
                    with m.Elif(big):
                        m.d.sync += self.oversize.eq(1)
                    with m.Elif(runt):
                        m.d.sync += self.runt.eq(1)
                    with m.Elif(fcs_bad):
                        m.d.sync += self.fcs_error.eq(1)
                    with m.Elif(lost):
                        m.d.sync += self.overrun.eq(1)
                    with m.Else():
                        m.d.sync += self.frame.eq(1)
                    m.next = "IDLE"
        # Outside DATA every per-frame register is cleared, so a frame starts clean.
        with m.If(~in_data):
            m.d.comb += crc.start.eq(1)
            m.d.sync += [count.eq(0), bad_er.eq(0), big.eq(0), ovr.eq(0), written.eq(0), pend.eq(0),
                         filled.eq(0), long_enough.eq(0)]
        return m
