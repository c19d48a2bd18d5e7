# Ref: rdma-core libibverbs/verbs.h and pyverbs (names, values and semantics of ibv_context,
#      ibv_pd, ibv_mr, ibv_cq, ibv_qp, ibv_qp_attr_mask, ibv_send_flags, ibv_wc_flags);
#      ibv_modify_qp(3) (required attributes per transition); IBTA Vol 1 ch. 10.3 (QP state
#      machine), ch. 11.4 (work requests, completions, flush on error)
"""Verbs: the host driver's API, after rdma-core's libibverbs / pyverbs, on any
:class:`stellar.host.device.Device` (simulated PCIe, VFIO)::

    ctx = await Context.open(device)                 # ident, features, table sizes
    await ctx.set_gid(0, mac=0x020000000001, ip="10.0.0.1")
    pd = ctx.alloc_pd()
    mr = await pd.reg_mr(numpy_array, Access.LOCAL_WRITE | Access.REMOTE_WRITE)  # mr.lkey/rkey/addr
    cq = await ctx.create_cq(256)
    qp = await ctx.create_qp(pd, QPInitAttr(send_cq=cq, recv_cq=cq, cap=QPCap(64, 64)))
    await qp.modify(QPAttr(qp_state=QPState.INIT, port_num=1, qp_access_flags=...))
    await qp.modify(QPAttr(qp_state=QPState.RTR, path_mtu=PathMtu.MTU_1024, dest_qp_num=...,
                           rq_psn=..., ah_attr=AHAttr(dgid="10.0.0.2", dmac=...), ...))
    await qp.modify(QPAttr(qp_state=QPState.RTS, sq_psn=..., timeout=14, retry_cnt=7, ...))
    await qp.post_send([SendWR(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=[SGE(mr.addr, n,
                        mr.lkey)], remote_addr=..., rkey=..., send_flags=SendFlags.SIGNALED)])
    wcs = await cq.poll(16)                          # reads host memory only

What the device does and what the driver does. Work requests go into rings in host memory
(``stellar.hdl.hostif.formats``): ``post_send`` writes 64-byte WQEs and rings ONE doorbell for the
whole list; ``post_recv`` likewise; ``poll`` reads CQEs by their owner bit -- no MMIO read -- and
returns them to the device with the CQ doorbell, batched (every quarter ring, and when the CQ is
armed). The device checks remote keys, QP states, PSNs; the driver checks what it can before
touching the device and raises typed errors (``stellar.host.errors``): a transition the QP state
machine does not have (E4001), a post to a QP in ERROR (E4002), an lkey that is not one of the
context's MRs, of another PD, or without LOCAL_WRITE where the NIC writes (E2001), an SGE out of
its MR (E2002), a full send or receive queue (E3008).

Memory. ``reg_mr`` takes a buffer (numpy array, bytearray, mmap, DmaBuffer), maps it for DMA
(zero-copy) and registers it in the device's MR table; ``mr.addr`` is the buffer's process
virtual address, as with libibverbs, and SGEs and remote addresses are virtual addresses inside
the MR (the driver turns local ones into bus addresses; the device turns remote ones). Keys:
``index << 8 | tag`` (lkey == rkey); the tag changes on every registration of an index, so a
stale rkey is refused by the device.

Queue accounting. A send-queue slot is free again when its work request has completed: a
signaled completion retires every unsignaled WQE before it (RC completes in order); an error
completion retires its own WQE and the ones before it; every WQE after an error completes
(WR_FLUSH_ERR). Post at least one signaled WR per ring's worth of unsignaled ones, as with any
verbs provider, or the queue reports full (E3008). A receive slot is free at its completion.

Transitions (ibv_modify_qp): RESET->INIT (port, pkey, access flags), INIT->INIT, INIT->RTR
(path, remote QPN, rq_psn, ...), RTR->RTS (sq_psn, timeout, retries), RTS->RTS, any->ERR,
any->RESET. Receives posted in INIT are fetched once the QP is in RTR (the device's RTR context
write re-initializes the receive queue). Recovery from ERROR: poll the flushed completions,
modify to RESET (rings re-initialized, indexes back to 0), then INIT -> RTR -> RTS again.

Interrupts: ``cq.req_notify()`` arms the CQ (one MSI on its ``comp_vector`` for the next CQEs,
after the moderation set with ``cq.moderate``); ``await cq.wait(timeout)`` waits for it; poll
once more after arming (``ibv_req_notify_cq``). ``ctx.mmio`` counts MMIO reads and writes, so a
program (and the tests) can see the fast path: one doorbell write per posted list, none per
completion.

Extensions over libibverbs (RoCE without a kernel to resolve addresses): ``AHAttr.dmac`` is the
next hop's MAC; ``QPAttr.rate_control`` / ``QPAttr.weight`` select the QP's congestion control
(``CcMode``) and its round-robin weight; ``Context(tenant=, vlan=)`` places every QP and MR of the
context in a tenant, tagged with a VLAN on the wire.
"""

import asyncio
import ctypes
import dataclasses
import enum
import ipaddress
import itertools
from collections import deque
from dataclasses import dataclass, field

from stellar.hdl.flow.fields import PD_BITS, Access, CcMode, FlowOp, FlowStatus, PathMtu, QpState
from stellar.hdl.hostif.formats import (
    CQ_DOORBELL,
    CQE,
    CQE_BYTES,
    INDEX_BITS,
    RQ_DOORBELL,
    RQ_WQE,
    RQ_WQE_BYTES,
    SQ_DOORBELL,
    SQ_WQE,
    SQ_WQE_BYTES,
    cqe_owner,
)
from stellar.hdl.regmap import (
    FEATURE_NAMES,
    MAGIC,
    REGMAP,
    HostqCommand,
    decode_feature,
    decode_version,
)
from stellar.hdl.transport.formats import INLINE_MAX, WcOpcode, WcStatus, WrOpcode

from .device import DmaBuffer
from .errors import (
    DeviceError,
    FlowTableFull,
    InvalidLkey,
    InvalidQpTransition,
    LocalBoundsError,
    QpInErrorState,
    QpStateError,
    QueueFull,
    StellarError,
)
from .tables import Tables

__all__ = [
    "Context", "PD", "MR", "CQ", "QP", "DeviceAttr", "PortAttr", "QPCap", "QPInitAttr", "QPAttr",
    "AHAttr", "SGE", "SendWR", "RecvWR", "WC", "QPType", "QPAttrMask", "SendFlags", "WcFlags",
    "QPState", "Access", "PathMtu", "WrOpcode", "WcOpcode", "WcStatus", "CcMode", "MmioCounter",
    "HostqCommand", "NotSupported",
]

QPState = QpState
INDEX_MASK = (1 << INDEX_BITS) - 1
MAX_RING_LOG = 15          # hostq: at most 2**15 entries per ring
QPN_BASE = 0x100           # QP numbers: QPN_BASE + QP index (0 and 1 are special in IB)


class QPType(enum.IntEnum):
    RC = 2                  # IBV_QPT_RC (the only type the transport implements)


class QPAttrMask(enum.IntFlag):
    """``ibv_qp_attr_mask`` values."""
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    ACCESS_FLAGS = 1 << 3
    PKEY_INDEX = 1 << 4
    PORT = 1 << 5
    AV = 1 << 7
    PATH_MTU = 1 << 8
    TIMEOUT = 1 << 9
    RETRY_CNT = 1 << 10
    RNR_RETRY = 1 << 11
    RQ_PSN = 1 << 12
    MAX_QP_RD_ATOMIC = 1 << 13
    MIN_RNR_TIMER = 1 << 15
    SQ_PSN = 1 << 16
    MAX_DEST_RD_ATOMIC = 1 << 17
    CAP = 1 << 19
    DEST_QPN = 1 << 20
    # Stellar extensions (above the bits libibverbs uses)
    RATE_CONTROL = 1 << 40
    WEIGHT = 1 << 41


class SendFlags(enum.IntFlag):
    """``ibv_send_flags`` values."""
    FENCE = 1 << 0
    SIGNALED = 1 << 1
    SOLICITED = 1 << 2
    INLINE = 1 << 3


class WcFlags(enum.IntFlag):
    """``ibv_wc_flags`` values."""
    GRH = 1 << 0
    WITH_IMM = 1 << 1
    WITH_INV = 1 << 3


class NotSupported(StellarError, ValueError):
    """A verbs feature the device does not implement (more than one SGE, a QP type other than
    RC, atomics)."""
    code = "E4010"
    default_fix = "see stellar.host.verbs: RC QPs, one SGE per work request, no atomics"


# Required attributes per transition (ibv_modify_qp(3), RC)
_REQUIRED = {
    (QpState.RESET, QpState.INIT): QPAttrMask.PKEY_INDEX | QPAttrMask.PORT | QPAttrMask.ACCESS_FLAGS,
    (QpState.INIT, QpState.RTR): (QPAttrMask.AV | QPAttrMask.PATH_MTU | QPAttrMask.DEST_QPN
                                  | QPAttrMask.RQ_PSN | QPAttrMask.MAX_DEST_RD_ATOMIC
                                  | QPAttrMask.MIN_RNR_TIMER),
    (QpState.RTR, QpState.RTS): (QPAttrMask.SQ_PSN | QPAttrMask.TIMEOUT | QPAttrMask.RETRY_CNT
                                 | QPAttrMask.RNR_RETRY | QPAttrMask.MAX_QP_RD_ATOMIC),
}
_ALLOWED = {(QpState.INIT, QpState.INIT), (QpState.RTS, QpState.RTS), *_REQUIRED}


class MmioCounter:
    """The device seen through a counter of its MMIO operations (``reads``, ``writes``)."""

    def __init__(self, device):
        self.device = device
        self.reads = 0
        self.writes = 0

    async def read32(self, offset):
        self.reads += 1
        return await self.device.read32(offset)

    async def write32(self, offset, value):
        self.writes += 1
        await self.device.write32(offset, value)

    def snapshot(self):
        return self.reads, self.writes


# --------------------------------------------------------------------------------- attributes
@dataclass(frozen=True)
class DeviceAttr:
    fw_ver: str
    vendor_id: int
    max_qp: int
    max_qp_wr: int
    max_cq: int
    max_cqe: int
    max_mr: int
    max_pd: int
    max_sge: int
    max_inline_data: int
    sq_depth: int               # on-chip work requests per QP in flight (the SQ credits)
    rq_depth: int
    features: tuple             # feature block names, in the device's list order
    phys_port_cnt: int = 1


@dataclass(frozen=True)
class PortAttr:
    state: str
    mac: int
    gid: str
    active_mtu: PathMtu = PathMtu.MTU_4096


@dataclass
class QPCap:
    max_send_wr: int = 64
    max_recv_wr: int = 64
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = INLINE_MAX


@dataclass
class QPInitAttr:
    send_cq: "CQ"
    recv_cq: "CQ"
    cap: QPCap = field(default_factory=QPCap)
    qp_type: QPType = QPType.RC
    sq_sig_all: bool = False


@dataclass
class AHAttr:
    """Address handle: where the QP sends (RoCEv2). ``dgid``: IPv4 or IPv6 address (str,
    ``ipaddress`` object, or 16 GID bytes; ``::ffff:a.b.c.d`` is IPv4); ``dmac``: the next hop's
    MAC (extension: no kernel resolves it here)."""
    dgid: object
    dmac: int
    sgid_index: int = 0
    traffic_class: int = 0
    hop_limit: int = 64
    flow_label: int = 0
    sl: int = 0
    port_num: int = 1


@dataclass
class QPAttr:
    """``ibv_qp_attr`` (the fields an RC QP uses) plus the extensions ``rate_control`` and
    ``weight``. With ``modify(attr)`` and no mask, every field that is not None is applied."""
    qp_state: QpState | None = None
    cur_qp_state: QpState | None = None
    qp_access_flags: Access | None = None
    pkey_index: int | None = None
    port_num: int | None = None
    ah_attr: AHAttr | None = None
    path_mtu: PathMtu | None = None
    timeout: int | None = None
    retry_cnt: int | None = None
    rnr_retry: int | None = None
    rq_psn: int | None = None
    max_rd_atomic: int | None = None
    min_rnr_timer: int | None = None
    sq_psn: int | None = None
    max_dest_rd_atomic: int | None = None
    cap: QPCap | None = None
    dest_qp_num: int | None = None
    rate_control: CcMode | None = None
    weight: int | None = None

    _MASK = {"qp_state": QPAttrMask.STATE, "cur_qp_state": QPAttrMask.CUR_STATE,
             "qp_access_flags": QPAttrMask.ACCESS_FLAGS, "pkey_index": QPAttrMask.PKEY_INDEX,
             "port_num": QPAttrMask.PORT, "ah_attr": QPAttrMask.AV,
             "path_mtu": QPAttrMask.PATH_MTU, "timeout": QPAttrMask.TIMEOUT,
             "retry_cnt": QPAttrMask.RETRY_CNT, "rnr_retry": QPAttrMask.RNR_RETRY,
             "rq_psn": QPAttrMask.RQ_PSN, "max_rd_atomic": QPAttrMask.MAX_QP_RD_ATOMIC,
             "min_rnr_timer": QPAttrMask.MIN_RNR_TIMER, "sq_psn": QPAttrMask.SQ_PSN,
             "max_dest_rd_atomic": QPAttrMask.MAX_DEST_RD_ATOMIC, "cap": QPAttrMask.CAP,
             "dest_qp_num": QPAttrMask.DEST_QPN, "rate_control": QPAttrMask.RATE_CONTROL,
             "weight": QPAttrMask.WEIGHT}

    def mask(self):
        out = QPAttrMask(0)
        for name, bit in self._MASK.items():
            if getattr(self, name) is not None:
                out |= bit
        return out


@dataclass
class SGE:
    addr: int           # virtual address inside the MR of ``lkey``
    length: int
    lkey: int


@dataclass
class SendWR:
    """``ibv_send_wr`` for RC: ``opcode`` (WrOpcode), ``sg_list`` (at most one SGE),
    ``send_flags``, ``imm_data`` (*_WITH_IMM), ``remote_addr`` / ``rkey`` (WRITE, READ),
    ``invalidate_rkey`` (SEND_WITH_INV). ``inline_data`` (extension): the payload itself,
    sent inline (at most 32 bytes) without an SGE."""
    wr_id: int = 0
    opcode: WrOpcode = WrOpcode.SEND
    sg_list: list = field(default_factory=list)
    send_flags: SendFlags = SendFlags(0)
    imm_data: int = 0
    remote_addr: int = 0
    rkey: int = 0
    invalidate_rkey: int = 0
    inline_data: bytes | None = None


@dataclass
class RecvWR:
    wr_id: int = 0
    sg_list: list = field(default_factory=list)


@dataclass(frozen=True)
class WC:
    """``ibv_wc``: ``qp_num`` is the local QP's number, ``src_qp`` the remote one (receives)."""
    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    byte_len: int
    imm_data: int
    qp_num: int
    src_qp: int
    wc_flags: WcFlags
    invalidated_rkey: int | None = None
    vendor_err: int = 0


# ---------------------------------------------------------------------------------- helpers
def _log2_ring(n, what):
    if n < 1:
        raise ValueError(f"{what}: at least 1 entry, not {n}")
    log = max(1, (n - 1).bit_length())
    if log > MAX_RING_LOG:
        raise ValueError(f"{what}: {n} entries; a ring holds at most {1 << MAX_RING_LOG}")
    return log


def _va(view):
    """The process virtual address of ``view[0]`` (a writable 'B' memoryview)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _gid_ip(gid):
    """``(ipv6, int address)`` of a GID given as str / ipaddress / 16 bytes."""
    if isinstance(gid, (bytes, bytearray)):
        addr = ipaddress.IPv6Address(bytes(gid))
    elif isinstance(gid, int):
        addr = ipaddress.ip_address(gid)
    else:
        addr = ipaddress.ip_address(gid) if not isinstance(gid, ipaddress._BaseAddress) else gid
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return isinstance(addr, ipaddress.IPv6Address), int(addr)


# ---------------------------------------------------------------------------------- context
class Context:
    """An opened device (``ibv_context``). Use :meth:`open`."""

    def __init__(self, device, *, tenant=0, vlan=None):
        self.device = device
        self.mmio = MmioCounter(device)
        self.tables = Tables(self.mmio)
        self.tenant = tenant
        self.vlan = vlan
        self.attr = None
        self._pds = itertools.count(1)
        self._mrs = {}              # index -> MR
        self._mr_tags = {}          # index -> last tag used
        self._cqs = {}              # number -> CQ
        self._qps = {}              # index -> QP
        self._hostq_lock = asyncio.Lock()     # one table command at a time

    @classmethod
    async def open(cls, device, *, tenant=0, vlan=None):
        """Check the device's identity, read its build configuration; returns the context."""
        ctx = cls(device, tenant=tenant, vlan=vlan)
        await ctx._probe()
        if vlan is not None:
            await ctx.tables.map_vlan(vlan, tenant)
        return ctx

    async def _r(self, name):
        return await self.mmio.read32(REGMAP[name].offset)

    async def _w(self, name, value):
        await self.mmio.write32(REGMAP[name].offset, value)

    async def _probe(self):
        magic = await self._r("ident.id")
        if magic != MAGIC:
            raise DeviceError(f"BAR0 does not hold a Stellar register map (ident.id {magic:#010x}, "
                              f"expected {MAGIC:#010x})",
                              fix="check the device's PCI address and that the bitstream is loaded")
        features = []
        for i in range(await self._r("ident.feature_count")):
            fid, _ver, _base = decode_feature(await self._r(f"ident.feature{i}"))
            features.append(FEATURE_NAMES.get(fid, f"feature{fid}"))
        if "hostq" not in features:
            raise DeviceError("the device has no host-queue block (feature hostq): its work "
                              "requests are not served from host memory",
                              fix="use a PCIe build (stellar_pcie_usp); board builds are driven "
                                  "through stellar.host.uartbus and their register queues")
        hq = await self._r("hostq.config")
        tables = await self.tables.config()
        major, minor, patch = decode_version(await self._r("ident.version"))
        self.qps = 1 << (hq & 0xFF)
        self.cqs = 1 << ((hq >> 8) & 0xFF)
        self.attr = DeviceAttr(
            fw_ver=f"{major}.{minor}.{patch}", vendor_id=0x10EE, max_qp=self.qps,
            max_qp_wr=1 << MAX_RING_LOG, max_cq=self.cqs, max_cqe=1 << MAX_RING_LOG,
            max_mr=tables["mr_entries"] - 1, max_pd=(1 << PD_BITS) - 1, max_sge=1,
            max_inline_data=INLINE_MAX, sq_depth=1 << ((hq >> 16) & 0xFF),
            rq_depth=1 << ((hq >> 24) & 0xFF), features=tuple(features))

    def query_device(self):
        """The device's attributes (read at :meth:`open`)."""
        return self.attr

    async def query_port(self, port_num=1):
        """Port 1: its state (``ACTIVE``; the link of a PCIe build is outside the core) and GID 0."""
        mac = await self._r("transport.gid0_mac_lo") | (await self._r("transport.gid0_mac_hi") << 32)
        ip = await self._r("transport.gid0_ip0")
        return PortAttr(state="ACTIVE", mac=mac, gid=str(ipaddress.IPv4Address(ip)))

    async def set_gid(self, index, *, mac, ip):
        """Local address ``index`` (a QP's ``ah_attr.sgid_index`` selects it): MAC and IP."""
        ipv6, value = _gid_ip(ip)
        await self._w(f"transport.gid{index}_mac_lo", mac & 0xFFFFFFFF)
        await self._w(f"transport.gid{index}_mac_hi", mac >> 32)
        await self._w(f"transport.gid{index}_flags", int(ipv6))
        for j in range(4 if ipv6 else 1):
            await self._w(f"transport.gid{index}_ip{j}", (value >> (32 * j)) & 0xFFFFFFFF)

    def alloc_pd(self):
        pd = next(self._pds)
        if pd > self.attr.max_pd:
            raise DeviceError(f"no protection domain left (the device has {self.attr.max_pd})")
        return PD(self, pd)

    # -- host queue table window -----------------------------------------------------------
    async def _hostq(self, command, index, words):
        async with self._hostq_lock:
            for i, w in enumerate(words):
                await self._w(f"hostq.wdata{i}", w & 0xFFFFFFFF)
            await self._w("hostq.index", index)
            await self._w("hostq.command", int(command))
            for _ in range(10_000):
                status = await self._r("hostq.status")
                if not status & 1:
                    break
            else:
                raise DeviceError("hostq: ring command still busy after 10000 status reads",
                                  fix="check that the device is alive (`stellar info`)")
            if status & 2:
                name = next(k for k, v in vars(HostqCommand).items() if v == command)
                raise DeviceError(f"hostq: command {name} for {index} "
                                  "refused (index out of range or written while busy)")

    async def ring_state(self, kind, index):
        """Raw read of a ring's configuration and indexes (``rdata0..4``) for diagnostics."""
        cmd = {"sq": HostqCommand.READ_SQ, "rq": HostqCommand.READ_RQ, "cq": HostqCommand.READ_CQ}[kind]
        await self._hostq(cmd, index, [])
        return [await self._r(f"hostq.rdata{i}") for i in range(5)]

    # -- objects -----------------------------------------------------------------------------
    async def create_cq(self, cqe=256, *, comp_vector=None):
        """A completion queue of at least ``cqe`` entries (``ibv_create_cq``)."""
        number = next((n for n in range(self.cqs) if n not in self._cqs), None)
        if number is None:
            raise DeviceError(f"no completion queue left (the device has {self.cqs})")
        cq = CQ(self, number, _log2_ring(cqe, "CQ"),
                number % 32 if comp_vector is None else comp_vector)
        await cq._configure()
        self._cqs[number] = cq
        return cq

    async def create_qp(self, pd, init_attr: QPInitAttr):
        """An RC QP in RESET (``ibv_create_qp``)."""
        if init_attr.qp_type != QPType.RC:
            raise NotSupported(f"QP type {init_attr.qp_type!r}: only RC is implemented")
        cap = init_attr.cap
        if cap.max_send_sge > 1 or cap.max_recv_sge > 1:
            raise NotSupported(f"{max(cap.max_send_sge, cap.max_recv_sge)} SGEs per work request: "
                               "the device takes one")
        if cap.max_inline_data > INLINE_MAX:
            raise NotSupported(f"max_inline_data {cap.max_inline_data}: at most {INLINE_MAX}")
        index = next((i for i in range(self.qps) if i not in self._qps), None)
        if index is None:
            raise DeviceError(f"no QP left (the device has {self.qps})")
        qp = QP(self, pd, index, init_attr)
        self._qps[index] = qp
        return qp

    async def close(self):
        for qp in list(self._qps.values()):
            await qp.destroy()
        for cq in list(self._cqs.values()):
            await cq.destroy()
        for mr in list(self._mrs.values()):
            await mr.dereg()

    # -- lookups for the fast path -------------------------------------------------------------
    def _local(self, sge, pd, *, write, what):
        """Bus address of ``sge`` after the lkey, PD, access and bounds checks."""
        mr = self._mrs.get(sge.lkey >> 8)
        if mr is None or mr.lkey != sge.lkey:
            raise InvalidLkey(f"{what}: lkey {sge.lkey:#x} is not a registered memory region of "
                              "this context", fix="use mr.lkey of a live MR (reg_mr)", lkey=sge.lkey)
        if mr.pd is not pd:
            raise InvalidLkey(f"{what}: lkey {sge.lkey:#x} belongs to PD {mr.pd.handle}, the QP to "
                              f"PD {pd.handle}", fix="register the buffer in the QP's PD",
                              lkey=sge.lkey)
        if write and not mr.access & Access.LOCAL_WRITE:
            raise InvalidLkey(f"{what}: the NIC writes into MR {sge.lkey:#x}, registered without "
                              "LOCAL_WRITE", fix="register it with Access.LOCAL_WRITE",
                              lkey=sge.lkey)
        off = sge.addr - mr.addr
        if sge.length < 0 or off < 0 or off + sge.length > mr.length:
            raise LocalBoundsError(f"{what}: [{sge.addr:#x}, +{sge.length}) is outside MR "
                                   f"{sge.lkey:#x} [{mr.addr:#x}, +{mr.length})",
                                   addr=sge.addr, length=sge.length)
        return mr, mr.bus_base + off


class PD:
    """A protection domain (``ibv_pd``): MRs are usable only from QPs of the same PD."""

    def __init__(self, ctx, handle):
        self.ctx = ctx
        self.handle = handle

    async def reg_mr(self, buf, access=Access.LOCAL_WRITE, *, length=None):
        """Register ``buf`` (numpy array, bytearray, mmap, memoryview or a ``DmaBuffer``) with
        ``access`` (``Access`` flags, ibv_access_flags values); returns the :class:`MR`."""
        ctx = self.ctx
        mapped_here = not isinstance(buf, DmaBuffer)
        dma = ctx.device.map_dma(buf) if mapped_here else buf
        index = next((i for i in range(1, ctx.attr.max_mr + 1) if i not in ctx._mrs), None)
        if index is None:
            if mapped_here:
                ctx.device.unmap_dma(dma)
            raise DeviceError(f"no memory region left (the device has {ctx.attr.max_mr})")
        tag = (ctx._mr_tags.get(index, 0) + 1) & 0xFF or 1
        ctx._mr_tags[index] = tag
        n = dma.size if length is None else length
        va = _va(dma.view)
        key = await ctx.tables.write_mr(index, tag=tag, tenant=ctx.tenant, pd=self.handle,
                                        access=int(access), va=va, length=n, bus_base=dma.bus_addr)
        mr = MR(self, index, key, va, n, Access(access), dma, mapped_here)
        ctx._mrs[index] = mr
        return mr


class MR:
    """A registered memory region: ``addr`` (virtual address of its first byte), ``length``,
    ``lkey`` / ``rkey``, ``buf`` (the ``DmaBuffer``; ``buf.view`` is the memory)."""

    def __init__(self, pd, index, key, addr, length, access, buf, owned):
        self.pd = pd
        self.index = index
        self.lkey = self.rkey = key
        self.addr = addr
        self.length = length
        self.access = access
        self.buf = buf
        self.bus_base = buf.bus_addr
        self._owned = owned

    async def dereg(self):
        ctx = self.pd.ctx
        if ctx._mrs.get(self.index) is not self:
            return
        await ctx.tables.invalidate_mr(self.index)
        del ctx._mrs[self.index]
        if self._owned:
            ctx.device.unmap_dma(self.buf)

    def __repr__(self):
        return f"MR(addr={self.addr:#x}, length={self.length}, lkey={self.lkey:#x})"


class CQ:
    """A completion queue: a ring of 32-byte CQEs in host memory the device writes."""

    def __init__(self, ctx, number, log, vector):
        self.ctx = ctx
        self.number = number
        self.log = log
        self.size = 1 << log
        self.vector = vector
        self.ring = ctx.device.alloc_dma(self.size * CQE_BYTES, align=max(64, self.size * CQE_BYTES))
        self.ci = 0             # consumer index (free-running)
        self.reported = 0       # last consumer index written to the doorbell
        self.mod_count = 1
        self.mod_time = 0

    async def _configure(self):
        self.ring.view[:] = bytes(self.ring.size)
        self.ci = self.reported = 0
        base = self.ring.bus_addr
        await self.ctx._hostq(HostqCommand.WRITE_CQ, self.number,
                              [base, base >> 32, self.log | 1 << 8 | self.vector << 16,
                               self.mod_count & 0xFFFF, self.mod_time])

    async def moderate(self, count=1, time_clocks=0):
        """Interrupt moderation: one MSI per ``count`` CQEs or ``time_clocks`` after the first,
        whichever is first. Re-initializes the ring: call it while no QP uses the CQ."""
        self.mod_count, self.mod_time = count, time_clocks
        await self._configure()

    def _peek(self):
        off = (self.ci & (self.size - 1)) * CQE_BYTES
        raw = self.ring.view[off:off + CQE_BYTES]
        if (raw[CQE_BYTES - 1] >> 7) != cqe_owner(self.ci & INDEX_MASK, self.log):
            return None
        return CQE.unpack(int.from_bytes(raw, "little"))

    async def poll(self, num_entries=16):
        """Up to ``num_entries`` completions (``ibv_poll_cq``), oldest first; reads host memory
        only. Returns the entries to the device every quarter ring."""
        out = []
        while len(out) < num_entries:
            f = self._peek()
            if f is None:
                break
            self.ci += 1
            out.append(self.ctx._qps[f["qp"]]._complete(f) if f["qp"] in self.ctx._qps
                       else _wc(f, QPN_BASE + f["qp"]))
        if self.ci - self.reported >= self.size // 4:
            await self._doorbell(arm=False)
        return out

    async def _doorbell(self, arm):
        self.reported = self.ci
        await self.ctx.mmio.write32(REGMAP["hostq.cq_doorbell"].offset,
                                    CQ_DOORBELL.pack(ci=self.ci & INDEX_MASK, cq=self.number,
                                                     arm=int(arm)))

    async def req_notify(self):
        """Arm: one MSI for the next CQEs (``ibv_req_notify_cq``); also returns consumed entries."""
        await self._doorbell(arm=True)

    async def wait(self, timeout=None):
        """Wait for the CQ's interrupt (after :meth:`req_notify`); ``timeout`` in seconds (of
        simulated time on a simulated device)."""
        return await self.ctx.device.wait_irq(self.vector, timeout=timeout)

    async def destroy(self):
        if self.ctx._cqs.get(self.number) is self:
            await self.ctx._hostq(HostqCommand.WRITE_CQ, self.number, [0, 0, 0, 0, 0])
            del self.ctx._cqs[self.number]


def _wc(f, qp_num):
    flags = WcFlags(0)
    if f["has_imm"]:
        flags |= WcFlags.WITH_IMM
    if f["has_inv"]:
        flags |= WcFlags.WITH_INV
    return WC(wr_id=f["wr_id"], status=WcStatus(f["status"]), opcode=WcOpcode(f["opcode"]),
              byte_len=f["byte_len"], imm_data=f["imm"] if f["has_imm"] else 0, qp_num=qp_num,
              src_qp=f["src_qpn"], wc_flags=flags,
              invalidated_rkey=f["imm"] if f["has_inv"] else None)


class QP:
    """An RC queue pair (``ibv_qp``): ``qp_num``, ``state``; rings in host memory."""

    def __init__(self, ctx, pd, index, init_attr):
        self.ctx = ctx
        self.pd = pd
        self.index = index
        self.qp_num = QPN_BASE + index
        self.init_attr = init_attr
        self.send_cq = init_attr.send_cq
        self.recv_cq = init_attr.recv_cq
        self.sq_sig_all = init_attr.sq_sig_all
        cap = init_attr.cap
        self.sq_log = _log2_ring(cap.max_send_wr, "send queue")
        self.rq_log = _log2_ring(cap.max_recv_wr, "receive queue")
        self.sq = ctx.device.alloc_dma(SQ_WQE_BYTES << self.sq_log, align=SQ_WQE_BYTES << self.sq_log)
        self.rq = ctx.device.alloc_dma(RQ_WQE_BYTES << self.rq_log,
                                       align=max(64, RQ_WQE_BYTES << self.rq_log))
        self.state = QpState.RESET
        self.attr = QPAttr()
        self.in_flow = False
        self._reset_indexes()

    def _reset_indexes(self):
        self.sq_pi = 0          # free-running producer indexes
        self.rq_pi = 0
        self.rq_rung = 0        # last RQ doorbell written
        self.sq_pending = deque()   # (wr_id, signaled) of posted, not completed send WQEs
        self.rq_pending = 0

    @property
    def sq_free(self):
        return (1 << self.sq_log) - len(self.sq_pending)

    @property
    def rq_free(self):
        return (1 << self.rq_log) - self.rq_pending

    # -- state machine ---------------------------------------------------------------------
    async def modify(self, attr: QPAttr, attr_mask=None):
        """``ibv_modify_qp``: checks the transition and its required attributes before writing
        anything to the device."""
        mask = attr.mask() if attr_mask is None else QPAttrMask(attr_mask)
        cur = self.state
        new = attr.qp_state if mask & QPAttrMask.STATE else cur
        new = QpState(new)
        if new == QpState.RESET:
            await self._to_reset()
            return
        if new == QpState.ERROR:
            await self.ctx.tables.write_qp(self.index, state=QpState.ERROR)
            self.state = QpState.ERROR
            return
        if (cur, new) not in _ALLOWED:
            raise InvalidQpTransition(
                f"QP {self.qp_num:#x}: {cur.name} -> {new.name} is not a transition of the RC QP "
                "state machine", fix="RESET->INIT->RTR->RTS in order; any state -> RESET or ERROR",
                qp_num=self.qp_num, cur=cur, new=new)
        missing = _REQUIRED.get((cur, new), QPAttrMask(0)) & ~mask
        if missing:
            names = ", ".join(n for n, b in QPAttr._MASK.items() if b & missing)
            raise InvalidQpTransition(f"QP {self.qp_num:#x}: {cur.name} -> {new.name} needs {names}",
                                      fix="set them in the QPAttr (ibv_modify_qp(3) lists the "
                                          "required attributes per transition)",
                                      qp_num=self.qp_num, missing=missing)
        for name in QPAttr._MASK:
            if QPAttr._MASK[name] & mask and name != "qp_state":
                setattr(self.attr, name, getattr(attr, name))
        if (cur, new) == (QpState.RESET, QpState.INIT):
            await self._to_init()
        elif new == QpState.INIT:
            await self.ctx.tables.write_qp(self.index, **self._common())
        elif new == QpState.RTR:
            await self._to_rtr()
        else:
            fields = {k: v for k, v in self._rts_fields().items()
                      if cur == QpState.RTR or k != "sq_psn"}
            await self.ctx.tables.write_qp(self.index, state=QpState.RTS, **fields)
        self.state = new
        self.attr.qp_state = new

    def _common(self):
        """Fields set at INIT (and INIT->INIT): tenant, PD, VLAN, class, rate control."""
        ctx, a = self.ctx, self.attr
        return dict(tenant=ctx.tenant, pd=self.pd.handle, pkey=0xFFFF,
                    tx_vlan=0 if ctx.vlan is None else (1 << 12) | ctx.vlan,
                    udp_sport=0xC000 | (self.index & 0x3FFF),
                    cc_mode=int(a.rate_control or 0), weight=a.weight or 0)

    async def _to_init(self):
        ctx = self.ctx
        if not self.in_flow:
            # A steering entry left by an earlier program on this device (QPNs are
            # QPN_BASE + index, so the key is this QP's) is taken over, not an error.
            r = await ctx.tables.flow_command(FlowOp.INSERT, ctx.tenant, self.qp_num, self.index)
            if r.status == FlowStatus.EXISTS and r.value != self.index:
                await ctx.tables.delete_flow(ctx.tenant, self.qp_num)
                await ctx.tables.insert_flow(ctx.tenant, self.qp_num, self.index)
            elif r.status == FlowStatus.FULL:
                raise FlowTableFull(f"flow table full inserting QP {self.qp_num:#x}",
                                    qp_num=self.qp_num)
            self.in_flow = True
        await ctx.tables.write_qp(self.index, state=QpState.INIT, msn=0, **self._common())
        await self._configure_rings(enabled=True)

    async def _configure_rings(self, enabled):
        """(Re)initialize both rings: zeroed, indexes 0, the device's credits full."""
        self.sq.view[:] = bytes(self.sq.size)
        self.rq.view[:] = bytes(self.rq.size)
        self._reset_indexes()
        for cmd, buf, log, cq in ((HostqCommand.WRITE_SQ, self.sq, self.sq_log, self.send_cq),
                                  (HostqCommand.WRITE_RQ, self.rq, self.rq_log, self.recv_cq)):
            await self.ctx._hostq(cmd, self.index, [buf.bus_addr, buf.bus_addr >> 32,
                                                    log | int(enabled) << 8 | cq.number << 16, 0, 0])

    async def _to_rtr(self):
        a = self.attr
        ah = a.ah_attr
        ipv6, ip = _gid_ip(ah.dgid)
        await self.ctx.tables.write_qp(
            self.index, state=QpState.RTR, pmtu=int(a.path_mtu), remote_qpn=a.dest_qp_num,
            epsn=a.rq_psn, min_rnr_timer=a.min_rnr_timer, ipv6=int(ipv6), dst_ip=ip,
            dst_mac=ah.dmac, sgid_index=ah.sgid_index, traffic_class=ah.traffic_class,
            hop_limit=ah.hop_limit, flow_label=ah.flow_label, sl=ah.sl)
        # the RTR write (epsn) re-initialized the device's receive queue: receives posted in
        # INIT were held in the ring; the doorbell now hands them over
        if self.rq_pi != self.rq_rung:
            await self._rq_doorbell()

    def _rts_fields(self):
        a = self.attr
        return dict(sq_psn=a.sq_psn, timeout=a.timeout, retry_cnt=a.retry_cnt,
                    rnr_retry=a.rnr_retry)

    async def _to_reset(self):
        await self.ctx.tables.write_qp(self.index, state=QpState.RESET)
        if self.in_flow:
            await self.ctx.tables.delete_flow(self.ctx.tenant, self.qp_num)
            self.in_flow = False
        await self._configure_rings(enabled=False)
        self.state = QpState.RESET
        self.attr = QPAttr(qp_state=QpState.RESET)

    async def query(self):
        """``ibv_query_qp``: the state as the device holds it (it moves a QP to ERROR by
        itself), and the attributes set."""
        hw = await self.ctx.tables.read_qp(self.index)
        state = QpState(hw["state"])
        if state == QpState.ERROR:
            self.state = state
        return dataclasses.replace(self.attr, qp_state=state), hw

    async def destroy(self):
        if self.ctx._qps.get(self.index) is self:
            await self._to_reset()
            del self.ctx._qps[self.index]

    # -- fast path ---------------------------------------------------------------------------
    def _check_post(self, what, allowed):
        if self.state == QpState.ERROR:
            raise QpInErrorState(f"{what} on QP {self.qp_num:#x}, which is in ERROR",
                                 fix="poll its flushed completions, then modify it to RESET and "
                                     "connect it again (INIT, RTR, RTS)", qp_num=self.qp_num)
        if self.state not in allowed:
            raise QpStateError(f"{what} on QP {self.qp_num:#x} in {self.state.name}: allowed in "
                               f"{', '.join(s.name for s in allowed)}",
                               fix="modify the QP to RTS first (post_recv: INIT or later)",
                               qp_num=self.qp_num)

    def _encode_send(self, wr):
        signaled = bool(wr.send_flags & SendFlags.SIGNALED) or self.sq_sig_all
        op = WrOpcode(wr.opcode)
        if len(wr.sg_list) > 1:
            raise NotSupported(f"work request {wr.wr_id}: {len(wr.sg_list)} SGEs; the device takes one")
        inline = wr.inline_data
        if inline is None and wr.send_flags & SendFlags.INLINE and wr.sg_list:
            sge = wr.sg_list[0]
            mr, _bus = self.ctx._local(sge, self.pd, write=False, what=f"inline WR {wr.wr_id}")
            off = sge.addr - mr.addr
            inline = bytes(mr.buf.view[off:off + sge.length])
        if inline is not None:
            if op == WrOpcode.RDMA_READ:
                raise NotSupported(f"work request {wr.wr_id}: an RDMA READ cannot be inline")
            if len(inline) > INLINE_MAX:
                raise NotSupported(f"work request {wr.wr_id}: {len(inline)} inline bytes; at most "
                                   f"{INLINE_MAX}")
            length, data = len(inline), int.from_bytes(inline, "little")
        elif wr.sg_list:
            sge = wr.sg_list[0]
            _mr, bus = self.ctx._local(sge, self.pd, write=op == WrOpcode.RDMA_READ,
                                       what=f"work request {wr.wr_id}")
            length, data = sge.length, bus
        else:
            length, data = 0, 0
        imm = wr.invalidate_rkey if op == WrOpcode.SEND_WITH_INV else wr.imm_data
        word = SQ_WQE.pack(opcode=int(op), signaled=int(signaled), inline=int(inline is not None),
                           length=length, wr_id=wr.wr_id, raddr=wr.remote_addr, rkey=wr.rkey,
                           imm=imm, data=data)
        return word.to_bytes(SQ_WQE_BYTES, "little"), signaled

    async def post_send(self, wrs):
        """``ibv_post_send``: every WR is checked and written to the ring, then ONE doorbell
        posts them all. Raises (before any write) on the first bad WR."""
        wrs = [wrs] if isinstance(wrs, SendWR) else list(wrs)
        self._check_post("post_send", (QpState.RTS,))
        if len(wrs) > self.sq_free:
            raise QueueFull(f"QP {self.qp_num:#x}: {len(wrs)} send WRs, {self.sq_free} free slots "
                            f"of {1 << self.sq_log}",
                            fix="poll the send CQ (and signal at least one WR in every ring's "
                                "worth), or create the QP with a larger max_send_wr",
                            qp_num=self.qp_num)
        encoded = [self._encode_send(wr) for wr in wrs]
        mask = (1 << self.sq_log) - 1
        for wr, (raw, signaled) in zip(wrs, encoded, strict=True):
            off = (self.sq_pi & mask) * SQ_WQE_BYTES
            self.sq.view[off:off + SQ_WQE_BYTES] = raw
            self.sq_pending.append((wr.wr_id, signaled))
            self.sq_pi += 1
        await self.ctx.mmio.write32(REGMAP["hostq.sq_doorbell"].offset,
                                    SQ_DOORBELL.pack(pi=self.sq_pi & INDEX_MASK, qp=self.index))

    async def post_recv(self, wrs):
        """``ibv_post_recv``: written to the ring, one doorbell for the list (held until RTR when
        posted in INIT)."""
        wrs = [wrs] if isinstance(wrs, RecvWR) else list(wrs)
        self._check_post("post_recv", (QpState.INIT, QpState.RTR, QpState.RTS))
        if len(wrs) > self.rq_free:
            raise QueueFull(f"QP {self.qp_num:#x}: {len(wrs)} receive WRs, {self.rq_free} free "
                            f"slots of {1 << self.rq_log}",
                            fix="poll the receive CQ, or create the QP with a larger max_recv_wr",
                            qp_num=self.qp_num)
        raws = []
        for wr in wrs:
            if len(wr.sg_list) > 1:
                raise NotSupported(f"receive {wr.wr_id}: {len(wr.sg_list)} SGEs; the device takes one")
            if wr.sg_list:
                sge = wr.sg_list[0]
                _mr, bus = self.ctx._local(sge, self.pd, write=True, what=f"receive {wr.wr_id}")
                length = sge.length
            else:
                bus, length = 0, 0
            raws.append(RQ_WQE.pack(wr_id=wr.wr_id, addr=bus, length=length)
                        .to_bytes(RQ_WQE_BYTES, "little"))
        mask = (1 << self.rq_log) - 1
        for raw in raws:
            off = (self.rq_pi & mask) * RQ_WQE_BYTES
            self.rq.view[off:off + RQ_WQE_BYTES] = raw
            self.rq_pi += 1
            self.rq_pending += 1
        if self.state != QpState.INIT:
            await self._rq_doorbell()

    async def _rq_doorbell(self):
        self.rq_rung = self.rq_pi
        await self.ctx.mmio.write32(REGMAP["hostq.rq_doorbell"].offset,
                                    RQ_DOORBELL.pack(pi=self.rq_pi & INDEX_MASK, qp=self.index))

    def _complete(self, f):
        """Account a CQE of this QP; returns its WC."""
        status = WcStatus(f["status"])
        if f["is_recv"]:
            self.rq_pending = max(0, self.rq_pending - 1)
        elif status == WcStatus.SUCCESS:
            while self.sq_pending:
                _wr_id, signaled = self.sq_pending.popleft()
                if signaled:
                    break
        else:
            while self.sq_pending:
                wr_id, _signaled = self.sq_pending.popleft()
                if wr_id == f["wr_id"]:
                    break
        if status != WcStatus.SUCCESS:
            self.state = QpState.ERROR
        return _wc(f, self.qp_num)

    def __repr__(self):
        return f"QP(qp_num={self.qp_num:#x}, index={self.index}, state={self.state.name})"
