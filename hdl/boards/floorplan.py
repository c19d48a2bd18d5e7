"""Block RAM floorplan for the ECP5 85k die: every ``DP16KD`` of a synthesized netlist pinned to
an EBR site so that each memory's block RAMs sit side by side and the memories of one block
follow one another.

Why: the NIC core at 256 QPs uses 202 of the die's 208 block RAMs. Left to itself, nextpnr's
placer has no free sites to keep a memory together: in the ECPIX-5 placements of 2026-12-06 every
row held block RAMs of the transport's send queue, the scheduler, the device memory and the
reaction point side by side, each memory spread over all four rows, and the logic of every block
stretched over the die to reach them (router2 never got below about 10,000 overused wires). Pinned
with this plan, the same netlist and seed placed with 20 % less wire and routed to a small
fraction of that (README, board notes). A floorplan of the block RAMs is what an FPGA engineer
would draw by hand; nextpnr-ecp5 from YoWASP has no Python (so no placement regions), but it
honours a cell's ``BEL`` attribute, which is what this writes into the JSON netlist between
synthesis and place-and-route.

The plan: memories are the ``DP16KD`` cells grouped by name without their last two indices (Yosys
names a memory's block RAMs ``<memory>.<row>.<column>``), ordered by ``BLOCK_ORDER`` (the receive
pipeline, the MR table first, then the transport and the TX builder, congestion control, DMA,
device memory, MAC), and laid out in that order along a serpentine over the EBR rows (the row at
y 82 left to right, the one at y 70 right to left, ...), so that consecutive memories, and the
blocks that pass data to each other, are neighbours. Cells that already have a ``BEL`` keep it
(their sites are not reused).

``python -m stellar.hdl.boards.floorplan <netlist.json> --device 85k`` rewrites the netlist in
place and prints the plan; ``stellar.hdl.boards.build`` runs it for the devices in ``EBR_SITES``.
"""

import argparse
import json
import re
import sys

__all__ = ["EBR_SITES", "BLOCK_ORDER", "ebr_sites", "memories", "plan", "apply", "main"]

# EBR sites of the 85k die (LFE5U-85F, LFE5UM-85F, LFE5UM5G-85F), as nextpnr-ecp5 names them:
# four rows of 52, the same columns in each (read from nextpnr placements of the ECPIX-5 core:
# 202 sites used, the 6 free ones at the end of row 82).
_X85 = (4, 6, 8, 10, 13, 15, 17, 19, 22, 24, 26, 28, 31, 33, 35, 37, 40, 42, 44, 46, 49, 51, 53, 55,
        58, 60, 62, 64, 69, 71, 73, 75, 78, 80, 82, 84, 87, 89, 91, 93, 96, 98, 100, 102, 105, 107,
        109, 111, 114, 116, 118, 120)
EBR_SITES = {
    "85k": {"rows": (82, 70, 46, 22), "columns": _X85},
}

# Memory name prefixes in layout order (the first that matches counts); memories matching none
# come last, in name order. The MR table first: in the corner at the start of the first row it
# is not next to the transport's QP state memory. Placed after the pipeline's other memories it
# sat just above it, and the two blocks' logic and the CSR bank's MR group met there: with that
# order the ECPIX-5 core's best route (seed 1, main at a85faf6) kept 378 overused wires; with
# this one the same netlist and seed routed (2026-12-07, README board notes).
BLOCK_ORDER = ("nic.pipe.mr", "nic.pipe", "nic.transport", "nic.builder", "nic.cc", "nic.dma",
               "ram", "mac")


def ebr_sites(device):
    """The EBR site names of ``device`` in serpentine order (first row left to right, the next
    right to left, ...). Within a tile the four sites are EBR0..EBR3, one per column."""
    grid = EBR_SITES[device]
    sites = []
    for i, y in enumerate(grid["rows"]):
        row = [f"X{x}/Y{y}/EBR{k % 4}" for k, x in enumerate(grid["columns"])]
        sites += row if i % 2 == 0 else row[::-1]
    return sites


def _top(netlist):
    tops = [m for m in netlist["modules"].values() if m.get("attributes", {}).get("top")]
    if len(tops) != 1:
        raise ValueError(f"expected one top module, found {len(tops)}")
    return tops[0]


def memories(netlist):
    """``{memory: [cell names]}`` of the netlist's ``DP16KD`` cells without a ``BEL``."""
    mems = {}
    for name, cell in sorted(_top(netlist)["cells"].items()):
        if cell["type"] == "DP16KD" and "BEL" not in cell.get("attributes", {}):
            mems.setdefault(re.sub(r"\.\d+\.\d+$", "", name), []).append(name)
    return mems


def _rank(memory, order):
    for i, prefix in enumerate(order):
        if memory == prefix or memory.startswith(prefix + "."):
            return i
    return len(order)


def _cell_key(name):
    # numeric order of the trailing indices (.0.10 after .0.9)
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def plan(netlist, device, order=BLOCK_ORDER):
    """``[(memory, [(cell, site), ...]), ...]`` in layout order. Raises ``ValueError`` when the
    memories need more sites than are free."""
    taken = {c["attributes"]["BEL"] for c in _top(netlist)["cells"].values()
             if c["type"] == "DP16KD" and "BEL" in c.get("attributes", {})}
    free = [s for s in ebr_sites(device) if s not in taken]
    mems = memories(netlist)
    need = sum(len(cells) for cells in mems.values())
    if need > len(free):
        raise ValueError(f"{need} block RAMs to place, {len(free)} EBR sites free on {device}")
    out = []
    i = 0
    for mem in sorted(mems, key=lambda m: (_rank(m, order), m)):
        cells = sorted(mems[mem], key=_cell_key)
        out.append((mem, list(zip(cells, free[i:i + len(cells)], strict=True))))
        i += len(cells)
    return out


def apply(netlist, device, order=BLOCK_ORDER):
    """Write the plan's sites into the cells' ``BEL`` attributes; returns the plan."""
    cells = _top(netlist)["cells"]
    layout = plan(netlist, device, order)
    for _mem, placed in layout:
        for cell, site in placed:
            cells[cell].setdefault("attributes", {})["BEL"] = site
    return layout


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.boards.floorplan",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("netlist", help="Yosys JSON netlist, rewritten in place")
    ap.add_argument("--device", choices=sorted(EBR_SITES), required=True)
    args = ap.parse_args(argv)
    with open(args.netlist) as f:
        netlist = json.load(f)
    layout = apply(netlist, args.device)
    with open(args.netlist, "w") as f:
        json.dump(netlist, f)
    used = sum(len(p) for _m, p in layout)
    print(f"floorplan: {used} block RAMs of {len(layout)} memories pinned "
          f"({len(ebr_sites(args.device))} EBR sites on the {args.device} die)")
    for mem, placed in layout:
        print(f"  {mem:40s} {len(placed):3d}  {placed[0][1]} .. {placed[-1][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
