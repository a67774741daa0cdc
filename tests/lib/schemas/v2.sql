-- ---- v2: the old layout (schema_version 2..10 shape) -------------------------
-- Reconstructed from the migration chain in hermes-agent 0.13.0's hermes_state.py
-- (v10 added messages_fts_trigram, v11 "switch from external-content to inline
-- mode") and the columns of that era. messages_fts reads `messages` as external
-- content; its triggers issue the FTS5 'delete' command with the old values.
-- Its tables and indexes are v30's of that era (later versions only added to them), cut
-- from v30.sql by hermes_fixtures.schema_sql to the columns named in V2_COLUMNS and the
-- indexes in V2_INDEXES; what is v2's own is the FTS below.
-- Loaded by hermes_fixtures._create_sql_schema (layout v2); schema_version is stamped there.

{v2_tables}

CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content,
    content=messages,
    content_rowid=id
);

CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;

CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
END;

CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
