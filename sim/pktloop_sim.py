# Ref: IBTA Vol 1 Annex A17 (RoCEv2)
"""``make sim``: the packet engine in loopback on Verilator, with a trace a newcomer can read.

1. scapy builds a mixed trace (RC SEND / WRITE / READ request and responses / ACK / NAK / atomics
   / UD / UC / CNP, IPv4 with and without options and IPv6, VLAN and not, 60-byte to 9000-byte
   jumbo frames, corrupted frames of every kind, non-RoCE frames) -> ``build/sim/rx.pcap``.
2. ``stellar_pktloop`` (Verilog from Amaranth, cached) runs on Verilator under cocotb; what it
   transmits goes to ``build/sim/tx.pcap``.
3. The summary: frames in and out, counts per opcode, drops per reason (read from the counters
   over AXI4-Lite), beats per cycle at the input and latency in cycles, whether every frame that
   should pass came out byte for byte, and tshark's verdict on tx.pcap.

Open the two pcaps in Wireshark to see the traffic (Decode As UDP 4791 -> RoCEv2 if needed).
"""

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

from stellar.hdl.net import headers as H
from stellar.hdl.top.pktloop import TOP_NAME, verilog_top

from . import packets, tshark
from .captures import is_rocev2
from .packets import Expect
from .runner import run_cocotb, tb_env
from .verilog import export_verilog, param_slug


def opcode_of(frame):
    """The BTH opcode name of a RoCEv2 frame (golden: scapy's dissection), else None."""
    if not is_rocev2(frame):
        return None
    from scapy.contrib.roce import BTH
    from scapy.layers.l2 import Ether
    pkt = Ether(frame)
    return H.opcode_name(pkt[BTH].opcode) if BTH in pkt else None


def step(text):
    print(f"[make sim] {text}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.pktloop_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=64, choices=(64, 512), help="data width in bits")
    ap.add_argument("--frames", type=int, default=300, help="frames in the trace")
    ap.add_argument("--seed", type=int, default=1, help="trace seed")
    ap.add_argument("--out", default="build/sim", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    step(f"building a {args.frames}-frame trace with scapy (seed {args.seed})")
    trace = packets.mixed_trace(args.seed, args.frames)
    frames = [t.frame for t in trace]
    packets.write_pcap(out / "rx.pcap", frames)

    params = {"width": args.width}
    step(f"generating Verilog for {TOP_NAME} at {args.width} bits (cached after the first run)")
    src = export_verilog(TOP_NAME, verilog_top, params)
    step("building with Verilator and running under cocotb (the first build takes a minute)")
    (out / "tx.pcap").unlink(missing_ok=True)
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[src], test_module="stellar.sim.tb_pktloop",
               params_slug=param_slug(params), testcase="sim_trace",
               extra_env={**tb_env(params), "STELLAR_TB_TRACE": str(out / "rx.pcap"),
                          "STELLAR_TB_OUT": str(out)})
    summary = json.loads((out / "summary.json").read_text())
    sent = packets.read_pcap(out / "tx.pcap")

    # Golden comparison: every frame labelled pass/non_roce must come out, in order, unchanged.
    kept = [i for i, t in enumerate(trace) if t.expect in (Expect.PASS, Expect.NON_ROCE)]
    wanted = [frames[i] for i in kept]
    exact = sent == wanted
    step("dissecting tx.pcap with tshark")
    try:
        problems = tshark.expert_errors(out / "tx.pcap")
        tshark_note = (f"{len(problems)} malformed/expert errors" if problems
                       else "no malformed packet, no expert error")
    except tshark.TsharkMissing as e:
        problems, tshark_note = [], f"skipped ({e})"

    c = summary["counters"]
    rx_ops = collections.Counter(opcode_of(f) or "non-RoCE" for f in frames)
    tx_ops = collections.Counter(opcode_of(f) or "non-RoCE" for f in sent)
    lat = [summary["first_tx_cycles"][n] - summary["first_rx_cycles"][i]
           for n, i in enumerate(kept) if n < len(summary["first_tx_cycles"])]
    single = [lat[n] for n, i in enumerate(kept) if n < len(lat)
              and (n == 0 or summary["first_tx_cycles"][n - 1] < summary["first_rx_cycles"][i])]
    nbytes = args.width // 8

    print()
    print(f"Stellar packet loopback ({TOP_NAME}, {args.width}-bit datapath, {nbytes} bytes/beat)")
    print(f"  frames in  {summary['frames_in']:6d}   ({sum(len(f) for f in frames)} bytes, rx.pcap)")
    print(f"  frames out {summary['frames_out']:6d}   ({sum(len(f) for f in sent)} bytes, tx.pcap)")
    print(f"  byte-for-byte: {'every passing frame came out unchanged, in order' if exact else 'MISMATCH'}")
    print(f"  tshark on tx.pcap: {tshark_note}")
    print()
    print("  per opcode                         in    out")
    for name in sorted(rx_ops, key=lambda n: (n == "non-RoCE", n)):
        print(f"    {name:32s} {rx_ops[name]:5d}  {tx_ops.get(name, 0):5d}")
    print()
    print("  counters (read over AXI4-Lite)")
    for name in ("rx_frames", "rx_roce", "rx_non_roce", "rx_ecn_ce", "rx_drop_icrc",
                 "rx_drop_ip_checksum", "rx_drop_malformed", "rx_drop_opcode", "rx_drop_overflow",
                 "tx_frames"):
        print(f"    {name:22s} {c[name]:8d}")
    labels = collections.Counter(t.expect.value for t in trace)
    print(f"  expected drops (how the trace was built): {dict(sorted(labels.items()))}")
    print()
    rate = summary["rx_beats"] / summary["rx_cycles"] if summary["rx_cycles"] else 0.0
    print(f"  input: {summary['rx_beats']} beats in {summary['rx_cycles']} cycles = "
          f"{rate:.3f} beats/cycle; the design held tready low {summary['rx_stall_cycles']} cycles "
          f"(0 = line rate)")
    if single:
        print(f"  latency, first rx beat -> first tx beat, frames that did not queue: "
              f"min {min(single)}, median {statistics.median(single):.0f}, max {max(single)} cycles")
        print("    (the loopback buffers each frame until its ICRC verdict, so latency grows with "
              "frame length;")
        print("     the parser and deparser themselves have fixed latency: see make bench)")
    print(f"  wall time {time.monotonic() - t0:.1f} s; waves: rerun with WAVES=1 "
          f"(build/sim/{TOP_NAME}/...)")
    ok = exact and not problems and c["rx_frames"] == len(frames)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
