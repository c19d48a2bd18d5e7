# Ref: /work/shared/captures/README.md (the corpus, its sources and its expected counts);
#      IBTA Vol 1 Annex A17 "RoCEv2" (UDP destination port 4791).
"""The shared corpus of real RoCEv2 captures (frames recorded from real NICs by other people).

Located by ``STELLAR_CAPTURES`` if set, else ``<repo root>/../shared/captures`` (repo root: the
folder holding ``sim/``), else, for a clone with no ``../shared`` beside it, beside the local
checkout named by its ``origin`` remote. Two file kinds: ``.pcap`` (Ethernet linktype, no FCS) and ``.txt``
(one frame in hex per line, ``#`` lines are comments).
"""

import os
import re
import subprocess
from pathlib import Path

from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.utils import RawPcapReader

__all__ = ["captures_dir", "load_captures", "read_hex", "is_rocev2"]

ROCEV2_UDP_PORT = 4791  # restated, not imported: this classification stays scapy-only
DLT_EN10MB = 1


def captures_dir():
    env = os.environ.get("STELLAR_CAPTURES")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent
    beside = repo.parent / "shared" / "captures"
    if beside.is_dir():
        return beside
    # A throwaway clone (``git clone . $(mktemp -d)``) has no ``../shared``; the checkout it was
    # cloned from does. Only a local origin is followed: a URL names no folder.
    origin = _local_origin(repo)
    if origin is not None and (origin.parent / "shared" / "captures").is_dir():
        return origin.parent / "shared" / "captures"
    return beside


def _local_origin(repo):
    try:
        url = subprocess.run(["git", "-C", str(repo), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return None
    if not url:
        return None
    if url.startswith("file://"):
        url = url[len("file://"):]
    elif "://" in url or re.match(r"^[^/]+:", url):
        return None
    path = Path(url)
    if not path.is_absolute():
        path = (repo / path).resolve()
    if path.name == ".git":
        path = path.parent
    return path if path.is_dir() else None


def read_hex(path):
    """Frames of a hex file: one per non-empty, non-``#`` line (whitespace inside is ignored)."""
    frames = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            frames.append(bytes.fromhex("".join(line.split())))
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not a hex frame: {e}") from None
    return frames


def _read_pcap(path):
    # Raw records, exactly as captured: a dissect-and-rebuild through scapy packets could alter
    # bytes of frames scapy does not fully understand.
    with RawPcapReader(str(path)) as r:
        if r.linktype != DLT_EN10MB:
            raise ValueError(f"{path}: linktype {r.linktype}, expected Ethernet ({DLT_EN10MB})")
        return [bytes(data) for data, _meta in r]


def load_captures(directory=None):
    """``{file name: [frame bytes, ...]}`` for every .pcap/.pcapng and .txt file, sorted by name."""
    directory = Path(directory) if directory is not None else captures_dir()
    if not directory.is_dir():
        raise FileNotFoundError(f"capture corpus not found at {directory}; set STELLAR_CAPTURES "
                                f"to the folder holding the .pcap/.txt captures")
    out = {}
    for path in sorted(directory.iterdir()):
        if path.suffix in (".pcap", ".pcapng"):
            out[path.name] = _read_pcap(path)
        elif path.suffix == ".txt":
            out[path.name] = read_hex(path)
    return out


def is_rocev2(frame):
    """Ether [/ one 802.1Q tag] / IPv4 or IPv6 / UDP with destination port 4791, the UDP header
    directly after the IP header (scapy's dissection decides; no Stellar code involved)."""
    pkt = Ether(bytes(frame))
    l3 = pkt.payload
    if isinstance(l3, Dot1Q):
        l3 = l3.payload
    if not isinstance(l3, (IP, IPv6)):
        return False
    l4 = l3.payload
    return isinstance(l4, UDP) and l4.dport == ROCEV2_UDP_PORT
