import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client, LeaseLostError, LockLostError, StaleTokenError, LockHeldError } from 'fencegate';
import { fencegateUrl, uniq, sleep, PKG_DIR } from './helpers.js';

const client = new Client({ url: fencegateUrl() });

/** A client whose requests are counted (and, for renews, optionally held back). */
function countingClient({ blockRenews = false } = {}) {
  const calls = [];
  const c = new Client({
    url: fencegateUrl(),
    fetch: (url, init) => {
      calls.push(`${init.method} ${new URL(url).pathname}`);
      if (blockRenews && String(url).endsWith('/renew')) {
        return new Promise((_, reject) => init.signal.addEventListener('abort', () => reject(init.signal.reason)));
      }
      return fetch(url, init);
    },
  });
  return { c, calls };
}

test('a lease renews past its ttl while held, and writes under its token and scope', async () => {
  const { c, calls } = countingClient();
  const name = uniq('lease');
  const lease = await c.lease(name, { ttlMs: 600, owner: 'renewer' });
  assert.equal(lease.scope, name);
  assert.equal(typeof lease.token, 'string');
  await sleep(2_000); // more than three ttls
  assert.equal(lease.held, true);
  assert.equal(lease.signal.aborted, false);
  const renews = calls.filter((x) => x.endsWith('/renew')).length;
  assert.ok(renews >= 5, `renewed ${renews} times in 2 s with a 600 ms ttl`);
  const h = await client.holder(name);
  assert.equal(h.owner, 'renewer');
  const w = await lease.put(uniq('k'), { ok: true });
  assert.equal(w.fence_token, lease.token);
  assert.equal(w.scope, name);
  await lease.release();
  assert.equal(await client.holder(name), null);
});

test('a renew answered 409 lock-lost aborts the signal; later writes reject without being sent', async () => {
  const { c, calls } = countingClient();
  const name = uniq('lease409');
  const lease = await c.lease(name, { ttlMs: 600 });
  let aborted = null;
  lease.signal.addEventListener('abort', () => {
    aborted = lease.signal.reason;
  });
  await client.admin.retireLock(name, { reason: 'end the lease under the test' });
  await sleep(400); // the next renew (every 200 ms) is refused
  assert.equal(lease.lost, true);
  assert.ok(aborted instanceof LeaseLostError);
  assert.ok(aborted.cause instanceof LockLostError, `cause: ${aborted.cause}`);
  const before = calls.length;
  await assert.rejects(lease.put(uniq('k'), 1), LeaseLostError);
  await assert.rejects(lease.batch([{ op: 'delete', key: uniq('k') }]), LeaseLostError);
  assert.throws(() => lease.throwIfLost(), LeaseLostError);
  assert.equal(calls.length, before, 'nothing sent after the loss');
  await lease.release(); // not an error
  await lease.release();
});

test('a write refused 412 marks the lease lost', async () => {
  const name = uniq('lease412');
  const lease = await client.lease(name, { ttlMs: 10_000 });
  await lease.put(uniq('k'), 'mine');
  // Another lock service takes the scope over: the lock is retired, the scope claimed higher.
  await client.admin.retireLock(name, { reason: 'hand the scope over' });
  await client.claim(name, { token: (BigInt(lease.token) + 5n).toString() });
  const e = await lease.put(uniq('k'), 'late').catch((x) => x);
  assert.ok(e instanceof StaleTokenError, `got ${e}`);
  assert.equal(e.presented, lease.token);
  assert.equal(lease.lost, true);
  assert.equal(lease.signal.aborted, true);
  assert.ok(lease.signal.reason.cause instanceof StaleTokenError);
  await assert.rejects(lease.put(uniq('k'), 'later'), LeaseLostError);
  await lease.release();
});

test('a lease whose renews never succeed is lost at its expiry, before the server could grant it again', async () => {
  const { c, calls } = countingClient({ blockRenews: true });
  const name = uniq('leaseexp');
  const t0 = performance.now();
  const lease = await c.lease(name, { ttlMs: 900 });
  // The lease's timers are unref'd and the held-back renews open no socket: keep the test alive.
  const keepAlive = setTimeout(() => {}, 5_000);
  const lostAt = await new Promise((r) => lease.signal.addEventListener('abort', () => r(performance.now())));
  clearTimeout(keepAlive);
  const after = lostAt - t0;
  assert.ok(after >= 700 && after < 900, `lost ${after.toFixed(0)} ms after the grant was sent (ttl 900, margin 100)`);
  assert.match(lease.signal.reason.message, /expiry passed/);
  const before = calls.length;
  await assert.rejects(lease.put(uniq('k'), 1), LeaseLostError);
  assert.equal(calls.length, before);
});

test('release is idempotent, ends the signal, and later writes reject without being sent', async () => {
  const { c, calls } = countingClient();
  const name = uniq('leaserel');
  const lease = await c.lease(name, { ttlMs: 5_000 });
  await lease.release();
  await lease.release();
  assert.equal(lease.signal.aborted, true);
  assert.equal(lease.signal.reason.name, 'AbortError');
  assert.equal(lease.lost, false);
  assert.equal(lease.held, false);
  assert.equal(calls.filter((x) => x.startsWith('DELETE /v1/locks/')).length, 1);
  const before = calls.length;
  await assert.rejects(lease.put(uniq('k'), 1), LeaseLostError);
  assert.equal(calls.length, before);
  assert.equal(await client.holder(name), null);
});

test('waitMs waits for the holder to let go', async () => {
  const name = uniq('leasewait');
  const first = await client.lease(name, { ttlMs: 5_000, owner: 'first' });
  await assert.rejects(client.lease(name, { ttlMs: 1_000 }), LockHeldError);
  setTimeout(() => first.release(), 300);
  const t0 = performance.now();
  const second = await client.lease(name, { ttlMs: 1_000, owner: 'second', waitMs: 5_000 });
  assert.ok(performance.now() - t0 >= 250);
  assert.ok(BigInt(second.token) > BigInt(first.token));
  await second.release();
});

test('`await using` releases the lease at the end of the block', async () => {
  const name = uniq('using');
  const body = `
import { Client } from 'fencegate';
const client = new Client({ url: process.env.FENCEGATE_URL });
let inside;
{
  await using lease = await client.lease(${JSON.stringify(name)}, { ttlMs: 10_000, owner: 'using' });
  await lease.put(${JSON.stringify(uniq('k'))}, 1);
  inside = await client.holder(lease.name);
}
const outside = await client.holder(${JSON.stringify(name)});
console.log(JSON.stringify({ inside: inside?.owner ?? null, outside }));
`;
  // Node versions whose V8 parses `await using` run it as it is; others (Node 20) run what the
  // TypeScript compiler (a devDependency) makes of it, as a TypeScript user's code would be.
  let native = true;
  try {
    new (Object.getPrototypeOf(async () => {}).constructor)('{ await using x = null; }');
  } catch {
    native = false;
  }
  let code = body;
  if (!native) {
    const ts = (await import('typescript')).default;
    code = ts.transpileModule(body, { compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext } }).outputText;
  }
  const dir = mkdtempSync(join(PKG_DIR, 'test', '.tmp-'));
  const file = join(dir, 'using.mjs');
  writeFileSync(file, code);
  const r = spawnSync(process.execPath, [file], { encoding: 'utf8', env: { ...process.env, FENCEGATE_URL: fencegateUrl() }, timeout: 30_000 });
  spawnSync('rm', ['-rf', dir]);
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout), { inside: 'using', outside: null });
});

test('the renewer never keeps a process alive on its own', () => {
  const r = spawnSync(
    process.execPath,
    [
      '--input-type=module',
      '-e',
      `import { Client } from 'fencegate';
       const lease = await new Client({ url: process.env.FENCEGATE_URL }).lease(${JSON.stringify(uniq('unref'))}, { ttlMs: 60_000 });
       console.log(lease.token);`,
    ],
    { encoding: 'utf8', cwd: PKG_DIR, env: { ...process.env, FENCEGATE_URL: fencegateUrl() }, timeout: 10_000 },
  );
  assert.equal(r.status, 0, `${r.error ?? ''} ${r.stderr}`);
  assert.match(r.stdout, /^\d+\n$/);
});
