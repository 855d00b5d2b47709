#!/usr/bin/env node
// Bring your own lock: a Redis lock (node-redis) whose fencing tokens come from INCR, and
// fencegate refusing the writes of a holder whose lock expired while it worked.
//
// Usage:
//   node examples/redis-lock.mjs LOCK OWNER TTL_MS KEY VALUE WORK_MS
//
//   LOCK     the lock's name; also the fencegate scope (X-Fencing-Scope), so every key written
//            under this lock is guarded by one fence
//   OWNER    who holds it (unique per client, e.g. `${hostname}:${pid}`); checked on release
//   TTL_MS   the Redis lock's lifetime (SET ... PX)
//   KEY      the fencegate key to write
//   VALUE    the value, as JSON text
//   WORK_MS  how long to "work" holding the lock before writing
//
// Environment: FENCEGATE_URL (default http://127.0.0.1:8080), FENCEGATE_API_KEY (optional),
// REDIS_URL (default redis://127.0.0.1:6379), FENCEGATE_HMAC_SECRET (optional: when the scope is
// an [[issuers]] entry's with hmac_sha256_secret_env, sign each token with it).
//
// Prints token=N, then result=written or result=stale. Exit: 0 written; 3 refused as stale (a newer
// holder exists); 2 the lock is held by someone else; 1 anything else.
//
// How the token is minted: one Lua script takes the lock and INCRs a counter that never expires,
// atomically, so each holder of LOCK has a larger token than every earlier holder. The script
// returns the token as a string: a Redis integer reply becomes a JS number, which is exact only
// up to 2^53. The new holder claims the scope (POST /v1/fences/LOCK) right away, so an old
// holder is fenced before the new one has written anything. Use one Redis node with persistence
// (appendonly yes): a counter that goes back (a failover to a replica that missed increments)
// makes the new holder's writes stale, never the old holder's accepted.
import { createClient } from 'redis';
import { Client, StaleTokenError, signHmac } from 'fencegate';

const ACQUIRE = `
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  return tostring(redis.call("INCR", KEYS[2]))
end
return false`;
const RELEASE = `
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0`;

const args = process.argv.slice(2);
if (args.length !== 6) {
  console.error('usage: node examples/redis-lock.mjs LOCK OWNER TTL_MS KEY VALUE WORK_MS');
  process.exit(1);
}
const [lock, owner, ttlMs, key, valueText, workMs] = args;
let value;
try {
  value = JSON.parse(valueText);
} catch {
  console.error(`VALUE must be JSON text, got ${valueText}`);
  process.exit(1);
}

const fencegate = new Client({
  url: process.env.FENCEGATE_URL ?? 'http://127.0.0.1:8080',
  apiKey: process.env.FENCEGATE_API_KEY || undefined,
});
const secret = process.env.FENCEGATE_HMAC_SECRET;
const proof = (token) => (secret ? signHmac(secret, lock, token) : undefined);

const redis = createClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' });
redis.on('error', (e) => console.error(`redis-lock: redis: ${e.message}`));
await redis.connect();
const lockKey = `fencegate:lock:${lock}`;
const fenceKey = `fencegate:lock:${lock}:fence`;
let code = 1;
try {
  const token = await redis.eval(ACQUIRE, { keys: [lockKey, fenceKey], arguments: [owner, ttlMs] });
  if (token === null) {
    const [holder, left] = await Promise.all([redis.get(lockKey), redis.pTTL(lockKey)]);
    console.error(`redis-lock: ${lock} is held by ${holder} for another ${left} ms`);
    code = 2;
  } else {
    console.log(`token=${token}`);
    // Fence out every earlier holder now, before any work.
    await fencegate.claim(lock, { token, proof: proof(token) });
    await new Promise((r) => setTimeout(r, Number(workMs)));
    try {
      const w = await fencegate.put(key, value, { token, scope: lock, proof: proof(token) });
      console.log(`result=written fence_token=${w.fence_token}`);
      code = 0;
    } catch (e) {
      if (!(e instanceof StaleTokenError)) throw e;
      console.log('result=stale');
      console.error(`redis-lock: refused: token ${e.presented} is below the fence ${e.current} of ${e.scope}`);
      code = 3;
    }
    await redis.eval(RELEASE, { keys: [lockKey], arguments: [owner] });
  }
} catch (e) {
  console.error(`redis-lock: ${e.message}`);
  code = 1;
} finally {
  await redis.quit().catch(() => {});
}
process.exit(code);
