-- With auth on, a lease belongs to the actor (API key name or JWT sub) that took it: only that
-- actor (or an admin) may renew or release it. NULL: taken with auth off, or free; such a lease
-- may be renewed or released by anyone holding its token (and, with auth on, the lock right).
ALTER TABLE fencegate_locks ADD COLUMN actor text;
