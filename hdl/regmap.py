"""The one register map of Stellar, shared by the gateware, the host driver and the docs.

Pure Python: this module must never import amaranth, because the host driver imports it.
From it come the CSR gateware (``stellar.hdl.csr.AxiLiteCsrBank``), the driver's offsets
(``REGMAP["pktengine.rx_frames"].offset``), the JSON dump and the Markdown reference::

    python -m stellar.hdl.regmap --json        # [{name, offset, width, access, doc}, ...]
    python -m stellar.hdl.regmap --markdown    # one table per block

Structure
---------
The address space is cut into blocks of ``BLOCK_SIZE`` (256) bytes, 32-bit registers at
4-byte-aligned offsets. A register's full name is ``"<block>.<register>"``; JSON offsets are
absolute byte addresses.

Block 0 (``ident``, base 0x0000) never moves and is how the driver finds everything else:

==========  ===================  ========================================================
offset      register             value
==========  ===================  ========================================================
0x00        ``id``               ``MAGIC`` = 0x53544C52 ("STLR"): a Stellar device is there
0x04        ``version``          ``major << 16 | minor << 8 | patch`` of the gateware
0x08        ``scratch``          read/write, no effect: the driver's bus sanity check
0x0C        ``feature_count``    number N of feature words that follow
0x10 + 4*i  ``feature{i}``       one word per feature block, i < N, ascending base
==========  ===================  ========================================================

Feature word encoding (``encode_feature`` / ``decode_feature``)::

    31      24 23      16 15                     0
    +---------+----------+------------------------+
    | feature | version  |      base >> 8         |
    +---------+----------+------------------------+

``feature`` is one of the ``FEATURE_*`` ids below (which kind of block; one kind can be
instantiated several times at different bases), ``version`` is the layout revision of that
block (bumped on any incompatible change, so a driver can refuse a layout it does not know),
and ``base`` is the block's byte address (blocks are 256-byte aligned, so 16 bits reach
16 MiB). A driver reads ``id``, checks ``version``, then walks ``feature0 ..
feature{N-1}``; it never needs hard-coded block addresses.

Access kinds
------------
``ro``       driven by gateware (an input port of the CSR bank), or a constant of the map when
             ``const`` is set (the bank drives it itself, no port); writes get SLVERR.
``rw``       host-written control, read back as written (an output port of the bank, reset to
             ``init``); byte strobes honoured.
``wo``       host-written data, like ``rw`` (an output port of the bank holding the last write,
             byte strobes honoured) but reads return 0: for operand windows the gateware reads
             and the host never needs back (the table commands' ``wdata*``), which then take no
             place in the bank's read multiplexer.
``counter``  32-bit read-only event counter incremented by gateware (the bank's input port
             ``<name>_inc`` adds 1 in every clock it is high), wrapping at 2**32; writes get
             SLVERR.
``clear``    write-only strobe: writing 1 to bit 0 zeroes every counter of the same block; reads
             return 0.
``command``  write-only: a write hands its value to the gateware (output port ``<name>``) together
             with a one-clock pulse on ``<name>_stb``, every time, even if the value repeats; reads
             return 0. Indirect table windows use it: the driver fills the data registers, then
             writes the command, then polls the block's ``status`` for ``busy`` to clear.

Adding a block
--------------
Write a factory like ``pktengine_block`` (registers with explicit, stable offsets), give its kind
a new ``FEATURE_*`` id and append it to ``BLOCKS``. The ``ident`` block, the feature list, the
gateware and the docs follow automatically.
"""

import argparse
import json
import keyword
import sys
from dataclasses import dataclass

from .cc.params import RP_DEFAULTS
from .flow.fields import MR_ENTRY, QP_CONTEXT, TENANT_BITS

__all__ = [
    "ACCESS", "MAGIC", "VERSION", "BLOCK_SIZE", "FEATURE_LIST_OFFSET", "MAX_FEATURES",
    "FEATURE_PKTENGINE", "FEATURE_FLOW", "FEATURE_QPCTX", "FEATURE_MR", "FEATURE_NAMES",
    "Register", "Block", "MappedRegister", "RegisterMap",
    "encode_version", "decode_version", "encode_feature", "decode_feature",
    "pktengine_block", "pktengine_config", "flow_block", "flow_config", "qpctx_block",
    "qpctx_config", "mr_block", "mr_config", "transport_block", "transport_config", "GIDS",
    "FEATURE_TRANSPORT", "FEATURE_CC", "cc_block", "cc_config", "CC_CLASSES",
    "FEATURE_MAC", "FEATURE_WQ", "mac_block", "wq_block", "wq_config", "MAC_COUNTERS",
    "WQ_WR_WORDS", "WQ_RR_WORDS", "WQ_CQ_WORDS",
    "FEATURE_HOSTQ", "hostq_block", "hostq_config", "HOSTQ_WORDS", "HostqCommand",
    "BLOCKS", "REGMAP",
]

ACCESS = ("ro", "rw", "wo", "counter", "clear", "command")

MAGIC = 0x53544C52  # "STLR" in ASCII, most significant byte first
VERSION = (0, 1, 0)  # gateware version reported by ident.version

# Blocks are 256-byte aligned: 64 registers each, and a feature word can carry base >> 8.
BLOCK_SIZE = 0x100
FEATURE_LIST_OFFSET = 0x10
MAX_FEATURES = (BLOCK_SIZE - FEATURE_LIST_OFFSET) // 4

# Feature ids (bits 31:24 of a feature word). 0 is reserved so that a zero word never
# looks like a valid feature. Never renumber: drivers in the field match on these.
FEATURE_PKTENGINE = 1
FEATURE_FLOW = 2
FEATURE_QPCTX = 3
FEATURE_MR = 4
FEATURE_TRANSPORT = 5
FEATURE_CC = 6
FEATURE_MAC = 7
FEATURE_WQ = 8
FEATURE_HOSTQ = 9

FEATURE_NAMES = {
    FEATURE_PKTENGINE: "pktengine",
    FEATURE_FLOW: "flow",
    FEATURE_QPCTX: "qpctx",
    FEATURE_MR: "mr",
    FEATURE_TRANSPORT: "transport",
    FEATURE_CC: "cc",
    FEATURE_MAC: "mac",
    FEATURE_WQ: "wq",
    FEATURE_HOSTQ: "hostq",
}


def encode_version(major, minor, patch):
    for part in (major, minor, patch):
        if not 0 <= part <= 0xFF:
            raise ValueError(f"version part {part} does not fit in 8 bits")
    return (major << 16) | (minor << 8) | patch


def decode_version(word):
    """``ident.version`` word -> ``(major, minor, patch)``."""
    return (word >> 16) & 0xFF, (word >> 8) & 0xFF, word & 0xFF


def encode_feature(feature, version, base):
    """Feature word for a block of kind ``feature``, layout ``version``, at byte address ``base``."""
    if not 1 <= feature <= 0xFF:
        raise ValueError(f"feature id {feature} must be in 1..255 (0 is reserved)")
    if not 0 <= version <= 0xFF:
        raise ValueError(f"block version {version} does not fit in 8 bits")
    if base % BLOCK_SIZE or not 0 <= base >> 8 <= 0xFFFF:
        raise ValueError(f"block base {base:#x} must be {BLOCK_SIZE:#x}-aligned and below 16 MiB")
    return (feature << 24) | (version << 16) | (base >> 8)


def decode_feature(word):
    """Feature word -> ``(feature id, block version, base byte address)``."""
    return (word >> 24) & 0xFF, (word >> 16) & 0xFF, (word & 0xFFFF) << 8


def _check_identifier(kind, name):
    # Names become Amaranth port names and Python attributes: keep them plain identifiers.
    if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)
            and name == name.lower() and not name.startswith("_") and "__" not in name):
        raise ValueError(f"{kind} name {name!r} must be a lower-case Python identifier "
                         f"without leading or double underscores")


@dataclass(frozen=True)
class Register:
    """One 32-bit register slot of a block.

    ``offset`` is the byte offset inside the block (4-byte aligned); ``width`` the number of
    implemented bits (the rest read as 0); ``init`` the reset value of an ``rw`` register or the
    value of a ``const`` ``ro`` register.
    """
    name: str
    offset: int
    width: int
    access: str
    doc: str
    init: int = 0
    const: bool = False

    def __post_init__(self):
        _check_identifier("register", self.name)
        if self.access not in ACCESS:
            raise ValueError(f"{self.name}: access {self.access!r} not one of {ACCESS}")
        if self.offset < 0 or self.offset % 4:
            raise ValueError(f"{self.name}: offset {self.offset:#x} is not 4-byte aligned")
        if not 1 <= self.width <= 32:
            raise ValueError(f"{self.name}: width {self.width} not in 1..32")
        if not 0 <= self.init < (1 << self.width):
            raise ValueError(f"{self.name}: init {self.init:#x} does not fit in {self.width} bits")
        if not self.doc.strip():
            raise ValueError(f"{self.name}: every register needs a doc string")
        if self.access == "counter" and (self.width != 32 or self.init):
            raise ValueError(f"{self.name}: counters are 32 bits wide and start at 0")
        if self.access == "clear" and (self.width != 1 or self.init):
            raise ValueError(f"{self.name}: a clear strobe is 1 bit wide with init 0")
        if self.access == "command" and self.init:
            raise ValueError(f"{self.name}: a command register has no init value")
        if self.const and self.access != "ro":
            raise ValueError(f"{self.name}: only ro registers can be constants")


@dataclass(frozen=True)
class Block:
    """A group of registers at ``base`` (``BLOCK_SIZE``-aligned, ``size`` bytes).

    ``version`` is the layout revision reported in the block's feature word; ``feature`` its
    ``FEATURE_*`` kind (``None`` only for the ``ident`` block, which is not in the feature list).
    ``registers`` may be given in any order; they are kept sorted by offset.
    """
    name: str
    base: int
    version: int
    doc: str
    registers: tuple
    feature: int = None
    size: int = BLOCK_SIZE

    def __post_init__(self):
        _check_identifier("block", self.name)
        if self.name == "s_axil":
            raise ValueError("block name 's_axil' is taken by the CSR bank's bus port")
        object.__setattr__(self, "registers", tuple(sorted(self.registers, key=lambda r: r.offset)))
        if self.base % BLOCK_SIZE or self.size <= 0 or self.size % BLOCK_SIZE:
            raise ValueError(f"{self.name}: base {self.base:#x} and size {self.size:#x} must be "
                             f"multiples of {BLOCK_SIZE:#x}")
        if not 0 <= self.version <= 0xFF:
            raise ValueError(f"{self.name}: version {self.version} does not fit in 8 bits")
        if self.feature is not None:
            # Fails early with the same checks the feature word will apply.
            encode_feature(self.feature, self.version, self.base)
        names, offsets = set(), set()
        for r in self.registers:
            if not isinstance(r, Register):
                raise TypeError(f"{self.name}: {r!r} is not a Register")
            if r.name in names:
                raise ValueError(f"{self.name}: duplicate register name {r.name!r}")
            if r.offset in offsets:
                raise ValueError(f"{self.name}.{r.name}: offset {r.offset:#x} already used")
            if r.offset >= self.size:
                raise ValueError(f"{self.name}.{r.name}: offset {r.offset:#x} outside the block")
            names.add(r.name)
            offsets.add(r.offset)
        # A counter's gateware port is "<name>_inc", a command's "<name>_stb": they must not shadow
        # another register's port.
        for r in self.registers:
            suffix = {"counter": "_inc", "command": "_stb"}.get(r.access)
            if suffix and f"{r.name}{suffix}" in names:
                raise ValueError(f"{self.name}.{r.name}{suffix} clashes with {r.access} {r.name}'s port")

    def register(self, name):
        for r in self.registers:
            if r.name == name:
                return r
        raise KeyError(f"block {self.name} has no register {name!r}")

    @property
    def counters(self):
        return tuple(r for r in self.registers if r.access == "counter")


@dataclass(frozen=True)
class MappedRegister:
    """A register placed in the map: full name ``block.register`` and absolute byte ``offset``."""
    name: str
    offset: int
    width: int
    access: str
    doc: str
    init: int
    const: bool
    block: str
    register: str

    def as_dict(self):
        """The JSON record: exactly ``{name, offset, width, access, doc}``."""
        return {k: getattr(self, k) for k in ("name", "offset", "width", "access", "doc")}


class RegisterMap:
    """The whole map: the ``ident`` block at 0 followed by the given feature blocks.

    ``blocks`` are the feature blocks (each with a ``feature`` id), in any order; the ``ident``
    block and its feature list are generated from them. Lookup by full name
    (``regmap["pktengine.rx_frames"]``), by address (``regmap.at(0x140)``), iteration in address
    order, ``to_json()`` and ``markdown()``.
    """

    def __init__(self, blocks, *, version=VERSION):
        blocks = sorted(blocks, key=lambda b: b.base)
        if len(blocks) > MAX_FEATURES:
            raise ValueError(f"{len(blocks)} feature blocks, the ident block lists at most {MAX_FEATURES}")
        for b in blocks:
            if b.feature is None:
                raise ValueError(f"block {b.name} has no feature id: the driver could not find it")
        self.version = tuple(version)
        self.blocks = (self._ident_block(blocks, self.version), *blocks)

        names = set()
        for prev, b in zip(self.blocks, self.blocks[1:], strict=False):
            if b.base < prev.base + prev.size:
                raise ValueError(f"block {b.name} at {b.base:#x} overlaps {prev.name}")
        for b in self.blocks:
            if b.name in names:
                raise ValueError(f"duplicate block name {b.name!r}")
            names.add(b.name)

        self._by_name = {}
        self._by_offset = {}
        for b in self.blocks:
            for r in b.registers:
                m = MappedRegister(name=f"{b.name}.{r.name}", offset=b.base + r.offset, width=r.width,
                                   access=r.access, doc=r.doc, init=r.init, const=r.const,
                                   block=b.name, register=r.name)
                self._by_name[m.name] = m
                self._by_offset[m.offset] = m

    @staticmethod
    def _ident_block(features, version):
        regs = [
            Register("id", 0x00, 32, "ro", 'Magic number 0x53544C52 ("STLR"): a Stellar device '
                     "answers here. Anything else means wrong BAR, wrong device or a dead bus.",
                     init=MAGIC, const=True),
            Register("version", 0x04, 32, "ro", "Gateware version: major << 16 | minor << 8 | patch.",
                     init=encode_version(*version), const=True),
            Register("scratch", 0x08, 32, "rw", "Scratch register with no effect: the driver writes "
                     "and reads back a pattern to check the register path."),
            Register("feature_count", 0x0C, 32, "ro", "Number of feature words feature0.. that follow.",
                     init=len(features), const=True),
        ]
        for i, b in enumerate(features):
            kind = FEATURE_NAMES.get(b.feature, f"feature id {b.feature}")
            regs.append(Register(
                f"feature{i}", FEATURE_LIST_OFFSET + 4 * i, 32, "ro",
                f"Feature word: id << 24 | version << 16 | base >> 8. Here: {kind} "
                f"(id {b.feature}), version {b.version}, block '{b.name}' at {b.base:#06x}.",
                init=encode_feature(b.feature, b.version, b.base), const=True))
        return Block("ident", 0x0000, 1, "Identification and feature discovery. Fixed at address 0; "
                     "the driver finds every other block through the feature list.", regs)

    def __getitem__(self, name):
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no register {name!r} in the register map") from None

    def __contains__(self, name):
        return name in self._by_name

    def __iter__(self):
        return iter(sorted(self._by_name.values(), key=lambda m: m.offset))

    def __len__(self):
        return len(self._by_name)

    def at(self, offset):
        """The register at absolute byte address ``offset``, or ``None`` (unmapped)."""
        return self._by_offset.get(offset)

    def block(self, name):
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(f"no block {name!r} in the register map")

    @property
    def span(self):
        """Bytes of address space the map needs (end of the highest block)."""
        last = self.blocks[-1]
        return last.base + last.size

    def to_json(self, indent=2):
        """JSON text: a list of ``{name, offset, width, access, doc}``, absolute offsets."""
        return json.dumps([m.as_dict() for m in self], indent=indent)

    def markdown(self):
        major, minor, patch = self.version
        lines = ["# Register map", "",
                 f"Generated from `stellar.hdl.regmap` (the one source of truth), gateware version "
                 f"{major}.{minor}.{patch}. Offsets are absolute byte addresses; every register is a "
                 "32-bit word, unimplemented bits read as 0.", ""]
        for b in self.blocks:
            what = "not in the feature list" if b.feature is None else \
                f"feature id {b.feature}, version {b.version}"
            lines += [f"## {b.name} — base {b.base:#06x} ({what})", "", b.doc, "",
                      "| offset | name | access | width | init | description |",
                      "|---|---|---|---|---|---|"]
            for r in b.registers:
                access = "ro (const)" if r.const else r.access
                doc = r.doc.replace("|", "\\|")
                lines.append(f"| {b.base + r.offset:#06x} | {b.name}.{r.name} | {access} | {r.width} "
                             f"| {r.init:#x} | {doc} |")
            lines.append("")
        return "\n".join(lines)


# --- packet engine ----------------------------------------------------------------------------

def pktengine_config(data_width):
    """Value the top drives on ``pktengine.config`` for a datapath ``data_width`` bits wide."""
    if data_width % 8 or not 0 < data_width // 8 <= 0xFFFF:
        raise ValueError(f"data width {data_width} is not a whole number of bytes below 64 KiB")
    return data_width // 8


def pktengine_block(name="pktengine", base=0x0100):
    """Header parser/deparser, ICRC and IPv4 checksum: configuration and per-frame counters."""
    def counter(reg, offset, doc):
        return Register(reg, offset, 32, "counter", doc)

    return Block(name, base, 1, "Packet engine: Ethernet/VLAN/IPv4/IPv6/UDP/BTH parsing and "
                 "deparsing, ICRC check and generation, IPv4 header checksum. Counters wrap at 2**32 "
                 "and are zeroed together through counters_clear.", [
        Register("config", 0x00, 32, "ro", "Build configuration: bits 15:0 = datapath width in bytes "
                 "per beat (8 or 64); bits 31:16 reserved, read 0."),
        Register("counters_clear", 0x04, 1, "clear", "Write 1 to bit 0 to zero every counter of this "
                 "block at once (an event in the same clock is counted, not lost). Reads 0."),
        # RX counters from 0x40, TX counters from 0x80: room to grow each group in place.
        counter("rx_frames", 0x40, "Frames received from the wire (every complete frame, good or bad)."),
        counter("rx_roce", 0x44, "Received frames recognised as RoCEv2 (IPv4 or IPv6, UDP destination "
                "port 4791), whether later dropped or not."),
        counter("rx_non_roce", 0x48, "Received frames that are not RoCEv2 (other EtherType, IP protocol "
                "or UDP port); not an error, they do not reach the transport."),
        counter("rx_ecn_ce", 0x4C, "Accepted (not dropped) RoCEv2 frames marked ECN Congestion "
                "Experienced (IP ECN = 0b11): the notification point's input for CNP generation."),
        counter("rx_drop_icrc", 0x50, "RoCEv2 frames dropped because the invariant CRC did not match."),
        counter("rx_drop_ip_checksum", 0x54, "IPv4 frames dropped because the IPv4 header checksum was "
                "wrong."),
        counter("rx_drop_malformed", 0x58, "Frames dropped as malformed: truncated before the end of "
                "their headers, or with inconsistent version, IHL or length fields."),
        counter("rx_drop_opcode", 0x5C, "RoCEv2 frames dropped because the BTH opcode is reserved or "
                "not supported."),
        counter("rx_drop_overflow", 0x60, "Frames dropped because they did not fit the receive "
                "buffer (longer than its capacity: 16 KiB)."),
        counter("tx_frames", 0x80, "Frames transmitted to the wire (every complete frame)."),
    ], feature=FEATURE_PKTENGINE)


def _counter(reg, offset, doc):
    return Register(reg, offset, 32, "counter", doc)


def _clear(offset=0x04):
    return Register("counters_clear", offset, 1, "clear", "Write 1 to bit 0 to zero every counter of "
                    "this block at once (an event in the same clock is counted, not lost). Reads 0.")


def _data_window(prefix, offset, words, access, what):
    return [Register(f"{prefix}{i}", offset + 4 * i, 32, access,
                     f"{what}: bits {32 * i + 31}:{32 * i}.") for i in range(words)]


def _log2(n):
    if n < 1 or n & (n - 1):
        raise ValueError(f"{n} is not a power of two")
    return n.bit_length() - 1


# --- flow table -------------------------------------------------------------------------------

def flow_config(capacity, ways, stash, latency):
    """Value the gateware drives on ``flow.config``."""
    return _log2(capacity) | (ways << 8) | (stash << 12) | (TENANT_BITS << 20) | (latency << 28)


def flow_block(name="flow", base=0x0200):
    """Tenant-scoped QP lookup: the VLAN->tenant table and the (tenant, QPN) -> QP index table."""
    return Block(name, base, 1, "Flow table: the VLAN->tenant map and the exact-match cuckoo table "
                 "(tenant, local QPN) -> QP index looked up for every received RoCEv2 packet. "
                 "Management: write key_tenant, key_qpn (and value for an insert), then command; poll "
                 "status until busy is 0; read the outcome from status, result_value, result_cycles.", [
        Register("config", 0x00, 32, "ro", "Build configuration: bits 4:0 log2(capacity in QPs), "
                 "11:8 hash ways, 19:12 stash entries, 27:20 tenant bits, 31:28 lookup latency in "
                 "cycles."),
        _clear(),
        Register("key_tenant", 0x08, TENANT_BITS, "rw", "Command key: tenant."),
        Register("key_qpn", 0x0C, 24, "rw", "Command key: local QP number."),
        Register("value", 0x10, 16, "rw", "Insert value: QP index (into the QP context store)."),
        Register("command", 0x14, 2, "command", "Write 1 insert, 2 delete, 3 lookup (stellar.hdl.flow."
                 "fields.FlowOp) to run a command on the key; ignored (status.error) while busy."),
        Register("status", 0x18, 5, "ro", "Bit 0 busy; bits 2:1 outcome of the last command "
                 "(FlowStatus: 0 ok, 1 exists, 2 full, 3 not found); bit 3 error: a command was "
                 "written while busy and ignored (cleared by the next accepted command); bit 4 done: "
                 "the last accepted command has completed."),
        Register("result_value", 0x1C, 16, "ro", "QP index found by the last lookup, or the index "
                 "already stored when an insert answered exists."),
        Register("result_cycles", 0x20, 16, "ro", "Clocks the last command took (saturates)."),
        Register("occupancy", 0x24, 32, "ro", "Keys stored (table and stash)."),
        Register("stash_used", 0x28, 8, "ro", "Keys held in the overflow stash."),
        Register("vlan_vid", 0x30, 12, "rw", "VLAN map command: VLAN ID (1..4094; VID 0 and untagged "
                 "frames always belong to tenant 0)."),
        Register("vlan_tenant", 0x34, 9, "rw", "VLAN map write data: bits 7:0 tenant, bit 8 mapped "
                 "(0: frames with this VID are dropped and counted in rx_drop_tenant)."),
        Register("vlan_command", 0x38, 2, "command", "Write 1 to store vlan_tenant for vlan_vid, 2 to "
                 "read it into vlan_result (done within 2 clocks: no busy flag)."),
        Register("vlan_result", 0x3C, 9, "ro", "VLAN map read result (layout of vlan_tenant)."),
        _counter("rx_lookups", 0x40, "RoCEv2 packets looked up (frames that passed the packet engine)."),
        _counter("rx_drop_tenant", 0x44, "RoCEv2 packets dropped because their VLAN ID is not mapped "
                 "to a tenant."),
        _counter("rx_drop_unknown_qp", 0x48, "RoCEv2 packets dropped because (tenant, destination QP) "
                 "is not in the flow table."),
    ], feature=FEATURE_FLOW)


# --- QP context store -------------------------------------------------------------------------

def qpctx_config(depth):
    """Value the gateware drives on ``qpctx.config``."""
    return _log2(depth) | (QP_CONTEXT.words << 8) | (len(QP_CONTEXT.fields) << 16)


def qpctx_block(name="qpctx", base=0x0300):
    """Indirect access to the per-QP context words (format stellar.hdl.flow.fields.QP_CONTEXT)."""
    return Block(name, base, 1, "QP context store: per-QP state in block RAM (format "
                 "stellar.hdl.flow.fields.QP_CONTEXT). Host access is serialized with packet "
                 "traffic: a masked write never loses an update the transport made. Read: write "
                 "index, command = 1, poll status.busy, read rdata*. Write: fill wdata*, write index "
                 "and mask (bit i = field i of QP_CONTEXT), command = 2. wdata* is read while the "
                 "command runs (not copied when it is written): change it only while status.busy "
                 "is 0.", [
        Register("config", 0x00, 32, "ro", "Build configuration: bits 4:0 log2(QPs), 15:8 context "
                 "words, 23:16 context fields (mask bits)."),
        Register("index", 0x04, 16, "rw", "QP index of the next command."),
        Register("mask", 0x08, len(QP_CONTEXT.fields), "rw", "Write mask: bit i selects field i of "
                 "QP_CONTEXT (reset: all fields).", init=(1 << len(QP_CONTEXT.fields)) - 1),
        Register("command", 0x0C, 2, "command", "Write 1 to read the context of index into rdata*, "
                 "2 to merge the masked fields of wdata* into it; ignored (status.error) while busy."),
        Register("status", 0x10, 2, "ro", "Bit 0 busy; bit 1 error: a command was written while busy "
                 "and ignored (cleared by the next accepted command)."),
        *_data_window("wdata", 0x40, QP_CONTEXT.words, "wo", "Context write data"),
        *_data_window("rdata", 0x80, QP_CONTEXT.words, "ro", "Context read data (last read or the "
                      "context as written)"),
    ], feature=FEATURE_QPCTX)


# --- memory regions ---------------------------------------------------------------------------

def mr_config(entries, pages):
    """Value the gateware drives on ``mr.config``."""
    return _log2(entries) | (_log2(pages) << 8) | (MR_ENTRY.words << 16)


def mr_block(name="mr", base=0x0400):
    """Memory-region protection table: entries, page table, and the RX check counters."""
    return Block(name, base, 1, "Memory-region protection: MR entries (format stellar.hdl.flow."
                 "fields.MR_ENTRY; rkey/lkey = index << 8 | tag) and the page table of page-list "
                 "regions. Every RETH/AtomicETH access of a received packet is checked before any "
                 "DMA. Write an entry: fill wdata*, write index, command = 1; read: command = 0 and "
                 "read rdata*; page table: command 3 writes wdata1:wdata0 as page index's bus "
                 "address, 2 reads it. Poll status.busy between commands; wdata* is read while the "
                 "command runs: change it only while status.busy is 0.", [
        Register("config", 0x00, 32, "ro", "Build configuration: bits 7:0 log2(MR entries), 15:8 "
                 "log2(page-table entries), 23:16 entry words."),
        _clear(),
        Register("index", 0x08, 16, "rw", "MR index (key >> 8) or page-table index of the next "
                 "command."),
        Register("command", 0x0C, 2, "command", "0 read entry, 1 write entry, 2 read page, 3 write "
                 "page (stellar.hdl.flow.mr.MrOp); ignored (status.error) while busy."),
        Register("status", 0x10, 2, "ro", "Bit 0 busy; bit 1 error: a command was written while busy "
                 "and ignored (cleared by the next accepted command)."),
        *_data_window("wdata", 0x20, MR_ENTRY.words, "wo", "Entry (or page) write data"),
        _counter("rx_mr_checks", 0x40, "Received RDMA WRITE/READ/atomic requests checked against the "
                 "MR table."),
        _counter("rx_drop_rkey", 0x44, "Requests dropped: R_Key invalid, stale (tag mismatch), or of "
                 "another tenant or protection domain."),
        _counter("rx_drop_bounds", 0x48, "Requests dropped: [va, va+length) not inside the region."),
        _counter("rx_drop_access", 0x4C, "Requests dropped: the region does not grant the access "
                 "(remote write, read or atomic)."),
        _counter("rx_invalidations", 0x50, "MRs invalidated by a received SEND with Invalidate "
                 "(its rkey's tag, tenant and PD matched the entry)."),
        *_data_window("rdata", 0x80, MR_ENTRY.words, "ro", "Entry (or page) read data"),
    ], feature=FEATURE_MR)


# --- RC transport -----------------------------------------------------------------------------

GIDS = 4   # local addresses (GID table entries) a QP's sgid_index can select


def transport_config(qps, sq_depth, rq_depth, data_width):
    """Value the gateware drives on ``transport.config``."""
    return (_log2(qps) | (_log2(sq_depth) << 8) | (_log2(rq_depth) << 16)
            | (_log2(data_width // 64) << 24) | (_log2(GIDS) << 28))


def _gid_registers(base):
    regs = []
    for i in range(GIDS):
        off = base + 0x20 * i
        regs += [
            Register(f"gid{i}_mac_lo", off, 32, "rw", f"GID {i}: source MAC bits 31:0."),
            Register(f"gid{i}_mac_hi", off + 4, 16, "rw", f"GID {i}: source MAC bits 47:32."),
            Register(f"gid{i}_flags", off + 8, 1, "rw", f"GID {i}: bit 0 = IPv6 address (else IPv4 "
                     "in ip0)."),
            *[Register(f"gid{i}_ip{j}", off + 0x10 + 4 * j, 32, "rw",
                       f"GID {i}: source IP bits {32 * j + 31}:{32 * j} (IPv4 in ip0).")
              for j in range(4)],
        ]
    return regs


def transport_block(name="transport", base=0x0500):
    """RC transport: requester/responder parameters, the local GID table, and its counters."""
    return Block(name, base, 1, "RC transport (stellar.hdl.transport.engine): responder PSN "
                 "checks, ACK coalescing, NAKs, READ responses; requester segmentation, window, "
                 "go-back-N retransmission and ACK timers. Per-QP parameters live in the QP "
                 "context; a host write of the context that includes sq_psn re-initializes the "
                 "QP's requester state (send queue emptied, PSNs from sq_psn), one that includes "
                 "epsn re-initializes its responder state.", [
        Register("config", 0x00, 32, "ro", "Build configuration: bits 7:0 log2(QPs), 15:8 "
                 "log2(send-queue depth per QP), 23:16 log2(receive-queue depth per QP), 27:24 "
                 "log2(data width / 64), 31:28 log2(GID entries)."),
        _clear(),
        Register("ack_coalesce", 0x08, 8, "rw", "Responder: send an ACK at least every this many "
                 "accepted SEND/WRITE packets even without AckReq (0: only on AckReq).", init=16),
        Register("ackreq_shift", 0x0C, 4, "rw", "Requester: set AckReq on packets whose PSN is "
                 "2**n - 1 modulo 2**n (besides the last packet of each message and the one that "
                 "fills the window).", init=3),
        Register("window", 0x10, 16, "rw", "Requester: at most this many PSNs outstanding per "
                 "QP (unacknowledged).", init=64),
        Register("tick_cycles", 0x14, 24, "rw", "Clock cycles per timer tick; the tick is the "
                 "4.096 us unit of the local ACK timeout (4.096 us * 2**timeout) and RNR delays. "
                 "Reset: 1024 (4.096 us at 250 MHz).", init=1024),
        Register("now", 0x18, 32, "ro", "Timer ticks since reset."),
        *_gid_registers(0x80),
        _counter("rx_requests", 0x20, "Responder: request packets accepted in sequence."),
        _counter("rx_duplicates", 0x24, "Responder: duplicate requests (re-ACKed or READ "
                 "re-executed)."),
        _counter("rx_out_of_sequence", 0x28, "Responder: requests ahead of the expected PSN "
                 "(one PSN-sequence NAK per gap, the rest silently dropped)."),
        _counter("tx_naks", 0x2C, "Responder: NAKs sent (sequence, RNR, invalid request, remote "
                 "access)."),
        _counter("tx_acks", 0x30, "ACKs sent."),
        _counter("rx_drop_state", 0x34, "Packets dropped: QP not in a state that accepts them, "
                 "or an opcode the RC transport does not execute."),
        _counter("tx_packets", 0x38, "Requester: request packets sent (new and retransmitted)."),
        _counter("retransmits", 0x3C, "Requester: go-back-N rewinds (NAK, timeout, RNR retry)."),
        _counter("timeouts", 0x40, "Requester: local ACK timer expiries acted upon."),
        _counter("rx_acks", 0x44, "Requester: ACK/NAK/READ responses accepted."),
        _counter("rx_stale", 0x48, "Requester: responses ignored (duplicate, stale or out of "
                 "sequence)."),
        _counter("completions", 0x4C, "Completions written (send and receive, any status)."),
        _counter("qp_errors", 0x50, "QPs moved to ERROR by the transport."),
        _counter("tx_read_responses", 0x54, "Responder: RDMA READ response packets sent."),
    ], feature=FEATURE_TRANSPORT)


CC_CLASSES = 8      # traffic classes (the QP's sl selects one)


def cc_config(qps, tenants, classes=CC_CLASSES):
    return _log2(qps) | (_log2(tenants) << 8) | (classes << 16)


def cc_block(name="cc", base=0x0600):
    """Congestion control and QoS (stellar.hdl.cc): notification point, reaction point, scheduler."""
    def rw(reg, offset, width, init, doc):
        return Register(reg, offset, width, "rw", doc, init=init)

    def rp(reg, offset, width, doc):       # a reaction-point parameter: reset value from hdl.cc.params
        return rw(reg, offset, width, RP_DEFAULTS[reg], doc)
    return Block(name, base, 1, "Congestion control and QoS (stellar.hdl.cc). Notification point: a "
                 "received RoCE packet marked ECN CE makes the NIC send a CNP to the sending QP, at "
                 "most one per QP per cnp_interval_us. Reaction point: per-QP DCQCN (or the "
                 "experimental FlowMatrix update) sets the QP's pacing rate; the TX scheduler serves "
                 "traffic classes by strict priority (class = the QP's sl, 7 highest), QPs inside a "
                 "class by weighted round robin, and holds each QP to its pacer and each tenant to "
                 "its token buckets. Rates are in Mb/s (bits per microsecond); the rate parameters "
                 "follow ConnectX firmware names (RPG_*).", [
        Register("config", 0x00, 32, "ro", "Build configuration: bits 7:0 log2(QPs), 15:8 "
                 "log2(tenants), 23:16 traffic classes."),
        _clear(),
        rw("us_cycles", 0x08, 16, 250, "Clock cycles per microsecond (the time base of every "
           "timer and rate below; 250 at 250 MHz)."),
        rw("cnp_interval_us", 0x0C, 16, 50, "Notification point: at most one CNP per QP per this "
           "many microseconds (ConnectX min_time_between_cnps)."),
        rw("cnp_marking", 0x10, 11, 48 | (6 << 8), "CNP marking: bits 5:0 DSCP (48), 10:8 802.1p "
           "priority (6), as ConnectX cnp_dscp / cnp_802p_prio. CNPs are sent Not-ECT."),
        rw("max_rate", 0x14, 20, 0, "Reaction point: line rate in Mb/s, the highest rate and the "
           "rate a QP starts at. 0: the datapath's rate, data width x us_cycles."),
        rp("min_rate", 0x18, 20, "RPG_MIN_RATE: lowest rate in Mb/s."),
        rp("ai_rate", 0x1C, 20, "RPG_AI_RATE: additive increase of the target rate, Mb/s."),
        rp("hai_rate", 0x20, 20, "RPG_HAI_RATE: hyper increase step, Mb/s."),
        rp("gd", 0x24, 4, "RPG_GD: on a CNP the rate drops by rate x alpha / 2**gd with alpha "
           "in 1/1024 units (11: rate x (1 - alpha/2), DCQCN)."),
        rp("min_dec_fac", 0x28, 7, "RPG_MIN_DEC_FAC: a CNP leaves at least this percentage of "
           "the rate."),
        rp("threshold", 0x2C, 4, "RPG_THRESHOLD (F): increase events of the timer and the byte "
           "counter before fast recovery gives way to additive (one of them past F) and hyper "
           "increase (both past F)."),
        rp("g_shift", 0x30, 4, "Alpha gain g = 2**-g_shift (DCE_TCP_G; 8: g = 1/256)."),
        rp("initial_alpha", 0x34, 10, "Alpha of a QP at setup, 1/1024 units (1023 ~ 1)."),
        rp("time_reset", 0x38, 16, "RPG_TIME_RESET: rate-increase timer period, us."),
        rp("byte_reset", 0x3C, 24, "RPG_BYTE_RESET: rate-increase byte counter, bytes."),
        rp("alpha_period", 0x40, 16, "Alpha update period, us (alpha decays by (1 - g) each "
           "period without a CNP; DCE_TCP_RTT)."),
        rp("fm_a", 0x44, 16, "FlowMatrix (experimental) a, Q0.16 (0.7)."),
        rp("fm_b", 0x48, 16, "FlowMatrix b, Q8.8 (0.3)."),
        rp("fm_c", 0x4C, 16, "FlowMatrix c, signed Q8.8 (0.5)."),
        rp("fm_period", 0x50, 16, "FlowMatrix weight update period, us."),
        rp("fm_cnp_gain", 0x54, 16, "FlowMatrix congestion signal per CNP in a period, Q8.8."),
        rp("fm_trend_gain", 0x58, 16, "FlowMatrix congestion signal per PSN of growth of the "
           "QP's in-flight packets over a period (the early warning), Q8.8."),
        rp("fm_norm", 0x5C, 32, "FlowMatrix rate normalisation, Q16.16: "
           "2**32 / (65536 - sigmoid(c)), so that no congestion signal means the line rate "
           "(stellar.hdl.cc.sigmoid.fm_norm; rewrite it with fm_c)."),
        rw("qp_burst", 0x60, 24, 16384, "Pacer bucket depth of every QP, bytes."),
        rw("pace_overhead", 0x64, 8, 82, "Bytes charged per packet on top of its payload (Ethernet, "
           "IPv4, UDP, BTH, ICRC, FCS, preamble and inter-frame gap: 82)."),
        *[rw(f"tc{i}", 0x70 + 4 * i, 10, 0, f"Traffic class {i}: bits 5:0 DSCP, 8:6 802.1p "
             "priority, bit 9 = use them on transmit instead of the QP's traffic_class/sl.")
          for i in range(CC_CLASSES)],
        rw("tenant_index", 0x90, TENANT_BITS, 0, "Tenant bucket window: tenant to configure."),
        rw("tenant_cap_rate", 0x94, 20, 0, "Tenant cap: rate in Mb/s the tenant's QPs together may "
           "not exceed (0 = no cap)."),
        rw("tenant_cap_burst", 0x98, 24, 16384, "Tenant cap bucket depth, bytes."),
        rw("tenant_guar_rate", 0x9C, 20, 0, "Tenant guarantee: rate in Mb/s served before other "
           "tenants of the same class (0 = none)."),
        rw("tenant_guar_burst", 0xA0, 24, 16384, "Tenant guarantee bucket depth, bytes."),
        Register("tenant_command", 0xA4, 1, "command", "Write 1: load the tenant_* values into the "
                 "bucket of tenant_index (buckets start full)."),
        rw("qp_index", 0xA8, 16, 0, "Reaction-point window: QP index whose state qp_* shows."),
        Register("qp_rate", 0xAC, 20, "ro", "Current rate Rc of QP qp_index, Mb/s."),
        Register("qp_target", 0xB0, 20, "ro", "Target rate Rt of QP qp_index, Mb/s."),
        Register("qp_alpha", 0xB4, 20, "ro", "Alpha of QP qp_index, 1.0 = 2**20 (FlowMatrix: the "
                 "weight W, Q0.16)."),
        Register("qp_flags", 0xB8, 32, "ro", "QP qp_index: bits 1:0 mode, 2 active (rate limited), "
                 "15:8 timer stage, 23:16 byte stage."),
        Register("cycle", 0xC0, 32, "ro", "Free-running clock-cycle counter."),
        Register("cnp_stamp", 0xC4, 32, "ro", "cycle of the last CNP the reaction point took."),
        Register("rate_stamp", 0xC8, 32, "ro", "cycle at which the rate that CNP set reached the "
                 "pacer (rate_stamp - cnp_stamp: CNP-to-rate latency)."),
        _counter("rx_ce", 0xD0, "RoCE packets received with ECN CE."),
        _counter("cnp_sent", 0xD4, "CNPs sent (notification point)."),
        _counter("cnp_suppressed", 0xD8, "CE packets that sent no CNP (interval not elapsed)."),
        _counter("cnp_received", 0xDC, "CNPs received for a local QP (reaction point)."),
        _counter("rate_updates", 0xE0, "Rates the reaction point sent to the pacers."),
        _counter("stall_pacer", 0xE4, "Scheduler: a QP skipped, its pacer out of tokens."),
        _counter("stall_tenant", 0xE8, "Scheduler: a QP skipped, its tenant over its cap."),
        _counter("sched_pops", 0xEC, "Scheduler: packets scheduled."),
    ], feature=FEATURE_CC)


# The MAC's event counters, in the order of stellar.hdl.mac.cdc.COUNTERS (kept here as plain
# names because this module must not import amaranth; tests check the two lists agree).
MAC_COUNTERS = (
    ("rx_frames", "Good frames received and queued for the core."),
    ("rx_fcs_errors", "Frames dropped: FCS mismatch."),
    ("rx_phy_errors", "Frames dropped: RX_ER during the frame, or no valid preamble/SFD."),
    ("rx_runts", "Frames dropped: shorter than 64 bytes with FCS."),
    ("rx_oversize", "Frames dropped: longer than the MAC's max_frame (1522 bytes with FCS)."),
    ("rx_overruns", "Good frames dropped whole: the receive FIFO was full (core back-pressure)."),
    ("tx_frames", "Frames sent on the wire."),
    ("tx_dropped", "Frames to send discarded: longer than the transmit packet FIFO."),
)


def mac_block(name="mac", base=0x0700):
    """The board's Ethernet MAC (stellar.hdl.mac): event counters, in the core clock domain."""
    return Block(name, base, 1, "Ethernet MAC of a board top (stellar.hdl.mac.MacCore, RGMII 1 GbE): "
                 "per-frame event counters, counted in the core clock domain.", [
        _clear(),
        *[_counter(reg, 0x10 + 4 * i, doc) for i, (reg, doc) in enumerate(MAC_COUNTERS)],
    ], feature=FEATURE_MAC)


WQ_WR_WORDS = 18    # a work request, stellar.hdl.transport.formats.WORK_REQUEST, in 576 bits
WQ_RR_WORDS = 6     # a receive request, RECV_REQUEST, in 192 bits
WQ_CQ_WORDS = 6     # a completion, COMPLETION, in 192 bits


def wq_config(wr_depth, rr_depth, cq_depth):
    """Value of ``wq.config``: the three queue depths, a byte each."""
    for d in (wr_depth, rr_depth, cq_depth):
        if not 1 <= d <= 0xFF:
            raise ValueError(f"queue depth {d} does not fit in a byte")
    return wr_depth | (rr_depth << 8) | (cq_depth << 16)


def wq_block(name="wq", base=0x0800):
    """Work-request / receive-request / completion queues through registers, for board tops whose
    host reaches the core only through the control bridge (no DMA-fetched rings)."""
    def command(reg, offset, doc):
        return Register(reg, offset, 1, "command", doc)

    def level(reg, offset, doc):
        return Register(reg, offset, 8, "ro", doc)

    return Block(name, base, 1, "Register queues of a board top (stellar.hdl.boards.wq): the driver "
                 "writes wr_data0..17 with a WORK_REQUEST (stellar.hdl.transport.formats, bit 0 in "
                 "wr_data0 bit 0) and writes wr_push; likewise rr_data0..5 and rr_push for a "
                 "RECV_REQUEST. Completions wait in a FIFO: cq_data0..5 show the oldest (zero when "
                 "cq_level is 0) and cq_pop removes it. A push into a full queue or a pop of an "
                 "empty one changes nothing and is counted.", [
        _clear(),
        command("wr_push", 0x08, "Write (any value) to queue the work request in wr_data0..17."),
        command("rr_push", 0x0C, "Write (any value) to queue the receive request in rr_data0..5."),
        command("cq_pop", 0x10, "Write (any value) to remove the completion shown in cq_data0..5."),
        level("wr_level", 0x14, "Work requests queued and not yet taken by the core."),
        level("rr_level", 0x18, "Receive requests queued and not yet taken by the core."),
        level("cq_level", 0x1C, "Completions waiting, the one in cq_data0..5 included."),
        Register("config", 0x20, 24, "ro", "Queue depths: wr 7:0, rr 15:8, cq 23:16 (wq_config)."),
        _counter("wr_pushed", 0x30, "Work requests queued."),
        _counter("rr_pushed", 0x34, "Receive requests queued."),
        _counter("cq_popped", 0x38, "Completions removed."),
        _counter("push_full", 0x3C, "wr_push or rr_push refused: the queue was full."),
        _counter("pop_empty", 0x40, "cq_pop with no completion waiting."),
        # Write-only (command) rather than rw: the words live in the board's bank, and a bare
        # NicCore, whose bank also has this block, keeps no flip-flops for them.
        *_data_window("wr_data", 0x50, WQ_WR_WORDS, "command", "Work request to push (write-only)"),
        *_data_window("rr_data", 0xA0, WQ_RR_WORDS, "command", "Receive request to push (write-only)"),
        *_data_window("cq_data", 0xC0, WQ_CQ_WORDS, "ro", "Oldest completion"),
    ], feature=FEATURE_WQ)


# --- host queues ------------------------------------------------------------------------------

HOSTQ_WORDS = 5     # wdata0..4 / rdata0..4 of the hostq table window


class HostqCommand:
    """Values of ``hostq.command`` (plain ints: this module does not import amaranth)."""
    WRITE_SQ = 1
    WRITE_RQ = 2
    WRITE_CQ = 3
    READ_SQ = 5
    READ_RQ = 6
    READ_CQ = 7


def hostq_config(qps, cqs, sq_depth, rq_depth):
    """Value the gateware drives on ``hostq.config``."""
    return _log2(qps) | (_log2(cqs) << 8) | (_log2(sq_depth) << 16) | (_log2(rq_depth) << 24)


def hostq_block(name="hostq", base=0x0900):
    """Host queues (stellar.hdl.hostif.queues): doorbells, ring tables, counters."""
    return Block(name, base, 1, "Host queues (stellar.hdl.hostif.queues): send, receive and "
                 "completion rings in host memory (formats: stellar.hdl.hostif.formats), "
                 "doorbells, MSI moderation. Ring tables through the window: fill wdata*, write "
                 "index (QP or CQ), then command (HostqCommand: 1/2/3 write the SQ/RQ/CQ "
                 "configuration, 5/6/7 read it and its indexes into rdata*); poll status.busy. "
                 "A configuration write resets the ring (indexes to its start index, CQ disarmed, "
                 "SQ/RQ credits full): do it while the ring is idle. Words: wdata1:wdata0 = ring bus address "
                 "(aligned to the ring's size in bytes, at least 64); wdata2 bits 3:0 = log2 "
                 "entries (at most 15), bit 8 = enabled, bits 31:16 = the CQ of an SQ/RQ or the "
                 "MSI vector of a CQ; wdata3: SQ/RQ bits 15:0 = start index (producer and fetch "
                 "index), CQ bits 15:0 = moderation count (an interrupt after this many CQEs, 0 as "
                 "1) and bits 31:16 = start index (producer and consumer); wdata4 bits 23:0 = CQ "
                 "moderation time in clocks (an "
                 "interrupt at most this long after the first CQE, 0: no time limit). rdata0..2 "
                 "read back as written; SQ/RQ: rdata3 = last doorbell index | fetch index << 16, "
                 "rdata4 = WQEs posted | credits returned << 16 (the difference is in the "
                 "transport); CQ: rdata3 = producer | consumer << 16, rdata4 = bit 0 armed, bit 1 "
                 "timer running, 31:16 CQEs since arming.", [
        Register("config", 0x00, 32, "ro", "Build configuration: bits 7:0 log2(QPs), 15:8 "
                 "log2(CQs), 23:16 log2(on-chip send-queue depth = SQ credits per QP), 31:24 "
                 "log2(receive-queue depth = RQ credits per QP)."),
        _clear(),
        Register("sq_doorbell", 0x08, 32, "command", "Send-queue doorbell (write-only, "
                 "stellar.hdl.hostif.formats.SQ_DOORBELL: bits 15:0 new producer index, 31:16 QP): "
                 "every WQE before the index is posted."),
        Register("rq_doorbell", 0x0C, 32, "command", "Receive-queue doorbell (write-only, "
                 "RQ_DOORBELL: bits 15:0 producer index, 31:16 QP)."),
        Register("cq_doorbell", 0x10, 32, "command", "Completion-queue doorbell (write-only, "
                 "CQ_DOORBELL: bits 15:0 new consumer index, 30:16 CQ, 31 arm: one interrupt for "
                 "the next completions, after moderation)."),
        Register("index", 0x14, 16, "rw", "QP or CQ index of the next table command."),
        Register("command", 0x18, 3, "command", "Table command (HostqCommand): 1 write SQ, 2 "
                 "write RQ, 3 write CQ, 5 read SQ, 6 read RQ, 7 read CQ; ignored (status.error) "
                 "while busy or out of range."),
        Register("status", 0x1C, 2, "ro", "Bit 0 busy; bit 1 error: the last command was "
                 "ignored (written while busy, unknown, or index out of range)."),
        *_data_window("wdata", 0x20, HOSTQ_WORDS, "wo", "Table write data"),
        _counter("sq_wqes", 0x40, "Send WQEs fetched from host memory."),
        _counter("rq_wqes", 0x44, "Receive WQEs fetched from host memory."),
        _counter("wqe_reads", 0x48, "DMA reads of WQEs (each fetches one or more)."),
        _counter("cqes", 0x4C, "CQEs written to host memory."),
        _counter("doorbells", 0x50, "Doorbell writes (SQ, RQ and CQ)."),
        _counter("doorbell_overflows", 0x54, "SQ/RQ doorbells whose wake-up did not fit the "
                 "doorbell FIFO: none is lost (the index is stored at once), every queue is "
                 "rescanned instead."),
        _counter("doorbell_invalid", 0x58, "SQ/RQ doorbells ignored: QP out of range, ring not "
                 "enabled, or an index more than the ring size ahead of the fetch index; CQ "
                 "doorbells for a CQ out of range."),
        _counter("cq_full", 0x5C, "Completions that found their CQ full (producer - consumer "
                 "== size) and waited for a CQ doorbell (each counted once)."),
        _counter("cqe_dropped", 0x60, "Completions dropped: the QP's CQ is out of range or not "
                 "enabled."),
        _counter("msis", 0x64, "MSI requests sent."),
        *_data_window("rdata", 0x80, HOSTQ_WORDS, "ro", "Table read data"),
    ], feature=FEATURE_HOSTQ)


# Every feature block of the design, in any order. New blocks are appended here.
# ``mac`` and ``wq`` are implemented by the board tops (stellar.hdl.boards.top); in a bare
# NicCore their registers exist but read 0 (no MAC, queues are the s_axis_wr/rr, m_axis_cq ports).
# ``hostq`` is implemented by stellar.hdl.hostif.queues.HostQueues (stellar.hdl.top.hostq).
BLOCKS = [
    pktengine_block(),
    flow_block(),
    qpctx_block(),
    mr_block(),
    transport_block(),
    cc_block(),
    mac_block(),
    wq_block(),
    hostq_block(),
]

REGMAP = RegisterMap(BLOCKS)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m stellar.hdl.regmap",
                                     description="Print Stellar's register map.")
    fmt = parser.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--json", action="store_true",
                     help="every register as {name, offset, width, access, doc}, absolute offsets")
    fmt.add_argument("--markdown", action="store_true", help="one Markdown table per block")
    args = parser.parse_args(argv)
    sys.stdout.write((REGMAP.to_json() if args.json else REGMAP.markdown()) + "\n")


if __name__ == "__main__":
    main()
