# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.4, A17.8 (ICRC); IBTA Vol 1 ch. 9.2-9.3; RFC 791,
#      RFC 8200, RFC 768, IEEE 802.1Q.
"""stellar.hdl.net.parser in the Amaranth simulator, at 64 and 512 bits, against scapy.

Every expectation comes from outside Stellar's gateware: frames are built by scapy
(``stellar.sim.packets``), the expected header record is scapy's dissection of the frame (the
extension headers, which scapy lacks, through the field table that ``test_headers`` checks
against scapy and tshark), the expected payload is the bytes the builder put in, the expected
verdict is the frame's ``Expect`` label, and for the random corruptions it is derived below
from the standards, with zlib and a one's-complement sum confirming every derivation.
"""

import ipaddress
import zlib

import pytest
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from stellar.hdl.net import headers as H
from stellar.hdl.net.layout import DropReason
from stellar.hdl.net.parser import Parser
from stellar.sim import captures
from stellar.sim import packets as P
from stellar.sim.amaranth_streams import FrameSink, FrameSource, run_seeds, seeded_rng, simulate
from stellar.sim.packets import Expect

WIDTHS = [64, 512]

REASON = {
    Expect.PASS: DropReason.NONE,
    Expect.NON_ROCE: DropReason.NONE,
    Expect.MALFORMED: DropReason.MALFORMED,
    Expect.IP_CHECKSUM: DropReason.IP_CHECKSUM,
    Expect.ICRC: DropReason.ICRC,
    Expect.OPCODE: DropReason.OPCODE,
}

# --------------------------------------------------------------------------------------------
# Independent expectations
# --------------------------------------------------------------------------------------------


def _mac(v):
    return v if isinstance(v, int) else int(v.replace(":", ""), 16)


def _ip(v):
    return v if isinstance(v, int) else int(ipaddress.ip_address(v))


def dissect(frame):
    """(expected header record fields, payload bytes) of a valid RoCEv2 frame, from scapy.

    Only the fields a frame of this shape defines: VLAN fields with a tag, IPv4 or IPv6 fields,
    every extension header (zero when the opcode does not carry it).
    """
    pkt = Ether(frame)
    exp = {"eth_dst": _mac(pkt.dst), "eth_src": _mac(pkt.src), "eth_ethertype": pkt.type,
           "vlan": int(Dot1Q in pkt), "roce": 1, "frame_len": len(frame), "drop": 0,
           "reason": DropReason.NONE}
    o = 14
    if Dot1Q in pkt:
        t = pkt[Dot1Q]
        exp.update(vlan_pcp=t.prio, vlan_dei=t.dei, vlan_vid=t.vlan, vlan_ethertype=t.type)
        o = 18
    if IPv6 in pkt:
        ip = pkt[IPv6]
        exp.update(ipv6=1, ipv6_version=ip.version, ipv6_dscp=ip.tc >> 2, ipv6_ecn=ip.tc & 3,
                   ipv6_flow_label=ip.fl, ipv6_payload_length=ip.plen, ipv6_next_header=ip.nh,
                   ipv6_hop_limit=ip.hlim, ipv6_src=_ip(ip.src), ipv6_dst=_ip(ip.dst))
        ip_hlen, end = 40, o + 40 + ip.plen
    else:
        ip = pkt[IP]
        ip_hlen, end = ip.ihl * 4, o + ip.len
        exp.update(ipv6=0, ipv4_version=ip.version, ipv4_ihl=ip.ihl, ipv4_dscp=ip.tos >> 2,
                   ipv4_ecn=ip.tos & 3, ipv4_total_length=ip.len, ipv4_identification=ip.id,
                   ipv4_flags=int(ip.flags), ipv4_frag_offset=ip.frag, ipv4_ttl=ip.ttl,
                   ipv4_protocol=ip.proto, ipv4_checksum=ip.chksum, ipv4_src=_ip(ip.src),
                   ipv4_dst=_ip(ip.dst),
                   ipv4_options=int.from_bytes(frame[o + 20:o + ip_hlen], "little"))
    udp = pkt[UDP]
    exp.update(udp_sport=udp.sport, udp_dport=udp.dport, udp_length=udp.len,
               udp_checksum=udp.chksum)
    bth = pkt[ScapyBTH]
    for name, sname in P.BTH_TO_SCAPY.items():
        exp[f"bth_{name}"] = getattr(bth, sname)
    pos = o + ip_hlen + 8 + 12
    chain = H.OPCODES[bth.opcode].ext
    for h in H.EXT_HEADERS:
        exp.update({f"{h.name}_{f.name}": 0 for f in h.fields})
    for h in chain:                     # in wire order
        exp.update({f"{h.name}_{k}": v for k, v in h.unpack(frame, pos).items()})
        pos += h.size
    payload = frame[pos:end - 4 - bth.padcount]
    exp["payload_len"] = len(payload)
    return exp, payload


def built_values(kw):
    """What the builder was asked for, as record fields (to confirm the dissection)."""
    v = {"bth_opcode": kw["opcode"], "udp_sport": kw["udp_sport"],
         "eth_dst": _mac(kw["eth"]["dst"]), "eth_src": _mac(kw["eth"]["src"])}
    v.update({f"bth_{k}": x for k, x in kw["bth"].items()})
    for hname, fields in (kw.get("ext") or {}).items():
        v.update({f"{hname}_{k}": x for k, x in fields.items()})
    if kw.get("vlan"):
        pcp, vid, *dei = kw["vlan"]
        v.update(vlan_pcp=pcp, vlan_vid=vid, vlan_dei=dei[0] if dei else 0)
    ipn = "ipv6" if kw["ipv6"] else "ipv4"
    v.update({f"{ipn}_src": _ip(kw["ip"]["src"]), f"{ipn}_dst": _ip(kw["ip"]["dst"]),
              f"{ipn}_ecn": kw["ecn"], f"{ipn}_dscp": kw["dscp"]})
    if kw["ipv6"]:
        v.update(ipv6_hop_limit=kw["ttl"], ipv6_flow_label=kw["ip"]["flow_label"])
    else:
        opts = kw["ip_options"]
        v.update(ipv4_ttl=kw["ttl"], ipv4_identification=kw["ip_id"], ipv4_ihl=5 + len(opts) // 4,
                 ipv4_options=int.from_bytes(opts, "little"))
    return v


def header_len(frame):
    """Bytes before the payload of a valid RoCEv2 frame (Ethernet to the extension headers)."""
    o = 18 if frame[12:14] == b"\x81\x00" else 14
    hl = 40 if frame[o - 2:o] == b"\x86\xdd" else (frame[o] & 15) * 4
    return o + hl + 8 + 12 + H.ext_layout(frame[o + hl + 8])[1]


def icrc_ok(frame):
    """The ICRC check of IBTA A17.8, restated: zlib's CRC-32 over 8 bytes of 0xFF and the IP
    packet with the variant fields set to ones, against the frame's last 4 IP-packet bytes."""
    o = 18 if frame[12:14] == b"\x81\x00" else 14
    if frame[o - 2:o] == b"\x86\xdd":
        end = o + 40 + int.from_bytes(frame[o + 4:o + 6], "big")
        pkt = bytearray(frame[o:end])
        pkt[0] |= 0x0F
        pkt[1:4] = b"\xff\xff\xff"
        pkt[7] = 0xFF
        u = 40
    else:
        end = o + int.from_bytes(frame[o + 2:o + 4], "big")
        pkt = bytearray(frame[o:end])
        pkt[1] = pkt[8] = 0xFF
        pkt[10:12] = b"\xff\xff"
        u = (frame[o] & 15) * 4
    pkt[u + 6:u + 8] = b"\xff\xff"
    pkt[u + 12] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(pkt[:-4])).to_bytes(4, "little") == frame[end - 4:end]


def ipv4_sum_ok(header):
    s = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, len(header), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s == 0xFFFF


# --------------------------------------------------------------------------------------------
# Running the parser
# --------------------------------------------------------------------------------------------

def run_parser(width, frames, rng, *, p_valid=1.0, p_ready=1.0, record_fields=None):
    dut = Parser(width, record_fields=record_fields)
    src = FrameSource(dut.i, frames, rng=rng, p_valid=p_valid)
    sink = FrameSink(dut.o, len(frames), rng=rng, p_ready=p_ready, watch=(dut.o_meta,),
                     empty_ok=True)
    simulate(dut, src, sink, tail=dut.latency + 8)
    assert len(sink.frames) == len(frames)
    return dut, src, sink, sink.frames


def check_record(meta, exp, what, fields=None):
    """``meta``'s fields equal ``exp``'s (only those of ``fields`` if given)."""
    exp = {k: v for k, v in exp.items() if fields is None or k in fields}
    bad = {k: (getattr(meta, k), v) for k, v in exp.items() if getattr(meta, k) != v}
    assert not bad, f"{what}: record fields (got, expected): {bad}"


def check_verdict(meta, expect, what):
    reason = REASON[expect]
    assert (meta.reason, meta.drop) == (reason, int(reason != DropReason.NONE)), (
        f"{what}: expected {expect} ({reason.name}), got drop={meta.drop} {meta.reason}")


def small_payload_len(rng, opcode, width):
    op = H.OPCODES.get(opcode)
    if op is None or not op.payload:
        return 0
    if op.name.endswith(("_FIRST", "_MIDDLE")):
        # One path MTU (256 at least) is what a FIRST/MIDDLE carries; the parser only needs
        # the 4-byte alignment, so 64-bit runs (slow in the pure-Python simulator) use less.
        return 256 if width > 64 else 4 * rng.randint(1, 16)
    return rng.randint(0, 100 if width == 64 else 300)


# Frame shapes every opcode meets in turn: (ipv6, vlan, IPv4 options length).
SHAPES = [(False, None, 0), (True, None, 0), (False, (5, 100), 0), (False, None, 40),
          (True, (1, 4094, 1), 0), (False, (7, 1), 12), (False, None, 4)]


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------

def opcode_cases(rng, width):
    """random_roce arguments for every opcode, the shapes (IPv6, VLAN, IPv4 options) in turn."""
    cases = []
    for n, opcode in enumerate(H.OPCODES):
        ipv6, vlan, nopt = SHAPES[n % len(SHAPES)]
        cases.append(P.random_roce(rng, opcode, ipv6=ipv6, vlan=vlan,
                                   ip_options=P.ip_options_of_length(nopt, rng) if nopt else b"",
                                   payload_len=small_payload_len(rng, opcode, width)))
    return cases


@pytest.mark.parametrize("seed", run_seeds([1]))
@pytest.mark.parametrize("width", WIDTHS)
def test_valid_frames_fields_and_payload(width, seed):
    """Every opcode, IPv4 (with options up to IHL 15) and IPv6, with and without VLAN, random
    ECN/DSCP/TTL/ID/ports/BTH fields: payload and every record field equal scapy's view, under
    random gaps and backpressure."""
    rng = seeded_rng(f"parser-valid-{width}", seed)
    cases = opcode_cases(rng, width)
    rng.shuffle(cases)
    frames = [P.roce_frame(**kw) for kw in cases]
    _, _, _, got = run_parser(width, frames, rng, p_valid=0.8, p_ready=0.7)
    for kw, frame, g in zip(cases, frames, got, strict=True):
        what = f"{H.opcode_name(kw['opcode'])} ipv6={kw['ipv6']} vlan={kw['vlan']} " \
               f"options={len(kw['ip_options'])} payload={len(kw['payload'])}"
        exp, payload = dissect(frame)
        assert payload == kw["payload"], what                        # scapy vs the builder
        built = built_values(kw)
        assert {k: exp[k] for k in built} == built, what
        check_record(g.watch[0], exp, what)
        assert g.data == payload, f"{what}: payload differs"


# A record with only some fields, as NicCore's pipeline asks for (RcTransport's, the lookup key's,
# the counters'), plus every kind of field the parser extracts: a field behind a VLAN tag, the
# IPv4 options, an IPv6 address, extension-header fields at several offsets, and the frame-level
# fields from the output stage.
SOME_FIELDS = ("bth_opcode", "bth_psn", "bth_ackreq", "bth_dest_qp", "aeth_syndrome",
               "reth_va", "reth_rkey", "reth_dma_length", "atomiceth_va", "atomiceth_rkey",
               "ieth_rkey", "immdt_data", "deth_src_qp", "payload_len", "ipv6", "ipv4_ecn",
               "ipv6_ecn", "ipv6_src", "ipv4_options", "ipv4_ihl", "roce", "vlan", "vlan_vid",
               "frame_len", "drop", "reason")


@pytest.mark.parametrize("width", WIDTHS)
def test_record_fields_subset(width):
    """``record_fields``: ``o_meta`` carries exactly the named fields, in that order, with the
    values scapy gives (valid frames of every opcode and shape) and the verdicts of the labels
    (faults and non-RoCE frames), under random gaps and backpressure."""
    rng = seeded_rng(f"parser-subset-{width}", 6)
    trace = [(P.roce_frame(**kw), Expect.PASS, H.opcode_name(kw["opcode"]), kw["payload"])
             for kw in opcode_cases(rng, width)]
    trace += [t for t in verdict_trace(rng, width) if t[1] != Expect.PASS][::3]
    rng.shuffle(trace)
    dut, _, _, got = run_parser(width, [t[0] for t in trace], rng, p_valid=0.8, p_ready=0.7,
                                record_fields=SOME_FIELDS)
    assert tuple(name for name, _ in dut.o_meta.shape()) == SOME_FIELDS
    for (frame, expect, desc, payload), g in zip(trace, got, strict=True):
        meta = g.watch[0]
        check_verdict(meta, expect, desc)
        assert meta.frame_len == len(frame), desc
        if expect == Expect.PASS:
            check_record(meta, dissect(frame)[0], desc, SOME_FIELDS)
            assert g.data == payload, desc
        elif expect == Expect.NON_ROCE:
            assert meta.roce == 0, desc
            assert g.data == frame, desc


def test_record_fields_unknown():
    with pytest.raises(KeyError, match="no field"):
        Parser(64, record_fields=("bth_opcode", "bth_nonsense"))


def _fault_opcode(kind, rng):
    """An opcode that can carry fault ``kind`` (restated from the fault descriptions)."""
    if kind == "opcode":
        return rng.choice(P.UNSUPPORTED_OPCODES)
    ops = list(H.OPCODES.values())
    if kind in ("icrc_payload", "pad_misaligned"):
        ops = [op for op in ops if op.payload]
    elif kind in ("pad_nopayload", "payload_nopayload"):
        ops = [op for op in ops if not op.payload]
    elif kind == "ext_truncated":
        ops = [op for op in ops if op.ext]
    return rng.choice(ops).code


def verdict_trace(rng, width):
    """Every fault kind (IPv4 and IPv6), every non-RoCE kind (with and without VLAN), and valid
    frames between them: (frame, expect, desc, expected payload or None)."""
    out = []
    for kind in sorted(P.CORRUPTIONS):
        for ipv6 in (False, True):
            if ipv6 and kind in P.IPV4_ONLY_CORRUPTIONS:
                continue
            opcode = _fault_opcode(kind, rng)
            t = P.corrupted_frame(kind, rng, opcode=opcode, ipv6=ipv6,
                                  payload_len=small_payload_len(rng, opcode, width))
            out.append((t.frame, t.expect, t.desc, None))
    for kind in sorted(P.NON_ROCE_KINDS):
        for vlan in (False, True):
            t = P.non_roce_frame(kind, rng, vlan=vlan)
            while width == 64 and len(t.frame) > 300:     # keep 64-bit runs short
                t = P.non_roce_frame(kind, rng, vlan=vlan)
            out.append((t.frame, t.expect, t.desc, None))
    # Runts: shorter than the Ethernet header, or than the 802.1Q tag it announces, are
    # malformed (no EtherType to classify them by); one byte more and they are plain non-IP.
    for n in rng.sample(range(1, 14), 4):
        out.append((rng.randbytes(n), Expect.MALFORMED, f"{n}-byte runt", None))
    out += [(rng.randbytes(12) + b"\x88\xb5", Expect.NON_ROCE, "14-byte non-IP frame", None),
            (rng.randbytes(12) + b"\x81\x00\x20\x01", Expect.MALFORMED, "cut in the VLAN tag", None),
            (rng.randbytes(12) + b"\x81\x00\x20\x01\x88\xb5", Expect.NON_ROCE,
             "18-byte tagged non-IP frame", None)]
    for _ in range(len(out) // 3):
        opcode = rng.choice(list(H.OPCODES))
        kw = P.random_roce(rng, opcode, payload_len=small_payload_len(rng, opcode, width))
        out.append((P.roce_frame(**kw), Expect.PASS, "valid", kw["payload"]))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", run_seeds([2]))
@pytest.mark.parametrize("width", WIDTHS)
def test_verdicts_and_non_roce_passthrough(width, seed):
    """Every corruption kind of sim.packets gets the DropReason of its label, runts are
    malformed; non-RoCE frames come out byte for byte; valid frames in between keep their
    payload (no desync)."""
    rng = seeded_rng(f"parser-verdicts-{width}", seed)
    trace = verdict_trace(rng, width)
    _, _, _, got = run_parser(width, [t[0] for t in trace], rng, p_valid=0.8, p_ready=0.7)
    for (frame, expect, desc, payload), g in zip(trace, got, strict=True):
        meta = g.watch[0]
        check_verdict(meta, expect, desc)
        if expect == Expect.NON_ROCE:
            assert meta.roce == 0, desc
            assert g.data == frame, f"{desc}: non-RoCE frame changed"
            assert meta.frame_len == len(frame), desc
        elif expect == Expect.PASS:
            check_record(meta, dissect(frame)[0], desc)
            assert g.data == payload, desc


@pytest.mark.parametrize("width", WIDTHS)
def test_real_captures_and_mixed_trace(width):
    """Frames recorded from real RoCE NICs (sim.captures; one per file, kind and length, as the
    pure-Python simulator is slow) and the make-sim trace: RoCEv2 frames pass with scapy's
    fields and payload; the rest passes unchanged."""
    seed = run_seeds([3])[0]
    rng = seeded_rng(f"parser-captures-{width}", seed)
    frames, seen = [], set()
    for name, fs in captures.load_captures().items():
        for i, f in enumerate(fs):
            key = (name, len(f), f[12:14], captures.is_rocev2(f))
            if key in seen or (width == 64 and len(f) > 600):
                continue
            seen.add(key)
            frames.append((f, Expect.PASS if captures.is_rocev2(f) else Expect.NON_ROCE,
                           f"{name} frame {i + 1}"))
    if width == 512:
        frames += [(t.frame, t.expect, t.desc) for t in P.mixed_trace(seed, 40)]
    rng.shuffle(frames)
    _, _, _, got = run_parser(width, [f for f, _, _ in frames], rng, p_valid=0.8, p_ready=0.7)
    for (frame, expect, desc), g in zip(frames, got, strict=True):
        meta = g.watch[0]
        check_verdict(meta, expect, desc)
        if expect == Expect.PASS:
            exp, payload = dissect(frame)
            check_record(meta, exp, desc)
            assert g.data == payload, desc
        elif expect == Expect.NON_ROCE:
            assert g.data == frame, desc


@pytest.mark.parametrize("width", WIDTHS)
def test_line_rate_and_documented_latency(width):
    """Back to back, no gaps, ready always high, frames longer than the header window then
    minimum-size ones: one beat accepted every clock, non-RoCE frames leave without bubbles,
    and every output beat of a long frame leaves ``Parser.latency`` cycles after the input beat
    holding its first byte (the last beat of a RoCEv2 frame, which carries the verdict:
    ``latency`` cycles after the frame's last input beat)."""
    rng = seeded_rng(f"parser-linerate-{width}", 4)
    frames, kinds = [], []
    for ipv6, vlan, nopt in SHAPES:
        kw = P.random_roce(rng, 0x0A, ipv6=ipv6, vlan=vlan,
                           ip_options=P.ip_options_of_length(nopt, rng) if nopt else b"",
                           payload_len=rng.randint(80, 200))
        frames.append(P.roce_frame(**kw))
        kinds.append("roce")
        raw = P.non_roce_frame("other_ethertype", rng).frame
        frames.append(raw + bytes(130 - len(raw)) if len(raw) < 130 else raw)
        kinds.append("raw")
    assert all(len(f) > 128 for f in frames)        # longer than the header window
    # Then minimum-size frames back to back (one beat each at 512 bits): still no stall.
    short = [P.roce_frame(**P.random_roce(rng, 0x04, payload_len=rng.randint(0, 2), ipv6=False,
                                          vlan=None, ip_options=b"")) for _ in range(12)]
    assert all(len(f) <= 64 for f in short)          # one beat at 512 bits
    n_long = len(frames)
    frames += short
    dut, src, sink, got = run_parser(width, frames, rng)
    B = width // 8
    cycles = [t.cycle for t in src.transfers]
    beats = sum(-(-len(f) // B) for f in frames)
    assert len(cycles) == beats
    assert src.stalls == 0
    assert beats / (cycles[-1] - cycles[0] + 1) == 1.0
    assert dut.latency == -(-128 // B) + 10     # window, 4 decoder stages, 6 to the output
    for frame, g in zip(short, got[n_long:], strict=True):
        exp, payload = dissect(frame)
        check_record(g.watch[0], exp, "minimum-size frame")
        assert g.data == payload
    for fi, (frame, kind, g) in enumerate(zip(frames[:n_long], kinds, got[:n_long], strict=True)):
        t_in = [t.cycle for t in src.transfers if t.frame == fi]
        if kind == "raw":
            assert g.data == frame
            assert g.cycles == [t + dut.latency for t in t_in], f"frame {fi}"
            continue
        assert g.watch[0].drop == 0
        hlen = header_len(frame)
        expect = [t_in[(hlen + k * B) // B] + dut.latency for k in range(len(g.cycles) - 1)]
        expect.append(t_in[-1] + dut.latency)
        assert g.cycles == expect, f"frame {fi} (header {hlen} bytes)"


# --------------------------------------------------------------------------------------------
# Random single-byte corruptions (property test, 64 bits)
# --------------------------------------------------------------------------------------------

def _offsets(frame):
    """(VLAN?, IP offset, IPv6?, IP header length, end of the IP packet) of a valid frame."""
    vlan = frame[12:14] == b"\x81\x00"
    o = 18 if vlan else 14
    v6 = frame[o - 2:o] == b"\x86\xdd"
    hl = 40 if v6 else (frame[o] & 15) * 4
    end = o + (40 + int.from_bytes(frame[o + 4:o + 6], "big") if v6
               else int.from_bytes(frame[o + 2:o + 4], "big"))
    return vlan, o, v6, hl, end


def corruption_outcome(frame, i, new):
    """The outcome of setting byte ``i`` of a valid RoCEv2 frame to ``new`` (!= the old value),
    derived field by field from the standards; None when it depends on random payload bytes
    (the caller draws again). Returns (Expect, why)."""
    vlan, o, v6, hl, end = _offsets(frame)
    u, b = o + hl, o + hl + 8
    f = bytearray(frame)
    f[i] = new
    assert len(frame) < 14 + 0x0800    # the EtherType cases below rely on it
    if i < 12:
        return Expect.PASS, "MAC address: no check covers it"
    if i in (12, 13):
        t = int.from_bytes(f[12:14], "big")
        assert t not in (0x0800, 0x86DD) or vlan    # one byte cannot swap IPv4 and IPv6
        if vlan and t == 0x0800:
            # IPv4 over the tag: version = PCP/DEI bits, or IHL from the VID, or a total length
            # read from the inner EtherType (0x0800/0x86DD) past the end of this short frame.
            return Expect.MALFORMED, "TPID became IPv4: no valid IPv4 header there"
        # Anything else (0x8100 on an untagged frame puts the IPv4 total length where the
        # inner EtherType goes: not an IP EtherType for a short frame) is not IP.
        return Expect.NON_ROCE, f"EtherType {t:#06x}"
    if vlan and i in (14, 15):
        return Expect.PASS, "VLAN TCI"
    if vlan and i in (16, 17):
        return Expect.NON_ROCE, "inner EtherType"
    r = i - o
    if i < u and v6:
        if r == 0:
            return (Expect.MALFORMED, "IPv6 version") if new >> 4 != 6 else (
                Expect.PASS, "traffic class: masked by the ICRC, no IPv6 header checksum")
        if r in (1, 2, 3):
            return Expect.PASS, "traffic class / flow label: masked by the ICRC"
        if r in (4, 5):
            return Expect.MALFORMED, "payload length: truncated or UDP length mismatch"
        if r == 6:
            return Expect.NON_ROCE, "next header not UDP"
        if r == 7:
            return Expect.PASS, "hop limit: masked by the ICRC"
        return Expect.ICRC, "IPv6 address"
    if i < u:
        if r == 0:
            ver, ihl = new >> 4, new & 15
            tl = int.from_bytes(frame[o + 2:o + 4], "big")
            if ver != 4 or ihl < 5 or tl < ihl * 4:
                return Expect.MALFORMED, f"IPv4 version {ver} IHL {ihl}"
            nu = o + ihl * 4
            if int.from_bytes(frame[nu + 2:nu + 4], "big") == H.ROCEV2_UDP_PORT:
                return None
            return Expect.NON_ROCE, f"IHL {ihl}: no UDP 4791 at the new UDP offset"
        if r in (2, 3):
            return Expect.MALFORMED, "total length: truncated or UDP length mismatch"
        if r == 6:
            if new & 0x1F:
                return Expect.NON_ROCE, "non-first fragment: no UDP header in it"
            if new & 0x20:
                return Expect.MALFORMED, "MF: a fragment of a RoCEv2 packet"
            return Expect.IP_CHECKSUM, "reserved / DF flag"
        if r == 7:
            return Expect.NON_ROCE, "non-first fragment: no UDP header in it"
        if r == 9:
            return Expect.NON_ROCE, "protocol not UDP"
        # TOS and TTL are masked by the ICRC, but not by the IPv4 header checksum.
        return Expect.IP_CHECKSUM, "IPv4 header byte (TOS, ID, TTL, checksum, address, option)"
    if i < b:
        q = i - u
        if q in (2, 3):
            return Expect.NON_ROCE, "UDP destination port"
        if q in (4, 5):
            return Expect.MALFORMED, "UDP length"
        if q in (6, 7):
            return Expect.PASS, "UDP checksum: masked by the ICRC and not checked (RoCEv2 sends 0)"
        return Expect.ICRC, "UDP source port"
    if i == b + 4:
        return Expect.PASS, "BTH FECN/BECN/resv6: masked by the ICRC"
    if i < end:
        return Expect.ICRC, "BTH, extension header, payload, pad or ICRC byte"
    return Expect.PASS, "Ethernet padding"


def confirm_outcome(corrupted, expect):
    """Cross-check a derived outcome with scapy's classification, zlib and the one's-complement
    sum (each failure here is a wrong derivation, not a parser bug)."""
    o = 18 if corrupted[12:14] == b"\x81\x00" else 14
    if expect == Expect.PASS:
        assert captures.is_rocev2(corrupted) and icrc_ok(corrupted)
    elif expect == Expect.NON_ROCE:
        assert not captures.is_rocev2(corrupted)
    elif expect == Expect.ICRC:
        assert not icrc_ok(corrupted)
    elif expect == Expect.IP_CHECKSUM:
        assert not ipv4_sum_ok(corrupted[o:o + (corrupted[o] & 15) * 4])


def _uniform(frame, rng):
    """A byte drawn from a uniformly drawn region (so that the small regions, a TTL byte, BTH
    byte 4, get hit as often as the payload), XORed with a bit or a random mask."""
    vlan, o, v6, hl, end = _offsets(frame)
    regions = [range(0, 12), range(12, 14), range(o, o + 1), range(o + 1, o + 4),
               range(o + 4, o + 8), range(o + 8, o + hl), range(o + hl, o + hl + 8),
               range(o + hl + 8, o + hl + 20), range(o + hl + 20, end)]
    if vlan:
        regions.append(range(14, 18))
    if len(frame) > end:
        regions.append(range(end, len(frame)))
    i = rng.choice(rng.choice([r for r in regions if len(r)]))
    return i, frame[i] ^ rng.choice([1 << rng.randrange(8), rng.randint(1, 255)])


def _targeted(frame, rng):
    """One of the single-byte changes a uniform draw rarely makes, each on a boundary of the
    verdict rules."""
    vlan, o, v6, hl, end = _offsets(frame)
    u, b = o + hl, o + hl + 8
    if v6:
        picks = [(o + 7, rng.randrange(256)),                         # hop limit
                 (o + 1, frame[o + 1] ^ rng.randint(1, 255)),        # traffic class / flow label
                 (o, 0x60 | rng.randrange(16)),                       # traffic class, version kept
                 (o, rng.choice([v for v in range(16) if v != 6]) << 4 | frame[o] & 15)]
    else:
        picks = [(o + 6, frame[o + 6] | 0x20),                        # MF: a first fragment
                 (o + 6, frame[o + 6] ^ 0x80),                        # reserved flag
                 (o + 6, frame[o + 6] ^ 0x40),                        # DF
                 (o + 6, frame[o + 6] | 0x01),                        # fragment offset, high bits
                 (o + 7, frame[o + 7] ^ 1 << rng.randrange(8)),       # fragment offset
                 (o + 8, rng.randrange(256)),                         # TTL
                 (o + 1, frame[o + 1] | 3),                           # ECN CE, as a switch marks
                 (o + 9, 6),                                          # protocol TCP
                 (o, 0x40 | rng.randrange(16)),                       # IHL
                 (o, rng.choice([v for v in range(16) if v != 4]) << 4 | frame[o] & 15)]
    picks += [(u + 6 + rng.randrange(2), rng.randrange(256)),         # UDP checksum
              (b + 4, rng.randrange(256)),                            # FECN, BECN, resv6
              (b + 1, frame[b + 1] | rng.randint(1, 15)),             # TVer: the ICRC outranks it
              (b, rng.choice(P.UNSUPPORTED_OPCODES)),                 # opcode: likewise
              (12, 0x08 if vlan else 0x81)]                           # TPID <-> IPv4 EtherType
    if vlan:
        picks.append((16, 0x81))                                      # inner EtherType
    if len(frame) > end:
        picks.append((rng.randrange(end, len(frame)), rng.randint(1, 255)))   # Ethernet padding
    return rng.choice(picks)


@pytest.mark.parametrize("seed", run_seeds([5]))
def test_random_byte_corruptions(seed):
    """One byte of a valid frame replaced (half drawn uniformly over the header regions, half
    targeted at rule boundaries): the parser's verdict is what the standards say, including the
    corruptions no check can see (masked ICRC fields the IPv4 header checksum does not cover,
    Ethernet padding) and the ones that turn the frame non-RoCE."""
    rng = seeded_rng("parser-corrupt-64", seed)
    cases = []
    while len(cases) < 80:
        opcode, ipv6 = rng.choice(list(H.OPCODES)), rng.random() < 0.35
        nopt = 0 if ipv6 else rng.choice((0, 0, 8, 40))
        kw = P.random_roce(rng, opcode, ipv6=ipv6,
                           vlan=(rng.randrange(8), rng.randint(1, 4094)) if rng.random() < 0.35 else None,
                           ip_options=P.ip_options_of_length(nopt, rng) if nopt else b"",
                           payload_len=min(small_payload_len(rng, opcode, 64), 48))
        frame = P.roce_frame(**kw)
        i, new = (_targeted if len(cases) % 2 else _uniform)(frame, rng)
        if new == frame[i]:
            continue
        outcome = corruption_outcome(frame, i, new)
        if outcome is None:
            continue
        corrupted = frame[:i] + bytes([new]) + frame[i + 1:]
        confirm_outcome(corrupted, outcome[0])
        cases.append((frame, corrupted, i, outcome))
    # Every kind of outcome is drawn (a weak draw would make this test toothless).
    assert {c[3][0] for c in cases} == {Expect.PASS, Expect.NON_ROCE, Expect.MALFORMED,
                                        Expect.IP_CHECKSUM, Expect.ICRC}
    _, _, _, got = run_parser(64, [c[1] for c in cases], rng, p_valid=0.85, p_ready=0.8)
    for (frame, corrupted, i, (expect, why)), g in zip(cases, got, strict=True):
        what = f"byte {i} {frame[i]:#04x}->{corrupted[i]:#04x} ({why})"
        meta = g.watch[0]
        check_verdict(meta, expect, what)
        if expect == Expect.PASS:
            exp, payload = dissect(corrupted)
            check_record(meta, exp, what)
            assert g.data == payload == dissect(frame)[1], what
        elif expect == Expect.NON_ROCE:
            assert g.data == corrupted, what
