"""The page's plots (PNG), drawn with matplotlib (requirements/bench.txt) from the results documents.

``files`` names them (standard library: the page is written without matplotlib); ``draw`` draws them.

* ``rows_s.png``: prune rows/s by file size, ours and the release's, one panel per benchmark;
* ``stall.png``: the writer's worst stall by file size (log scale, the 250 ms target drawn);
* ``latency-<mode>.png``: the writer's latency over time during ours and the release's prune on the
  same file (the largest size), when the results hold every append (``series``).
"""

from pathlib import Path

from bench.common import MODES, TARGETS, idle_gateway, parse_size

LABELS = {"wal-0.19": "Hermes 0.19.0, WAL", "delete-0.22": "Hermes 0.22.2, DELETE", "wal-0.22": "Hermes 0.22.2, WAL"}


def _largest_with_series(doc):
    """(size, {kind: row}) of the largest size whose rows all hold a latency series, else None."""
    sizes = {}
    for r in doc["rows"]:
        sizes.setdefault(r["size"], {})[r["kind"]] = r
    with_series = [s for s, kinds in sizes.items() if all(r.get("series") for r in kinds.values())]
    if not with_series:
        return None
    size = max(with_series, key=parse_size)
    return size, sizes[size]


def files(docs):
    """[(file name, caption)] of the plots ``draw`` writes for ``docs``."""
    out = [
        ("rows_s.png", "Prune rows/s by file size, ours and the release's own, per benchmark"),
        ("stall.png", "The writer's worst stall by file size (log scale), per benchmark"),
    ]
    for doc in docs:
        found = None if idle_gateway(doc) else _largest_with_series(doc)  # idle: no append to plot
        if found:
            out.append(
                (
                    "latency-%s.png" % doc["name"],
                    "%s, %s messages: the writer's latency over time during each run" % (LABELS[doc["mode"]], found[0]),
                )
            )
    return out


def by_mode(docs):
    """{mode: every row of its results documents} (a --label run's sizes join its mode's curves; beside an
    idle gateway, curves of their own)."""
    out = {}
    for doc in docs:
        rows = doc["rows"]
        if idle_gateway(doc):
            rows = [dict(r, kind=r["kind"] + ", idle gateway") for r in rows]
        out.setdefault(doc["mode"], []).extend(rows)
    return out


def _by_size_panels(docs, title, ylabel, value, log=False, target=None):
    import matplotlib.pyplot as plt

    modes = by_mode(docs)
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 3.4), squeeze=False)
    for ax, (mode, mode_rows) in zip(axes[0], modes.items()):
        kinds = {}
        for r in mode_rows:
            kinds.setdefault(r["kind"], []).append(r)
        for kind, rows in kinds.items():
            rows = sorted(rows, key=lambda r: parse_size(r["size"]))
            xs = [parse_size(r["size"]) / 1000 for r in rows]
            style = "--" if kind == MODES[mode]["hermes"] else "-"
            ax.plot(xs, [value(r) for r in rows], style, marker="o", label=kind)
        hermes = sorted(kinds[MODES[mode]["hermes"]], key=lambda r: parse_size(r["size"]))
        if target == "rows_ratio":  # the target follows the release's own rate, measured beside ours
            xs = [parse_size(r["size"]) / 1000 for r in hermes]
            ax.plot(xs, [TARGETS["rows_ratio"] * r["rows_s"] for r in hermes], ":", color="red",
                    linewidth=0.8, label="target: %.1fx the release's" % TARGETS["rows_ratio"])  # fmt: skip
        elif target is not None:
            ax.axhline(target, color="red", linewidth=0.8, linestyle=":", label="target: %g %s" % (target, ylabel))
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks([parse_size(r["size"]) / 1000 for r in hermes])
        ax.set_xticklabels([r["size"] for r in hermes])
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_title(LABELS[mode], fontsize=10)
        ax.set_xlabel("messages in the file")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _latency(doc):
    import matplotlib.pyplot as plt

    size, kinds = _largest_with_series(doc)
    fig, axes = plt.subplots(len(kinds), 1, figsize=(8.5, 2.4 * len(kinds)), sharex=True, sharey=True, squeeze=False)
    for ax, (kind, r) in zip(axes[:, 0], sorted(kinds.items())):
        for who, color in (("control", "grey"), ("writer", "tab:blue")):
            points = r["series"].get(who) or []
            ax.plot([t / 1000 for t, _lat in points], [lat for _t, lat in points], ".", color=color, markersize=3,
                    label="control writer" if who == "control" else "writer on the file")  # fmt: skip
        ax.axhline(TARGETS["stall"] * 1000, color="red", linewidth=0.8, linestyle=":", label="250 ms")
        ax.set_yscale("log")
        ax.set_title("%s (%s messages pruned)" % (kind, "{:,}".format(r["messages"])), fontsize=9)
        ax.set_ylabel("append latency ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the maintenance process started")
    fig.suptitle("%s, %s messages" % (LABELS[doc["mode"]], size), fontsize=11)
    fig.tight_layout()
    return fig


def _stall_ms(row):
    return float("nan") if row["worst"] is None else row["worst"] * 1000  # no append during the run: no point


def draw(docs, out_dir):
    """Write every plot of ``files(docs)`` into ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {
        "rows_s.png": lambda: _by_size_panels(
            docs, "Prune rows/s", "rows/s", lambda r: r["rows_s"], target="rows_ratio"
        ),
        "stall.png": lambda: _by_size_panels(
            docs, "Writer's worst stall", "ms", _stall_ms, log=True, target=TARGETS["stall"] * 1000
        ),
    }
    for doc in docs:
        figures["latency-%s.png" % doc["name"]] = lambda doc=doc: _latency(doc)
    written = []
    for name, _caption in files(docs):
        fig = figures[name]()
        path = out_dir / name
        # No "Software" entry: the same data gives the same bytes whatever matplotlib's version.
        fig.savefig(str(path), dpi=80, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written
