-- Idempotency-Key (docs/api.md): the first outcome of a keyed write, written in the same
-- transaction as the write, so a retry after a lost answer (a 503 during a failover, a cut
-- connection) learns whether the write landed. One row per (actor, route, key): one client can
-- never replay or probe another's key. `fingerprint` is a SHA-256 of the request (method, path,
-- token, scope, proof, body); `status`, `headers` (a JSON object) and `body` are the answer.
-- Expired rows are deleted by fencegate's sweep in bounded batches (`store::idempotency`).
CREATE TABLE fencegate_idempotency (
    actor       text        NOT NULL,
    route       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint text        NOT NULL,
    status      smallint    NOT NULL,
    headers     text        NOT NULL,
    body        bytea       NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (actor, route, key)
);
CREATE INDEX fencegate_idempotency_expires ON fencegate_idempotency (expires_at);
