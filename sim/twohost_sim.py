# Ref: IBTA Vol 1 ch. 9.7 (RC transport); Annex A17 (RoCEv2); rdma-core libibverbs
"""``make sim``: two simulated hosts, each running the Stellar host driver on its own NIC over
simulated PCIe, talk RoCEv2 RC through a lossy switch, on Verilator.

1. ``stellar_pcie2`` holds two NICs, each a complete core (packet engine, flow table, QP
   contexts, MR protection, RC transport, congestion control) with its queue engine behind the
   UltraScale+ PCIe adapter. cocotbext-pcie's root complex and hard-block model stand for each
   host's PCIe: enumeration, BAR0, DMA into the host's memory, MSI.
2. The host driver (``stellar.host.verbs``) on each host registers numpy arrays as memory
   regions, creates CQs and RC QPs in host memory, and connects the QPs pairwise.
3. Both hosts post random RDMA WRITE, READ, SEND (with immediate, inline) and WRITE with
   immediate work requests into their rings and ring doorbells; the NICs fetch them by DMA. The
   switch drops, duplicates, reorders and corrupts frames at the configured rate.
4. Every byte is checked against its source array and every completion against its work
   request; the summary prints bandwidth, latency, MMIO per work request and the counters.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from .pcie import pcie_verilog
from .runner import run_cocotb, tb_env
from .verilog import param_slug


def step(text):
    print(f"[make sim] {text}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.twohost_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loss", type=float, default=0.01, help="frame drop probability per direction")
    ap.add_argument("--pairs", type=int, default=2, help="QP pairs")
    ap.add_argument("--messages", type=int, default=12, help="work requests per QP and side")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="probability of a stalled cycle on every PCIe stream")
    ap.add_argument("--seed", type=int, default=1, help="random seed")
    ap.add_argument("--out", default="build/sim/twohost", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    step("generating Verilog for stellar_pcie2 (two NICs behind PCIe; cached after the first run)")
    top, src, build = pcie_verilog(two=True)
    step("building with Verilator (the first build takes a few minutes), enumerating both NICs, "
         "connecting QPs through the host driver, running the traffic")
    (out / "summary.json").unlink(missing_ok=True)
    run_cocotb(toplevel=top, verilog_sources=[src], test_module="stellar.sim.tb_twohost",
               params_slug=param_slug(build), testcase="demo", seed=args.seed,
               extra_env={**tb_env({"loss": args.loss, "pairs": args.pairs,
                                    "messages": args.messages, "pause": args.pause}),
                          "STELLAR_TB_OUT": str(out)})
    if not (out / "summary.json").exists():
        print("the simulation did not finish: see the cocotb log above")
        return 1
    s = json.loads((out / "summary.json").read_text())
    print()
    print(f"Two hosts, each the Stellar driver on its own NIC over simulated PCIe ({top}), "
          f"{s['pairs']} RC QP pairs, switch dropping {100 * s['loss']:g} % of frames each way "
          "(plus duplicates, reordering, corruption)")
    posted = ", ".join(f"{n} {k}" for k, n in sorted(s["posted"].items()))
    print(f"  work requests: {posted}")
    print(f"  {s['bytes']} payload bytes in {s['cycles']} cycles ({s['seconds'] * 1e6:.1f} us "
          f"simulated): {s['gbps']:.2f} Gb/s over both directions")
    lat = sorted(s["latency_cycles"])
    print(f"  latency, doorbell to completion in host memory (64-byte WRITE): min {lat[0]}, "
          f"median {lat[len(lat) // 2]} cycles at 250 MHz")
    print(f"  MMIO: {s['mmio_writes_per_wr']:.2f} writes per work request (one doorbell per "
          f"list), reads while polling: A {s['mmio']['a']['reads']}, B {s['mmio']['b']['reads']}")
    comp = s["completions"]
    print(f"  completions: A {comp['a']['send']} send + {comp['a']['recv']} receive, "
          f"B {comp['b']['send']} send + {comp['b']['recv']} receive; every byte and completion "
          f"checked: {len(s['problems'])} problems")
    print()
    names = ("tx_packets", "rx_requests", "tx_acks", "rx_acks", "rx_duplicates",
             "rx_out_of_sequence", "tx_naks", "retransmits", "timeouts", "tx_read_responses",
             "completions")
    print("  transport counters          NIC A      NIC B")
    for n in names:
        print(f"    {n:24s} {s['transport']['a'][n]:8d}   {s['transport']['b'][n]:8d}")
    for n in ("sq_wqes", "rq_wqes", "wqe_reads", "cqes", "doorbells"):
        print(f"    {'hostq.' + n:24s} {s['hostq']['a'][n]:8d}   {s['hostq']['b'][n]:8d}")
    print()
    print("  switch                     frames   dropped  duplicated  reordered  corrupted")
    for name, c in s["switch"].items():
        print(f"    {name:22s} {c['frames_in']:8d}  {c['dropped']:8d}  {c['duplicated']:10d}  "
              f"{c['reordered']:9d}  {c['corrupted']:9d}")
    print()
    print(f"  files: {out}/summary.json; wall time {time.monotonic() - t0:.1f} s; waves: WAVES=1")
    return 0 if not s["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
