# Ref: linux-rdma/perftest (ib_write_bw, ib_read_bw, ib_write_lat: tx depth, post list,
#      cq_mod = one signaled work request every N, ping-pong latency by WRITE with polling on
#      memory, latency as half the round trip); rdma-core libibverbs (the verbs used)
"""perftest-style measurements over the verbs API (:mod:`stellar.host.verbs`) on a connected RC
QP pair, on any device: the simulated two-host system, a VFIO device, anything ``Context.open``
takes::

    pair = await PerfPair.create(ctx_a, ctx_b, addr_a=(mac_a, ip_a), addr_b=(mac_b, ip_b))
    r = await write_bw(pair, size=4096, iters=1000, tx_depth=32, batch=4, signal_every=8,
                       clock=WallClock(), progress=print_progress)
    print(r.gbps, r.msg_rate, r.mmio_writes_per_wr, r.latency.median)
    await pair.close()

Routines (A is the requester, B the responder):

* :func:`write_bw`: ``iters`` RDMA WRITEs of ``size`` bytes from A to B, at most ``tx_depth``
  outstanding, posted in lists of ``batch`` work requests (one doorbell per list), one WR in
  ``signal_every`` signaled (perftest's ``--post_list`` and ``--cq-mod``). Timed from the first
  post to the last completion.
* :func:`read_bw`: the same with RDMA READs (A reads B's memory).
* :func:`write_lat`: ``ib_write_lat``: A WRITEs ``size`` bytes to B, B polls the last byte of its
  buffer until the message's tag shows, WRITEs back, A polls its own buffer; the latency of a
  round is half its round trip. Both sides run in this one program (the simulation is one
  program; on hardware the loopback pair is one device).

Buffers: each side registers one region of ``2 * region`` bytes: a transmit half and a receive
half. Messages rotate through ``slots = min(iters, region // size)`` slots, so consecutive
WRITEs land at different addresses. Before a run the source is filled with fresh random bytes
and the destination zeroed; after it the destination must equal the source byte for byte
(:class:`DataMismatch` otherwise): ``verified`` is only ever True.

Results (:class:`PerfResult`): bytes, messages, seconds, Gb/s, messages/s, the completion
latency of every signaled WR (post of its list -- the doorbell write -- to its CQE seen in host
memory) or the ping-pong latency, min / median / p99 / max, in clock cycles too when the clock
has a frequency (simulation); MMIO writes and reads per work request from ``ctx.mmio`` over the
timed window: the fast path makes one write per posted list (``sq_doorbells``) plus one CQ
doorbell every quarter of the CQ ring polled (``cq_doorbells``; the CQs here hold 4096 entries,
so that is one per 1024 signaled WRs), and no reads at all.

Time comes from a :class:`Clock`: :class:`WallClock` (``time.perf_counter``) on hardware; a
simulation supplies its own (``stellar.sim.tb_cli.SimClock``: simulated seconds, 250 MHz cycles,
one poll per clock), since this package never imports cocotb.
"""

import abc
import asyncio
import dataclasses
import math
import mmap
import random
import statistics
import time
from dataclasses import dataclass

from .errors import StellarError
from .verbs import (
    SGE,
    Access,
    AHAttr,
    PathMtu,
    QPAttr,
    QPCap,
    QPInitAttr,
    QpState,
    SendFlags,
    SendWR,
    WcStatus,
    WrOpcode,
)

__all__ = [
    "Clock", "WallClock", "LatencyStats", "PerfResult", "PerfPair", "PerfEndpoint",
    "write_bw", "read_bw", "write_lat", "run_tests", "TESTS", "connect_qps",
    "PerfError", "DataMismatch", "CompletionError", "PerfTimeout",
]

ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
CQ_ENTRIES = 4096       # a CQ doorbell every 1024 CQEs polled: rare enough to vanish per WR


# ------------------------------------------------------------------------------------ errors
class PerfError(StellarError):
    """A measurement could not complete."""
    code = "E7100"


class DataMismatch(PerfError):
    """After a run the destination memory differs from the source: data was lost or corrupted
    on the way (the transport reported success)."""
    code = "E7101"
    default_fix = ("report it with the seed and the command line: a completed transfer must "
                   "deliver every byte; `stellar stats` shows the drop and retransmit counters")


class CompletionError(PerfError):
    """A work request of the measurement completed with an error status."""
    code = "E7102"
    default_fix = ("check the link between the two QPs (`stellar stats`: retransmits, timeouts, "
                   "rx_drop_*) and the QP states (`stellar qp list`)")


class PerfTimeout(PerfError, TimeoutError):
    """No completion (or no ping-pong reply) arrived within the clock's timeout."""
    code = "E7103"
    default_fix = ("check that the link is up (a loopback pair needs the port looped back or a "
                   "switch that hairpins) and `stellar qp list` for QPs in ERROR")


# ------------------------------------------------------------------------------------- clock
class Clock(abc.ABC):
    """Time for the routines (the interface of :class:`WallClock` and the simulation's
    ``SimClock``): ``now()`` in seconds, ``idle()`` lets the device work for one poll
    interval, ``hz`` the cycle rate when time is a clock's (simulation; None on hardware),
    ``timeout`` seconds without progress before :class:`PerfTimeout`, ``kind`` names it."""

    kind = "wall"
    hz = None
    timeout = 10.0

    @abc.abstractmethod
    def now(self):
        """Seconds, monotonic."""

    @abc.abstractmethod
    async def idle(self):
        """Let the device work for one poll interval."""

    def cycles(self, seconds):
        return None if self.hz is None else round(seconds * self.hz)


class WallClock(Clock):
    """``time.perf_counter``; ``idle`` yields to the event loop (busy polling, as perftest)."""

    def __init__(self, timeout=10.0):
        self.timeout = timeout

    def now(self):
        return time.perf_counter()

    async def idle(self):
        await asyncio.sleep(0)


# ----------------------------------------------------------------------------------- results
def _p99(ordered):
    """Nearest-rank 99th percentile of an ordered list."""
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass(frozen=True)
class LatencyStats:
    """Latency samples summarized, in seconds; ``hz`` (cycles per second) when simulated."""
    samples: int
    min: float
    median: float
    p99: float
    max: float
    mean: float
    hz: float | None = None

    @classmethod
    def of(cls, samples, hz=None):
        if not samples:
            return None
        s = sorted(samples)
        return cls(len(s), s[0], statistics.median(s), _p99(s), s[-1], statistics.fmean(s), hz)

    def cycles(self):
        """``{min, median, p99, max, mean}`` in clock cycles, or None without a clock rate."""
        if self.hz is None:
            return None
        return {k: round(getattr(self, k) * self.hz, 1)
                for k in ("min", "median", "p99", "max", "mean")}

    def to_dict(self):
        d = {"samples": self.samples,
             **{f"{k}_us": getattr(self, k) * 1e6 for k in ("min", "median", "p99", "max", "mean")}}
        if self.hz is not None:
            d["cycles"] = self.cycles()
        return d


@dataclass(frozen=True)
class PerfResult:
    """One measurement. ``bytes`` / ``messages``: payload moved and work requests completed (a
    ``write_lat`` round is two WRITEs, one each way); ``seconds`` of the clock (simulated seconds
    in simulation); ``latency``: completion latency of each signaled WR (bw) or half round trips
    (lat); ``mmio_*``: MMIO operations in the timed window; ``verified``: the destination equals
    the source (a run that is not raises :class:`DataMismatch` instead)."""
    test: str
    size: int
    iters: int
    tx_depth: int
    batch: int
    signal_every: int
    bytes: int
    messages: int
    seconds: float
    clock: str
    hz: float | None
    latency: LatencyStats | None
    mmio_writes: int
    mmio_reads: int
    sq_doorbells: int
    verified: bool

    @property
    def gbps(self):
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def msg_rate(self):
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def cycles(self):
        return None if self.hz is None else round(self.seconds * self.hz)

    @property
    def cq_doorbells(self):
        return self.mmio_writes - self.sq_doorbells

    @property
    def mmio_writes_per_wr(self):
        return self.mmio_writes / self.messages

    @property
    def mmio_reads_per_wr(self):
        return self.mmio_reads / self.messages

    def to_dict(self):
        d = dataclasses.asdict(self)
        d["latency"] = self.latency.to_dict() if self.latency else None
        d.update(gbps=self.gbps, msg_rate=self.msg_rate, cycles=self.cycles,
                 cq_doorbells=self.cq_doorbells, mmio_writes_per_wr=self.mmio_writes_per_wr,
                 mmio_reads_per_wr=self.mmio_reads_per_wr)
        return d

    @classmethod
    def from_dict(cls, d):
        """The inverse of :meth:`to_dict` (results that crossed a JSON file)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        lat = d.get("latency")
        kw["latency"] = None if lat is None else LatencyStats(
            lat["samples"], *(lat[f"{k}_us"] / 1e6 for k in ("min", "median", "p99", "max",
                                                             "mean")), d.get("hz"))
        return cls(**kw)


# ----------------------------------------------------------------------------------- the pair
@dataclass
class PerfEndpoint:
    """One side: its context, PD, CQ, QP, and one registered region of ``2 * region`` bytes
    (transmit half at ``tx_addr``, receive half at ``rx_addr``)."""
    ctx: object
    pd: object
    cq: object
    qp: object
    mr: object
    mem: mmap.mmap
    region: int

    @property
    def tx(self):
        return memoryview(self.mem)[:self.region]

    @property
    def rx(self):
        return memoryview(self.mem)[self.region:2 * self.region]

    @property
    def tx_addr(self):
        return self.mr.addr

    @property
    def rx_addr(self):
        return self.mr.addr + self.region


async def connect_qps(qa, addr_a, qb, addr_b, *, psn_a, psn_b, mtu=PathMtu.MTU_1024, timeout=14,
                      retry_cnt=7, rnr_retry=7, min_rnr_timer=1, rd_atomic=4):
    """RESET -> INIT -> RTR -> RTS for both QPs of an RC connection; ``addr_*``: ``(mac, ip)``
    of each side's GID 0 (what an out-of-band exchange would carry, with the QPN and PSN)."""
    for qp in (qa, qb):
        await qp.modify(QPAttr(qp_state=QpState.INIT, pkey_index=0, port_num=1,
                               qp_access_flags=ALL_ACCESS))
    for qp, peer_qp, (mac, ip), rq_psn in ((qa, qb, addr_b, psn_b), (qb, qa, addr_a, psn_a)):
        await qp.modify(QPAttr(qp_state=QpState.RTR, path_mtu=mtu, dest_qp_num=peer_qp.qp_num,
                               rq_psn=rq_psn, max_dest_rd_atomic=rd_atomic,
                               min_rnr_timer=min_rnr_timer, ah_attr=AHAttr(dgid=ip, dmac=mac)))
    for qp, sq_psn in ((qa, psn_a), (qb, psn_b)):
        await qp.modify(QPAttr(qp_state=QpState.RTS, sq_psn=sq_psn, timeout=timeout,
                               retry_cnt=retry_cnt, rnr_retry=rnr_retry, max_rd_atomic=rd_atomic))


class PerfPair:
    """A connected RC QP pair for the measurements: ``a`` (requester) and ``b``
    (:class:`PerfEndpoint`). ``ctx_a`` may be ``ctx_b`` (a loopback pair on one device)."""

    def __init__(self, a, b, *, seed=1):
        self.a, self.b = a, b
        self.rng = random.Random(seed)

    @classmethod
    async def create(cls, ctx_a, ctx_b, *, addr_a, addr_b, region=1 << 20, tx_depth=64,
                     mtu=PathMtu.MTU_1024, timeout=14, seed=1):
        """Allocate, register and connect. ``region``: bytes per direction and side (the
        largest message size the pair takes); ``tx_depth``: the most outstanding WRs a run may
        use (the send queue's size)."""
        rng = random.Random(seed)
        ends = []
        for ctx in (ctx_a, ctx_b):
            pd = ctx.alloc_pd()
            mem = mmap.mmap(-1, 2 * region)
            mr = await pd.reg_mr(mem, ALL_ACCESS)
            cq = await ctx.create_cq(CQ_ENTRIES)
            qp = await ctx.create_qp(pd, QPInitAttr(send_cq=cq, recv_cq=cq,
                                                    cap=QPCap(max(tx_depth, 2), 2)))
            ends.append(PerfEndpoint(ctx, pd, cq, qp, mr, mem, region))
        a, b = ends
        await connect_qps(a.qp, addr_a, b.qp, addr_b, psn_a=rng.randrange(1 << 24),
                          psn_b=rng.randrange(1 << 24), mtu=mtu, timeout=timeout)
        return cls(a, b, seed=seed)

    @property
    def max_depth(self):
        return min(1 << self.a.qp.sq_log, 1 << self.b.qp.sq_log)

    def slots(self, size, iters):
        return max(1, min(iters, self.a.region // size))

    def fill(self, view):
        view[:] = self.rng.randbytes(len(view))

    async def close(self):
        """Destroy the QPs and CQs, deregister the regions (the device is left as found)."""
        for ep in (self.a, self.b):
            await ep.qp.destroy()
        for ep in (self.a, self.b):
            await ep.cq.destroy()
            await ep.mr.dereg()


# ---------------------------------------------------------------------------------- routines
def _check(pair, size, iters, tx_depth, batch, signal_every):
    if size < 1 or size > pair.a.region:
        raise ValueError(f"size {size}: 1 .. {pair.a.region} bytes (the pair's region)")
    if iters < 1:
        raise ValueError(f"iters {iters}: at least 1")
    if not 1 <= tx_depth <= pair.max_depth:
        raise ValueError(f"tx_depth {tx_depth}: 1 .. {pair.max_depth} (the send queue's size)")
    if not 1 <= batch <= tx_depth:
        raise ValueError(f"batch {batch}: 1 .. tx_depth ({tx_depth})")
    # lists are posted whole: with more than tx_depth - batch WRs outstanding none can be
    # posted, so one of them must be signaled, or the run would wait forever
    if not 1 <= signal_every <= tx_depth - batch + 1:
        raise ValueError(f"signal_every {signal_every}: 1 .. tx_depth - batch + 1 "
                         f"({tx_depth - batch + 1}), so that a full queue always holds a "
                         "signaled WR")


def _verify(test, src, dst, n):
    a, b = bytes(src[:n]), bytes(dst[:n])
    if a != b:
        first = next(i for i in range(n) if a[i] != b[i])
        bad = sum(x != y for x, y in zip(a, b, strict=True))
        raise DataMismatch(f"{test}: {bad} of {n} destination bytes differ from the source, the "
                           f"first at offset {first} ({b[first]:#04x}, expected {a[first]:#04x})",
                           offset=first, differing=bad)


def _report(progress, test, size, done, total):
    if progress is not None:
        progress(test, size, done, total)


async def _bw(test, opcode, pair, size, iters, tx_depth, batch, signal_every, clock, progress):
    _check(pair, size, iters, tx_depth, batch, signal_every)
    a, b = pair.a, pair.b
    slots = pair.slots(size, iters)
    n_bytes = slots * size
    if opcode == WrOpcode.RDMA_WRITE:     # A.tx -> B.rx
        src, dst = a.tx, b.rx
        local_addr, remote_addr = a.tx_addr, b.rx_addr
    else:                                 # A.rx <- B.tx
        src, dst = b.tx, a.rx
        local_addr, remote_addr = a.rx_addr, b.tx_addr
    pair.fill(src[:n_bytes])
    dst[:n_bytes] = bytes(n_bytes)
    qp, cq, mmio = a.qp, a.cq, a.ctx.mmio
    lkey, rkey = a.mr.lkey, b.mr.rkey
    step = max(1, iters // 10)
    next_report = step
    posted = completed = lists = 0
    post_time, samples = {}, []
    reads0, writes0 = mmio.snapshot()
    start = last = clock.now()
    while completed < iters:
        while posted < iters:
            n = min(batch, iters - posted)
            if posted - completed + n > tx_depth:
                break
            wrs, signaled = [], []
            for k in range(posted, posted + n):
                off = (k % slots) * size
                sig = (k + 1) % signal_every == 0 or k == iters - 1
                if sig:
                    signaled.append(k)
                wrs.append(SendWR(wr_id=k, opcode=opcode, sg_list=[SGE(local_addr + off, size, lkey)],
                                  remote_addr=remote_addr + off, rkey=rkey,
                                  send_flags=SendFlags.SIGNALED if sig else SendFlags(0)))
            t = clock.now()
            await qp.post_send(wrs)
            for k in signaled:
                post_time[k] = t
            posted += n
            lists += 1
        wcs = await cq.poll(64)
        if not wcs:
            if clock.now() - last > clock.timeout:
                raise PerfTimeout(f"{test} {size} B: {completed} of {iters} WRs completed, none "
                                  f"more within {clock.timeout:g} s ({clock.kind} time)",
                                  completed=completed)
            await clock.idle()
            continue
        last = clock.now()
        for wc in wcs:
            if wc.status != WcStatus.SUCCESS:
                raise CompletionError(f"{test} {size} B: work request {wc.wr_id} completed with "
                                      f"{wc.status.name} (vendor error {wc.vendor_err})",
                                      status=wc.status, wr_id=wc.wr_id)
            samples.append(last - post_time.pop(wc.wr_id))
            completed = max(completed, wc.wr_id + 1)
        if completed >= next_report or completed == iters:
            _report(progress, test, size, completed, iters)
            next_report = (completed // step + 1) * step
    end = clock.now()
    reads1, writes1 = mmio.snapshot()
    _verify(f"{test} {size} B", src, dst, n_bytes)
    return PerfResult(test=test, size=size, iters=iters, tx_depth=tx_depth, batch=batch,
                      signal_every=signal_every, bytes=iters * size, messages=iters,
                      seconds=end - start, clock=clock.kind, hz=clock.hz,
                      latency=LatencyStats.of(samples, clock.hz), mmio_writes=writes1 - writes0,
                      mmio_reads=reads1 - reads0, sq_doorbells=lists, verified=True)


async def write_bw(pair, *, size, iters, clock, tx_depth=32, batch=1, signal_every=8,
                   progress=None):
    """``ib_write_bw``: see the module docstring. ``progress(test, size, done, total)`` is
    called about every tenth of the run."""
    return await _bw("write_bw", WrOpcode.RDMA_WRITE, pair, size, iters, tx_depth, batch,
                     signal_every, clock, progress)


async def read_bw(pair, *, size, iters, clock, tx_depth=32, batch=1, signal_every=8,
                  progress=None):
    """``ib_read_bw``: A reads ``size`` bytes of B's memory ``iters`` times."""
    return await _bw("read_bw", WrOpcode.RDMA_READ, pair, size, iters, tx_depth, batch,
                     signal_every, clock, progress)


async def write_lat(pair, *, size, iters, clock, tx_depth=32, signal_every=8, progress=None,
                    batch=1):
    """``ib_write_lat``: ping-pong by WRITE, each side polling the last byte of its receive
    buffer for the round's tag; latency = round trip / 2. ``batch`` must be 1 (one WR per
    round and side)."""
    if batch != 1:
        raise ValueError("write_lat posts one WR per round and side: batch must be 1")
    _check(pair, size, iters, tx_depth, 1, signal_every)
    a, b = pair.a, pair.b
    for ep in (a, b):
        pair.fill(ep.tx[:size])
        ep.rx[:size] = bytes(size)
    step = max(1, iters // 10)
    mmio = [a.ctx.mmio] if a.ctx is b.ctx else [a.ctx.mmio, b.ctx.mmio]
    snap0 = [m.snapshot() for m in mmio]
    samples = []
    posts = 0

    async def send(ep, peer, i):
        nonlocal posts
        while ep.qp.sq_free == 0:       # retire unsignaled WRs behind a signaled one
            await drain(ep, wait=True)
        sig = (i + 1) % signal_every == 0 or i == iters - 1
        await ep.qp.post_send(SendWR(wr_id=i, opcode=WrOpcode.RDMA_WRITE,
                                     sg_list=[SGE(ep.tx_addr, size, ep.mr.lkey)],
                                     remote_addr=peer.rx_addr, rkey=peer.mr.rkey,
                                     send_flags=SendFlags.SIGNALED if sig else SendFlags(0)))
        posts += 1

    async def drain(ep, wait=False):
        since = clock.now()
        while True:
            wcs = await ep.cq.poll(64)
            for wc in wcs:
                if wc.status != WcStatus.SUCCESS:
                    raise CompletionError(f"write_lat {size} B: work request {wc.wr_id} completed "
                                          f"with {wc.status.name}", status=wc.status, wr_id=wc.wr_id)
            if wcs or not wait:
                return
            if clock.now() - since > clock.timeout:
                raise PerfTimeout(f"write_lat {size} B: no send completion within "
                                  f"{clock.timeout:g} s ({clock.kind} time)")
            await clock.idle()

    async def wait_tag(view, tag, i):
        since = clock.now()
        while view[size - 1] != tag:
            if clock.now() - since > clock.timeout:
                raise PerfTimeout(f"write_lat {size} B: round {i}: the WRITE did not arrive "
                                  f"within {clock.timeout:g} s ({clock.kind} time)", round=i)
            await clock.idle()

    start = clock.now()
    for i in range(iters):
        tag = i % 255 + 1               # never 0 (the zeroed buffer) and never the last tag
        t0 = clock.now()
        a.tx[size - 1] = tag
        await send(a, b, i)
        await wait_tag(b.rx, tag, i)
        b.tx[size - 1] = tag
        await send(b, a, i)
        await wait_tag(a.rx, tag, i)
        samples.append((clock.now() - t0) / 2)
        await drain(a)
        await drain(b)
        if (i + 1) % step == 0 or i + 1 == iters:
            _report(progress, "write_lat", size, i + 1, iters)
    end = clock.now()
    snap1 = [m.snapshot() for m in mmio]
    # the last signaled WRs may still be completing: collect them outside the timed window
    for ep in (a, b):
        while ep.qp.sq_pending:
            await drain(ep, wait=True)
    _verify(f"write_lat {size} B A->B", a.tx, b.rx, size)
    _verify(f"write_lat {size} B B->A", b.tx, a.rx, size)
    reads = sum(s1[0] - s0[0] for s0, s1 in zip(snap0, snap1, strict=True))
    writes = sum(s1[1] - s0[1] for s0, s1 in zip(snap0, snap1, strict=True))
    return PerfResult(test="write_lat", size=size, iters=iters, tx_depth=tx_depth, batch=1,
                      signal_every=signal_every, bytes=2 * iters * size, messages=2 * iters,
                      seconds=end - start, clock=clock.kind, hz=clock.hz,
                      latency=LatencyStats.of(samples, clock.hz), mmio_writes=writes,
                      mmio_reads=reads, sq_doorbells=posts, verified=True)


TESTS = {"write_bw": write_bw, "read_bw": read_bw, "write_lat": write_lat}


async def run_tests(pair, test, sizes, *, clock, iters, tx_depth=32, batch=1, signal_every=8,
                    progress=None):
    """``test`` (a key of :data:`TESTS`) once per size; returns the results in order."""
    fn = TESTS[test]
    return [await fn(pair, size=size, iters=iters, clock=clock, tx_depth=tx_depth, batch=batch,
                     signal_every=signal_every, progress=progress) for size in sizes]
