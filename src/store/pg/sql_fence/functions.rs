//! The PL/pgSQL of `fencegate.fence(scope, token)` and of the guard trigger's function, written
//! at every start from the same Rust spelling of the rules as the HTTP statements
//! (`store::sql`: [`fence_admits`], [`sql_issued_check`], [`sql_jump_check`]), so SQL writers
//! and HTTP writers cannot drift apart: a change to a rule changes both.
//!
//! Both functions are SECURITY DEFINER (they run as fencegate's role, which owns fencegate's
//! tables) with `search_path` = fencegate's schema, then `pg_temp` last: a caller's temporary
//! table cannot stand in for one of fencegate's.

use crate::{
    fence::{Checks, Rule},
    store::sql::{fence_admits, sql_issued_check, sql_jump_check},
};

/// The refusals SQL writers can meet, each counted by a sequence of its own (sequences are not
/// transactional: a count survives the rollback the refusal causes), with the SQLSTATE it is
/// raised with. The label is the HTTP problem type a client would get for the same refusal.
pub const REFUSALS: [(&str, &str); 6] = [
    ("stale-token", "FG412"),
    ("token-not-issued", "FG422"),
    ("token-jump", "FG422"),
    ("scope-has-issuer", "FG422"),
    ("forbidden", "FG403"),
    ("unfenced", "FG428"),
];

/// The sequence counting refusals of `kind` (one of [`REFUSALS`]).
pub fn counter(kind: &str) -> String {
    format!("fencegate_sql_refused_{}", kind.replace('-', "_"))
}

/// `PERFORM nextval(..)` for a refusal of `kind`, schema-qualified.
fn count(schema: &str, kind: &str) -> String {
    format!("PERFORM pg_catalog.nextval('{schema}.{}');", counter(kind))
}

/// `CREATE OR REPLACE FUNCTION {schema}.fence(..)`: the checks of an HTTP write under a scope,
/// in the verdict's order (`fence::verdict`), after the two that HTTP makes before any database
/// work (who may, and an issuer's scope: no proof can be given in SQL).
///
/// 1. the role (session_user) is fencegate's own, or an `[[auth.roles]]` entry whose prefixes
///    cover the scope: else FG403;
/// 2. the scope is not an `[[issuers]]` scope: else FG422;
/// 3. the fence row is locked (`FOR UPDATE`, until the transaction ends) and the rule of the
///    scope admits the token (strict for `kv.strict` or a strict resource's scope): else FG412;
/// 4. the token was issued, if the scope is a built-in lock's: else FG422;
/// 5. the token does not jump past `kv.max_token_jump`: else FG422;
///
/// then the fence is raised, the transaction is marked as fenced for the scope with the token
/// (what the guard trusts), made impossible to prepare (`PREPARE TRANSACTION` refuses a
/// transaction that touched a temporary table), and its idle time is bounded. Calling it again in the same
/// transaction with the same token returns at once (the fence is this transaction's already).
pub fn fence_function(schema: &str, checks: &Checks) -> String {
    let inclusive = fence_admits(Rule::Inclusive, "v_current", "p_token");
    let strict = fence_admits(Rule::Strict, "v_current", "p_token");
    let issued = sql_issued_check("p_scope", "p_token", &checks.reserved);
    let jump = sql_jump_check(checks.jump, "v_current", "p_token");
    let forbidden = count(schema, "forbidden");
    let issuer = count(schema, "scope-has-issuer");
    let stale = count(schema, "stale-token");
    let not_issued = count(schema, "token-not-issued");
    let jumped = count(schema, "token-jump");
    format!(
        r#"CREATE OR REPLACE FUNCTION "{schema}".fence(p_scope text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = "{schema}", pg_temp AS $fence$
DECLARE
    g         fencegate_sql_guards;
    v_allowed text[];
    v_strict  boolean;
    v_current bigint;
    v_marked  bigint;
    v_created boolean := false;
    v_kind    text;
    v_ours    boolean;
    v_idle    bigint;
BEGIN
    SELECT * INTO STRICT g FROM fencegate_sql_guards;
    IF p_scope IS NULL OR p_scope = '' OR octet_length(p_scope) > g.max_scope_bytes OR p_scope ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'fencegate.fence: the scope must be 1 to % bytes without control characters', g.max_scope_bytes
            USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL OR p_token < 0 THEN
        RAISE EXCEPTION 'fencegate.fence: the token must be 0..9223372036854775807' USING ERRCODE = '22023';
    END IF;
    IF session_user <> g.own_role THEN
        SELECT prefixes INTO v_allowed FROM fencegate_sql_roles WHERE role = session_user;
        IF NOT FOUND OR NOT fencegate_covered(p_scope, v_allowed) THEN
            {forbidden}
            RAISE EXCEPTION 'fencegate.fence: role % may not fence scope %', session_user, p_scope
                USING ERRCODE = 'FG403',
                      DETAIL = format('role=%s scope=%s', session_user, p_scope),
                      HINT = 'declare the role in [[auth.roles]] with a prefix covering the scope (docs/tables.md)';
        END IF;
    END IF;
    IF fencegate_covered(p_scope, g.issuer_scopes) THEN
        {issuer}
        RAISE EXCEPTION 'fencegate.fence: scope % takes only tokens signed by an issuer ([[issuers]]); no proof can be given in SQL: write through HTTP', p_scope
            USING ERRCODE = 'FG422', DETAIL = format('scope=%s', p_scope);
    END IF;
    SELECT token INTO v_marked FROM fencegate_sql_marks WHERE xact = pg_catalog.pg_current_xact_id() AND scope = p_scope;
    IF v_marked = p_token THEN
        RETURN p_token;
    END IF;
    v_strict := g.kv_strict OR p_scope = ANY (g.strict_scopes);
    -- A scope never fenced has no fence to pass (as an HTTP write's claim inserts its row); the
    -- row made here counts as 0 for the jump cap, as a missing fence does over HTTP.
    INSERT INTO fencegate_fences (scope, fence_token) VALUES (p_scope, 0) ON CONFLICT (scope) DO NOTHING
        RETURNING true INTO v_created;
    v_created := COALESCE(v_created, false);
    SELECT fence_token INTO STRICT v_current FROM fencegate_fences WHERE scope = p_scope FOR UPDATE;
    IF NOT v_created AND NOT (CASE WHEN v_strict THEN {strict} ELSE {inclusive} END) THEN
        {stale}
        IF v_strict AND p_token = v_current THEN
            RAISE EXCEPTION 'token % is not above the fence % of scope % (strict: one write per token)', p_token, v_current, p_scope
                USING ERRCODE = 'FG412', DETAIL = format('presented_token=%s current_token=%s scope=%s', p_token, v_current, p_scope);
        END IF;
        RAISE EXCEPTION 'token % is older than the fence % of scope %: a newer lock holder exists', p_token, v_current, p_scope
            USING ERRCODE = 'FG412', DETAIL = format('presented_token=%s current_token=%s scope=%s', p_token, v_current, p_scope);
    END IF;
    IF NOT ({issued}) THEN
        {not_issued}
        RAISE EXCEPTION 'token % was never issued by the built-in lock %', p_token, p_scope
            USING ERRCODE = 'FG422', DETAIL = format('presented_token=%s latest_issued=%s scope=%s', p_token,
                COALESCE((SELECT token FROM fencegate_locks WHERE name = p_scope AND NOT retired), 0), p_scope);
    END IF;
    IF NOT ({jump}) THEN
        {jumped}
        RAISE EXCEPTION 'token % would raise the fence of scope % from % by more than kv.max_token_jump', p_token, p_scope, v_current
            USING ERRCODE = 'FG422', DETAIL = format('presented_token=%s current_token=%s scope=%s', p_token, v_current, p_scope);
    END IF;
    IF v_created OR p_token > v_current THEN
        UPDATE fencegate_fences SET fence_token = p_token, version = version + 1, updated_at = now() WHERE scope = p_scope;
    END IF;
    INSERT INTO fencegate_sql_marks (xact, scope, token) VALUES (pg_catalog.pg_current_xact_id(), p_scope, p_token)
        ON CONFLICT (xact, scope) DO UPDATE SET token = EXCLUDED.token;
    -- A prepared transaction would hold the fence row after its session is gone, past any idle
    -- timeout: a transaction that touched a temporary table cannot be prepared, so this one
    -- touches one of fencegate's (created once per session; anything else of that name in the
    -- way is refused, never read: it could run a caller's code as fencegate's role).
    SELECT c.relkind::text, c.relowner = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)
        INTO v_kind, v_ours FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass('pg_temp.fencegate_no_prepare');
    IF NOT FOUND THEN
        CREATE TEMP TABLE pg_temp.fencegate_no_prepare ();
    ELSIF v_kind <> 'r' OR NOT v_ours THEN
        RAISE EXCEPTION 'fencegate.fence: pg_temp.fencegate_no_prepare is not fencegate''s: drop it'
            USING ERRCODE = '42P07';
    END IF;
    PERFORM 1 FROM pg_temp.fencegate_no_prepare;
    -- The bound never loosens a stricter one the session already has. (Its text, as an
    -- interval: pg_settings would format every setting of the server, about a millisecond.)
    IF g.idle_timeout_ms > 0 THEN
        v_idle := (pg_catalog.date_part('epoch', pg_catalog.current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint;
        IF v_idle = 0 OR v_idle > g.idle_timeout_ms THEN
            PERFORM pg_catalog.set_config('idle_in_transaction_session_timeout', g.idle_timeout_ms || 'ms', true);
        END IF;
    END IF;
    RETURN p_token;
END $fence$"#
    )
}

/// `CREATE OR REPLACE FUNCTION {schema}.fencegate_guard()`: the trigger of a guarded table,
/// whose one argument is the resource. Its mode and scope are read from `fencegate_guards`; a
/// table the row does not name, itself or as a partition's ancestor (the function attached
/// elsewhere, a resource no longer configured), is let by and counted nowhere. A write by fencegate's own role passes (it is
/// fenced in its own statement); any other must come in a transaction that `fence()` marked
/// for the resource's scope with a token the fence still admits.
pub fn guard_function(schema: &str) -> String {
    let admits = fence_admits(Rule::Inclusive, "v_fence", "v_token");
    let unfenced = count(schema, "unfenced");
    format!(
        r#"CREATE OR REPLACE FUNCTION "{schema}".fencegate_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = "{schema}", pg_temp AS $guard$
DECLARE
    g       fencegate_guards;
    v_token bigint;
    v_fence bigint;
BEGIN
    IF session_user = (SELECT own_role FROM fencegate_sql_guards) THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    SELECT * INTO g FROM fencegate_guards WHERE resource = TG_ARGV[0] AND relid = TG_RELID;
    IF NOT FOUND THEN
        -- A partition of the resource's table (its trigger is a clone of the table's).
        SELECT * INTO g FROM fencegate_guards WHERE resource = TG_ARGV[0]
            AND relid IN (SELECT pg_catalog.pg_partition_ancestors(TG_RELID));
    END IF;
    IF NOT FOUND OR g.mode = 'off' THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    SELECT token INTO v_token FROM fencegate_sql_marks WHERE xact = pg_catalog.pg_current_xact_id() AND scope = g.scope;
    IF v_token IS NOT NULL THEN
        SELECT fence_token INTO v_fence FROM fencegate_fences WHERE scope = g.scope;
        IF v_fence IS NOT NULL AND {admits} THEN
            RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
        END IF;
    END IF;
    IF g.mode = 'enforce' THEN
        {unfenced}
        RAISE EXCEPTION 'unfenced write to %: call fencegate.fence(%, <token>) first, in the same transaction', TG_TABLE_NAME, quote_literal(g.scope)
            USING ERRCODE = 'FG428', DETAIL = format('resource=%s scope=%s role=%s', g.resource, g.scope, session_user),
                  HINT = 'BEGIN; SELECT fencegate.fence(scope, token); <your writes>; COMMIT;';
    END IF;
    INSERT INTO fencegate_unfenced (resource, writes, last_role) VALUES (g.resource, 1, session_user)
    ON CONFLICT (resource) DO UPDATE SET writes = fencegate_unfenced.writes + 1, last_at = now(), last_role = EXCLUDED.last_role;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $guard$"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::{JumpCap, Reserved};

    #[test]
    fn the_bodies_carry_the_rules_of_the_http_statements() {
        let checks = Checks {
            jump: JumpCap(100),
            reserved: Reserved::new(&["jobs/".to_owned()]).unwrap(),
            ..Checks::default()
        };
        let body = fence_function("fencegate", &checks);
        assert!(body.contains(&fence_admits(Rule::Strict, "v_current", "p_token")));
        assert!(body.contains(&fence_admits(Rule::Inclusive, "v_current", "p_token")));
        assert!(body.contains(&sql_jump_check(JumpCap(100), "v_current", "p_token")));
        assert!(body.contains("'jobs/'"));
        for (kind, _) in REFUSALS.iter().filter(|(k, _)| *k != "unfenced") {
            assert!(body.contains(&counter(kind)), "{kind}");
        }
        assert!(guard_function("fencegate").contains(&counter("unfenced")));
    }
}
