"""Stream drivers for the Amaranth simulator: frames as beats on ``lib.stream`` interfaces.

The unit tests of the packet engine (``tests/unit``) drive and watch
``stream.Signature(beat_layout(w))`` interfaces with these, from one async testbench::

    rng = seeded_rng("parser-fields", seed)                  # prints the seed
    src = FrameSource(dut.i, frames, rng=rng, p_valid=0.7)   # random gaps
    sink = FrameSink(dut.o, len(frames), rng=rng, p_ready=0.6, watch=(dut.o_meta,))
    simulate(dut, src, sink)                                 # or: await run_streams(ctx, ...)
    sink.frames[0].data, sink.frames[0].watch, src.transfers, ...

All drivers advance in lockstep, one clock per step, in a single testbench: before each clock
edge every driver chooses what it drives (``valid`` and payload, or ``ready``), all of it is
applied with ONE ``ctx.set`` (each ``ctx.set`` settles the whole design again, which is most
of the simulation time: separate testbenches would pay it once per driver and per signal),
then ``ctx.tick().sample(...)`` reads every handshake AT the edge. (``ctx.get`` after
``await ctx.tick()`` would read values the edge already changed.)

Cycle numbers: the edges are numbered from 0 (the first edge after the run starts); every
transfer is stamped with the number of the edge it happened at, the same time base for all
drivers of a run, so stamps can be subtracted to measure latency.

Randomness: ``p_valid`` / ``p_ready`` are the per-clock probabilities of offering a beat and of
being ready (1.0: never). While ``valid`` is low a source drives junk on the payload (set when
``valid`` drops), and the null lanes (``keep == 0``) of every beat carry junk, as AXI-Stream
allows: a design that reads them fails. A sink checks the stream rules on what it sees: a beat
offered and not taken stays offered, unchanged, on the next clock; ``keep`` is a prefix of
ones, full on every beat but a frame's last.
"""

import os
import random
from dataclasses import dataclass

from amaranth.hdl import Cat
from amaranth.sim import Simulator

__all__ = ["seeded_rng", "run_seeds", "frame_beats", "beats_bytes", "pack_struct", "Transfer",
           "Received", "FrameSource", "ItemSource", "FrameSink", "run_streams", "simulate"]


def run_seeds(default):
    """The seeds a randomized test runs with: ``STELLAR_SEED=<n>`` replays one seed, else
    ``default`` (a list of ints)."""
    if "STELLAR_SEED" in os.environ:
        return [int(os.environ["STELLAR_SEED"])]
    return list(default)


def seeded_rng(name, seed):
    """A ``random.Random`` for one test, announcing its seed (pytest shows it on failure)."""
    print(f"{name}: seed {seed} (replay with STELLAR_SEED={seed})")
    return random.Random(f"{name}:{seed}")


def frame_beats(frame, nbytes):
    """``(data, keep, last)`` per beat of ``frame`` (bytes), lane 0 first. An empty frame is one
    beat with ``keep == 0``."""
    frame = bytes(frame)
    chunks = [frame[i:i + nbytes] for i in range(0, len(frame), nbytes)] or [b""]
    return [(int.from_bytes(c, "little"), (1 << len(c)) - 1, i == len(chunks) - 1)
            for i, c in enumerate(chunks)]


def beats_bytes(beats, nbytes):
    """The bytes of ``(data, keep, last)`` beats: the lanes whose ``keep`` bit is set."""
    out = bytearray()
    for data, keep, _last in beats:
        raw = data.to_bytes(nbytes, "little")
        out += bytes(raw[b] for b in range(nbytes) if keep >> b & 1)
    return bytes(out)


def pack_struct(layout, values, *, rng=None):
    """The bits of a ``data.StructLayout`` value from ``{field: int}``; fields not given are
    random (from ``rng``) or zero."""
    bits = 0
    for name, f in layout:
        if name in values:
            v = int(values[name])
            assert 0 <= v < 1 << f.width, f"{name}={v:#x} does not fit in {f.width} bits"
        else:
            v = rng.getrandbits(f.width) if rng else 0
        bits |= v << f.offset
    return bits


@dataclass
class Transfer:
    cycle: int          # edge number
    frame: int          # index of the frame / item in its sequence
    beat: int           # index of the beat within the frame (0 for items)


@dataclass
class Received:
    """One frame as a sink saw it."""
    data: bytes                      # kept lanes of its beats
    beats: list                      # (data, keep, last) as sampled
    cycles: list                     # edge number of each beat
    watch: tuple = ()                # values of the sink's ``watch`` signals with the last beat


class _Driver:
    """One participant of :func:`run_streams`: ``drives`` (signals it sets before each edge),
    ``samples`` (signals it reads at each edge), ``drive()`` -> int for ``Cat(*drives)``,
    ``sampled(edge, values)``, ``done``."""
    drives = ()
    samples = ()
    done = True
    progress = 0                     # transfers so far (for the stall timeout)


class _Source(_Driver):
    def __init__(self, stream, items, *, rng, p_valid=1.0, side=(), junk=True):
        self.stream = stream
        self.rng = rng
        self.p_valid = p_valid
        self.junk = junk
        self._bits = stream.payload.as_value()
        self._side = tuple(side)
        self.drives = (self._bits, stream.valid, *self._side)
        self._side_at = len(self._bits) + 1
        self._queue = list(items)   # (bits, side value or None, frame index, beat index, last)
        self._pos = 0
        self._offered = False
        self._idle_value = None
        self.transfers = []
        self.stalls = 0             # edges with valid high and ready low
        self.idle = 0               # edges with valid low before the end
        self.done = not self._queue

    @property
    def progress(self):
        return len(self.transfers)

    def _random_side(self):
        return self.rng.getrandbits(sum(len(s) for s in self._side)) if self._side else 0

    def drive(self):
        if self._pos >= len(self._queue):
            if self._idle_value is None:
                self._idle_value = self._junk_value()
            return self._idle_value
        if not self._offered:
            if not (self.p_valid >= 1.0 or self.rng.random() < self.p_valid):
                if self._idle_value is None:        # a gap starts: junk, then hold it
                    self._idle_value = self._junk_value()
                self.idle += 1
                return self._idle_value
            self._offered = True
            self._idle_value = None
            bits, side, *_ = self._queue[self._pos]
            self._offer = (bits | 1 << len(self._bits)
                           | (self._random_side() if side is None else side) << self._side_at)
        return self._offer

    def _junk_value(self):
        bits = self.rng.getrandbits(len(self._bits)) if self.junk else 0
        return bits | self._random_side() << self._side_at

    def sampled(self, edge, values):
        if not self._offered:
            return
        if values[0]:
            _, _, fi, bi, _ = self._queue[self._pos]
            self.transfers.append(Transfer(edge, fi, bi))
            self._on_transfer(values)
            self._pos += 1
            self._offered = False
            self.done = self._pos >= len(self._queue)
        else:
            self.stalls += 1

    def _on_transfer(self, values):
        pass


class FrameSource(_Source):
    """Sends ``frames`` (bytes) as beats on a ``stream.Signature(beat_layout(w))`` interface.

    ``side``: signals driven with each frame's last beat, to the values in ``side_values`` (one
    int per frame, the side signals concatenated, the first in the LSBs), random at every other
    time: the design must sample them only with the last beat. ``watch``: signals sampled when
    a frame's last beat is taken, per frame in ``watched``.
    """

    def __init__(self, stream, frames, *, rng, p_valid=1.0, side=(), side_values=None, watch=(),
                 junk=True):
        layout = stream.payload.shape()
        self.nbytes = layout["data"].width // 8
        keep_at, last_at = layout["keep"].offset, layout["last"].offset
        assert layout["data"].offset == 0
        items = []
        for fi, frame in enumerate(frames):
            for bi, (data, keep, last) in enumerate(frame_beats(frame, self.nbytes)):
                if junk:
                    null = ~keep & ((1 << self.nbytes) - 1)
                    mask = sum(0xFF << (8 * b) for b in range(self.nbytes) if null >> b & 1)
                    data |= rng.getrandbits(self.nbytes * 8) & mask
                bits = data | keep << keep_at | int(last) << last_at
                items.append((bits, side_values[fi] if side_values and last else None, fi, bi,
                              last))
        super().__init__(stream, items, rng=rng, p_valid=p_valid, side=side, junk=junk)
        self.samples = (stream.ready, *watch)
        self.watched = []

    def _on_transfer(self, values):
        if self._queue[self._pos][4]:
            self.watched.append(tuple(values[1:]))


class ItemSource(_Source):
    """Sends one payload per transfer (e.g. header records) on a ``stream.Signature``; items
    are the payload's bits as ints (see :func:`pack_struct`)."""

    def __init__(self, stream, items, *, rng, p_valid=1.0, junk=True):
        super().__init__(stream, [(v, None, n, 0, True) for n, v in enumerate(items)], rng=rng,
                         p_valid=p_valid, junk=junk)
        self.samples = (stream.ready,)


class FrameSink(_Driver):
    """Receives ``count`` frames from a ``stream.Signature(beat_layout(w))`` interface into
    ``frames`` (a list of :class:`Received`).

    ``watch``: signals sampled with each frame's last beat (e.g. a record valid with it).
    ``empty_ok``: a frame may be one beat with ``keep == 0``.
    Once it has its ``count`` frames it stays ready and fails on any further beat (run with a
    ``tail`` to watch for them).
    """

    def __init__(self, stream, count, *, rng, p_ready=1.0, watch=(), empty_ok=False):
        self.stream = stream
        self.count = count
        self.rng = rng
        self.p_ready = p_ready
        self.empty_ok = empty_ok
        p = stream.payload
        self.nbytes = len(p.data) // 8
        self.drives = (stream.ready,)
        self.samples = (stream.valid, p.data, p.keep, p.last, *watch)
        self.frames = []
        self.bubbles = 0            # edges with ready high and valid low, after the first beat
        self._beats, self._cycles = [], []
        self._pending = None
        self._ready = 0
        self.done = count == 0

    @property
    def progress(self):
        return len(self.frames) * 1_000_000 + len(self._beats)

    def drive(self):
        # Once done, stay ready: a beat beyond the expected frames is taken and reported.
        self._ready = int(self.done or self.p_ready >= 1.0 or self.rng.random() < self.p_ready)
        return self._ready

    def sampled(self, edge, values):
        valid, data, keep, last, *watched = values
        beat = (data, keep, bool(last))
        if self._pending is not None:
            assert valid and beat == self._pending, (
                f"edge {edge}: a refused beat was withdrawn or changed: {self._pending} -> "
                f"{beat if valid else 'valid low'}")
        self._pending = beat if valid and not self._ready else None
        if not (valid and self._ready):
            if self._ready and (self._beats or self.frames) and not self.done:
                self.bubbles += 1
            return
        assert not self.done, f"edge {edge}: a beat after the last expected frame"
        full = (1 << self.nbytes) - 1
        assert keep & (keep + 1) == 0, f"edge {edge}: keep {keep:#x} is not a prefix of ones"
        if not last:
            assert keep == full, f"edge {edge}: partial keep {keep:#x} on a beat before last"
        elif keep == 0:
            assert self.empty_ok and not self._beats, f"edge {edge}: empty last beat"
        self._beats.append(beat)
        self._cycles.append(edge)
        if last:
            self.frames.append(Received(beats_bytes(self._beats, self.nbytes), self._beats,
                                        self._cycles, tuple(watched)))
            self._beats, self._cycles = [], []
            self.done = len(self.frames) == self.count


async def run_streams(ctx, *drivers, timeout=10_000, tail=0):
    """Clock ``drivers`` in lockstep until every one is done (and ``tail`` more clocks); fails
    when no driver makes progress for ``timeout`` clocks."""
    drives = [s for d in drivers for s in d.drives]
    bus = Cat(*drives)
    samples = [s for d in drivers for s in d.samples]
    driven, edge, still, last_progress, extra = None, 0, 0, None, 0
    while True:
        if all(d.done for d in drivers):
            if extra >= tail:
                break
            extra += 1
        value, shift = 0, 0
        for d in drivers:
            if d.drives:
                value |= d.drive() << shift
                shift += sum(len(s) for s in d.drives)
        if value != driven:
            ctx.set(bus, value)
            driven = value
        _clk, _rst, *values = await ctx.tick().sample(*samples)
        pos = 0
        for d in drivers:
            d.sampled(edge, values[pos:pos + len(d.samples)])
            pos += len(d.samples)
        edge += 1
        progress = tuple(d.progress for d in drivers)
        still = still + 1 if progress == last_progress else 0
        last_progress = progress
        if still > timeout:
            raise AssertionError(f"no progress for {timeout} clocks at edge {edge}: "
                                 + ", ".join(f"{type(d).__name__} done={d.done}" for d in drivers))
    return edge


def simulate(dut, *drivers, timeout=10_000, tail=0):
    """Simulate ``dut`` (clocked by ``sync``) with ``drivers`` in one testbench until they are
    done; returns the number of clocks."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    result = []

    async def testbench(ctx):
        result.append(await run_streams(ctx, *drivers, timeout=timeout, tail=tail))

    sim.add_testbench(testbench)
    sim.run()
    print(f"{type(dut).__name__}: {result[0]} clocks")
    return result[0]
