-- The built-in lease service. A lock row is never deleted: `token` is the highest token ever
-- granted for the name, so tokens are never reused, also after release or expiry.
CREATE TABLE fencegate_locks (
    name        text        PRIMARY KEY,
    owner       text,                    -- NULL while free (released)
    token       bigint      NOT NULL CHECK (token > 0),
    expires_at  timestamptz,             -- NULL while free; the database's clock decides
    granted_at  timestamptz NOT NULL DEFAULT now()
);
