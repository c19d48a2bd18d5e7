"""``make bench``, congestion-control part: DCQCN and the experimental FlowMatrix mode on an
incast of 2, 4 and 8 flows, token-bucket accuracy, strict priority and tenant buckets, and the
cycles from a CNP's arrival to the pacer's new rate.

A report, not a test. Writes ``build/bench/cc.json``, ``cc.md`` and PNG plots (rate versus time
per flow, DCQCN and FlowMatrix side by side; the switch queue) under ``build/bench/``::

    python -m stellar.sim.bench_cc              # full runs
    python -m stellar.sim.bench_cc --quick      # shorter runs, 2 and 4 flows

Setup (``stellar.sim.tb_cc``): two 64-bit NIC cores; NIC A sends 16 KiB RDMA WRITEs on N QPs to
NIC B through a switch port that drains at half of A's line rate and marks CE with RED (Kmin 4000
B, Kmax 16000 B, Pmax 0.2). Incast time base: 125 cycles per microsecond (a 125 MHz clock: line
8 Gb/s, port 4 Gb/s) with the DCQCN timers shortened so a run of 200k cycles (1.6 ms) holds
many of them (``tb_cc.INCAST_DCQCN``: rate timer 20 us, alpha period 10 us, byte counter 16 KiB,
AI 40 / HAI 200 Mb/s; CNPs at most every 4 us per QP). The bucket, tenant and priority cases
run at 10 cycles per microsecond (line 640 Mb/s), the CNP latency case at 250.

Convergence time: the first sample of the reaction points' rates after which their Jain index
stays >= 0.95 to the end of the run. Jain index and utilization: wire rates over the second half.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["main", "plan"]

ROOT = Path("build")


def plan(quick):
    cycles = 80_000 if quick else 200_000
    flows = (2, 4) if quick else (2, 4, 8)
    cases = [{"case": "cnp_latency"}, {"case": "bucket_accuracy"},
             {"case": "tenants"}, {"case": "priority"}]
    for n in flows:
        for mode in ("dcqcn", "flowmatrix"):
            cases.append({"case": "incast", "flows": n, "mode": mode, "cycles": cycles,
                          "check": 0})
    return cases


def run_case(params, out_dir):
    from stellar.hdl.top.nic import PAIR_NAME

    from .nic import pair_verilog
    from .runner import run_cocotb, tb_env
    from .verilog import param_slug
    params = {"width": 64, **params, "out": str(out_dir / "cc_runs")}
    case = params.pop("case")
    run_cocotb(toplevel=PAIR_NAME, verilog_sources=[pair_verilog(64)],
               test_module="stellar.sim.tb_cc", params_slug=param_slug({"width": 64}),
               testcase=case, extra_env=tb_env(params))


def convergence(rp_series, us_cycles, threshold=0.95):
    """First sample time (cycles) after which the Jain index of the flows' rates stays above
    ``threshold``; None if it never does."""
    from .switch import jain
    flows = list(rp_series.values())
    n = min(len(s) for s in flows)
    t_conv = None
    for i in range(n):
        j = jain([s[i][1] for s in flows])
        if j >= threshold:
            if t_conv is None:
                t_conv = flows[0][i][0]
        else:
            t_conv = None
    return t_conv


def summarize(runs_dir):
    rows = {"incast": [], "extra": {}}
    for p in sorted(runs_dir.glob("*.json")):
        d = json.loads(p.read_text())
        if p.name.startswith("incast_"):
            sw = next(iter(d["counters"]["switch"].values()))
            t = convergence({k: v for k, v in d["rp_series"].items()}, d["us_cycles"])
            rows["incast"].append({
                "mode": d["mode"], "flows": d["flows"], "jain": d["jain_last_half"],
                "util": d["utilization_last_half"],
                "conv_us": None if t is None else t / d["us_cycles"],
                "queue_peak": d["queue_peak"], "queue_mean": d["queue_mean"],
                "cnps": d["counters"]["a"]["cc"]["cnp_received"],
                "marked": sw["ecn_marked"], "dropped": sw["dropped"] + sw["queue_dropped"],
                "retransmits": d["counters"]["a"]["transport"]["retransmits"],
                "file": p.name})
        else:
            rows["extra"][p.stem] = d
    rows["incast"].sort(key=lambda r: (r["flows"], r["mode"]))
    return rows


def plots(runs_dir, out_dir):
    from .ccplot import plot_queue, plot_side_by_side
    made = []
    by = {}
    for p in runs_dir.glob("incast_*.json"):
        d = json.loads(p.read_text())
        by[(d["mode"], d["flows"])] = d
    for n in sorted({k[1] for k in by}):
        dc, fm = by.get(("DCQCN", n)), by.get(("FLOWMATRIX", n))
        if not (dc and fm):
            continue

        def rp(d):
            return {f"QP {k}": [(t / d["us_cycles"], r) for t, r in v]
                    for k, v in d["rp_series"].items()}

        def wire(d, k=6):
            # the run's windows (~10 us) hold less than one frame per flow at the fair share:
            # plot the mean of k consecutive windows, or every flow looks like a square wave
            return {f"QP {q}": [(v[i][0] / d["us_cycles"], sum(r for _, r in v[i:i + k]) / len(v[i:i + k]))
                                for i in range(0, len(v), k)]
                    for q, v in d["wire_series"].items()}
        made.append(plot_side_by_side(rp(dc), rp(fm), out_dir / f"cc_rates_{n}flows.png",
                                      ("DCQCN", "FlowMatrix (experimental)"), ylabel="pacer rate (Mb/s)",
                                      suptitle=f"{n} flows into one port: reaction-point rate per QP"))
        made.append(plot_side_by_side(wire(dc), wire(fm), out_dir / f"cc_wire_{n}flows.png",
                                      ("DCQCN", "FlowMatrix (experimental)"), ylabel="wire rate (Mb/s)",
                                      suptitle=f"{n} flows into one port: throughput per QP on the wire"))
        made.append(plot_queue(dc["queue_samples"], out_dir / f"cc_queue_{n}flows_dcqcn.png",
                               title=f"switch queue, DCQCN, {n} flows", kmin=4000, kmax=16000))
    return made


def markdown(rows):
    out = ["### Congestion control: N flows into one port at half the line rate", "",
           "| flows | mode | Jain (2nd half) | port utilization | convergence (us) | queue peak / "
           "mean (B) | CNPs | CE marks | drops | resent |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows["incast"]:
        conv = "-" if r["conv_us"] is None else f"{r['conv_us']:.0f}"
        out.append(f"| {r['flows']} | {r['mode']} | {r['jain']:.3f} | {100 * r['util']:.1f} % | "
                   f"{conv} | {r['queue_peak']} / {r['queue_mean']:.0f} | {r['cnps']} | "
                   f"{r['marked']} | {r['dropped']} | {r['retransmits']} |")
    ex = rows["extra"]
    if "cnp_latency" in ex:
        c = ex["cnp_latency"]
        out += ["", f"CNP first beat at the sender's s_axis_rx to the new rate in its pacer: "
                f"**{c['cycles']} cycles** (reaction point alone: {c['rp_cycles']}); first cut "
                f"{c['line']} -> {c['rate']} Mb/s."]
    if "bucket_accuracy" in ex:
        b = ex["bucket_accuracy"]
        out += ["", "| tenant cap (Mb/s) | measured on the wire (Mb/s) | error |", "|---|---|---|"]
        for r in b["results"]:
            out.append(f"| {r['cap']} | {r['measured']:.1f} | {100 * r['error']:+.2f} % |")
    if "tenants" in ex:
        t = ex["tenants"]
        out += ["", f"Tenants (line {t['line']} Mb/s): tenant 1 (3 QPs) capped at {t['cap']} -> "
                f"{t['tenant1']:.1f} Mb/s; tenant 2 (1 QP) guaranteed {t['guarantee']} -> "
                f"{t['tenant2']:.1f} Mb/s (round robin alone would give it {0.2125 * t['line']:.0f})."]
    if "priority" in ex:
        p = ex["priority"]
        f, s = p["first"], p["second"]
        out += ["", f"Strict priority (line {p['line']} Mb/s, class 7 capped at {p['cap7']}): "
                f"while class 3 is busy: class 7 {f['1']:.0f}, class 3 {f['2']:.0f}, class 0 "
                f"{f['3']:.0f} Mb/s; after class 3 stops: class 7 {s['1']:.0f}, class 0 "
                f"{s['3']:.0f} Mb/s."]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.bench_cc", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs, fewer flow counts")
    ap.add_argument("--out", type=Path, default=ROOT / "bench", help="report folder")
    args = ap.parse_args(argv)
    out_dir = args.out.resolve()
    runs = out_dir / "cc_runs"
    runs.mkdir(parents=True, exist_ok=True)
    for p in runs.glob("*.json"):
        p.unlink()
    t0 = time.monotonic()
    failed = []
    cases = plan(args.quick)
    for i, case in enumerate(cases, 1):
        label = ", ".join(f"{k}={v}" for k, v in case.items())
        print(f"[bench_cc {time.monotonic() - t0:6.0f} s] {i}/{len(cases)} {label}", flush=True)
        try:
            run_case(dict(case), out_dir)
        except Exception as e:          # a report of what ran beats no report at all
            failed.append(f"{label}: {e}")
            print(f"[bench_cc] FAILED {label}: {e}", file=sys.stderr, flush=True)
    rows = summarize(runs)
    pngs = plots(runs, out_dir)
    report = {"rows": rows, "failed": failed, "plots": [str(p) for p in pngs],
              "elapsed_s": round(time.monotonic() - t0, 1)}
    (out_dir / "cc.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    table = markdown(rows)
    (out_dir / "cc.md").write_text(table)
    print()
    print(table, flush=True)
    print(f"[bench_cc] wrote {out_dir / 'cc.md'}, cc.json and {len(pngs)} plots in "
          f"{report['elapsed_s']} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.exit(main())
