// Every mapped error class, produced by a real server on its real status.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  Client,
  FencegateError,
  StaleTokenError,
  ScopeMismatchError,
  TokenNotIssuedError,
  TokenJumpError,
  MissingTokenProofError,
  InvalidTokenProofError,
  LockHeldError,
  LockLostError,
  LockExhaustedError,
  ScopeHasIssuerError,
  MissingTokenError,
  UnauthorizedError,
  ForbiddenError,
  NotFoundError,
  UnavailableError,
  signHmac,
  signEd25519,
  problemError,
  PROBLEM_SLUGS,
  PROBLEM_BASE,
  MalformedTokenError,
  ResetNotBelowError,
} from 'fencegate';
import { fencegateUrl, uniq, startServer, apiKey, databaseUrl, freezableProxy, fencegateBin } from './helpers.js';

const client = new Client({ url: fencegateUrl() });

async function refused(promise, Cls, status) {
  const e = await promise.then(
    (v) => assert.fail(`expected ${Cls.name}, got success ${JSON.stringify(v)}`),
    (err) => err,
  );
  assert.ok(e instanceof Cls, `expected ${Cls.name}, got ${e?.name}: ${e?.message}`);
  assert.ok(e instanceof FencegateError);
  assert.equal(e.status, status);
  assert.equal(e.name, Cls.name);
  assert.ok(e.type.startsWith('https://fencegate.dev/problems/'), e.type);
  assert.equal(typeof e.title, 'string');
  assert.equal(typeof e.detail, 'string');
  assert.equal(e.body.status, status);
  return e;
}

test('StaleTokenError 412 with presented/current strings and the key', async () => {
  const key = uniq('stale');
  await client.put(key, 1, { token: '9007199254740995' });
  const e = await refused(client.put(key, 2, { token: '9007199254740994' }), StaleTokenError, 412);
  assert.equal(e.slug, 'stale-token');
  assert.equal(e.presented, '9007199254740994');
  assert.equal(e.current, '9007199254740995');
  assert.equal(e.key, key);
  assert.ok(e.requestId);
});

test('ScopeMismatchError 409 with the bound and presented scopes', async () => {
  const key = uniq('sm');
  const scope = uniq('smscope');
  await client.put(key, 1, { token: '1', scope });
  const e = await refused(client.put(key, 2, { token: '1' }), ScopeMismatchError, 409);
  assert.equal(e.key, key);
  assert.equal(e.scope, scope);
  assert.equal(e.presentedScope, null);
});

test('TokenNotIssuedError 422 under a built-in lock scope', async () => {
  const name = uniq('tni');
  const g = await client.acquire(name, { ttlMs: 2_000 });
  const next = (BigInt(g.token) + 1n).toString();
  const e = await refused(client.put(uniq('k'), 1, { token: next, scope: name }), TokenNotIssuedError, 422);
  assert.equal(e.scope, name);
  assert.equal(e.presented, next);
  assert.equal(e.latestIssued, g.token);
  await client.release(name, { token: g.token });
});

test('LockHeldError 409 with holder and remainingMs; waitMs gives up with it', async () => {
  const name = uniq('held');
  const g = await client.acquire(name, { ttlMs: 5_000, owner: 'first' });
  const e = await refused(client.acquire(name, { ttlMs: 1_000, owner: 'second' }), LockHeldError, 409);
  assert.equal(e.holder, 'first');
  assert.ok(e.remainingMs > 0 && e.remainingMs <= 5_000);
  const t0 = performance.now();
  await refused(client.acquire(name, { ttlMs: 1_000, waitMs: 300 }), LockHeldError, 409);
  assert.ok(performance.now() - t0 >= 290, 'waited');
  await client.release(name, { token: g.token });
});

test('LockLostError 409 on renew/release by a non-holder', async () => {
  const name = uniq('lost');
  const g = await client.acquire(name, { ttlMs: 5_000, owner: 'holder-x' });
  await client.release(name, { token: g.token });
  await refused(client.renew(name, { token: g.token, ttlMs: 1_000 }), LockLostError, 409);
  const g2 = await client.acquire(name, { ttlMs: 5_000, owner: 'holder-y' });
  const e = await refused(client.release(name, { token: g.token }), LockLostError, 409);
  assert.equal(e.holder, 'holder-y');
  await client.release(name, { token: g2.token });
});

test('LockExhaustedError 409 when no larger token exists', async () => {
  const name = uniq('exh');
  await client.claim(name, { token: '9223372036854775807' });
  await refused(client.acquire(name, { ttlMs: 1_000 }), LockExhaustedError, 409);
});

test('NotFoundError 404 (admin retire of a lock never granted; unknown route); reads answer null', async () => {
  await refused(client.admin.retireLock(uniq('never'), { reason: 'test' }), NotFoundError, 404);
  await refused(client.request('GET', '/v1/nothing-here'), NotFoundError, 404);
  assert.equal(await client.get(uniq('absent')), null);
  assert.equal(await client.fence(uniq('absent')), null);
  assert.equal(await client.holder(uniq('absent')), null);
  assert.equal(await client.tableGet('no-such-resource', 'k'), null);
});

test('MissingTokenError 428 and MalformedTokenError 400 through the raw request', async () => {
  await refused(client.request('PUT', `/v1/kv/${uniq('raw')}`, { body: 1 }), MissingTokenError, 428);
  const e = await client.request('PUT', `/v1/kv/${uniq('raw')}`, { body: 1, headers: { 'X-Fencing-Token': '007' } }).catch((x) => x);
  assert.equal(e.constructor, MalformedTokenError);
  assert.equal(e.status, 400);
  assert.equal(e.slug, 'malformed-token');
});

test('problemError maps by slug, and by status when there is no type', () => {
  assert.ok(problemError(412, { type: 'https://fencegate.dev/problems/stale-token', status: 412 }) instanceof StaleTokenError);
  assert.equal(problemError(409, { type: 'https://fencegate.dev/problems/something-new', status: 409 }).constructor, FencegateError);
  assert.ok(problemError(503, null) instanceof UnavailableError);
  assert.ok(problemError(401, null) instanceof UnauthorizedError);
  assert.equal(problemError(418, null).constructor, FencegateError);
});

test('admin: reset, retire and the audit log', async () => {
  const scope = uniq('adm');
  await client.claim(scope, { token: '50' });
  const r = await client.admin.resetFence(scope, { to: '10', reason: 'ts client test' });
  assert.equal(r.target, 'scope');
  assert.equal(r.from, '50');
  assert.equal(r.to, '10');
  const key = uniq('admkey');
  await client.put(key, 1, { token: '10', scope });
  const rk = await client.admin.resetKey(key, { scope: null, reason: 'unbind' });
  assert.equal(rk.target, 'key');
  await client.put(key, 2, { token: '1' }); // unscoped now
  const name = uniq('admlock');
  const g = await client.acquire(name, { ttlMs: 5_000 });
  const ret = await client.admin.retireLock(name, { reason: 'retire it' });
  assert.equal(ret.target, 'lock');
  assert.equal(ret.to, g.token);
  const audit = await client.admin.audit({ limit: 50 });
  const mine = audit.entries.filter((x) => x.name === scope || x.name === name || x.name === key);
  assert.deepEqual(mine.map((x) => x.action).sort(), ['reset', 'reset', 'retire']);
  await refused(client.admin.resetFence(scope, { to: '20', reason: 'not below' }), ResetNotBelowError, 409);
});

// ---- a server of our own with auth, issuers and a jump cap ----

let secure;
let keys;
let hmacSecret;
let edSeed;
let edPublicB64;
let prefix;

before(async () => {
  prefix = uniq('sec');
  keys = {
    admin: apiKey('ts-admin', ['admin']),
    worker: apiKey('ts-worker', ['read', 'write', 'lock', 'fence'], [`${prefix}/w/`]),
  };
  hmacSecret = randomBytes(32).toString('hex');
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  edSeed = privateKey.export({ format: 'der', type: 'pkcs8' }).subarray(-32);
  edPublicB64 = publicKey.export({ format: 'der', type: 'spki' }).subarray(-32).toString('base64');
  const config = `
[kv]
max_token_jump = 1000

${keys.admin.block}
${keys.worker.block}

[[issuers]]
name = "ts-hmac"
scopes = ["${prefix}/w/hmac/"]
hmac_sha256_secret_env = "TS_ISSUER_SECRET"

[[issuers]]
name = "ts-ed"
scopes = ["${prefix}/w/ed/"]
ed25519_public_key = "${edPublicB64}"
`;
  secure = await startServer({ config, env: { TS_ISSUER_SECRET: hmacSecret } });
});

after(async () => {
  await secure?.stop();
});

test('UnauthorizedError 401 without or with a wrong credential', async () => {
  await refused(new Client({ url: secure.url }).get(`${prefix}/w/x`), UnauthorizedError, 401);
  await refused(new Client({ url: secure.url, apiKey: 'wrong-key' }).get(`${prefix}/w/x`), UnauthorizedError, 401);
});

test('ForbiddenError 403 naming the right and the name', async () => {
  const worker = new Client({ url: secure.url, apiKey: keys.worker.key });
  const outside = `${prefix}/other`;
  const e = await refused(worker.put(outside, 1, { token: '1' }), ForbiddenError, 403);
  assert.equal(e.right, 'write');
  assert.equal(e.key, outside);
  await refused(worker.admin.audit(), ForbiddenError, 403);
  // and inside its prefix it works
  const k = `${prefix}/w/${uniq('ok')}`;
  await worker.put(k, 1, { token: '1' });
  assert.equal((await worker.get(k)).value, 1);
});

test('TokenJumpError 422 past kv.max_token_jump', async () => {
  const admin = new Client({ url: secure.url, apiKey: keys.admin.key });
  const key = `${prefix}/w/${uniq('jump')}`;
  await admin.put(key, 1, { token: '1000' });
  const e = await refused(admin.put(key, 2, { token: '2001' }), TokenJumpError, 422);
  assert.equal(e.presented, '2001');
  assert.equal(e.current, '1000');
  assert.equal(e.maxJump, '1000');
  assert.equal(e.key, key);
});

test('issuer proofs: HMAC and Ed25519 accepted; missing and wrong refused; no built-in lock on the scope', async () => {
  const worker = new Client({ url: secure.url, apiKey: keys.worker.key });
  const hs = `${prefix}/w/hmac/${uniq('s')}`;
  const es = `${prefix}/w/ed/${uniq('s')}`;
  await refused(worker.claim(hs, { token: '7' }), MissingTokenProofError, 422);
  await refused(worker.claim(hs, { token: '7', proof: signHmac('another secret of 32 bytes or more!', hs, '7') }), InvalidTokenProofError, 422);
  // a proof for another token does not verify
  await refused(worker.put(`${prefix}/w/${uniq('k')}`, 1, { token: '8', scope: hs, proof: signHmac(hmacSecret, hs, '7') }), InvalidTokenProofError, 422);
  assert.deepEqual(await worker.claim(hs, { token: '7', proof: signHmac(hmacSecret, hs, '7') }), { scope: hs, fence_token: '7' });
  const k = `${prefix}/w/${uniq('k')}`;
  await worker.put(k, 'signed', { token: 7n, scope: hs, proof: signHmac(Buffer.from(hmacSecret), hs, 7n) });

  await refused(worker.claim(es, { token: '3' }), MissingTokenProofError, 422);
  await refused(worker.claim(es, { token: '3', proof: signHmac(hmacSecret, es, '3') }), InvalidTokenProofError, 422);
  assert.deepEqual(await worker.claim(es, { token: '3', proof: signEd25519(edSeed, es, '3') }), { scope: es, fence_token: '3' });
  await worker.batch([{ op: 'put', key: `${prefix}/w/${uniq('k')}`, value: 1 }], {
    token: '4',
    scope: es,
    proof: signEd25519(edSeed.toString('base64'), es, '4'),
  });

  const e = await refused(worker.acquire(es, { ttlMs: 1_000 }), ScopeHasIssuerError, 409);
  assert.equal(e.scope, es);
  assert.equal(e.issuer, 'ts-ed');
});

test('signEd25519 and signHmac agree with `fencegate sign`', () => {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-ts-sign-'));
  const keyFile = join(dir, 'ed25519.key');
  writeFileSync(keyFile, edSeed.toString('base64'));
  for (const [scope, token] of [
    ['jobs/1', '42'],
    ['café/ü', '9223372036854775807'],
  ]) {
    const ed = spawnSync(fencegateBin(), ['sign', '--scope', scope, '--token', token, '--ed25519-key-file', keyFile], { encoding: 'utf8' });
    assert.equal(ed.status, 0, ed.stderr);
    assert.equal(signEd25519(edSeed, scope, token), ed.stdout.trim());
    const hm = spawnSync(fencegateBin(), ['sign', '--scope', scope, '--token', token, '--hmac-secret-env', 'TS_SIGN_SECRET'], {
      encoding: 'utf8',
      env: { ...process.env, TS_SIGN_SECRET: hmacSecret },
    });
    assert.equal(hm.status, 0, hm.stderr);
    assert.equal(signHmac(hmacSecret, scope, token), hm.stdout.trim());
    assert.match(hm.stdout.trim(), /^[A-Za-z0-9_-]+$/, 'base64url without padding');
  }
});

test('UnavailableError 503 with retryAfter when the database hangs', async () => {
  const db = new URL(databaseUrl());
  const proxy = await freezableProxy(db.hostname || '127.0.0.1', Number(db.port || 5432));
  const viaProxy = new URL(db.href);
  viaProxy.hostname = '127.0.0.1';
  viaProxy.port = String(proxy.port);
  const server = await startServer({
    dbUrl: viaProxy.href,
    config: '[server]\nrequest_timeout_ms = 1000\n[database]\nacquire_timeout_ms = 1000\ncoalesce_workers = 0\n',
  });
  try {
    const c = new Client({ url: server.url });
    const key = uniq('unavail');
    await c.put(key, 1, { token: '1' });
    proxy.freeze();
    const e = await refused(c.put(key, 2, { token: '2' }), UnavailableError, 503);
    assert.equal(e.retryAfter, 1);
    await refused(c.ready(), UnavailableError, 503);
  } finally {
    await server.stop();
    await proxy.close();
  }
});

test("every problem type in the server's /openapi.json maps to a class of its own", async () => {
  const doc = await (await fetch(`${fencegateUrl()}/openapi.json`)).json();
  const types = new Set();
  const walk = (v) => {
    if (typeof v === 'string') {
      if (v.startsWith(PROBLEM_BASE)) types.add(v);
    } else if (v && typeof v === 'object') {
      for (const x of Object.values(v)) walk(x);
    }
  };
  walk(doc);
  assert.ok(types.size >= 30, `only ${types.size} problem types in /openapi.json`);
  for (const type of types) {
    const e = problemError(409, { type, status: 409, detail: 'd' });
    assert.notEqual(e.constructor, FencegateError, `${type}: no class of its own`);
    assert.equal(e.slug, type.slice(PROBLEM_BASE.length));
  }
  assert.equal(PROBLEM_SLUGS.length, types.size, `the library maps ${PROBLEM_SLUGS.length}, the server defines ${types.size}`);
});
