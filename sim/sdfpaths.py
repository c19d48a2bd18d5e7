"""The worst register-to-register paths of a *placed* (not yet routed) nextpnr design, from the
SDF file nextpnr writes (``--no-route --sdf placed.sdf``).

Why: nextpnr estimates each clock's fmax after placement (wire delays predicted from the
placed cells' distance) but names critical paths only after routing, and the whole core on the
ECPIX-5 does not route. Its SDF writer does work after placement: every cell's delays (LUTs,
carry chains, clock-to-out of flip-flops, block RAMs and multipliers, and setup times) come from
nextpnr's timing database, and every net connection's delay is nextpnr's own prediction for an
unrouted arc (``predictArcDelay``: distance in tiles). A static timing analysis over those
figures is what nextpnr's placement estimate is, so it names the paths behind that estimate.
No library reads SDF into a timing graph (the SDF readers on PyPI are annotation parsers for
simulators), hence this small one.

What it does not do: clock skew and the clock network's delay (nextpnr's estimate counts
skew; its ECP5 global clocks add little), multicycle or false paths, and rise/fall separation
(it takes the larger of the two). The constant nets start no path (nextpnr routes them from
LUTs, and its estimate may count them). Paths between different clocks are reported under their pair
of clock nets, not timed against a phase relation.

:func:`parse_sdf` reads the file; :func:`worst_paths` ranks the endpoints; with the placed JSON
(``--write placed.json``) :func:`placed_names` gives net names and cell locations for the report.
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

__all__ = ["parse_sdf", "placed_names", "worst_paths", "format_paths", "analyse", "block_of",
           "bit_names", "block_spread", "main"]

# nextpnr-ecp5's cells that drive the constant nets ($PACKER_VCC_NET, $PACKER_GND_NET)
CONSTANT_CELLS = ("$PACKER_VCC", "$PACKER_GND")
# placed cell types that count for a block's spread
SPREAD_TYPES = ("TRELLIS_COMB", "TRELLIS_FF", "TRELLIS_RAMW", "DP16KD", "MULT18X18D")

_ESC = re.compile(r"\\(.)")
_DELAY = re.compile(r"\(([-\d.]*):([-\d.]*):([-\d.]*)\)")
_INTERCONNECT = re.compile(r"^\s*\(INTERCONNECT (\S+) (\S+) (.*)\)\s*$")
_IOPATH = re.compile(r"^\s*\(IOPATH (\S+) (\S+) (.*)\)\s*$")
_SETUPHOLD = re.compile(r"^\s*\(SETUPHOLD \((?:posedge|negedge) (\S+)\) "
                        r"\((posedge|negedge) (\S+)\) (.*)\)\s*$")
_CELLTYPE = re.compile(r'^\s*\(CELLTYPE "([^"]*)"\)\s*$')
_INSTANCE = re.compile(r"^\s*\(INSTANCE ?(.*)\)\s*$")


def _name(s):
    return _ESC.sub(r"\1", s)


def _pin(s):
    cell, _, port = _name(s).rpartition("/")
    return cell, port


def _max_ps(text):
    """The largest max figure of a rise/fall delay pair, in ps."""
    vals = [float(m.group(3)) for m in _DELAY.finditer(text) if m.group(3)]
    return max(vals) if vals else 0.0


def _first_max_ps(text):
    """The max figure of the first triple (SETUPHOLD: setup first, hold second), in ps."""
    m = _DELAY.search(text)
    return float(m.group(3)) if m and m.group(3) else 0.0


def parse_sdf(text):
    """Parse an SDF file as nextpnr writes it (one statement per line).

    Returns a dict: ``types`` (cell -> cell type), ``nets`` (sink pin -> (driver pin, ps)),
    ``iopaths`` (cell -> {output port: [(input port, ps), ...]}), ``checks`` (cell ->
    {data port: (clock port, setup ps)}); pins are ``(cell, port)`` tuples."""
    types, nets = {}, {}
    iopaths = defaultdict(lambda: defaultdict(list))
    checks = defaultdict(dict)
    cell = None
    for line in text.splitlines():
        if "(INTERCONNECT" in line:
            m = _INTERCONNECT.match(line)
            if m:
                src = _pin(m.group(1))
                # nextpnr-ecp5's constant drivers: a constant never switches, so it starts no
                # path (its sinks count as undriven: arrival 0, no wire)
                if src[0] not in CONSTANT_CELLS:
                    nets[_pin(m.group(2))] = (src, _max_ps(m.group(3)))
            continue
        if "(IOPATH" in line:
            m = _IOPATH.match(line)
            if m and cell is not None:
                iopaths[cell][_name(m.group(2))].append((_name(m.group(1)), _max_ps(m.group(3))))
            continue
        if "(SETUPHOLD" in line:
            m = _SETUPHOLD.match(line)
            if m and cell is not None:
                data, clk = _name(m.group(1)), _name(m.group(3))
                setup = _first_max_ps(m.group(4))
                old = checks[cell].get(data)
                if old is None or setup > old[1]:
                    checks[cell][data] = (clk, setup)
            continue
        m = _CELLTYPE.match(line)
        if m:
            ctype = m.group(1)
            continue
        m = _INSTANCE.match(line)
        if m:
            cell = _name(m.group(1).strip()) or None
            if cell is not None:
                types[cell] = ctype
    return {"types": types, "nets": nets, "iopaths": iopaths, "checks": checks}


def bit_names(mod):
    """bit -> the most readable name of a Yosys/nextpnr JSON module's net bit: fewest
    Yosys-generated (``$``) parts, then shortest."""
    names = {}
    for name, net in mod["netnames"].items():
        for b in net["bits"]:
            if isinstance(b, int) and (b not in names or (name.count("$"), len(name))
                                       < (names[b].count("$"), len(names[b]))):
                names[b] = name
    return names


def placed_names(netlist):
    """From nextpnr's ``--write`` JSON (text or parsed): (driver pin -> net name, cell ->
    (x, y) tile of its placed BEL)."""
    if isinstance(netlist, str):
        netlist = json.loads(netlist)
    mod = next(iter(netlist["modules"].values()))
    bitname = bit_names(mod)
    names, locs = {}, {}
    for cname, c in mod["cells"].items():
        bel = c.get("attributes", {}).get("NEXTPNR_BEL", "")
        m = re.match(r"X(\d+)/Y(\d+)/", bel)
        if m:
            locs[cname] = (int(m.group(1)), int(m.group(2)))
        for port, bits in c.get("connections", {}).items():
            if c.get("port_directions", {}).get(port) == "output":
                for b in bits:
                    if isinstance(b, int) and b in bitname:
                        names[(cname, port)] = bitname[b]
    return names, locs


def worst_paths(sdf, period_ns, n=20, distinct=None, summary=None):
    """Static timing of a parsed SDF (:func:`parse_sdf`) against one clock period.

    A path starts at a clock-to-out arc (a register, block RAM or registered multiplier output;
    a cell input named as the clock of a setup check, or an IOPATH from a port whose name starts
    with ``CLK``/``WCK``) or at an undriven input, passes combinational IOPATHs and nets, and
    ends at a data input with a setup check. Returns the ``n`` worst endpoints, worst first,
    each a dict: ``slack_ns``, ``arrival_ns`` (with setup), ``launch``/``capture`` (the clock
    net's driver pin, "cell/port"), ``end`` ("cell/port") and ``steps``: a list of
    ``(kind, ps, cell, port)`` from the launch on, kind ``clk2q``, ``net`` (to cell/port),
    ``cell`` (through it to port) or ``setup``. ``distinct`` is a function of an endpoint's
    dict; only the first (worst) endpoint of each value is kept (for example one per pair of
    blocks). ``summary``, a dict, receives per capture clock (its driver pin): ``endpoints``,
    ``failing`` (negative slack), ``histogram`` (failing endpoints by whole ns of negative
    slack: ``{0: misses by less than 1 ns, 1: ..., ...}``) and ``wire_share`` (the nets' part
    of the failing paths' summed delay)."""
    types, nets, iopaths, checks = sdf["types"], sdf["nets"], sdf["iopaths"], sdf["checks"]
    clock_ports = defaultdict(set)
    for cell, chk in checks.items():
        for clk, _ in chk.values():
            clock_ports[cell].add(clk)

    def is_clock(cell, port):
        return port in clock_ports[cell] or port.startswith(("CLK", "WCK"))

    def clock_of(cell, port):
        drv = nets.get((cell, port))
        return f"{drv[0][0]}/{drv[0][1]}" if drv else "?"

    out_arr = {}        # (cell, out port) -> (ps, previous input pin or None, launch clock)

    def arrive_out(pin):
        stack = [(pin, False)]
        open_ = set()
        while stack:
            p, expanded = stack.pop()
            if p in out_arr or (not expanded and p in open_):
                continue
            cell, port = p
            arcs = iopaths.get(cell, {}).get(port, [])
            launch = [(d, (cell, i)) for i, d in arcs if is_clock(cell, i)]
            if launch:
                d, ck = max(launch)
                out_arr[p] = (d, None, clock_of(*ck))
                continue
            ins = [((cell, i), d) for i, d in arcs]
            if not expanded:
                stack.append((p, True))
                open_.add(p)
                for ip, _ in ins:
                    drv = nets.get(ip)
                    if drv and drv[0] not in out_arr and drv[0] not in open_:
                        stack.append((drv[0], False))
                continue
            open_.discard(p)
            best = (0.0, None, None)
            for ip, d in ins:
                a, clk = in_arrival(ip)
                if a + d > best[0] or best[1] is None:
                    best = (a + d, ip, clk)
            out_arr[p] = best
        return out_arr[pin]

    def in_arrival(ip):
        drv = nets.get(ip)
        if drv is None or drv[0] not in out_arr:
            return 0.0, None        # undriven, or a combinational loop cut here
        a = out_arr[drv[0]]
        return a[0] + drv[1], a[2]

    ends = []
    for cell, chk in checks.items():
        for data, (clk, setup) in chk.items():
            drv = nets.get((cell, data))
            if drv is None:
                continue
            arrive_out(drv[0])
            a, launch = in_arrival((cell, data))
            ends.append((a + setup, cell, data, clk, setup, launch))
    ends.sort(key=lambda e: -e[0])

    def trace(cell, data, setup):
        steps = [("setup", setup, cell, data)]
        ip = (cell, data)
        while True:
            drv = nets.get(ip)
            if drv is None or drv[0] not in out_arr:
                break
            steps.append(("net", drv[1], ip[0], ip[1]))
            a = out_arr[drv[0]]
            prev = a[1]
            if prev is None:
                steps.append(("clk2q", a[0], drv[0][0], drv[0][1]))
                break
            d = a[0] - in_arrival(prev)[0]
            steps.append(("cell", d, drv[0][0], drv[0][1]))
            ip = prev
        steps.reverse()
        return steps

    if summary is not None:
        wire, total_ps = defaultdict(float), defaultdict(float)
        for total, cell, data, clk, setup, _launch in ends:
            cap = clock_of(cell, clk)
            sm = summary.setdefault(cap, {"endpoints": 0, "failing": 0, "histogram": {}})
            sm["endpoints"] += 1
            late = total / 1000 - period_ns
            if late > 0:
                sm["failing"] += 1
                sm["histogram"][int(late)] = sm["histogram"].get(int(late), 0) + 1
                wire[cap] += sum(ps for k, ps, _, _ in trace(cell, data, setup) if k == "net")
                total_ps[cap] += total
        for cap, sm in summary.items():
            sm["histogram"] = dict(sorted(sm["histogram"].items()))
            sm["wire_share"] = round(wire[cap] / total_ps[cap], 3) if total_ps[cap] else 0.0
    rows, seen = [], set()
    for total, cell, data, clk, setup, launch in ends:
        steps = trace(cell, data, setup)
        row = {"slack_ns": round(period_ns - total / 1000, 3), "arrival_ns": round(total / 1000, 3),
               "launch": launch, "capture": clock_of(cell, clk), "end": f"{cell}/{data}",
               "end_type": types.get(cell, "?"), "steps": steps}
        if distinct is not None:
            key = distinct(row)
            if key in seen:
                continue
            seen.add(key)
        rows.append(row)
        if len(rows) >= n:
            break
    return rows


def format_paths(rows, names=None, locs=None, types=None, width=100):
    """Text report of :func:`worst_paths` rows: per path its slack and each step with the net
    name (from :func:`placed_names`) and, for nets, the tile distance between the cells."""
    names, locs, types = names or {}, locs or {}, types or {}
    out = []
    for r in rows:
        out.append(f"slack {r['slack_ns']:+.2f} ns  arrival {r['arrival_ns']:.2f} ns  "
                   f"end {r['end']} ({r['end_type']})  clocks {r['launch']} -> {r['capture']}")
        prev_cell = None
        for kind, ps, cell, port in r["steps"]:
            if kind == "net":
                dist = ""
                if prev_cell in locs and cell in locs:
                    (x0, y0), (x1, y1) = locs[prev_cell], locs[cell]
                    dist = f" {abs(x1 - x0) + abs(y1 - y0):3d} tiles"
                label = f"net{dist} -> {types.get(cell, '')} {cell}/{port}"
            elif kind in ("clk2q", "cell"):
                net = names.get((cell, port), "")
                label = f"{kind:5s} {types.get(cell, '')}.{port}  {net}"
                prev_cell = cell
            else:
                label = f"setup {port}"
            out.append(f"  {ps / 1000:6.3f}  {label[:width]}")
    return "\n".join(out)


def block_spread(netlist, levels=2, min_cells=200):
    """Where each block of a placed nextpnr design lies: per block of the hierarchy
    (``levels`` deep) with at least ``min_cells`` placed logic, flip-flop, RAM and multiplier
    cells, the count, its block RAMs and the mean and standard deviation of the cells' tile
    x and y. Largest first. A block whose cells spread across the die pays for it in wire on
    every path between them."""
    mod = next(iter(netlist["modules"].values()))
    pos = defaultdict(list)
    for cname, c in mod["cells"].items():
        m = re.match(r"X(\d+)/Y(\d+)/", c.get("attributes", {}).get("NEXTPNR_BEL", ""))
        if m and c["type"] in SPREAD_TYPES:
            pos[block_of(cname, levels)].append((int(m.group(1)), int(m.group(2)), c["type"]))
    out = []
    for blk, p in pos.items():
        if len(p) < min_cells:
            continue
        xs, ys = [a[0] for a in p], [a[1] for a in p]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        out.append({"block": blk, "cells": len(p), "ebr": sum(a[2] == "DP16KD" for a in p),
                    "x": round(mx, 1), "y": round(my, 1),
                    "x_sd": round((sum((x - mx) ** 2 for x in xs) / len(xs)) ** 0.5, 1),
                    "y_sd": round((sum((y - my) ** 2 for y in ys) / len(ys)) ** 0.5, 1)})
    return sorted(out, key=lambda b: -b["cells"])


def _cell_nets(names):
    """cell -> the name of the net it drives: a flip-flop's ``Q``, else the most readable."""
    best = {}
    for (cell, port), net in names.items():
        key = (port != "Q", net.count("$"), len(net))
        if cell not in best or key < best[cell][0]:
            best[cell] = (key, net)
    return {cell: net for cell, (_, net) in best.items()}


def block_of(net, levels=2):
    """The block a net name belongs to: its hierarchy without the signal name, ``levels`` deep
    (``core.pipe``); ``top`` for names without hierarchy."""
    parts = net.split(" ")[0].split(".")
    return ".".join(parts[:-1][:levels]) or "top"


def analyse(workdir, period_ns, n=20, levels=3, sdf="placed.sdf", netlist="placed.json"):
    """Read ``workdir``/placed.sdf (and placed.json when there) and return (rows, text): the
    worst path of each pair of (start block, end block), ``n`` of them, worst first; each row
    also carries ``start_net``, ``end_net``, ``start_block`` and ``end_block``."""
    workdir = Path(workdir)
    parsed = parse_sdf((workdir / sdf).read_text())
    names, locs, placed = {}, {}, None
    if (workdir / netlist).exists():
        placed = json.loads((workdir / netlist).read_text())
        names, locs = placed_names(placed)
    cell_net = _cell_nets(names)

    def annotate(row):
        kind, _, cell, port = row["steps"][0]
        row["start_net"] = names.get((cell, port), cell)
        end_cell = row["end"].rpartition("/")[0]
        # Yosys names a flip-flop cell after the signal it drives (``x_TRELLIS_FF_Q_3``), while
        # nextpnr keeps one of a net's names, not always that signal's
        row["end_net"] = end_cell if "$" not in end_cell else cell_net.get(end_cell, end_cell)
        row["start_block"] = block_of(row["start_net"], levels)
        row["end_block"] = block_of(row["end_net"], levels)
        return row["start_block"], row["end_block"], row["launch"], row["capture"]

    summary = {}
    rows = worst_paths(parsed, period_ns, n=n, distinct=annotate, summary=summary)
    head = []
    for cap, sm in sorted(summary.items(), key=lambda kv: -kv[1]["endpoints"]):
        hist = ", ".join(f"{k}-{k + 1} ns: {v}" for k, v in sm["histogram"].items())
        head.append(f"clock {cap}: {sm['failing']} of {sm['endpoints']} endpoints miss "
                    f"{period_ns:g} ns" + (f" ({hist}); wire {sm['wire_share']:.0%} of their delay"
                                           if sm["failing"] else ""))
    spread = block_spread(placed, levels=max(levels - 1, 1)) if placed else []
    if spread:
        head.append("")
        head.append(f"{'cells':>7s} {'EBR':>4s}  {'x mean+-sd':>11s} {'y mean+-sd':>11s}  block "
                    f"(placed cells by hierarchy)")
        for b in spread[:25]:
            head.append(f"{b['cells']:7d} {b['ebr']:4d}  {b['x']:5.1f}+-{b['x_sd']:4.1f} "
                        f"{b['y']:5.1f}+-{b['y_sd']:4.1f}  {b['block']}")
    head += ["", f"{'slack':>7s} {'arrival':>7s}  start block -> end block  (start net -> end net)"]
    for r in rows:
        head.append(f"{r['slack_ns']:+7.2f} {r['arrival_ns']:7.2f}  {r['start_block']} -> "
                    f"{r['end_block']}  ({r['start_net']} -> {r['end_net']})")
    text = "\n".join(head) + "\n\n" + format_paths(rows, names, locs, parsed["types"])
    return rows, text, {"clocks": summary, "blocks": spread}


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.sdfpaths",
                                 description="the worst paths of a placed nextpnr design, from "
                                             "its SDF (--no-route --sdf placed.sdf --write "
                                             "placed.json)")
    ap.add_argument("workdir", help="folder holding placed.sdf (and placed.json)")
    ap.add_argument("--period", type=float, default=8.0, help="clock period in ns (8)")
    ap.add_argument("--paths", type=int, default=20, help="paths to print (20)")
    ap.add_argument("--levels", type=int, default=3, help="hierarchy levels of a block (3)")
    a = ap.parse_args(argv)
    rows, text, summary = analyse(a.workdir, a.period, a.paths, a.levels)
    out = Path(a.workdir)
    (out / "placed_paths.txt").write_text(text + "\n")
    (out / "placed_paths.json").write_text(json.dumps({**summary, "paths": rows}, indent=1) + "\n")
    print(text)
    print(f"written: {out / 'placed_paths.txt'}, placed_paths.json")
    return 0 if not rows or rows[0]["slack_ns"] >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
