-- The gateway runtime ledger of upstream Hermes main (PR #106742), applied on top of a file a
-- real release wrote (hermes_fixtures.add_runtime_ledger). No PyPI release has it yet and the
-- stored upstream copy holds no DDL text, so the layout is read from the statements of
-- hermes_state_runtime.py (the columns each INSERT/UPDATE names) and from
-- tests/hermes_state/test_downgrade_delete_guard.py (what the guard refuses, and its words).
-- Upstream keeps schema_version at 31 for these releases.
CREATE TABLE IF NOT EXISTS runtime_epoch (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    epoch INTEGER NOT NULL,
    instance_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS session_admissions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    admission_id TEXT NOT NULL UNIQUE,
    request_id TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    target_session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT,
    lineage_json TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    intent TEXT NOT NULL CHECK (intent IN ('queue', 'steer', 'redirect')),
    status TEXT NOT NULL CHECK (status IN ('queued', 'started', 'unknown', 'terminal')),
    outcome TEXT,
    owner_epoch INTEGER NOT NULL,
    generation INTEGER,
    UNIQUE (principal_id, target_session_id, request_id)
);
CREATE INDEX IF NOT EXISTS idx_session_admissions_target ON session_admissions(target_session_id, status);
CREATE TABLE IF NOT EXISTS worker_executions (
    execution_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT,
    kind TEXT NOT NULL CHECK (kind IN ('cron', 'child', 'compute', 'kanban')),
    owner_epoch INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('registered', 'running', 'unknown', 'terminal')),
    adoption_digest TEXT NOT NULL,
    last_sequence INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idx_worker_executions_session ON worker_executions(session_id, status);
CREATE TABLE IF NOT EXISTS worker_receipts (
    execution_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    payload_digest TEXT NOT NULL,
    result_json TEXT NOT NULL,
    PRIMARY KEY (execution_id, sequence)
);
ALTER TABLE sessions ADD COLUMN runtime_generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN runtime_revision INTEGER NOT NULL DEFAULT 0;
-- An older release's delete (messages, then the session) of a session with runtime history
-- fails with these words instead of the bare "FOREIGN KEY constraint failed".
CREATE TRIGGER IF NOT EXISTS sessions_runtime_ledger_delete_guard
BEFORE DELETE ON sessions
WHEN EXISTS (SELECT 1 FROM session_admissions WHERE target_session_id = OLD.id)
  OR EXISTS (SELECT 1 FROM worker_executions WHERE session_id = OLD.id)
BEGIN
    SELECT RAISE(ABORT, 'This state.db belongs to a newer Hermes (the gateway runtime ledger holds this session). Downgrading is unsupported: run `hermes update`, or restore the pre-update snapshot');
END;
