"""The command line every Verilog top shares: ``python -m stellar.hdl.top.<top> [--width W]
[-o DIR]`` writes ``DIR/<top name>_w<W>.v``."""

import argparse
from pathlib import Path

__all__ = ["verilog_main"]


def verilog_main(top_name, convert, argv=None, *, module, widths=(64, 512)):
    """Parse ``argv`` and write ``convert(width)`` (Verilog text) to the output folder.

    ``module``: the top's module name, for the usage line. ``widths``: the data widths the top
    accepts (``None``: any). Returns the path written."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}",
                                 description=f"Write the {top_name} Verilog top.")
    ap.add_argument("--width", type=int, default=64, choices=widths, help="data width in bits")
    ap.add_argument("-o", "--output", default="build/verilog", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.output) / f"{top_name}_w{args.width}.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(convert(args.width))
    print(f"wrote {out}")
    return out
