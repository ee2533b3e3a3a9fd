"""How the report draws a figure: its PNG file, axes, legend, titles and the styles that tell
series apart (colour, marker, dash and hatching). The legend sits beside the axes, never over the
data; each panel's title names its n (samples), each caption the n of every panel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from sodaray.io.writes import OutputFolder


@dataclass
class Plot:
    """A drawn figure and its caption: what a reader needs beside it (what each line, bar and
    band is, and the n of each panel)."""

    figure: Any  # matplotlib.figure.Figure
    caption: str


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster head or in CI
    import matplotlib.pyplot as plt

    return plt


def _clear_suptitle(fig) -> None:
    """In a tall figure tight_layout can leave the suptitle over the first panel's title: the
    panels then give up the band down to the suptitle's lowest line."""
    from matplotlib.text import Text

    text = fig.get_suptitle()
    found = [c for c in fig.get_children() if isinstance(c, Text) and c.get_text() == text]
    if not text or not found:
        return
    renderer = fig.canvas.get_renderer()
    bottom = found[0].get_window_extent(renderer).y0
    tops = [ax.get_tightbbox(renderer).y1 for ax in fig.axes]
    if tops and max(tops) > bottom:
        fig.tight_layout(rect=(0, 0, 1, bottom / fig.bbox.height))


def save(fig, path: Path, out: OutputFolder | None = None, dpi: int = 120) -> Path:
    """The figure as PNG at `path`, closed, by the rule for every file sodaray writes
    (`writes.write_file`: nothing through a link below `out`, by default `path`'s folder)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()  # the legends beside the axes are part of each axes' tight box
    _clear_suptitle(fig)
    out = OutputFolder(path.parent) if out is None else out
    out.write(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    plt.close(fig)
    return path


# A percent axis from a little below 0 to a little above 100: a curve or point at 0 (or 100)
# would otherwise lie on the frame, where a reader cannot see it.
PERCENT_LIMITS = (-4, 104)


def percent_axis(ax) -> None:
    ax.set_ylim(*PERCENT_LIMITS)


def integer_axis(axis) -> None:
    """Ticks on whole numbers only (steps, positions): no half-step ticks on a short range."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


# Series j gets colour, marker, dash and hatch j: any one tells two series apart (in greyscale,
# for a colour-blind reader, where two lie on each other); hatches of different directions over
# a pale fill keep coinciding 95% bands readable.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
_ON_OFF = ((5, 1, 1, 1, 1, 1), (8, 2), (1, 1), (4, 1, 1, 1, 1, 1, 1, 1))  # dash and gap lengths
DASHES: tuple[Any, ...] = ("-", "--", "-.", ":", *((0, pattern) for pattern in _ON_OFF))
HATCHES = ("//", "\\\\", "||", "--", "xx", "..", "++", "oo")
BAND_ALPHA = 0.08  # the band's fill: pale enough that a curve and other hatchings show through
EDGE_ALPHA = 0.6  # its hatching and outline


class Style(NamedTuple):
    color: str
    marker: str
    dash: Any
    hatch: str


def series_style(j: int) -> Style:
    """Series j's colour, marker, dash and hatch (each cycles on its own length)."""
    return Style(
        f"C{j % 10}", MARKERS[j % len(MARKERS)], DASHES[j % len(DASHES)], HATCHES[j % len(HATCHES)]
    )


def rgba(color: str, alpha: float) -> tuple[float, float, float, float]:
    from matplotlib.colors import to_rgba

    return to_rgba(color, alpha)


def interval_band(ax, xs, intervals, color: str, hatch: str, **style):
    """An interval ((low, high) shares at each x) as a hatched band over a pale fill, in %."""
    return ax.fill_between(
        xs,
        [100 * low for low, _ in intervals],
        [100 * high for _, high in intervals],
        facecolor=rgba(color, BAND_ALPHA),
        edgecolor=rgba(color, EDGE_ALPHA),
        hatch=hatch,
        **style,
    )


def legend_outside(ax, handles: list, labels: list[str], title: str | None = None) -> None:
    """The legend to the right of the axes, outside the data; a (patch, line) handle draws the
    series' hatched band with its line and marker over it."""
    from matplotlib.legend_handler import HandlerTuple

    ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize="small",
        title=title,
        title_fontsize="small",
        handler_map={tuple: HandlerTuple(ndivide=None, pad=0.0)},
        handlelength=3.0,
    )


def known_count(rows: pd.DataFrame) -> int:
    """Samples behind a point: rows whose true input is known (exact is defined)."""
    return int(rows["exact"].notna().sum())


def title(rows: pd.DataFrame, what: str, panel_counts: list[int] | None = None) -> str:
    """`what`, then the model(s), sweep(s) and n: the one panel's, n per panel where all panels
    hold the same number, else a pointer to the panels' own titles (never the sum, which no
    panel shows)."""

    def names(column: str) -> str:
        values = sorted({str(v) for v in rows[column].dropna() if str(v)})
        return ", ".join(values[:3]) + (f" +{len(values) - 3}" if len(values) > 3 else "")

    sweeps = names("sweep")
    parts = [names("model_name"), f"sweep {sweeps}" if sweeps else ""]
    counts = panel_counts or [known_count(rows)]
    if len(counts) == 1:
        parts.append(f"n={counts[0]}")
    elif len(set(counts)) == 1:
        parts.append(f"{len(counts)} panels, n={counts[0]} each")
    else:
        parts.append(f"{len(counts)} panels, n in each panel's title")
    return what + "\n" + " · ".join(p for p in parts if p)  # two lines: fits a narrow figure


def source(rows: pd.DataFrame) -> str:
    """Model(s) and sweep(s) of a caption."""
    models = ", ".join(sorted({str(v) for v in rows["model_name"].dropna()}))
    sweeps = ", ".join(sorted({str(v) for v in rows["sweep"].dropna() if str(v)}))
    return f"SODA on {models}" + (f", sweep {sweeps}" if sweeps else "")
