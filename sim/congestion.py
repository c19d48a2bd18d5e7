"""Where nextpnr's router2 finds its routing congested, from the heatmaps it writes with
``--router2-heatmap <prefix>`` (``make bitstream BUILD_ARGS=--heatmap``).

router2 writes, after every iteration ``N``:

- ``<prefix>_congestion_by_coordinate_N.csv``: one line per tile column x, one value per tile row
  y: the summed use count of that tile's overused wires (used by two nets or more);
- ``<prefix>_congestion_by_net_N.csv``: ``net,overuse``, the net's share of that overuse (each
  overused wire it uses counts its users minus one);
- ``<prefix>_congestion_by_wiretype_N.csv``: per wire type, how many wires have 0, 1, 2 ... users.

nextpnr only writes these tables; this module reads the last iteration's and says which blocks of
the design (a net counts for the hierarchy its name starts with), which nets, which wire types and
which part of the die carry the overuse. Written by hand: nextpnr ships no reader for them.

::

    python -m stellar.sim.congestion build/ecpix5 [--prefix heat] [--levels 2] [-n 20]
"""

import argparse
import json
import re
from collections import Counter
from pathlib import Path

__all__ = ["iterations", "load", "summarize", "main"]


def iterations(workdir, prefix="heat"):
    """The router2 iterations with heatmaps in ``workdir``, ascending."""
    pat = re.compile(re.escape(prefix) + r"_congestion_by_net_(\d+)\.csv$")
    found = (pat.match(p.name) for p in Path(workdir).iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def _rows(path):
    with open(path) as f:
        return [[c for c in line.rstrip("\n").rstrip(",").split(",")] for line in f if line.strip()]


def load(workdir, iteration, prefix="heat"):
    """``{"grid": [[x][y] overuse], "nets": {net: overuse}, "types": {type: [count by users]}}``
    of one iteration's heatmaps."""
    base = Path(workdir) / prefix
    grid = [[int(v) for v in row if v != ""]
            for row in _rows(f"{base}_congestion_by_coordinate_{iteration}.csv")]
    nets = {}
    for row in _rows(f"{base}_congestion_by_net_{iteration}.csv"):
        name, value = ",".join(row[:-1]), int(row[-1])
        nets[name] = nets.get(name, 0) + value
    types = {}
    rows = _rows(f"{base}_congestion_by_wiretype_{iteration}.csv")
    for row in rows[1:]:
        types[row[0]] = [int(v) for v in row[1:] if v != ""]
    return {"grid": grid, "nets": nets, "types": types}


def block_of(net, levels=2):
    """The hierarchy a net name belongs to: its first ``levels`` dotted parts, without the
    names synthesis appends to the last one (``nic.pipe.slot__valid`` -> ``nic.pipe``)."""
    parts = net.split(".")
    if len(parts) <= 1:
        return "(top)"
    return ".".join(parts[:min(levels, len(parts) - 1)])


def _bands(values, width):
    total = sum(values) or 1
    return [(i, min(i + width, len(values)) - 1, sum(values[i:i + width]), sum(values[i:i + width]) / total)
            for i in range(0, len(values), width)]


def summarize(workdir, prefix="heat", iteration=None, levels=2, n=20, band=8, window=16):
    """(text, dict) for the last (or the given) iteration's heatmaps in ``workdir``."""
    its = iterations(workdir, prefix)
    if not its:
        raise FileNotFoundError(f"no {prefix}_congestion_by_net_N.csv in {workdir}")
    it = its[-1] if iteration is None else iteration
    h = load(workdir, it, prefix)
    grid, nets = h["grid"], h["nets"]
    overused = {t: sum(c[2:]) for t, c in h["types"].items() if sum(c[2:])}
    total_wires = sum(overused.values())
    net_total = sum(nets.values()) or 1
    blocks = Counter()
    for name, v in nets.items():
        blocks[block_of(name, levels)] += v
    xs = [sum(col) for col in grid]
    ys = [sum(col[y] for col in grid if y < len(col)) for y in range(max(map(len, grid), default=0))]
    grid_total = sum(xs) or 1
    # the densest window x window tiles (a summed-area table)
    W, H = len(grid), len(ys)
    sat = [[0] * (H + 1) for _ in range(W + 1)]
    for x in range(W):
        for y in range(H):
            v = grid[x][y] if y < len(grid[x]) else 0
            sat[x + 1][y + 1] = v + sat[x][y + 1] + sat[x + 1][y] - sat[x][y]
    best = (0, 0, 0)
    for x in range(max(W - window, 0) + 1):
        for y in range(max(H - window, 0) + 1):
            x1, y1 = min(x + window, W), min(y + window, H)
            s = sat[x1][y1] - sat[x][y1] - sat[x1][y] + sat[x][y]
            best = max(best, (s, x, y))
    found = {
        "iteration": it, "iterations": its, "overused_wires": total_wires,
        "overused_by_type": dict(sorted(overused.items(), key=lambda kv: -kv[1])),
        "blocks": {b: v for b, v in blocks.most_common()},
        "nets": dict(sorted(nets.items(), key=lambda kv: -kv[1])[:n]),
        "x_bands": _bands(xs, band), "y_bands": _bands(ys, band),
        "window": {"x": best[1], "y": best[2], "size": window, "share": best[0] / grid_total},
    }
    lines = [f"router2 congestion after iteration {it} ({workdir}): {total_wires} overused wires"]
    lines.append("  by wire type: " + ", ".join(
        f"{t.replace('WIRE_TYPE_', '')} {v}" for t, v in list(found["overused_by_type"].items())[:10]))
    lines.append(f"  by block (net overuse, {levels} levels):")
    for b, v in blocks.most_common(12):
        lines.append(f"    {b:<28} {v:7d}  {100 * v / net_total:5.1f} %")
    lines.append("  by tile row y (bands of %d): " % band + ", ".join(
        f"{a}-{b} {100 * s:.0f}%" for a, b, _, s in found["y_bands"] if s >= 0.005))
    lines.append("  by tile column x (bands of %d): " % band + ", ".join(
        f"{a}-{b} {100 * s:.0f}%" for a, b, _, s in found["x_bands"] if s >= 0.005))
    w = found["window"]
    lines.append(f"  densest {window} x {window} tiles: x {w['x']}-{w['x'] + window - 1}, "
                 f"y {w['y']}-{w['y'] + window - 1}: {100 * w['share']:.1f} % of the overuse "
                 f"({100 * window * window / max(W * H, 1):.1f} % of the grid)")
    lines.append(f"  nets with the most overuse (of {len(nets)}):")
    for name, v in found["nets"].items():
        lines.append(f"    {v:6d}  {name}")
    return "\n".join(lines), found


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.congestion",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="the nextpnr run's folder (build/<board>)")
    ap.add_argument("--prefix", default="heat", help="the --router2-heatmap prefix")
    ap.add_argument("--iteration", type=int, help="default: the last one")
    ap.add_argument("--levels", type=int, default=2, help="hierarchy levels per block")
    ap.add_argument("-n", type=int, default=20, help="nets to list")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    text, found = summarize(args.workdir, args.prefix, args.iteration, args.levels, args.n)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
