# Ref: IBTA Vol 1 Annex A17 (RoCEv2)
"""cocotb testbench of ``stellar_rxflow`` (parser -> ICRC -> VLAN tenant -> flow table -> MR
check -> QP context, with the deparser and the annotation stream as observers).

The host side is the real driver code (``stellar.host.tables.Tables``) over cocotbext-axi's
``AxiLiteMaster``; the golden model is ``stellar.sim.flowmodel`` (tables as programmed, rules
from the spec, scapy-built packets). Random idle cycles and backpressure on every stream.

Parameters: ``STELLAR_TB_WIDTH``, ``STELLAR_TB_QPS``, ``STELLAR_TB_FRAMES``, ``STELLAR_TB_PAUSE``;
``sim_trace`` (the ``make sim`` job) also reads ``STELLAR_TB_OUT`` and writes summary.json,
annotations.json and the pcaps there.
"""

import json
import os
import random
from pathlib import Path

import cocotb
from cocotb.triggers import Timer, with_timeout
from cocotbext.axi import (
    AxiLiteBus,
    AxiLiteMaster,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)
from stellar.hdl.flow.fields import MR_ENTRY, QP_CONTEXT, Access, QpState, make_key
from stellar.hdl.regmap import FEATURE_FLOW, FEATURE_MR, FEATURE_QPCTX, MAGIC, REGMAP, decode_feature
from stellar.hdl.top.rxflow import ANN_WORD
from stellar.host.tables import Tables

from . import packets
from .flowmodel import (
    SEND_ONLY,
    FlowModel,
    Packet,
    attack_packets,
    coverage_packets,
    default_world,
    random_trace,
)
from .tb import TB, AxilRegs, pause_generator, tb_param

BLOCK_COUNTERS = {b: [r.name for r in REGMAP.block(b).counters] for b in ("pktengine", "flow", "mr")}
VERDICT_COUNTER = {1: "flow.rx_drop_tenant", 2: "flow.rx_drop_unknown_qp", 3: "mr.rx_drop_rkey",
                   4: "mr.rx_drop_access", 5: "mr.rx_drop_bounds"}


class RxFlowTB(TB):
    def __init__(self, dut, pause=None):
        super().__init__(dut)
        self.width = tb_param("width")
        self.qps = tb_param("qps", int, 4096)
        self.nbytes = self.width // 8
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_rx"), dut.clk, dut.rst)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_tx"), dut.clk, dut.rst)
        self.ann = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_ann"), dut.clk, dut.rst)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        self.tables = Tables(AxilRegs(self.axil))
        if pause is None:
            pause = tb_param("pause", float, 0.3)
        if pause:
            self.source.set_pause_generator(pause_generator(pause, name="rx"))
            self.sink.set_pause_generator(pause_generator(pause, name="tx"))
            self.ann.set_pause_generator(pause_generator(pause, name="ann"))
            self.axil.read_if.ar_channel.set_pause_generator(pause_generator(pause, name="ar"))
            self.axil.read_if.r_channel.set_pause_generator(pause_generator(pause, name="r"))

    async def counters(self):
        out = {}
        for block, names in BLOCK_COUNTERS.items():
            for n in names:
                out[f"{block}.{n}"] = await self.axil.read_dword(REGMAP[f"{block}.{n}"].offset)
        return out

    async def program(self, world):
        """Everything the host sets up before traffic: VLAN map, QP contexts, flows, MRs."""
        t = self.tables
        for vid, tenant in world.vlans.items():
            await t.map_vlan(vid, tenant or 0, mapped=tenant is not None)
        for index, ctx in world.qps.items():
            await t.write_qp(index, ctx)
        for (tenant, qpn), index in world.flows.items():
            await t.insert_flow(tenant, qpn, index)
        for slot, addr in world.pages.items():
            await t.write_page(slot, addr)
        for index, e in world.mrs.items():
            await t._mr_command(1, index, _mr_word(e))

    async def run(self, pkts, model, *, extra_frames=(), non_roce=()):
        """Send ``pkts``, then ``non_roce`` frames (they pass the lookups untouched) and
        ``extra_frames`` (the packet engine drops them: they never reach the lookups); check
        every annotation word, every transmitted frame and every counter."""
        before = await self.counters()
        expected = [model.outcome(p) for p in pkts]
        frames = [p.frame() for p in pkts]
        for f in [*frames, *non_roce, *extra_frames]:
            await self.source.send(AxiStreamFrame(f))
        timeout = 200 + sum(-(-len(f) // self.nbytes) + 8 for f in frames) * 40 * 4 // 1000
        anns = []
        for _ in range(len(pkts) + len(non_roce)):
            a = await with_timeout(self.ann.recv(), timeout, "us")
            anns.append(ANN_WORD.unpack(int.from_bytes(bytes(a.tdata), "little")))
        for i, a in enumerate(anns[len(pkts):]):
            assert (a["passed"], a["roce"], a["reason"], a["tenant"], a["qp"], a["mr_kind"]) == \
                (1, 0, 0, 0, 0, 0), f"non-RoCE frame {i}: {a}"
        anns = anns[:len(pkts)]
        passed = [f for f, e in zip(frames, expected, strict=True) if e.passed] + list(non_roce)
        got = []
        for _ in passed:
            got.append(bytes((await with_timeout(self.sink.recv(), timeout, "us")).tdata))
        await self.source.wait()   # the frames the engine drops go last: all of them sent
        await Timer(2, "us")
        assert self.ann.empty(), "more annotation words than frames"
        assert self.sink.empty(), "more transmitted frames than passed frames"
        for i, (p, e, a) in enumerate(zip(pkts, expected, anns, strict=True)):
            want = {"passed": int(e.passed), "reason": e.reason, "roce": 1, "tenant": e.tenant,
                    "qp": e.qp, "mr_kind": e.mr_kind, "opcode": p.opcode, "dest_qp": p.qpn,
                    "psn": p.psn, "bus_addr": e.bus_addr, "span": e.span}
            if e.mr_kind:
                want["mr_reason"] = e.mr_reason
            if e.passed:
                want.update(ctx_state=e.ctx_state, ctx_epsn=e.ctx_epsn, ctx_msn=e.ctx_msn)
            diff = {k: (a[k], v) for k, v in want.items() if a[k] != v}
            assert not diff, f"packet {i} ({p.desc}): (got, want) {diff}"
        for n, (g, w) in enumerate(zip(got, passed, strict=True)):
            assert g == w, f"passed frame {n} changed: got {g[:64].hex()} want {w[:64].hex()}"
        after = await self.counters()
        delta = {k: (after[k] - before[k]) & 0xFFFFFFFF for k in after}
        assert delta["flow.rx_lookups"] == len(pkts), delta
        for v, name in VERDICT_COUNTER.items():
            n = sum(1 for e in expected if not e.passed and e.reason == v)
            assert delta[name] == n, f"{name}: {delta[name]} != {n}"
        assert delta["mr.rx_mr_checks"] == sum(1 for e in expected if e.mr_kind), delta
        assert delta["pktengine.tx_frames"] == len(passed), delta
        assert delta["pktengine.rx_frames"] == len(pkts) + len(non_roce) + len(extra_frames), delta
        self.last_tx = got
        return expected, anns, delta


def _mr_word(e):
    return MR_ENTRY.pack(e)


@cocotb.test()
async def host_tables(dut):
    """The register map and the driver's table access: ident lists the flow, qpctx and mr
    blocks; VLAN map, flow table, QP contexts (masked writes), MR entries and pages read back
    as written; flow statuses OK / EXISTS / NOT_FOUND; config reports the build."""
    tb = RxFlowTB(dut)
    await tb.reset()
    axil, t = tb.axil, tb.tables
    assert await axil.read_dword(REGMAP["ident.id"].offset) == MAGIC
    n = await axil.read_dword(REGMAP["ident.feature_count"].offset)
    feats = {decode_feature(await axil.read_dword(0x10 + 4 * i))[0] for i in range(n)}
    assert {FEATURE_FLOW, FEATURE_QPCTX, FEATURE_MR} <= feats
    cfg = await t.config()
    assert cfg["qps"] == tb.qps and cfg["ways"] >= 2, cfg

    await t.map_vlan(100, 7)
    await t.map_vlan(200, 9, mapped=False)
    assert await t.vlan_tenant(100) == (True, 7)
    assert await t.vlan_tenant(200) == (False, 9)
    assert await t.vlan_tenant(300) == (False, 0)

    r = await t.insert_flow(3, 0xABCDEF, 17)
    assert r.status == 0 and r.cycles > 0
    r = await t.flow_command(1, 3, 0xABCDEF, 18)
    assert (r.status, r.value) == (1, 17), r          # EXISTS, value kept
    assert await t.lookup_flow(3, 0xABCDEF) == 17
    assert await t.lookup_flow(4, 0xABCDEF) is None   # another tenant's QPN space
    assert (await t.flow_command(2, 3, 0xABCDEF)).status == 0
    assert (await t.flow_command(2, 3, 0xABCDEF)).status == 3
    assert await t.lookup_flow(3, 0xABCDEF) is None
    assert await t.flow_occupancy() == (0, 0)

    rng = random.Random(cocotb.RANDOM_SEED)
    full = {f.name: rng.randrange(1 << f.width) for f in QP_CONTEXT}
    await t.write_qp(tb.qps - 1, full)
    assert await t.read_qp(tb.qps - 1) == full
    await t.write_qp(tb.qps - 1, state=QpState.ERROR, epsn=0x123456)
    assert await t.read_qp(tb.qps - 1) == {**full, "state": QpState.ERROR, "epsn": 0x123456}

    world = default_world()
    for slot, addr in world.pages.items():
        await t.write_page(slot, addr)
    for index, e in world.mrs.items():
        await t._mr_command(1, index, _mr_word(e))
    for slot, addr in world.pages.items():
        assert await t.read_page(slot) == addr
    for index, e in world.mrs.items():
        assert await t.read_mr(index) == e, index

    # The driver's own MR registration: contiguous and page list, then invalidation.
    key = await t.write_mr(7, tag=0x5A, tenant=3, pd=33, access=Access.REMOTE_WRITE | Access.REMOTE_READ,
                           va=0x1234_5000, length=0x2000, bus_base=0xDEAD_0000)
    assert key == make_key(7, 0x5A)
    assert await t.read_mr(7) == MR_ENTRY.unpack(MR_ENTRY.pack(
        valid=1, tag=0x5A, tenant=3, pd=33, access=6, va=0x1234_5000, length=0x2000,
        bus_base=0xDEAD_0000))
    pages = [0x7_0000_0000 + 0x1000 * i for i in range(3)]
    await t.write_mr(8, tag=1, tenant=3, pd=33, access=Access.REMOTE_ATOMIC, va=0x800, length=0x2800,
                     pages=pages, page_shift=12, pbl_index=100)
    got = await t.read_mr(8)
    assert (got["page_list"], got["pbl_index"], got["page_shift"], got["bus_base"]) == (1, 100, 12, 0)
    assert [await t.read_page(100 + i) for i in range(3)] == pages
    await t.invalidate_mr(7)
    assert (await t.read_mr(7))["valid"] == 0


@cocotb.test()
async def multi_tenant_trace(dut):
    """A random multi-tenant trace (legitimate traffic, runs of packets on one QP, unknown QPs,
    unmapped VLANs, every MR violation, the cross-tenant attack, parser drops in between): every
    annotation word (verdict, tenant, QP, MR answer, the context each packet saw), every passed
    frame byte for byte, every counter."""
    tb = RxFlowTB(dut)
    await tb.reset()
    world = default_world()
    await tb.program(world)
    model = FlowModel(world)
    pkts = random_trace(cocotb.RANDOM_SEED, tb_param("frames", int, 200), world)
    rng = random.Random(cocotb.RANDOM_SEED)
    for p in coverage_packets(world):       # every verdict, whatever the random draw
        pkts.insert(rng.randrange(len(pkts) + 1), p)
    # Frames the packet engine drops never reach the lookups; they go last so ordering is plain.
    bad = [packets.corrupted_frame("icrc_payload", rng)[0] for _ in range(3)]
    others = [packets.non_roce_frame(k, rng, vlan=rng.random() < 0.5)[0]
              for k in list(packets.NON_ROCE_KINDS)[:4]]
    expected, _anns, delta = await tb.run(pkts, model, extra_frames=bad, non_roce=others)
    assert delta["pktengine.rx_drop_icrc"] == len(bad)
    kinds = {e.reason for e in expected}
    assert kinds == {0, 1, 2, 3, 4, 5}, f"the trace reached only verdicts {kinds}"


@cocotb.test()
async def context_forwarding(dut):
    """Back-to-back minimum-size packets on one QP, without gaps on the input: each packet sees
    the context the previous one wrote (epsn = previous PSN + 1, msn + 1), interleaved with
    another QP; then a host masked write during traffic loses no update."""
    tb = RxFlowTB(dut, pause=0.0)
    await tb.reset()
    world = default_world()
    await tb.program(world)
    model = FlowModel(world)
    vid = world.tenant_vid(1)
    pkts = [Packet(SEND_ONLY, 0x11 if k % 5 else 0x333, psn=1000 + k, vid=vid, desc=f"run {k}")
            for k in range(60)]
    await tb.run(pkts, model)
    # Host write of traffic_class while packets for the same QP stream through.
    more = [Packet(SEND_ONLY, 0x11, psn=2000 + k, vid=vid) for k in range(40)]
    for p in more:
        await tb.source.send(AxiStreamFrame(p.frame()))
    await tb.tables.write_qp(2, traffic_class=0x68)
    for p in more:
        model.outcome(p)
    for _ in more:
        await with_timeout(tb.ann.recv(), 200, "us")
        await with_timeout(tb.sink.recv(), 200, "us")
    ctx = await tb.tables.read_qp(2)
    assert ctx["traffic_class"] == 0x68
    assert (ctx["epsn"], ctx["msn"]) == (model.ctx[2]["epsn"], model.ctx[2]["msn"]), ctx


@cocotb.test()
async def attack(dut):
    """The cross-tenant attack alone: a tenant-1 packet naming tenant 2's QPN and rkey is
    dropped and counted; the same request from tenant 2 passes."""
    tb = RxFlowTB(dut)
    await tb.reset()
    world = default_world()
    await tb.program(world)
    model = FlowModel(world)
    pkts = attack_packets(world)
    legit = [Packet(p.opcode, 0x11, psn=p.psn, vid=world.tenant_vid(2), va=p.va, rkey=p.rkey,
                    length=p.length, payload=p.payload, desc="tenant 2 itself") for p in pkts]
    expected, _, delta = await tb.run(pkts + legit, model)
    assert [e.verdict for e in expected] == ["unknown_qp", "rkey", "rkey", "pass", "pass", "pass"]
    assert delta["flow.rx_drop_unknown_qp"] == 1 and delta["mr.rx_drop_rkey"] == 2


@cocotb.test(skip=os.environ.get("STELLAR_TB_OUT") is None)
async def sim_trace(dut):
    """The ``make sim`` job: program the world, send the trace, write what came out."""
    tb = RxFlowTB(dut, pause=0.0)
    await tb.reset()
    out = Path(os.environ["STELLAR_TB_OUT"])
    world = default_world()
    await tb.program(world)
    model = FlowModel(world)
    pkts = random_trace(int(os.environ.get("STELLAR_TB_SEED", "1")), tb_param("frames", int, 300),
                        world)
    pkts = pkts[:20] + attack_packets(world) + pkts[20:]
    packets.write_pcap(out / "rx.pcap", [p.frame() for p in pkts])
    expected, anns, delta = await tb.run(pkts, model)
    rows = [{"desc": p.desc, "vid": p.vid, "opcode": p.opcode, "ann": a,
             "expected": {"passed": e.passed, "reason": e.reason}} for p, e, a in zip(pkts, expected, anns,
                                                                                     strict=True)]
    packets.write_pcap(out / "tx.pcap", tb.last_tx)
    (out / "annotations.json").write_text(json.dumps(rows, indent=1))
    (out / "summary.json").write_text(json.dumps({"width": tb.width, "qps": tb.qps, "counters": delta,
                                                  "frames": len(pkts)}, indent=1))

