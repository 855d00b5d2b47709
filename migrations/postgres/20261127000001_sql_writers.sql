-- SQL writers, first-class (docs/tables.md): who may call fence(), one rule with HTTP, guards
-- that survive restarts under a role that owns no application table, a record of fence() that
-- nobody else can write, and refusals counted although their transaction rolls back.
--
-- The bodies of fence() and fencegate_guard() are written again at every start by fencegate
-- (`store/pg/sql_fence`), from the same Rust spelling of the rule as the HTTP statements; the
-- ones left here are placeholders that refuse everything until then.

-- [[auth.roles]]: the login roles (session_user) that may call fence(), and the scopes each may
-- fence. Written at every start; EXECUTE on fence() is granted to exactly these.
CREATE TABLE fencegate_sql_roles (
    role     text   PRIMARY KEY,
    prefixes text[] NOT NULL
);

-- One row per [[resources]] table: the guard trigger's argument is the resource alone, its mode
-- and scope live here, so audit -> enforce -> off is a configuration change, not DDL. `relid`
-- binds the row to the table: the trigger function attached anywhere else does nothing.
CREATE TABLE fencegate_guards (
    resource text PRIMARY KEY,
    relid    oid  NOT NULL,
    scope    text,
    mode     text NOT NULL CHECK (mode IN ('enforce', 'audit', 'off'))
);

-- What fence() recorded for each transaction (pg_current_xact_id()): the only thing the guard
-- trusts. Owned by fencegate's role and granted to no one: fence() and the guard are SECURITY
-- DEFINER. Unlogged: a mark matters only while its transaction runs (a crash ends it); rows of
-- finished transactions are deleted by fencegate every few seconds.
CREATE UNLOGGED TABLE fencegate_sql_marks (
    xact  xid8   NOT NULL,
    scope text   NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (xact, scope)
);

-- The rule per scope, and how long a transaction that called fence() may sit idle.
ALTER TABLE fencegate_sql_guards
    ADD COLUMN strict_scopes   text[]  NOT NULL DEFAULT '{}',
    ADD COLUMN kv_strict       boolean NOT NULL DEFAULT false,
    ADD COLUMN idle_timeout_ms integer NOT NULL DEFAULT 30000 CHECK (idle_timeout_ms >= 0);

-- SQL refusals, counted although the refusing transaction rolls back: sequences are not
-- transactional. fencegate_sql_refusals_total{kind} reads them.
CREATE SEQUENCE fencegate_sql_refused_stale_token;
CREATE SEQUENCE fencegate_sql_refused_token_not_issued;
CREATE SEQUENCE fencegate_sql_refused_token_jump;
CREATE SEQUENCE fencegate_sql_refused_scope_has_issuer;
CREATE SEQUENCE fencegate_sql_refused_forbidden;
CREATE SEQUENCE fencegate_sql_refused_unfenced;

-- Installing a trigger is now the table owner's DDL (or fencegate's where it can), run once.
DROP FUNCTION fencegate_install_guard(regclass, text, text, text);

-- Placeholders until fencegate's first start writes the real bodies: refuse everything.
CREATE OR REPLACE FUNCTION fence(p_scope text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'fencegate.fence: fencegate has not started on this database since its upgrade'
        USING ERRCODE = 'FG403';
END $$;

-- No one but fencegate's role (the owner) may call either function; fencegate grants EXECUTE
-- on fence() to the [[auth.roles]] at start. A trigger runs its function whatever the writer's
-- rights: only CREATE TRIGGER needs EXECUTE.
REVOKE EXECUTE ON FUNCTION fence(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate_guard() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate_covered(text, text[]) FROM PUBLIC;
