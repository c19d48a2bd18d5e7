"""stellar.sim.switch without a simulator: header walk, ECN marking, corruption, impairment
statistics and the wire schedule of ``LinkModel``.

References are independent of the switch's own code: scapy dissects frames (header offsets,
ECN field, IPv4 checksum recomputed, ICRC recomputed by ``scapy.contrib.roce``) and the wire
schedule is restated with ``Fraction`` sums; the output queue (occupancy each arrival finds, RED
probabilities, tail drops, peak and mean) by :func:`ref_queue` and hand-computed staircases, the
flow monitor and Jain's index by hand. ``STELLAR_SEED=<n>`` replays one seed.
"""

import bisect
import dataclasses
import math
import random
from fractions import Fraction

import pytest
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from stellar.sim import packets
from stellar.sim.amaranth_streams import run_seeds, seeded_rng
from stellar.sim.captures import is_rocev2, load_captures
from stellar.sim.switch import (
    DEFAULT_OVERHEAD,
    MIN_DELAY,
    FlowMonitor,
    FrameRecord,
    LinkConfig,
    LinkModel,
    bth_dest_qp,
    bth_opcode,
    bth_psn,
    ecn_field,
    flip_icrc_bit,
    jain,
    mark_ce,
    walk,
)
from stellar.sim.tb_switch import icrc_ok, ip_ecn, ipv4_checksum_ok, tagged_frame

SEEDS = run_seeds([1, 2])


def scapy_offsets(frame):
    """(ip offset, is IPv6, end of IP packet, BTH offset or -1) from scapy's dissection."""
    p = Ether(frame)
    l3 = p[Dot1Q].payload if Dot1Q in p else p.payload
    if not isinstance(l3, (IP, IPv6)):
        return (-1, False, -1, -1)
    ip = len(frame) - len(bytes(l3))
    end = ip + (l3.len if isinstance(l3, IP) else 40 + l3.plen)
    l4 = l3.payload
    bth = -1
    if isinstance(l4, UDP) and l4.dport == 4791:
        bth = len(frame) - len(bytes(l4.payload))
    return (ip, isinstance(l3, IPv6), end, bth)


def random_frames(rng, n):
    return [packets.roce_frame(**packets.random_roce(rng)) for _ in range(n)]


# --------------------------------------------------------------------------------------------
# Header walk
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_walk_matches_scapy(seed):
    """Offsets and BTH fields of random RoCEv2 frames (any opcode, VLAN or not, IPv4 with
    options or IPv6), non-RoCE frames of every kind and the real captures, against scapy."""
    rng = seeded_rng("switch-walk", seed)
    frames = random_frames(rng, 150)
    frames += [packets.non_roce_frame(k, rng, vlan=rng.random() < 0.5).frame
               for k in packets.NON_ROCE_KINDS for _ in range(4)]
    frames += [f for fs in load_captures().values() for f in fs]
    kinds = set()
    for f in frames:
        info = walk(f)
        ip, ipv6, end, bth = scapy_offsets(f)
        assert (info.ip, info.end) == ((ip, end) if ip >= 0 else (-1, -1)), f[:80].hex()
        if ip >= 0:
            assert info.ipv6 == ipv6
            assert ecn_field(f) == ip_ecn(f)
        assert info.roce == (bth >= 0) == is_rocev2(f)
        if info.roce:
            assert info.bth == bth
            b = Ether(f)[ScapyBTH]
            assert (bth_opcode(f), bth_dest_qp(f), bth_psn(f)) == (b.opcode, b.dqpn, b.psn)
            kinds.add((ipv6, Dot1Q in Ether(f), not ipv6 and (f[ip] & 15) > 5))
        else:
            assert bth_opcode(f) is bth_dest_qp(f) is bth_psn(f) is None
    # Every header combination came up: IPv4/IPv6 x VLAN, and IPv4 options.
    assert {(False, False, False), (False, True, False), (True, False, False),
            (True, True, False), (False, False, True)} <= kinds


def test_walk_truncated_never_raises():
    """Every prefix of a frame walks without an exception; a frame cut inside its IP packet is
    not IP (the IP length runs past it), so it is never marked or corrupted."""
    rng = random.Random(7)
    for f in random_frames(rng, 20):
        info = walk(f)
        for n in range(len(f)):
            cut = walk(f[:n])
            if n < info.end:
                assert cut.ip == -1 and not cut.roce
            else:
                assert cut == info


# --------------------------------------------------------------------------------------------
# ECN marking and corruption
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_ecn_mark_keeps_checksum_and_icrc(seed):
    """An ECT(0)/ECT(1) frame leaves as CE with a valid IPv4 checksum (scapy recomputes it) and
    a valid ICRC (scapy recomputes it); only the TOS/TC byte and the checksum change. Not-ECT
    and CE frames, and non-IP frames, pass unchanged and are not counted."""
    rng = seeded_rng("switch-ecn", seed)
    frames = []
    for i in range(120):
        kw = packets.random_roce(rng)
        kw["ecn"] = i % 4
        frames.append(packets.roce_frame(**kw))
    frames += [packets.non_roce_frame("arp", rng).frame]
    link = LinkModel(LinkConfig(ecn_mark=1.0, bytes_per_cycle=8, seed=seed))
    out = link.simulate([(10 * i, f) for i, f in enumerate(frames)])
    assert [r.seq for _, _, r in out] == list(range(len(frames)))
    marked = 0
    for f, (_, g, rec) in zip(frames, out, strict=True):
        before = ip_ecn(f)
        if before in (1, 2):
            marked += 1
            assert ip_ecn(g) == 3 and rec.action == "ecn"
            assert ipv4_checksum_ok(g) and icrc_ok(g)
            ip = scapy_offsets(f)[0]
            assert {k for k in range(len(f)) if f[k] != g[k]} <= {ip + 1, ip + 10, ip + 11}
        else:
            assert g == f and rec.action == "pass"
    assert link.counters.ecn_marked == marked == 60


def _ones_sum(header):
    s = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, len(header), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def test_ecn_mark_keeps_a_wrong_checksum_wrong():
    """RFC 1624: the one's-complement sum over the header (0xFFFF when the checksum is right)
    is the same before and after marking, so a wrong checksum stays wrong by the same amount."""
    rng = random.Random(3)
    for _ in range(100):
        opts = packets.ip_options_of_length(4 * rng.randint(1, 3), rng) if rng.random() < 0.7 else b""
        f = bytearray(packets.roce_frame(0x04, ecn=rng.choice((1, 2)), dscp=rng.randrange(64),
                                         payload=b"abcd", ip_options=opts))
        ip = packets.ip_offset(bytes(f))
        ihl = (f[ip] & 15) * 4
        if rng.random() < 0.7:
            f[ip + 10 + rng.randrange(2)] ^= 1 << rng.randrange(8)
        g = mark_ce(bytes(f))
        assert _ones_sum(g[ip:ip + ihl]) == _ones_sum(f[ip:ip + ihl])
        assert ipv4_checksum_ok(bytes(g)) == ipv4_checksum_ok(bytes(f))
        assert ip_ecn(bytes(g)) == 3


@pytest.mark.parametrize("seed", SEEDS)
def test_corruption_is_caught_by_the_icrc(seed):
    """``corrupt`` flips exactly one bit between the BTH and the end of the ICRC, never in the
    masked FECN/BECN/resv6 byte, and scapy's ICRC check fails on every corrupted frame;
    non-RoCE frames are never corrupted."""
    rng = seeded_rng("switch-corrupt", seed)
    frames = random_frames(rng, 150) + [packets.non_roce_frame(k, rng).frame
                                        for k in packets.NON_ROCE_KINDS]
    link = LinkModel(LinkConfig(corrupt=1.0, bytes_per_cycle=8, seed=seed))
    out = link.simulate([(10 * i, f) for i, f in enumerate(frames)])
    hits = set()
    for f, (_, g, rec) in zip(frames, out, strict=True):
        _, _, end, bth = scapy_offsets(f)
        if bth < 0:
            assert g == f and rec.action == "pass"
            continue
        diff = [k for k in range(len(f)) if f[k] != g[k]]
        assert len(diff) == 1 and bin(f[diff[0]] ^ g[diff[0]]).count("1") == 1
        k = diff[0]
        assert bth <= k < end and k != bth + 4 and rec.corrupt_at[0] == k
        assert icrc_ok(f) and not icrc_ok(g), f"flip at {k - bth} after the BTH went unnoticed"
        hits.add("bth" if k < bth + 12 else "icrc" if k >= end - 4 else "body")
    assert hits == {"bth", "body", "icrc"}
    assert link.counters.corrupted == sum(1 for f in frames if scapy_offsets(f)[3] >= 0)


def test_flip_covers_the_whole_range():
    """The flipped byte is uniform over [BTH, end) minus one byte: both ends are reachable."""
    f = packets.roce_frame(0x04, payload=b"")
    info = walk(f)
    rng = random.Random(1)
    seen = {flip_icrc_bit(f, rng)[1] for _ in range(3000)}
    assert seen == set(range(info.bth, info.end)) - {info.bth + 4}


# --------------------------------------------------------------------------------------------
# Impairment statistics, order, determinism
# --------------------------------------------------------------------------------------------

def _trace(rng, n):
    """``n`` arrivals 1..120 cycles apart, drawn from a pool of 63 frames (scapy is slow): RoCE
    and plain UDP, Not-ECT, ECT(0) and ECT(1). The link's log tells the copies apart."""
    pool = [tagged_frame(rng, i, ecn=i % 3, roce=i % 9 != 4) for i in range(63)]
    t, arrivals = 0, []
    for _ in range(n):
        t += rng.randint(1, 120)
        arrivals.append((t, pool[rng.randrange(len(pool))]))
    return arrivals


@pytest.mark.parametrize("seed", SEEDS)
def test_impairment_statistics_and_order(seed):
    """4000 frames, 10 % of each impairment: each count within 6 standard deviations of its
    expectation; dropped frames are gone, duplicates leave twice back to back, only held frames
    are overtaken and by at most reorder_depth later frames; nothing leaves before arrival +
    delay; counters add up."""
    rng = seeded_rng("switch-stats", seed)
    arrivals = _trace(rng, 4000)
    cfg = LinkConfig(drop=0.1, duplicate=0.1, reorder=0.1, corrupt=0.1, ecn_mark=0.1, delay=17,
                     jitter=5, reorder_depth=3, reorder_timeout=200, bytes_per_cycle=8, seed=seed)
    link = LinkModel(cfg)
    out = link.simulate(arrivals)
    c = link.counters
    n = len(arrivals)
    ecn_of = {f: ip_ecn(f) for _, f in arrivals}
    roce = sum(1 for _, f in arrivals if scapy_offsets(f)[3] >= 0)
    ect = sum(1 for _, f in arrivals if ecn_of[f] in (1, 2))

    def near(count, trials, p):
        sd = math.sqrt(trials * p * (1 - p))
        assert abs(count - trials * p) < 6 * sd + 1, (count, trials, p)

    near(c.dropped, n, 0.1)
    kept = n - c.dropped
    near(c.duplicated, kept, 0.1)
    near(c.corrupted, roce * 0.9, 0.1)
    near(c.ecn_marked, ect * 0.9, 0.1)
    assert c.frames_out == len(out) == kept + c.duplicated
    assert c.bytes_in == sum(len(f) for _, f in arrivals)
    assert c.bytes_out == sum(len(g) for _, g, _ in out)

    seqs = [r.seq for _, _, r in out]
    counts = {s: seqs.count(s) for s in set(seqs)}
    recs = {r.seq: r for r in link.history if r.copy == 0}
    assert {s for s in range(n) if s not in counts} == {s for s, r in recs.items() if r.action == "drop"}
    dups = {s for s, k in counts.items() if k == 2}
    assert dups == {s for s, r in recs.items() if "dup" in r.action} and max(counts.values()) == 2
    assert all(seqs[seqs.index(s) + 1] == s for s in dups), "duplicate copies not back to back"
    held = {s for s, r in recs.items() if "reorder" in r.action or "held" in r.action}
    plain = [s for s in seqs if s not in held]
    assert plain == sorted(plain)
    overtaken = 0
    counts_seen = set()
    before = []                     # distinct seqs already out, sorted
    for s in seqs:
        later_before = len(before) - bisect.bisect_right(before, s)
        if s not in counts_seen:
            bisect.insort(before, s)
            counts_seen.add(s)
        if later_before:
            assert s in held and later_before <= cfg.reorder_depth
            assert recs[s].action.endswith(f"reorder{later_before}"), recs[s].action
            overtaken += 1
    near(len(held), kept, 0.1)
    assert c.reordered == overtaken > 0
    arrived = dict((s, t) for s, (t, _) in enumerate(arrivals))
    for d, _, r in out:
        assert d >= arrived[r.seq] + cfg.delay and d == r.cycle_out


def test_deterministic_and_common_random_numbers():
    """The seed fixes everything; changing one probability leaves the other decisions of the
    frames alike (every frame draws the same numbers)."""
    rng = random.Random(5)
    arrivals = _trace(rng, 600)

    def run(**kw):
        cfg = LinkConfig(**{"drop": 0.1, "corrupt": 0.2, "ecn_mark": 0.3, "jitter": 4,
                            "bytes_per_cycle": 8, "seed": 9, **kw})
        link = LinkModel(cfg)
        return link.simulate(arrivals), link

    a, la = run()
    b, _ = run()
    assert [(d, g) for d, g, _ in a] == [(d, g) for d, g, _ in b]
    c, lc = run(seed=10)
    assert [g for _, g, _ in a] != [g for _, g, _ in c]
    d, ld = run(drop=0.0)
    acts = {r.seq: r.action for r in la.history}
    acts0 = {r.seq: r.action for r in ld.history}
    assert all(acts0[s] == a_ for s, a_ in acts.items() if a_ != "drop")
    assert sum(1 for a_ in acts.values() if a_ == "drop") > 30


def test_cut_and_restore():
    """cut(predicate) drops the matching frames only, cut() everything, restore() nothing."""
    rng = random.Random(2)
    frames = [tagged_frame(rng, i, qp=0x22 if i % 3 == 0 else 0x11) for i in range(30)]
    link = LinkModel(LinkConfig(bytes_per_cycle=8))
    link.cut(lambda f: bth_dest_qp(f) == 0x22)
    out = link.simulate([(100 * i, f) for i, f in enumerate(frames[:15])])
    link.cut()
    out += link.simulate([(2000 + 100 * i, f) for i, f in enumerate(frames[15:20])])
    link.restore()
    out += link.simulate([(3000 + 100 * i, f) for i, f in enumerate(frames[20:])])
    want = [f for f in frames[:15] if bth_dest_qp(f) != 0x22] + frames[20:]
    assert [g for _, g, _ in out] == want
    assert link.counters.cut_dropped == 5 + 5 and link.counters.dropped == 0


def test_history_bounded():
    link = LinkModel(LinkConfig(bytes_per_cycle=8), history=10)
    link.simulate([(10 * i, packets.roce_frame(0x04, bth={"psn": i})) for i in range(50)])
    assert [r.psn for r in link.history] == list(range(40, 50))
    silent = LinkModel(LinkConfig(bytes_per_cycle=8), history=0)
    silent.simulate([(0, packets.roce_frame(0x04))])
    assert not silent.history and silent.counters.frames_out == 1


def test_reorder_timeout():
    """A held frame with no later traffic leaves at its timeout, not overtaken ("held")."""
    f = packets.roce_frame(0x04)
    link = LinkModel(LinkConfig(reorder=1.0, reorder_timeout=300, delay=10, bytes_per_cycle=8))
    out = link.simulate([(50, f)])
    assert [(d, r.action) for d, _, r in out] == [(350 + MIN_DELAY, "held")]
    assert link.counters.reordered == 0


# --------------------------------------------------------------------------------------------
# Wire schedule
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bpc", [8, 64, Fraction(5), Fraction(25, 2)])
def test_wire_time_exact(bpc):
    """A burst that arrives at once leaves at ceil(delay + sum of earlier wire times), wire time
    (L + 24) / B exactly, as long as the stream keeps up; over the whole burst no fraction of a
    cycle is lost; wire_busy_cycles is the exact sum."""
    rng = random.Random(11)
    # The stream (64 bytes per beat) keeps up: at B < 64 always; at B = 64 only with integral
    # wire times equal to the beats (L % 64 == 40), otherwise a fractional start plus whole
    # beats can overtake the wire (test_wire_time_stream_limited).
    choices = [104, 168, 1000, 9000] if bpc == 64 else [104, 105, 320, 361, 1000, 1023, 9000]
    lengths = [rng.choice(choices) for _ in range(200)]
    frames = [bytes(n) for n in lengths]
    link = LinkModel(LinkConfig(delay=20, bytes_per_cycle=bpc), stream_bytes=64)
    out = link.simulate([(0, f) for f in frames])
    start = Fraction(20)
    for (d, g, _), n in zip(out, lengths, strict=True):
        assert len(g) == n and d == math.ceil(start)
        start += Fraction(n + 24) / Fraction(bpc)
    assert link.wire_busy == start - 20
    assert out[-1][0] - out[0][0] == math.ceil(start - Fraction(lengths[-1] + 24) / Fraction(bpc)) - 20


def test_wire_time_stream_limited():
    """At 64 bytes per beat and per cycle a 65-byte frame needs 2 beats but only 89/64 cycles of
    wire: back-to-back departures are 2 cycles apart, and the wire resumes from there."""
    link = LinkModel(LinkConfig(delay=5, bytes_per_cycle=64), stream_bytes=64)
    out = link.simulate([(0, bytes(65))] * 10 + [(0, bytes(1000))] * 3)
    d = [x[0] for x in out]
    assert d[:11] == [5 + 2 * i for i in range(11)]
    # After the 10th 65-byte frame (left at 23, stream free at 25) the 1000-byte frames go by the
    # wire: 1024 / 64 = 16 cycles each.
    assert d[11:] == [25 + 16, 25 + 32]


def test_idle_link_latency_and_min_delay():
    """On an idle wire a frame leaves exactly delay cycles after it arrived (at least
    MIN_DELAY); jitter adds 0..jitter and keeps the order."""
    f = packets.roce_frame(0x04)
    for delay in (0, 1, 2, 3, 40):
        link = LinkModel(LinkConfig(delay=delay, bytes_per_cycle=8))
        assert [d for d, _, _ in link.simulate([(100, f), (1000, f)])] == [
            100 + max(delay, MIN_DELAY), 1000 + max(delay, MIN_DELAY)]
    link = LinkModel(LinkConfig(delay=10, jitter=7, bytes_per_cycle=8, seed=4))
    out = link.simulate([(100 * i, bytes([i]) * 60) for i in range(200)])
    waits = [d - 100 * r.seq for d, _, r in out]
    assert [r.seq for _, _, r in out] == list(range(200))
    assert set(waits) == set(range(10, 18))


def test_ecn_threshold_marks_by_queue_depth():
    """With ecn_threshold, an ECT frame is marked exactly when the wire bytes queued ahead of it
    (its start minus its ready time, times B) exceed the threshold; a burst builds the queue."""
    f = packets.roce_frame(0x04, payload=bytes(200), ecn=2)
    n = len(f)
    link = LinkModel(LinkConfig(delay=10, bytes_per_cycle=8, ecn_threshold=1000))
    out = link.simulate([(i, f) for i in range(20)])
    w = Fraction(n + 24, 8)
    for i, (_, g, _) in enumerate(out):
        ready = i + 10
        queued = max(Fraction(0), 10 + i * w - ready) * 8
        assert (ip_ecn(g) == 3) == (queued > 1000), (i, queued)
    assert 0 < link.counters.ecn_marked < 20


def test_set_config_on_the_fly():
    f = packets.roce_frame(0x04, ecn=1)
    link = LinkModel(LinkConfig(bytes_per_cycle=8, seed=3))
    link.simulate([(0, f)])
    link.set_config(LinkConfig(drop=1.0))
    link.simulate([(100, f)])
    assert link.config.bytes_per_cycle == 8 and link.config.seed == 3
    assert link.counters.dropped == 1 and link.counters.frames_out == 1
    with pytest.raises(ValueError):
        LinkConfig(drop=1.5)
    with pytest.raises(ValueError):
        LinkConfig(reorder_depth=0)


# --------------------------------------------------------------------------------------------
# Output queue: occupancy, RED, tail drop, statistics
# --------------------------------------------------------------------------------------------

def ref_queue(arrivals, delay, bpc, overhead=DEFAULT_OVERHEAD, limit=None):
    """The queue restated from the module docstring, for FIFO traffic without impairments and a
    stream that keeps up: ``[(occupancy found, admitted, wire start or None)]`` per arrival.
    A copy counts ``L + overhead`` bytes from its arrival until ``start + wire`` (exclusive);
    it is tail-dropped when ``q + its bytes > limit``."""
    inq = []                        # (wire end, bytes) of admitted frames, in wire order
    prev_end = None
    out = []
    for t, frame in arrivals:
        inq = [(e, w) for e, w in inq if e > t]
        q = sum(w for _, w in inq)
        w = len(frame) + overhead
        if limit is not None and q + w > limit:
            out.append((q, False, None))
            continue
        start = Fraction(t + max(delay, MIN_DELAY))
        if prev_end is not None:
            start = max(start, prev_end)
        prev_end = start + Fraction(w) / Fraction(bpc)
        inq.append((prev_end, w))
        out.append((q, True, start))
    return out


def _same_length_pool():
    """Eight RoCEv2 frames of one length: Not-ECT, ECT(1), ECT(0), CE x IPv4, IPv6."""
    pool = [packets.roce_frame(0x04, ipv6=v6, ecn=ecn, payload=bytes(944 - 20 * v6),
                               bth={"dest_qp": 0x40 + ecn, "psn": v6})
            for v6 in (False, True) for ecn in range(4)]
    assert len({len(f) for f in pool}) == 1
    return pool


def _dwell_arrivals(pool, levels, per_level, delay, bpc):
    """Arrivals that hold the queue at each of ``levels`` (bytes, rising, multiples of the wire
    bytes W of a pool frame) for ``per_level`` frames. After two frames at edge 0 the wire
    stays busy (levels >= W), so frames end on the grid ``delay + j*w`` (w = W / B, integral,
    >= delay); arrivals on that grid find the queue right after one left: a burst raises it to
    the level, then one frame per wire time keeps it there."""
    wire_bytes = len(pool[0]) + DEFAULT_OVERHEAD
    w = Fraction(wire_bytes, bpc)
    assert w.denominator == 1 and w >= delay and all(level % wire_bytes == 0 for level in levels)
    arrivals = [(0, pool[0]), (0, pool[1])]
    t = max(delay, MIN_DELAY) + int(w)

    def occupancy(at):
        return ref_queue(arrivals + [(at, pool[0])], delay, bpc)[-1][0]

    for level in levels:
        while occupancy(t) < level:
            arrivals.append((t, pool[len(arrivals) % len(pool)]))
        for _ in range(per_level):
            arrivals.append((t, pool[len(arrivals) % len(pool)]))
            t += int(w)
    return arrivals


@pytest.mark.parametrize("seed", SEEDS)
def test_red_marking_probability(seed):
    """The queue is held at levels from below kmin to above kmax: every arrival finds the
    occupancy the reference computes (``FrameRecord.queue``), and the ECT frames are marked with
    the RED probability: never at or below kmin, all above kmax, in between within 5 standard
    deviations of pmax (q - kmin) / (kmax - kmin) per level (at q == kmax: pmax, not 1).
    Not-ECT and CE frames are never marked; a marked frame differs only in its TOS/TC byte and
    IPv4 checksum, and scapy finds the checksum and the ICRC valid."""
    print(f"seed {seed}")
    pool = _same_length_pool()
    wire_bytes = len(pool[0]) + DEFAULT_OVERHEAD
    kmin, kmax, pmax = 4 * wire_bytes, 12 * wire_bytes, 0.4
    levels = [k * wire_bytes for k in (2, 4, 6, 8, 10, 12, 14)]
    arrivals = _dwell_arrivals(pool, levels, 500, 2, 2)
    link = LinkModel(LinkConfig(delay=2, bytes_per_cycle=2, red_kmin=kmin, red_kmax=kmax,
                                red_pmax=pmax, seed=seed))
    out = link.simulate(arrivals)
    ref = ref_queue(arrivals, 2, 2)
    assert [r.seq for _, _, r in out] == list(range(len(arrivals)))
    trials = {}                      # occupancy -> [ECT frames, marked]
    checked = set()
    ecn_of = {f: ip_ecn(f) for f in pool}
    for (_, f), (d, g, rec), (q, _, start) in zip(arrivals, out, ref, strict=True):
        assert rec.queue == q and d == math.ceil(start)
        ecn = ecn_of[f]
        marked = g != f
        if ecn in (0, 3):
            assert not marked
            continue
        st = trials.setdefault(q, [0, 0])
        st[0] += 1
        st[1] += marked
        if marked and f not in checked:
            checked.add(f)
            assert ip_ecn(g) == 3 and ipv4_checksum_ok(g) and icrc_ok(g)
            ip = scapy_offsets(f)[0]
            assert {k for k in range(len(f)) if f[k] != g[k]} <= {ip + 1, ip + 10, ip + 11}
    assert len(checked) == 4, "an ECT kind was never marked"
    for level in levels:
        assert trials[level][0] >= 200, (level, trials[level])
    total_marked = 0
    for q, (n, m) in sorted(trials.items()):
        p = 0.0 if q <= kmin else 1.0 if q > kmax else pmax * (q - kmin) / (kmax - kmin)
        if p in (0.0, 1.0):
            assert m == n * p, (q, n, m)
        else:
            assert abs(m - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1, (q, n, m, p)
        total_marked += m
    assert link.counters.ecn_marked == link.counters.ecn_marked_red == total_marked
    assert link.counters.dropped == link.counters.queue_dropped == 0


def test_red_and_limits_leave_other_draws_alone():
    """RED's draws come from a separate stream: the seeded impairment run of a config without
    the new fields, with them at their defaults, and with RED and a queue limit that never act
    are identical; with RED marking, only the ECN marks differ (drops, corruption, duplicates,
    reorder and jitter decisions stay)."""
    arrivals = _trace(random.Random(8), 800)
    base = {"drop": 0.05, "duplicate": 0.05, "reorder": 0.05, "corrupt": 0.1, "ecn_mark": 0.1,
            "jitter": 3, "bytes_per_cycle": 8, "seed": 21}

    def run(**kw):
        link = LinkModel(LinkConfig(**{**base, **kw}), history=None)
        out = link.simulate(arrivals)
        return [(d, g) for d, g, _ in out], [dataclasses.astuple(r) for r in link.history], link

    a = run()
    b = run(red_kmin=None, red_kmax=None, red_pmax=0.01, queue_limit=None)
    c = run(red_kmin=10**9, red_kmax=10**9, red_pmax=1.0, queue_limit=10**12)
    assert a[:2] == b[:2] == c[:2]
    assert a[2].counters == c[2].counters
    d = run(red_kmin=0, red_kmax=200, red_pmax=0.5)
    assert d[2].counters.ecn_marked_red > 50
    assert d[2].counters.ecn_marked > a[2].counters.ecn_marked

    def strip(rec):
        action = "+".join(x for x in rec.action.split("+") if x != "ecn") or "pass"
        return rec.seq, rec.copy, rec.cycle_out, rec.corrupt_at, action

    assert [strip(r) for r in a[2].history] == [strip(r) for r in d[2].history]
    # The link's own stream is the documented one (five uniforms and 64 bits per frame from
    # Random(seed)), RED on or off: the drops are those of a replay of it.
    replay = random.Random(base["seed"])
    want = []
    for i in range(len(arrivals)):
        if [replay.random() for _ in range(5)][0] < base["drop"]:
            want.append(i)
        replay.getrandbits(64)
    for run_ in (a, d):
        assert [r.seq for r in run_[2].history if r.action == "drop"] == want
    assert a[0] != d[0] and [x for x, _ in a[0]] == [x for x, _ in d[0]]


@pytest.mark.parametrize("seed", SEEDS)
def test_queue_limit_tail_drop(seed):
    """Bursts of random lengths into a limited queue: exactly the frames the reference finds
    over the limit are tail-dropped (``queue_dropped``, action ``qdrop``, never ``dropped``),
    the others leave when the reference schedules them. A limit equal to the peak the
    unlimited queue reaches drops nothing (a lossless run); one byte less drops."""
    print(f"seed {seed}")
    rng = seeded_rng("switch-qlimit", seed)
    t, arrivals = 0, []
    for _ in range(60):
        t += rng.randint(0, 1200)
        for _ in range(rng.choice([1, 1, 2, 5, 12])):
            arrivals.append((t, bytes(rng.randint(60, 1500))))
    limit = 6000
    link = LinkModel(LinkConfig(delay=7, bytes_per_cycle=8, queue_limit=limit, seed=seed),
                     history=None)
    out = link.simulate(arrivals)
    ref = ref_queue(arrivals, 7, 8, limit=limit)
    expect_drop = [i for i, (_, ok, _) in enumerate(ref) if not ok]
    assert 10 < len(expect_drop) < len(arrivals) // 2
    assert [r.seq for r in link.history if r.action == "qdrop"] == expect_drop
    assert [r.queue for r in link.history] == [q for q, _, _ in ref]
    assert [(r.seq, d) for d, _, r in out] == [(i, math.ceil(s)) for i, (_, ok, s) in enumerate(ref) if ok]
    c = link.counters
    assert c.queue_dropped == len(expect_drop) and c.dropped == 0
    assert link.queue_stats().peak <= limit

    free = ref_queue(arrivals, 7, 8)
    peak = max(q + len(f) + DEFAULT_OVERHEAD for (q, _, _), (_, f) in zip(free, arrivals, strict=True))
    for lim, lossless in ((peak, True), (peak - 1, False)):
        link = LinkModel(LinkConfig(delay=7, bytes_per_cycle=8, queue_limit=lim))
        link.simulate(arrivals)
        assert (link.counters.queue_dropped == link.counters.dropped == 0) == lossless
        assert link.queue_stats().peak == (peak if lossless else link.queue_stats().peak)


def test_queue_limit_duplicate_copy():
    """The second copy of a duplicated frame occupies the queue too: it is tail-dropped alone
    when only the first fits."""
    f = bytes(100)                  # 124 wire bytes
    link = LinkModel(LinkConfig(duplicate=1.0, bytes_per_cycle=8, queue_limit=124 * 3))
    out = link.simulate([(0, f), (0, f)])
    assert [(r.seq, r.copy) for _, _, r in out] == [(0, 0), (0, 1), (1, 0)]
    assert [r.action for r in link.history] == ["dup", "dup", "dup", "qdrop"]
    assert link.counters.queue_dropped == 1 and link.counters.duplicated == 2


@pytest.mark.parametrize("bpc", [4, 8, Fraction(25, 2)])
def test_queue_statistics_staircase(bpc):
    """k frames of L bytes at edge 0, wire rate B, delay d: the occupancy is k*W on
    [0, d + w), then one W less at each d + (i+1) w (W = L + 24, w = W / B); peak k*W,
    mean sum_i W (d + (i+1) w) / (d + k w). Stats up to an earlier edge do not disturb the
    later arrivals; a reset restarts peak, mean and series from the current occupancy."""
    k, n, d = 5, 100, 10
    W = n + DEFAULT_OVERHEAD
    w = Fraction(W) / Fraction(bpc)
    link = LinkModel(LinkConfig(delay=d, bytes_per_cycle=bpc))
    link.simulate([(0, bytes(n))] * k)
    ends = [d + (i + 1) * w for i in range(k)]
    st = link.queue_stats()
    assert (st.start, st.end, st.peak, st.occupancy) == (0, ends[-1], k * W, 0)
    assert st.mean == sum(W * e for e in ends) / ends[-1]
    assert st.samples == ([(0, 0)] + [(0, (i + 1) * W) for i in range(k)]
                          + [(e, (k - 1 - i) * W) for i, e in enumerate(ends)])
    mid = 50
    st = link.queue_stats(until=mid)
    held = [e for e in ends if e > mid]
    area = sum(W * min(e, mid) for e in ends)
    assert st.mean == area / mid and st.occupancy == len(held) * W
    # A later frame on the idle wire adds one more step; the mean covers the idle gap.
    link.simulate([(200, bytes(n))])
    st = link.queue_stats()
    assert st.end == 200 + d + w and st.samples[-2:] == [(200, W), (200 + d + w, 0)]
    assert st.mean == (sum(W * e for e in ends) + W * (d + w)) / (200 + d + w)
    # Reset during a burst: statistics from there on.
    link.simulate([(1000, bytes(n))] * 3)
    link.reset_queue_stats(1000 + d + w)
    st = link.queue_stats()
    assert st.start == 1000 + d + w and st.peak == 2 * W and st.samples[0] == (1000 + d + w, 2 * W)
    assert st.mean == W * (2 * w + w) / (2 * w)


def test_queue_follows_a_late_departure():
    """A receiver stall (Link: ``sent`` later than scheduled) keeps the frame in the queue until
    it really left the wire, and the next frame queues behind that."""
    link = LinkModel(LinkConfig(delay=4, bytes_per_cycle=4))
    f = bytes(100)                  # 124 wire bytes: 31 cycles
    link.arrive(f, 0)
    link.arrive(f, 0)
    e = link.pop()
    assert e.depart == 4
    link.sent(e, 14)                # 10 cycles late
    e2 = link.pop()
    link.sent(e2, e2.depart)
    assert e2.depart == 14 + 31
    st = link.queue_stats()
    assert st.samples[-2:] == [(14 + 31, 124), (14 + 62, 0)]
    assert st.mean == Fraction(248 * 45 + 124 * 31, 76)


def test_queue_samples_decimated():
    """A capped series keeps every stride-th change (stride a power of two) of the full one."""
    rng = random.Random(4)
    arrivals = sorted((rng.randrange(20000), bytes(rng.randint(60, 600))) for _ in range(300))
    full = LinkModel(LinkConfig(bytes_per_cycle=8), queue_samples=10**6)
    full.simulate(arrivals)
    capped = LinkModel(LinkConfig(bytes_per_cycle=8), queue_samples=16)
    capped.simulate(arrivals)
    fs, cs = full.queue_stats().samples, capped.queue_stats().samples
    assert len(fs) == 601
    stride = 1
    while fs[::stride] != cs:
        stride *= 2
        assert stride < len(fs), "capped series is not a decimation of the full one"
    assert len(cs) <= 16 and stride > 1
    assert capped.queue_stats().peak == full.queue_stats().peak == max(q for _, q in fs)
    assert LinkModel(LinkConfig(bytes_per_cycle=8), queue_samples=0).queue_stats().samples == []


def test_link_config_queue_validation():
    for kw in ({"red_kmin": 10}, {"red_kmax": 10}, {"red_kmin": 20, "red_kmax": 10},
               {"red_kmin": -1, "red_kmax": 10}, {"red_kmin": 1, "red_kmax": 2, "red_pmax": 1.5},
               {"queue_limit": -1}):
        with pytest.raises(ValueError):
            LinkConfig(**kw)
    LinkConfig(red_kmin=10, red_kmax=10, red_pmax=0.0, queue_limit=0)


# --------------------------------------------------------------------------------------------
# Per-flow throughput, fairness
# --------------------------------------------------------------------------------------------

def test_flow_monitor_hand_computed():
    """Windows of 100 cycles at 250 cycles/us: b bytes in a window are b * 8 * 250 / 100 Mb/s;
    every flow gets every window from the first to the last seen; frames not departed or
    without a key are left out."""
    def rec(qp, out, n, psn=0):
        return FrameRecord(0, 0, n, 0, out, "pass", dest_qp=qp, psn=psn)

    recs = [rec(1, 0, 500), rec(1, 99, 500, 1), rec(1, 100, 250), rec(2, 150, 1000, 1),
            rec(2, 320, 125), rec(None, 10, 9999), rec(3, None, 9999)]
    mon = FlowMonitor.from_history(recs, 100, 250)
    assert mon.series() == {1: [(0, 20000.0), (100, 5000.0), (200, 0.0), (300, 0.0)],
                            2: [(0, 0.0), (100, 20000.0), (200, 0.0), (300, 2500.0)]}
    assert mon.series_us()[2] == [(0.0, 0.0), (0.4, 20000.0), (0.8, 0.0), (1.2, 2500.0)]
    assert mon.totals() == {1: 1250, 2: 1125}
    assert mon.mean_rates(0, 200) == {1: 12500.0, 2: 10000.0}
    assert mon.mean_rates() == {1: 1250 * 8 * 250 / 400, 2: 1125 * 8 * 250 / 400}
    by_psn = FlowMonitor.from_history(recs[:5], 200, Fraction(1000, 3), key=lambda r: r.psn,
                                      overhead=24, origin=-100)
    # Windows [-100, 100) and [100, 300), [300, 500): psn 0: 524 | 274 | 149 bytes.
    assert by_psn.totals() == {0: 524 + 274 + 149, 1: 524 + 1024}
    assert by_psn.series()[0] == [(-100, pytest.approx(524 * 8 * 1000 / 3 / 200)),
                                  (100, pytest.approx(274 * 8 * 1000 / 3 / 200)),
                                  (300, pytest.approx(149 * 8 * 1000 / 3 / 200))]
    assert FlowMonitor(10, 1).series() == {}


def test_flow_monitor_as_link_hook():
    """Attached to a link it sees what the history sees: bytes per destination QP of the
    frames that left (dropped ones excluded), in the windows of their departure edges."""
    rng = random.Random(6)
    frames = [tagged_frame(rng, i, qp=0x10 + i % 3) for i in range(40)]
    link = LinkModel(LinkConfig(drop=0.2, bytes_per_cycle=8, seed=2))
    hook = FlowMonitor(500, 250)
    link.add_monitor(hook)
    out = link.simulate([(37 * i, f) for i, f in enumerate(frames)])
    want = {}
    for _, g, _ in out:
        want[bth_dest_qp(g)] = want.get(bth_dest_qp(g), 0) + len(g)
    assert hook.totals() == want and len(want) == 3 and link.counters.dropped > 0
    assert FlowMonitor.from_history(link.history, 500, 250).series() == hook.series()


def test_jain():
    assert jain([3, 3, 3, 3]) == pytest.approx(1.0)
    assert jain([5, 0, 0, 0]) == pytest.approx(0.25)
    assert jain([1, 2]) == pytest.approx(0.9)
    assert jain([2.0, 4.0, 6.0]) == pytest.approx(144 / (3 * 56))
    assert jain([0, 0]) == 1.0
    with pytest.raises(ValueError):
        jain([])
