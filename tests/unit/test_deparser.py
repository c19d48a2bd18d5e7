# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.4, A17.8 (ICRC); IBTA Vol 1 ch. 9.2-9.3; RFC 791
#      (IPv4 header checksum), RFC 8200, RFC 768, IEEE 802.1Q.
"""stellar.hdl.net.deparser in the Amaranth simulator, at 64 and 512 bits.

Each test frame is built by scapy (``stellar.sim.packets``) or recorded from a real RoCE NIC
(``stellar.sim.captures``). Its header record is decoded from the frame's bytes with the field
table (checked against scapy and tshark in ``test_headers``); every field the deparser
computes itself -- lengths, checksums, EtherTypes, versions, protocol, destination port, pad
count -- and every field the frame does not use is random garbage. The deparser must emit the
original frame byte for byte: scapy's ICRC and IPv4 checksum, its lengths, zero pad and
Ethernet padding to 60 bytes.
"""

import pytest
from stellar.hdl.net import headers as H
from stellar.hdl.net.deparser import Deparser, frames_span_two_beats
from stellar.hdl.net.layout import record_layout
from stellar.sim import captures
from stellar.sim import packets as P
from stellar.sim.amaranth_streams import (
    FrameSink,
    FrameSource,
    ItemSource,
    pack_struct,
    run_seeds,
    seeded_rng,
    simulate,
)

WIDTHS = [64, 512]
RECORD = record_layout()


def roce_record(frame):
    """(record fields the deparser must be given, payload bytes) of a valid RoCEv2 frame, from
    its bytes through the field table. Fields not returned are for the caller to fill with
    garbage."""
    eth = H.ETH.unpack(frame)
    rec = {"eth_dst": eth["dst"], "eth_src": eth["src"], "roce": 1}
    o, ethertype = 14, eth["ethertype"]
    if ethertype == 0x8100:
        v = H.VLAN.unpack(frame, 14)
        rec.update(vlan=1, vlan_pcp=v["pcp"], vlan_dei=v["dei"], vlan_vid=v["vid"])
        o, ethertype = 18, v["ethertype"]
    else:
        rec["vlan"] = 0
    if ethertype == 0x86DD:
        ip = H.IPV6.unpack(frame, o)
        rec.update(ipv6=1, **{f"ipv6_{k}": ip[k] for k in ("dscp", "ecn", "flow_label",
                                                          "hop_limit", "src", "dst")})
        hl, end = 40, o + 40 + ip["payload_length"]
    else:
        ip = H.IPV4.unpack(frame, o)
        hl, end = ip["ihl"] * 4, o + ip["total_length"]
        rec.update(ipv6=0, **{f"ipv4_{k}": ip[k] for k in ("ihl", "dscp", "ecn", "identification",
                                                          "flags", "frag_offset", "ttl", "src",
                                                          "dst")})
        rec["ipv4_options_given"] = frame[o + 20:o + hl]
    udp = H.UDP.unpack(frame, o + hl)
    rec.update(udp_sport=udp["sport"], udp_checksum=udp["checksum"])
    bth = H.BTH.unpack(frame, o + hl + 8)
    rec.update({f"bth_{k}": v for k, v in bth.items() if k != "pad_count"})
    pos = o + hl + 8 + 12
    for h in H.OPCODES[bth["opcode"]].ext:
        rec.update({f"{h.name}_{k}": v for k, v in h.unpack(frame, pos).items()})
        pos += h.size
    payload = frame[pos:end - 4 - bth["pad_count"]]
    rec["payload_len"] = len(payload)
    return rec, payload


def ip_end(frame):
    o = 18 if frame[12:14] == b"\x81\x00" else 14
    if frame[o - 2:o] == b"\x86\xdd":
        return o + 40 + int.from_bytes(frame[o + 4:o + 6], "big")
    return o + int.from_bytes(frame[o + 2:o + 4], "big")


def record_bits(rec, rng):
    """The record as bits: the given fields, random garbage everywhere else (IPv4 option bytes
    past the IHL included)."""
    rec = dict(rec)
    opts = rec.pop("ipv4_options_given", None)
    if opts is not None:
        junk = rng.randbytes(H.MAX_IPV4_OPTIONS - len(opts))
        rec["ipv4_options"] = int.from_bytes(opts + junk, "little")
    return pack_struct(RECORD, rec, rng=rng)


def run_deparser(width, jobs, rng, *, p_valid=1.0, p_ready=1.0):
    """``jobs``: (record bits, payload-stream bytes). Returns (dut, meta source, payload source,
    sink, received frames)."""
    dut = Deparser(width)
    meta = ItemSource(dut.i_meta, [r for r, _ in jobs], rng=rng, p_valid=p_valid)
    src = FrameSource(dut.i, [p for _, p in jobs], rng=rng, p_valid=p_valid)
    sink = FrameSink(dut.o, len(jobs), rng=rng, p_ready=p_ready)
    simulate(dut, meta, src, sink, tail=8)
    return dut, meta, src, sink, sink.frames


def job(frame, rng, roce=True):
    if not roce:
        return record_bits({"roce": 0}, rng), frame
    rec, payload = roce_record(frame)
    return record_bits(rec, rng), payload


def check_frames(cases, got):
    assert len(got) == len(cases)
    for n, ((frame, desc), g) in enumerate(zip(cases, got, strict=True)):
        assert g.data == frame, (
            f"frame {n} ({desc}): first difference at byte "
            f"{next((i for i, (a, b) in enumerate(zip(g.data, frame, strict=False)) if a != b), None)}"
            f", {len(g.data)} bytes emitted, {len(frame)} expected")


SHAPES = [(False, None, 0), (True, None, 0), (False, (5, 100), 0), (False, None, 40),
          (True, (1, 4094, 1), 0), (False, (7, 1), 12), (False, None, 4)]


@pytest.mark.parametrize("seed", run_seeds([1]))
@pytest.mark.parametrize("width", WIDTHS)
def test_rebuilds_scapy_frames(width, seed):
    """Every opcode, IPv4 with and without options, IPv6, VLAN, payloads 0..n bytes (every pad
    count, frames below 60 bytes), non-RoCE frames in between, random gaps on both inputs and
    random backpressure: the output is scapy's frame, byte for byte."""
    rng = seeded_rng(f"deparser-scapy-{width}", seed)
    cases, jobs, padded = [], [], False
    # Every opcode in turn, then RC SEND_ONLY over untagged IPv4 with 0..3 payload bytes (every
    # pad count, frames of 58..61 bytes before Ethernet padding).
    plan = [(opcode, SHAPES[n % len(SHAPES)], None) for n, opcode in enumerate(H.OPCODES)]
    plan += [(0x04, SHAPES[0], n) for n in range(4)]
    for n, (opcode, (ipv6, vlan, nopt), payload_len) in enumerate(plan):
        if payload_len is None:
            payload_len = rng.randint(0, 16 if width == 64 else 128) if H.OPCODES[opcode].payload else 0
        kw = P.random_roce(rng, opcode, ipv6=ipv6, vlan=vlan, payload_len=payload_len,
                           ip_options=P.ip_options_of_length(nopt, rng) if nopt else b"")
        frame = P.roce_frame(**kw)
        rec, payload = roce_record(frame)
        assert payload == kw["payload"]
        cases.append((frame, f"{H.opcode_name(opcode)} payload {payload_len}"))
        jobs.append((record_bits(rec, rng), payload))
        if n % 6 == 0:
            t = P.non_roce_frame(rng.choice(sorted(P.NON_ROCE_KINDS)), rng, vlan=rng.random() < 0.5)
            while len(t.frame) > (80 if width == 64 else 300):
                t = P.non_roce_frame(rng.choice(sorted(P.NON_ROCE_KINDS)), rng)
            cases.append((t.frame, t.desc))
            jobs.append(job(t.frame, rng, roce=False))
        padded |= ip_end(frame) < len(frame) == 60
    assert padded, "no RoCEv2 frame needed Ethernet padding"
    _, _, _, _, got = run_deparser(width, jobs, rng, p_valid=0.9, p_ready=0.8)
    check_frames(cases, got)


@pytest.mark.parametrize("width", WIDTHS)
def test_rebuilds_real_captures_and_jumbo(width):
    """Frames recorded from real RoCE NICs (their ICRCs were computed by the NICs), one per
    kind and length, and at 512 bits a jumbo frame: rebuilt byte for byte."""
    seed = run_seeds([2])[0]
    rng = seeded_rng(f"deparser-captures-{width}", seed)
    cases, seen = [], set()
    for name, fs in captures.load_captures().items():
        for i, f in enumerate(fs):
            key = (len(f), captures.is_rocev2(f))
            if key in seen or len(f) > (600 if width == 64 else 1100):
                continue
            seen.add(key)
            cases.append((f, captures.is_rocev2(f), f"{name} frame {i + 1}"))
    if width == 512:
        jumbo = P.random_roce(rng, 0x0A, ipv6=True, vlan=(2, 7),
                              payload_len=P.max_payload(0x0A, ipv6=True))
        cases.append((P.roce_frame(**jumbo), True, "9000-byte IPv6 packet"))
    rng.shuffle(cases)
    jobs = [job(f, rng, roce) for f, roce, _ in cases]
    _, _, _, _, got = run_deparser(width, jobs, rng, p_valid=0.8, p_ready=0.7)
    check_frames([(f, d) for f, _, d in cases], got)


@pytest.mark.parametrize("width", WIDTHS)
def test_no_bubbles_and_latency(width):
    """Inputs always valid, output always ready: the output carries a beat on every clock from
    the first beat of the first frame to the last beat of the last (short and long frames, RoCE
    and non-RoCE), and the first beat leaves 6 cycles after its record is accepted (header
    stages A, B and C, the emit stage, then the ICRC word and ICRC update stages), 7 where a
    frame lasts two beats or more (A prepares from its registered copy of the record)."""
    rng = seeded_rng(f"deparser-linerate-{width}", 3)
    cases = []
    for n in range(8):
        ipv6, vlan, nopt = SHAPES[n % len(SHAPES)]
        if n % 4 == 3:
            t = P.non_roce_frame(("arp", "ipv4_icmp")[n // 4], rng)
            cases.append((t.frame, False))
            continue
        kw = P.random_roce(rng, rng.choice((0x04, 0x0A, 0x11, 0x64, 0x81, 0x13)), ipv6=ipv6,
                           vlan=vlan, ip_options=P.ip_options_of_length(nopt, rng) if nopt else b"")
        if H.OPCODES[kw["opcode"]].payload:
            sizes = (0, 1, 7, 64, 150) if width > 64 else (0, 1, 7, 20, 30)
            kw["payload"] = rng.randbytes(rng.choice(sizes))
        cases.append((P.roce_frame(**kw), True))
    jobs = [job(f, rng, roce) for f, roce in cases]
    _, meta, _, sink, got = run_deparser(width, jobs, rng)
    check_frames([(f, str(n)) for n, (f, _) in enumerate(cases)], got)
    out = [c for g in got for c in g.cycles]
    assert out == list(range(out[0], out[0] + len(out))), "bubble in the output"
    assert sink.bubbles == 0
    assert out[0] - meta.transfers[0].cycle == (7 if frames_span_two_beats(width) else 6)
