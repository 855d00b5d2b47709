-- fencegate core tables, SQLite flavour (the embedded default). Same semantics as
-- migrations/postgres: fences only go up; deleted keys stay as tombstones holding their fence.
-- Times are UTC: text (RFC 3339) for display, integer milliseconds for lease arithmetic.

CREATE TABLE fencegate_kv (
    key         TEXT    PRIMARY KEY NOT NULL,
    value       TEXT,                                   -- JSON text; NULL while deleted
    deleted     INTEGER NOT NULL DEFAULT 0,
    key_fence   INTEGER NOT NULL DEFAULT 0 CHECK (key_fence >= 0),
    fence_token INTEGER NOT NULL CHECK (fence_token >= 0),
    scope       TEXT,
    version     INTEGER NOT NULL DEFAULT 1,
    updated_at  TEXT    NOT NULL
);

CREATE TABLE fencegate_fences (
    scope       TEXT    PRIMARY KEY NOT NULL,
    fence_token INTEGER NOT NULL CHECK (fence_token >= 0),
    version     INTEGER NOT NULL DEFAULT 1,
    updated_at  TEXT    NOT NULL
);

CREATE TABLE fencegate_locks (
    name          TEXT    PRIMARY KEY NOT NULL,
    owner         TEXT,
    token         INTEGER NOT NULL CHECK (token > 0),
    expires_at_ms INTEGER,
    granted_at    TEXT    NOT NULL
);
