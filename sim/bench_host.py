"""``make bench``, host part: the host driver and the NIC's host queues end to end, measured with
``stellar.host.perf`` (the code behind ``stellar perf``) on the simulated two-host system
(``stellar_pcie2``: two PCIe NICs behind simulated root complexes, Gen3 x2 model, 64-bit
datapath at 250 MHz, joined by a lossless switch model):

* WRITE bandwidth, 64 B .. 64 KiB: messages and bytes per simulated second (tx depth 32, lists
  of 4 WRs, one signaled WR in 8);
* MMIO operations per work request with and without batching (lists of 1 vs 8 WRs): the fast
  path rings one doorbell per list and polls completions from memory (no MMIO reads);
* completion latency in cycles: the doorbell write of one signaled WRITE (tx depth 1) to its
  CQE seen in host memory (polled every clock), and ib_write_lat's ping-pong half round trip.

A report, not a test. One simulation (``stellar.sim.tb_cli`` with a ``bench`` request), then
``build/bench/host_perf.json`` and ``host_perf.md``, and the table printed::

    python -m stellar.sim.bench_host            # full sizes
    python -m stellar.sim.bench_host --quick    # fewer iterations
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from stellar.host.perf import PerfResult

__all__ = ["main", "plan", "summarize", "markdown", "write_report"]

ROOT = Path("build")
BW_SIZES = [64, 256, 1024, 4096, 16384, 65536]


def _perf(label, test, sizes, iters, tx_depth, batch, signal_every):
    return {"command": "perf", "label": label, "test": test, "sizes": sizes, "iters": iters,
            "tx_depth": tx_depth, "batch": batch, "signal_every": signal_every}


def plan(quick=False, sizes=None):
    """The perf requests of the bench (``tb_cli``'s ``bench`` request ``runs``)."""
    sizes = sizes or BW_SIZES
    runs = []
    for size in sizes:
        # about 128 KiB per size (quick: 32 KiB), 8 .. 512 messages (quick: 8 .. 128), whole
        # lists of 4; the simulation runs about 4 us of simulated time per second
        budget, most = ((1 << 15), 128) if quick else ((1 << 17), 512)
        iters = max(8, min(most, budget // size))
        iters -= iters % 4
        runs.append(_perf("bandwidth", "write_bw", [size], iters, 32, 4, 8))
    n = 64 if quick else 128
    runs.append(_perf("mmio_unbatched", "write_bw", [64], n, 32, 1, 8))
    runs.append(_perf("mmio_batched", "write_bw", [64], n, 32, 8, 8))
    lat = 10 if quick else 20
    runs.append(_perf("completion_latency", "write_bw", [64, 4096], lat, 1, 1, 1))
    runs.append(_perf("pingpong_latency", "write_lat", [64, 4096], lat, 32, 1, 8))
    return runs


def run_bench(runs, out_dir, *, pause=0.0, seed=None):
    """One simulation of ``runs``; returns the ``bench`` document of ``tb_cli``."""
    from .pcie import pcie_verilog
    from .runner import run_cocotb, tb_env
    from .verilog import param_slug
    top, path, params = pcie_verilog(two=True)
    run_dir = Path(tempfile.mkdtemp(prefix="host-", dir=out_dir))
    request = {"command": "bench", "runs": runs}
    run_cocotb(toplevel=top, verilog_sources=[path], test_module="stellar.sim.tb_cli",
               params_slug=param_slug(params), testcase="cli", seed=seed,
               extra_env={**tb_env({"request": json.dumps(request), "pause": pause}),
                          "STELLAR_TB_OUT": str(run_dir)})
    doc = json.loads((run_dir / "result.json").read_text())
    for p in run_dir.iterdir():
        p.unlink()
    run_dir.rmdir()
    return doc


def summarize(doc):
    """Rows of the report from a ``bench`` document."""
    rows = {"bandwidth": [], "mmio": [], "latency": []}
    for sub in doc["docs"]:
        for run in sub["runs"]:
            r = PerfResult.from_dict(run["result"])
            lat = r.latency.cycles() if r.latency and r.hz else None
            if sub["label"] == "bandwidth":
                rows["bandwidth"].append({
                    "size": r.size, "messages": r.messages, "bytes": r.bytes,
                    "sim_seconds": r.seconds, "cycles": r.cycles, "msg_per_s": r.msg_rate,
                    "bytes_per_s": r.bytes / r.seconds, "gbps": r.gbps,
                    "completion_cycles_median": lat and lat["median"], "verified": r.verified})
            elif sub["label"].startswith("mmio"):
                rows["mmio"].append({
                    "batch": r.batch, "signal_every": r.signal_every, "messages": r.messages,
                    "mmio_writes": r.mmio_writes, "mmio_reads": r.mmio_reads,
                    "sq_doorbells": r.sq_doorbells, "cq_doorbells": r.cq_doorbells,
                    "writes_per_wr": r.mmio_writes_per_wr, "reads_per_wr": r.mmio_reads_per_wr,
                    "msg_per_s": r.msg_rate})
            else:
                rows["latency"].append({
                    "what": ("doorbell to CQE in memory" if sub["label"] == "completion_latency"
                             else "ping-pong half round trip"),
                    "test": r.test, "size": r.size, "samples": r.latency.samples, **(lat or {})})
    return rows


def markdown(rows, meta):
    out = ["### Host driver and host queues: verbs end to end (`stellar perf`)", "",
           f"Two PCIe NICs (`stellar_pcie2`, 64-bit datapath at 250 MHz, PCIe Gen3 x2 model, "
           f"lossless switch); simulated time. Seed {meta['seed']}, PCIe stream pause "
           f"{meta['pause']:g}.", "",
           "RDMA WRITE, tx depth 32, lists of 4 WRs, one in 8 signaled:", "",
           "| size | messages | msg/s (simulated) | MB/s (simulated) | Gb/s | completion latency "
           "median (cycles) | data |", "|---|---|---|---|---|---|---|"]
    for r in rows["bandwidth"]:
        out.append(f"| {r['size']} | {r['messages']} | {r['msg_per_s'] / 1e6:.3f} M | "
                   f"{r['bytes_per_s'] / 1e6:.1f} | {r['gbps']:.2f} | "
                   f"{r['completion_cycles_median']:.0f} | {'ok' if r['verified'] else 'BAD'} |")
    out += ["", "MMIO per work request (64 B WRITEs, tx depth 32):", "",
            "| WRs per list | signaled | WRs | MMIO writes | SQ doorbells | CQ doorbells | "
            "writes / WR | reads / WR | msg/s (simulated) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows["mmio"]:
        out.append(f"| {r['batch']} | 1 in {r['signal_every']} | {r['messages']} | "
                   f"{r['mmio_writes']} | {r['sq_doorbells']} | {r['cq_doorbells']} | "
                   f"{r['writes_per_wr']:.3f} | {r['reads_per_wr']:.3f} | "
                   f"{r['msg_per_s'] / 1e6:.3f} M |")
    out += ["", "Latency in 250 MHz cycles (polled every cycle):", "",
            "| what | size | samples | min | median | p99 | max |", "|---|---|---|---|---|---|---|"]
    for r in rows["latency"]:
        out.append(f"| {r['what']} | {r['size']} | {r['samples']} | {r['min']:.0f} | "
                   f"{r['median']:.0f} | {r['p99']:.0f} | {r['max']:.0f} |")
    return "\n".join(out) + "\n"


def write_report(doc, out_dir, *, elapsed_s=None, mode="full"):
    """``host_perf.json`` (the simulation's document and the rows) and ``host_perf.md``;
    returns the markdown."""
    rows = summarize(doc)
    sim = doc.get("simulated", {})
    meta = {"seed": sim.get("seed"), "pause": sim.get("pause", 0.0), "mode": mode,
            "elapsed_s": elapsed_s}
    report = {"generated": time.strftime("%Y-%m-%dT%H:%M:%S"), **meta, "rows": rows,
              "simulation": doc}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "host_perf.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    table = markdown(rows, meta)
    (out_dir / "host_perf.md").write_text(table)
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.bench_host", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations per size")
    ap.add_argument("--sizes", help="bandwidth sizes, comma-separated (default 64 .. 65536)")
    ap.add_argument("--seed", type=int, help="random seed")
    ap.add_argument("--out", type=Path, default=ROOT / "bench", help="report folder")
    args = ap.parse_args(argv)
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    runs = plan(args.quick, sizes)
    t0 = time.monotonic()
    print(f"[bench_host] {len(runs)} measurements in one simulation of stellar_pcie2 (the first "
          "build takes several minutes); progress in the cocotb log lines", flush=True)
    doc = run_bench(runs, out_dir, seed=args.seed)
    table = write_report(doc, out_dir, elapsed_s=round(time.monotonic() - t0, 1),
                         mode="quick" if args.quick else "full")
    print()
    print(table, flush=True)
    print(f"[bench_host] wrote {out_dir / 'host_perf.json'} and host_perf.md in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
