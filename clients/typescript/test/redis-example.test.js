// examples/redis-lock.mjs run for real: a Redis server of the test's own, two holders, the first
// paused (working) past its Redis lock.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { Client } from 'fencegate';
import { fencegateUrl, uniq, sleep, freePort, requireProgram, PKG_DIR } from './helpers.js';

let redis;
let redisUrl;

before(async () => {
  const bin = requireProgram('redis-server', 'Debian/Ubuntu: apt-get install redis-server');
  const port = await freePort();
  redis = spawn(bin, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  redisUrl = `redis://127.0.0.1:${port}`;
  const { createConnection } = await import('node:net');
  for (let i = 0; ; i++) {
    const up = await new Promise((r) => {
      const s = createConnection(port, '127.0.0.1', () => {
        s.destroy();
        r(true);
      });
      s.on('error', () => r(false));
    });
    if (up) break;
    if (i > 100) throw new Error('redis-server did not start');
    await sleep(50);
  }
});

after(() => {
  redis?.kill('SIGTERM');
});

/**
 * Runs the example; resolves with its exit. `.holding` resolves once it printed its token (it
 * holds the Redis lock from then on), or when it exits: a test waits on that, not on a guess of
 * how long a node process takes to start on a loaded machine.
 */
function run(args) {
  let held;
  const holding = new Promise((r) => (held = r));
  const exited = new Promise((resolve) => {
    const child = spawn(process.execPath, [join(PKG_DIR, 'examples', 'redis-lock.mjs'), ...args], {
      cwd: PKG_DIR,
      env: { ...process.env, FENCEGATE_URL: fencegateUrl(), REDIS_URL: redisUrl },
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => {
      stdout += d;
      if (/token=\d+/.test(stdout)) held();
    });
    child.stderr.on('data', (d) => (stderr += d));
    child.on('exit', (code) => {
      held();
      resolve({ code, stdout, stderr });
    });
  });
  return Object.assign(exited, { holding });
}

test('redis-lock example: the holder whose Redis lock expired mid-work is refused; the new holder is not', async () => {
  const lock = uniq('redis');
  const key = uniq('redis-key');
  // A takes the lock for 400 ms and works for 4000 ms: its lock expires while it works.
  const a = run([lock, 'worker-a', '400', key, '{"by":"a"}', '4000']);
  await a.holding;
  await sleep(700); // A's 400 ms Redis lock has expired: Redis counts it, not us

  // B takes the expired lock, gets a larger token, claims the scope and writes.
  const b = await run([lock, 'worker-b', '5000', key, '{"by":"b"}', '0']);
  assert.equal(b.code, 0, b.stderr);
  const ra = await a;
  assert.equal(ra.code, 3, `A should be refused as stale: ${ra.stdout} ${ra.stderr}`);
  assert.match(ra.stdout, /result=stale/);
  const tokenA = /token=(\d+)/.exec(ra.stdout)[1];
  const tokenB = /token=(\d+)/.exec(b.stdout)[1];
  assert.ok(BigInt(tokenB) > BigInt(tokenA));
  const got = await new Client({ url: fencegateUrl() }).get(key);
  assert.deepEqual(got.value, { by: 'b' });
  assert.equal(got.scope, lock);
  assert.equal(got.fence_token, tokenB);
});

test('redis-lock example: a lock held by another exits 2 and writes nothing', async () => {
  const lock = uniq('redis-held');
  const key = uniq('redis-held-key');
  const first = run([lock, 'first', '5000', key, '1', '800']);
  await first.holding;
  const second = await run([lock, 'second', '5000', key, '2', '0']);
  assert.equal(second.code, 2, second.stderr);
  assert.match(second.stderr, /held by first/);
  assert.equal((await first).code, 0);
  assert.equal((await new Client({ url: fencegateUrl() }).get(key)).value, 1);
});
