"""The abstract device every host-driver backend implements, DMA buffers, and a sync facade.

The driver is transport-agnostic and async (DESIGN.md): the verbs layer, the table code
(``stellar.host.tables``) and the QoS code await a :class:`Device` and never know whether it
is a simulated PCIe device (``stellar.sim.pcie``), a real one through VFIO
(``stellar.host.vfio``) or a board behind the UART bridge (``stellar.host.uartbus``)::

    async read32(offset) -> int          BAR0 register read (32-bit, 4-byte aligned offset)
    async write32(offset, value)         BAR0 register write
    alloc_dma(size, align=4096)          -> DmaBuffer: new host memory the device can reach
    map_dma(obj)                         -> DmaBuffer over an existing buffer, zero-copy
    unmap_dma(buf)                       the device can no longer reach buf
    async wait_irq(vector, timeout=None) -> int: interrupts seen on the vector since the last wait
    async close()

A :class:`DmaBuffer` has ``bus_addr`` (what the device puts in its DMA requests: an IOVA behind
an IOMMU, a simulated bus address in simulation), ``size`` and ``view``: a writable ``memoryview``
of format ``'B'`` on the very memory the device reads and writes. Nothing is ever copied:
``map_dma(numpy_array)`` gives a view on the array's own memory, so the device's writes show in
the array and the program's writes reach the device.

``map_dma`` takes any object with the buffer protocol (numpy array, bytearray, mmap, memoryview,
ctypes array) and refuses, with :class:`~stellar.host.errors.BufferNotMappable`, a read-only
buffer (``bytes``, a read-only numpy array or mmap) or a non-contiguous one (a strided numpy
slice): using either would need a hidden copy. While mapped, the buffer stays exported, so a
bytearray cannot be resized and an mmap cannot be closed under the device's feet (Python raises
``BufferError``); ``unmap_dma`` releases it.

:class:`SyncDevice` runs the async API for scripts and the CLI on its own event loop, in a
thread of its own; see its docstring for the thread-safety rules.
"""

import abc
import asyncio
import bisect
import ctypes
import threading

from .errors import BufferNotMappable, DeviceClosed, DmaMappingError

__all__ = ["DmaBuffer", "Device", "SyncDevice", "IovaAllocator", "dma_view", "PAGE_SIZE"]

PAGE_SIZE = 4096


def dma_view(obj):
    """A writable, contiguous byte view (``memoryview`` of format ``'B'``) on ``obj``'s own
    memory, or :class:`BufferNotMappable` saying why there cannot be one without a copy."""
    try:
        view = memoryview(obj)
    except TypeError:
        raise BufferNotMappable(f"{type(obj).__name__} does not support the buffer protocol",
                                buffer_type=type(obj).__name__) from None
    if view.readonly:
        view.release()
        raise BufferNotMappable(f"the {type(obj).__name__} buffer is read-only: the device could "
                                "not write it, and mapping a copy would hide its writes",
                                buffer_type=type(obj).__name__)
    if not view.c_contiguous:
        strides = view.strides
        view.release()
        raise BufferNotMappable(f"the {type(obj).__name__} buffer is not contiguous (strides "
                                f"{strides}): DMA needs one linear range",
                                buffer_type=type(obj).__name__)
    if view.nbytes == 0:
        view.release()
        raise BufferNotMappable(f"the {type(obj).__name__} buffer is empty",
                                fix="map a buffer of at least one byte",
                                buffer_type=type(obj).__name__)
    if view.format != "B" or view.ndim != 1:
        # a reinterpretation of the same memory, never a copy
        try:
            return view.cast("B")
        except (TypeError, ValueError):
            # a format memoryview will not cast: view the same bytes through ctypes
            nbytes = view.nbytes
            view.release()
            return memoryview((ctypes.c_ubyte * nbytes).from_buffer(obj)).cast("B")
    return view


class DmaBuffer:
    """Host memory the device can reach by DMA.

    Attributes
    ----------
    bus_addr : int
        The address of ``view[0]`` as the device sees it.
    size : int
        Bytes.
    view : memoryview
        Writable, format ``'B'``, on the memory itself.
    device : Device
        The device it was allocated or mapped on.
    obj
        The object passed to ``map_dma`` (kept alive while mapped); None for ``alloc_dma``.
    """

    def __init__(self, device, bus_addr, view, *, obj=None, backing=None):
        self.device = device
        self.bus_addr = bus_addr
        self.view = view
        self.size = view.nbytes
        self.obj = obj
        self.backing = backing       # backend-specific: the mapping, the pinned memory
        self.mapped = True

    def __len__(self):
        return self.size

    def __repr__(self):
        state = "" if self.mapped else ", unmapped"
        return f"DmaBuffer(bus_addr={self.bus_addr:#x}, size={self.size}{state})"

    def bus(self, offset=0):
        """Bus address of byte ``offset`` (bounds-checked)."""
        if not 0 <= offset <= self.size:
            raise ValueError(f"offset {offset} outside the {self.size}-byte DMA buffer")
        return self.bus_addr + offset

    def release(self):
        """Drop the view (the backend calls this from ``unmap_dma``)."""
        self.mapped = False
        self.view.release()


class Device(abc.ABC):
    """What the driver needs of a device; the module docstring lists the interface.

    Implementations must make ``read32``/``write32`` single 32-bit accesses (a register with
    side effects on read or write sees exactly one), and may assume offsets are 4-byte
    aligned inside BAR0 (``_check_offset`` raises ``ValueError`` otherwise).

    A device is an async context manager: ``async with open_device() as dev: ...`` closes it.
    """

    #: bytes of BAR0 (``read32`` / ``write32`` range); set by the backend
    bar_size = None

    @abc.abstractmethod
    async def read32(self, offset):
        """Read the 32-bit register at byte ``offset`` of BAR0."""

    @abc.abstractmethod
    async def write32(self, offset, value):
        """Write the 32-bit register at byte ``offset`` of BAR0."""

    @abc.abstractmethod
    def alloc_dma(self, size, align=PAGE_SIZE):
        """New zeroed host memory of ``size`` bytes the device can reach, its bus address
        aligned to ``align`` (a power of two). Returns a :class:`DmaBuffer`."""

    @abc.abstractmethod
    def map_dma(self, obj):
        """Make the memory of the buffer-protocol object ``obj`` reachable by the device,
        zero-copy. Returns a :class:`DmaBuffer` whose ``view`` is on ``obj``'s memory."""

    @abc.abstractmethod
    def unmap_dma(self, buf):
        """The device can no longer reach ``buf``; memory from ``alloc_dma`` is freed."""

    @abc.abstractmethod
    async def wait_irq(self, vector, timeout=None):
        """Wait for interrupt ``vector``; return how many arrived since the last wait on it
        (at least 1). ``timeout`` in seconds; :class:`~stellar.host.errors.IrqTimeout`
        when it passes."""

    @abc.abstractmethod
    async def close(self):
        """Release everything (interrupts, DMA mappings, the BAR mapping, file descriptors).
        Calling it twice is harmless."""

    # --- shared helpers ----------------------------------------------------------------

    def _check_offset(self, offset):
        if not isinstance(offset, int) or offset < 0 or offset % 4:
            raise ValueError(f"register offset {offset!r} is not a non-negative multiple of 4")
        if self.bar_size is not None and offset + 4 > self.bar_size:
            raise ValueError(f"register offset {offset:#x} is outside BAR0 ({self.bar_size:#x} "
                             "bytes)")
        return offset

    @staticmethod
    def _check_value(value):
        if not isinstance(value, int) or not 0 <= value < 1 << 32:
            raise ValueError(f"write32 value {value!r} does not fit in 32 bits")
        return value

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class IovaAllocator:
    """Bus (IO virtual) address space for a backend that chooses the addresses itself: the
    VFIO type1 and iommufd backends (inside the ranges the IOMMU allows) and simulated host
    memory. First fit over sorted free ranges, ``align``-aligned, freed ranges merge again.

    ``ranges``: ``[(start, last), ...]`` inclusive, as the kernel reports them; addresses
    below ``floor`` are never handed out (bus address 0 is kept unused so that a zeroed
    descriptor never points at a valid buffer).
    """

    def __init__(self, ranges, *, floor=1 << 20):
        self._free = []          # sorted [start, end) pairs
        for start, last in sorted(ranges):
            start = max(start, floor)
            if last + 1 > start:
                self._free.append([start, last + 1])
        self.used = {}           # start -> size

    def alloc(self, size, align=PAGE_SIZE):
        if size <= 0:
            raise ValueError(f"cannot allocate {size} bytes of bus address space")
        if align <= 0 or align & (align - 1):
            raise ValueError(f"alignment {align} is not a power of two")
        for i, (start, end) in enumerate(self._free):
            addr = (start + align - 1) & -align
            if addr + size <= end:
                pieces = []
                if addr > start:
                    pieces.append([start, addr])
                if addr + size < end:
                    pieces.append([addr + size, end])
                self._free[i:i + 1] = pieces
                self.used[addr] = size
                return addr
        raise DmaMappingError(f"no free {size}-byte bus address range aligned to {align:#x} "
                              f"({sum(e - s for s, e in self._free)} bytes free in "
                              f"{len(self._free)} ranges)",
                              fix="unmap buffers no longer in use, or map fewer / smaller ones")

    def free(self, addr):
        size = self.used.pop(addr)
        end = addr + size
        i = bisect.bisect_left(self._free, [addr, end])
        self._free.insert(i, [addr, end])
        # merge with the neighbours
        if i + 1 < len(self._free) and self._free[i][1] == self._free[i + 1][0]:
            self._free[i][1] = self._free.pop(i + 1)[1]
        if i > 0 and self._free[i - 1][1] == self._free[i][0]:
            self._free[i - 1][1] = self._free.pop(i)[1]

    @property
    def free_bytes(self):
        return sum(e - s for s, e in self._free)


class SyncDevice:
    """Blocking facade over an async :class:`Device`, for scripts and the CLI::

        with SyncDevice(VfioDevice("0000:03:00.0")) as dev:
            print(hex(dev.read32(0)))
            buf = dev.alloc_dma(1 << 20)
            dev.run(Tables(dev.device).config())      # any coroutine of the async driver

    It owns an event loop that runs in a daemon thread of its own; every call is submitted
    to that loop and waited for. Hence:

    * Thread safety: any number of threads may call one ``SyncDevice``; the calls are
      serialized on its loop by a lock (one call runs to its end before the next starts, so
      a multi-step coroutine given to ``run`` is not interleaved with another thread's
      calls). ``wait_irq`` does not take the lock: a thread waiting for an interrupt does not
      hold up register access from the others. The wrapped device must not be used directly
      elsewhere at the same time (its async resources, such as interrupt readers, belong to
      this loop).
    * It may be used from inside another event loop's coroutine (it blocks that loop for the
      duration of the call), but not from a coroutine running on its own loop (that would
      wait for itself): such a call raises ``RuntimeError``.
    * A forgotten ``close`` leaks nothing at exit: the loop thread is a daemon thread, and
      the kernel releases a VFIO device's resources when the process ends.
    * Not for simulations: a cocotb or Amaranth device is driven by the simulator's scheduler,
      which this thread cannot advance; await those devices directly.

    ``device``: a :class:`Device`, or a coroutine function / callable returning an awaitable
    that produces one (it then runs on this loop, so a backend that binds loop resources at
    open time gets the right loop). ``timeout``: seconds any one call may take (None: no
    limit; ``wait_irq`` has its own).
    """

    def __init__(self, device, *, timeout=None):
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stellar-sync-device",
                                        daemon=True)
        self._thread.start()
        self._closed = False
        self._lock = None            # an asyncio.Lock, made on the loop at first use
        try:
            if isinstance(device, Device):
                self.device = device
            else:
                self.device = self._submit(self._make(device), None)
        except BaseException:
            self._stop()
            raise

    @staticmethod
    async def _make(factory):
        made = factory()
        if asyncio.iscoroutine(made) or isinstance(made, asyncio.Future):
            made = await made
        return made

    def _submit(self, coro, timeout):
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SyncDevice called from a coroutine on its own event loop: await "
                               "the async device (sync.device) there instead")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def run(self, awaitable, timeout=None):
        """Run any coroutine of the async driver on this device's loop, under the facade's lock,
        and return its result."""
        if self._closed or threading.current_thread() is self._thread:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            if self._closed:
                raise DeviceClosed("the SyncDevice is closed")
        return self._submit(self._locked(awaitable),
                            timeout if timeout is not None else self.timeout)

    async def _locked(self, awaitable):
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await awaitable

    @staticmethod
    async def _wrap(awaitable):
        return await awaitable

    async def _call(self, fn, *args):
        return fn(*args)

    def _sync(self, fn, *args):
        return self.run(self._call(fn, *args))

    # --- the Device interface, blocking ----------------------------------------------------

    def read32(self, offset):
        return self.run(self.device.read32(offset))

    def write32(self, offset, value):
        return self.run(self.device.write32(offset, value))

    def alloc_dma(self, size, align=PAGE_SIZE):
        return self._sync(self.device.alloc_dma, size, align)

    def map_dma(self, obj):
        return self._sync(self.device.map_dma, obj)

    def unmap_dma(self, buf):
        return self._sync(self.device.unmap_dma, buf)

    def wait_irq(self, vector, timeout=None):
        # the device enforces its own timeout; the facade's limit is not added on top
        if self._closed:
            raise DeviceClosed("the SyncDevice is closed")
        return self._submit(self._wrap(self.device.wait_irq(vector, timeout)), None)

    def close(self):
        """Close the device and stop the loop thread. Idempotent."""
        if self._closed:
            return
        try:
            self._submit(self._locked(self.device.close()), self.timeout)
        finally:
            self._closed = True
            self._stop()

    def _stop(self):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
