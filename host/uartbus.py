"""``UartBus``: the host driver's register access over the UART control bridge
(``stellar.hdl.bridge.uart.UartBridge``), for boards without PCIe.

It offers what the driver's table code expects of a bus (``stellar.host.tables``): ``async
read32(offset)`` and ``async write32(offset, value)`` on the 16-bit CSR space. Underneath is a
byte channel, :class:`ByteTransport`, with two implementations:

* :class:`SerialTransport`: a serial port through pyserial, imported only when one is opened
  (pyserial is not a dependency of this project; without it the error says to
  ``pip install pyserial``). Blocking pyserial calls run in a worker thread under asyncio.
* :class:`SimTransport`: four async callables supplied by a simulation (cocotb coroutines, or
  an Amaranth testbench's) that move bytes through a UART bit-level model or the bridge's byte
  interface. Nothing here imports cocotb, amaranth or asyncio-only primitives in that path, so
  ``UartBus`` runs inside any coroutine-driven simulator.

Protocol (the bridge's docstring is the reference)::

    write: 'W' a0 a1 d0 d1 d2 d3  ->  'W' status
    read:  'R' a0 a1              ->  'R' status d0 d1 d2 d3
    status: 0 OKAY, 2 SLVERR, 3 DECERR (the AXI response)

Errors speak: a refused access raises :class:`UartBusResponseError` naming the operation,
address and response; a response that does not arrive in time or does not parse raises
:class:`UartBusTimeout` / :class:`UartBusProtocolError` after the bus resynchronized (waited
out the bridge's idle timeout and the longest response, then discarded what it received), so
the next access starts clean. Accesses are never retried behind the caller's back: a write to a
command register is not idempotent. These errors are ``DeviceError`` instances from
``stellar.host.errors`` (codes E5101..E5104) and still ``RuntimeError`` instances.

``UartBus`` is a :class:`stellar.host.device.Device`: the driver awaits it like the PCIe
backends. A board has no DMA to host memory and no interrupt line on the UART, so
``alloc_dma`` / ``map_dma`` raise :class:`~stellar.host.errors.DeviceMemoryOnly` (the board's
device memory regions take their place) and ``wait_irq`` raises
:class:`~stellar.host.errors.IrqUnavailable` (poll the status registers instead).
"""

import abc
import asyncio

from .device import PAGE_SIZE, Device
from .errors import DeviceError, DeviceMemoryOnly, IrqUnavailable

__all__ = ["CMD_WRITE", "CMD_READ", "STATUS_NAMES", "UartBusError", "UartBusTimeout",
           "UartBusProtocolError", "UartBusResponseError", "ByteTransport", "SerialTransport",
           "SimTransport", "UartBus"]

CMD_WRITE = 0x57   # 'W'
CMD_READ = 0x52    # 'R'
STATUS_NAMES = {0: "OKAY", 1: "EXOKAY", 2: "SLVERR", 3: "DECERR"}


class UartBusError(DeviceError, RuntimeError):
    """Base of every error the UART bus raises."""

    code = "E5101"


class UartBusTimeout(UartBusError):
    """The bridge did not answer (in full) in time."""

    code = "E5102"


class UartBusProtocolError(UartBusError):
    """The bridge's answer did not parse (a lost or corrupted byte)."""

    code = "E5103"


class UartBusResponseError(UartBusError):
    """The bridge executed the access and the bus answered with an error response."""

    code = "E5104"

    def __init__(self, op, addr, status):
        name = STATUS_NAMES.get(status, f"unknown status {status:#04x}")
        hint = ("the address is unmapped or the register cannot be written (ro/counter); "
                "`python -m stellar.hdl.regmap --json` lists the map" if status == 2 else
                "no device decodes this address" if status == 3 else
                "the bridge reported a status the protocol does not define")
        super().__init__(f"UART bridge: {op} at {addr:#06x} answered {name}", fix=hint, op=op,
                         addr=addr, status=status)


class ByteTransport(abc.ABC):
    """A byte channel to the bridge."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send ``data``."""

    @abc.abstractmethod
    async def read(self, count: int, timeout: float) -> bytes:
        """Up to ``count`` bytes; fewer only if ``timeout`` seconds pass first."""

    @abc.abstractmethod
    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of line time pass (simulated or real)."""

    @abc.abstractmethod
    async def discard_input(self) -> None:
        """Drop every byte received and not yet read."""


def _import_serial():
    try:
        import serial  # pyserial
    except ImportError:
        raise UartBusError("the UART control bridge needs pyserial to open a serial port, and it "
                           "is not installed: `pip install pyserial` (or pass an open pyserial-like "
                           "object as the port)") from None
    return serial


class SerialTransport(ByteTransport):
    """A serial port. ``port``: a device name (``"/dev/ttyUSB1"``, opened with pyserial at
    ``baudrate``, 8N1) or an already open pyserial-like object (``read``, ``write``,
    ``timeout``, ``reset_input_buffer``). Blocking calls run in a worker thread."""

    def __init__(self, port, baudrate=115200):
        if isinstance(port, str):
            serial = _import_serial()
            port = serial.Serial(port, baudrate, bytesize=8, parity="N", stopbits=1, timeout=0.1)
        self.port = port

    async def write(self, data):
        await asyncio.to_thread(self._write, bytes(data))

    def _write(self, data):
        self.port.write(data)
        flush = getattr(self.port, "flush", None)
        if flush is not None:
            flush()

    async def read(self, count, timeout):
        self.port.timeout = timeout
        return bytes(await asyncio.to_thread(self.port.read, count))

    async def sleep(self, seconds):
        await asyncio.sleep(seconds)

    async def discard_input(self):
        self.port.reset_input_buffer()

    def close(self):
        close = getattr(self.port, "close", None)
        if close is not None:
            close()


class SimTransport(ByteTransport):
    """A simulation's byte channel from four async callables: ``write(data)``,
    ``read(count, timeout) -> bytes`` (fewer bytes on timeout, in simulated seconds),
    ``sleep(seconds)`` and ``discard_input()``. They may be cocotb coroutines (driving a UART
    model on the bridge's pins) or an Amaranth testbench's; this class only forwards, so the
    bus runs on whatever scheduler awaits it."""

    def __init__(self, *, write, read, sleep, discard_input):
        self._write, self._read, self._sleep, self._discard = write, read, sleep, discard_input

    async def write(self, data):
        await self._write(bytes(data))

    async def read(self, count, timeout):
        return bytes(await self._read(count, timeout))

    async def sleep(self, seconds):
        await self._sleep(seconds)

    async def discard_input(self):
        await self._discard()


class UartBus(Device):
    """``read32``/``write32`` over the UART bridge (a :class:`~stellar.host.device.Device`
    without DMA or interrupts).

    Parameters
    ----------
    transport : ByteTransport
    baudrate : int
        Line rate, for the default timeouts (10 bits per byte).
    timeout : float
        Seconds allowed for a whole response after the command was sent; default: the
        response's line time x 4 + 50 ms (USB-serial adapters batch their input).
    bridge_timeout : float
        The bridge's idle timeout in seconds (``UartBridge``'s ``timeout`` / clock rate);
        default 64 byte times, the bridge's default.
    """

    def __init__(self, transport, *, baudrate=115200, timeout=None, bridge_timeout=None):
        self.transport = transport
        byte_time = 10 / baudrate
        self.timeout = 6 * byte_time * 4 + 0.05 if timeout is None else timeout
        self.bridge_timeout = 64 * byte_time if bridge_timeout is None else bridge_timeout
        self.byte_time = byte_time

    async def read32(self, offset):
        addr = self._check_addr(offset)
        await self.transport.write(bytes([CMD_READ]) + addr.to_bytes(2, "little"))
        reply = await self._reply(6, "read32", addr)
        if reply[1] != 0:
            raise UartBusResponseError("read32", addr, reply[1])
        return int.from_bytes(reply[2:6], "little")

    async def write32(self, offset, value):
        addr = self._check_addr(offset)
        if not 0 <= value < 1 << 32:
            raise ValueError(f"write32 value {value!r} does not fit in 32 bits")
        await self.transport.write(bytes([CMD_WRITE]) + addr.to_bytes(2, "little")
                                   + value.to_bytes(4, "little"))
        reply = await self._reply(2, "write32", addr)
        if reply[1] != 0:
            raise UartBusResponseError("write32", addr, reply[1])

    def alloc_dma(self, size, align=PAGE_SIZE):
        raise DeviceMemoryOnly(f"alloc_dma({size}): a board behind the UART bridge has no DMA "
                               "to host memory")

    def map_dma(self, obj):
        raise DeviceMemoryOnly(f"map_dma({type(obj).__name__}): a board behind the UART bridge "
                               "has no DMA to host memory")

    def unmap_dma(self, buf):
        raise DeviceMemoryOnly("unmap_dma: a board behind the UART bridge maps no host memory")

    async def wait_irq(self, vector, timeout=None):
        raise IrqUnavailable(f"wait_irq({vector}): the UART bridge carries no interrupts",
                             fix="poll the completion / status registers instead (read32)",
                             vector=vector)

    async def close(self):
        """Close the transport (a serial port); a simulation's transport has nothing to close."""
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()

    async def resync(self):
        """Bring the bridge and this side back in step: wait until the bridge abandoned any
        partial command and finished any response, then drop what arrived."""
        await self.transport.sleep(self.bridge_timeout + 8 * self.byte_time)
        await self.transport.discard_input()

    @staticmethod
    def _check_addr(offset):
        if not (isinstance(offset, int) and 0 <= offset < 1 << 16 and offset % 4 == 0):
            raise ValueError(f"CSR offset {offset!r} is not a 4-byte-aligned address below 0x10000")
        return offset

    async def _reply(self, length, op, addr):
        reply = await self.transport.read(length, self.timeout)
        cmd = CMD_READ if op == "read32" else CMD_WRITE
        if len(reply) < length:
            await self.resync()
            raise UartBusTimeout(
                f"UART bridge: {op} at {addr:#06x}: {len(reply)} of {length} response bytes "
                f"within {self.timeout:.3f} s ({reply.hex() or 'nothing'}); check the cable, the "
                f"port and that the baud rate matches the bitstream's divisor")
        if reply[0] != cmd:
            await self.resync()
            raise UartBusProtocolError(
                f"UART bridge: {op} at {addr:#06x}: response starts with {reply[0]:#04x}, not "
                f"{cmd:#04x} ({reply.hex()}); a byte was lost or another program uses the port. "
                f"The bus resynchronized; retry the access")
        return reply
