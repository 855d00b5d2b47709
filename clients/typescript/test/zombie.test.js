// A real zombie: a process using the library is frozen with SIGSTOP past its lease, a new holder
// takes the lock and writes, the zombie is resumed and writes again.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { Client, StaleTokenError } from 'fencegate';
import { fencegateUrl, uniq, sleep, PKG_DIR } from './helpers.js';

const client = new Client({ url: fencegateUrl() });

test('a zombie frozen past its lease is fenced: its write is refused, its signal aborted, the new value intact', async (t) => {
  const lock = uniq('zombie');
  const key = uniq('zombie-key');
  const ttlMs = 1_000;
  const child = spawn(process.execPath, [join(PKG_DIR, 'test', 'fixtures', 'zombie-child.mjs'), fencegateUrl(), lock, key, String(ttlMs)], {
    cwd: PKG_DIR,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d) => {
    stderr += d;
  });
  const exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const next = async (what) => {
    let timer;
    const r = await Promise.race([lines.next(), new Promise((res) => (timer = setTimeout(() => res({ timeout: true }), 20_000)))]);
    clearTimeout(timer);
    if (r.timeout || r.done) assert.fail(`the child sent no ${what} (stderr: ${stderr})`);
    return JSON.parse(r.value);
  };
  try {
    const ready = await next('ready line');
    assert.equal(ready.event, 'ready');
    assert.equal(ready.held, true, 'the child renewed past its ttl');
    assert.ok(ready.writes > 3);

    // Freeze it past its lease.
    assert.ok(child.kill('SIGSTOP'));
    await sleep(ttlMs * 1.5);
    // A new holder: the grant fences the zombie's token at once.
    const holder = await client.lease(lock, { ttlMs: 10_000, owner: 'new-holder', waitMs: 5_000 });
    assert.ok(BigInt(holder.token) > BigInt(ready.token));
    await holder.put(key, { by: 'new-holder' });

    assert.ok(child.kill('SIGCONT'));
    child.stdin.write('write\n');
    const result = await next('result line');
    assert.ok(
      ['StaleTokenError', 'LeaseLostError'].includes(result.leaseWrite.error),
      `the zombie's write under its lease: ${JSON.stringify(result.leaseWrite)}`,
    );
    if (result.leaseWrite.error === 'StaleTokenError') {
      assert.equal(result.leaseWrite.presented, ready.token);
      assert.equal(result.leaseWrite.current, holder.token);
    }
    // The same token sent anyway: the server refuses it with the typed error.
    assert.equal(result.direct.error, 'StaleTokenError', JSON.stringify(result.direct));
    assert.equal(result.direct.status, 412);
    assert.equal(result.direct.presented, ready.token);
    assert.equal(result.direct.current, holder.token);
    assert.equal(result.aborted, true, 'the zombie lease.signal is aborted');
    assert.equal(result.lost, true);
    t.diagnostic(`zombie write: ${result.leaseWrite.error}; signal: ${result.reason}`);

    const value = await client.get(key);
    assert.deepEqual(value.value, { by: 'new-holder' });
    assert.equal(value.fence_token, holder.token);
    assert.equal((await client.holder(lock)).owner, 'new-holder');
    await holder.release();
    const { code } = await exited;
    assert.equal(code, 0, stderr);
  } finally {
    if (child.exitCode === null) {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
    }
  }
});
