# Copyright: Contributors to the hermes_agent.ops collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Add, update or remove the maintenance job in a Hermes home's cron/jobs.json.

Run by the role through ansible.builtin.script (as root or as the Hermes user):

    hermes_cron_job.py --home HOME --id ID (--present --name N --script S --schedule EXPR
                       [--deliver local] | --absent) [--owner UID:GID] [--check]

Writes the way Hermes Agent 0.19.0's cron/jobs.py does: under an exclusive flock on
HOME/cron/.jobs.lock, to a temp file in HOME/cron that is fsynced and then renamed over
jobs.json (mode 0600). Only the job with our id is touched; fields Hermes keeps at run
time (next_run_at, last_run_at, repeat.completed, last_status, enabled...) are left alone
unless the schedule changed (then next_run_at is cleared and Hermes recomputes it).
Prints one JSON object: {"changed": bool, "action": "...", "jobs_file": "..."}.
"""

import argparse
import datetime
import errno
import fcntl
import json
import os
import tempfile
import time

LOCK_TIMEOUT = 30.0


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat()


def new_job(args):
    schedule = {"kind": "cron", "expr": args.schedule, "display": args.schedule}
    return {
        "id": args.id,
        "name": args.name,
        "prompt": "",
        "skills": [],
        "skill": None,
        "model": None,
        "provider": None,
        "provider_snapshot": None,
        "model_snapshot": None,
        "base_url": None,
        "script": args.script,
        "no_agent": True,
        "context_from": None,
        "schedule": schedule,
        "schedule_display": args.schedule,
        "repeat": {"times": None, "completed": 0},
        "enabled": True,
        "state": "scheduled",
        "paused_at": None,
        "paused_reason": None,
        "created_at": now_iso(),
        # None: Hermes's scheduler computes the next run from the cron expression.
        "next_run_at": None,
        "last_run_at": None,
        "last_status": None,
        "last_error": None,
        "last_delivery_error": None,
        "deliver": args.deliver,
        "origin": None,
        "enabled_toolsets": None,
        "workdir": None,
    }


def managed(args):
    """The fields this role owns in its job, compared for idempotence."""
    return {
        "name": args.name,
        "script": args.script,
        "no_agent": True,
        "schedule": {"kind": "cron", "expr": args.schedule, "display": args.schedule},
        "schedule_display": args.schedule,
        "deliver": args.deliver,
    }


def load(path):
    try:
        with open(path, encoding="utf-8-sig") as handle:
            data = json.load(handle)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return {"jobs": []}
        raise
    if isinstance(data, list):
        data = {"jobs": data}
    if not isinstance(data, dict) or not isinstance(data.get("jobs", []), list):
        raise ValueError(f"{path}: expected {{'jobs': [...]}}; refusing to rewrite it")
    data.setdefault("jobs", [])
    return data


def save(path, data, owner):
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".jobs_", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        if owner:
            os.chown(tmp, owner[0], owner[1])
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def ensure_dir(path, owner):
    if not os.path.isdir(path):
        os.makedirs(path, 0o700)
        if owner:
            os.chown(path, owner[0], owner[1])


def lock(cron_dir, owner):
    path = os.path.join(cron_dir, ".jobs.lock")
    existed = os.path.exists(path)
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until exit
    if owner and not existed:
        os.chown(path, owner[0], owner[1])
    deadline = time.monotonic() + LOCK_TIMEOUT
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except OSError:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{path}: still locked after {LOCK_TIMEOUT:.0f}s by another process") from None
            time.sleep(0.1)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", required=True)
    parser.add_argument("--id", required=True)
    state = parser.add_mutually_exclusive_group(required=True)
    state.add_argument("--present", action="store_true")
    state.add_argument("--absent", action="store_true")
    parser.add_argument("--name")
    parser.add_argument("--script")
    parser.add_argument("--schedule")
    parser.add_argument("--deliver", default="local")
    parser.add_argument("--owner", help="UID:GID for files this creates")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)

    owner = tuple(int(x) for x in args.owner.split(":")) if args.owner else None
    cron_dir = os.path.join(args.home, "cron")
    jobs_file = os.path.join(cron_dir, "jobs.json")
    result = {"changed": False, "action": "none", "jobs_file": jobs_file}

    if args.absent and not os.path.exists(jobs_file):
        print(json.dumps(result))
        return 0
    if args.present:
        missing = [n for n in ("name", "script", "schedule") if not getattr(args, n)]
        if missing:
            parser.error("--present needs " + ", ".join("--" + n for n in missing))
        if not os.path.isdir(args.home):
            raise SystemExit(f"Hermes home {args.home} does not exist")
        if not args.check:
            ensure_dir(cron_dir, owner)

    handle = lock(cron_dir, owner) if os.path.isdir(cron_dir) else None
    try:
        data = load(jobs_file)
        jobs = data["jobs"]
        index = next((i for i, j in enumerate(jobs) if isinstance(j, dict) and j.get("id") == args.id), None)
        if args.absent:
            if index is not None:
                del jobs[index]
                result.update(changed=True, action="removed")
        elif index is None:
            jobs.append(new_job(args))
            result.update(changed=True, action="added")
        else:
            job = jobs[index]
            want = managed(args)
            diff = {k: v for k, v in want.items() if job.get(k) != v}
            if diff:
                if "schedule" in diff:
                    job["next_run_at"] = None
                job.update(diff)
                result.update(changed=True, action="updated", fields=sorted(diff))
        if result["changed"] and not args.check:
            data["updated_at"] = now_iso()
            if not owner and os.path.exists(jobs_file):
                st = os.stat(jobs_file)
                owner = (st.st_uid, st.st_gid)
            save(jobs_file, data, owner)
    finally:
        if handle is not None:
            handle.close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
