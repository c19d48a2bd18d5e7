# Ref: 8N1 asynchronous serial framing; ARM IHI 0022E part B (AXI4-Lite)
"""stellar.hdl.bridge.uart + stellar.host.uartbus: the UART control bridge in the Amaranth
simulator against the real CSR bank, driven by a bit-level UART model written here from the 8N1
framing rules (start bit low, 8 data bits LSB first, stop bit high; sampled mid-bit), and the
host backend over that model and over a fake serial port.

The register target is ``AxiLiteCsrBank`` with a small map (ident + pktengine): ``ident.id`` is
``MAGIC``, ``ident.scratch`` read/write, ``ident.id`` read-only (a write answers SLVERR), offset
0x0F0 unmapped (SLVERR).
"""

import asyncio
import sys

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from stellar.hdl.bridge.uart import UartBridge
from stellar.hdl.csr import AxiLiteCsrBank
from stellar.hdl.regmap import MAGIC, VERSION, RegisterMap, encode_version, pktengine_block
from stellar.host.uartbus import (
    SerialTransport,
    SimTransport,
    UartBus,
    UartBusError,
    UartBusProtocolError,
    UartBusResponseError,
    UartBusTimeout,
)

REGMAP = RegisterMap([pktengine_block()])
ID = REGMAP["ident.id"].offset
VERSION_REG = REGMAP["ident.version"].offset
SCRATCH = REGMAP["ident.scratch"].offset
UNMAPPED = 0x00F0
DIVISOR = 8            # clocks per bit
PERIOD = 1e-8          # 100 MHz: the line runs at 12.5 Mbaud in simulation
TIMEOUT = 640 * DIVISOR
assert UNMAPPED not in {r.offset for r in REGMAP}


class BridgeHarness(wiring.Component):
    rx: In(1, init=1)
    tx: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = bridge = UartBridge(DIVISOR, timeout=TIMEOUT)
        m.submodules.csr = csr = AxiLiteCsrBank(REGMAP)
        wiring.connect(m, bridge.m_axil, csr.s_axil)
        m.d.comb += [bridge.rx.eq(self.rx), self.tx.eq(bridge.tx)]
        return m


class UartModel:
    """The far end of the line: sends 8N1 frames on ``rx`` (``DIVISOR`` clocks per bit) and a
    background process receives every frame on ``tx`` into ``received``."""

    def __init__(self, dut):
        self.dut = dut
        self.received = bytearray()
        self.framing_errors = 0
        self.ctx = None

    async def monitor(self, ctx):
        while True:
            await ctx.negedge(self.dut.tx)
            await ctx.tick().repeat(DIVISOR // 2)
            if ctx.get(self.dut.tx):
                continue                       # not a start bit
            value = 0
            for i in range(8):
                await ctx.tick().repeat(DIVISOR)
                value |= ctx.get(self.dut.tx) << i
            await ctx.tick().repeat(DIVISOR)
            if not ctx.get(self.dut.tx):
                self.framing_errors += 1
            self.received.append(value)

    async def write(self, data, *, stop=1):
        for b in data:
            for v in [0] + [(b >> i) & 1 for i in range(8)] + [stop]:
                self.ctx.set(self.dut.rx, v)
                await self.ctx.tick().repeat(DIVISOR)
        self.ctx.set(self.dut.rx, 1)

    async def read(self, count, timeout):
        for _ in range(round(timeout / PERIOD)):
            if len(self.received) >= count:
                break
            await self.ctx.tick()
        out = bytes(self.received[:count])
        del self.received[:count]
        return out

    async def sleep(self, seconds):
        await self.ctx.tick().repeat(max(1, round(seconds / PERIOD)))

    async def discard_input(self):
        self.received.clear()

    def transport(self):
        return SimTransport(write=self.write, read=self.read, sleep=self.sleep,
                            discard_input=self.discard_input)

    def bus(self):
        # 200 us for a response: generous against the 6-byte line time (4.8 us).
        return UartBus(self.transport(), baudrate=round(1 / (PERIOD * DIVISOR)), timeout=200e-6,
                       bridge_timeout=TIMEOUT * PERIOD)


def simulate(body):
    """Run ``await body(model)`` against the bridge and the CSR bank."""
    dut = BridgeHarness()
    model = UartModel(dut)
    sim = Simulator(dut)
    sim.add_clock(PERIOD)

    async def bench(ctx):
        model.ctx = ctx
        await ctx.tick().repeat(4)
        await body(model)

    sim.add_testbench(model.monitor, background=True)
    sim.add_testbench(bench)
    sim.run()
    assert model.framing_errors == 0
    return model


def w(addr, value):
    return bytes([0x57]) + addr.to_bytes(2, "little") + value.to_bytes(4, "little")


def r(addr):
    return bytes([0x52]) + addr.to_bytes(2, "little")


def test_raw_protocol_bytes():
    """Byte-exact answers from the protocol spec: write -> 'W' 00; read -> 'R' 00 + data LE;
    unmapped read -> 'R' 02 + zeros; write to the read-only id -> 'W' 02 (and id unchanged);
    bytes other than 'W'/'R' between commands are ignored."""
    replies = []

    async def body(model):
        for cmd, n in [(w(SCRATCH, 0x12345678), 2), (r(SCRATCH), 6), (r(ID), 6),
                       (r(UNMAPPED), 6), (w(ID, 0xDEADBEEF), 2), (b"\x00\xff\x13" + r(ID), 6)]:
            await model.write(cmd)
            replies.append(await model.read(n, 100e-6))

    simulate(body)
    assert replies == [
        b"\x57\x00",
        b"\x52\x00" + (0x12345678).to_bytes(4, "little"),
        b"\x52\x00" + MAGIC.to_bytes(4, "little"),
        b"\x52\x02" + bytes(4),
        b"\x57\x02",
        b"\x52\x00" + MAGIC.to_bytes(4, "little"),
    ]


def test_uartbus_ident_and_scratch():
    """The host backend over the bit-level model: ident.id is MAGIC, ident.version the gateware
    version, ident.scratch keeps what is written."""
    seen = {}

    async def body(model):
        bus = model.bus()
        seen["id"] = await bus.read32(ID)
        seen["version"] = await bus.read32(VERSION_REG)
        for value in (0x5A5A1234, 0xFFFFFFFF, 0):
            await bus.write32(SCRATCH, value)
            seen[value] = await bus.read32(SCRATCH)

    simulate(body)
    assert seen["id"] == MAGIC
    assert seen["version"] == encode_version(*VERSION)
    assert all(seen[v] == v for v in (0x5A5A1234, 0xFFFFFFFF, 0))


def test_uartbus_error_status():
    """SLVERR from the bank becomes UartBusResponseError naming the operation, address and
    response; the bus stays usable afterwards."""
    errors = []
    after = []

    async def body(model):
        bus = model.bus()
        for call in (bus.write32(ID, 1), bus.read32(UNMAPPED)):
            try:
                await call
            except UartBusResponseError as exc:
                errors.append(exc)
        after.append(await bus.read32(ID))

    simulate(body)
    assert [(e.op, e.addr, e.status) for e in errors] == [("write32", ID, 2), ("read32", UNMAPPED, 2)]
    assert "SLVERR" in str(errors[0]) and f"{ID:#06x}" in str(errors[0])
    assert after == [MAGIC]


def test_truncated_command_recovery():
    """A half-sent write ('W' and 3 of its 6 argument bytes) is abandoned after the bridge's
    idle timeout: the next command is parsed from its own first byte and the half write never
    happens. A read issued right after a half-sent command (no pause) is absorbed as argument
    bytes: the host sees a timeout, resynchronizes, and its next read works."""
    seen = {}

    async def body(model):
        bus = model.bus()
        await bus.write32(SCRATCH, 0x11111111)
        await model.write(w(SCRATCH, 0x22222222)[:4])
        await model.sleep((TIMEOUT + 10) * PERIOD)
        seen["after_pause"] = await bus.read32(SCRATCH)
        await model.write(w(SCRATCH, 0x33333333)[:3])
        try:
            await bus.read32(SCRATCH)
        except UartBusTimeout as exc:
            seen["timeout"] = str(exc)
        seen["after_resync"] = await bus.read32(SCRATCH)
        seen["id"] = await bus.read32(ID)

    simulate(body)
    assert seen["after_pause"] == 0x11111111
    assert "timeout" in seen and "0 of 6" in seen["timeout"]
    assert seen["after_resync"] == 0x11111111
    assert seen["id"] == MAGIC


def test_framing_error_byte_dropped():
    """A frame with a low stop bit is dropped by the receiver (no command starts from it); the
    following command is answered normally."""
    replies = []

    async def body(model):
        await model.write(b"\x52", stop=0)       # 'R' with a broken stop bit
        await model.write(b"\x00")               # would be an address byte if 'R' had counted
        await model.sleep(4 * DIVISOR * PERIOD)
        await model.write(r(ID))
        replies.append(await model.read(6, 100e-6))
        replies.append(await model.read(1, 20e-6))

    simulate(body)
    assert replies == [b"\x52\x00" + MAGIC.to_bytes(4, "little"), b""]


# --- host side only: SerialTransport ---------------------------------------------------------

class FakeSerial:
    """A pyserial-like port with the bridge protocol modelled in Python (registers in a dict;
    offsets not in it answer SLVERR), and an optional corrupted reply."""

    def __init__(self, regs, *, corrupt=False):
        self.regs = dict(regs)
        self.pending = bytearray()
        self.timeout = None
        self.corrupt = corrupt
        self.resets = 0

    def write(self, data):
        if data[0] == 0x57:
            addr, value = int.from_bytes(data[1:3], "little"), int.from_bytes(data[3:7], "little")
            ok = addr in self.regs
            if ok:
                self.regs[addr] = value
            self.pending += bytes([0x57, 0 if ok else 2])
        else:
            addr = int.from_bytes(data[1:3], "little")
            status = 0 if addr in self.regs else 2
            self.pending += bytes([0x52, status]) + self.regs.get(addr, 0).to_bytes(4, "little")
        if self.corrupt:
            self.pending[0] ^= 0xFF
            self.corrupt = False

    def read(self, count):
        out = bytes(self.pending[:count])
        del self.pending[:count]
        return out

    def reset_input_buffer(self):
        self.resets += 1
        self.pending.clear()


def test_serial_transport_with_fake_port():
    """UartBus over SerialTransport on a pyserial-like object: reads and writes, an error
    status, and a corrupted reply (protocol error, input discarded, next access fine)."""
    port = FakeSerial({0: MAGIC, 8: 0})
    bus = UartBus(SerialTransport(port), baudrate=1_000_000, bridge_timeout=0.0)

    async def run():
        assert await bus.read32(0) == MAGIC
        await bus.write32(8, 0xCAFEF00D)
        assert await bus.read32(8) == 0xCAFEF00D
        with pytest.raises(UartBusResponseError, match="SLVERR"):
            await bus.write32(0x40, 1)
        port.corrupt = True
        with pytest.raises(UartBusProtocolError, match="resynchronized"):
            await bus.read32(0)
        assert port.resets == 1
        assert await bus.read32(0) == MAGIC

    asyncio.run(run())


def test_serial_transport_without_pyserial(monkeypatch):
    """Opening a port by name without pyserial installed says how to fix it."""
    monkeypatch.setitem(sys.modules, "serial", None)
    with pytest.raises(UartBusError, match="pip install pyserial"):
        SerialTransport("/dev/ttyUSB0")


def test_bad_arguments():
    bus = UartBus(SerialTransport(FakeSerial({})))
    for call in (bus.read32(2), bus.read32(0x10000), bus.write32(0, 1 << 32)):
        with pytest.raises(ValueError):
            asyncio.run(call)
