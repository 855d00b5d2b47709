-- SQL writers fence a transaction with one call, against the same fences as HTTP:
--   BEGIN; SELECT fencegate.fence('billing', 42); UPDATE ...; COMMIT;
-- and guarded legacy tables refuse (or count) writes that come without one (docs/tables.md).
-- Everything here is created in fencegate's schema (the migrations run with search_path set to
-- it), and the functions keep that search_path (SET search_path FROM CURRENT): a caller's own
-- search_path cannot redirect them to look-alike tables.

-- The guards the HTTP path takes from the configuration, written by fencegate at every start
-- (`store::postgres::sql_fence`): one row. Processes serving one database share a configuration.
CREATE TABLE fencegate_sql_guards (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- kv.max_token_jump (0: no cap).
    max_token_jump bigint  NOT NULL DEFAULT 0 CHECK (max_token_jump >= 0),
    -- [locks] names: scopes reserved for the built-in lock service.
    reserved       text[]  NOT NULL DEFAULT '{}',
    -- [[issuers]] scopes: no proof can be given in SQL, so fence() refuses them.
    issuer_scopes  text[]  NOT NULL DEFAULT '{}',
    -- fencegate's own role: its writes are fenced in their statement, so guards let them by.
    own_role       text    NOT NULL DEFAULT current_user,
    -- kv.max_key_bytes: the longest scope.
    max_scope_bytes integer NOT NULL DEFAULT 512
);
INSERT INTO fencegate_sql_guards DEFAULT VALUES;

-- Unfenced writes to guarded tables in audit mode, per resource: the metric
-- fencegate_unfenced_writes_total{resource} and the console read it.
CREATE TABLE fencegate_unfenced (
    resource   text        PRIMARY KEY,
    writes     bigint      NOT NULL DEFAULT 0,
    last_at    timestamptz NOT NULL DEFAULT now(),
    last_role  text        NOT NULL
);

-- Does `scope` start with one of `prefixes`?
CREATE FUNCTION fencegate_covered(scope text, prefixes text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(prefixes) AS p WHERE left(scope, length(p)) = p)
$$;

-- fence(scope, token): raises the scope's fence to `token` under the inclusive rule (as a claim
-- does), with HTTP's guards in HTTP's order (an issuer's scope; stale; not issued; jump), and
-- keeps the fence row locked until the transaction ends: a newer holder's grant or claim waits
-- for this transaction, and this transaction's later statements run under a fence no one else
-- can raise meanwhile. Refusals: SQLSTATE FG412 (stale; DETAIL: presented and current token),
-- FG422 (not issued, jump, an issuer's scope), 22023 (bad arguments). A refusal aborts the
-- transaction, so nothing it wrote can commit. Returns the token.
CREATE FUNCTION fence(p_scope text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    g         fencegate_sql_guards;
    v_current bigint;
    v_latest  bigint;
BEGIN
    SELECT * INTO STRICT g FROM fencegate_sql_guards;
    IF p_scope IS NULL OR p_scope = '' OR octet_length(p_scope) > g.max_scope_bytes OR p_scope ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'fencegate.fence: the scope must be 1 to % bytes without control characters', g.max_scope_bytes
            USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL OR p_token < 0 THEN
        RAISE EXCEPTION 'fencegate.fence: the token must be 0..9223372036854775807' USING ERRCODE = '22023';
    END IF;
    IF fencegate_covered(p_scope, g.issuer_scopes) THEN
        RAISE EXCEPTION 'fencegate.fence: scope % takes only tokens signed by an issuer ([[issuers]]); no proof can be given in SQL: write through HTTP', p_scope
            USING ERRCODE = 'FG422';
    END IF;
    INSERT INTO fencegate_fences (scope, fence_token) VALUES (p_scope, 0) ON CONFLICT (scope) DO NOTHING;
    SELECT fence_token INTO STRICT v_current FROM fencegate_fences WHERE scope = p_scope FOR UPDATE;
    IF p_token < v_current THEN
        RAISE EXCEPTION 'stale fencing token for scope %: a newer lock holder exists', p_scope
            USING ERRCODE = 'FG412', DETAIL = format('presented_token=%s current_token=%s', p_token, v_current);
    END IF;
    SELECT token INTO v_latest FROM fencegate_locks WHERE name = p_scope AND NOT retired;
    IF FOUND OR fencegate_covered(p_scope, g.reserved) THEN
        v_latest := COALESCE(v_latest, 0);
        IF p_token < 1 OR p_token > v_latest THEN
            RAISE EXCEPTION 'token % was never issued by the built-in lock %', p_token, p_scope
                USING ERRCODE = 'FG422', DETAIL = format('presented_token=%s latest_issued=%s', p_token, v_latest);
        END IF;
    END IF;
    IF g.max_token_jump > 0 AND p_token - v_current > g.max_token_jump THEN
        RAISE EXCEPTION 'token % would raise the fence of scope % from % by more than kv.max_token_jump (%)', p_token, p_scope, v_current, g.max_token_jump
            USING ERRCODE = 'FG422', DETAIL = format('presented_token=%s current_token=%s max_jump=%s', p_token, v_current, g.max_token_jump);
    END IF;
    IF p_token > v_current THEN
        UPDATE fencegate_fences SET fence_token = p_token, version = version + 1, updated_at = now() WHERE scope = p_scope;
    END IF;
    -- What the guard triggers check: this transaction passed fence() for the scope, with this
    -- token (transaction-local: gone at commit or rollback).
    PERFORM set_config('fencegate.fenced',
        (COALESCE(NULLIF(current_setting('fencegate.fenced', true), ''), '{}')::jsonb || jsonb_build_object(p_scope, p_token))::text,
        true);
    RETURN p_token;
END $$;

-- The trigger of a guarded legacy table: TG_ARGV = (resource, scope, mode). A write by another
-- role than fencegate's must come in a transaction that passed fence(scope, t) with a token the
-- fence still admits; otherwise `enforce` refuses it (FG428) and `audit` counts it.
CREATE FUNCTION fencegate_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_resource text := TG_ARGV[0];
    v_scope    text := TG_ARGV[1];
    v_mode     text := TG_ARGV[2];
    v_fenced   jsonb;
    v_token    bigint;
    v_fence    bigint;
BEGIN
    IF session_user = (SELECT own_role FROM fencegate_sql_guards) THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    v_fenced := NULLIF(current_setting('fencegate.fenced', true), '')::jsonb;
    v_token := (v_fenced ->> v_scope)::bigint;
    IF v_token IS NOT NULL THEN
        SELECT fence_token INTO v_fence FROM fencegate_fences WHERE scope = v_scope;
        IF v_fence IS NOT NULL AND v_fence <= v_token THEN
            RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
        END IF;
    END IF;
    IF v_mode = 'enforce' THEN
        RAISE EXCEPTION 'unfenced write to %: call fencegate.fence(%, <token>) first, in the same transaction', TG_TABLE_NAME, quote_literal(v_scope)
            USING ERRCODE = 'FG428', DETAIL = format('resource=%s scope=%s role=%s', v_resource, v_scope, session_user),
                  HINT = 'BEGIN; SELECT fencegate.fence(scope, token); <your writes>; COMMIT;';
    END IF;
    INSERT INTO fencegate_unfenced (resource, writes, last_role) VALUES (v_resource, 1, session_user)
    ON CONFLICT (resource) DO UPDATE SET writes = fencegate_unfenced.writes + 1, last_at = now(), last_role = EXCLUDED.last_role;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;

-- Installs (or replaces) the guard trigger on a table; arguments bound by fencegate, quoted here.
CREATE FUNCTION fencegate_install_guard(tbl regclass, resource text, scope text, mode text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS fencegate_guard ON %s', tbl);
    EXECUTE format('CREATE TRIGGER fencegate_guard BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %I.fencegate_guard(%L, %L, %L)',
                   tbl, current_schema(), resource, scope, mode);
END $$;

-- Any role may call fence() (it runs as fencegate's role and touches only fences), given USAGE
-- on the schema, granted here to PUBLIC (revoke it and grant it to the writers' roles to narrow
-- it). USAGE lets a role find the schema's objects, not read or write its tables.
GRANT EXECUTE ON FUNCTION fence(text, bigint) TO PUBLIC;
DO $$ BEGIN EXECUTE format('GRANT USAGE ON SCHEMA %I TO PUBLIC', current_schema()); END $$;
