# Ref: IEEE 802.3 clause 3-4 (preamble, SFD, FCS, inter-frame gap); IEEE 802.1Q; RFC 791 (IPv4);
#      RFC 8200 (IPv6); RFC 3168 (ECN field, CE marking); RFC 1624 (incremental checksum update);
#      IBTA Vol 1 Annex A17 "RoCEv2" (UDP 4791, ICRC coverage and masked fields, A17.8);
#      Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015 (DCQCN:
#      RED-style ECN marking on the instantaneous egress queue, Kmin/Kmax/Pmax);
#      Jain, Chiu, Hawe, DEC-TR-301, 1984 (fairness index).
"""A network switch model for two-NIC simulations: one impaired link per direction.

Between the two cores of a cocotb testbench (``a_m_axis_tx`` -> ``b_s_axis_rx`` and back) each
:class:`Link` takes the frames one core transmits (a cocotbext-axi ``AxiStreamSink``, never
paused: the wire does not back-pressure a MAC), applies seeded impairments and hands the frames
to the other core (an ``AxiStreamSource``) at wire rate::

    sw = Switch.from_prefixes(dut, "a", "b", config_ab=LinkConfig(drop=0.01, seed=1),
                              config_ba=LinkConfig(ecn_mark=0.1))
    sw.start()
    ...
    sw.ab.cut(lambda f: bth_dest_qp(f) == 0x11)   # black-hole one QP
    sw.ab.restore()
    print(sw.summary())

Impairments, drawn per frame from one ``random.Random`` per link (seeded from
``LinkConfig.seed``, else from cocotb's seed and the link name; the seed is logged), in this
order: cut (``cut()``/``restore()``), drop, corrupt, ECN mark, duplicate, reorder, jitter. Every
frame draws the same numbers from the link's stream whatever the probabilities (five uniforms and
the seed of a per-frame generator for the jitter, the bit to flip and the hold depth), so two
runs with one seed that differ only in one probability impair the other frames identically.

* ``corrupt`` flips one random bit of a RoCEv2 frame between the start of the BTH and the end of
  the ICRC, never in the BTH byte the ICRC masks (FECN/BECN/resv6): the receiver must drop the
  frame on its ICRC check. Other frames are never corrupted.
* ``ecn_mark`` sets CE (0b11) on IPv4/IPv6 frames whose ECN field is ECT(0) or ECT(1) (RFC 3168:
  Not-ECT frames are never marked, CE stays CE) and updates the IPv4 header checksum
  incrementally (RFC 1624), so a valid checksum stays valid and a wrong one stays wrong; the
  ICRC masks TOS/traffic class, so it stays valid. ``ecn_threshold`` (bytes) also marks every ECT
  frame that would wait behind more than that many bytes of queue, as a RED/DCQCN switch does.
* ``duplicate`` sends the frame twice, back to back.
* ``reorder`` holds the frame back until ``k`` later frames (``k`` uniform in
  1..``reorder_depth``) went ahead of it, or ``reorder_timeout`` cycles passed; the history
  names how many did (``reorder<n>``, or ``held`` when none came).
* ``delay`` + uniform 0..``jitter`` cycles: the frame may not leave before that.

Timing. Cycles are numbered by rising edge of ``clock`` (:class:`ClockTimebase`: edge ``k`` is at
``phase + k * period`` of sim time, the same numbers for every model of one clock). A frame
*arrives* at the edge its last beat is taken from the transmitter and *departs* at the edge the
receiver first sees its first beat (``tvalid`` high). On the wire a frame of ``L`` bytes occupies
``(L + overhead) / bytes_per_cycle`` cycles, kept exact as a ``Fraction``: frame ``i`` starts on
the wire at ``s_i = max(s_{i-1} + wire_{i-1}, ready_i)`` and departs at edge ``ceil(s_i)``, so
back-to-back departures are spaced by the wire time, rounded per frame but exact over a run.
``ready_i`` is ``arrival + max(delay, 2) + jitter`` (2 cycles is the least the source BFM can do
once the frame is known). Frames leave in FIFO order (only ``reorder`` reorders); the stream also
needs ``ceil(L / lanes)`` beats per frame, which at 512 bits can exceed the wire time of short
frames: the next frame then waits for the stream (``s_i`` moves to that edge). If the receiver
stalls ``tready`` (a real MAC could not), frames leave late; the schedule continues from where
they actually left and ``late_cycles`` adds up the delay.

Output queue. Each link is also the output port of a switch: the frames that arrived and have
not finished leaving the wire form its queue. The *occupancy* ``q(t)`` at cycle ``t`` is the sum
of the wire bytes (``L + overhead``, the overhead of the configuration in force when the frame
arrived) of the frame copies accepted at an arrival edge ``<= t`` whose wire end ``s_i + wire_i``
(exact, a ``Fraction``) is still ``> t``; a frame counts with all its wire bytes from its arrival
(propagation ``delay``, jitter and reorder holds included) until its last bit left the wire, and
a frame not yet scheduled (waiting in the queue or held back) has not finished. An arriving
frame sees ``q`` of its arrival edge without itself (``FrameRecord.queue``); frames that arrived
at the same edge before it count, frames that end exactly at that edge do not.

* RED/ECN (DCQCN-style, on that instantaneous ``q``): with ``red_kmin``/``red_kmax`` set, an ECT
  frame is marked CE with probability 0 if ``q <= kmin``, ``pmax * (q - kmin) / (kmax - kmin)``
  if ``kmin < q <= kmax`` and 1 if ``q > kmax`` (:func:`red_probability`); the RFC 3168 rules and
  the checksum update are those of ``ecn_mark``. The draw comes from a second generator seeded
  from the link's seed (one uniform per arriving frame, RED on or off), so turning RED on or
  changing its parameters leaves every other impairment decision unchanged. A frame marked for
  any reason counts in ``ecn_marked``; one whose RED draw marked it also in ``ecn_marked_red``.
* ``queue_limit`` (bytes): a copy whose wire bytes would make ``q`` exceed it is tail-dropped
  (``queue_dropped``, action ``qdrop``; random ``drop`` is counted apart). A *lossless* run has
  ``dropped == queue_dropped == 0``.
* Statistics (:meth:`LinkModel.queue_stats` -> :class:`QueueStats`): peak occupancy, the
  time-weighted mean of ``q`` from the first arrival (or :meth:`LinkModel.reset_queue_stats`) to
  a given cycle, and a time series of ``(cycle, q)`` recorded at every change (arrival: up, wire
  end: down), decimated by two whenever it would exceed ``queue_samples`` points.

Throughput per flow: :class:`FlowMonitor` bins the bytes of departed frames by flow (BTH
destination QP, or any key of the :class:`FrameRecord`) into windows of ``W`` cycles and gives
Mb/s per window; it reads a link's history or is called by the link at every departure
(``add_monitor``). :func:`jain` is Jain's fairness index of a list of rates.

Frames are parsed by a hand-written header walk (:func:`walk`: Ethernet, one optional 802.1Q
tag, IPv4 with options or IPv6, UDP 4791, BTH), field offsets from ``stellar.hdl.net.headers``;
scapy would cost milliseconds per frame. Everything except :class:`Link`, :class:`Switch` and
:class:`ClockTimebase` is pure Python (:class:`LinkModel` is the whole link without cocotb, for
unit tests and offline use).
"""

import collections
import dataclasses
import logging
import math
import random
import zlib
from collections.abc import Callable
from fractions import Fraction
from typing import NamedTuple

from stellar.hdl.net import headers as H

__all__ = [
    "LinkConfig", "LinkCounters", "FrameRecord", "FrameInfo", "LinkModel", "Link", "Switch",
    "ClockTimebase", "walk", "bth_opcode", "bth_dest_qp", "bth_psn", "ecn_field", "mark_ce",
    "flip_icrc_bit", "MIN_DELAY", "DEFAULT_OVERHEAD", "QueueStats", "FlowMonitor", "jain",
    "red_probability",
]

# Preamble + SFD (8), FCS (4), minimum inter-frame gap (12): wire bytes a stream frame lacks.
DEFAULT_OVERHEAD = 24
# Least departure - arrival the cocotb link can do: it learns of a frame at the edge its last beat
# is taken; the source BFM drives a queued frame after the next edge, the receiver sees it at the
# one after that.
MIN_DELAY = 2

# Offsets from the one header table (DESIGN.md "One source of truth for every format").
_ETH_TYPE = H.ETH.field("ethertype").byte
_VLAN_TYPE = H.ETH.size + H.VLAN.field("ethertype").byte
_V4_TOS = H.IPV4.field("ecn").byte                 # DSCP + ECN byte
_V4_LEN = H.IPV4.field("total_length").byte
_V4_FRAG = H.IPV4.field("flags").byte              # flags + fragment offset, 2 bytes
_V4_PROTO = H.IPV4.field("protocol").byte
_V4_CSUM = H.IPV4.field("checksum").byte
_V6_ECN = H.IPV6.field("ecn").byte                 # traffic class straddles bytes 0-1: ECN in 1
_V6_ECN_SHIFT = 8 - (H.IPV6.field("ecn").bit + H.IPV6.field("ecn").width)
_V6_PLEN = H.IPV6.field("payload_length").byte
_V6_NH = H.IPV6.field("next_header").byte
_UDP_DPORT = H.UDP.field("dport").byte
_BTH_OPCODE = H.BTH.field("opcode").byte
_BTH_QP = H.BTH.field("dest_qp").byte
_BTH_PSN = H.BTH.field("psn").byte
# The BTH byte holding FECN, BECN and resv6: the ICRC covers it as ones (A17.8), so a flip there
# would go unnoticed.
_BTH_MASKED = H.BTH.field("fecn").byte
assert H.BTH.field("resv6").byte == _BTH_MASKED and H.IPV4.field("ecn").bit == 6
ICRC_BYTES = 4
_ECT = (1, 2)       # ECT(1), ECT(0)
_CE = 3


# --------------------------------------------------------------------------------------------
# Header walk and frame edits (pure Python)
# --------------------------------------------------------------------------------------------

class FrameInfo(NamedTuple):
    """Where the headers of a frame are (byte offsets; -1: absent).

    ``ip``: IP header; ``ipv6``: it is IPv6; ``end``: end of the IP packet (Ethernet padding
    follows); ``bth``: the BTH of a RoCEv2 frame (UDP 4791 directly after the IP header, BTH and
    ICRC inside the IP packet), whose ICRC is the last 4 bytes before ``end``.
    """
    ip: int = -1
    ipv6: bool = False
    end: int = -1
    bth: int = -1

    @property
    def roce(self):
        return self.bth >= 0


_NOT_IP = FrameInfo()


def walk(frame) -> FrameInfo:
    """Locate the IP header and, for RoCEv2, the BTH of ``frame`` (bytes, no FCS).

    Truncated or inconsistent headers give less information, never an exception: a frame whose
    IP header does not fit is not IP; one whose IP length runs past the frame, that is
    fragmented, or whose UDP/BTH/ICRC do not fit in the IP packet is IP but not RoCEv2.
    """
    n = len(frame)
    if n < H.ETH.size:
        return _NOT_IP
    et = frame[_ETH_TYPE] << 8 | frame[_ETH_TYPE + 1]
    off = H.ETH.size
    if et == H.ETHERTYPE_VLAN:
        if n < H.ETH.size + H.VLAN.size:
            return _NOT_IP
        et = frame[_VLAN_TYPE] << 8 | frame[_VLAN_TYPE + 1]
        off += H.VLAN.size
    if et == H.ETHERTYPE_IPV4:
        if n < off + H.IPV4.size or frame[off] >> 4 != 4:
            return _NOT_IP
        ihl = (frame[off] & 15) * 4
        end = off + (frame[off + _V4_LEN] << 8 | frame[off + _V4_LEN + 1])
        if ihl < H.IPV4.size or end > n or end < off + ihl:
            return _NOT_IP
        fragmented = (frame[off + _V4_FRAG] & 0x3F) or frame[off + _V4_FRAG + 1]   # MF or offset
        udp = off + ihl if frame[off + _V4_PROTO] == H.IPPROTO_UDP and not fragmented else -1
        ipv6 = False
    elif et == H.ETHERTYPE_IPV6:
        if n < off + H.IPV6.size or frame[off] >> 4 != 6:
            return _NOT_IP
        end = off + H.IPV6.size + (frame[off + _V6_PLEN] << 8 | frame[off + _V6_PLEN + 1])
        if end > n:
            return _NOT_IP
        udp = off + H.IPV6.size if frame[off + _V6_NH] == H.IPPROTO_UDP else -1
        ipv6 = True
    else:
        return _NOT_IP
    bth = udp + H.UDP.size
    if (udp < 0 or bth + H.BTH.size + ICRC_BYTES > end
            or (frame[udp + _UDP_DPORT] << 8 | frame[udp + _UDP_DPORT + 1]) != H.ROCEV2_UDP_PORT):
        bth = -1
    return FrameInfo(off, ipv6, end, bth)


def _bth_field(frame, byte, nbytes):
    info = walk(frame)
    if not info.roce:
        return None
    return int.from_bytes(frame[info.bth + byte:info.bth + byte + nbytes], "big")


def bth_opcode(frame):
    """BTH opcode of a RoCEv2 frame, else None."""
    return _bth_field(frame, _BTH_OPCODE, 1)


def bth_dest_qp(frame):
    """BTH destination QP of a RoCEv2 frame, else None (for ``Link.cut`` predicates)."""
    return _bth_field(frame, _BTH_QP, 3)


def bth_psn(frame):
    """BTH PSN of a RoCEv2 frame, else None."""
    return _bth_field(frame, _BTH_PSN, 3)


def ecn_field(frame, info=None):
    """The IP ECN field (0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE), or None for a non-IP frame."""
    info = info or walk(frame)
    if info.ip < 0:
        return None
    if info.ipv6:
        return frame[info.ip + _V6_ECN] >> _V6_ECN_SHIFT & 3
    return frame[info.ip + _V4_TOS] & 3


def _ones_add(a, b):
    s = a + b
    return (s & 0xFFFF) + (s >> 16)


def mark_ce(frame, info=None):
    """``frame`` with ECN set to CE (a bytearray is edited in place and returned; bytes give a
    new bytearray). Only for IP frames. IPv4: the header checksum is updated as RFC 1624 eqn. 3
    does, ``HC' = ~(~HC + ~m + m')`` over the 16-bit word holding the TOS byte."""
    info = info or walk(frame)
    f = frame if isinstance(frame, bytearray) else bytearray(frame)
    o = info.ip
    if info.ipv6:
        f[o + _V6_ECN] |= _CE << _V6_ECN_SHIFT
        return f
    word = o + _V4_TOS - 1          # the TOS byte is the low half of the first 16-bit word
    old = f[word] << 8 | f[word + 1]
    f[o + _V4_TOS] |= _CE
    new = f[word] << 8 | f[word + 1]
    hc = f[o + _V4_CSUM] << 8 | f[o + _V4_CSUM + 1]
    hc = ~_ones_add(_ones_add(~hc & 0xFFFF, ~old & 0xFFFF), new) & 0xFFFF
    f[o + _V4_CSUM:o + _V4_CSUM + 2] = hc.to_bytes(2, "big")
    return f


def flip_icrc_bit(frame, rng, info=None):
    """``(bytearray, byte index, bit)``: ``frame`` with one random bit flipped in the part of a
    RoCEv2 frame the ICRC covers unmasked from the BTH on: BTH (but its FECN/BECN/resv6 byte),
    extension headers, payload, pad and the ICRC itself."""
    info = info or walk(frame)
    if not info.roce:
        raise ValueError("not a RoCEv2 frame")
    f = bytearray(frame)
    i = rng.randrange(info.end - info.bth - 1)
    i += info.bth + (i >= _BTH_MASKED)
    bit = rng.randrange(8)
    f[i] ^= 1 << bit
    return f, i, bit


# --------------------------------------------------------------------------------------------
# Configuration, counters, log
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class LinkConfig:
    """Impairments and wire of one direction. Probabilities are per frame.

    ``drop``, ``duplicate``, ``reorder``, ``corrupt``, ``ecn_mark``: probabilities (0..1).
    ``delay``: propagation delay in cycles (at least :data:`MIN_DELAY` is applied).
    ``jitter``: extra delay, uniform in 0..jitter cycles.
    ``reorder_depth``: a reordered frame lets 1..reorder_depth later frames go first.
    ``reorder_timeout``: cycles after which a held frame leaves even if fewer came.
    ``bytes_per_cycle``: wire rate (int or Fraction); None: the stream width in bytes.
    ``overhead``: wire bytes per frame not on the stream (preamble+SFD 8, FCS 4, IFG 12).
    ``ecn_threshold``: mark ECT frames that queue behind more than this many wire bytes (None: off).
    ``seed``: the link's random seed; None: derived from cocotb's seed and the link name.
    ``red_kmin``, ``red_kmax``: RED marking thresholds on the queue occupancy in wire bytes
    (both None: RED off; ``0 <= kmin <= kmax``); ``red_pmax``: marking probability at ``kmax``
    (default 0.01, DCQCN's recommendation).
    ``queue_limit``: tail-drop a frame that would take the occupancy above this many wire bytes
    (None: unlimited).
    """
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    ecn_mark: float = 0.0
    delay: int = 20
    jitter: int = 0
    reorder_depth: int = 4
    reorder_timeout: int = 1000
    bytes_per_cycle: int | Fraction | None = None
    overhead: int = DEFAULT_OVERHEAD
    ecn_threshold: int | None = None
    seed: int | None = None
    red_kmin: int | None = None
    red_kmax: int | None = None
    red_pmax: float = 0.01
    queue_limit: int | None = None

    def __post_init__(self):
        for name in ("drop", "duplicate", "reorder", "corrupt", "ecn_mark", "red_pmax"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"LinkConfig.{name}={p} is not a probability")
        for name in ("delay", "jitter", "overhead", "reorder_timeout"):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 0:
                raise ValueError(f"LinkConfig.{name}={getattr(self, name)} must be an integer >= 0")
        if int(self.reorder_depth) != self.reorder_depth or self.reorder_depth < 1:
            raise ValueError(f"LinkConfig.reorder_depth={self.reorder_depth} must be >= 1")
        if self.bytes_per_cycle is not None and Fraction(self.bytes_per_cycle) <= 0:
            raise ValueError(f"LinkConfig.bytes_per_cycle={self.bytes_per_cycle} must be > 0")
        if (self.red_kmin is None) != (self.red_kmax is None):
            raise ValueError("LinkConfig.red_kmin and red_kmax are set together (or neither)")
        if self.red_kmin is not None and not 0 <= self.red_kmin <= self.red_kmax:
            raise ValueError(f"LinkConfig: need 0 <= red_kmin={self.red_kmin} <= red_kmax={self.red_kmax}")
        if self.queue_limit is not None and self.queue_limit < 0:
            raise ValueError(f"LinkConfig.queue_limit={self.queue_limit} must be >= 0")


def red_probability(q, kmin, kmax, pmax):
    """RED/DCQCN marking probability of an ECT frame that finds ``q`` bytes queued: 0 up to
    ``kmin``, rising linearly to ``pmax`` at ``kmax`` (inclusive), 1 above ``kmax``."""
    if q <= kmin:
        return 0.0
    if q <= kmax:
        return pmax * (q - kmin) / (kmax - kmin)
    return 1.0


COUNTER_NAMES = ("frames_in", "frames_out", "bytes_in", "bytes_out", "dropped", "duplicated",
                 "reordered", "corrupted", "ecn_marked", "cut_dropped", "queue_dropped",
                 "ecn_marked_red")


@dataclasses.dataclass
class LinkCounters:
    """What one link did. ``frames_out``/``bytes_out`` count frames handed to the receiver
    (duplicates twice); ``reordered`` counts frames that at least one later frame overtook;
    ``late_cycles`` adds up how much later than scheduled frames left (receiver stalls);
    ``queue_dropped`` counts frame copies tail-dropped by ``queue_limit`` (``dropped``: the
    random ones); ``ecn_marked_red`` the marks decided by the RED draw (also in ``ecn_marked``)."""
    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    corrupted: int = 0
    ecn_marked: int = 0
    cut_dropped: int = 0
    late_cycles: int = 0
    queue_dropped: int = 0
    ecn_marked_red: int = 0

    def as_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class FrameRecord:
    """One frame copy in the link's log.

    ``seq``: arrival number; ``copy``: 0, or 1 for the second copy of a duplicate (same
    action); ``cycle_in``: arrival edge; ``cycle_out``: departure edge (None while queued or
    when dropped); ``action``: ``"pass"``, ``"drop"``, ``"cut"``, ``"qdrop"`` (tail drop) or
    ``"+"``-joined ``corrupt``, ``ecn``, ``dup``, ``reorder<k>`` (overtaken by k later frames),
    ``held`` (released by the timeout, not overtaken); ``opcode``, ``dest_qp``, ``psn``: BTH
    fields as they arrived (None: not RoCE); ``corrupt_at``: ``(byte, bit)`` flipped;
    ``queue``: occupancy in wire bytes the frame found at its arrival edge (without itself).
    """
    seq: int
    copy: int
    length: int
    cycle_in: int
    cycle_out: int | None
    action: str
    opcode: int | None = None
    dest_qp: int | None = None
    psn: int | None = None
    corrupt_at: tuple | None = None
    queue: int | None = None


@dataclasses.dataclass
class QueueStats:
    """The output queue over ``[start, end]`` (cycles, Fractions where a wire end falls between
    edges). ``peak``: highest occupancy (bytes) reached in the interval (exact, whatever the
    decimation); ``mean``: time-weighted mean occupancy (bytes, Fraction; None for an empty
    interval); ``occupancy``: at ``end``; ``samples``: ``[(cycle, bytes after the change)]``, a
    step function (several points may share a cycle), decimated as the link's docstring says.
    """
    start: Fraction | None
    end: Fraction | None
    peak: int
    mean: Fraction | None
    occupancy: int
    samples: list


@dataclasses.dataclass
class _Entry:
    data: bytes
    ready: int                  # earliest departure edge
    record: FrameRecord
    depart: int | None = None   # scheduled departure edge
    start: Fraction | None = None
    wire_bytes: int = 0         # its share of the queue occupancy


class _Series:
    """The occupancy time series: a point per change, every ``stride``-th change kept; when
    more than ``cap`` points are kept, every other one goes and the stride doubles (the kept
    points stay those of changes numbered by multiples of the stride)."""

    def __init__(self, cap):
        self.cap = cap
        self.samples = []
        self.stride = 1
        self.events = 0

    def add(self, t, occ):
        if self.cap and self.events % self.stride == 0:
            self.samples.append((t, occ))
            if len(self.samples) > self.cap:
                self.samples = self.samples[::2]
                self.stride *= 2
        self.events += 1

    def copy(self):
        other = _Series(self.cap)
        other.samples = list(self.samples)
        other.stride, other.events = self.stride, self.events
        return other


@dataclasses.dataclass
class _Hold:
    entries: list
    remaining: int
    deadline: int
    passed: int = 0


# --------------------------------------------------------------------------------------------
# The link without cocotb
# --------------------------------------------------------------------------------------------

class LinkModel:
    """One direction of the switch as a pure-Python model, driven by cycle numbers.

    ``arrive(frame, cycle)`` applies the impairments and queues the frame; ``expire(cycle)``
    releases held (reordered) frames whose timeout passed; ``pop()`` takes the next frame off the
    queue and schedules its departure edge (``entry.depart``); ``sent(entry, start, end)`` reports
    the edge it was first presented and the edge its last beat was driven. :meth:`simulate`
    runs a whole arrival list with a receiver that never stalls.

    The output queue (occupancy, RED, tail drop, statistics; see the module docstring) is
    advanced by arrivals; :meth:`queue_stats` reads it up to any later cycle, and
    :meth:`reset_queue_stats` restarts the statistics (e.g. after a warm-up). ``monitors``:
    callables called with the :class:`FrameRecord` of every departed frame copy
    (:meth:`add_monitor`, e.g. a :class:`FlowMonitor`).

    Parameters: ``config`` (:class:`LinkConfig`, ``bytes_per_cycle`` filled in), ``name``,
    ``stream_bytes`` (bytes per beat of the receiving stream; default ``bytes_per_cycle``),
    ``history`` (records kept: an int bounds the log, None keeps all, 0 none),
    ``queue_samples`` (most points kept of the occupancy time series; 0: none).
    """

    def __init__(self, config: LinkConfig, *, name="link", stream_bytes=None, history=100_000,
                 queue_samples=4096):
        if config.bytes_per_cycle is None:
            raise ValueError("LinkModel needs config.bytes_per_cycle")
        self.name = name
        self.seed = config.seed if config.seed is not None else zlib.crc32(name.encode())
        self.rng = random.Random(self.seed)
        # RED has its own stream (a str seed is hashed with SHA-512: stable across runs), so the
        # draws of the other impairments do not depend on whether RED is on.
        self.red_rng = random.Random(f"red/{self.seed}")
        self.config = None
        self.set_config(config)
        self.stream_bytes = int(stream_bytes or self._bpc)
        self.counters = LinkCounters()
        self.history = collections.deque(maxlen=history) if history is not None else collections.deque()
        self._keep_history = history != 0
        self.fifo = collections.deque()
        self.held = []
        self.wire_busy = Fraction(0)       # cycles the wire carried frames (overhead included)
        self._wire_end = Fraction(-10**9)  # wire time at which the last scheduled frame ends
        self._stream_free = -10**9         # first edge the stream can present a new frame
        self._cut = None                   # None: no cut; else a predicate (or True: everything)
        self.monitors = []
        # Output queue: bytes of the admitted copies not yet off the wire, and the scheduled
        # copies among them as [wire end, bytes, entry] in wire order (so by wire end).
        self._occ = 0
        self._inflight = collections.deque()
        self._t0 = None                    # start of the statistics (first arrival or reset)
        self._t_last = None                # time up to which _area integrates _occ
        self._area = Fraction(0)           # integral of the occupancy, byte-cycles
        self._peak = 0
        self._series = _Series(queue_samples)

    # -- configuration ----------------------------------------------------------------------

    def set_config(self, config: LinkConfig):
        """Change the impairments from the next arrival on. The wire (bytes_per_cycle, overhead)
        may change too; the random stream and the seed stay."""
        bpc = Fraction(config.bytes_per_cycle if config.bytes_per_cycle is not None
                       else self.config.bytes_per_cycle)
        self.config = dataclasses.replace(config, seed=getattr(self, "seed", config.seed),
                                          bytes_per_cycle=bpc)
        self._bpc = bpc

    def cut(self, predicate: Callable[[bytes], bool] | None = None):
        """Drop every frame (or each for which ``predicate(frame)`` is true) until restore()."""
        self._cut = predicate if predicate is not None else True

    def restore(self):
        self._cut = None

    def wire_time(self, length) -> Fraction:
        """Cycles a frame of ``length`` stream bytes occupies the wire."""
        return Fraction(length + self.config.overhead) / self._bpc

    def add_monitor(self, fn: Callable[[FrameRecord], None]):
        """Call ``fn(record)`` for every frame copy that departs (``record.cycle_out`` set)."""
        self.monitors.append(fn)

    # -- output queue -------------------------------------------------------------------------

    @property
    def occupancy(self) -> int:
        """Queue occupancy in wire bytes as of the last arrival (see the module docstring)."""
        return self._occ

    def _advance(self, t):
        """Move the queue's clock to edge ``t``: retire the copies whose wire end is ``<= t``."""
        if self._t_last is None:
            self._t0 = self._t_last = t
            self._series.add(t, self._occ)
        while self._inflight and self._inflight[0][0] <= t:
            end, nbytes, _ = self._inflight.popleft()
            self._integrate(end)
            self._occ -= nbytes
            self._series.add(end, self._occ)
        self._integrate(t)

    def _integrate(self, t):
        if t > self._t_last:
            self._area += self._occ * (t - self._t_last)
            self._t_last = t

    def _admit(self, entry, cycle):
        entry.wire_bytes = len(entry.data) + self.config.overhead
        self._occ += entry.wire_bytes
        self._peak = max(self._peak, self._occ)
        self._series.add(cycle, self._occ)

    def queue_stats(self, until=None) -> QueueStats:
        """Statistics of the output queue from the first arrival (or the last
        :meth:`reset_queue_stats`) to cycle ``until`` (default: when the last scheduled copy
        leaves the wire if nothing else waits, else the last arrival). Does not change the
        link: ``until`` may lie beyond arrivals still to come."""
        if self._t_last is None:
            return QueueStats(None, None, 0, None, 0, [])
        if until is None:
            until = self._t_last
            if self._inflight and not self.fifo and not self.held:
                until = self._inflight[-1][0]
        until = max(until, self._t_last)
        area, occ, t = self._area, self._occ, self._t_last
        series = self._series.copy()
        for end, nbytes, _ in self._inflight:
            if end > until:
                break
            area += occ * (end - t)
            t = end
            occ -= nbytes
            series.add(end, occ)
        area += occ * (until - t)
        span = until - self._t0
        mean = Fraction(area) / span if span > 0 else None
        return QueueStats(self._t0, until, self._peak, mean, occ, series.samples)

    def reset_queue_stats(self, cycle):
        """Restart peak, mean and time series at edge ``cycle`` (not before the last arrival),
        from the occupancy the queue has then."""
        if self._t_last is None:
            self._t_last = cycle
        self._advance(max(cycle, self._t_last))
        self._t0 = self._t_last
        self._area = Fraction(0)
        self._peak = self._occ
        self._series = _Series(self._series.cap)
        self._series.add(self._t0, self._occ)

    # -- arrivals -----------------------------------------------------------------------------

    def _log(self, rec):
        if self._keep_history:
            self.history.append(rec)

    def arrive(self, frame, cycle):
        """A frame (bytes) whose last beat was taken at edge ``cycle``. Returns the new
        :class:`_Hold` when the frame is held back for reordering, else None."""
        cfg, c = self.config, self.counters
        # Five uniforms and a seed for everything else (jitter, bit to flip, hold depth), drawn
        # for every frame: whatever happens to one frame, the next draws the same numbers.
        r_drop, r_corrupt, r_ecn, r_dup, r_reorder = (self.rng.random() for _ in range(5))
        aux_seed = self.rng.getrandbits(64)
        r_red = self.red_rng.random()
        aux = random.Random(aux_seed) if cfg.jitter or cfg.corrupt or cfg.reorder else None
        jitter = aux.randint(0, cfg.jitter) if cfg.jitter else 0
        seq = c.frames_in
        c.frames_in += 1
        c.bytes_in += len(frame)
        info = walk(frame)
        self._advance(cycle)
        q = self._occ
        rec = FrameRecord(seq, 0, len(frame), cycle, None, "pass", queue=q)
        if info.roce:
            b = info.bth
            rec.opcode = frame[b + _BTH_OPCODE]
            rec.dest_qp = int.from_bytes(frame[b + _BTH_QP:b + _BTH_QP + 3], "big")
            rec.psn = int.from_bytes(frame[b + _BTH_PSN:b + _BTH_PSN + 3], "big")
        self._log(rec)
        if self._cut is not None and (self._cut is True or self._cut(frame)):
            c.cut_dropped += 1
            rec.action = "cut"
            return None
        if r_drop < cfg.drop:
            c.dropped += 1
            rec.action = "drop"
            return None
        wire = len(frame) + cfg.overhead
        limit = cfg.queue_limit
        if limit is not None and q + wire > limit:
            c.queue_dropped += 1
            rec.action = "qdrop"
            return None

        actions = []
        data = frame
        if r_corrupt < cfg.corrupt and info.roce:
            data, byte, bit = flip_icrc_bit(data, aux, info)
            rec.corrupt_at = (byte, bit)
            c.corrupted += 1
            actions.append("corrupt")
        ready = cycle + max(cfg.delay, MIN_DELAY) + jitter
        if info.ip >= 0 and ecn_field(data, info) in _ECT:
            congested = (cfg.ecn_threshold is not None
                         and self.queue_delay(ready) * self._bpc > cfg.ecn_threshold)
            red = (cfg.red_kmin is not None
                   and r_red < red_probability(q, cfg.red_kmin, cfg.red_kmax, cfg.red_pmax))
            if r_ecn < cfg.ecn_mark or congested or red:
                data = mark_ce(data, info)
                c.ecn_marked += 1
                c.ecn_marked_red += red
                actions.append("ecn")
        data = bytes(data)
        entries = [_Entry(data, ready, rec)]
        if r_dup < cfg.duplicate:
            c.duplicated += 1
            actions.append("dup")
        rec.action = "+".join(actions) or "pass"
        if r_dup < cfg.duplicate:
            copy = dataclasses.replace(rec, copy=1)
            self._log(copy)
            if limit is not None and q + 2 * wire > limit:
                c.queue_dropped += 1        # the second copy does not fit behind the first
                copy.action = "qdrop"
            else:
                entries.append(_Entry(data, ready, copy))
        for e in entries:
            self._admit(e, cycle)
        if r_reorder < cfg.reorder:
            hold = _Hold(entries, aux.randint(1, cfg.reorder_depth), cycle + cfg.reorder_timeout)
            self.held.append(hold)
            return hold
        self._enqueue(entries, cycle)
        return None

    def _enqueue(self, entries, cycle):
        """Queue one frame (its copies); it overtakes every frame held since before it arrived,
        and those it was the last one to wait for go in right behind it (and overtake in turn)."""
        self.fifo.extend(entries)
        seq = entries[0].record.seq
        for hold in list(self.held):
            if hold.entries[0].record.seq < seq and hold in self.held:
                hold.passed += 1
                hold.remaining -= 1
                if hold.remaining == 0:
                    self._release(hold, cycle)

    def _release(self, hold, cycle):
        self.held.remove(hold)
        for e in hold.entries:
            e.ready = max(e.ready, cycle + MIN_DELAY)
            tag = f"reorder{hold.passed}" if hold.passed else "held"
            e.record.action = tag if e.record.action == "pass" else f"{e.record.action}+{tag}"
        if hold.passed:
            self.counters.reordered += len(hold.entries)
        self._enqueue(hold.entries, cycle)

    def expire(self, cycle):
        """Release the held frames whose ``reorder_timeout`` ends at or before ``cycle``."""
        for hold in [h for h in self.held if h.deadline <= cycle]:
            if hold in self.held:
                self._release(hold, cycle)

    def queue_delay(self, ready) -> Fraction:
        """Cycles a frame ready at edge ``ready`` would wait for the wire behind the queue."""
        end = self._wire_end
        for e in self.fifo:
            end = max(end, Fraction(e.ready)) + self.wire_time(len(e.data))
        return max(Fraction(0), end - ready)

    # -- departures ---------------------------------------------------------------------------

    def pop(self):
        """Take the next queued frame and schedule its departure edge (``entry.depart``)."""
        e = self.fifo.popleft()
        start = max(self._wire_end, Fraction(e.ready), Fraction(self._stream_free))
        e.start = start
        e.depart = math.ceil(start)
        self._wire_end = start + self.wire_time(len(e.data))
        self._inflight.append([self._wire_end, e.wire_bytes, e])
        self._stream_free = e.depart + -(-len(e.data) // self.stream_bytes)
        return e

    def sent(self, e, start, end=None):
        """Frame ``e`` was first presented at edge ``start``, its last beat driven at edge
        ``end`` (default: on time, ``start + beats - 2``)."""
        beats = -(-len(e.data) // self.stream_bytes)
        if end is None:
            end = start + beats - 2
        if start > e.depart:
            # The receiver stalled: the wire restarts from where the frame really left.
            self.counters.late_cycles += start - e.depart
            self._wire_end = start + self.wire_time(len(e.data))
            # It leaves the queue later too (unless an arrival already retired it on schedule).
            for item in reversed(self._inflight):
                if item[2] is e:
                    item[0] = self._wire_end
                    break
        self._stream_free = max(self._stream_free, end + 2)
        e.record.cycle_out = start
        c = self.counters
        c.frames_out += 1
        c.bytes_out += len(e.data)
        self.wire_busy += self.wire_time(len(e.data))
        for fn in self.monitors:
            fn(e.record)

    def idle(self):
        return not self.fifo and not self.held

    def simulate(self, arrivals):
        """Run ``arrivals`` (``(cycle, frame)`` in time order) through the link with a receiver
        that never stalls; returns ``[(departure edge, frame bytes, record)]`` in departure
        order. Held frames are released at their timeout relative to the arrivals."""
        out = []

        def drain():
            while self.fifo:
                e = self.pop()
                self.sent(e, e.depart)
                out.append((e.depart, e.data, e.record))

        for cycle, frame in arrivals:
            while self.held and min(h.deadline for h in self.held) < cycle:
                deadline = min(h.deadline for h in self.held)
                self.expire(deadline)
                drain()
            self.arrive(frame, cycle)
            drain()
        while self.held:
            self.expire(min(h.deadline for h in self.held))
            drain()
        return out

    def counters_dict(self):
        return {**self.counters.as_dict(), "wire_busy_cycles": self.wire_busy}


# --------------------------------------------------------------------------------------------
# Per-flow throughput
# --------------------------------------------------------------------------------------------

def _dest_qp(record):
    return record.dest_qp


class FlowMonitor:
    """Bytes delivered per flow and per window of ``window`` cycles, as rates in Mb/s.

    A frame copy counts in the window of its departure edge (``record.cycle_out``): window
    ``k`` holds the edges ``origin + k*window <= cycle < origin + (k+1)*window``, and a window
    of ``b`` bytes is ``b * 8 * cycles_per_us / window`` Mb/s (bits per microsecond).
    ``cycles_per_us``: the clock in MHz (int, float or Fraction). ``key(record)``: the flow of a
    :class:`FrameRecord` (default its BTH destination QP); None leaves the frame out (non-RoCE
    frames by default). ``overhead``: bytes added per frame (0: stream bytes, i.e. the frame
    without FCS; ``DEFAULT_OVERHEAD``: wire bytes).

    Feed it a link's history (:meth:`from_history`, records not departed are skipped) or
    attach it (``link.add_monitor(monitor)``: it is called with each departing record), or
    call :meth:`add` directly.
    """

    def __init__(self, window, cycles_per_us, *, key=_dest_qp, origin=0, overhead=0):
        if window <= 0:
            raise ValueError("FlowMonitor window must be > 0 cycles")
        self.window = window
        self.cycles_per_us = cycles_per_us
        self.key = key
        self.origin = origin
        self.overhead = overhead
        self.bins = collections.defaultdict(collections.Counter)   # key -> {window: bytes}

    @classmethod
    def from_history(cls, records, window, cycles_per_us, **kw):
        mon = cls(window, cycles_per_us, **kw)
        for rec in records:
            mon(rec)
        return mon

    def __call__(self, record):
        if record.cycle_out is None:
            return
        k = self.key(record)
        if k is not None:
            self.add(record.cycle_out, record.length + self.overhead, k)

    def add(self, cycle, nbytes, key):
        """``nbytes`` of flow ``key`` delivered at edge ``cycle``."""
        self.bins[key][(cycle - self.origin) // self.window] += nbytes

    def _mbps(self, nbytes, windows=1):
        return float(Fraction(nbytes * 8) * Fraction(self.cycles_per_us) / (self.window * windows))

    def totals(self):
        """``{key: bytes}`` over everything seen."""
        return {k: sum(b.values()) for k, b in self.bins.items()}

    def series(self):
        """``{key: [(window start cycle, Mb/s), ...]}``: every flow over the same windows, from
        the first to the last window any flow was seen in (empty windows are 0)."""
        if not self.bins:
            return {}
        lo = min(min(b) for b in self.bins.values())
        hi = max(max(b) for b in self.bins.values())
        return {k: [(self.origin + w * self.window, self._mbps(b.get(w, 0)))
                    for w in range(lo, hi + 1)] for k, b in self.bins.items()}

    def series_us(self):
        """:meth:`series` with the window start in microseconds (for :mod:`stellar.sim.ccplot`)."""
        return {k: [(float(Fraction(t) / Fraction(self.cycles_per_us)), v) for t, v in pts]
                for k, pts in self.series().items()}

    def mean_rates(self, start=None, end=None):
        """``{key: mean Mb/s}`` over the cycles ``[start, end)``, both rounded down to a window
        boundary (default: every window any flow was seen in); for :func:`jain`."""
        if not self.bins:
            return {}
        lo = (start - self.origin) // self.window if start is not None else min(
            min(b) for b in self.bins.values())
        hi = (end - self.origin) // self.window if end is not None else max(
            max(b) for b in self.bins.values()) + 1
        if hi <= lo:
            raise ValueError("FlowMonitor.mean_rates: empty interval")
        return {k: self._mbps(sum(v for w, v in b.items() if lo <= w < hi), hi - lo)
                for k, b in self.bins.items()}


def jain(xs):
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all equal, ``1/n`` when one
    takes everything. All zeros count as equal (1.0); an empty list is an error."""
    xs = list(xs)
    if not xs:
        raise ValueError("jain() of no values")
    sq = sum(x * x for x in xs)
    if sq == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sq)


# --------------------------------------------------------------------------------------------
# cocotb side
# --------------------------------------------------------------------------------------------

class ClockTimebase:
    """Cycle numbers of a free-running clock from sim time: rising edge ``k`` is at
    ``phase + k * period`` steps, so every model that measures the same clock numbers its edges
    the same way (a link's history and a host memory's write log can be compared).
    :meth:`measure` waits for two rising edges; until then ``period`` is None."""

    def __init__(self, clock):
        self.clock = clock
        self.period = None
        self.phase = None
        self._measuring = None

    async def measure(self):
        from cocotb.simtime import get_sim_time
        from cocotb.triggers import RisingEdge
        if self.period is not None:
            return
        await RisingEdge(self.clock)
        t0 = get_sim_time("step")
        await RisingEdge(self.clock)
        t1 = get_sim_time("step")
        if self.period is None:
            self.period = t1 - t0
            self.phase = t0 % self.period

    def cycle(self, t=None):
        """Edge number of sim time ``t`` (steps; default now): the last edge at or before it."""
        if t is None:
            from cocotb.simtime import get_sim_time
            t = get_sim_time("step")
        return (int(t) - self.phase) // self.period

    def edge_time(self, k):
        return self.phase + k * self.period


class Link:
    """One direction of the switch, in a cocotb test.

    Parameters: ``config`` (:class:`LinkConfig`); ``sink`` (cocotbext-axi ``AxiStreamSink`` on
    the transmitting core's ``m_axis_tx``; leave it unpaused); ``source`` (``AxiStreamSource`` on
    the receiving core's ``s_axis_rx``); ``clock`` (the signal both run on); ``name`` (log name,
    seed derivation); ``history`` (records kept, see :class:`LinkModel`); ``queue_samples``
    (points kept of the queue's time series, see :class:`LinkModel`).

    Attributes: ``model`` (:class:`LinkModel`), ``seed``, ``history`` (deque of
    :class:`FrameRecord`), ``wire_busy_cycles`` (Fraction), ``timebase`` (:class:`ClockTimebase`).
    The output queue: :meth:`queue_stats`, :meth:`reset_queue_stats`; per-flow rates:
    :meth:`add_monitor` with a :class:`FlowMonitor`.
    Call :meth:`start` once; frames the sink took earlier wait in its queue with their timestamps.
    """

    def __init__(self, config: LinkConfig, sink, source, clock, *, name="link", history=100_000,
                 queue_samples=4096):
        import cocotb
        self.sink = sink
        self.source = source
        self.clock = clock
        self.name = name
        self.log = logging.getLogger(f"cocotb.switch.{name}")
        if config.seed is None:
            config = dataclasses.replace(
                config, seed=(cocotb.RANDOM_SEED + zlib.crc32(name.encode())) & 0xFFFF_FFFF)
        if config.bytes_per_cycle is None:
            config = dataclasses.replace(config, bytes_per_cycle=source.byte_lanes)
        self.model = LinkModel(config, name=name, stream_bytes=source.byte_lanes, history=history,
                               queue_samples=queue_samples)
        self.seed = self.model.seed
        self.timebase = ClockTimebase(clock)
        self._kick = None
        self._tasks = []
        self._in_flight = 0
        self.log.info("link %s: seed %d, %s", name, self.seed, self.model.config)

    # -- control ------------------------------------------------------------------------------

    @property
    def config(self):
        return self.model.config

    def set_config(self, config: LinkConfig):
        """New impairments from the next arriving frame on (seed and random stream kept)."""
        self.model.set_config(config)
        self.log.info("link %s: %s", self.name, self.model.config)

    def cut(self, predicate=None):
        """Drop every frame, or those for which ``predicate(frame bytes)`` is true, until
        :meth:`restore` (counted in ``cut_dropped``)."""
        self.model.cut(predicate)

    def restore(self):
        self.model.restore()

    @property
    def counters(self) -> LinkCounters:
        return self.model.counters

    @property
    def history(self):
        return self.model.history

    @property
    def wire_busy_cycles(self) -> Fraction:
        return self.model.wire_busy

    def add_monitor(self, fn):
        """Call ``fn(record)`` for every departing frame copy (e.g. a :class:`FlowMonitor`)."""
        self.model.add_monitor(fn)

    def queue_stats(self, until=None) -> QueueStats:
        """:meth:`LinkModel.queue_stats` up to ``until`` (default: the current edge)."""
        if until is None and self.timebase.period is not None:
            until = self.timebase.cycle()
        return self.model.queue_stats(until)

    def reset_queue_stats(self):
        """Restart the queue statistics at the current edge (e.g. after a warm-up)."""
        self.model.reset_queue_stats(self.timebase.cycle())

    def idle(self):
        """Nothing in the sink, the queue, held back or being sent."""
        return (self.sink.empty() and not self.sink.active and self.model.idle()
                and not self._in_flight)

    async def wait_idle(self, timeout_cycles=100_000):
        """Wait until :meth:`idle`, at most ``timeout_cycles`` (then raise TimeoutError)."""
        from cocotb.triggers import RisingEdge
        for _ in range(timeout_cycles):
            if self.idle():
                return
            await RisingEdge(self.clock)
        raise TimeoutError(f"link {self.name} not idle after {timeout_cycles} cycles")

    def start(self):
        import cocotb
        from cocotb.triggers import Event
        if self._tasks:
            return
        self._kick = Event()
        self._tasks = [cocotb.start_soon(self._ingress()), cocotb.start_soon(self._egress())]

    # -- processes ----------------------------------------------------------------------------

    async def _ingress(self):
        import cocotb
        await self.timebase.measure()
        while True:
            frame = await self.sink.recv()
            cycle = self.timebase.cycle(frame.sim_time_end)
            hold = self.model.arrive(bytes(frame.tdata), cycle)
            if hold is not None:
                cocotb.start_soon(self._expire(hold))
            self._kick.set()

    async def _wait_until_before(self, edge):
        """Return strictly between edges ``edge - 1`` and ``edge`` (now if that is past)."""
        from cocotb.simtime import get_sim_time
        from cocotb.triggers import Timer
        target = self.timebase.edge_time(edge) - self.timebase.period // 2
        now = get_sim_time("step")
        if target > now:
            await Timer(target - now, "step")

    async def _expire(self, hold):
        await self._wait_until_before(hold.deadline + 1)
        if hold in self.model.held:
            self.model.expire(self.timebase.cycle())
            self._kick.set()

    async def _egress(self):
        from cocotb.triggers import Event
        from cocotbext.axi import AxiStreamFrame
        await self.timebase.measure()
        while True:
            if not self.model.fifo:
                self._kick.clear()
                await self._kick.wait()
                continue
            e = self.model.pop()
            self._in_flight = 1
            # The source drives a queued frame after the next edge and the receiver sees it at
            # the edge after that: queue it between edges depart-2 and depart-1.
            await self._wait_until_before(e.depart - 1)
            done = Event()
            sent = []

            def complete(frame, done=done, sent=sent):
                sent.append(frame)
                done.set()

            self.source.send_nowait(AxiStreamFrame(e.data, tx_complete=complete))
            await done.wait()
            f = sent[0]
            if f.sim_time_end is None:      # flushed by a reset: it never went out
                self._in_flight = 0
                continue
            self.model.sent(e, self.timebase.cycle(f.sim_time_start) + 1,
                            self.timebase.cycle(f.sim_time_end))
            self._in_flight = 0


class Switch:
    """Two links, ``ab`` (a -> b) and ``ba`` (b -> a).

    ``Switch(ab, ba)`` takes two :class:`Link`; :meth:`from_prefixes` binds them to a DUT by
    prefix: ``AxiStreamSink`` on ``{a}_{tx}`` and ``AxiStreamSource`` on ``{b}_{rx}`` for a -> b,
    the mirror for b -> a (``tx="m_axis_tx"``, ``rx="s_axis_rx"``).
    """

    def __init__(self, ab: Link, ba: Link):
        self.ab = ab
        self.ba = ba
        self.links = (ab, ba)

    @classmethod
    def from_prefixes(cls, dut, a="a", b="b", *, config_ab=None, config_ba=None, clock=None,
                      reset=None, tx="m_axis_tx", rx="s_axis_rx", history=100_000,
                      domains=False):
        """``domains``: each side has its own clock and reset (``{a}_clk`` / ``{a}_rst``, as
        ``stellar_pcie2``); a link's sink runs on its sender's clock, its source and its
        timebase on its receiver's (the clocks must have the same period)."""
        from cocotbext.axi import AxiStreamBus, AxiStreamSink, AxiStreamSource
        clock = clock if clock is not None else (None if domains else dut.clk)
        reset = reset if reset is not None else getattr(dut, "rst", None)

        def side(p):
            if domains:
                return getattr(dut, f"{p}_clk"), getattr(dut, f"{p}_rst")
            return clock, reset
        links = []
        for src, dst, cfg in ((a, b, config_ab), (b, a, config_ba)):
            sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"{src}_{tx}"), *side(src))
            source = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"{dst}_{rx}"), *side(dst))
            for bfm in (sink, source):      # the link's history replaces a log line per frame
                bfm.log.setLevel(max(bfm.log.getEffectiveLevel(), logging.WARNING))
            links.append(Link(cfg or LinkConfig(), sink, source, side(dst)[0],
                              name=f"{src}->{dst}", history=history))
        return cls(*links)

    def start(self):
        for link in self.links:
            link.start()

    def idle(self):
        return all(link.idle() for link in self.links)

    async def wait_idle(self, timeout_cycles=100_000):
        for link in self.links:
            await link.wait_idle(timeout_cycles)

    def counters(self):
        """``{link name: {counter: value, ..., "wire_busy_cycles": Fraction}}``."""
        return {link.name: link.model.counters_dict() for link in self.links}

    def summary(self, elapsed_cycles=None):
        """A printable table of both links' counters (and wire utilization over
        ``elapsed_cycles`` when given)."""
        cols = ["link", *COUNTER_NAMES, "late_cycles", "wire_busy"]
        if elapsed_cycles:
            cols.append("util")
        rows = []
        for link in self.links:
            d = link.model.counters_dict()
            row = [link.name, *(str(d[n]) for n in COUNTER_NAMES), str(d["late_cycles"]),
                   f"{float(d['wire_busy_cycles']):.1f}"]
            if elapsed_cycles:
                row.append(f"{float(d['wire_busy_cycles']) / elapsed_cycles:.3f}")
            rows.append(row)
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        lines = [fmt.format(*cols)] + [fmt.format(*r) for r in rows]
        seeds = ", ".join(f"{link.name} seed {link.seed}" for link in self.links)
        return "\n".join(lines + [seeds])
