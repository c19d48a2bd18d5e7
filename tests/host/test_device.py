"""stellar.host.device: zero-copy DMA views (numpy, bytearray, mmap; read-only and strided
buffers refused), the bus-address allocator, the Device base's checks, the SyncDevice facade
(its own loop thread, concurrent callers serialized, re-entrancy refused, close), and the UART
bus as a Device without DMA or interrupts."""

import asyncio
import mmap
import threading

import numpy as np
import pytest
from stellar.host.device import PAGE_SIZE, Device, DmaBuffer, IovaAllocator, SyncDevice, dma_view
from stellar.host.errors import (
    BufferNotMappable,
    DeviceClosed,
    DeviceMemoryOnly,
    DmaMappingError,
    IrqTimeout,
    IrqUnavailable,
)

# --- dma_view --------------------------------------------------------------------------


def _same_memory(view, obj):
    """Writing through the view shows in obj: no copy was made."""
    view[0] = 0xA5
    view[-1] = 0x5A
    raw = memoryview(obj).cast("B")
    return raw[0] == 0xA5 and raw[-1] == 0x5A


def test_dma_view_zero_copy_on_numpy_bytearray_mmap():
    a = np.zeros((4, 8), dtype=np.float32)
    v = dma_view(a)
    assert v.format == "B" and v.nbytes == a.nbytes and _same_memory(v, a)
    assert a.view(np.uint8).reshape(-1)[0] == 0xA5
    b = bytearray(100)
    assert _same_memory(dma_view(b), b)
    m = mmap.mmap(-1, 8192)
    v = dma_view(m)
    assert v.nbytes == 8192 and _same_memory(v, m)
    with pytest.raises(BufferError):
        m.close()                  # exported while mapped: cannot vanish under the device
    v.release()
    m.close()
    structured = np.zeros(3, dtype=[("a", "<u4"), ("b", "<f8")])
    assert dma_view(structured).nbytes == structured.nbytes


def test_dma_view_keeps_bytearray_from_resizing():
    b = bytearray(64)
    v = dma_view(b)
    with pytest.raises(BufferError):
        b.extend(b"x")
    v.release()
    b.extend(b"x")


@pytest.mark.parametrize("obj, reason", [
    (b"bytes are immutable", "read-only"),
    (np.zeros(16, np.uint8)[::2], "not contiguous"),
    (np.zeros((4, 4), np.uint32).T, "not contiguous"),
    (bytearray(), "empty"),
    (12345, "buffer protocol"),
])
def test_dma_view_refuses_without_copying(obj, reason):
    with pytest.raises(BufferNotMappable, match=reason) as info:
        dma_view(obj)
    assert info.value.code == "E1002" and "Fix:" in str(info.value)


def test_dma_view_refuses_readonly_numpy_and_mmap():
    a = np.zeros(8)
    a.flags.writeable = False
    with pytest.raises(BufferNotMappable, match="read-only"):
        dma_view(a)
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)
    with pytest.raises(BufferNotMappable, match="read-only"):
        dma_view(m)
    m.close()


# --- IovaAllocator -----------------------------------------------------------------------

def test_iova_allocator_alignment_floor_and_merge():
    alloc = IovaAllocator([(0, (1 << 32) - 1)])
    a = alloc.alloc(4096)
    assert a == 1 << 20                          # nothing below the floor: 0 is never valid
    b = alloc.alloc(100, align=1 << 16)
    assert b % (1 << 16) == 0 and b > a
    c = alloc.alloc(1 << 21, align=1 << 21)
    assert c % (1 << 21) == 0
    total = alloc.free_bytes
    for addr in (b, a, c):
        alloc.free(addr)
    assert alloc.free_bytes == total + 4096 + 100 + (1 << 21)
    assert alloc._free == [[1 << 20, 1 << 32]]     # merged back into one range


def test_iova_allocator_ranges_and_exhaustion():
    alloc = IovaAllocator([(0x100000, 0x1FFFFF), (0x400000, 0x400FFF)], floor=0)
    assert alloc.alloc(0x100000) == 0x100000
    assert alloc.alloc(0x1000) == 0x400000
    with pytest.raises(DmaMappingError, match="no free 4096-byte bus address range"):
        alloc.alloc(0x1000)
    with pytest.raises(ValueError):
        alloc.alloc(64, align=3)


# --- a Device for the facade tests -------------------------------------------------------

class MemoryDevice(Device):
    """BAR0 in a bytearray, DMA buffers in host memory at allocator addresses, interrupts
    raised by ``raise_irq``: enough to exercise the facade and the base class."""

    bar_size = 4096

    def __init__(self):
        self.bar = bytearray(self.bar_size)
        self.iova = IovaAllocator([(0, (1 << 40) - 1)])
        self.events = {}
        self.closed = 0
        self.loop_threads = set()
        self.active = 0
        self.max_active = 0

    async def read32(self, offset):
        self._check_offset(offset)
        self.loop_threads.add(threading.current_thread().name)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        await asyncio.sleep(0)
        self.active -= 1
        return int.from_bytes(self.bar[offset:offset + 4], "little")

    async def write32(self, offset, value):
        self._check_offset(offset)
        self._check_value(value)
        self.bar[offset:offset + 4] = value.to_bytes(4, "little")

    def alloc_dma(self, size, align=PAGE_SIZE):
        return DmaBuffer(self, self.iova.alloc(size, align), memoryview(bytearray(size)))

    def map_dma(self, obj):
        view = dma_view(obj)
        return DmaBuffer(self, self.iova.alloc(view.nbytes), view, obj=obj)

    def unmap_dma(self, buf):
        self.iova.free(buf.bus_addr)
        buf.release()

    def _event(self, vector):
        return self.events.setdefault(vector, asyncio.Event())

    def raise_irq(self, vector):
        self._event(vector).set()

    async def wait_irq(self, vector, timeout=None):
        event = self._event(vector)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            raise IrqTimeout(f"vector {vector}", vector=vector) from None
        event.clear()
        return 1

    async def close(self):
        self.closed += 1


def test_device_base_checks():
    dev = MemoryDevice()
    with pytest.raises(ValueError, match="multiple of 4"):
        asyncio.run(dev.read32(2))
    with pytest.raises(ValueError, match="outside BAR0"):
        asyncio.run(dev.read32(4096))
    with pytest.raises(ValueError, match="32 bits"):
        asyncio.run(dev.write32(0, 1 << 32))

    async def ctx():
        async with dev as d:
            await d.write32(8, 0xDEADBEEF)
            return await d.read32(8)
    assert asyncio.run(ctx()) == 0xDEADBEEF and dev.closed == 1


def test_dma_buffer_attributes():
    dev = MemoryDevice()
    buf = dev.alloc_dma(1000, align=1 << 16)
    assert buf.bus_addr % (1 << 16) == 0 and buf.size == len(buf) == 1000
    assert buf.bus(10) == buf.bus_addr + 10
    with pytest.raises(ValueError):
        buf.bus(1001)
    buf.view[:4] = b"abcd"
    arr = np.arange(16, dtype=np.uint32)
    m = dev.map_dma(arr)
    m.view[0:4] = (7).to_bytes(4, "little")
    assert arr[0] == 7 and m.obj is arr
    dev.unmap_dma(m)
    assert "unmapped" in repr(m)


def test_sync_device_runs_on_its_own_loop_thread():
    dev = MemoryDevice()
    with SyncDevice(dev) as sync:
        sync.write32(0x10, 0x12345678)
        assert sync.read32(0x10) == 0x12345678
        buf = sync.alloc_dma(64)
        assert isinstance(buf, DmaBuffer)
        sync.unmap_dma(buf)
        assert sync.run(dev.read32(0x10)) == 0x12345678
        assert dev.loop_threads == {"stellar-sync-device"}
        # interrupts: one raised from the loop, then a timeout
        sync.run(_call_soon(dev.raise_irq, 3))
        assert sync.wait_irq(3, timeout=1) == 1
        with pytest.raises(IrqTimeout):
            sync.wait_irq(3, timeout=0.01)
    assert dev.closed == 1
    sync.close()                       # idempotent
    assert dev.closed == 1
    with pytest.raises(DeviceClosed):
        sync.read32(0)


async def _call_soon(fn, *args):
    fn(*args)


def test_sync_device_serializes_concurrent_threads():
    dev = MemoryDevice()
    sync = SyncDevice(dev)
    for i in range(16):
        sync.write32(4 * i, i * 3)
    results, errors = [], []

    def worker(k):
        try:
            for i in range(16):
                results.append(sync.read32(4 * ((i + k) % 16)))
        except Exception as exc:       # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sync.close()
    assert not errors and sorted(results) == sorted([i * 3 for i in range(16)] * 4)
    assert dev.max_active == 1          # one call at a time on the device


def test_sync_device_refuses_reentry_and_accepts_factories():
    async def make():
        return MemoryDevice()

    sync = SyncDevice(make)
    assert isinstance(sync.device, MemoryDevice)

    async def reenter():
        return sync.read32(0)          # a coroutine on the facade's own loop calling it

    with pytest.raises(RuntimeError, match="own event loop"):
        sync.run(reenter())
    # usable from inside another loop (it blocks that loop for the call)

    async def elsewhere():
        return sync.read32(0)
    assert asyncio.run(elsewhere()) == 0
    sync.close()
    sync2 = SyncDevice(MemoryDevice)   # a plain callable returning a Device
    assert isinstance(sync2.device, MemoryDevice)
    sync2.close()


def test_device_is_abstract():
    class Half(Device):
        async def read32(self, offset):
            return 0

    with pytest.raises(TypeError):
        Half()


# --- the UART bus as a Device ------------------------------------------------------------

class _LoopbackTransport:
    """Answers every UART bridge command with OKAY (reads return 0x11223344)."""

    def __init__(self):
        self.pending = b""
        self.closed = False

    async def write(self, data):
        self.pending += (b"R\x00\x44\x33\x22\x11" if data[0] == 0x52 else b"W\x00")

    async def read(self, count, timeout):
        out, self.pending = self.pending[:count], self.pending[count:]
        return out

    async def sleep(self, seconds):
        pass

    async def discard_input(self):
        self.pending = b""

    def close(self):
        self.closed = True


def test_uartbus_is_a_device_without_dma_or_irq():
    from stellar.host.uartbus import UartBus
    transport = _LoopbackTransport()
    bus = UartBus(transport)
    assert isinstance(bus, Device)
    with pytest.raises(DeviceMemoryOnly, match="no DMA to host memory") as info:
        bus.alloc_dma(4096)
    assert info.value.code == "E1004" and "device memory" in str(info.value)
    with pytest.raises(DeviceMemoryOnly):
        bus.map_dma(bytearray(16))
    with pytest.raises(IrqUnavailable, match="poll"):
        asyncio.run(bus.wait_irq(0))
    with SyncDevice(bus) as sync:
        assert sync.read32(0) == 0x11223344
        sync.write32(8, 5)
    assert transport.closed
