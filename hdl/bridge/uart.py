# Ref: TIA-232-F / common 8N1 asynchronous serial framing; ARM IHI 0022E part B (AXI4-Lite)
"""UART (8N1) and the UART -> AXI4-Lite control bridge for boards without PCIe.

Why hand-written: the Amaranth core library has no UART and amaranth-stdio is not a dependency
of this project (not in ``.venv``); 8N1 at a fixed divisor is a few dozen lines.

``UartRx(divisor)``: ``rx`` In(1) (the pin, asynchronous: synchronized here, idle high) ->
``o`` Out(stream.Signature(8)), one byte per frame; ``framing_error`` Out(1) pulses for a frame
whose stop bit is low (the byte is dropped; reception resumes once the line is high again).
Bits are sampled mid-bit: the start bit is confirmed ``divisor // 2`` clocks after the falling
edge (a shorter low glitch is ignored), each later bit ``divisor`` clocks apart, so a sender
within about +-4 % of the rate is received. A byte not taken from ``o`` before the next one
is complete is overwritten (``overrun`` pulses); the bridge always keeps up.

``UartTx(divisor)``: ``i`` In(stream.Signature(8)) -> ``tx`` Out(1, init=1): start bit, 8 data
bits LSB first, stop bit, ``divisor`` clocks each; a waiting byte starts 1 clock after the stop bit.

``divisor`` is clocks per bit: ``clk_hz // baud`` (125 MHz / 115200 -> 1085).

``UartBridge(divisor, timeout=...)``: ``rx`` In(1), ``tx`` Out(1), ``m_axil``
Out(AxiLiteSignature(16)) (AXI4-Lite manager, 32-bit data; connect to ``NicCore.s_axil`` /
``AxiLiteCsrBank.s_axil``). Protocol (bytes on the line; multi-byte fields little-endian)::

    write:  host -> 0x57 'W', addr[7:0], addr[15:8], data[7:0], .., data[31:24]   (7 bytes)
            dev  -> 0x57, status                                                   (2 bytes)
    read:   host -> 0x52 'R', addr[7:0], addr[15:8]                                (3 bytes)
            dev  -> 0x52, status, data[7:0], .., data[31:24]                       (6 bytes)

``status`` is the AXI response of the access: 0 OKAY, 2 SLVERR (the CSR bank's answer for an
unmapped address or a write to a read-only register; read data is then 0), 3 DECERR. Writes use
``wstrb`` 0xF and ``awprot``/``arprot`` 0. One command executes at a time; bytes arriving
meanwhile wait in a 16-byte FIFO, but a host sends one command and waits for its response.

Resynchronization: in the idle state, a byte that is not 'W' or 'R' is ignored. A command whose
next byte does not arrive within ``timeout`` clocks of the previous one is abandoned and the
parser returns to idle, so a host that lost track (a half-sent command, a response it gave up
on) waits for ``timeout`` of silence plus the longest response (6 bytes), discards what it
received, and starts afresh. ``timeout`` defaults to 64 byte times (``640 * divisor`` clocks,
5.6 ms at 115200 baud). An access the bus never answers is not timed out: the AXI4-Lite
protocol gives no way to abandon it, and the CSR bank always answers.

Latency: the response's first bit starts 1 clock after the AXI response handshake; a CSR
access (bank: 1 clock for a write, 3 for a read, handshake to response) is dwarfed by the line
time (a read is 90 bit times end to end).
"""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..axil import AxiLiteSignature

__all__ = ["CMD_WRITE", "CMD_READ", "UartRx", "UartTx", "UartBridge"]

CMD_WRITE = 0x57   # 'W'
CMD_READ = 0x52    # 'R'


class UartRx(wiring.Component):
    """8N1 receiver (see the module docstring)."""

    rx:            In(1, init=1)
    o:             Out(stream.Signature(8))
    framing_error: Out(1)
    overrun:       Out(1)

    def __init__(self, divisor):
        if divisor < 4:
            raise ValueError(f"divisor {divisor} is below 4 clocks per bit")
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(self.divisor))
        bits = Signal(range(9))
        shreg = Signal(8)
        tick = timer == 0

        m.d.sync += [self.framing_error.eq(0), self.overrun.eq(0)]
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(~tick):
            m.d.sync += timer.eq(timer - 1)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~rx):
                    m.d.sync += timer.eq(self.divisor // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(tick):
                    with m.If(rx):
                        m.next = "IDLE"       # a glitch, not a start bit
                    with m.Else():
                        m.d.sync += [timer.eq(self.divisor - 1), bits.eq(0)]
                        m.next = "DATA"
            with m.State("DATA"):
                with m.If(tick):
                    m.d.sync += [shreg.eq(Cat(shreg[1:], rx)), bits.eq(bits + 1),
                                 timer.eq(self.divisor - 1)]
                    with m.If(bits == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(tick):
                    with m.If(rx):
                        m.d.sync += [self.o.payload.eq(shreg), self.o.valid.eq(1),
                                     self.overrun.eq(self.o.valid & ~self.o.ready)]
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += self.framing_error.eq(1)
                        m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(rx):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """8N1 transmitter (see the module docstring)."""

    i:  In(stream.Signature(8))
    tx: Out(1, init=1)

    def __init__(self, divisor):
        if divisor < 2:
            raise ValueError(f"divisor {divisor} is below 2 clocks per bit")
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.divisor))
        frame = Signal(10, init=1)      # bits still to send, LSB next; stop bit in the MSB
        left = Signal(range(11))
        m.d.comb += self.i.ready.eq(left == 0)
        with m.If(left == 0):
            with m.If(self.i.valid):
                m.d.sync += [frame.eq(Cat(Const(0, 1), self.i.payload, Const(1, 1))),
                             left.eq(10), timer.eq(self.divisor - 1), self.tx.eq(0)]
        with m.Elif(timer == 0):
            m.d.sync += [frame.eq(frame[1:]), left.eq(left - 1), timer.eq(self.divisor - 1)]
            with m.If(left != 1):
                m.d.sync += self.tx.eq(frame[1])
        with m.Else():
            m.d.sync += timer.eq(timer - 1)
        return m


class UartBridge(wiring.Component):
    """UART -> AXI4-Lite manager speaking the protocol of the module docstring.

    Parameters: ``divisor`` (clocks per bit), ``timeout`` (clocks of silence that abandon a
    partial command; default ``640 * divisor``), ``addr_width`` (AXI address bits, <= 16).
    Ports: ``rx`` In(1), ``tx`` Out(1), ``m_axil`` Out(AxiLiteSignature(addr_width)).
    """

    def __init__(self, divisor, *, timeout=None, addr_width=16):
        if not 1 <= addr_width <= 16:
            raise ValueError(f"the protocol carries 16-bit addresses; addr_width {addr_width} does not fit")
        self.divisor = divisor
        self.timeout = 640 * divisor if timeout is None else timeout
        self.addr_width = addr_width
        super().__init__({
            "rx":     In(1, init=1),
            "tx":     Out(1, init=1),
            "m_axil": Out(AxiLiteSignature(addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart_rx = urx = UartRx(self.divisor)
        m.submodules.uart_tx = utx = UartTx(self.divisor)
        m.submodules.rx_fifo = fifo = SyncFIFOBuffered(width=8, depth=16)
        m.d.comb += [
            urx.rx.eq(self.rx),
            self.tx.eq(utx.tx),
            fifo.w_data.eq(urx.o.payload),
            fifo.w_en.eq(urx.o.valid),
            urx.o.ready.eq(fifo.w_rdy),
        ]

        bus = self.m_axil
        byte = fifo.r_data
        is_write = Signal()
        args = [Signal(8, name=f"arg{k}") for k in range(6)]   # addr lo, hi, data 0..3
        index = Signal(range(6))
        idle = Signal(range(self.timeout + 1))
        addr = Cat(args[0], args[1])[:self.addr_width]
        wdata = Cat(*args[2:])
        aw_done, w_done = Signal(), Signal()
        resp = [Signal(8, name=f"resp{k}") for k in range(6)]
        resp_len = Signal(range(7))
        sent = Signal(range(7))

        m.d.comb += [
            bus.awaddr.eq(addr), bus.araddr.eq(addr), bus.wdata.eq(wdata), bus.wstrb.eq(0xF),
            bus.awprot.eq(0), bus.arprot.eq(0),
        ]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += fifo.r_en.eq(1)
                m.d.sync += [index.eq(0), idle.eq(0)]
                with m.If(fifo.r_rdy):
                    with m.If(byte == CMD_WRITE):
                        m.d.sync += is_write.eq(1)
                        m.next = "ARGS"
                    with m.Elif(byte == CMD_READ):
                        m.d.sync += is_write.eq(0)
                        m.next = "ARGS"
            with m.State("ARGS"):
                m.d.comb += fifo.r_en.eq(1)
                with m.If(fifo.r_rdy):
                    m.d.sync += [idle.eq(0), index.eq(index + 1)]
                    for k in range(6):
                        with m.If(index == k):
                            m.d.sync += args[k].eq(byte)
                    with m.If(index == 5):
                        m.next = "WRITE"
                    with m.Elif((index == 1) & ~is_write):
                        m.next = "READ"
                with m.Elif(idle == self.timeout):
                    m.next = "IDLE"            # a half-sent command: forget it
                with m.Else():
                    m.d.sync += idle.eq(idle + 1)
            with m.State("WRITE"):
                m.d.comb += [bus.awvalid.eq(~aw_done), bus.wvalid.eq(~w_done)]
                aw_ok = aw_done | bus.awready
                w_ok = w_done | bus.wready
                m.d.sync += [aw_done.eq(aw_ok), w_done.eq(w_ok)]
                with m.If(aw_ok & w_ok):
                    m.d.sync += [aw_done.eq(0), w_done.eq(0)]
                    m.next = "WRITE_RESP"
            with m.State("WRITE_RESP"):
                m.d.comb += bus.bready.eq(1)
                with m.If(bus.bvalid):
                    m.d.sync += [resp[0].eq(CMD_WRITE), resp[1].eq(bus.bresp), resp_len.eq(2),
                                 sent.eq(0)]
                    m.next = "RESPOND"
            with m.State("READ"):
                m.d.comb += bus.arvalid.eq(1)
                with m.If(bus.arready):
                    m.next = "READ_RESP"
            with m.State("READ_RESP"):
                m.d.comb += bus.rready.eq(1)
                with m.If(bus.rvalid):
                    m.d.sync += [resp[0].eq(CMD_READ), resp[1].eq(bus.rresp), resp_len.eq(6),
                                 sent.eq(0)]
                    for k in range(4):
                        m.d.sync += resp[2 + k].eq(bus.rdata[8 * k:8 * k + 8])
                    m.next = "RESPOND"
            with m.State("RESPOND"):
                m.d.comb += [utx.i.valid.eq(1), utx.i.payload.eq(resp[0])]
                with m.If(utx.i.ready):
                    m.d.sync += [Cat(*resp).eq(Cat(*resp[1:], Const(0, 8))), sent.eq(sent + 1)]
                    with m.If(sent == resp_len - 1):
                        m.next = "IDLE"
        return m
