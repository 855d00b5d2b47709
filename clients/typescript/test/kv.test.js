import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client, StaleTokenError, toToken, MAX_TOKEN } from 'fencegate';
import { fencegateUrl, uniq } from './helpers.js';

const client = new Client({ url: fencegateUrl() });

test('kv: put, get, overwrite, delete round trip', async () => {
  const key = uniq('kv');
  const created = await client.put(key, { total: 120, items: ['a', 'b'] }, { token: '5' });
  assert.equal(created.key, key);
  assert.equal(created.fence_token, '5');
  assert.equal(created.scope, null);

  const got = await client.get(key);
  assert.deepEqual(got.value, { total: 120, items: ['a', 'b'] });
  assert.equal(got.fence_token, '5');
  assert.equal(typeof got.version, 'number');

  // equal token: the holder writes again
  const again = await client.put(key, 'second', { token: 5 });
  assert.equal(again.fence_token, '5');
  assert.equal((await client.get(key)).value, 'second');

  const del = await client.delete(key, { token: 6n });
  assert.equal(del.deleted, true);
  assert.equal(del.fence_token, '6');
  assert.equal(await client.get(key), null, 'a deleted key reads as null');

  // the tombstone keeps the fence
  await assert.rejects(client.put(key, 1, { token: '5' }), (e) => e instanceof StaleTokenError && e.current === '6');
});

test('kv: an absent key is null, values of every JSON kind survive', async () => {
  assert.equal(await client.get(uniq('absent')), null);
  for (const value of [null, true, 0, -1.5, 'str', [], {}, { nested: { a: [1, { b: null }] } }]) {
    const key = uniq('json');
    await client.put(key, value, { token: '1' });
    assert.deepEqual((await client.get(key)).value, value);
  }
});

test('kv: tokens above 2^53 are exact, in and out', async () => {
  const key = uniq('big');
  const t1 = '9007199254740993'; // 2^53 + 1: a JS number would round it to ...992
  await client.put(key, 1, { token: t1 });
  const got = await client.get(key);
  assert.equal(got.fence_token, t1);
  // ...992 (what a float would send) is below the fence
  await assert.rejects(client.put(key, 2, { token: 9007199254740992n }), (e) => {
    assert.ok(e instanceof StaleTokenError);
    assert.equal(e.presented, '9007199254740992');
    assert.equal(e.current, t1);
    return true;
  });
  // the largest token there is
  const max = await client.put(key, 3, { token: MAX_TOKEN });
  assert.equal(max.fence_token, '9223372036854775807');
  const stale = await client.put(key, 4, { token: '9223372036854775806' }).catch((e) => e);
  assert.ok(stale instanceof StaleTokenError);
  assert.equal(stale.current, '9223372036854775807');
  assert.equal(typeof stale.current, 'string');
});

test('tokens: numbers must be safe integers; malformed tokens never leave the process', async () => {
  const key = uniq('tok');
  let sent = 0;
  const counting = new Client({
    url: fencegateUrl(),
    fetch: (...a) => {
      sent += 1;
      return fetch(...a);
    },
  });
  assert.throws(() => counting.put(key, 1, { token: 2 ** 53 }), TypeError);
  assert.throws(() => counting.put(key, 1, { token: 1.5 }), TypeError);
  assert.throws(() => counting.put(key, 1, { token: -1 }), TypeError);
  assert.throws(() => counting.put(key, 1, { token: '007' }), TypeError);
  assert.throws(() => counting.put(key, 1, { token: '+7' }), TypeError);
  assert.throws(() => counting.put(key, 1, { token: ' 7' }), TypeError);
  assert.throws(() => counting.put(key, 1, { token: '9223372036854775808' }), RangeError);
  assert.throws(() => counting.put(key, 1, { token: 9223372036854775808n }), RangeError);
  assert.throws(() => counting.put(key, 1, {}), TypeError);
  assert.equal(sent, 0);
  assert.equal(toToken(Number.MAX_SAFE_INTEGER), '9007199254740991');
  assert.equal(toToken(0), '0');
  await counting.put(key, 1, { token: 42 });
  assert.equal(sent, 1);
});

test('names: unicode, slashes and percent signs are one path segment; scopes are spelled the same', async () => {
  for (const key of ['café/ü', 'a%2Fb', '100%', 'sp ace?#&', 'emoji-🔒', '..x']) {
    const k = `${uniq('name')}-${key}`;
    const scope = `${uniq('scope')}-café/%`;
    await client.put(k, { k }, { token: '3', scope });
    const got = await client.get(k);
    assert.equal(got.key, k);
    assert.equal(got.scope, scope);
    assert.deepEqual(got.value, { k });
    assert.equal((await client.fence(scope)).fence_token, '3');
  }
  assert.throws(() => client.get('..'), TypeError);
  assert.throws(() => client.get(''), TypeError);
});

test('batch: all or nothing under one token and scope', async () => {
  const scope = uniq('bscope');
  const [a, b] = [uniq('ba'), uniq('bb')];
  const res = await client.batch(
    [
      { op: 'put', key: a, value: 1 },
      { op: 'delete', key: b },
    ],
    { token: '10', scope },
  );
  assert.equal(res.fence_token, '10');
  assert.equal(res.scope, scope);
  assert.deepEqual(
    res.results.map((r) => [r.op, r.key, r.status]),
    [
      ['put', a, 201],
      ['delete', b, 200],
    ],
  );
  const err = await client.batch([{ op: 'put', key: a, value: 2 }], { token: '9', scope }).catch((e) => e);
  assert.ok(err instanceof StaleTokenError);
  assert.equal(err.scope, scope);
  assert.equal(err.current, '10');
  assert.equal((await client.get(a)).value, 1, 'nothing applied');
});

test('fences: claim raises a scope without data; get reads it', async () => {
  const scope = uniq('fence');
  assert.equal(await client.fence(scope), null);
  const c = await client.claim(scope, { token: '77' });
  assert.deepEqual(c, { scope, fence_token: '77' });
  assert.deepEqual(await client.fence(scope), { scope, fence_token: '77' });
  const err = await client.claim(scope, { token: '76' }).catch((e) => e);
  assert.ok(err instanceof StaleTokenError);
  assert.equal(err.presented, '76');
  assert.equal(err.current, '77');
  assert.equal(err.scope, scope);
  // a write under the scope with an older token is refused, whatever the key
  await assert.rejects(client.put(uniq('k'), 1, { token: '70', scope }), StaleTokenError);
});

test('locks: acquire, holder, renew, release (tokens as strings)', async () => {
  const name = uniq('lock');
  const g = await client.acquire(name, { ttlMs: 5_000, owner: 'worker-1' });
  assert.equal(typeof g.token, 'string');
  assert.equal(g.owner, 'worker-1');
  assert.equal(g.scope, name);
  const h = await client.holder(name);
  assert.equal(h.owner, 'worker-1');
  assert.ok(h.remaining_ms > 0 && h.remaining_ms <= 5_000);
  assert.equal(h.token, undefined, 'the holder view never shows the token');
  const r = await client.renew(name, { token: g.token, ttlMs: 5_000 });
  assert.equal(r.token, g.token);
  const rel = await client.release(name, { token: g.token });
  assert.deepEqual(rel, { name, token: g.token, released: true });
  assert.equal(await client.holder(name), null);
  const g2 = await client.acquire(name, { ttlMs: 1_000 });
  assert.ok(BigInt(g2.token) > BigInt(g.token), 'a later grant has a larger token');
  await client.release(name, { token: g2.token });
});

test('probes and the raw request', async () => {
  assert.deepEqual(await client.health(), { status: 'ok' });
  assert.deepEqual(await client.ready(), { status: 'ready' });
  const doc = await client.request('GET', '/openapi.json');
  assert.ok(doc.openapi.startsWith('3.1'));
});
