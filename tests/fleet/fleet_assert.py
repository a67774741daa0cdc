"""Judge one phase of the fleet test from the evidence verify.yml collected.

    fleet_assert.py PHASE --manifest M [--evidence E] [--before B] [--record R] [--stdout S]

PHASE     what must hold
idempotent  ``schedule.yml`` applied a second time: no host changed or failed.
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

M = make_fleet_data.py's manifest, E/B = {host: fleet_inspect.py output}, R = the JSON
record of the hermes_test_json callback, S = text files to search (repeatable). Prints one line
per check and ends with ``fleet <phase>: N passed, N failed``; exit 1 on any failure.
"""

import argparse
import json
import re
import sys

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
    stats = record.get("stats", {})
    for host in sorted(manifest["homes"]):
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("phase", choices=["idempotent", "cron", "absent", "quiet", "check", "real", "again", "report"])
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--evidence")
    parser.add_argument("--before")
    parser.add_argument("--record")
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
