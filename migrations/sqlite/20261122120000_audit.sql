-- The audit log (see migrations/postgres): every admin action, in the same transaction.
CREATE TABLE fencegate_audit (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          TEXT    NOT NULL,
    actor       TEXT    NOT NULL,
    action      TEXT    NOT NULL,
    target      TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    resource    TEXT,
    from_token  INTEGER NOT NULL,
    to_token    INTEGER NOT NULL,
    from_scope  TEXT,
    to_scope    TEXT,
    reason      TEXT    NOT NULL
);
