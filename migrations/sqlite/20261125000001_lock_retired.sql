-- A retired built-in lock no longer speaks for its scope's tokens: an admin retires one whose
-- old grants keep another lock service's tokens out (`POST /v1/admin/locks/{name}/retire`,
-- audited). The row stays, with its token, so a later grant still never reissues a token.
ALTER TABLE fencegate_locks ADD COLUMN retired INTEGER NOT NULL DEFAULT 0 CHECK (retired IN (0, 1));

-- Actors are namespaced now (key:NAME, jwt:SUB, cert:NAME), so a JWT whose subject equals an
-- API key's name is another actor. A live lease taken before the upgrade names its actor the old
-- way, which cannot be told apart; it becomes a lease of no actor in particular (renewed or
-- released by whoever holds its token and the lock right) until it ends.
UPDATE fencegate_locks SET actor = NULL
WHERE actor IS NOT NULL AND actor NOT LIKE 'key:%' AND actor NOT LIKE 'jwt:%' AND actor NOT LIKE 'cert:%';
