# Ref: IBTA Vol 1 9.7.4.1.3-9.7.4.1.5 (R_Key, bounds and access checks), Annex A17 (RoCEv2)
"""Golden model of the receive flow pipeline, and the multi-tenant world the tests program.

Independent of the gateware: the expected outcome of a packet is decided from how the packet
was built (tenant VLAN, destination QP, opcode, RETH/AtomicETH) and from the tables the host
programmed, with the rules written out again here from the spec (VLAN -> tenant, (tenant, QPN)
-> QP, MR check with the QP's tenant and PD), not by running any Stellar code.

``default_world()`` is the scene of ``make sim`` and of the cocotb tests: three tenants on one
port (untagged = tenant 0, VLAN 100 = tenant 1, VLAN 200 = tenant 2, VLAN 300 not mapped), the
same QPN 0x11 used by tenants 1 and 2 for different QPs, memory regions of each tenant with
different rights, contiguous and page-list. ``random_trace`` mixes legitimate traffic with every
kind of violation, including the attack ``make sim`` shows: a tenant-1 packet naming a tenant-2
QPN and rkey.
"""

import random
from dataclasses import dataclass, field, replace

from stellar.hdl.flow.fields import Access, MrReason, QpState, make_key, split_key
from stellar.hdl.net import headers as H

from . import packets

__all__ = ["World", "Packet", "Outcome", "default_world", "FlowModel", "mr_check", "random_trace",
           "attack_packets", "coverage_packets", "VERDICTS", "MR_KINDS"]

# FlowVerdict / MrKind values (stellar.hdl.flow.rxflow), spelled out for the reports.
VERDICTS = {0: "pass", 1: "tenant", 2: "unknown_qp", 3: "rkey", 4: "access", 5: "bounds"}
MR_KINDS = {0: "-", 1: "write", 2: "read", 3: "atomic"}
_REASON_VERDICT = {MrReason.BAD_KEY: 3, MrReason.PD_TENANT: 3, MrReason.ACCESS: 4,
                   MrReason.BOUNDS: 5}
MASK64 = (1 << 64) - 1


@dataclass
class World:
    """Tables as the host programs them."""
    vlans: dict            # vid -> tenant, or None: explicitly unmapped
    qps: dict              # QP index -> context fields (dict for fields.QP_CONTEXT)
    flows: dict            # (tenant, qpn) -> QP index
    mrs: dict              # MR index -> MR_ENTRY fields (dict, valid=1)
    pages: dict            # page-table index -> bus address
    mr_entries: int = 1024
    mr_pages: int = 1024

    def key(self, mr_index):
        return make_key(mr_index, self.mrs[mr_index]["tag"])

    def tenant_vid(self, tenant):
        """A VLAN ID carrying ``tenant`` (None: untagged)."""
        if tenant == 0:
            return None
        return next(v for v, t in sorted(self.vlans.items()) if t == tenant)


def default_world(seed=0):
    rng = random.Random(f"flow-world:{seed}")
    rw = Access.REMOTE_WRITE | Access.REMOTE_READ

    def ctx(tenant, pd):
        return {"state": QpState.RTS, "tenant": tenant, "pd": pd, "pmtu": 5, "pkey": 0xFFFF,
                "remote_qpn": rng.randrange(1 << 24), "epsn": rng.randrange(1 << 24),
                "msn": rng.randrange(1 << 24), "sq_psn": rng.randrange(1 << 24),
                "dst_mac": 0x02_00_00_00_00_02, "dst_ip": 0xC0A80002, "traffic_class": 0,
                "timeout": 14, "retry_cnt": 7, "rnr_retry": 7}

    qps = {1: ctx(0, 1), 2: ctx(1, 10), 3: ctx(2, 20), 4: ctx(2, 21), 5: ctx(1, 10),
           4095: ctx(1, 11)}
    flows = {(0, 0x000101): 1, (1, 0x000011): 2, (2, 0x000011): 3, (2, 0x000222): 4,
             (1, 0x000333): 5, (1, 0xFFFFFF): 4095}

    def mr(tag, tenant, pd, access, va, length, **kw):
        return {"valid": 1, "tag": tag, "tenant": tenant, "pd": pd, "access": int(access), "va": va,
                "length": length, "page_list": 0, "bus_base": 0, "pbl_index": 0, "page_shift": 0,
                **kw}

    mrs = {
        1: mr(0x11, 1, 10, rw, 0x1000_0000, 0x10000, bus_base=0x8000_0000),
        2: mr(0x22, 2, 20, rw | Access.REMOTE_ATOMIC, 0x2000_0800, 0x3000, page_list=1,
              pbl_index=8, page_shift=12),
        3: mr(0x33, 1, 10, Access.REMOTE_READ, 0x3000_0000, 0x1000, bus_base=0x9000_0000),
        4: mr(0x44, 2, 21, rw, 0x4000_0000, 0x2000, bus_base=0xA000_0000),
        5: mr(0x55, 0, 1, rw | Access.REMOTE_ATOMIC, 0xFFFF_FFFF_FFFF_F000, 0x1000,
              bus_base=0x1_0000_0000),
        1023: mr(0xFE, 1, 11, rw, 0x7000_0000, 0x100, bus_base=0xB000_0000),
    }
    pages = {8 + i: 0x4_0000_0000 + 0x10_0000 * (i * 7 % 5) for i in range(4)}
    vlans = {100: 1, 200: 2, 300: None}
    return World(vlans=vlans, qps=qps, flows=flows, mrs=mrs, pages=pages)


@dataclass(frozen=True)
class Packet:
    """One packet of a trace, as built (not as parsed)."""
    opcode: int
    qpn: int
    psn: int = 0
    vid: int = None          # None: untagged
    va: int = 0
    rkey: int = 0
    length: int = 0          # RETH DMA length (atomics: 8 implied)
    payload: bytes = b""
    ipv6: bool = False
    desc: str = ""

    def frame(self):
        ext = {}
        op = H.OPCODES[self.opcode]
        if H.RETH in op.ext:
            ext["reth"] = {"va": self.va, "rkey": self.rkey, "dma_length": self.length}
        if H.ATOMICETH in op.ext:
            ext["atomiceth"] = {"va": self.va, "rkey": self.rkey, "swap_add": 1, "compare": 0}
        if H.AETH in op.ext:
            ext["aeth"] = {"syndrome": 0x1F, "msn": self.psn}
        if H.DETH in op.ext:
            ext["deth"] = {"qkey": 0x11111111, "src_qp": 0x42}
        if H.IMMDT in op.ext:
            ext["immdt"] = {"data": 0xC0FFEE}
        payload = self.payload if op.payload else b""
        return packets.roce_frame(self.opcode, ipv6=self.ipv6,
                                  vlan=None if self.vid is None else (0, self.vid),
                                  payload=payload, bth={"dest_qp": self.qpn, "psn": self.psn},
                                  ext=ext)


@dataclass
class Outcome:
    """What the pipeline must report for one packet (the fields of the annotation word)."""
    passed: bool
    reason: int = 0
    tenant: int = 0
    qp: int = 0
    mr_kind: int = 0
    mr_reason: int = 0
    bus_addr: int = 0
    span: int = 0
    ctx_state: int = 0
    ctx_epsn: int = 0
    ctx_msn: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def verdict(self):
        return VERDICTS[self.reason]


def mr_kind(opcode):
    op = H.OPCODES.get(opcode)
    if op is None:
        return 0
    if H.ATOMICETH in op.ext:
        return 3
    if H.RETH in op.ext:
        return 2 if op.name.endswith("RDMA_READ_REQUEST") else 1
    return 0


_KIND_ACCESS = {1: Access.REMOTE_WRITE, 2: Access.REMOTE_READ, 3: Access.REMOTE_ATOMIC}


def mr_check(world, tenant, pd, key, va, length, access):
    """``(MrReason, bus_addr, span)`` by the rules of IBTA 9.7.4.1 as Stellar applies them."""
    if length == 0:
        return MrReason.OK, 0, 0
    index, tag = split_key(key)
    e = world.mrs.get(index)
    if index >= world.mr_entries or e is None or not e["valid"] or e["tag"] != tag:
        return MrReason.BAD_KEY, 0, 0
    if e["tenant"] != tenant or e["pd"] != pd:
        return MrReason.PD_TENANT, 0, 0
    if int(access) & ~e["access"]:
        return MrReason.ACCESS, 0, 0
    if not (e["va"] <= va and va + length <= e["va"] + e["length"]):
        return MrReason.BOUNDS, 0, 0
    if not e["page_list"]:
        return MrReason.OK, (e["bus_base"] + va - e["va"]) & MASK64, length
    size = 1 << e["page_shift"]
    page = (va - e["va"] + (e["va"] & (size - 1))) >> e["page_shift"]
    slot = e["pbl_index"] + page
    if slot >= world.mr_pages:
        return MrReason.BOUNDS, 0, 0
    bus = (world.pages.get(slot, 0) & ~(size - 1) & MASK64) | (va & (size - 1))
    return MrReason.OK, bus, min(length, size - (va & (size - 1)))


class FlowModel:
    """The pipeline's expected answers, packet by packet, including the QP-context updates of the
    ``stellar_rxflow`` transport stand-in (epsn = PSN + 1, msn + 1 per passed RoCE packet)."""

    def __init__(self, world):
        self.world = world
        self.ctx = {i: dict(c) for i, c in world.qps.items()}

    def tenant_of(self, vid):
        if vid is None or vid == 0:
            return 0
        return self.world.vlans.get(vid)

    def outcome(self, pkt):
        tenant = self.tenant_of(pkt.vid)
        if tenant is None:
            return Outcome(False, 1, tenant=0)
        qp = self.world.flows.get((tenant, pkt.qpn))
        if qp is None:
            return Outcome(False, 2, tenant=tenant)
        ctx = self.ctx[qp]
        if ctx["tenant"] != tenant:
            return Outcome(False, 1, tenant=tenant, qp=qp)
        out = Outcome(True, 0, tenant=tenant, qp=qp)
        kind = mr_kind(pkt.opcode)
        if kind:
            length = 8 if kind == 3 else pkt.length
            reason, bus, span = mr_check(self.world, ctx["tenant"], ctx["pd"], pkt.rkey, pkt.va,
                                         length, _KIND_ACCESS[kind])
            out.mr_kind, out.mr_reason, out.bus_addr, out.span = kind, int(reason), bus, span
            if reason != MrReason.OK:
                out.passed, out.reason = False, _REASON_VERDICT[reason]
                out.bus_addr = out.span = 0
                return out
        out.ctx_state, out.ctx_epsn, out.ctx_msn = ctx["state"], ctx["epsn"], ctx["msn"]
        ctx["epsn"] = (pkt.psn + 1) & 0xFFFFFF
        ctx["msn"] = (ctx["msn"] + 1) & 0xFFFFFF
        return out


def _rc(name):
    return next(c for c, op in H.OPCODES.items() if op.name == f"RC_{name}")


SEND_ONLY = _rc("SEND_ONLY")
WRITE_ONLY = _rc("RDMA_WRITE_ONLY")
WRITE_FIRST = _rc("RDMA_WRITE_FIRST")
WRITE_MIDDLE = _rc("RDMA_WRITE_MIDDLE")
WRITE_ONLY_IMM = _rc("RDMA_WRITE_ONLY_WITH_IMMEDIATE")
READ_REQUEST = _rc("RDMA_READ_REQUEST")
ACK = _rc("ACKNOWLEDGE")
CMP_SWAP = _rc("COMPARE_SWAP")
FETCH_ADD = _rc("FETCH_ADD")
CNP = 0x81
UD_SEND_ONLY = next(c for c, op in H.OPCODES.items() if op.name == "UD_SEND_ONLY")


def attack_packets(world):
    """The cross-tenant attack: tenant 1 (VLAN 100) names tenant 2's QPN 0x222 (unknown to
    tenant 1 -> unknown QP), and tenant 1's own QPN 0x11 with tenant 2's rkey (-> rkey)."""
    vid1 = world.tenant_vid(1)
    key2 = world.key(2)
    va2 = world.mrs[2]["va"]
    return [
        Packet(WRITE_ONLY, 0x222, psn=7, vid=vid1, va=va2, rkey=key2, length=64,
               payload=b"\xEE" * 64, desc="attack: tenant 1 -> tenant 2 QPN 0x222"),
        Packet(WRITE_ONLY, 0x11, psn=8, vid=vid1, va=va2, rkey=key2, length=64,
               payload=b"\xEE" * 64, desc="attack: tenant 1 QPN 0x11 with tenant 2 rkey"),
        Packet(READ_REQUEST, 0x11, psn=9, vid=vid1, va=va2, rkey=key2, length=256,
               desc="attack: tenant 1 reads tenant 2 memory"),
    ]


def coverage_packets(world):
    """One packet per verdict of ``default_world`` (pass, tenant, unknown QP, rkey, access,
    bounds), so a short random trace still reaches every one."""
    vid1 = world.tenant_vid(1)
    mr1, mr3 = world.mrs[1], world.mrs[3]
    return [
        Packet(WRITE_ONLY, 0x11, psn=1, vid=vid1, va=mr1["va"] + 64, rkey=world.key(1), length=32,
               payload=b"\x11" * 32, desc="coverage: legit write"),
        Packet(SEND_ONLY, 0x11, psn=2, vid=300, payload=b"\x22" * 8, desc="coverage: unmapped VLAN"),
        Packet(SEND_ONLY, 0x999, psn=3, vid=vid1, payload=b"\x33" * 8, desc="coverage: unknown QPN"),
        attack_packets(world)[1],
        Packet(WRITE_ONLY, 0x11, psn=4, vid=vid1, va=mr3["va"], rkey=world.key(3), length=16,
               payload=b"\x44" * 16, desc="coverage: write to a read-only region"),
        Packet(WRITE_ONLY, 0x11, psn=5, vid=vid1, va=mr1["va"] + mr1["length"] - 8,
               rkey=world.key(1), length=16, payload=b"\x55" * 16, desc="coverage: past the end"),
    ]


def _legit_access(rng, world, qp_tenant, qp_pd, kind):
    """A (va, rkey, length) the QP may use, or None when it owns no suitable region."""
    need = _KIND_ACCESS[kind]
    mine = [i for i, e in world.mrs.items()
            if e["tenant"] == qp_tenant and e["pd"] == qp_pd and e["access"] & need]
    if not mine:
        return None
    i = rng.choice(mine)
    e = world.mrs[i]
    length = 8 if kind == 3 else rng.choice([0, 1, 64, rng.randrange(1, e["length"] + 1)])
    off = rng.randrange(0, e["length"] - length + 1)
    if kind == 3:
        off &= ~7
    return e["va"] + off, world.key(i), length


def random_trace(seed, count, world=None, *, runs=True):
    """``count`` packets mixing legitimate traffic and every kind of violation, with runs of
    back-to-back packets on one QP (the context store's forwarding case)."""
    world = world or default_world()
    rng = random.Random(f"flow-trace:{seed}")
    out = []
    qp_keys = sorted(world.flows)
    while len(out) < count:
        r = rng.random()
        tenant, qpn = rng.choice(qp_keys)
        vid = world.tenant_vid(tenant)
        if vid is None and rng.random() < 0.2:
            vid = 0                                    # priority tag: still tenant 0
        qp = world.flows[(tenant, qpn)]
        ctx = world.qps[qp]
        psn = rng.randrange(1 << 24)
        if runs and r < 0.15:
            n = rng.randint(4, 12)
            for k in range(n):
                out.append(Packet(SEND_ONLY, qpn, psn=(psn + k) & 0xFFFFFF, vid=vid,
                                  payload=rng.randbytes(rng.choice([0, 4, 16])),
                                  desc=f"run {k + 1}/{n} on QP {qp}"))
        elif r < 0.35:
            kind = rng.choice([1, 1, 2, 3])
            acc = _legit_access(rng, world, ctx["tenant"], ctx["pd"], kind)
            if acc is None:
                continue
            va, key, length = acc
            op = {1: rng.choice([WRITE_ONLY, WRITE_FIRST, WRITE_ONLY_IMM]), 2: READ_REQUEST,
                  3: rng.choice([CMP_SWAP, FETCH_ADD])}[kind]
            payload = rng.randbytes(min(length, 256)) if kind == 1 else b""
            out.append(Packet(op, qpn, psn=psn, vid=vid, va=va, rkey=key, length=length,
                              payload=payload, desc=f"legit {MR_KINDS[kind]} QP {qp}"))
        elif r < 0.55:
            # A violation of the MR rules by an otherwise legitimate QP, mostly on a region of
            # its own (so that the bounds and access checks are the ones that fail).
            own = [j for j, e in world.mrs.items() if (e["tenant"], e["pd"]) == (ctx["tenant"], ctx["pd"])]
            i = rng.choice(own if own and rng.random() < 0.8 else sorted(world.mrs))
            e = world.mrs[i]
            how = rng.choice(["stale_tag", "bad_index", "other_mr", "bounds_low", "bounds_high",
                              "read_only", "wrap"])
            va, key, length, op = e["va"], world.key(i), 64, WRITE_ONLY
            if how == "stale_tag":
                key = make_key(i, e["tag"] ^ 0x5A)
            elif how == "bad_index":
                key = make_key(rng.choice([0, 6, 777, 1024, 0xFFFFFF]), e["tag"])
            elif how == "bounds_low":
                va = (e["va"] - 1) & MASK64
            elif how == "bounds_high":
                va = e["va"] + e["length"] - length + 1
            elif how == "read_only":
                op = WRITE_ONLY if not e["access"] & Access.REMOTE_WRITE else CMP_SWAP
                va &= ~7
            elif how == "wrap":
                va, length = MASK64 - 3, 64
            out.append(Packet(op, qpn, psn=psn, vid=vid, va=va, rkey=key, length=length,
                              payload=rng.randbytes(length), desc=f"violation {how} MR {i} QP {qp}"))
        elif r < 0.65:
            # Unknown QPs: QPNs no tenant has, and other tenants' QPNs.
            other_t, other_q = rng.choice(qp_keys)
            qpn2 = other_q if (tenant, other_q) not in world.flows else rng.randrange(1 << 24)
            if (tenant, qpn2) in world.flows:
                continue
            out.append(Packet(SEND_ONLY, qpn2, psn=psn, vid=vid, payload=b"\x01" * 8,
                              desc=f"unknown QPN {qpn2:#x} for tenant {tenant}"))
        elif r < 0.72:
            out.append(Packet(SEND_ONLY, qpn, psn=psn, vid=rng.choice([300, 4000, 7]),
                              payload=b"\x02" * 8, desc="unmapped VLAN"))
        elif r < 0.75:
            out.extend(replace(p) for p in attack_packets(world))
        else:
            op = rng.choice([SEND_ONLY, ACK, CNP, WRITE_MIDDLE, UD_SEND_ONLY])
            out.append(Packet(op, qpn, psn=psn, vid=vid, payload=rng.randbytes(rng.choice([0, 8, 100])),
                              ipv6=rng.random() < 0.3, desc=f"{H.opcode_name(op)} QP {qp}"))
    return out[:count]
