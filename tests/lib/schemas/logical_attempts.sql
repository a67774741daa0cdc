-- A store as upstream main's logical-attempt index shapes it (hermes_state_logical_attempts.py, read
-- at NousResearch/hermes-agent cfd08b374bc0: its SCHEMA_SQL), applied on top of a 0.22.2 file that
-- has the runtime ledger (schemas/runtime_ledger.sql). Reduced to what the catalogue sees: the tables
-- and the triggers upstream installs on the ledger's and state_meta's writes, written here in this
-- collection's words (columns and events as upstream's, bodies minimal).
CREATE TABLE IF NOT EXISTS logical_attempts (
    admission_id TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    intent TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS logical_attempt_dirty (
    source TEXT NOT NULL,
    admission_id TEXT NOT NULL,
    session_id TEXT,
    PRIMARY KEY (source, admission_id)
);
CREATE TRIGGER IF NOT EXISTS logical_attempt_live_delete AFTER DELETE ON session_admissions
BEGIN INSERT OR REPLACE INTO logical_attempt_dirty VALUES ('live', OLD.admission_id, OLD.target_session_id); END;
CREATE TRIGGER IF NOT EXISTS logical_attempt_terminal_insert AFTER INSERT ON state_meta
WHEN NEW.key GLOB 'gateway.terminal_admission.v1.*'
BEGIN INSERT OR IGNORE INTO logical_attempt_dirty VALUES ('terminal', substr(NEW.key, 31), NULL); END;
