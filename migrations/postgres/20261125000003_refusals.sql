-- Refused writes (412 stale, 409 scope mismatch, 422 not issued / jump / proof), kept for
-- operators: GET /v1/admin/refusals and the console read them, from every process serving the
-- database, across restarts. Bounded by fencegate itself: the newest 10,000, at most 7 days old.
CREATE TABLE fencegate_refusals (
    id              bigserial   PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    -- "<process>-<event id>": the same refusal as the console's live event stream sent it.
    uid             text        NOT NULL,
    kind            text        NOT NULL,
    op              text        NOT NULL,
    route           text,
    key             text,
    resource        text,
    scope           text,
    -- A scope mismatch: the scope the write came under (NULL: none).
    presented_scope text,
    presented_token bigint,
    current_token   bigint,
    keys            bigint      NOT NULL DEFAULT 1,
    actor           text,
    request_id      text,
    detail          text
);
CREATE INDEX fencegate_refusals_at ON fencegate_refusals (at);
