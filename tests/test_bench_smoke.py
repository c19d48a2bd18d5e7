"""Smoke test of ``make bench`` plumbing: the smallest bench run writes a complete report.

Runs ``python -m stellar.sim.bench`` on the parser alone, one width and one size, without
synthesis (about 20 s with a cold Verilator build, 2 s warm). It checks that the report has its
shape, not what the numbers are: the benchmark measures, the block tests assert behaviour.
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
