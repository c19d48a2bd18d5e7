# Ref: IEEE 802.3 / 802.1Q (Ethernet II, VLAN tag); RFC 791 (IPv4); RFC 8200 (IPv6);
#      RFC 768 (UDP); IBTA Vol 1 Rel 1.4 ch. 9.2-9.5 (BTH, RETH, AETH, ImmDt, IETH, DETH,
#      AtomicETH, AtomicAckETH); IBTA Vol 1 Annex A17 "RoCEv2" (UDP port 4791, ICRC, CNP).
"""The one declaration of every header format Stellar parses and emits.

Pure Python (no amaranth import), so the host driver, the tests and the gateware all read the
same table. Each header is a list of fields: ``(name, byte offset, bit offset, width)``. Offsets
are in network order: ``bit`` counts from the most significant bit of byte ``byte`` (bit 0 is the
MSB), exactly as the RFC/IBTA diagrams draw them.

From this table come:
  * the Python codec below (``Header.pack`` / ``Header.unpack``),
  * the Amaranth header-metadata record (``stellar.hdl.net.layout``),
  * the field-extraction and serialization gateware of the parser and deparser,
  * the Markdown reference (``python -m stellar.hdl.net.headers --markdown``).
"""

from dataclasses import dataclass

__all__ = [
    "Field", "Header", "HEADERS", "ETH", "VLAN", "IPV4", "IPV6", "UDP", "BTH", "RETH", "AETH",
    "IMMDT", "IETH", "DETH", "ATOMICETH", "ATOMICACKETH", "CNP", "OPCODES", "Opcode",
    "ROCEV2_UDP_PORT", "ETHERTYPE_IPV4", "ETHERTYPE_IPV6", "ETHERTYPE_VLAN", "IPPROTO_UDP",
    "EXT_HEADERS", "MAX_IPV4_OPTIONS", "MAX_HEADER_BYTES", "ext_layout", "opcode_name",
]

ROCEV2_UDP_PORT = 4791
ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_IPV6 = 0x86DD
ETHERTYPE_VLAN = 0x8100
IPPROTO_UDP = 17
MAX_IPV4_OPTIONS = 40  # IHL 15 -> 60-byte header -> 40 bytes of options


@dataclass(frozen=True)
class Field:
    name: str
    byte: int
    bit: int
    width: int
    doc: str = ""

    @property
    def first_bit(self):
        """Offset of the field's MSB from the start of the header, in bits."""
        return self.byte * 8 + self.bit


@dataclass(frozen=True)
class Header:
    name: str
    size: int
    fields: tuple
    doc: str = ""

    def __post_init__(self):
        covered = 0
        for f in self.fields:
            assert f.first_bit == covered, f"{self.name}.{f.name}: gap or overlap at bit {covered}"
            covered += f.width
        assert covered == self.size * 8, f"{self.name}: fields cover {covered} of {self.size * 8} bits"

    def field(self, name):
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.name} has no field {name!r}")

    def pack(self, values=None, **kwargs):
        """Serialize a dict of field values (missing fields are zero) to ``size`` bytes."""
        values = {**(values or {}), **kwargs}
        unknown = set(values) - {f.name for f in self.fields}
        if unknown:
            raise KeyError(f"{self.name} has no field(s) {sorted(unknown)}")
        word = 0
        for f in self.fields:
            v = int(values.get(f.name, 0))
            if not 0 <= v < (1 << f.width):
                raise ValueError(f"{self.name}.{f.name}={v:#x} does not fit in {f.width} bits")
            word |= v << (self.size * 8 - f.first_bit - f.width)
        return word.to_bytes(self.size, "big")

    def unpack(self, data, offset=0):
        """Parse ``size`` bytes at ``offset`` into a dict of field values."""
        raw = bytes(data[offset:offset + self.size])
        if len(raw) != self.size:
            raise ValueError(f"{self.name}: need {self.size} bytes, got {len(raw)}")
        word = int.from_bytes(raw, "big")
        return {f.name: (word >> (self.size * 8 - f.first_bit - f.width)) & ((1 << f.width) - 1)
                for f in self.fields}


def _header(name, doc, *fields):
    out, byte, bit = [], 0, 0
    for fname, width, fdoc in fields:
        out.append(Field(fname, byte, bit, width, fdoc))
        bit += width
        byte, bit = byte + bit // 8, bit % 8
    assert bit == 0, name
    return Header(name, byte, tuple(out), doc)


ETH = _header(
    "eth", "Ethernet II header (no FCS on Stellar's streams: the MAC strips and adds it)",
    ("dst", 48, "destination MAC"),
    ("src", 48, "source MAC"),
    ("ethertype", 16, "EtherType (0x8100 here means a VLAN tag follows)"),
)
VLAN = _header(
    "vlan", "802.1Q tag body, after the 0x8100 TPID in eth.ethertype",
    ("pcp", 3, "priority code point (802.1p)"),
    ("dei", 1, "drop eligible indicator"),
    ("vid", 12, "VLAN ID"),
    ("ethertype", 16, "inner EtherType"),
)
IPV4 = _header(
    "ipv4", "IPv4 header without options (options follow when IHL > 5)",
    ("version", 4, "4"),
    ("ihl", 4, "header length in 32-bit words, 5..15"),
    ("dscp", 6, "differentiated services code point"),
    ("ecn", 2, "ECN: 0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE"),
    ("total_length", 16, "IP header + payload bytes (computed by the deparser)"),
    ("identification", 16, "IPv4 ID"),
    ("flags", 3, "reserved, DF, MF"),
    ("frag_offset", 13, "fragment offset"),
    ("ttl", 8, "time to live"),
    ("protocol", 8, "17 = UDP"),
    ("checksum", 16, "header checksum (computed by the deparser)"),
    ("src", 32, "source address"),
    ("dst", 32, "destination address"),
)
IPV6 = _header(
    "ipv6", "IPv6 fixed header (extension headers are not RoCEv2 traffic)",
    ("version", 4, "6"),
    ("dscp", 6, "traffic class, DSCP part"),
    ("ecn", 2, "traffic class, ECN part"),
    ("flow_label", 20, "flow label"),
    ("payload_length", 16, "bytes after this header (computed by the deparser)"),
    ("next_header", 8, "17 = UDP"),
    ("hop_limit", 8, "hop limit"),
    ("src", 128, "source address"),
    ("dst", 128, "destination address"),
)
UDP = _header(
    "udp", "UDP header; RoCEv2 uses destination port 4791",
    ("sport", 16, "source port (RoCEv2 uses it as flow entropy)"),
    ("dport", 16, "destination port"),
    ("length", 16, "UDP header + payload bytes (computed by the deparser)"),
    ("checksum", 16, "UDP checksum; RoCEv2 senders commonly send 0"),
)
BTH = _header(
    "bth", "Base Transport Header (IBTA 9.2)",
    ("opcode", 8, "transport (3 bits) + operation (5 bits); 0x81 = CNP"),
    ("se", 1, "solicited event"),
    ("migreq", 1, "migration request"),
    ("pad_count", 2, "pad bytes before the ICRC (computed by the deparser)"),
    ("tver", 4, "transport header version, 0"),
    ("pkey", 16, "partition key"),
    ("fecn", 1, "forward ECN (RoCEv2: reserved)"),
    ("becn", 1, "backward ECN (CNP sets it)"),
    ("resv6", 6, "reserved"),
    ("dest_qp", 24, "destination QP number"),
    ("ackreq", 1, "acknowledge request"),
    ("resv7", 7, "reserved"),
    ("psn", 24, "packet sequence number"),
)
RETH = _header(
    "reth", "RDMA Extended Transport Header (IBTA 9.3.3)",
    ("va", 64, "virtual address"),
    ("rkey", 32, "remote key"),
    ("dma_length", 32, "DMA length in bytes"),
)
AETH = _header(
    "aeth", "ACK Extended Transport Header (IBTA 9.3.5)",
    ("syndrome", 8, "ACK / RNR NAK / NAK code and credit or timer"),
    ("msn", 24, "message sequence number"),
)
IMMDT = _header(
    "immdt", "Immediate Data Extended Transport Header (IBTA 9.3.6)",
    ("data", 32, "immediate data"),
)
IETH = _header(
    "ieth", "Invalidate Extended Transport Header (IBTA 9.3.7)",
    ("rkey", 32, "remote key to invalidate"),
)
DETH = _header(
    "deth", "Datagram Extended Transport Header (IBTA 9.3.2)",
    ("qkey", 32, "queue key"),
    ("resv8", 8, "reserved"),
    ("src_qp", 24, "source QP number"),
)
ATOMICETH = _header(
    "atomiceth", "Atomic Extended Transport Header (IBTA 9.3.4)",
    ("va", 64, "virtual address"),
    ("rkey", 32, "remote key"),
    ("swap_add", 64, "swap (compare-and-swap) or add (fetch-and-add) data"),
    ("compare", 64, "compare data"),
)
ATOMICACKETH = _header(
    "atomicacketh", "Atomic ACK Extended Transport Header (IBTA 9.5.3)",
    ("orig_data", 64, "original remote data"),
)
CNP = _header(
    "cnp", "RoCEv2 Congestion Notification Packet body (Annex A17.9.3): 16 reserved bytes",
    ("reserved", 128, "reserved, zero"),
)

HEADERS = (ETH, VLAN, IPV4, IPV6, UDP, BTH, RETH, AETH, IMMDT, IETH, DETH, ATOMICETH,
           ATOMICACKETH, CNP)
# Extension headers, in the order they may follow the BTH.
EXT_HEADERS = (RETH, AETH, IMMDT, IETH, DETH, ATOMICETH, ATOMICACKETH, CNP)


@dataclass(frozen=True)
class Opcode:
    code: int
    name: str
    ext: tuple          # extension headers after the BTH, in wire order
    payload: bool       # may carry payload bytes (and pad)


def _transport_ops(base, prefix, ops):
    return [Opcode(base + code, f"{prefix}_{name}", ext, payload) for code, name, ext, payload in ops]


_RC_UC_OPS = [
    (0x00, "SEND_FIRST", (), True),
    (0x01, "SEND_MIDDLE", (), True),
    (0x02, "SEND_LAST", (), True),
    (0x03, "SEND_LAST_WITH_IMMEDIATE", (IMMDT,), True),
    (0x04, "SEND_ONLY", (), True),
    (0x05, "SEND_ONLY_WITH_IMMEDIATE", (IMMDT,), True),
    (0x06, "RDMA_WRITE_FIRST", (RETH,), True),
    (0x07, "RDMA_WRITE_MIDDLE", (), True),
    (0x08, "RDMA_WRITE_LAST", (), True),
    (0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", (IMMDT,), True),
    (0x0A, "RDMA_WRITE_ONLY", (RETH,), True),
    (0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", (RETH, IMMDT), True),
]
_RC_ONLY_OPS = [
    (0x0C, "RDMA_READ_REQUEST", (RETH,), False),
    (0x0D, "RDMA_READ_RESPONSE_FIRST", (AETH,), True),
    (0x0E, "RDMA_READ_RESPONSE_MIDDLE", (), True),
    (0x0F, "RDMA_READ_RESPONSE_LAST", (AETH,), True),
    (0x10, "RDMA_READ_RESPONSE_ONLY", (AETH,), True),
    (0x11, "ACKNOWLEDGE", (AETH,), False),
    (0x12, "ATOMIC_ACKNOWLEDGE", (AETH, ATOMICACKETH), False),
    (0x13, "COMPARE_SWAP", (ATOMICETH,), False),
    (0x14, "FETCH_ADD", (ATOMICETH,), False),
    (0x16, "SEND_LAST_WITH_INVALIDATE", (IETH,), True),
    (0x17, "SEND_ONLY_WITH_INVALIDATE", (IETH,), True),
]
_UD_OPS = [
    (0x04, "SEND_ONLY", (DETH,), True),
    (0x05, "SEND_ONLY_WITH_IMMEDIATE", (DETH, IMMDT), True),
]

OPCODES = {op.code: op for op in (
    _transport_ops(0x00, "RC", _RC_UC_OPS + _RC_ONLY_OPS)
    + _transport_ops(0x20, "UC", _RC_UC_OPS)
    + _transport_ops(0x60, "UD", _UD_OPS)
    + [Opcode(0x81, "CNP", (CNP,), False)]
)}


def opcode_name(code):
    op = OPCODES.get(code)
    return op.name if op else f"UNKNOWN_{code:#04x}"


def ext_layout(code):
    """Byte offset of each extension header after the BTH, and their total length."""
    offsets, pos = {}, 0
    for h in OPCODES[code].ext:
        offsets[h.name] = pos
        pos += h.size
    return offsets, pos


# Longest header Stellar parses: Ethernet + VLAN + IPv4 with 40 bytes of options + UDP + BTH
# + the longest extension-header chain (AtomicETH, 28 bytes).
MAX_HEADER_BYTES = (ETH.size + VLAN.size + IPV4.size + MAX_IPV4_OPTIONS + UDP.size + BTH.size
                    + max(ext_layout(c)[1] for c in OPCODES))


def markdown():
    lines = ["# Header formats", "",
             "Generated from `stellar.hdl.net.headers` (the one source of truth). Offsets in "
             "network order: bit 0 is the MSB of the byte.", ""]
    for h in HEADERS:
        lines += [f"## {h.name} ({h.size} bytes)", "", h.doc, "",
                  "| field | byte | bit | width | meaning |", "|---|---|---|---|---|"]
        lines += [f"| {f.name} | {f.byte} | {f.bit} | {f.width} | {f.doc} |" for f in h.fields]
        lines.append("")
    lines += ["## Opcodes", "", "| opcode | name | extension headers | payload |", "|---|---|---|---|"]
    for op in OPCODES.values():
        lines.append(f"| {op.code:#04x} | {op.name} | {', '.join(h.name for h in op.ext) or '-'} "
                     f"| {'yes' if op.payload else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(markdown(), end="")
