-- Idempotency-Key (docs/api.md): the first outcome of a keyed write, written in the same
-- transaction as the write, so a retry after a lost answer learns whether the write landed.
-- One row per (actor, route, key): one client can never replay or probe another's key.
-- `fingerprint` is a SHA-256 of the request; `status`, `headers` (a JSON object) and `body`
-- are the answer; `expires_at` is in milliseconds since the epoch. Expired rows are deleted by
-- fencegate's sweep in bounded batches (`store::idempotency`).
CREATE TABLE fencegate_idempotency (
    actor       TEXT    NOT NULL,
    route       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    fingerprint TEXT    NOT NULL,
    status      INTEGER NOT NULL,
    headers     TEXT    NOT NULL,
    body        BLOB    NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (actor, route, key)
);
CREATE INDEX fencegate_idempotency_expires ON fencegate_idempotency (expires_at);
