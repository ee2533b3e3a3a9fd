"""Writing tables as Markdown, LaTeX (booktabs) and CSV (long form: one line per cell, with
the numbers behind it)."""

from __future__ import annotations

import csv
import io

from sodaray.errors import shown
from sodaray.report.tables import Table

FORMATS = ("md", "latex", "csv")


def md_cell(text: str) -> str:
    """A table cell's text as Markdown data: control characters escaped (`shown`: a line
    break in a model's or dataset's name split the table's row) and `|` as `\\|`."""
    return shown(text).replace("|", "\\|")


def to_markdown(table: Table) -> str:
    lines = [f"### {shown(table.title)}", "", "| " + " | ".join(map(md_cell, table.header)) + " |"]
    lines.append("|" + "---|" * len(table.header))
    for label, cells in table.rows:
        texts = [label] + [c.text for c in cells]
        lines.append("| " + " | ".join(map(md_cell, texts)) + " |")
    lines += ["", f"*{shown(table.caption)}*", ""]
    return "\n".join(lines)


# LaTeX's special characters: seven escaped with a backslash, the rest spelled out.
_LATEX_SPECIAL = {ch: "\\" + ch for ch in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "±": r"$\pm$",
    "–": "--",
    "−": "$-$",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in shown(text))


def to_latex(table: Table) -> str:
    cols = "l" + "r" * (len(table.header) - 1)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{latex_escape(table.title)}. {latex_escape(table.caption)}}}",
        rf"\label{{tab:{table.name}}}",
        rf"\begin{{tabular}}{{{cols}}}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in table.header) + r" \\",
        r"\midrule",
    ]
    for label, cells in table.rows:
        texts = [label] + [c.text for c in cells]
        lines.append(" & ".join(map(latex_escape, texts)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def to_csv(table: Table) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["table", "row", "column", "text", "value", "low", "high", "se", "n"])
    for label, cells in table.rows:
        for column, cell in zip(table.header[1:], cells, strict=True):
            writer.writerow(
                [table.name, label, column, cell.text]
                + [
                    "" if x is None else x
                    for x in (cell.value, cell.low, cell.high, cell.se, cell.n)
                ]
            )
    return buf.getvalue()


RENDERERS = {"md": (to_markdown, "md"), "latex": (to_latex, "tex"), "csv": (to_csv, "csv")}
