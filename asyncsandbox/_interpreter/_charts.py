"""A matplotlib figure's data as E2B's chart (``e2b/chart``), for the results a kernel
displays (:mod:`._kernel`). Shipped with the runner (see :data:`._engine.RUNNER`); it
imports matplotlib's modules only for a figure the code drew with matplotlib.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: nothing is imported that the runner does not use
if TYPE_CHECKING:
    from typing import Any

MAX_CHART = 1 << 20
"""Largest chart (JSON bytes) a figure's result carries (past it: the image alone)."""


def figure_chart(figure: Any) -> dict[str, Any] | None:
    """A matplotlib figure's data in E2B's chart format (``e2b/chart``): per axes a
    ``line``, ``scatter``, ``bar``, ``pie`` or ``box_and_whisker`` chart (else ``unknown``,
    without elements), several axes as a ``superchart``; ``None`` for a blank figure."""
    axes = figure.get_axes()
    if not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return axes_chart(axes[0])
    get_suptitle = getattr(figure, "get_suptitle", None)  # matplotlib 3.8 and later
    if get_suptitle is not None:
        title = get_suptitle()
    else:
        suptitle = figure._suptitle  # matplotlib before 3.8: no public accessor
        title = suptitle.get_text() if suptitle is not None else ""
    return {
        "type": "superchart",
        "title": title or None,
        "elements": [axes_chart(ax) for ax in axes],
    }


def axes_chart(ax: Any) -> dict[str, Any]:
    Line2D = matplotlib("lines").Line2D
    PathCollection = matplotlib("collections").PathCollection
    patches = matplotlib("patches")
    PathPatch, Rectangle, Wedge = patches.PathPatch, patches.Rectangle, patches.Wedge

    drawn = [*ax.lines, *ax.collections, *ax.patches, *ax.images, *ax.tables, *ax.artists]
    if all(isinstance(a, Line2D) for a in drawn):
        kind = "line"
    elif all(isinstance(a, (PathPatch, Line2D)) for a in drawn):
        kind = "box_and_whisker"
    else:
        rest = [a for a in drawn if not (isinstance(a, Line2D) and straight(a))]
        kind = "unknown"
        for name, types in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
            if rest and all(isinstance(a, types) for a in rest):
                kind = name
                break
    chart: dict[str, Any] = {"type": kind, "title": ax.get_title() or None, "elements": []}
    if kind in ("unknown", "pie"):
        if kind == "pie":
            chart["elements"] = [
                {"label": w.get_label(), "angle": rounded(abs(w.theta2 - w.theta1)), "radius": w.r}
                for w in ax.patches
            ]
        return chart
    for axis in ("x", "y"):
        label = getattr(ax, "get_%slabel" % axis)() or None
        chart["%s_label" % axis] = label
        chart["%s_unit" % axis] = unit(label)
    if kind in ("line", "scatter"):
        for axis in ("x", "y"):
            chart.update(scale(ax, axis))
        if kind == "line":
            lines = [line for line in ax.get_lines() if not straight(line)]
            chart["elements"] = [
                {"label": line_label(line.get_label()),
                 "points": [[point(x), point(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]}  # noqa: B905
                for line in lines
            ]  # fmt: skip
        else:
            chart["elements"] = [
                {"label": c.get_label(), "points": [[float(x), float(y)] for x, y in c.get_offsets()]}
                for c in ax.collections
            ]  # fmt: skip
    elif kind == "bar":
        chart["elements"] = bars(ax, chart)
    else:
        chart["elements"] = boxes(ax, chart)
    return chart


def matplotlib(name: str) -> Any:
    """A module of matplotlib (imported: the code drew a figure with it)."""
    import importlib

    return importlib.import_module("matplotlib." + name)


def straight(line: Any) -> bool:
    """An axis-parallel segment of two points (``axhline``, ``axvline``): no data."""
    xs, ys = line.get_xdata(), line.get_ydata()
    return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1])


def unit(label: str | None) -> str | None:
    import re

    match = re.search(r" \(([^)]*)\)|\[([^\]]*)\]", label or "")
    return (match.group(1) or match.group(2)) if match else None


def rounded(value: Any) -> float:
    """A drawn value without what float arithmetic added to it: as many significant
    digits as E2B keeps (8 less the value's decimal exponent, at least 1)."""
    import math

    number = float(value)
    if number == 0 or not math.isfinite(number):
        return number
    digits = max(1, 8 - math.floor(math.log10(abs(number))))
    return float("%.*g" % (digits, number))


def point(value: Any) -> Any:
    import datetime

    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if type(value).__name__ == "datetime64":
        return str(value.astype("datetime64[s]"))
    return value.item() if hasattr(value, "item") else value


def line_label(label: str) -> str:
    return "Line %s" % label[6:] if label.startswith("_child") else label


def scale(ax: Any, axis: str) -> dict[str, Any]:
    """An axis's ticks (dates in ISO format), their labels and its scale (``linear``,
    ``datetime``, ``categorical`` or matplotlib's name: ``log``, ...)."""
    category, mdates = matplotlib("category"), matplotlib("dates")
    which = getattr(ax, axis + "axis")
    formatter = which.get_major_formatter()
    ticks = list(getattr(ax, "get_%sticks" % axis)())
    labels = [t.get_text() for t in getattr(ax, "get_%sticklabels" % axis)()]
    dates = (mdates.AutoDateFormatter, mdates.ConciseDateFormatter, mdates.DateFormatter)
    if isinstance(formatter, dates):
        kind = "datetime"
        ticks = [mdates.num2date(t).isoformat() for t in ticks]
    else:
        kind = getattr(ax, "get_%sscale" % axis)()
        if kind == "linear" and isinstance(formatter, category.StrCategoryFormatter):
            kind = "categorical"
        ticks = [float(t) for t in ticks]
    return {axis + "_ticks": ticks, axis + "_tick_labels": labels, axis + "_scale": kind}


def bars(ax: Any, chart: dict[str, Any]) -> list[dict[str, Any]]:
    """One element per bar: its group (the container's label), its category (the tick
    label at its place, else its place) and its value."""
    found = []
    for number, container in enumerate(ax.containers):
        group = container.get_label()
        if group.startswith("_container"):
            group = "Group %s" % group[10:]
        horizontal = getattr(container, "orientation", None) == "horizontal"
        axis = "y" if horizontal else "x"
        ticks = getattr(ax, "get_%sticks" % axis)()
        tick_labels = getattr(ax, "get_%sticklabels" % axis)()
        names = {rounded(t): label.get_text() for t, label in zip(ticks, tick_labels)}  # noqa: B905 - Python 3.8
        values = getattr(container, "datavalues", None)
        for i, bar in enumerate(container):
            x, y, width, height = bar.get_x(), bar.get_y(), bar.get_width(), bar.get_height()
            where = rounded(y + height / 2 if horizontal else x + width / 2)
            value = values[i] if values is not None else (width if horizontal else height)
            found.append({"label": names.get(where) or str(where), "group": group,
                          "value": float(value)})  # fmt: skip
        if horizontal and number == 0:  # the categories are on y: E2B's x is theirs
            swap_axes(chart)
    return found


def swap_axes(chart: dict[str, Any]) -> None:
    chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
    chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]


def boxes(ax: Any, chart: dict[str, Any]) -> list[dict[str, Any]]:
    """From what ``boxplot(patch_artist=True)`` drew: each box (quartiles), the segments
    beside it (whiskers: min and max), across it (median) and its markers (outliers)."""
    spans = []
    for patch in ax.patches:
        vertices = patch.get_path().vertices
        spans.append((min(vertices[:, 0]), max(vertices[:, 0]),
                      min(vertices[:, 1]), max(vertices[:, 1])))  # fmt: skip
    widths = {rounded(x1 - x0) for x0, x1, _, _ in spans}
    vertical = len(widths) == 1
    if not vertical:  # horizontal boxes: read them with the axes swapped
        spans = [(y0, y1, x0, x1) for x0, x1, y0, y1 in spans]
        swap_axes(chart)
    labels = [t.get_text() for t in (ax.get_xticklabels() if vertical else ax.get_yticklabels())]
    found = []
    for i, (left, right, q1, q3) in enumerate(spans):
        slack = (right - left) * 1e-9
        x0, x1 = left - slack, right + slack
        outliers: list[float] = []
        box: dict[str, Any] = {"label": labels[i] if i < len(labels) else str(i + 1),
               "min": rounded(q1), "first_quartile": rounded(q1), "median": rounded(q1),
               "third_quartile": rounded(q3), "max": rounded(q3), "outliers": outliers}  # fmt: skip
        for line in ax.lines:
            xs, ys = line.get_xdata(), line.get_ydata()
            if not vertical:
                xs, ys = ys, xs
            if len(xs) == 0 or not all(x0 <= x <= x1 for x in xs):
                continue
            if line.get_linestyle() in ("None", "none", " ", ""):  # markers: outliers
                outliers.extend(rounded(y) for y in ys)
            elif len(ys) == 2 and ys[0] == ys[1] and q1 < ys[0] < q3:
                box["median"] = rounded(ys[0])
            elif len(xs) == 2 and xs[0] == xs[1]:  # a whisker, from the box outwards
                if max(ys) <= q1:
                    box["min"] = rounded(min(ys))
                elif min(ys) >= q3:
                    box["max"] = rounded(max(ys))
        found.append(box)
    return found
