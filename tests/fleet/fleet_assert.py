"""Judge one phase of the fleet test from the evidence verify.yml collected.

    fleet_assert.py PHASE --manifest M [--evidence E] [--before B] [--record R] [--stdout S]

PHASE     what must hold
idempotent  ``schedule.yml`` applied a second time: no host changed or failed (the systemd host
          too, its timer check included, whether or not the timer was running its service).
cron      the job fired by itself on every host: job in the user's crontab, log lines with
          the expected counts, database counts and kept ids, a backup per healthy profile,
          files still the user's (0600), the broken profile logged as FAILED.
absent    no maintenance job left in any crontab; homes and backups untouched.
quiet     (B = right after removal, E = later, past a minute boundary) no new run: no job,
          the runner's log (watched since the cron phase) untouched.
check     ``maintain.yml --check``: every database byte-identical (B vs E), predicted
          counts = manifest, the broken profile fails its host's task with a clear message.
real      ``maintain.yml``: counts = manifest, databases hold exactly the kept sessions.
again     ``maintain.yml`` again: no change reported anywhere (broken still fails).
report    ``report.yml``: a table row for every host and profile.
timer-running  (E = {host: what verify.yml kept}) the role's timer check run while the timer ran
          the service it fired (made 20 s longer): it found it running, waited, and passed with
          the timer waiting and a next elapse.
systemd   (E = {host: fleet_gateway.py evidence}, R = converge's record, --refused = the record
          of schedule.yml --check with an OnCalendar in the past) the systemd host: that apply
          failed naming the variable; the role said its timer will fire; the timer ran the job
          by itself; its first run opened the service window around the gateway's user unit
          (the steps that need the file alone, the file incremental after); the client's
          requests failed only inside that run, none after, every turn answered and stored;
          the gateway back (unit active, serving).

M = make_fleet_data.py's manifest, E/B = {host: fleet_inspect.py output}, R = the JSON
record of the hermes_test_json callback, S = text files to search (repeatable). Prints one line
per check and ends with ``fleet <phase>: N passed, N failed``; exit 1 on any failure.
"""

import argparse
import json
import re
import sys
import time

MODULE_SUFFIX = "session_maintenance"
START = "=== Session Maintenance Start"
DONE = "=== Session Maintenance Done ==="
BACKUP_NAME = r"^hermes-ops_{profile}_\d{{8}}T\d{{6}}Z(?:-\d+)?\.db(?:\.gz)?$"


class Checker:
    def __init__(self, phase):
        self.phase = phase
        self.passed = 0
        self.failed = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print("ok   %s" % what)
        else:
            self.failed += 1
            print("FAIL %s%s" % (what, (": " + detail) if detail else ""))
        return ok

    def finish(self):
        print("fleet %s: %d passed, %d failed" % (self.phase, self.passed, self.failed))
        return 1 if self.failed or not self.passed else 0


def load(path):
    with open(path) as handle:
        return json.load(handle)


def healthy(home):
    return {n: p for n, p in home["profiles"].items() if not p["broken"]}


def broken(home):
    return {n: p for n, p in home["profiles"].items() if p["broken"]}


# ---------------------------------------------------------------------- record helpers


def module_results(record):
    """{host: [result dicts of the session_maintenance module]} (loop results flattened)."""
    out = {}
    for play in record.get("plays", []):
        for task in play.get("tasks", []):
            if not str(task.get("action", "")).endswith(MODULE_SUFFIX):
                continue
            for host, res in task.get("hosts", {}).items():
                items = res.get("results") if isinstance(res.get("results"), list) else [res]
                for item in items:
                    if item.get("_status") is None:
                        item = dict(item, _status=res.get("_status"))
                    if item.get("_status") != "skipped":
                        out.setdefault(host, []).append(item)
    return out


def profile_results(results):
    """{profile name: profile_result} over all module results of one host."""
    out = {}
    for res in results:
        for prof in res.get("profiles") or []:
            if isinstance(prof, dict) and "name" in prof:
                out[prof["name"]] = prof
    return out


def failed_tasks(record, host):
    out = []
    for play in record.get("plays", []):
        for task in play.get("tasks", []):
            res = task.get("hosts", {}).get(host)
            if res and res.get("_status") in ("failed", "unreachable") and not res.get("_ignored"):
                out.append((task.get("name"), res))
    return out


def all_strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from all_strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from all_strings(v)


# ---------------------------------------------------------------------------- phases


def phase_cron(c, manifest, evidence):
    for host, home in sorted(manifest["homes"].items()):
        ev = evidence.get(host)
        if not c.check(ev is not None, "%s: evidence collected" % host):
            continue
        c.check(bool(ev.get("cron_pids")), "%s: cron daemon running" % host, "no cron process")
        job = ev.get("job") or []
        c.check(
            len(job) == 1,
            "%s: one maintenance job in %s's crontab" % (host, ev["user"]),
            "crontab lines: %r" % ev.get("crontab", {}).get("lines"),
        )
        if job:
            c.check(job[0].split()[:5] == ["*"] * 5, "%s: job runs every minute" % host, job[0])
        log = ev.get("log") or {}
        if not c.check(
            log.get("exists"),
            "%s: runner log exists" % host,
            "config %s log_file=%r" % (ev.get("config_path"), (ev.get("config") or {}).get("log_file")),
        ):
            continue
        text = log["text"]
        c.check(START in text and DONE in text, "%s: log has a complete run" % host, text[-400:])
        for name, prof in sorted(healthy(home).items()):
            want = re.compile(
                r"^\d\d:\d\d:\d\d %s: zombies=%d pruned=%d freed=~?[0-9.]+[KMG]?B remaining=%d sessions, %d messages"
                % (
                    re.escape(name),
                    prof["zombies_closed"],
                    prof["sessions_pruned"],
                    prof["sessions_after"],
                    prof["messages_after"],
                ),
                re.M,
            )
            c.check(
                bool(want.search(text)),
                "%s/%s: log line with the expected counts" % (host, name),
                "wanted /%s/ in:\n%s" % (want.pattern, text[-1500:]),
            )
        for name in broken(home):
            line = next((ln for ln in text.splitlines() if "ERROR" in ln and name in ln and "FAILED" in ln), None)
            c.check(line is not None, "%s/%s: log names the broken profile as FAILED" % (host, name), text[-800:])
            if line:
                c.check("state.db" in line, "%s/%s: the error names the file" % (host, name), line)
        check_databases(c, host, home, ev, after=True)
        for name in healthy(home):
            rx = re.compile(BACKUP_NAME.format(profile=re.escape(name)))
            c.check(
                any(rx.match(b) for b in ev.get("backups", [])),
                "%s/%s: backup in %s" % (host, name, ev.get("backup_dir")),
                "backups: %r" % ev.get("backups"),
            )
        for name in broken(home):
            rx = re.compile(BACKUP_NAME.format(profile=re.escape(name)))
            c.check(
                not any(rx.match(b) for b in ev.get("backups", [])),
                "%s/%s: no backup of the broken file" % (host, name),
            )
        c.check(not ev.get("foreign"), "%s: every file is %s's" % (host, ev["user"]), "%r" % ev.get("foreign"))


def check_databases(c, host, home, ev, after):
    for name, prof in sorted(home["profiles"].items()):
        got = ev["profiles"].get(name)
        if not c.check(got is not None, "%s/%s: state.db present" % (host, name)):
            continue
        c.check(
            got["mode"] == "0600" and got["uid"] == ev["uid"],
            "%s/%s: state.db 0600 and %s's" % (host, name, ev["user"]),
            "mode %s uid %s" % (got["mode"], got["uid"]),
        )
        if prof["broken"]:
            c.check(not got.get("sqlite"), "%s/%s: broken file left as it was" % (host, name))
            continue
        sessions = prof["sessions_after"] if after else prof["sessions_before"]
        messages = prof["messages_after"] if after else prof["messages_before"]
        c.check(
            got.get("sessions") == sessions and got.get("messages") == messages,
            "%s/%s: %d sessions, %d messages" % (host, name, sessions, messages),
            "found %s sessions, %s messages (%s)" % (got.get("sessions"), got.get("messages"), got.get("error", "")),
        )
        if after:
            missing = sorted(set(prof["kept"]) - set(got.get("ids", [])))
            extra = sorted(set(got.get("ids", [])) - set(prof["kept"]))
            c.check(
                not missing and not extra,
                "%s/%s: exactly the kept sessions remain" % (host, name),
                "missing %r, not pruned %r" % (missing, extra),
            )
        c.check(got.get("integrity") == "ok", "%s/%s: quick_check ok" % (host, name), str(got.get("integrity")))


def phase_absent(c, manifest, evidence):
    for host, home in sorted(manifest["homes"].items()):
        ev = evidence.get(host)
        if not c.check(ev is not None, "%s: evidence collected" % host):
            continue
        c.check(not ev.get("job"), "%s: no maintenance job in %s's crontab" % (host, ev["user"]), "%r" % ev.get("job"))
        for name in home["profiles"]:
            c.check(name in ev["profiles"], "%s/%s: state.db still there" % (host, name))
        c.check(bool(ev.get("backups")) or not healthy(home), "%s: backups kept" % host)


def phase_quiet(c, manifest, before, evidence):
    """B = right after removal, E = later: no job came back, no watched file (the runner's log,
    from the cron phase) changed, and cron had a chance to fire in between."""
    for host in sorted(manifest["homes"]):
        b, e = before.get(host) or {}, evidence.get(host) or {}
        if not c.check(bool(b) and bool(e), "%s: evidence collected" % host):
            continue
        c.check(not e.get("job"), "%s: still no maintenance job" % host, "%r" % e.get("job"))
        boundary = (int(b["time"]) // 60 + 1) * 60 + 5
        c.check(
            e["time"] >= boundary,
            "%s: a minute boundary passed since the removal" % host,
            "removed at %d, checked at %d" % (b["time"], e["time"]),
        )
        watched = sorted(set(b.get("watch") or {}) | set(e.get("watch") or {}))
        c.check(bool(watched), "%s: the runner's log is watched" % host, "no log path from the cron phase")
        for path in watched:
            c.check(
                (b.get("watch") or {}).get(path) == (e.get("watch") or {}).get(path),
                "%s: %s untouched since the removal" % (host, path),
                "%r -> %r" % ((b.get("watch") or {}).get(path), (e.get("watch") or {}).get(path)),
            )


def check_broken_host(c, record, host, home, results):
    names = sorted(broken(home))
    fails = failed_tasks(record, host)
    if not c.check(bool(fails), "%s: the task fails (broken profile %s)" % (host, ", ".join(names))):
        return
    msg = " ".join(str(r.get("msg", "")) for _name, r in fails)
    c.check(
        all(n in msg for n in names) and "state.db" in msg,
        "%s: the failure message names the broken profile and its file" % host,
        msg[:600],
    )
    profs = profile_results(results)
    for name in healthy(home):
        if name in profs:
            c.check(
                profs[name].get("status") == "ok",
                "%s/%s: healthy profile ok beside the broken one" % (host, name),
                str(profs[name].get("error")),
            )


def phase_maintain(c, manifest, record, mode, before=None, evidence=None):
    results = module_results(record)
    stats = record.get("stats", {})
    for host, home in sorted(manifest["homes"].items()):
        res = results.get(host)
        if not c.check(bool(res), "%s: session_maintenance ran" % host, "no module result in the record"):
            continue
        profs = profile_results(res)
        if broken(home):
            check_broken_host(c, record, host, home, res)
        else:
            c.check(
                not failed_tasks(record, host) and not stats.get(host, {}).get("failures"),
                "%s: no failed task" % host,
                "%r" % [name for name, _res in failed_tasks(record, host)],
            )
        for name, prof in sorted(healthy(home).items()):
            got = profs.get(name)
            if not c.check(got is not None, "%s/%s: profile reported" % (host, name), "reported: %r" % sorted(profs)):
                continue
            if mode in ("check", "real"):
                for key in ("zombies_closed", "sessions_pruned", "messages_pruned"):
                    c.check(
                        got.get(key) == prof[key],
                        "%s/%s: %s=%d" % (host, name, key, prof[key]),
                        "reported %r" % got.get(key),
                    )
                c.check(bool(got.get("changed")), "%s/%s: reported as changed" % (host, name))
                after = got.get("after") or {}
                c.check(
                    after.get("sessions") == prof["sessions_after"],
                    "%s/%s: %s sessions after = %d"
                    % (host, name, "predicted" if mode == "check" else "reported", prof["sessions_after"]),
                    "got %r" % after.get("sessions"),
                )
            else:  # again
                c.check(
                    not got.get("changed") and not got.get("zombies_closed") and not got.get("sessions_pruned"),
                    "%s/%s: no change on the second run" % (host, name),
                    "changed=%r zombies_closed=%r sessions_pruned=%r"
                    % (got.get("changed"), got.get("zombies_closed"), got.get("sessions_pruned")),
                )
        if mode == "again" and not broken(home):
            c.check(not any(r.get("changed") for r in res), "%s: task reports no change" % host)
        if mode == "check":
            b, e = before.get(host, {}).get("profiles", {}), evidence.get(host, {}).get("profiles", {})
            for name in sorted(home["profiles"]):
                same = (
                    b.get(name)
                    and e.get(name)
                    and all(
                        (b[name].get(k) or {}).get("sha256") == (e[name].get(k) or {}).get("sha256") for k in ("wal",)
                    )
                    and b[name]["sha256"] == e[name]["sha256"]
                )
                c.check(
                    bool(same),
                    "%s/%s: byte-identical after --check" % (host, name),
                    "before %s after %s" % ((b.get(name) or {}).get("sha256"), (e.get(name) or {}).get("sha256")),
                )
            c.check(
                before.get(host, {}).get("backups") == evidence.get(host, {}).get("backups"),
                "%s: no backup written by --check" % host,
            )
    if evidence is not None and mode == "real":
        for host, home in sorted(manifest["homes"].items()):
            if host in evidence:
                check_databases(c, host, home, evidence[host], after=True)


def phase_idempotent(c, manifest, record):
    """Every host of the manifest, and every other host the run reached (the systemd host)."""
    stats = record.get("stats", {})
    for host in sorted(set(manifest["homes"]) | set(stats)):
        st = stats.get(host)
        if not c.check(st is not None, "%s: schedule.yml ran" % host):
            continue
        changed = [
            t.get("name")
            for p in record.get("plays", [])
            for t in p.get("tasks", [])
            if (t.get("hosts", {}).get(host) or {}).get("_status") == "changed"
        ]
        c.check(
            not st.get("changed") and not changed, "%s: second apply changed nothing" % host, "changed: %r" % changed
        )
        c.check(
            not st.get("failures") and not st.get("unreachable"),
            "%s: second apply did not fail" % host,
            "%r" % [name for name, _res in failed_tasks(record, host)],
        )


def phase_report(c, manifest, record, stdout_text):
    lines = []
    for s in list(all_strings(record)) + [stdout_text]:
        lines.extend(s.replace("\\n", "\n").splitlines())
    for host, home in sorted(manifest["homes"].items()):
        c.check(not failed_tasks(record, host) or bool(broken(home)), "%s: report ran" % host)
        for name in sorted(home["profiles"]):
            rx = re.compile(r"(^|[^\w-])%s([^\w-]|$)" % re.escape(host))
            rp = re.compile(r"(^|[^\w-])%s([^\w-]|$)" % re.escape(name))
            c.check(
                any(rx.search(ln) and rp.search(ln) for ln in lines), "%s/%s: a row in the fleet table" % (host, name)
            )


def task_result(record, name, host):
    """The result of the task called ``name`` (a role's: ``role : name``) on ``host`` in a record
    (the last one), or None."""
    found = None
    for play in record.get("plays", []):
        for task in play.get("tasks", []):
            if str(task.get("name")).rsplit(" : ", maxsplit=1)[-1] == name and host in task.get("hosts", {}):
                found = task["hosts"][host]
    return found


WINDOW_LINE = re.compile(r"service window ([\d.]+) s: ([^(\n]*)(\(.*\))?$", re.M)


def phase_systemd(c, record, evidence, refused):
    """The systemd host: the role said its timer fires, the timer ran the job by itself, the first
    run opened the window beside the gateway's user unit, the client failed only inside it."""
    for host, ev in sorted(evidence.items()):
        if not c.check(bool(ev and ev.get("client")), "%s: evidence collected" % host):
            continue
        said = task_result(record, "Say whether the systemd timer will run the maintenance", host) or {}
        c.check(
            said.get("_status") == "ok"
            and " will run the maintenance on %s: active (waiting), enabled" % host in str(said.get("msg")),
            "%s: the role said its timer will fire" % host,
            "%r" % said.get("msg"),
        )
        never = [msg for name, res in failed_tasks(refused, host) for msg in [str(res.get("msg"))]]
        c.check(
            len(never) == 1
            and never[0].startswith("hermes_maintenance_systemd_on_calendar gives the timer ")
            and "Next elapse: never" in never[0],
            "%s: an OnCalendar in the past fails the apply, naming the variable" % host,
            "%r" % never,
        )
        runs = ev["runs"]
        finished = [r for r in runs if r["end"]]
        c.check(
            len(finished) >= 2 and all(r["result"] == "done" for r in finished),
            "%s: the timer ran the job by itself, each run done (nothing else starts it)" % host,
            "%r" % [(r["start"], r["result"]) for r in runs],
        )
        c.check(ev["timer"].get("ActiveState") == "active" and ev["timer"].get("UnitFileState") == "enabled",
                "%s: the timer is active and enabled" % host, "%r" % ev["timer"])  # fmt: skip
        opened = [(r, WINDOW_LINE.search(r.get("log", ""))) for r in finished]
        opened = [(r, m) for r, m in opened if m]
        seen = [(_clock(r["start"]), r["result"], r.get("log", "")[-400:]) for r in runs]
        if not c.check(bool(opened), "%s: a scheduled run opened the service window" % host, "runs: %r" % seen):
            continue
        run, words = opened[0]
        downtime, steps, reason = float(words.group(1)), words.group(2).strip(), words.group(3)
        c.check(run is finished[0], "%s: the window opened in the timer's first run" % host)
        c.check("vacuum_full" in steps and not reason and 0 < downtime <= 120,
                "%s: the window ran the steps that need the file alone (%s), %.1f s down" % (host, steps, downtime),
                words.group(0))  # fmt: skip
        pruned = re.search(r" pruned=(\d+) ", run["log"])
        c.check(bool(pruned) and int(pruned.group(1)) > 0, "%s: that run pruned the old sessions (%s)"
                % (host, pruned and pruned.group(0).strip()), run["log"][-600:])  # fmt: skip
        c.check(ev.get("hermes_last_auto_prune") is None,
                "%s: Hermes's own auto-prune never ran (sessions.auto_prune: false), so the timer's run did the work"
                % host, "state_meta.last_auto_prune = %r" % ev.get("hermes_last_auto_prune"))  # fmt: skip
        c.check(len(opened) == 1, "%s: no window in the runs after it" % host, "%d windows" % len(opened))
        attempts = ev["client"]["attempts"]
        failed = [a for a in attempts if not a["ok"]]
        after = [a for a in attempts if a["start"] > run["end"]]
        c.check(bool(failed), "%s: requests met the window (else the test proves nothing)" % host)
        c.check(all(run["start"] <= a["start"] <= run["end"] for a in failed),
                "%s: requests failed only inside the window's run" % host,
                "%r" % [a for a in failed if not run["start"] <= a["start"] <= run["end"]][:3])  # fmt: skip
        c.check(len(after) >= 10 and all(a["ok"] for a in after),
                "%s: after it, %d requests, none failed" % (host, len(after)),
                "%r" % [a for a in after if not a["ok"]][:3])  # fmt: skip
        answered = ev["client"]["answered"]
        c.check(sorted({a["message"] for a in attempts}) == answered,
                "%s: every message was answered on a retry" % host)  # fmt: skip
        c.check(ev["stored"] == answered, "%s: every answered turn is in state.db (nothing written lost)" % host,
                "%d answered, %d stored" % (len(answered), len(ev["stored"])))  # fmt: skip
        # Back and serving: the unit active now, and the requests after the window answered and stored
        # (above). No descriptor on state.db is asked for here: 0.22.2's writer connection retires after
        # an idle window, and the client has stopped by now (the engine saw one when the window closed).
        c.check(ev["gateway_active"] == "active",
                "%s: the gateway is back (unit active; it served every request after the window)" % host,
                "%s, holders now %r" % (ev["gateway_active"], ev["holders"]))  # fmt: skip
        c.check(ev["gateway_unit_path"].endswith("/.config/systemd/user/hermes-gateway.service"),
                "%s: the gateway is the user unit Hermes installs" % host, ev["gateway_unit_path"])  # fmt: skip
        c.check(ev["auto_vacuum"] == 2, "%s: state.db is incremental after the window" % host, "%r" % ev["auto_vacuum"])
        worst = max((a["latency"] for a in failed), default=0)
        print(
            "info %s: timer fired at %s; window opened in the run of %s-%s for %s: %.1f s down; client %d requests,"
            " %d failed inside the window (worst %.0f ms), %d after it, %d failed after; %d answered, %d stored"
            % (host, ", ".join(_clock(r["start"]) for r in runs), _clock(run["start"]), _clock(run["end"]), steps,
               downtime, len(attempts), len(failed), 1000 * worst, len(after), sum(1 for a in after if not a["ok"]),
               len(answered), len(ev["stored"]))
        )  # fmt: skip


def phase_timer_running(c, evidence):
    """The role's timer check run while the timer ran the service it fired (no next elapse then):
    it waited for that run to end and passed with the timer waiting for a next elapse."""
    for host, ev in sorted(evidence.items()):
        if not c.check(bool(ev), "%s: evidence collected" % host):
            continue
        shown = dict(line.split("=", 1) for line in ev.get("shown") or [] if "=" in line)
        c.check(ev.get("fired") is True, "%s: the timer fired the service by itself (SubState running)" % host)
        c.check(int(ev.get("polls") or 1) >= 2, "%s: the check found the service running and asked again" % host,
                "asked %s time(s)" % ev.get("polls"))  # fmt: skip
        c.check(ev.get("failed") is None, "%s: the check passed" % host, str(ev.get("failed")))
        c.check(shown.get("SubState") == "waiting" and bool(shown.get("NextElapseUSecRealtime")),
                "%s: it ended with the timer waiting, next at %s" % (host, shown.get("NextElapseUSecRealtime")),
                "%r" % shown)  # fmt: skip


def _clock(at):
    return time.strftime("%H:%M:%S", time.gmtime(at))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument(
        "phase",
        choices=["idempotent", "cron", "absent", "quiet", "check", "real", "again", "report", "systemd"]
        + ["timer-running"],
    )
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--evidence")
    parser.add_argument("--before")
    parser.add_argument("--record")
    parser.add_argument("--refused", help="systemd: the record of schedule.yml with an OnCalendar in the past")
    parser.add_argument(
        "--stdout",
        action="append",
        default=[],
        help="text output to search (report: ansible-playbook's stdout, the Markdown table)",
    )
    args = parser.parse_args(argv)

    c = Checker(args.phase)
    manifest = load(args.manifest)
    evidence = load(args.evidence) if args.evidence else None
    before = load(args.before) if args.before else None
    record = load(args.record) if args.record else None
    if args.phase == "idempotent":
        phase_idempotent(c, manifest, record)
    elif args.phase == "cron":
        phase_cron(c, manifest, evidence)
    elif args.phase == "absent":
        phase_absent(c, manifest, evidence)
    elif args.phase == "quiet":
        phase_quiet(c, manifest, before, evidence)
    elif args.phase in ("check", "real", "again"):
        phase_maintain(c, manifest, record, args.phase, before=before, evidence=evidence)
    elif args.phase == "systemd":
        phase_systemd(c, record, evidence, load(args.refused))
    elif args.phase == "timer-running":
        phase_timer_running(c, evidence)
    elif args.phase == "report":
        texts = []
        for path in args.stdout:
            try:
                with open(path) as handle:
                    texts.append(handle.read())
            except OSError as exc:
                c.check(False, "read %s" % path, str(exc))
        phase_report(c, manifest, record, "\n".join(texts))
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
