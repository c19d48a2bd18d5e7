"""``make bench``, RC transport part: goodput of 4 KiB-MTU RDMA WRITEs between two NIC cores
as a fraction of the wire limit (lossless, 0.1 % and 1 % loss, next to the analytic go-back-N
figure), cycles to recover from a single loss, and WRITE latency from the wire to host memory.

A report, not a test. Writes ``build/bench/rc_transport.json`` and ``rc_transport.md`` and
prints the table::

    python -m stellar.sim.bench_rc             # both widths, full sizes
    python -m stellar.sim.bench_rc --quick     # smaller transfers
    python -m stellar.sim.bench_rc --widths 512

Wire limit: each 4 KiB WRITE packet costs payload + 54 bytes of headers (Ethernet, IPv4, UDP,
BTH; +16 RETH on the first packet of a message) + 4 ICRC + 24 (FCS, preamble, inter-frame gap);
the switch model serializes exactly that at ``W/8`` bytes per cycle. The go-back-N figure is
1 / (1 + p * R / T): every loss wastes the wire time R from the lost frame's departure to its
retransmission (measured in the ``recovery`` case), T being one packet's wire time.
The measurements themselves are in :mod:`stellar.sim.bench_rc_tb`.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main", "plan"]

ROOT = Path("build")


def plan(quick):
    mib = 1 << 20
    cases = []
    for width in (64, 512):
        # ~1000 packets at 0.1 % (64 bits: 4 MiB), ~500-2000 at 1 %; quick: a few hundred
        base = mib if width == 64 else 2 * mib
        lossless, p01, p1 = (base // 2, 4 * base, 2 * base) if not quick else (base // 2,) * 3
        cases += [
            {"width": width, "case": "latency"},
            {"width": width, "case": "goodput", "loss": 0.0, "total": lossless},
            {"width": width, "case": "recovery", "total": lossless},
            {"width": width, "case": "goodput", "loss": 0.001, "total": p01, "seed": 3},
            {"width": width, "case": "goodput", "loss": 0.01, "total": p1, "seed": 3},
        ]
    return cases


def run_case(params, out_dir):
    from stellar.hdl.top.nic import PAIR_NAME

    from .nic import pair_verilog
    from .runner import run_cocotb, tb_env
    from .verilog import param_slug
    width = params["width"]
    src = pair_verilog(width)
    fd, path = tempfile.mkstemp(suffix=".json", dir=out_dir)
    os.close(fd)
    os.environ["STELLAR_BENCH_OUT"] = path
    try:
        run_cocotb(toplevel=PAIR_NAME, verilog_sources=[src], test_module="stellar.sim.bench_rc_tb",
                   params_slug=param_slug({"width": width}), testcase="bench",
                   extra_env=tb_env({k: v for k, v in params.items()}))
        return json.loads(Path(path).read_text())
    finally:
        os.environ.pop("STELLAR_BENCH_OUT", None)
        Path(path).unlink(missing_ok=True)


def summarize(results):
    rows = []
    by = {(r["width"], r["case"], r.get("loss")): r for r in results}
    for width in sorted({r["width"] for r in results}):
        rec = by.get((width, "recovery", 0.0)) or next(
            (r for r in results if r["width"] == width and r["case"] == "recovery"), None)
        lat = next((r for r in results if r["width"] == width and r["case"] == "latency"), None)
        for r in results:
            if r["width"] != width or r["case"] != "goodput":
                continue
            row = {"width": width, "loss": r["loss"], "bytes": r["total"],
                   "fraction": r["fraction_of_limit"], "drops": r["dropped"],
                   "resent": r["frames_sent"] - r["frames_ideal"], "cycles": r["cycles"],
                   "frames": r["frames_ideal"]}
            if rec and r["loss"]:
                cost = rec["recovery_cycles"] / rec["packet_cycles"]
                row["gbn"] = 1 / (1 + r["loss"] * cost)
                # the same formula at the loss rate this run actually drew
                row["gbn_run"] = 1 / (1 + r["dropped"] / r["frames_ideal"] * cost)
            rows.append(row)
        if rec:
            rows.append({"width": width, "recovery_cycles": rec["recovery_cycles"],
                         "packet_cycles": rec["packet_cycles"], "recovery_resent": rec["resent"]})
        if lat:
            rows.append({"width": width, "latency_cycles": lat["latency_cycles"]})
    return rows


def markdown(rows):
    out = ["### RC transport: 4 KiB-MTU RDMA WRITE between two cores", "",
           "| width | loss | transfer | goodput / wire limit | go-back-N analytic at p "
           "(at the drops drawn) | frames lost / sent once | frames resent |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "fraction" in r:
            gbn = (f"{100 * r['gbn']:.2f} % ({100 * r['gbn_run']:.2f} %)" if "gbn" in r else "-")
            out.append(f"| {r['width']} | {100 * r['loss']:g} % | {r['bytes'] >> 10} KiB | "
                       f"{100 * r['fraction']:.2f} % | {gbn} | {r['drops']} / {r['frames']} | "
                       f"{r['resent']} |")
    out += ["", "| width | single-loss recovery (cycles) | one packet on the wire (cycles) | "
            "frames resent | WRITE latency, wire to first DMA beat (cycles) |",
            "|---|---|---|---|---|"]
    for width in sorted({r["width"] for r in rows}):
        rec = next((r for r in rows if r["width"] == width and "recovery_cycles" in r), {})
        lat = next((r for r in rows if r["width"] == width and "latency_cycles" in r), {})
        out.append(f"| {width} | {rec.get('recovery_cycles', '-')} | "
                   f"{rec.get('packet_cycles', 0):.1f} | {rec.get('recovery_resent', '-')} | "
                   f"{lat.get('latency_cycles', '-')} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.bench_rc", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller transfers")
    ap.add_argument("--widths", default="64,512", help="data widths (default 64,512)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench", help="report folder")
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results, failed = [], []
    cases = [c for c in plan(args.quick) if c["width"] in widths]
    for i, case in enumerate(cases, 1):
        label = ", ".join(f"{k}={v}" for k, v in case.items())
        print(f"[bench_rc {time.monotonic() - t0:6.0f} s] {i}/{len(cases)} {label}", flush=True)
        try:
            results.append(run_case(case, out_dir))
        except Exception as e:          # a report of what ran beats no report at all
            failed.append(f"{label}: {e}")
            print(f"[bench_rc] FAILED {label}: {e}", file=sys.stderr, flush=True)
    rows = summarize(results)
    report = {"results": results, "rows": rows, "failed": failed,
              "elapsed_s": round(time.monotonic() - t0, 1)}
    (out_dir / "rc_transport.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    table = markdown(rows)
    (out_dir / "rc_transport.md").write_text(table)
    print()
    print(table, flush=True)
    print(f"[bench_rc] wrote {out_dir / 'rc_transport.json'} and rc_transport.md in "
          f"{report['elapsed_s']} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
