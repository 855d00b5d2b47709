-- Refused writes (412 stale, 409 scope mismatch, 422 not issued / jump / proof), kept for
-- operators: GET /v1/admin/refusals and the console read them, from every process serving the
-- database, across restarts. Bounded by fencegate itself: the newest 10,000, at most 7 days old.
CREATE TABLE fencegate_refusals (
    id              INTEGER     PRIMARY KEY AUTOINCREMENT,
    at              TEXT        NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- "<process>-<event id>": the same refusal as the console's live event stream sent it.
    uid             TEXT        NOT NULL,
    kind            TEXT        NOT NULL,
    op              TEXT        NOT NULL,
    route           TEXT,
    key             TEXT,
    resource        TEXT,
    scope           TEXT,
    -- A scope mismatch: the scope the write came under (NULL: none).
    presented_scope TEXT,
    presented_token INTEGER,
    current_token   INTEGER,
    keys            INTEGER     NOT NULL DEFAULT 1,
    actor           TEXT,
    request_id      TEXT,
    detail          text
);
CREATE INDEX fencegate_refusals_at ON fencegate_refusals (at);
