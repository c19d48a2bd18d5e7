"""Smoke test of ``make bench`` plumbing: the smallest bench run writes a complete report.

Runs ``python -m stellar.sim.bench`` on the parser alone, one width and one size, without
synthesis (about 20 s with a cold Verilator build, 2 s warm), and the flow-table bench alone at
256 entries, two key streams, without synthesis (about 30 s cold, a few seconds warm). It checks
that each report has its shape, not what the numbers are: the benchmark measures, the block
tests assert behaviour.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_quick_writes_report(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "stellar.sim.bench", "--quick", "--no-synth", "--widths", "64",
           "--sizes", "256", "--blocks", "parser", "--out", str(out)]
    # From the repository root, so the simulator build lands in (and is reused from) build/.
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "beats/cycle" in proc.stdout   # the table was printed

    report = json.loads((out / "packet_engine.json").read_text())
    assert {"generated", "git", "mode", "tools", "cycles", "resources", "notes",
            "line_rate_violations", "elapsed_s"} <= report.keys()
    assert report["mode"] == "quick" and report["resources"] == []
    (case,) = report["cycles"]
    assert (case["block"], case["width"], case["size"], case["frame_bytes"]) == ("parser", 64, 256, 254)
    assert case["ok"], case["errors"]
    for key in ("beats", "cycles", "beats_per_cycle", "bubbles", "max_bubble", "stalls", "trace"):
        assert key in case["ports"]["in"]
    assert {"first", "min", "max", "by_opcode"} <= case["latency"].keys()
    assert (out / "packet_engine.md").read_text().startswith("# Packet engine benchmark")


def test_bench_flow_quick_writes_report(tmp_path):
    """The flow-table bench (block ``flow``) at a small capacity, two key streams, no synthesis
    (about 30 s with a cold Verilator build, a few seconds warm)."""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "stellar.sim.bench", "--quick", "--no-synth", "--blocks", "flow",
           "--flow-capacities", "256", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "results/cycle" in proc.stdout   # the table was printed
    assert not (out / "packet_engine.json").exists()   # only the flow bench ran

    report = json.loads((out / "flow_table.json").read_text())
    assert {"generated", "git", "mode", "plan", "tools", "summary", "runs", "resources", "notes",
            "elapsed_s"} <= report.keys()
    assert report["mode"] == "quick" and report["resources"] == []
    assert [(r["capacity"], r["keys"]) for r in report["runs"]] == [(256, "random:1"), (256, "random:2")]
    run = report["runs"][0]
    assert all(r["ok"] for r in report["runs"]), [r["errors"] for r in report["runs"]]
    assert set(run["phases"]) == {"fill", "idle", "churn", "empty"}     # churn: first run only
    for phase in run["phases"].values():
        assert {"lookups", "results", "cycles", "results_per_cycle"} <= phase.keys()
    assert {"min", "max", "histogram"} <= run["latency"].keys()
    assert 0 < run["load_at_full"] <= 1 + 4 / 256      # stash included
    assert len(run["insert_cycles"]["bands"]) == 10
    (summary,) = report["summary"]
    assert summary["capacity"] == 256 and summary["load_at_full_random"]["n"] == 2
    assert (out / "flow_table.md").read_text().startswith("# Flow table benchmark")
