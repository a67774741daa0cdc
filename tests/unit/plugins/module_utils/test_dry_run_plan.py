"""Check mode and the real run follow one action plan, so they say the same thing.

Each case copies one file built by a real Hermes release (0.19.0 in WAL mode, 0.22.2 in
rollback-journal mode) twice, runs check mode on one copy and the real run on the other
under the same conditions (a process holding the file in both, or in neither), and compares
the two summary lines word for word: the counts, the backup (taken, deferred to an archive,
none and why), the reclaim (VACUUM full, incremental or skipped and why), the other files.
Only the measured sizes differ: check mode's ``freed=~...`` is an estimate and a backup's
name carries the time it was taken. The predicted ``after`` counts equal the real ones.
"""

import contextlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.reclaim import full_vacuum
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.actions import human_size
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from hermes_fixtures import layout_available, make_big_home, missing_venv_message

WAL_RELEASE, ROLLBACK_RELEASE = "hermes-0.19.0", "hermes-0.22.2.post1"
EXACT_AFTER = ("sessions", "messages", "open_sessions")

# The homes are laid out for the seed script's 7 days (make_big_home: half the sessions older).
SEED_RETENTION = {"prune_days": 7}
pytestmark = [pytest.mark.slow, pytest.mark.releases]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """One file per release (200 sessions of 20 messages, half of them prunable), built once."""
    built, now = {}, time.time()

    def get(layout, incremental=False):
        if not layout_available(layout):
            pytest.skip(missing_venv_message(layout))
        key = (layout, incremental)
        if key not in built:
            home = tmp_path_factory.mktemp(layout)
            db = str(make_big_home(str(home), layout, 200, 20, old_fraction=0.5, seed=7, now=now))
            if incremental:  # as a run with vacuum_mode=full and vacuum_switch_incremental leaves it
                conn = sqlite3.connect(db, isolation_level=None)
                full_vacuum(conn, True)
                conn.close()
            built[key] = db
        return built[key]

    return get


def copy_home(db, home):
    os.makedirs(os.path.join(home, "sessions"))
    for suffix in ("", "-wal"):
        if os.path.exists(db + suffix):
            shutil.copyfile(db + suffix, os.path.join(home, "state.db" + suffix))
            os.chmod(os.path.join(home, "state.db" + suffix), 0o600)
    return os.path.join(home, "state.db")


@contextlib.contextmanager
def holder(db):
    """Another process with the file open and idle, as a running gateway between turns."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1]); "
         "c.execute('select count(*) from sessions').fetchone(); print('ready', flush=True); time.sleep(120)", db],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def one_run(db, home, held, check_mode, options):
    with holder(db) if held else contextlib.nullcontext():
        options = dict(SEED_RETENTION, **options, hermes_home=[home], batch_pause=0)
        return run_maintenance(options, check_mode=check_mode)


def measured_masked(line):
    """The line without what check mode can only estimate (the bytes freed) and what differs between
    the two copies' worlds (a backup's time stamp, the pid of each copy's holder)."""
    line = re.sub(r"freed=~?[0-9.]+[KMG]?B", "freed=<size>", line)
    line = re.sub(r"\(pid \d+\)", "(pid N)", line)
    return re.sub(r"_(?:\d{8}T\d{6}Z(?:-\d+)?|<timestamp>)\.db", "_<timestamp>.db", line)


def dry_run_and_run(base_db, tmp_path, held=False, prepare=None, **options):
    check_db = copy_home(base_db, str(tmp_path / "check"))
    run_db = copy_home(base_db, str(tmp_path / "run"))
    for home in (prepare and (tmp_path / "check", tmp_path / "run")) or ():
        prepare(home)
    check = one_run(check_db, str(tmp_path / "check"), held, True, options)
    run = one_run(run_db, str(tmp_path / "run"), held, False, options)
    assert check["status"] == run["status"] == "ok", (check, run)
    assert measured_masked(check["summary"][0]) == measured_masked(run["summary"][0]), (
        check["summary"][0], run["summary"][0],
    )  # fmt: skip
    predicted, done = check["profiles"][0], run["profiles"][0]
    assert {k: predicted["after"][k] for k in EXACT_AFTER} == {k: done["after"][k] for k in EXACT_AFTER}
    for key in ("zombies_closed", "sessions_pruned", "messages_pruned", "changed", "backup_deferred"):
        assert predicted[key] == done[key], key
    assert (predicted["backup"] or {}).get("kind") == (done["backup"] or {}).get("kind")
    for key in ("action", "free_pages_predicted"):
        assert predicted["reclaim"][key] == done["reclaim"][key], key
    assert measured_masked(predicted["reclaim"]["skipped_reason"] or "") == measured_masked(
        done["reclaim"]["skipped_reason"] or ""
    )
    return check["summary"][0], run["summary"][0], predicted, done


CASES = {
    # name: (release, incremental file, a holder, options, the reclaim words, the backup words)
    "full-wal-backup": (WAL_RELEASE, False, False, {}, "; vacuum full", "backup=file backups/hermes-ops_default_"),
    "full-rollback-backup": (ROLLBACK_RELEASE, False, False, {}, "; vacuum full", "backup=file "),
    "incremental-rollback-deferred": (
        ROLLBACK_RELEASE, True, True, {}, "; vacuum incremental", "backup=archive backups/hermes-ops-archive_default_",
    ),
    "incremental-wal-backup-off": (WAL_RELEASE, True, False, {"backup": False}, "; vacuum incremental",
                                   "no backup (backup is off)"),
    "skipped-threshold-backup-off": (
        ROLLBACK_RELEASE, False, False, {"backup": False, "vacuum_threshold": 90},
        "the prune deletes 50.0% of the messages: an estimated 50.3% after it, below vacuum_threshold 90%",
        "no backup (backup is off)",
    ),
    # beside a holder the FTS indexes keep the deleted rows (no optimize): 21.8% is expected free, below 25%
    "skipped-held-wal-backup": (
        WAL_RELEASE, False, True, {"vacuum_threshold": 10}, "vacuum skipped: held open by ",
        "backup=file backups/hermes-ops_default_",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_mode_says_word_for_word_what_the_run_does(base, tmp_path, case):
    release, incremental, held, options, reclaim_words, backup_words = CASES[case]
    check, run, predicted, done = dry_run_and_run(base(release, incremental), tmp_path, held=held, **options)
    print("%s\n  check: %s\n  run:   %s" % (case, check, run))  # side by side, with -s
    assert reclaim_words in check and reclaim_words in run, (check, run)
    assert backup_words in check and backup_words in run, (check, run)
    assert done["sessions_pruned"] == 100 and done["messages_pruned"] == 2000
    if done["reclaim"]["action"]:
        assert done["after"]["db_bytes"] < done["before"]["db_bytes"]
        before, after = done["before"], done["after"]
        freed = before["db_bytes"] + before["wal_bytes"] - after["db_bytes"] - after["wal_bytes"]
        assert "freed=%s " % human_size(freed) in run
        assert re.search(r"freed=~[0-9.]+[KM]B ", check), check
    else:
        assert re.search(r"freed=~0B ", check), check


def orphaned_transcript(home):
    """A transcript of a session state.db no longer has, written ten days ago."""
    path = home / "sessions" / "gone-long-ago.jsonl"
    path.write_text('{"role": "user", "content": "hello"}\n' * 40)
    old = time.time() - 10 * 86400
    os.utime(str(path), (old, old))


def test_file_retention_is_predicted_word_for_word(base, tmp_path):
    check, run, predicted, done = dry_run_and_run(
        base(ROLLBACK_RELEASE), tmp_path, prepare=orphaned_transcript,
        file_retention={"orphaned_transcripts": {"days": 7}},
    )  # fmt: skip
    assert "; files removed=1 (1KB)" in check and "; files removed=1 (1KB)" in run, (check, run)

    def removed(profile):
        return [dict(item, path=None) for item in profile["file_retention"]["removed"]]  # each copy's own path

    assert removed(predicted) == removed(done)
    assert not (tmp_path / "run" / "sessions" / "gone-long-ago.jsonl").exists()
    assert (tmp_path / "check" / "sessions" / "gone-long-ago.jsonl").exists()


def test_a_second_run_with_nothing_to_do_is_predicted_too(base, tmp_path):
    """After a run, nothing is due: no backup (nothing changed), and the vacuum words agree."""
    home = str(tmp_path / "home")
    copy_home(base(ROLLBACK_RELEASE), home)
    run_maintenance(dict(SEED_RETENTION, hermes_home=[home], batch_pause=0))
    again = str(tmp_path / "again")
    os.makedirs(again)
    check_db, run_db = os.path.join(home, "state.db"), os.path.join(again, "state.db")
    shutil.copyfile(check_db, run_db)
    os.chmod(run_db, 0o600)
    check = run_maintenance(dict(SEED_RETENTION, hermes_home=[home], batch_pause=0), check_mode=True)
    run = run_maintenance(dict(SEED_RETENTION, hermes_home=[again], batch_pause=0))
    assert check["summary"][0] == run["summary"][0].replace("freed=0B", "freed=~0B"), (check["summary"], run["summary"])
    assert "no backup (nothing changed); vacuum skipped: no free pages" in run["summary"][0]
    assert check["changed"] is run["changed"] is False


@pytest.mark.parametrize(
    "nbytes, words",
    [(0, "0B"), (999, "999B"), (290816, "291KB"), (999_499, "999KB"), (999_600, "1.0MB"), (1_234_567, "1.2MB"),
     (3_400_000_000, "3.4GB")],
)  # fmt: skip
def test_sizes_print_in_human_units(nbytes, words):
    assert human_size(nbytes) == words
