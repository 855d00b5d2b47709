-- kv.max_token_jump for a key that a write creates: its fence counts as 0, so its token may not
-- exceed the cap. A key that exists is checked in the upsert's DO UPDATE .. WHERE, on the row as
-- locked; this trigger fires only for rows actually inserted (an upsert that updates fires no
-- INSERT trigger), so the upsert needs no lookup of its keys before the insert. fencegate's
-- unscoped writes set the cap for their own transaction in the statement itself (so a pooler
-- cannot lose it), and only if this trigger is there and enabled ALWAYS: otherwise their rows are
-- not written at all (fail closed). Without the setting (any other writer) there is nothing to
-- check. Scoped writes leave the key's fence at 0 and are capped by their scope's
-- fence instead: the WHEN skips them. The refusal, SQLSTATE FGJMP (DETAIL: the token, a space,
-- the key), aborts the statement: nothing of it is committed, and fencegate answers 422
-- token-jump to that write.
-- No SET search_path: the function names no table and calls only schema-qualified built-ins.
CREATE FUNCTION fencegate_kv_created() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cap bigint := NULLIF(pg_catalog.current_setting('fencegate.kv_jump_cap', true), '')::bigint;
BEGIN
    IF cap > 0 AND NEW.key_fence > cap THEN
        RAISE EXCEPTION 'token % would create key % with a fence above kv.max_token_jump (%)', NEW.key_fence, NEW.key, cap
            USING ERRCODE = 'FGJMP', DETAIL = pg_catalog.format('%s %s', NEW.key_fence, NEW.key);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER fencegate_kv_created AFTER INSERT ON fencegate_kv
    FOR EACH ROW WHEN (NEW.key_fence > 0) EXECUTE FUNCTION fencegate_kv_created();
-- ALWAYS: it fires under session_replication_role = replica too.
ALTER TABLE fencegate_kv ENABLE ALWAYS TRIGGER fencegate_kv_created;
