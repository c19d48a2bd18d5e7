# Ref: ARM IHI 0022E "AMBA AXI and ACE Protocol Specification" (AXI4 write channels, WSTRB).
"""Simulated host memory that records every DMA write, for scoreboards that must prove each
byte landed exactly once.

:class:`RecordingAxiRam` is a cocotbext-axi ``AxiRam`` (an AXI4 slave on the DUT's ``m_axi_*``
master) whose write path also logs each write: cocotbext-axi's ``AxiSlaveWrite`` splits every
W beat into runs of consecutive strobed bytes and hands each run to ``_write(address, data)``;
this class puts its own ``_write`` there, so what is recorded is exactly what landed in memory,
strobes applied::

    ram = RecordingAxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst,
                          size=1 << 24, window=(0, 1 << 20))
    ram.fill_random(0x1000, 4096, rng)              # back door: not recorded
    ...                                             # the DUT DMAs into 0x1000..0x1FFF
    assert ram.write_faults(0x1000, 4096) == []     # every byte written exactly once
    assert ram.snapshot(0x1000, 4096) == expected

Per-byte write counts live in a ``bytearray`` over a configured window (saturating at 255,
plenty to tell "once" from "twice"); the common case, bytes never written before, costs one
slice compare and one slice assignment per run. Writes outside the window are counted in a
dict (they are usually the bug a test looks for). ``write_map()`` gives ``{address: count}``
of every written byte (what ``stellar.sim.scoreboard`` reads), ``write_counts(addr, n)`` the
dense counts of a range. The log (:class:`DmaWrite`: address, data,
sim time in ns, clock edge number) can be turned off for long runs (``log=False``).
"""

import re
from typing import NamedTuple

from cocotbext.axi import AxiRam
from cocotbext.axi.axi_ram import AxiRamRead, AxiRamWrite
from cocotbext.axi.memory import Memory

from .switch import ClockTimebase

__all__ = ["DmaWrite", "RecordingAxiRam"]


class DmaWrite(NamedTuple):
    """One run of strobed bytes a W beat wrote: ``cycle`` is the clock edge number (the
    numbering of :class:`stellar.sim.switch.ClockTimebase`), None before the clock was measured."""
    address: int
    data: bytes
    time_ns: float
    cycle: int | None


class _RecordingWrite(AxiRamWrite):
    def __init__(self, owner, *args, **kwargs):
        self._owner = owner
        super().__init__(*args, **kwargs)

    async def _write(self, address, data):
        address %= self.size
        self.write(address, data)
        self._owner._record(address, data)


class RecordingAxiRam(AxiRam):
    """``AxiRam`` that records every write arriving on the AXI bus.

    Parameters (as ``AxiRam``): ``bus`` (``AxiBus``), ``clock``, ``reset``,
    ``reset_active_level``, ``size`` (bytes), ``mem``. Own keywords: ``window=(base, length)``,
    the address range counted per byte in a bytearray (default: the first
    ``min(size, 16 MiB)`` bytes); ``log`` (keep the :class:`DmaWrite` list ``writes``).

    Back-door ``read(addr, n)`` / ``write(addr, data)`` / :meth:`fill_random` /
    :meth:`snapshot` go straight to memory and are never recorded.
    """

    def __init__(self, bus, clock, reset=None, reset_active_level=True, size=2**64, mem=None, *,
                 window=None, log=True, **kwargs):
        # As AxiRam.__init__, with the recording write interface in place of AxiRamWrite.
        self.write_if = None
        self.read_if = None
        Memory.__init__(self, size, mem, **kwargs)
        if window is None:
            window = (0, min(self.size, 1 << 24))
        self.window_base, self.window_size = int(window[0]), int(window[1])
        if self.window_base < 0 or self.window_base + self.window_size > self.size:
            raise ValueError(f"window {window} is outside the memory (size {self.size:#x})")
        self._counts = bytearray(self.window_size)
        self.outside = {}            # address -> count, for bytes outside the window
        self.writes = []
        self.log_writes = log
        self.bytes_written = 0       # every byte the bus wrote, rewrites included
        self.write_count = 0         # runs recorded
        self.timebase = ClockTimebase(clock)
        self.write_if = _RecordingWrite(self, bus.write, clock, reset, reset_active_level,
                                        mem=self.mem)
        self.read_if = AxiRamRead(bus.read, clock, reset, reset_active_level, mem=self.mem)
        import cocotb
        cocotb.start_soon(self.timebase.measure())

    # -- recording ------------------------------------------------------------------------------

    def _record(self, address, data):
        n = len(data)
        self.bytes_written += n
        self.write_count += 1
        if self.log_writes:
            from cocotb.simtime import get_sim_time
            t = get_sim_time("step")
            cycle = self.timebase.cycle(t) if self.timebase.period else None
            self.writes.append(DmaWrite(address, bytes(data), get_sim_time("ns"), cycle))
        lo = address - self.window_base
        hi = lo + n
        counts = self._counts
        if 0 <= lo and hi <= self.window_size:
            if not any(counts[lo:hi]):
                counts[lo:hi] = b"\x01" * n
            else:
                for i in range(lo, hi):
                    if counts[i] < 255:
                        counts[i] += 1
            return
        for a in range(address, address + n):
            i = a - self.window_base
            if 0 <= i < self.window_size:
                counts[i] = min(255, counts[i] + 1)
            else:
                self.outside[a] = self.outside.get(a, 0) + 1

    def clear_record(self):
        """Forget every recorded write (counts, log, outside writes); memory is unchanged."""
        self._counts = bytearray(self.window_size)
        self.outside.clear()
        self.writes.clear()
        self.bytes_written = 0
        self.write_count = 0

    # -- queries ------------------------------------------------------------------------------

    def write_map(self) -> dict:
        """``{address: count}`` for every byte the bus wrote (counts saturate at 255): the
        ``HostMemory`` protocol of ``stellar.sim.scoreboard``."""
        out = {}
        base = self.window_base
        for m in re.finditer(rb"[^\x00]+", self._counts):
            for i in range(m.start(), m.end()):
                out[base + i] = self._counts[i]
        for a, c in self.outside.items():
            out[a] = min(255, c)
        return out

    def write_counts(self, addr=None, n=None) -> bytes:
        """Per byte of ``[addr, addr + n)`` (default: the window) how many times the bus wrote
        it (saturating at 255): index ``i`` is address ``addr + i``."""
        if addr is None:
            addr, n = self.window_base, self.window_size
        lo = addr - self.window_base
        if 0 <= lo and lo + n <= self.window_size:
            return bytes(self._counts[lo:lo + n])
        return bytes(self._count_at(a) for a in range(addr, addr + n))

    def _count_at(self, a):
        i = a - self.window_base
        if 0 <= i < self.window_size:
            return self._counts[i]
        return min(255, self.outside.get(a, 0))

    def written_bytes_count(self, addr=None, n=None) -> int:
        """How many byte addresses of ``[addr, addr + n)`` were written at least once
        (default: the window plus every address outside it)."""
        if addr is None:
            return self.window_size - self._counts.count(0) + len(self.outside)
        m = self.write_counts(addr, n)
        return len(m) - m.count(0)

    def write_faults(self, addr, n, expect=1):
        """``[(start, end, count)]``: the runs of ``[addr, addr + n)`` not written exactly
        ``expect`` times (an empty list proves the range landed exactly once)."""
        m = self.write_counts(addr, n)
        out = []
        i = 0
        while i < n:
            if m[i] == expect:
                i += 1
                continue
            j = i
            while j < n and m[j] == m[i]:
                j += 1
            out.append((addr + i, addr + j, m[i]))
            i = j
        return out

    def writes_outside(self, ranges):
        """Runs ``[(start, end)]`` of written addresses outside every ``(addr, n)`` of
        ``ranges``: stray DMA. Uses the count map, so it works with ``log=False``."""
        def allowed(a):
            return any(s <= a < s + k for s, k in ranges)

        stray = [a for a in self.outside if not allowed(a)]
        counts = bytearray(self._counts)
        for s, k in ranges:             # blank the allowed part of the window (C-speed slices)
            lo, hi = max(s - self.window_base, 0), min(s + k - self.window_base, self.window_size)
            if lo < hi:
                counts[lo:hi] = bytes(hi - lo)
        for m in re.finditer(rb"[^\x00]+", counts):
            stray += range(self.window_base + m.start(), self.window_base + m.end())
        runs = []
        for a in sorted(stray):
            if runs and runs[-1][1] == a:
                runs[-1][1] = a + 1
            else:
                runs.append([a, a + 1])
        return [tuple(r) for r in runs]

    # -- back door ----------------------------------------------------------------------------

    def read(self, address, length) -> bytes:
        """Memory contents (not recorded)."""
        return bytes(self.mem[address:address + length])

    def snapshot(self, addr, n) -> bytes:
        """A copy of ``[addr, addr + n)`` as it is now."""
        return self.read(addr, n)

    def fill_random(self, addr, n, rng):
        """Fill ``[addr, addr + n)`` with bytes from ``rng`` (a ``random.Random``); not recorded.
        Returns the bytes written."""
        data = rng.randbytes(n)
        self.write(addr, data)
        return data
