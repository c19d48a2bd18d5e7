"""Plots for the congestion-control bench: per-flow rates, two schemes side by side, and the
switch queue. PNG files, drawn off screen.

Every function builds a ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot, so no
global figure state, no GUI backend and nothing to close), writes ``path`` (parent
directories created) and returns it as a ``pathlib.Path``.

* :func:`plot_rates` -- ``series = {label: [(t_us, value), ...]}``: one line per flow (e.g.
  :meth:`stellar.sim.switch.FlowMonitor.series_us`, Mb/s against microseconds).
* :func:`plot_side_by_side` -- two such dicts in two panels sharing the y axis (DCQCN vs
  FlowMatrix), so the rates compare at a glance.
* :func:`plot_queue` -- ``samples = [(t, bytes), ...]``, the step function of
  :attr:`stellar.sim.switch.QueueStats.samples` (each point holds until the next), optionally
  with the RED thresholds as horizontal lines.
"""

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["plot_rates", "plot_side_by_side", "plot_queue"]

_SIZE = (8, 4.5)        # inches; at 100 dpi an 800x450 PNG
_DPI = 100


def _save(fig, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=_DPI)
    return path


def _draw_rates(ax, series, title, ylabel, xlabel):
    # Sorted by label so that a flow keeps its colour from one plot to the next.
    for label in sorted(series, key=str):
        pts = series[label]
        ax.plot([float(t) for t, _ in pts], [float(v) for _, v in pts], label=str(label),
                linewidth=1.2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(fontsize="small", loc="best")


def plot_rates(series, path, title, ylabel="Mb/s", xlabel="time (us)"):
    """One line per flow: ``series = {label: [(t_us, value), ...]}``. Returns the path."""
    fig = Figure(figsize=_SIZE)
    _draw_rates(fig.add_subplot(), series, title, ylabel, xlabel)
    fig.tight_layout()
    return _save(fig, path)


def plot_side_by_side(left, right, path, titles, ylabel="Mb/s", xlabel="time (us)",
                      suptitle=None):
    """Two rate plots (``left``, ``right``: dicts as for :func:`plot_rates`) side by side on one
    y scale; ``titles = (left title, right title)``. Returns the path."""
    fig = Figure(figsize=(2 * _SIZE[0], _SIZE[1]))
    ax_l, ax_r = fig.subplots(1, 2, sharey=True)
    _draw_rates(ax_l, left, titles[0], ylabel, xlabel)
    _draw_rates(ax_r, right, titles[1], "", xlabel)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return _save(fig, path)


def plot_queue(samples, path, title="switch queue", xlabel="cycle", ylabel="bytes",
               kmin=None, kmax=None):
    """The queue occupancy as a step function of ``samples = [(t, bytes), ...]`` (the value
    holds from its time to the next point's); ``kmin``/``kmax`` draw the RED thresholds."""
    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    ax.step([float(t) for t, _ in samples], [float(q) for _, q in samples], where="post",
            linewidth=1.0, label="occupancy")
    for value, name, style in ((kmin, "Kmin", ":"), (kmax, "Kmax", "--")):
        if value is not None:
            ax.axhline(float(value), color="grey", linestyle=style, linewidth=1.0, label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if kmin is not None or kmax is not None:
        ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    return _save(fig, path)
