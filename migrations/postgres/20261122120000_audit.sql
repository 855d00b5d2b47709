-- The audit log: every admin action (today: a reset that lowers a fence or rebinds a key's
-- scope), written in the same transaction as the action. Rows are never updated or deleted.
CREATE TABLE fencegate_audit (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),   -- the database's clock
    actor       text        NOT NULL,                 -- who: a key name, a JWT subject, "cli:..."
    action      text        NOT NULL,                 -- "reset"
    target      text        NOT NULL,                 -- "scope" | "key" | "table"
    name        text        NOT NULL,                 -- the scope, the key, or the row's key
    resource    text,                                 -- for a table row: the resource
    from_token  bigint      NOT NULL,
    to_token    bigint      NOT NULL,
    -- A key's or row's scope binding before and after (equal when only the fence changed).
    from_scope  text,
    to_scope    text,
    reason      text        NOT NULL
);
