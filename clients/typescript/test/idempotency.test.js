// Idempotency-Key: every write carries one, its retry carries the same, and a write that landed is
// answered with its first outcome even after a newer holder fenced the writer out. The lost
// answers are real: the request reaches the fencegate under test, and its answer is dropped.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Client, StaleTokenError, IdempotencyKeyReusedError } from 'fencegate';
import { fencegateUrl, uniq } from './helpers.js';

const client = new Client({ url: fencegateUrl() });

/** A fetch that records what it sends and, with `loseFirst`, drops the first keyed answer. */
function recordingFetch({ loseFirst = false, between = async () => {} } = {}) {
  const sent = [];
  const answers = [];
  let lose = loseFirst;
  const f = async (url, init) => {
    const headers = new Headers(init.headers);
    sent.push({ method: init.method, url, key: headers.get('idempotency-key') });
    const res = await fetch(url, init);
    answers.push(res.headers.get('idempotent-replayed'));
    if (lose && headers.has('idempotency-key')) {
      lose = false;
      await res.arrayBuffer();
      await between();
      throw new TypeError('fetch failed (the answer was lost: test)');
    }
    return res;
  };
  return { fetch: f, sent, answers };
}

test('idempotency: the same key after a newer holder gets the first answer, replayed', async () => {
  const key = uniq('idem');
  const scope = uniq('idem-scope');
  const idempotencyKey = randomUUID();
  const rec = recordingFetch();
  const c = new Client({ url: fencegateUrl(), fetch: rec.fetch });
  const first = await c.put(key, { n: 1 }, { token: 5, scope, idempotencyKey });
  await client.claim(scope, { token: 6 }); // a newer holder
  const again = await c.put(key, { n: 1 }, { token: 5, scope, idempotencyKey });
  assert.deepEqual(again, first);
  assert.deepEqual(rec.answers, [null, 'true']);
  assert.deepEqual(
    rec.sent.map((s) => s.key),
    [idempotencyKey, idempotencyKey],
  );
  // without the key the write is judged again: fenced out
  await assert.rejects(c.put(key, { n: 1 }, { token: 5, scope }), StaleTokenError);
  // the same key with another write: 422, nothing changed
  await assert.rejects(c.put(key, { n: 2 }, { token: 7, scope, idempotencyKey }), IdempotencyKeyReusedError);
  assert.deepEqual((await client.get(key)).value, { n: 1 });
});

test('idempotency: every write sends its own key; reads and lock calls send none', async () => {
  const rec = recordingFetch();
  const c = new Client({ url: fencegateUrl(), fetch: rec.fetch });
  const key = uniq('idem-each');
  await c.put(key, 1, { token: 1 });
  await c.put(key, 2, { token: 1 });
  await c.delete(key, { token: 2 });
  await c.batch([{ op: 'put', key, value: 3 }], { token: 3 });
  await c.claim(uniq('idem-each-scope'), { token: 4 });
  await c.get(key);
  await c.acquire(uniq('idem-each-lock'), { ttlMs: 1000 });
  const keys = rec.sent.map((s) => s.key);
  const writes = keys.slice(0, 5);
  for (const k of writes) assert.match(k, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(new Set(writes).size, 5, 'two writes without an explicit key sent the same key');
  assert.deepEqual(keys.slice(5), [null, null]);
});

test('idempotency: a lost answer is retried with the same key and replayed', async () => {
  const key = uniq('idem-lost');
  const scope = uniq('idem-lost-scope');
  const rec = recordingFetch({ loseFirst: true, between: () => client.claim(scope, { token: 9 }) });
  const c = new Client({ url: fencegateUrl(), fetch: rec.fetch });
  const w = await c.put(key, 'landed', { token: 8, scope });
  assert.equal(w.fence_token, '8');
  assert.equal(rec.sent.length, 2);
  assert.equal(rec.sent[0].key, rec.sent[1].key);
  assert.deepEqual(rec.answers, [null, 'true']);
  assert.equal((await client.get(key)).value, 'landed');
});

test('idempotency: with retries 0 a lost answer is thrown', async () => {
  const rec = recordingFetch({ loseFirst: true });
  const c = new Client({ url: fencegateUrl(), fetch: rec.fetch, retries: 0 });
  await assert.rejects(c.put(uniq('idem-noretry'), 1, { token: 1 }), TypeError);
  assert.equal(rec.sent.length, 1);
});

test('idempotency: a bad key is refused before sending', () => {
  for (const bad of ['', 'a b', 'é', 'x'.repeat(256), 7]) {
    assert.throws(() => client.put(uniq('idem-bad'), 1, { token: 1, idempotencyKey: bad }), TypeError);
  }
});
