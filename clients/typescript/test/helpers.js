// Shared by the tests: the server under test, servers of their own, unique names.
import { spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import net from 'node:net';

export const PKG_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_DIR = resolve(PKG_DIR, '..', '..');

/** The fencegate every test talks to (required). */
export function fencegateUrl() {
  const url = process.env.FENCEGATE_URL;
  if (!url) {
    throw new Error(
      'FENCEGATE_URL is not set: start a server (DATABASE_URL=postgres://... fencegate serve --listen 127.0.0.1:0) and run FENCEGATE_URL=http://ADDR bash clients/typescript/test.sh',
    );
  }
  return url.replace(/\/+$/, '');
}

const RUN = `ts${Date.now().toString(36)}${randomBytes(3).toString('hex')}`;
let counter = 0;
/** A name no other run or test uses. */
export function uniq(what = 'n') {
  counter += 1;
  return `${RUN}-${what}-${counter}`;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The fencegate binary for servers of a test's own (FENCEGATE_BIN, else the repository's build). */
export function fencegateBin() {
  const candidates = [process.env.FENCEGATE_BIN, join(REPO_DIR, 'target', 'release', 'fencegate'), join(REPO_DIR, 'target', 'debug', 'fencegate')];
  for (const c of candidates) if (c && existsSync(c)) return c;
  throw new Error(
    'this test starts fencegate servers of its own: set FENCEGATE_BIN to the fencegate binary (cargo build --release; target/release/fencegate)',
  );
}

export function databaseUrl() {
  const u = process.env.DATABASE_URL;
  if (!u) throw new Error('this test starts fencegate servers of its own: set DATABASE_URL to a PostgreSQL database (postgres://user@host:port/db)');
  return u;
}

/**
 * Starts `fencegate serve` with a config file; resolves to {url, stop()} once it listens.
 * `env` adds environment variables (e.g. an issuer's secret).
 */
export async function startServer({ config = '', env = {}, dbUrl } = {}) {
  const bin = fencegateBin();
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-ts-'));
  const cfg = join(dir, 'config.toml');
  writeFileSync(cfg, config);
  const child = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--config', cfg, '--database-url', dbUrl ?? databaseUrl()], {
    env: { ...process.env, ...env, FENCEGATE_LOG: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d) => {
    stderr += d;
  });
  const url = await new Promise((resolveUrl, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`fencegate did not start within 30 s:\n${stderr}`)), 30_000);
    child.stdout.on('data', (d) => {
      out += d;
      const m = /listening on (\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolveUrl(`http://${m[1]}`);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`fencegate exited (${code}) before listening:\n${stderr}`));
    });
  });
  return {
    url,
    stderr: () => stderr,
    async stop() {
      if (child.exitCode !== null) return;
      const done = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await done;
      clearTimeout(t);
    },
  };
}

/** A fresh API key and the [[auth.keys]] block for it. */
export function apiKey(name, rights, prefixes = ['']) {
  const key = randomBytes(24).toString('base64url');
  const sha256 = createHash('sha256').update(key).digest('hex');
  const block = `[[auth.keys]]\nname = ${JSON.stringify(name)}\nsha256 = "${sha256}"\nrights = ${JSON.stringify(rights)}\nprefixes = ${JSON.stringify(prefixes)}\n`;
  return { key, block };
}

/** A free TCP port on 127.0.0.1. */
export function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.unref();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

/**
 * A TCP proxy in front of PostgreSQL that can be frozen: every byte stops flowing both ways, as
 * when the database hangs. Resolves to {port, freeze(), close()}.
 */
export async function freezableProxy(targetHost, targetPort) {
  const pairs = new Set();
  let frozen = false;
  const server = net.createServer((client) => {
    if (frozen) {
      client.pause();
      pairs.add([client, null]);
      return;
    }
    const upstream = net.connect(targetPort, targetHost);
    const pair = [client, upstream];
    pairs.add(pair);
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
      pairs.delete(pair);
    };
    client.on('error', end);
    upstream.on('error', end);
    client.on('close', end);
    upstream.on('close', end);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: server.address().port,
    freeze() {
      frozen = true;
      for (const [a, b] of pairs) {
        a.unpipe?.();
        b?.unpipe?.();
        a.pause();
        b?.pause();
      }
    },
    close() {
      for (const [a, b] of pairs) {
        a.destroy();
        b?.destroy();
      }
      return new Promise((r) => server.close(() => r()));
    },
  };
}

/** Fails with what to install when a program is missing. */
export function requireProgram(name, install) {
  const r = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${name} is not installed; this test needs it (${install})`);
  return r.stdout.trim();
}
