"""stellar.sim.timing: the out-of-context timing targets (no synthesis or place and route here).

Each of NicCore's blocks is a target built with the parameters NicCore gives it (checked
against the submodules of ``NicCore.elaborate`` at the ECPIX-5 configuration), and every target
elaborates inside the PortRegisters harness to RTLIL.
"""

import json

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Shape
from stellar.hdl.top.nic import NicCore
from stellar.sim import timing
from stellar.sim.timing import TARGETS, PortRegisters, board_config

# the signature checks build components they never elaborate
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl._ir.UnusedElaboratable")

# target -> NicCore's submodule name
NIC_BLOCKS = {"rxflow": "pipe", "transport": "transport", "txbuild": "builder",
              "deparser": "deparser", "dma": "dma", "csr": "csr", "cc": "cc"}
# target -> submodule name inside NicCore's receive pipeline (RxFlowPipeline)
RX_BLOCKS = {"rxparser": "parser", "flowtable": "flow", "mr": "mr", "qpctx": "store"}
# the attributes that tell two instances' parameters apart (where the class keeps them)
PARAMS = ("data_width", "qps", "sq_depth", "rq_depth", "mr_entries", "mr_pages", "index_bits",
          "pass_mr_failures", "capacity", "entries", "pages", "depth", "user_width", "queue",
          "record_fields", "wb_fields")


def _kw(cfg, **over):
    kw = dict(qps=cfg.qps, width=cfg.data_width, tenants=256, classes=8, sq_depth=cfg.sq_depth,
              rq_depth=cfg.rq_depth, mr_entries=cfg.mr_entries, mr_pages=cfg.mr_pages)
    kw.update(over)
    return kw


@pytest.fixture(scope="module")
def nic_blocks():
    cfg = board_config("ecpix5")
    nic = NicCore(cfg.data_width, qps=cfg.qps, sq_depth=cfg.sq_depth, rq_depth=cfg.rq_depth,
                  mr_entries=cfg.mr_entries, mr_pages=cfg.mr_pages)
    m = nic.elaborate(None)
    blocks = {t: m.submodules[name] for t, name in NIC_BLOCKS.items()}
    rx = blocks["rxflow"].elaborate(None)
    blocks.update({t: rx.submodules[name] for t, name in RX_BLOCKS.items()})
    return cfg, blocks


def test_targets_cover_nic_blocks():
    assert set(NIC_BLOCKS) | set(RX_BLOCKS) <= set(TARGETS)
    assert board_config("ecpix5").qps == 256


@pytest.mark.parametrize("target", sorted(NIC_BLOCKS) + sorted(RX_BLOCKS))
def test_target_matches_nic_submodule(nic_blocks, target):
    cfg, blocks = nic_blocks
    ref = blocks[target]
    comp = TARGETS[target](**_kw(cfg))
    assert type(comp) is type(ref)
    assert comp.signature == ref.signature
    for attr in PARAMS:
        if hasattr(ref, attr):
            assert getattr(comp, attr) == getattr(ref, attr), attr


@pytest.mark.parametrize("target", ["rxflow", "transport", "txbuild", "deparser", "dma", "csr",
                                    "rxparser", "flowtable", "mr", "qpctx"])
def test_target_elaborates(target):
    # 16 QPs keeps the conversion quick; the signature test above covers the ECPIX-5 sizes
    comp = TARGETS[target](**_kw(board_config("ecpix5"), qps=16))
    top = PortRegisters(comp)
    text = rtlil.convert(top, name=f"{target}_top")
    assert "module \\" + f"{target}_top" in text
    assert top.port_bits == sum(Shape.cast(m.shape).width for _, m, _ in
                                top.signature.flatten(top))


def test_cli_builds_target_with_options(monkeypatch, tmp_path):
    seen = {}

    def fake_run(comp, name, **kw):
        seen.update(comp=comp, name=name, **kw)
        return timing.TimingResult(name=name, target_mhz=kw["freq"], fmax={"clk": 200.0},
                                   cells={"LUT4": 1}, utilisation={})

    monkeypatch.setattr(timing, "run_timing", fake_run)
    rc = timing.main(["transport", "--qps", "32", "--width", "64", "--sq-depth", "8",
                      "--device", "um5g-85k", "--speed", "8", "--seed", "3", "--router",
                      "router2"])
    assert rc == 0
    assert seen["name"] == "transport_top" and seen["device"] == "um5g-85k" and seen["speed"] == 8
    assert seen["router"] == "router2"
    assert seen["seed"] == 3 and seen["workdir"].name == "transport_top_um5g-85k_s8"
    assert seen["comp"].qps == 32 and seen["comp"].sq_depth == 8
    assert seen["comp"].rq_depth == board_config("ecpix5").rq_depth
    # the CC targets keep their options
    assert timing.main(["rp", "--qps", "8", "--freq", "100"]) == 0
    assert seen["name"] == "rp_top" and seen["freq"] == 100.0 and seen["router"] is None
    assert seen["workdir"].name == "rp_top"


def _cell(kind, inputs=(), outputs=(), params=None):
    conns = {p: [b] for p, b in (*inputs, *outputs)}
    dirs = {p: "input" for p, _ in inputs} | {p: "output" for p, _ in outputs}
    return {"type": kind, "connections": conns, "port_directions": dirs,
            "parameters": params or {}}


def test_logic_depth_ranks_paths_by_block_pair():
    """A hand-made netlist with known depths (weights from DEPTH_WEIGHTS and friends):
    flip-flop -> 2 LUTs -> flip-flop in another block; block RAM output -> LUT -> flip-flop;
    a carry chain entered at its first cell, leaving at the second's carry out; a combinational
    loop, which must end the search rather than hang it."""
    w, hop, ram = (timing.DEPTH_WEIGHTS["LUT4"], timing.DEPTH_CARRY_HOP,
                   timing.DEPTH_SOURCES["DP16KD"])
    cells = {
        "flat.inner.a.x_ff": _cell("TRELLIS_FF", [("DI", 20)], [("Q", 2)]),
        "l1": _cell("LUT4", [("A", 2), ("B", "0")], [("Z", 3)]),
        "l2": _cell("LUT4", [("A", 3)], [("Z", 4)]),
        "flat.inner.b.y_ff": _cell("TRELLIS_FF", [("DI", 4)], [("Q", 21)]),
        "flat.inner.r.mem": _cell("DP16KD", [("ADA0", 21)], [("DOA0", 5)]),
        "l3": _cell("LUT4", [("A", 5)], [("Z", 6)]),
        "flat.inner.c.z_ff": _cell("TRELLIS_FF", [("DI", 6)], [("Q", 22)]),
        "c1": _cell("CCU2C", [("A0", 2), ("CIN", "0")], [("COUT", 7), ("S0", 8)]),
        "c2": _cell("CCU2C", [("CIN", 7)], [("COUT", 9), ("S0", 10)]),
        "flat.inner.d.v_ff": _cell("TRELLIS_FF", [("DI", 9)], [("Q", 23)]),
        "loop1": _cell("LUT4", [("A", 12), ("B", 22)], [("Z", 13)]),
        "loop2": _cell("LUT4", [("A", 13)], [("Z", 12)]),
        "flat.inner.e.u_ff": _cell("TRELLIS_FF", [("DI", 13)], [("Q", 24)]),
    }
    netnames = {"flat.inner.a.x": {"bits": [2]}, "flat.inner.a.x_lut": {"bits": [3]},
                "flat.inner.r.rdata": {"bits": [5]}, "flat.inner.c.z": {"bits": [22]},
                "flat.inner.b.y": {"bits": [21]}, "$auto$1": {"bits": [20]}}
    netlist = {"modules": {"top": {"attributes": {"top": "1"}, "cells": cells,
                                   "netnames": netnames}}}
    rows = timing.logic_depth(json.dumps(netlist), n=10)
    got = {(r["start"], r["end"]): r for r in rows}
    assert [r["depth"] for r in rows] == sorted((r["depth"] for r in rows), reverse=True)
    assert got[("flat.inner.r.rdata", "flat.inner.c.z_ff.DI")]["depth"] == ram + w
    assert got[("flat.inner.r.rdata", "flat.inner.c.z_ff.DI")]["blocks"] == ["r", "c"]
    assert got[("flat.inner.a.x", "flat.inner.b.y_ff.DI")]["depth"] == 2 * w
    assert got[("flat.inner.a.x", "flat.inner.b.y_ff.DI")]["blocks"] == ["a", "b"]
    assert got[("flat.inner.a.x", "flat.inner.d.v_ff.DI")]["depth"] == pytest.approx(w + hop)
    loop = [r for r in rows if r["end"] == "flat.inner.e.u_ff.DI"]
    assert len(loop) == 1 and loop[0]["depth"] >= 2 * w     # c.z -> loop1 (-> loop2 -> loop1)
    # one row per (start block, end block): the ram -> c.z path is also the worst into c
    assert len({(timing._block_of(r["start"]), r["end"].split(".")[2]) for r in rows}) == len(rows)


def test_block_resources_counts_cells_where_they_feed():
    """A hand-made netlist: cells named by the net they drive count in that net's block; ABC's
    unnamed LUTs count with the named cell they feed, through a chain of them; a block RAM is
    named by its output; a cell that feeds nothing named is "?"; ``levels`` cuts the name."""
    cells = {
        "$abc$1": _cell("LUT4", [("A", 2)], [("Z", 3)]),             # -> $abc$2 -> a.x FF
        "$abc$2": _cell("LUT4", [("A", 3)], [("Z", 4)]),
        "$auto$ff1": _cell("TRELLIS_FF", [("DI", 4)], [("Q", 5)]),   # Q named flat.inner.a.x
        "$abc$3": _cell("LUT4", [("A", 5)], [("Z", 6)]),             # named b.w
        "$auto$ff2": _cell("TRELLIS_FF", [("DI", 6)], [("Q", 7)]),   # Q only a $ net: p.q's
        "$abc$4": _cell("LUT4", [("A", 7)], [("Z", 8)]),             # feeds the RAM
        "mem": _cell("DP16KD", [("DIA0", 8)], [("DOA0", 9)]),        # DOA0 named p.q.r.rdata
        "$abc$5": _cell("LUT4", [("A", 9)], [("Z", 10)]),            # feeds nothing named
    }
    netnames = {"flat.inner.a.x": {"bits": [5]}, "flat.inner.b.w": {"bits": [6]},
                "flat.inner.p.q.r.rdata": {"bits": [9]}, "$abc$net": {"bits": [3, 4, 8, 10]},
                "$auto$q": {"bits": [7]}}
    netlist = {"modules": {"top": {"attributes": {"top": "1"}, "cells": cells,
                                   "netnames": netnames}}}
    got = timing.block_resources(json.dumps(netlist))
    assert got == {"a": {"LUT4": 2, "TRELLIS_FF": 1}, "b": {"LUT4": 1},
                   "p.q": {"TRELLIS_FF": 1, "LUT4": 1, "DP16KD": 1}, "?": {"LUT4": 1}}
    assert timing.block_resources(netlist, levels=3)["p.q.r"] == {"TRELLIS_FF": 1, "LUT4": 1,
                                                                 "DP16KD": 1}
    table = timing.format_blocks(got).splitlines()
    assert table[1].split()[:3] == ["a", "2", "0"] and table[-1].split()[1] == "5"
