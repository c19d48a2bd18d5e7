"""stellar.sim.ccplot: each helper writes a PNG of the expected size (checked from the file's
signature and IHDR chunk, not through matplotlib), for small and degenerate inputs."""

import struct
from fractions import Fraction

from stellar.sim import ccplot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


RATES = {0x11: [(0.0, 9000.0), (0.4, 4500.0), (0.8, 5000)],
         0x12: [(0.0, 0.0), (0.4, 4400.0), (0.8, Fraction(9000, 2))]}


def test_plot_rates(tmp_path):
    p = ccplot.plot_rates(RATES, tmp_path / "sub" / "rates.png", "two flows")
    assert p == tmp_path / "sub" / "rates.png"
    assert png_size(p) == (800, 450)
    # An empty plot still draws (no legend).
    assert png_size(ccplot.plot_rates({}, tmp_path / "empty.png", "nothing")) == (800, 450)


def test_plot_side_by_side(tmp_path):
    p = ccplot.plot_side_by_side(RATES, {"a": [(0, 1), (1, 2)]}, tmp_path / "sbs.png",
                                 ("DCQCN", "FlowMatrix"), suptitle="4 flows")
    assert png_size(p) == (1600, 450)


def test_plot_queue(tmp_path):
    samples = [(0, 0), (0, 124), (Fraction(31, 2), 248), (41, 124), (72, 0)]
    p = ccplot.plot_queue(samples, tmp_path / "q.png", kmin=100, kmax=200)
    assert png_size(p) == (800, 450) and p.stat().st_size > 1000
