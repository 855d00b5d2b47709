-- The jump trigger's refusal names the write in fields of its own, not in a sentence: the key in
-- CONSTRAINT and the token in COLUMN (as text), so fencegate reads them as they are and never
-- parses a DETAIL. SQLSTATE FGJMP and the message (for psql users) are as before; nothing else
-- changes. No SET search_path: the function names no table and calls only schema-qualified
-- built-ins.
CREATE OR REPLACE FUNCTION fencegate_kv_created() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cap bigint := NULLIF(pg_catalog.current_setting('fencegate.kv_jump_cap', true), '')::bigint;
BEGIN
    IF cap > 0 AND NEW.key_fence > cap THEN
        RAISE EXCEPTION 'token % would create key % with a fence above kv.max_token_jump (%)', NEW.key_fence, NEW.key, cap
            USING ERRCODE = 'FGJMP', CONSTRAINT = NEW.key, COLUMN = NEW.key_fence::text;
    END IF;
    RETURN NULL;
END $$;
