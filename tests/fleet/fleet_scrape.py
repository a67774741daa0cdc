"""Scrape every fleet host's node_exporter and check the Hermes metrics against the databases.

    fleet_scrape.py --targets TARGETS.json --evidence EV.json [--wait SECONDS]

TARGETS.json: {inventory_host: {"url": "http://ADDRESS:9100/metrics"}} (the container's own
address); EV.json: {inventory_host: fleet_inspect.py evidence} gathered as the Hermes user
after cron ran the job. For every inventory host (one Hermes user) the runner's textfile
metrics, as node_exporter serves them, must give the sessions, messages, open sessions and
file size of each healthy profile that SQLite counted, status ok for those and failed
(reason damaged) for a broken one, a backup, the last run's time, and a last success time
only where no profile failed. Scrapes again (the job may be mid-run) until all checks pass
or --wait runs out; prints every check and exits 1 if one failed. Standard library only.
"""

import argparse
import json
import re
import sys
import time
import urllib.request

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, frozenset(labels)): value} of a text-format exposition."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if not match:
            raise ValueError("not a sample line: %r" % line)
        labels = frozenset((k, v.replace('\\"', '"').replace("\\\\", "\\")) for k, v in LABEL.findall(match[2] or ""))
        samples[(match[1], labels)] = float(match[3])
    return samples


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return parse(response.read().decode())


def check_host(host, samples, ev):
    """(ok, message) pairs for one Hermes user's metrics."""
    checks = []
    user, home = ev["user"], ev["home"]

    def value(name, **labels):
        return samples.get((name, frozenset(labels.items())))

    def expect(what, got, want):
        checks.append((got == want, "%s %s: metrics %s, expected %s" % (host, what, got, want)))

    broken = 0
    for name, prof in sorted(ev["profiles"].items()):
        where = dict(home=home, profile=name)
        if not prof.get("sqlite"):
            broken += 1
            status = value("hermes_ops_profile_status", status="failed", reason="damaged", **where)
            expect("%s status failed/damaged" % name, status, 1.0)
            continue
        for metric, key in (("sessions", "sessions"), ("messages", "messages"), ("open_sessions", "open")):
            expect("%s %s" % (name, metric), value("hermes_ops_" + metric, **where), float(prof[key]))
        expect("%s db_size_bytes" % name, value("hermes_ops_db_size_bytes", **where), float(prof["size"]))
        expect("%s status ok" % name, value("hermes_ops_profile_status", status="ok", reason="none", **where), 1.0)
        backups = value("hermes_ops_backups", **where)
        checks.append((bool(backups and backups >= 1), "%s %s backups: %s (want >= 1)" % (host, name, backups)))
        # the home inventory's series: state.db and its sidecars are one kind, its files counted
        state_bytes = value("hermes_ops_home_bytes", kind="state_db", **where)
        checks.append(
            (
                bool(state_bytes and state_bytes >= float(prof["size"])),
                "%s %s home_bytes{kind=state_db}: %s (want >= %s)" % (host, name, state_bytes, prof["size"]),
            )
        )
        state_files = value("hermes_ops_home_files", kind="state_db", **where)
        checks.append(
            (
                bool(state_files and state_files >= 1),
                "%s %s home_files{kind=state_db}: %s (want >= 1)" % (host, name, state_files),
            )
        )
        version = value("hermes_ops_schema_version", **where)
        checks.append((bool(version and version > 0), "%s %s schema_version: %s" % (host, name, version)))
    last_run = value("hermes_ops_last_run_timestamp_seconds", user=user)
    checks.append((bool(last_run and last_run <= time.time() + 5), "%s last run at %s" % (host, last_run)))
    expect("failed profiles", value("hermes_ops_last_run_failed_profiles", user=user), float(broken))
    success = value("hermes_ops_last_success_timestamp_seconds", user=user)
    if broken:
        expect("last success (every run had a broken profile)", success, None)
    else:
        expect("last success", success, last_run)
    return checks


def check_all(targets, evidence):
    checks = []
    for host in sorted(targets):
        url = targets[host]["url"]
        try:
            samples = scrape(url)
        except (OSError, ValueError) as exc:
            checks.append((False, "%s: cannot scrape %s: %s" % (host, url, exc)))
            continue
        errors = [v for (n, _l), v in samples.items() if n == "node_textfile_scrape_error"]
        checks.append((errors == [0.0], "%s node_textfile_scrape_error %s (%s)" % (host, errors, url)))
        checks.extend(check_host(host, samples, evidence[host]))
    return checks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--targets", required=True)
    parser.add_argument("--evidence", required=True)
    parser.add_argument("--wait", type=float, default=90.0)
    args = parser.parse_args(argv)
    with open(args.targets) as handle:
        targets = json.load(handle)
    with open(args.evidence) as handle:
        evidence = json.load(handle)
    deadline = time.time() + args.wait
    attempts = 0
    while True:
        attempts += 1
        checks = check_all(targets, evidence)
        if all(ok for ok, _msg in checks) or time.time() > deadline:
            break
        time.sleep(3)
    for ok, msg in checks:
        print("%s %s" % ("ok  " if ok else "FAIL", msg))
    failed = sum(1 for ok, _msg in checks if not ok)
    print("%d checks on %d hosts after %d scrape(s): %d failed" % (len(checks), len(targets), attempts, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
