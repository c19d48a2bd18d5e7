# Ref: IBTA Vol 1 Rel 1.4 ch. 9.2-9.5 (BTH, extension headers, pad count), ch. 9.6 (header
#      validation); IBTA Vol 1 Annex A17 "RoCEv2" (UDP port 4791, ICRC A17.8, CNP A17.9.3);
#      RFC 791 (IPv4), RFC 8200 (IPv6), RFC 768 (UDP), IEEE 802.1Q.
"""Golden RoCEv2 frames: the independent reference the packet-engine tests compare against.

Frames are built with scapy (``scapy.contrib.roce.BTH`` computes the ICRC, scapy's ``IP`` the
header checksum); only the extension headers scapy lacks are packed with the shared field table
(``stellar.hdl.net.headers``), field by field, and ``tests/unit/test_headers.py`` checks that
codec against scapy and tshark. Nothing here runs Stellar gateware or its parser: every frame's
expected outcome is decided by how the frame was built.

No frame carries an Ethernet FCS (the MAC strips and adds it); frames shorter than 60 bytes are
zero-padded to 60, as a MAC pads them.

Expected outcomes (:class:`Expect`), what the packet engine must do with a frame:

``pass``         a RoCEv2 frame the engine accepts (counted as rx_roce).
``non_roce``     not RoCEv2 (not Ether[/802.1Q]/IPv4|IPv6/UDP dport 4791, UDP directly after the
                 fixed IP header): passes through unchanged.
``malformed``    framing or header structure is wrong (see the fault list below).
``ip_checksum``  IPv4 header checksum wrong.
``icrc``         ICRC wrong.
``opcode``       BTH opcode Stellar does not support (RD, reserved, manufacturer-specific, ...).

Every corrupted frame carries exactly ONE fault, the one its label names; everything else about
it is valid (IPv4 checksum over the header as built, ICRC recomputed by scapy over the bytes as
built, lengths consistent), so a checker that finds a different fault is wrong. When a frame has
several faults (never built here, but the engine has to pick one counter) the first failing check
in this order names the outcome:

 1. ``malformed``: frame framing -- frame ends inside the IP packet (truncated), bytes beyond
    max(60, end of IP packet) (trailing bytes), IPv4 IHL < 5, IP version not matching the
    EtherType, UDP length not equal to the IP payload length, UDP payload shorter than BTH+ICRC.
    These come first because the ICRC cannot even be located without them.
 2. ``ip_checksum``: IPv4 header checksum.
 3. (not UDP dport 4791 directly after the IP header: ``non_roce``, never dropped.)
 4. ``icrc``: once the ICRC is wrong no header bit after the IP header can be trusted, so a
    wrong ICRC outranks every BTH-level fault below.
 5. ``malformed``: BTH TVer != 0 (the header format itself is unknown).
 6. ``opcode``: opcode not in ``headers.OPCODES``.
 7. ``malformed``: opcode-dependent lengths -- extension headers do not fit, payload on an
    opcode without payload, non-zero pad count on an opcode without payload, transport length
    (extension headers + payload + pad) not a multiple of 4, pad count larger than the payload.
"""

import enum
import ipaddress
import random
from typing import NamedTuple

from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6, IPv6ExtHdrHopByHop
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import PcapWriter, RawPcapReader
from stellar.hdl.net import headers as H

__all__ = [
    "Expect", "TraceFrame", "CORRUPTIONS", "IPV4_ONLY_CORRUPTIONS", "NON_ROCE_KINDS", "UNSUPPORTED_OPCODES",
    "MIN_FRAME", "JUMBO_MTU", "roce_frame", "random_roce", "corrupted_frame", "non_roce_frame",
    "mixed_trace", "write_pcap", "read_pcap", "ip_offset", "max_payload", "ip_options_of_length",
]

MIN_FRAME = 60          # Ethernet minimum without the 4-byte FCS
JUMBO_MTU = 9000        # largest IP packet the trace emits
DLT_EN10MB = 1          # pcap linktype: Ethernet

DEFAULT_ETH = {"dst": "02:00:00:00:00:02", "src": "02:00:00:00:00:01"}
DEFAULT_IPV4 = {"src": "10.0.0.1", "dst": "10.0.0.2"}
DEFAULT_IPV6 = {"src": "fd00::1", "dst": "fd00::2"}
# rxe and ConnectX pick the source port from a flow hash in 0xC000..0xFFFF. Keeping it above 4791
# also makes tshark (which tries the lower port first) dissect every frame as RoCEv2.
DEFAULT_UDP_SPORT = 0xC000

# BTH field names in the shared table -> scapy.contrib.roce.BTH field names.
BTH_TO_SCAPY = {
    "opcode": "opcode", "se": "solicited", "migreq": "migreq", "pad_count": "padcount",
    "tver": "version", "pkey": "pkey", "fecn": "fecn", "becn": "becn", "resv6": "resv6",
    "dest_qp": "dqpn", "ackreq": "ackreq", "resv7": "resv7", "psn": "psn",
}

# Opcodes Stellar must reject with "opcode": RC/UC holes, every RD opcode (RD is not supported),
# UD opcodes other than SEND_ONLY[_WITH_IMMEDIATE], the CNP neighbours and the reserved and
# manufacturer-specific ranges.
UNSUPPORTED_OPCODES = tuple(c for c in range(256) if c not in H.OPCODES)
_UNSUPPORTED_PICKS = (0x15, 0x18, 0x1F, 0x2C, 0x40, 0x44, 0x4C, 0x60, 0x66, 0x80, 0x82, 0xA0, 0xC0,
                      0xFF)
assert all(c in UNSUPPORTED_OPCODES for c in _UNSUPPORTED_PICKS)  # guards a table change


class Expect(str, enum.Enum):
    """What the packet engine must do with a frame (compares equal to its string value)."""
    PASS = "pass"
    NON_ROCE = "non_roce"
    MALFORMED = "malformed"
    IP_CHECKSUM = "ip_checksum"
    ICRC = "icrc"
    OPCODE = "opcode"

    def __str__(self):
        return self.value


class TraceFrame(NamedTuple):
    frame: bytes
    expect: Expect
    desc: str


# --------------------------------------------------------------------------------------------
# Building RoCEv2 frames
# --------------------------------------------------------------------------------------------

def _mac(v):
    if isinstance(v, int):
        return ":".join(f"{b:02x}" for b in v.to_bytes(6, "big"))
    return v


def _addr(v, version):
    if isinstance(v, int):
        return str(ipaddress.IPv4Address(v) if version == 4 else ipaddress.IPv6Address(v))
    return v


def _ip_options(opts):
    """Scapy option objects for raw option bytes (scapy has no raw-bytes option field)."""
    opts = bytes(opts)
    if len(opts) % 4 or len(opts) > H.MAX_IPV4_OPTIONS:
        raise ValueError(f"IPv4 options must be a multiple of 4 bytes, at most "
                         f"{H.MAX_IPV4_OPTIONS}; got {len(opts)}")
    if not opts:
        return []
    # Dissect a dummy header carrying the options, then check scapy rebuilds them byte for byte.
    parsed = IP(bytes([0x40 | (5 + len(opts) // 4)]) + bytes(19) + opts).options
    rebuilt = bytes(IP(options=parsed))[20:]
    if rebuilt != opts:
        raise ValueError(f"scapy cannot reproduce IPv4 options {opts.hex()} (got {rebuilt.hex()})")
    return parsed


def _vlan(vlan):
    if vlan is None:
        return None
    if isinstance(vlan, dict):
        return {"pcp": vlan.get("pcp", 0), "dei": vlan.get("dei", 0), "vid": vlan["vid"]}
    pcp, vid, *rest = vlan
    return {"pcp": pcp, "dei": rest[0] if rest else 0, "vid": vid}


def _ext_bytes(opcode, ext):
    ext = dict(ext or {})
    op = H.OPCODES.get(opcode)
    chain = op.ext if op else ()
    unknown = set(ext) - {h.name for h in chain}
    if unknown:
        raise ValueError(f"opcode {H.opcode_name(opcode)} carries {[h.name for h in chain]}, "
                         f"not {sorted(unknown)}")
    return b"".join(h.pack(ext.get(h.name, {})) for h in chain)


def _roce_packet(opcode, *, ipv6=False, vlan=None, payload=b"", eth=None, ip=None,
                 udp_sport=DEFAULT_UDP_SPORT, bth=None, ext=None, ecn=0, dscp=0, ttl=64, ip_id=0,
                 ip_options=b"", pad_bytes=None, ext_bytes=None, ip_fields=None, udp_fields=None):
    """The scapy packet behind :func:`roce_frame`; the extra keywords exist to build faults:

    ``pad_bytes``   pad bytes actually appended (default: what the payload needs);
    ``ext_bytes``   raw bytes in place of the packed extension headers;
    ``ip_fields``   scapy IP/IPv6 field overrides (``ihl``, ``version``, ...);
    ``udp_fields``  scapy UDP field overrides (``len``).
    ICRC and IPv4 checksum are always computed by scapy over the bytes as built.
    """
    payload = bytes(payload)
    if pad_bytes is None:
        # Every extension header is a multiple of 4 bytes, so the payload alone sets the pad.
        pad_bytes = -len(payload) % 4
    bth_values = {"pkey": 0xFFFF, "dest_qp": 0x11, "pad_count": -len(payload) % 4, **(bth or {})}
    if "opcode" in bth_values:
        raise ValueError("pass the opcode as the first argument, not in bth")
    H.BTH.pack(bth_values, opcode=opcode)  # validates names and widths against the table
    if ext_bytes is None:
        ext_bytes = _ext_bytes(opcode, ext)
    elif ext:
        raise ValueError("ext and ext_bytes are exclusive")

    eth = {**DEFAULT_ETH, **(eth or {})}
    vlan = _vlan(vlan)
    ethertype = H.ETHERTYPE_IPV6 if ipv6 else H.ETHERTYPE_IPV4
    pkt = Ether(dst=_mac(eth["dst"]), src=_mac(eth["src"]),
                type=H.ETHERTYPE_VLAN if vlan else ethertype)
    if vlan:
        pkt = pkt / Dot1Q(prio=vlan["pcp"], dei=vlan["dei"], vlan=vlan["vid"], type=ethertype)

    tos = (dscp << 2) | ecn
    if not (0 <= dscp < 64 and 0 <= ecn < 4):
        raise ValueError(f"dscp={dscp} ecn={ecn} out of range")
    if ipv6:
        if ip_options:
            raise ValueError("IPv6 has no options (extension headers are not RoCEv2)")
        ip = {**DEFAULT_IPV6, "flow_label": 0, **(ip or {})}
        l3 = IPv6(src=_addr(ip["src"], 6), dst=_addr(ip["dst"], 6), tc=tos, fl=ip["flow_label"],
                  hlim=ttl, nh=H.IPPROTO_UDP)
    else:
        ip = {**DEFAULT_IPV4, "flags": 2, **(ip or {})}  # DF: RoCEv2 senders never fragment
        l3 = IP(src=_addr(ip["src"], 4), dst=_addr(ip["dst"], 4), tos=tos, ttl=ttl, id=ip_id,
                flags=ip["flags"], proto=H.IPPROTO_UDP, options=_ip_options(ip_options))
    for k, v in (ip_fields or {}).items():
        setattr(l3, k, v)
    # UDP checksum 0: what RoCEv2 senders send, over IPv4 and IPv6 alike (the ICRC protects the
    # packet); scapy would otherwise fill one in.
    l4 = UDP(sport=udp_sport, dport=H.ROCEV2_UDP_PORT, chksum=0, **(udp_fields or {}))
    bth_pkt = ScapyBTH(**{BTH_TO_SCAPY[k]: v for k, v in bth_values.items()}, opcode=opcode)
    # Extension headers, payload and pad go in one Raw after the BTH: scapy's BTH covers them all
    # with the ICRC it appends (pad included, as A17.8 requires).
    return pkt / l3 / l4 / bth_pkt / Raw(ext_bytes + payload + bytes(pad_bytes))


def _finish(pkt):
    frame = bytes(pkt)
    return frame + bytes(max(0, MIN_FRAME - len(frame)))


def roce_frame(opcode, *, ipv6=False, vlan=None, payload=b"", eth=None, ip=None,
               udp_sport=DEFAULT_UDP_SPORT, bth=None, ext=None, ecn=0, dscp=0, ttl=64, ip_id=0,
               ip_options=b""):
    """One valid RoCEv2 frame, as bytes (no FCS, zero-padded to 60).

    ``opcode``      BTH opcode (``headers.OPCODES`` key; any byte for fault frames).
    ``ipv6``        IPv6 instead of IPv4.
    ``vlan``        None, ``(pcp, vid)``, ``(pcp, vid, dei)`` or ``{"pcp", "dei", "vid"}``.
    ``payload``     payload bytes; the pad bytes (zero) and the BTH pad count follow from its length.
    ``eth``         ``{"dst", "src"}`` MACs (strings or ints).
    ``ip``          ``{"src", "dst"}`` (strings or ints), IPv4 ``"flags"`` (default DF),
                    IPv6 ``"flow_label"``.
    ``udp_sport``   UDP source port (destination is always 4791, checksum always 0).
    ``bth``         BTH fields by table name (``se``, ``migreq``, ``pkey``, ``dest_qp``, ``psn``,
                    ``ackreq``, ``fecn``, ``becn``, ``resv6``, ``resv7``, ``tver``, ``pad_count``);
                    defaults: pkey 0xFFFF, dest_qp 0x11, pad_count from the payload, others 0.
    ``ext``         ``{header name: {field: value}}`` for the opcode's extension headers
                    (``reth``, ``aeth``, ``immdt``, ``ieth``, ``deth``, ``atomiceth``,
                    ``atomicacketh``, ``cnp``); missing headers and fields are zero.
    ``ecn``, ``dscp``, ``ttl`` (IPv6 hop limit), ``ip_id``, ``ip_options`` (raw IPv4 option bytes,
    a multiple of 4, at most 40).
    """
    return _finish(_roce_packet(opcode, ipv6=ipv6, vlan=vlan, payload=payload, eth=eth, ip=ip,
                                udp_sport=udp_sport, bth=bth, ext=ext, ecn=ecn, dscp=dscp, ttl=ttl,
                                ip_id=ip_id, ip_options=ip_options))


def ip_offset(frame):
    """Byte offset of the IP header (after Ethernet and at most one 802.1Q tag)."""
    return 18 if frame[12:14] == H.ETHERTYPE_VLAN.to_bytes(2, "big") else 14


def max_payload(opcode, *, ipv6=False, ip_options_len=0, mtu=JUMBO_MTU):
    """Largest payload (a multiple of 4, so no pad) whose IP packet fits in ``mtu`` bytes."""
    ip_hdr = H.IPV6.size if ipv6 else H.IPV4.size + ip_options_len
    room = mtu - ip_hdr - H.UDP.size - H.BTH.size - H.ext_layout(opcode)[1] - 4
    return room - room % 4


# --------------------------------------------------------------------------------------------
# Random valid frames
# --------------------------------------------------------------------------------------------

_PMTUS = (256, 512, 1024, 2048, 4096)
_FIRST_MIDDLE = {c for c, op in H.OPCODES.items() if op.name.endswith(("_FIRST", "_MIDDLE"))}
# AETH syndromes (IBTA 9.3.5): bits 6:5 = 00 ACK (credit count), 01 RNR NAK (timer), 11 NAK.
NAK_CODES = {0: "PSN sequence error", 1: "invalid request", 2: "remote access error",
             3: "remote operational error", 4: "invalid RD request"}


def _aeth_syndrome(rng, kind="ack"):
    if kind == "ack":
        return rng.randrange(32)            # credit count, 31 = no credit information
    if kind == "rnr":
        return 0x20 | rng.randrange(32)     # RNR NAK with a timer value
    return 0x60 | rng.choice(list(NAK_CODES))


def _random_ext(rng, opcode, aeth_kind="ack"):
    ext = {}
    for h in H.OPCODES[opcode].ext:
        vals = {f.name: rng.getrandbits(f.width) for f in h.fields}
        if h is H.AETH:
            vals["syndrome"] = _aeth_syndrome(rng, aeth_kind if opcode == 0x11 else "ack")
        if h is H.DETH:
            vals["resv8"] = 0
        if h is H.CNP:
            vals = {}
        ext[h.name] = vals
    return ext


def _random_payload_len(rng, opcode, ipv6, ip_options_len):
    op = H.OPCODES[opcode]
    if not op.payload:
        return 0
    # FIRST and MIDDLE packets carry exactly one path MTU of payload (only the LAST/ONLY packet of
    # a message may be shorter and padded), so they are 4-aligned with pad count 0.
    if opcode in _FIRST_MIDDLE:
        return rng.choice(_PMTUS[:3] if rng.random() < 0.85 else _PMTUS)
    r = rng.random()
    if r < 0.25:
        return rng.randint(0, 8)
    if r < 0.6:
        return rng.randint(9, 256)
    if r < 0.85:
        return rng.randint(257, 1500)
    if r < 0.95:
        return rng.randint(1501, 4096)
    return rng.randint(4097, max_payload(opcode, ipv6=ipv6, ip_options_len=ip_options_len))


def ip_options_of_length(n, rng=None):
    """``n`` bytes (a multiple of 4, 4..40) of well-formed IPv4 options, so that tshark raises no
    warning: [NOPs] [Router Alert (RFC 2113)] [Record Route, empty (RFC 791)] End-of-List
    padding. At most 3 NOPs in a row (tshark warns about more: "a router may have removed some
    options")."""
    rng = rng or random.Random(n)
    if n % 4 or not 4 <= n <= H.MAX_IPV4_OPTIONS:
        raise ValueError(f"IPv4 options length {n}: need a multiple of 4 in 4..40")
    body = b"\x01" * rng.randint(0, 3)
    if n - len(body) >= 5 and rng.random() < 0.5:
        body += b"\x94\x04\x00\x00"
    room = n - len(body) - 1                 # keep one byte for End-of-List
    if room >= 7:
        rr_len = 3 + 4 * ((room - 3) // 4)
        body += bytes([0x07, rr_len, 4]) + bytes(rr_len - 3)
    return body + bytes(n - len(body))      # EOL (0), then zero padding


def _random_payload(rng, n):
    """Random payload bytes that tshark will not mistake for an encapsulated frame.

    tshark's InfiniBand dissector treats a payload whose bytes 2..3 are zero as IPoIB (EtherType
    in bytes 0..1, two reserved zero bytes) and hands the rest to that EtherType's dissector,
    which then reports random data as a malformed VLAN/IPv4/... packet. Bytes 2..3 include the
    zero pad bytes of a 1- or 2-byte payload, so those start with an EtherType below 0x0040 (tshark
    4.0 registers none there; its lowest are 0x0059, 0x0061, ...), and longer payloads get a
    non-zero byte 2.
    """
    p = bytearray(rng.randbytes(n))
    if n in (1, 2):
        p[0] = 0
        p[n - 1] &= 0x3F
    elif n >= 3 and p[2:4] in (b"\0", b"\0\0"):
        p[2] = rng.randint(1, 255)
    return bytes(p)


def _random_ip_options(rng):
    return ip_options_of_length(4 * rng.randint(1, 10), rng)


_RANDOM = object()  # "draw this at random" (None is a meaningful value: no VLAN)


def random_roce(rng, opcode=None, *, ipv6=_RANDOM, vlan=_RANDOM, ip_options=_RANDOM,
                payload_len=_RANDOM, aeth_kind="ack", **overrides):
    """Keyword arguments (``opcode`` included) for :func:`roce_frame` with random valid values.

    ``opcode``, ``ipv6``, ``vlan``, ``ip_options`` and ``payload_len`` are drawn from ``rng``
    unless given. Reserved fields stay zero, the AETH of ACKNOWLEDGE follows ``aeth_kind``
    ("ack", "rnr", "nak"), CNPs set BECN. Any ``roce_frame`` keyword in ``overrides`` wins.
    """
    if opcode is None:
        opcode = rng.choice(list(H.OPCODES))
    if ipv6 is _RANDOM:
        ipv6 = rng.random() < 0.3
    if vlan is _RANDOM:
        vlan = (rng.randrange(8), rng.randint(1, 4094)) if rng.random() < 0.3 else None
    if ip_options is _RANDOM:
        ip_options = _random_ip_options(rng) if not ipv6 and rng.random() < 0.15 else b""
    if payload_len is _RANDOM:
        payload_len = _random_payload_len(rng, opcode, ipv6, len(ip_options))
    elif payload_len and opcode in H.OPCODES and not H.OPCODES[opcode].payload:
        raise ValueError(f"{H.opcode_name(opcode)} carries no payload (that is the "
                         f"'payload_nopayload' fault)")
    ecn = rng.choice((0, 1, 2, 3)) if rng.random() < 0.5 else 2
    bth = {"se": rng.getrandbits(1), "migreq": rng.getrandbits(1),
           "pkey": 0xFFFF if rng.random() < 0.7 else rng.getrandbits(16),
           "dest_qp": rng.getrandbits(24), "ackreq": rng.getrandbits(1), "psn": rng.getrandbits(24)}
    if opcode == 0x81:
        # CNP (A17.9.3): BECN set, and the other BTH fields that carry no meaning left at zero.
        bth = {"becn": 1, "dest_qp": bth["dest_qp"], "pkey": bth["pkey"]}
    if ipv6:
        ip = {"src": rng.getrandbits(128), "dst": rng.getrandbits(128),
              "flow_label": rng.getrandbits(20)}
    else:
        ip = {"src": rng.getrandbits(32), "dst": rng.getrandbits(32)}
    kwargs = dict(
        ipv6=ipv6, vlan=vlan, payload=_random_payload(rng, payload_len),
        eth={"dst": rng.getrandbits(48) & ~(1 << 40), "src": rng.getrandbits(48) & ~(1 << 40)},
        ip=ip, udp_sport=rng.randint(0xC000, 0xFFFF), bth=bth,
        ext=_random_ext(rng, opcode, aeth_kind), ecn=ecn, dscp=rng.choice((0, 26, 46, 48)),
        ttl=rng.randint(1, 255), ip_id=0 if ipv6 else rng.getrandbits(16), ip_options=ip_options)
    kwargs.update(overrides)
    return {"opcode": opcode, **kwargs}


def _describe(kw):
    opcode = kw["opcode"]
    parts = [H.opcode_name(opcode), "ipv6" if kw.get("ipv6") else "ipv4"]
    if kw.get("vlan"):
        parts.append(f"vlan={_vlan(kw['vlan'])['vid']}")
    if kw.get("ip_options"):
        parts.append(f"ihl={5 + len(kw['ip_options']) // 4}")
    parts.append(f"payload={len(kw.get('payload', b''))}")
    if kw.get("ecn") == 3:
        parts.append("CE")
    aeth = (kw.get("ext") or {}).get("aeth")
    if opcode == 0x11 and aeth:
        s = aeth["syndrome"]
        parts.append({0: "ACK", 1: "RNR-NAK", 3: f"NAK({NAK_CODES.get(s & 31, s & 31)})"}
                     .get(s >> 5, f"syndrome={s:#x}"))
    return " ".join(parts)


def _valid(rng, opcode=None, **kw):
    kwargs = random_roce(rng, opcode, **kw)
    return TraceFrame(roce_frame(**kwargs), Expect.PASS, _describe(kwargs))


def _forwarded(rng, ipv6):
    """A valid frame whose ICRC-masked fields a router rewrote after the sender computed the ICRC
    (TTL / hop limit, ECN set to CE, DSCP, IPv6 flow label; IPv4 checksum updated as a router
    does). The ICRC must still check: A17.8 masks exactly these fields."""
    kwargs = random_roce(rng, ipv6=ipv6)
    f = bytearray(roce_frame(**kwargs))
    o = ip_offset(f)
    tos = (rng.randrange(64) << 2) | 3                              # new DSCP, ECN CE
    if ipv6:
        fl = rng.getrandbits(20)
        f[o] = 0x60 | tos >> 4
        f[o + 1] = (tos & 0x0F) << 4 | fl >> 16
        f[o + 2:o + 4] = (fl & 0xFFFF).to_bytes(2, "big")
        f[o + 7] = rng.randint(1, 255)                              # hop limit
    else:
        f[o + 1] = tos
        f[o + 8] = rng.randint(1, 255)                              # TTL
        ihl = (f[o] & 15) * 4
        f[o + 10:o + 12] = b"\0\0"
        f[o + 10:o + 12] = _inet_checksum(f[o:o + ihl]).to_bytes(2, "big")
    return TraceFrame(bytes(f), Expect.PASS, _describe(kwargs) + " forwarded(masked fields rewritten)")


def _inet_checksum(data):
    s = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


# --------------------------------------------------------------------------------------------
# Corrupted frames: one fault each, expected outcome fixed by construction
# --------------------------------------------------------------------------------------------

_NO_PAYLOAD = tuple(c for c, op in H.OPCODES.items() if not op.payload)
_WITH_PAYLOAD = tuple(c for c, op in H.OPCODES.items() if op.payload)
_WITH_EXT = tuple(c for c, op in H.OPCODES.items() if op.ext)


def _layout(frame):
    """(IP offset, end of the IP packet, offset of the BTH) of a frame built here."""
    o = ip_offset(frame)
    if frame[o - 2:o] == H.ETHERTYPE_IPV6.to_bytes(2, "big"):
        return o, o + 40 + int.from_bytes(frame[o + 4:o + 6], "big"), o + 40 + 8
    ihl = (frame[o] & 15) * 4
    return o, o + int.from_bytes(frame[o + 2:o + 4], "big"), o + ihl + 8


def _flip(frame, lo, hi, rng):
    """Flip one random bit in frame[lo:hi]."""
    f = bytearray(frame)
    i = rng.randrange(lo, hi)
    f[i] ^= 1 << rng.randrange(8)
    return bytes(f), i


def _fault_icrc_payload(rng, kw):
    if not kw.get("payload"):
        kw["payload"] = rng.randbytes(rng.randint(1, 64))
    frame = roce_frame(**kw)
    _, end, bth = _layout(frame)
    start = bth + H.BTH.size + H.ext_layout(kw["opcode"])[1]
    frame, i = _flip(frame, start, start + len(kw["payload"]), rng)
    return frame, f"payload bit flipped at byte {i}"


def _fault_icrc_value(rng, kw):
    frame = roce_frame(**kw)
    _, end, _ = _layout(frame)
    frame, i = _flip(frame, end - 4, end, rng)
    return frame, f"ICRC bit flipped at byte {i}"


def _fault_icrc_udp_sport(rng, kw):
    # The UDP source port is covered by the ICRC and by nothing else (UDP checksum is 0).
    frame = roce_frame(**kw)
    _, _, bth = _layout(frame)
    frame, i = _flip(frame, bth - 8, bth - 6, rng)
    return frame, "UDP source port bit flipped"


def _fault_ip_checksum(rng, kw):
    kw["ipv6"] = False
    f = bytearray(roce_frame(**kw))
    o = ip_offset(f)
    old = int.from_bytes(f[o + 10:o + 12], "big")
    while True:
        new = old ^ rng.randint(1, 0xFFFF)
        # 0x0000 and 0xFFFF are the same one's-complement number: swapping them is no fault.
        if {old, new} != {0x0000, 0xFFFF}:
            break
    f[o + 10:o + 12] = new.to_bytes(2, "big")
    return bytes(f), f"IPv4 checksum {old:#06x} -> {new:#06x}"


def _fault_truncated_header(rng, kw):
    frame = roce_frame(**kw)
    o, _, bth = _layout(frame)
    hdr_end = bth + H.BTH.size + H.ext_layout(kw["opcode"])[1]
    # Keep the EtherType (so the frame is still claimed by IPv4/IPv6), cut anywhere after it.
    cut = rng.randrange(o + 1, hdr_end)
    return frame[:cut], f"cut at byte {cut}, inside the headers"


def _fault_truncated_tail(rng, kw):
    frame = roce_frame(**kw)
    _, end, bth = _layout(frame)
    hdr_end = bth + H.BTH.size + H.ext_layout(kw["opcode"])[1]
    cut = rng.randrange(hdr_end, end)  # inside payload, pad or ICRC; never only Ethernet padding
    return frame[:cut], f"cut at byte {cut} of {end}, after the headers"


def _fault_ipv4_ihl(rng, kw):
    kw["ipv6"] = False
    kw["ip_options"] = b""  # the real header is exactly 20 bytes, so only the IHL field lies
    ihl = rng.randrange(5)
    # scapy computes the checksum over the header bytes it built and the ICRC over the frame as
    # built, so IHL is the only wrong thing.
    return _finish(_roce_packet(**kw, ip_fields={"ihl": ihl})), f"IPv4 IHL {ihl}"


def _fault_ip_version(rng, kw):
    good = 6 if kw.get("ipv6") else 4
    version = rng.choice([v for v in range(16) if v != good])
    return (_finish(_roce_packet(**kw, ip_fields={"version": version})),
            f"IP version {version} under EtherType IPv{good}")


def _fault_bth_tver(rng, kw):
    tver = rng.randint(1, 15)
    kw["bth"] = {**kw.get("bth", {}), "tver": tver}
    return roce_frame(**kw), f"BTH TVer {tver}"


def _fault_pad_nopayload(rng, kw):
    pad = rng.randint(1, 3)
    kw["payload"] = b""
    kw["bth"] = {**kw.get("bth", {}), "pad_count": pad}
    return roce_frame(**kw), f"pad count {pad} on an opcode without payload"


def _fault_pad_misaligned(rng, kw):
    if len(kw.get("payload", b"")) % 4 == 0:
        kw["payload"] = rng.randbytes(4 * rng.randint(0, 16) + rng.randint(1, 3))
    n = len(kw["payload"])
    # The pad count says what the payload needs, but the pad bytes are missing: the transport
    # length (ext + payload) is not a multiple of 4.
    return (_finish(_roce_packet(**kw, pad_bytes=0)),
            f"payload {n} bytes, pad count {-n % 4}, no pad bytes")


def _fault_udp_length(rng, kw):
    frame = roce_frame(**kw)
    o, end, bth = _layout(frame)
    good = end - (bth - 8)
    bad = max(0, good + rng.choice((-8, -4, -1, 1, 4, 8, 100)))
    return (_finish(_roce_packet(**kw, udp_fields={"len": bad})),
            f"UDP length {bad}, IP payload {good}")


def _fault_trailing_bytes(rng, kw):
    frame = roce_frame(**kw)
    extra = rng.randbytes(rng.randint(1, 64))
    _, end, _ = _layout(frame)
    return frame + extra, f"{len(extra)} bytes after max(60, IP end {end})"


def _fault_ext_truncated(rng, kw):
    full = _ext_bytes(kw["opcode"], kw.get("ext"))
    keep = 4 * rng.randrange(len(full) // 4)  # keep 4-byte alignment: only the length is wrong
    kw.pop("ext", None)
    kw["payload"] = b""
    return (_finish(_roce_packet(**kw, ext_bytes=full[:keep])),
            f"{keep} of {len(full)} extension-header bytes, no payload")


def _fault_payload_nopayload(rng, kw):
    kw["payload"] = rng.randbytes(4 * rng.randint(1, 8))
    return roce_frame(**kw), f"{len(kw['payload'])} payload bytes on an opcode without payload"


def _fault_opcode(rng, kw):
    return roce_frame(**kw), f"opcode {kw['opcode']:#04x}"


# fault kind -> (expected outcome, builder). Builders take (rng, roce_frame kwargs with the
# opcode already suited to the fault) and return (frame, what was broken).
CORRUPTIONS = {
    "icrc_payload": (Expect.ICRC, _fault_icrc_payload),
    "icrc_value": (Expect.ICRC, _fault_icrc_value),
    "icrc_udp_sport": (Expect.ICRC, _fault_icrc_udp_sport),
    "ip_checksum": (Expect.IP_CHECKSUM, _fault_ip_checksum),
    "truncated_header": (Expect.MALFORMED, _fault_truncated_header),
    "truncated_tail": (Expect.MALFORMED, _fault_truncated_tail),
    "ipv4_ihl": (Expect.MALFORMED, _fault_ipv4_ihl),
    "ip_version": (Expect.MALFORMED, _fault_ip_version),
    "bth_tver": (Expect.MALFORMED, _fault_bth_tver),
    "pad_nopayload": (Expect.MALFORMED, _fault_pad_nopayload),
    "pad_misaligned": (Expect.MALFORMED, _fault_pad_misaligned),
    "udp_length": (Expect.MALFORMED, _fault_udp_length),
    "trailing_bytes": (Expect.MALFORMED, _fault_trailing_bytes),
    "ext_truncated": (Expect.MALFORMED, _fault_ext_truncated),
    "payload_nopayload": (Expect.MALFORMED, _fault_payload_nopayload),
    "opcode": (Expect.OPCODE, _fault_opcode),
}
IPV4_ONLY_CORRUPTIONS = frozenset({"ip_checksum", "ipv4_ihl"})
# Faults that only exist on some opcodes; the others suit every supported opcode.
_FAULT_OPCODES = {
    "icrc_payload": _WITH_PAYLOAD,
    "pad_nopayload": _NO_PAYLOAD,
    "pad_misaligned": _WITH_PAYLOAD,
    "ext_truncated": _WITH_EXT,
    "payload_nopayload": _NO_PAYLOAD,
    "opcode": UNSUPPORTED_OPCODES,
}


def corrupted_frame(kind, rng, **kwargs):
    """A RoCEv2 frame with exactly one fault of ``kind`` (a :data:`CORRUPTIONS` key).

    ``kwargs`` are :func:`random_roce` / :func:`roce_frame` keywords, ``opcode`` included;
    what is missing is drawn from ``rng``. An opcode that cannot carry the fault is an error.
    Returns a :class:`TraceFrame` whose ``expect`` is the fault's outcome.
    """
    expect, build = CORRUPTIONS[kind]
    if kind in IPV4_ONLY_CORRUPTIONS:
        if kwargs.get("ipv6"):
            raise ValueError(f"fault {kind!r} exists only on IPv4")
        kwargs["ipv6"] = False
    opcode = kwargs.pop("opcode", None)
    allowed = _FAULT_OPCODES.get(kind, tuple(H.OPCODES))
    if opcode is None:
        opcode = rng.choice(_UNSUPPORTED_PICKS if kind == "opcode" else allowed)
    elif opcode not in allowed:
        raise ValueError(f"fault {kind!r} needs an opcode among {[hex(c) for c in allowed]}, "
                         f"got {opcode:#x}")
    if opcode in H.OPCODES:
        base = random_roce(rng, opcode, **kwargs)
    else:
        # Unsupported opcode: no extension headers, the random payload of an RC SEND_ONLY.
        base = {**random_roce(rng, 0x04, **kwargs), "opcode": opcode}
    frame, what = build(rng, base)
    return TraceFrame(frame, expect, f"{kind}: {what} [{_describe(base)}]")


# --------------------------------------------------------------------------------------------
# Non-RoCE frames
# --------------------------------------------------------------------------------------------

def _l2(rng, vlan, ethertype=None):
    """Ethernet [+ 802.1Q]; scapy fills in the EtherType from the next layer unless given."""
    pkt = Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01")
    if vlan:
        pkt = pkt / Dot1Q(prio=rng.randrange(8), vlan=rng.randint(1, 4094))
    if ethertype is not None:
        pkt.lastlayer().type = ethertype
    return pkt


def _nr_arp(rng, vlan):
    return (_l2(rng, vlan) / ARP(op=rng.choice((1, 2)), hwsrc="02:00:00:00:00:01",
                                 psrc="10.0.0.1", pdst="10.0.0.2"), "ARP")


def _nr_tcp(rng, vlan):
    return (_l2(rng, vlan) / IP(src="10.0.0.1", dst="10.0.0.2", flags="DF")
            / TCP(sport=rng.randint(0xC000, 0xFFFF), dport=rng.choice((4791, rng.randint(0xC000, 0xFFFF))),
                  flags="PA")
            / Raw(rng.randbytes(rng.randint(0, 1400))), "IPv4 TCP")


def _text(n):
    # ASCII filler for non-RoCE UDP payloads: random bytes on an unregistered UDP port still
    # wake tshark's heuristic dissectors (RTCP, ...) and get reported as malformed.
    return (b"stellar non-roce udp payload " * (n // 29 + 1))[:n]


def _nr_udp_other(rng, vlan):
    # UDP that is not RoCEv2: a neighbouring port and a one-bit-off port that a sloppy compare
    # would accept, an unregistered port pair (random payloads would trip tshark's DNS, VXLAN-GPE
    # (4790), ... dissectors on registered ports), and source port 4791 with a RoCEv2-looking
    # body (an ACK): only the destination port makes RoCEv2.
    sport, dport = rng.choice(((0xC123, 4792), (0xC123, 4791 ^ 0x0100), (0xD000, 0xD001),
                               (4791, 0xC123)))
    if sport == H.ROCEV2_UDP_PORT:
        body = H.BTH.pack(opcode=0x11, pkey=0xFFFF, dest_qp=0x11) + H.AETH.pack(msn=1) + bytes(4)
    else:
        body = _text(rng.randint(0, 512))
    return (_l2(rng, vlan) / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=sport, dport=dport)
            / Raw(body), f"IPv4 UDP {sport}->{dport}")


def _nr_icmp(rng, vlan):
    return (_l2(rng, vlan) / IP(src="10.0.0.1", dst="10.0.0.2") / ICMP()
            / Raw(rng.randbytes(56)), "IPv4 ICMP echo")


def _nr_icmpv6(rng, vlan):
    return (_l2(rng, vlan) / IPv6(src="fd00::1", dst="fd00::2")
            / ICMPv6EchoRequest(id=rng.getrandbits(16), data=rng.randbytes(32)), "IPv6 ICMPv6 echo")


def _nr_udp6_other(rng, vlan):
    return (_l2(rng, vlan) / IPv6(src="fd00::1", dst="fd00::2")
            / UDP(sport=0xC123, dport=rng.choice((4792, 0xD001))) / Raw(_text(100)),
            "IPv6 UDP, other port")


def _nr_ipv6_hbh(rng, vlan):
    # UDP 4791 behind an IPv6 extension header: headers.IPV6 says extension headers are not
    # RoCEv2 traffic, so the engine sees next_header 0, not 17, and lets the frame through.
    # The body is an ACK (BTH, AETH) with a zero ICRC: scapy's BTH cannot compute one here.
    body = H.BTH.pack(opcode=0x11, pkey=0xFFFF, dest_qp=0x11) + H.AETH.pack(msn=1) + bytes(4)
    pkt = (_l2(rng, vlan) / IPv6(src="fd00::1", dst="fd00::2") / IPv6ExtHdrHopByHop()
           / UDP(sport=0xC000, dport=H.ROCEV2_UDP_PORT, chksum=0) / Raw(body))
    return pkt, "IPv6 hop-by-hop header, then UDP 4791"


def _nr_ethertype(rng, vlan):
    return (_l2(rng, vlan, 0x88B5) / Raw(rng.randbytes(rng.randint(46, 200))),
            "EtherType 0x88B5 (local experimental)")


NON_ROCE_KINDS = {
    "arp": _nr_arp, "ipv4_tcp": _nr_tcp, "ipv4_udp_other_port": _nr_udp_other,
    "ipv4_icmp": _nr_icmp, "ipv6_icmpv6": _nr_icmpv6, "ipv6_udp_other_port": _nr_udp6_other,
    "ipv6_ext_header_udp4791": _nr_ipv6_hbh, "other_ethertype": _nr_ethertype,
}


def non_roce_frame(kind, rng, *, vlan=False):
    """A valid frame that is not RoCEv2 (a :data:`NON_ROCE_KINDS` key): the engine passes it."""
    pkt, desc = NON_ROCE_KINDS[kind](rng, vlan)
    return TraceFrame(_finish(pkt), Expect.NON_ROCE, desc + (" vlan" if vlan else ""))


# --------------------------------------------------------------------------------------------
# The mixed trace
# --------------------------------------------------------------------------------------------

def _coverage_recipes():
    """One recipe per thing the trace must show at least once."""
    recipes = [lambda rng, c=c: _valid(rng, c) for c in H.OPCODES]
    recipes += [lambda rng, k=k: _valid(rng, 0x11, aeth_kind=k) for k in ("nak", "rnr")]
    recipes += [
        lambda rng: _valid(rng, 0x04, ipv6=False, vlan=(3, 100),               # IHL 15
                           ip_options=ip_options_of_length(40, rng)),
        lambda rng: _valid(rng, 0x0A, ipv6=True, vlan=(5, 7)),
        lambda rng: _valid(rng, 0x04, payload_len=0, ipv6=False),
        lambda rng: _valid(rng, 0x04, ecn=3),
        lambda rng: _valid(rng, 0x81, ipv6=True),
        lambda rng: _valid(rng, 0x0A, ipv6=False, ip_options=b"",                  # 9000-byte IP
                           payload_len=max_payload(0x0A)),
        lambda rng: _valid(rng, 0x04, ipv6=True, payload_len=max_payload(0x04, ipv6=True)),
        lambda rng: _forwarded(rng, False),
        lambda rng: _forwarded(rng, True),
    ]
    for kind in CORRUPTIONS:
        recipes.append(lambda rng, k=kind: corrupted_frame(k, rng, ipv6=False))
        if kind not in IPV4_ONLY_CORRUPTIONS:
            recipes.append(lambda rng, k=kind: corrupted_frame(k, rng, ipv6=True))
    for kind in NON_ROCE_KINDS:
        recipes.append(lambda rng, k=kind: non_roce_frame(k, rng))
        recipes.append(lambda rng, k=kind: non_roce_frame(k, rng, vlan=True))
    return recipes


def _random_recipe(rng):
    r = rng.random()
    if r < 0.65:
        return _valid(rng)
    if r < 0.70:
        return _forwarded(rng, rng.random() < 0.3)
    if r < 0.85:
        kind = rng.choice(list(CORRUPTIONS))
        return corrupted_frame(kind, rng, ipv6=False if kind in IPV4_ONLY_CORRUPTIONS else rng.random() < 0.3)
    return non_roce_frame(rng.choice(list(NON_ROCE_KINDS)), rng, vlan=rng.random() < 0.3)


def mixed_trace(seed, count):
    """``count`` frames for ``make sim``: list of :class:`TraceFrame` (frame, expect, desc).

    Deterministic from ``seed``. The first frames (in a seed-shuffled order) cover every
    supported opcode, ACK/NAK/RNR NAK, IHL 15, IPv6, VLAN, zero and jumbo payloads, ECN CE,
    router-rewritten masked fields, every fault kind (IPv4 and IPv6) and every non-RoCE kind;
    with ``count`` below that many only a seed-chosen subset of them appears. The rest is drawn
    at random: ~70% valid RoCEv2, ~15% faulty, ~15% non-RoCE.
    """
    rng = random.Random(seed)
    recipes = _coverage_recipes()
    rng.shuffle(recipes)
    out = [r(rng) for r in recipes[:count]]
    while len(out) < count:
        out.append(_random_recipe(rng))
    return out


# --------------------------------------------------------------------------------------------
# pcap files
# --------------------------------------------------------------------------------------------

def write_pcap(path, frames):
    """Write frames (bytes or :class:`TraceFrame`) to a pcap, linktype Ethernet.

    Timestamps are 1 us apart from the epoch, so the file is a pure function of the frames.
    """
    with PcapWriter(str(path), linktype=DLT_EN10MB, sync=False) as w:
        w.write_header(None)  # write_packet() alone writes records only; an empty trace is valid
        for i, f in enumerate(frames):
            f = f.frame if isinstance(f, TraceFrame) else bytes(f)
            sec, usec = divmod(i, 1_000_000)
            w.write_packet(f, sec=sec, usec=usec)


def read_pcap(path):
    """Frames of a pcap/pcapng file as raw bytes (no re-serialization by scapy)."""
    with RawPcapReader(str(path)) as r:
        if r.linktype != DLT_EN10MB:
            raise ValueError(f"{path}: linktype {r.linktype}, expected Ethernet ({DLT_EN10MB})")
        return [bytes(data) for data, _meta in r]
