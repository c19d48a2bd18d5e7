# Ref: IBTA Vol 1 ch. 9-10 (RC QP state, PSNs, keys); rdma-core libibverbs/verbs.h (enum values)
"""Formats of the flow-table pipeline, declared once: the flow key, the QP context and the
memory-region (MR) entry.

Pure Python (no amaranth import): the gateware builds its ``data.StructLayout`` from these
tables (``stellar.hdl.flow.layouts``), the host driver and the tests pack and unpack with the
same tables, and the docs are generated from them. A table lists fields from the least
significant bit up, the order ``data.StructLayout`` uses, so ``pack`` gives exactly the integer
the gateware sees.

Enumerations keep the numeric values of rdma-core's ``verbs.h`` (``IBV_QPS_*``, ``IBV_MTU_*``,
``IBV_ACCESS_*``) so a verbs programmer reads them without a table.
"""

import enum
from dataclasses import dataclass

__all__ = [
    "TENANT_BITS", "QPN_BITS", "PD_BITS", "PSN_BITS", "KEY_TAG_BITS",
    "QpState", "PathMtu", "Access", "MrReason", "FlowStatus", "FlowOp", "CcMode",
    "Field", "FieldTable", "QP_CONTEXT", "MR_ENTRY", "FLOW_KEY",
    "mtu_bytes", "make_key", "split_key", "flow_key",
]

TENANT_BITS = 8    # 256 tenants; tenant 0 is the untagged one
QPN_BITS = 24      # BTH DestQP
PD_BITS = 16       # protection domains (per device, tenant-scoped by the tenant field)
PSN_BITS = 24
KEY_TAG_BITS = 8   # lkey/rkey = MR index << 8 | tag (as mlx5 does): a stale key misses


class QpState(enum.IntEnum):
    """``enum ibv_qp_state``."""
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERROR = 6


class PathMtu(enum.IntEnum):
    """``enum ibv_mtu``: path MTU code -> 128 << code bytes."""
    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5


def mtu_bytes(code):
    return 128 << int(PathMtu(code))


class Access(enum.IntFlag):
    """``enum ibv_access_flags`` (the four an MR entry stores)."""
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8


class MrReason(enum.IntEnum):
    """Answer of the MR check, in the order the checks decide (first failing wins)."""
    OK = 0
    BAD_KEY = 1      # index beyond the table, entry invalid, or tag mismatch
    PD_TENANT = 2    # the key exists but belongs to another tenant or protection domain
    ACCESS = 3       # the MR does not grant the requested access
    BOUNDS = 4       # [va, va+len) not inside [base, base+length)


class FlowOp(enum.IntEnum):
    """Flow-table management commands."""
    NOP = 0
    INSERT = 1
    DELETE = 2
    LOOKUP = 3


class FlowStatus(enum.IntEnum):
    """Result of a flow-table management command."""
    OK = 0
    EXISTS = 1       # insert of a key already present (its value is reported, nothing changes)
    FULL = 2         # insert found no room (table and stash); the table is unchanged
    NOT_FOUND = 3    # delete or lookup of an absent key


@dataclass(frozen=True)
class Field:
    name: str
    width: int
    doc: str


class FieldTable:
    """An ordered set of fields, least significant first; ``pack``/``unpack`` to integers."""

    def __init__(self, name, fields, doc):
        self.name = name
        self.doc = doc
        self.fields = tuple(Field(*f) for f in fields)
        self.offsets = {}
        pos = 0
        for f in self.fields:
            if f.name in self.offsets:
                raise ValueError(f"{name}: duplicate field {f.name}")
            self.offsets[f.name] = pos
            pos += f.width
        self.width = pos
        self.index = {f.name: i for i, f in enumerate(self.fields)}

    def __getitem__(self, name):
        return self.fields[self.index[name]]

    def __iter__(self):
        return iter(self.fields)

    @property
    def words(self):
        """32-bit words needed to carry one value (the CSR data windows)."""
        return -(-self.width // 32)

    def pack(self, values=None, **kw):
        values = {**(values or {}), **kw}
        unknown = set(values) - set(self.offsets)
        if unknown:
            raise KeyError(f"{self.name}: no field(s) {sorted(unknown)}")
        out = 0
        for f in self.fields:
            v = int(values.get(f.name, 0))
            if not 0 <= v < (1 << f.width):
                raise ValueError(f"{self.name}.{f.name} = {v:#x} does not fit in {f.width} bits")
            out |= v << self.offsets[f.name]
        return out

    def unpack(self, value):
        return {f.name: (value >> self.offsets[f.name]) & ((1 << f.width) - 1) for f in self.fields}

    def to_words(self, value):
        return [(value >> (32 * i)) & 0xFFFFFFFF for i in range(self.words)]

    def from_words(self, words):
        return sum((w & 0xFFFFFFFF) << (32 * i) for i, w in enumerate(words))

    def mask(self, names):
        """Field mask (bit i = field i of the table) selecting ``names``."""
        return sum(1 << self.index[n] for n in names)

    def merge(self, old, new, mask):
        """``old`` with the fields selected by ``mask`` taken from ``new`` (integers)."""
        out = old
        for i, f in enumerate(self.fields):
            if mask >> i & 1:
                bits = ((1 << f.width) - 1) << self.offsets[f.name]
                out = (out & ~bits) | (new & bits)
        return out

    def markdown(self):
        lines = [f"### {self.name} ({self.width} bits)", "", self.doc, "",
                 "| bits | field | description |", "|---|---|---|"]
        for f in self.fields:
            lo = self.offsets[f.name]
            lines.append(f"| {lo + f.width - 1}:{lo} | {f.name} | {f.doc} |")
        return "\n".join(lines)


class CcMode(enum.IntEnum):
    """Per-QP rate control (``cc_mode`` of the QP context; ``stellar.hdl.cc``)."""
    NONE = 0        # no reaction point: only the traffic class and tenant buckets limit the QP
    DCQCN = 1       # DCQCN reaction point (per-QP rate, target rate, alpha, timers, byte counter)
    FLOWMATRIX = 2  # experimental FlowMatrix weight update (sigmoid of the congestion signal)


QP_CONTEXT = FieldTable("qp_context", [
    ("state", 3, "QpState (ibv_qp_state values)"),
    ("tenant", TENANT_BITS, "tenant owning the QP (must match the packet's VLAN tenant and the MR's)"),
    ("pd", PD_BITS, "protection domain; an MR is usable only from QPs of the same PD and tenant"),
    ("pmtu", 3, "path MTU code (PathMtu, 256 << (code - 1) bytes)"),
    ("ipv6", 1, "destination is IPv6 (else IPv4 in dst_ip bits 31:0)"),
    ("dst_mac", 48, "next-hop MAC address"),
    ("dst_ip", 128, "destination IP address (IPv4 in bits 31:0 when ipv6 = 0)"),
    ("sgid_index", 8, "index of the local (source) address in the device's GID table"),
    ("remote_qpn", QPN_BITS, "destination QP number on the remote side"),
    ("sq_psn", PSN_BITS, "requester: PSN of the next packet to send"),
    ("epsn", PSN_BITS, "responder: expected PSN of the next request"),
    ("msn", 24, "responder: message sequence number (last completed request message)"),
    ("timeout", 5, "local ACK timeout code t: 4.096 us * 2**t (0 = infinite)"),
    ("retry_cnt", 3, "transport retries allowed on ACK timeout or NAK sequence error"),
    ("rnr_retry", 3, "RNR retries allowed (7 = infinite)"),
    ("min_rnr_timer", 5, "responder: RNR NAK timer code sent to the requester"),
    ("pkey", 16, "partition key (BTH P_Key) of the QP"),
    ("traffic_class", 8, "IP traffic class / DSCP+ECN on transmit"),
    ("hop_limit", 8, "IPv4 TTL / IPv6 hop limit on transmit"),
    ("flow_label", 20, "IPv6 flow label on transmit"),
    ("udp_sport", 16, "UDP source port on transmit (ECMP entropy)"),
    ("sl", 3, "service level: 802.1p priority on transmit"),
    ("tx_vlan", 13, "transmit VLAN tag: bit 12 set = tagged with VID bits 11:0 (PCP = sl); 0 = untagged"),
    ("cc_mode", 2, "rate control (CcMode): 0 none (class and tenant limits only), 1 DCQCN, "
                   "2 FlowMatrix (experimental)"),
    ("weight", 8, "weighted-round-robin share inside the QP's traffic class (sl); 0 acts as 1"),
    ("cc", 54, "reserved; zero"),
], "Per-QP state, read at lookup and written back by the transport (one word per QP index).")


MR_ENTRY = FieldTable("mr_entry", [
    ("valid", 1, "entry in use"),
    ("tag", KEY_TAG_BITS, "key tag: the low 8 bits of the lkey/rkey (index = key >> 8)"),
    ("tenant", TENANT_BITS, "tenant owning the region"),
    ("pd", PD_BITS, "protection domain of the region"),
    ("access", 4, "Access flags granted (ibv_access_flags values)"),
    ("va", 64, "virtual (or offset) address of the first byte"),
    ("length", 64, "bytes in the region"),
    ("page_list", 1, "0: contiguous at bus_base; 1: pages listed in the page table from pbl_index"),
    ("bus_base", 64, "contiguous: bus (IOVA) address of byte va"),
    ("pbl_index", 16, "page list: page-table index of the page holding byte va"),
    ("page_shift", 5, "page list: log2 of the page size (12 = 4 KiB, 21 = 2 MiB)"),
], "A registered memory region. Keys are index << 8 | tag; the index selects the entry.")


FLOW_KEY = FieldTable("flow_key", [
    ("qpn", QPN_BITS, "local QP number (BTH DestQP)"),
    ("tenant", TENANT_BITS, "tenant (from the VLAN->tenant table; untagged = 0)"),
], "Flow-table key: each tenant has its own QP number space.")


def make_key(index, tag):
    """lkey/rkey of MR ``index`` with key tag ``tag``."""
    return (index << KEY_TAG_BITS) | (tag & ((1 << KEY_TAG_BITS) - 1))


def split_key(key):
    """``(index, tag)`` of an lkey/rkey."""
    return key >> KEY_TAG_BITS, key & ((1 << KEY_TAG_BITS) - 1)


def flow_key(tenant, qpn):
    return FLOW_KEY.pack(tenant=tenant, qpn=qpn)
