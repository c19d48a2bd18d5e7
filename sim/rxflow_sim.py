# Ref: IBTA Vol 1 Annex A17 (RoCEv2)
"""``make sim``: the receive flow pipeline on Verilator, with a multi-tenant trace a newcomer can read.

1. The host side programs the NIC through its registers, with the driver's own code
   (``stellar.host.tables``): three tenants on one port (untagged = tenant 0, VLAN 100 = tenant
   1, VLAN 200 = tenant 2, VLAN 300 unmapped), QPs in each tenant's own QPN space (tenants 1
   and 2 both have a QPN 0x11), QP contexts, memory regions with different rights (contiguous
   and page-list).
2. scapy builds a trace: legitimate SEND / WRITE / READ / atomic / ACK / CNP / UD traffic, runs of
   back-to-back packets on one QP, unknown QPs, unmapped VLANs, every kind of bad rkey, out of
   bounds and access violation, and the cross-tenant attack: a tenant-1 packet naming a
   tenant-2 QPN and rkey -> ``build/sim/rxflow/rx.pcap``.
3. ``stellar_rxflow`` runs under cocotb; every frame's verdict (annotation stream), every passed
   frame (``tx.pcap``) and every counter are checked against the golden model
   (``stellar.sim.flowmodel``).
4. The summary: lookups per tenant, drops per reason, the attack packets line by line.
"""

import argparse
import collections
import json
import sys
import time
from pathlib import Path

from stellar.hdl.net import headers as H
from stellar.hdl.top.rxflow import TOP_NAME, verilog_top

from .flowmodel import MR_KINDS, VERDICTS
from .runner import run_cocotb, tb_env
from .verilog import export_verilog, param_slug


def step(text):
    print(f"[make sim] {text}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.rxflow_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=64, choices=(64, 512), help="data width in bits")
    ap.add_argument("--qps", type=int, default=4096, help="flow-table capacity / QP contexts")
    ap.add_argument("--frames", type=int, default=300, help="packets in the trace")
    ap.add_argument("--seed", type=int, default=1, help="trace seed")
    ap.add_argument("--out", default="build/sim/rxflow", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    params = {"width": args.width, "qps": args.qps}
    step(f"generating Verilog for {TOP_NAME} at {args.width} bits, {args.qps} QPs (cached after the "
         "first run)")
    src = export_verilog(TOP_NAME, verilog_top, params)
    step("building with Verilator, programming the tables over AXI4-Lite and running the trace "
         "(the first build takes a minute or two)")
    for name in ("summary.json", "annotations.json", "tx.pcap"):
        (out / name).unlink(missing_ok=True)
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[src], test_module="stellar.sim.tb_rxflow",
               params_slug=param_slug(params), testcase="sim_trace",
               extra_env={**tb_env({**params, "frames": args.frames}), "STELLAR_TB_OUT": str(out),
                          "STELLAR_TB_SEED": str(args.seed)})
    if not (out / "summary.json").exists():
        print("the simulation did not finish: see the cocotb log above")
        return 1
    summary = json.loads((out / "summary.json").read_text())
    rows = json.loads((out / "annotations.json").read_text())
    c = summary["counters"]

    print()
    print(f"Stellar RX flow pipeline ({TOP_NAME}, {args.width}-bit datapath, {args.qps} QPs)")
    print(f"  packets in {len(rows)} (rx.pcap); passed to the transport {c['pktengine.tx_frames']} "
          "(tx.pcap); every verdict, frame and counter matched the golden model")
    print()
    per_tenant = collections.defaultdict(collections.Counter)
    for r in rows:
        a = r["ann"]
        per_tenant[a["tenant"]][VERDICTS[a["reason"]]] += 1
    cols = list(VERDICTS.values())
    print("  verdicts per tenant      " + "".join(f"{v:>11s}" for v in cols))
    for t in sorted(per_tenant):
        print(f"    tenant {t:<3d}              " + "".join(f"{per_tenant[t][v]:11d}" for v in cols))
    print()
    print("  counters (read over AXI4-Lite)")
    for name in ("pktengine.rx_frames", "flow.rx_lookups", "flow.rx_drop_tenant",
                 "flow.rx_drop_unknown_qp", "mr.rx_mr_checks", "mr.rx_drop_rkey",
                 "mr.rx_drop_access", "mr.rx_drop_bounds", "pktengine.tx_frames"):
        print(f"    {name:26s} {c[name]:8d}")
    print()
    attacks = [r for r in rows if r["desc"].startswith("attack")]
    print(f"  the cross-tenant attack ({len(attacks)} attack packets in the trace, "
          f"{sum(1 for r in attacks if not r['ann']['passed'])} dropped), then a sample of each verdict")
    shown = attacks[:3]
    for v in VERDICTS:
        shown += [r for r in rows if not r["desc"].startswith(("attack", "run "))
                  and r["ann"]["reason"] == v][:2]
    run = [r for r in rows if r["desc"].startswith("run ")][:4]
    for r in shown + run:
        a = r["ann"]
        vlan = "untagged" if r["vid"] is None else f"VLAN {r['vid']}"
        verdict = "PASS" if a["passed"] else f"DROP {VERDICTS[a['reason']]}"
        mr = ""
        if a["mr_kind"]:
            mr = f" MR {MR_KINDS[a['mr_kind']]}" + (f" -> bus {a['bus_addr']:#x}" if a["passed"] else "")
        seen = (f" PSN {a['psn']:#08x}, saw epsn {a['ctx_epsn']:#08x} msn {a['ctx_msn']}"
                if r in run else "")
        qp = f"QP {a['qp']}" if a["qp"] or a["passed"] else "no QP"
        print(f"    {vlan:9s} tenant {a['tenant']} {H.opcode_name(a['opcode']):28s} "
              f"QPN {a['dest_qp']:#08x} {qp:8s} {verdict:16s}{mr}{seen}   ({r['desc']})")
    print()
    print(f"  files: {out}/rx.pcap, tx.pcap, annotations.json (one verdict per packet)")
    print(f"  wall time {time.monotonic() - t0:.1f} s; waves: rerun with WAVES=1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
