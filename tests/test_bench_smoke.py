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


def test_bench_cc_report_from_runs(tmp_path):
    """The congestion-control bench's report and plots from run files shaped like the ones
    ``stellar.sim.tb_cc`` writes (the runs themselves are the cocotb tests' business)."""
    from stellar.sim import bench_cc
    runs = tmp_path / "cc_runs"
    runs.mkdir()
    for mode in ("DCQCN", "FLOWMATRIX"):
        series = {str(q): [[t, 100 + q + (t // 1000) % 3] for t in range(0, 20000, 1000)]
                  for q in (1, 2)}
        counters = {"a": {"cc": {"cnp_received": 7}, "transport": {"retransmits": 0}},
                    "switch": {"a->b": {"ecn_marked": 9, "dropped": 0, "queue_dropped": 0}}}
        (runs / f"incast_{mode.lower()}_2.json").write_text(json.dumps({
            "mode": mode, "flows": 2, "us_cycles": 125, "jain_last_half": 0.99,
            "utilization_last_half": 0.9, "queue_peak": 5000, "queue_mean": 1200.0,
            "counters": counters, "rp_series": series, "wire_series": series,
            "queue_samples": [[0, 0], [100, 3000], [200, 1000]]}))
    (runs / "cnp_latency.json").write_text(json.dumps({"cycles": 40, "rp_cycles": 6,
                                                       "rate": 8008, "line": 16000}))
    (runs / "bucket_accuracy.json").write_text(json.dumps(
        {"line": 640, "results": [{"cap": 64, "measured": 64.1, "error": 0.0016}]}))
    rows = bench_cc.summarize(runs)
    assert [(r["mode"], r["flows"]) for r in rows["incast"]] == [("DCQCN", 2), ("FLOWMATRIX", 2)]
    assert rows["incast"][0]["conv_us"] == 0
    table = bench_cc.markdown(rows)
    assert "| 2 | DCQCN | 0.990 | 90.0 % |" in table and "**40 cycles**" in table
    pngs = bench_cc.plots(runs, tmp_path)
    assert len(pngs) == 3 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_bench_host_report_from_a_run(tmp_path):
    """The host bench's plan and report: the document of a small run shaped as
    ``stellar.sim.tb_cli`` writes it for a ``bench`` request (PerfResult dicts from
    ``stellar.host.perf``; the simulation itself is tests/cocotb/test_cli_cocotb.py's business)."""
    from stellar.host.perf import LatencyStats, PerfResult
    from stellar.sim import bench_host
    runs = bench_host.plan(quick=True, sizes=[64, 4096])
    assert [r["label"] for r in runs] == ["bandwidth", "bandwidth", "mmio_unbatched",
                                         "mmio_batched", "completion_latency", "pingpong_latency"]
    for r in runs:      # every request is one host.perf accepts (a full queue holds a signaled WR)
        assert r["command"] == "perf" and 1 <= r["batch"] <= r["tx_depth"]
        assert 1 <= r["signal_every"] <= r["tx_depth"] - r["batch"] + 1
        assert r["test"] == "write_lat" or r["iters"] % r["batch"] == 0

    def result(req, size):
        n, hz = req["iters"], 250e6
        seconds = n * (size + 200) / 1e9
        lists = -(-n // req["batch"])
        return PerfResult(test=req["test"], size=size, iters=n, tx_depth=req["tx_depth"],
                          batch=req["batch"], signal_every=req["signal_every"], bytes=n * size,
                          messages=n, seconds=seconds, clock="simulated", hz=hz,
                          latency=LatencyStats.of([(300 + i) / hz for i in range(8)], hz),
                          mmio_writes=lists, mmio_reads=0, sq_doorbells=lists, verified=True)
    doc = {"command": "bench", "simulated": {"seed": 7, "pause": 0.0},
           "docs": [{"label": req["label"], "command": "perf", "test": req["test"],
                     "runs": [{"result": result(req, s).to_dict(), "counters": {}}
                              for s in req["sizes"]]} for req in runs]}
    table = bench_host.write_report(doc, tmp_path, elapsed_s=1.0, mode="quick")
    assert table.startswith("### Host driver and host queues")
    assert "| 4096 | 8 | " in table and "| 8 | 1 in 8 | 64 | 8 | 8 | 0 | 0.125 | 0.000 |" in table
    assert "| doorbell to CQE in memory | 64 | 8 | 300 | 304 | 307 | 307 |" in table
    report = json.loads((tmp_path / "host_perf.json").read_text())
    assert {"generated", "seed", "pause", "mode", "elapsed_s", "rows", "simulation"} <= report.keys()
    assert [r["size"] for r in report["rows"]["bandwidth"]] == [64, 4096]
    assert report["rows"]["mmio"][0]["writes_per_wr"] == 1.0
    assert (tmp_path / "host_perf.md").read_text() == table
