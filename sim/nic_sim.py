# Ref: IBTA Vol 1 ch. 9.7 (RC transport); Annex A17 (RoCEv2)
"""``make sim``: two Stellar NICs talk RoCEv2 RC through a lossy switch, on Verilator.

1. ``stellar_nic2`` holds two complete NIC cores (packet engine, flow table, QP contexts, MR
   protection, RC transport, DMA). Each has its own host memory (a recording AXI RAM).
2. The host side of each NIC sets up memory regions and QP pairs through the driver's own
   table code (``stellar.host.tables``) over AXI4-Lite.
3. Both sides post random RDMA WRITE, SEND and RDMA READ work requests (with immediate data,
   inline SENDs, multi-packet messages) on every QP pair; the switch model between the cores
   drops, duplicates, reorders and corrupts frames at the configured rate.
4. The scoreboard proves every message landed exactly once with the right bytes and every
   completion matched its work request; the summary prints what the transport did about the
   losses (NAKs, go-back-N rewinds, timeouts) and the switch's own counters.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from stellar.hdl.top.nic import PAIR_NAME

from .nic import pair_verilog
from .runner import run_cocotb, tb_env
from .verilog import param_slug


def step(text):
    print(f"[make sim] {text}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.nic_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=64, choices=(64, 512), help="data width in bits")
    ap.add_argument("--loss", type=float, default=0.01, help="frame drop probability per direction")
    ap.add_argument("--pairs", type=int, default=2, help="QP pairs")
    ap.add_argument("--messages", type=int, default=10, help="work requests per QP and side")
    ap.add_argument("--seed", type=int, default=1, help="random seed")
    ap.add_argument("--out", default="build/sim/nic", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    step(f"generating Verilog for {PAIR_NAME} (two NIC cores, {args.width}-bit datapath; cached "
         "after the first run)")
    src = pair_verilog(args.width)
    step("building with Verilator (the first build takes a few minutes), setting up QPs and "
         "memory regions through the host driver, running the traffic")
    (out / "summary.json").unlink(missing_ok=True)
    run_cocotb(toplevel=PAIR_NAME, verilog_sources=[src], test_module="stellar.sim.tb_nic",
               params_slug=param_slug({"width": args.width}), testcase="demo", seed=args.seed,
               extra_env={**tb_env({"width": args.width, "loss": args.loss, "pairs": args.pairs,
                                    "messages": args.messages}), "STELLAR_TB_OUT": str(out)})
    if not (out / "summary.json").exists():
        print("the simulation did not finish: see the cocotb log above")
        return 1
    s = json.loads((out / "summary.json").read_text())
    print()
    print(f"Two Stellar NICs ({PAIR_NAME}, {s['width']}-bit datapath), {s['pairs']} RC QP pairs, "
          f"switch dropping {100 * s['loss']:g} % of frames each way (plus duplicates, reordering, "
          "corruption)")
    posted = ", ".join(f"{n} {k}" for k, n in sorted(s["posted"].items()))
    print(f"  work requests: {posted}; {s['bytes']} payload bytes in {s['cycles']} cycles")
    print(f"  completions: A {s['completions']['a']}, B {s['completions']['b']} "
          f"({', '.join(f'{n} {k}' for k, n in s['statuses'].items())}); the scoreboard checked "
          "every byte and every completion")
    print()
    names = ("tx_packets", "rx_requests", "tx_acks", "rx_acks", "rx_duplicates",
             "rx_out_of_sequence", "tx_naks", "retransmits", "timeouts", "tx_read_responses",
             "rx_stale", "completions")
    print("  transport counters          NIC A      NIC B")
    for n in names:
        print(f"    {n:24s} {s['transport']['a'][n]:8d}   {s['transport']['b'][n]:8d}")
    print(f"    {'rx_drop_icrc (pktengine)':24s} {s['pktengine']['a']['rx_drop_icrc']:8d}   "
          f"{s['pktengine']['b']['rx_drop_icrc']:8d}")
    print()
    print("  switch                     frames   dropped  duplicated  reordered  corrupted")
    for name, c in s["switch"].items():
        print(f"    {name:22s} {c['frames_in']:8d}  {c['dropped']:8d}  {c['duplicated']:10d}  "
              f"{c['reordered']:9d}  {c['corrupted']:9d}")
    print()
    print(f"  files: {out}/summary.json; wall time {time.monotonic() - t0:.1f} s; waves: WAVES=1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
