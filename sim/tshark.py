# Ref: Wireshark 4.0 tshark(1) (-T json, --no-duplicate-keys, --disable-protocol); Wireshark
#      epan/proto.h expert severities (PI_COMMENT .. PI_ERROR).
"""tshark as an independent dissector of what the tests build and what the design emits.

Two heuristic dissectors are disabled on every run: ``rpcordma`` (RPC-over-RDMA) and
``infiniband.eoib`` (Ethernet over InfiniBand) claim SEND payloads whose first bytes happen to
look like their headers, so random payloads would be dissected (and flagged malformed) as
protocols that are not there.
"""

import json
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["TsharkMissing", "ExpertInfo", "DISABLED_PROTOCOLS", "TOLERATED", "tshark_path",
           "dissect", "flatten", "expert_infos", "expert_errors"]

DISABLED_PROTOCOLS = ("rpcordma", "infiniband.eoib")
# tshark does not verify IPv4/UDP checksums unless asked; ask, so a wrong one is an expert error
# ("ip.checksum_bad.expert", ...) and "ip.checksum.status" reads 0 (bad) or 1 (good).
PREFS = {"ip.check_checksum": "TRUE", "udp.check_checksum": "TRUE"}

# Expert severities as tshark's JSON prints them (epan/proto.h PI_*).
SEVERITIES = {0x00100000: "comment", 0x00200000: "chat", 0x00400000: "note",
              0x00600000: "warn", 0x00800000: "error"}
_SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES.values())}

# The one expert message Stellar's traffic is allowed to raise: RFC 8200 forbids a zero UDP
# checksum over IPv6, but RoCEv2 senders send 0 over IPv6 as over IPv4 (the ICRC covers the
# packet). tshark 4.0 reports it as field ``udp.checksum.zero``, "Illegal checksum value (0)",
# severity error, group checksum; it does not report it for IPv4.
TOLERATED = ("udp.checksum.zero",)


class TsharkMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class ExpertInfo:
    frame: int          # 1-based frame number, as tshark counts
    field: str          # the expert field, e.g. "udp.length.bad", "_ws.malformed.expert"
    message: str
    severity: str       # comment / chat / note / warn / error
    ipv6: bool          # the frame has an IPv6 layer (for the tolerated zero-checksum case)


def tshark_path():
    path = shutil.which("tshark")
    if path is None:
        raise TsharkMissing("tshark is not on PATH; it is the independent packet dissector the "
                            "tests compare against. Install it with `make tshark` (Debian/Ubuntu "
                            "package `tshark`).")
    return path


def _run(pcap_path, *args):
    cmd = [tshark_path(), "-r", str(pcap_path), *args]
    for proto in DISABLED_PROTOCOLS:
        cmd += ["--disable-protocol", proto]
    for pref, value in PREFS.items():
        cmd += ["-o", f"{pref}:{value}"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    return res.stdout


def dissect(pcap_path):
    """Per frame, tshark's protocol tree: ``{protocol: {field: value, field + "_tree": {...}}}``.

    Values are tshark's strings (decimal, "0x..." or colon-separated bytes, as the field's
    display base says). Repeated keys are merged into lists (``--no-duplicate-keys``), so nothing
    tshark shows is silently lost.
    """
    out = _run(pcap_path, "-T", "json", "--no-duplicate-keys")
    return [pkt["_source"]["layers"] for pkt in json.loads(out or "[]")]


def flatten(tree):
    """Every ``field: value`` of a (sub)tree, subtrees inlined; repeated fields become lists."""
    flat = {}

    def add(k, v):
        if k in flat:
            prev = flat[k] if isinstance(flat[k], list) else [flat[k]]
            flat[k] = prev + (v if isinstance(v, list) else [v])
        else:
            flat[k] = v

    def walk(node):
        for k, v in node.items():
            items = v if isinstance(v, list) else [v]
            for item in items:
                if isinstance(item, dict):
                    walk(item)
                else:
                    add(k, item)
    walk(tree)
    return flat


def _experts(node, found):
    if isinstance(node, list):
        for item in node:
            _experts(item, found)
    elif isinstance(node, dict):
        for k, v in node.items():
            if k == "_ws.expert":
                for e in (v if isinstance(v, list) else [v]):
                    found.append(e)
            elif k == "_ws.malformed" and isinstance(v, str):
                found.append({"_ws.malformed": "", "_ws.expert.message": v,
                              "_ws.expert.severity": str(0x00800000)})
            else:
                _experts(v, found)


def expert_infos(pcap_path, min_severity="note"):
    """All expert infos (and malformed-packet marks) at or above ``min_severity``."""
    result = []
    for number, layers in enumerate(dissect(pcap_path), 1):
        found = []
        _experts(layers, found)
        seen = set()
        for e in found:
            fields = [k for k in e if not k.startswith("_ws.expert")]
            field = fields[0] if fields else "?"
            sev = SEVERITIES.get(int(e.get("_ws.expert.severity", 0)), "unknown")
            info = ExpertInfo(number, field, e.get("_ws.expert.message", ""), sev, "ipv6" in layers)
            if _SEVERITY_RANK.get(sev, 99) >= _SEVERITY_RANK[min_severity] and info not in seen:
                seen.add(info)
                result.append(info)
    # A bare "_ws.malformed" mark comes with the "_ws.malformed.expert" entry of the same frame:
    # keep the mark only where tshark gave no expert entry for it.
    malformed = {e.frame for e in result if e.field == "_ws.malformed.expert"}
    return [e for e in result if not (e.field == "_ws.malformed" and e.frame in malformed)]


def expert_errors(pcap_path):
    """Warnings, errors and malformed packets, minus the tolerated zero UDP checksum on IPv6."""
    return [e for e in expert_infos(pcap_path, "warn")
            if not (e.field in TOLERATED and e.ipv6)]
