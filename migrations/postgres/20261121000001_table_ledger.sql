-- Fences of legacy-table rows (/v1/tables/...). The legacy tables themselves are never altered:
-- every row fencegate has written keeps a ledger row here, also after the row is deleted (a
-- tombstone: the fence outlives the row, so a zombie cannot resurrect it with an old token).
-- Writers of one row serialize on its ledger row lock.

CREATE TABLE fencegate_ledger (
    -- The legacy table, as PostgreSQL prints its qualified name (e.g. public.orders).
    relation    text        NOT NULL,
    -- The row's canonical key: each key column's value as PostgreSQL prints it, percent-encoded,
    -- joined by ',' in the configured key order (the URL form of docs/tables.md).
    key         text        NOT NULL,
    -- The row's own fence: highest token accepted by an unscoped write to this row.
    -- Scoped writes neither check nor raise it (tokens of different fences are never compared).
    fence       bigint      NOT NULL DEFAULT 0 CHECK (fence >= 0),
    -- Token and scope (NULL = the row's own fence) of the last write fencegate accepted.
    token       bigint      NOT NULL CHECK (token >= 0),
    scope       text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (relation, key)
);
