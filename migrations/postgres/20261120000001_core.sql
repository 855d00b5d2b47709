-- fencegate core tables. Fences only ever go up; rows are never garbage-collected (a deleted key
-- stays as a tombstone holding its fence, so a zombie cannot resurrect it with an old token).

CREATE TABLE fencegate_kv (
    key         text        PRIMARY KEY,
    -- The current value; NULL while the key is deleted (a tombstone).
    value       jsonb,
    deleted     boolean     NOT NULL DEFAULT false,
    -- The key's own fence: highest token accepted by an unscoped write to this key.
    -- Scoped writes neither check nor raise it (tokens of different fences are never compared).
    key_fence   bigint      NOT NULL DEFAULT 0 CHECK (key_fence >= 0),
    -- Token and scope (NULL = the key's own fence) of the write that produced this state.
    fence_token bigint      NOT NULL CHECK (fence_token >= 0),
    scope       text,
    -- Writes since the key was last created (1 = just created, also after a tombstone).
    version     bigint      NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Scope fences: one high-water mark per scope (normally a lock name), raised by claims and by
-- scoped writes.
CREATE TABLE fencegate_fences (
    scope       text        PRIMARY KEY,
    fence_token bigint      NOT NULL CHECK (fence_token >= 0),
    version     bigint      NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
