"""stellar.sim.switch without a simulator: header walk, ECN marking, corruption, impairment
statistics and the wire schedule of ``LinkModel``.

References are independent of the switch's own code: scapy dissects frames (header offsets,
ECN field, IPv4 checksum recomputed, ICRC recomputed by ``scapy.contrib.roce``) and the wire
schedule is restated with ``Fraction`` sums. ``STELLAR_SEED=<n>`` replays one seed.
"""

import bisect
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
    MIN_DELAY,
    LinkConfig,
    LinkModel,
    bth_dest_qp,
    bth_opcode,
    bth_psn,
    ecn_field,
    flip_icrc_bit,
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
