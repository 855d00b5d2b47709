// The package as a user gets it: installed from the directory with no build step, its runtime
// exports matching index.d.ts, no runtime dependencies.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as fencegate from 'fencegate';
import { PKG_DIR } from './helpers.js';

const pkg = JSON.parse(readFileSync(join(PKG_DIR, 'package.json'), 'utf8'));

test('no runtime dependencies; ESM; types shipped', () => {
  assert.equal(pkg.name, 'fencegate');
  assert.equal(pkg.type, 'module');
  assert.deepEqual(pkg.dependencies ?? {}, {});
  assert.equal(pkg.exports['.'].types, './index.d.ts');
  assert.ok(pkg.files.includes('index.d.ts'));
});

test('the runtime exports and the declared ones are the same names', () => {
  const dts = readFileSync(join(PKG_DIR, 'index.d.ts'), 'utf8');
  const declared = new Set([...dts.matchAll(/^export declare (?:class|function|const) (\w+)/gm)].map((m) => m[1]));
  const runtime = new Set(Object.keys(fencegate));
  assert.deepEqual([...runtime].sort(), [...declared].sort());
});

test('npm install ./clients/typescript works with no build step', () => {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-ts-install-'));
  try {
    writeFileSync(join(dir, 'package.json'), '{"name":"consumer","private":true,"type":"module"}');
    const i = spawnSync('npm', ['install', '--no-audit', '--no-fund', '--ignore-scripts', '--offline', PKG_DIR], { cwd: dir, encoding: 'utf8' });
    assert.equal(i.status, 0, i.stderr);
    const r = spawnSync(
      process.execPath,
      ['--input-type=module', '-e', "import { Client, StaleTokenError, signHmac } from 'fencegate'; console.log(typeof Client, typeof StaleTokenError, signHmac('s', 'a', '1').length)"],
      { cwd: dir, encoding: 'utf8' },
    );
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), 'function function 43');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('proofs: base64url without padding over "fencegate-token-v1\\n{scope}\\n{token}"', async () => {
  const { createHmac } = await import('node:crypto');
  const expect = createHmac('sha256', 'k').update('fencegate-token-v1\nbilling\n42').digest('base64url');
  assert.equal(fencegate.signHmac('k', 'billing', 42), expect);
  assert.equal(fencegate.proofMessage('café', 7n).toString('utf8'), 'fencegate-token-v1\ncafé\n7');
  assert.throws(() => fencegate.signEd25519(new Uint8Array(31), 's', '1'), TypeError);
  assert.throws(() => fencegate.signHmac('k', 's', 2 ** 60), TypeError);
});
