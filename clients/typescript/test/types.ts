// Compiled by `tsc --noEmit` (npm run typecheck, test.sh): the declarations in index.d.ts as a
// TypeScript user meets them. Never run.
import {
  Client,
  Lease,
  FencegateError,
  StaleTokenError,
  LeaseLostError,
  LockHeldError,
  UnavailableError,
  signHmac,
  signEd25519,
  toToken,
  type KvEntry,
  type Token,
} from 'fencegate';
import { generateKeyPairSync } from 'node:crypto';

export async function usage(url: string): Promise<void> {
  const client = new Client({ url, apiKey: 'k', timeoutMs: 5_000 });
  const w = await client.put('invoice-7', { total: 120 }, { token: 9223372036854775807n, scope: 'billing' });
  const t: Token = w.fence_token;
  const e: KvEntry<{ total: number }> | null = await client.get<{ total: number }>('invoice-7');
  if (e) e.value.total.toFixed();
  await client.batch([{ op: 'put', key: 'a', value: 1 }, { op: 'delete', key: 'b' }], { token: '42' });
  await client.put('invoice-8', 1, { token: 9n, idempotencyKey: 'b3f1c2d4e5f60718293a4b5c6d7e8f90' });
  new Client({ url, retries: 0 });
  await client.claim('billing', { token: t, proof: signHmac('secret', 'billing', t) });
  const { privateKey } = generateKeyPairSync('ed25519');
  signEd25519(privateKey, 'jobs/1', 7);
  toToken(7n);

  {
    await using lease = await client.lease('nightly', { ttlMs: 10_000, owner: 'worker-1', waitMs: 1_000 });
    const l: Lease = lease;
    const tok: string = l.token;
    void tok;
    lease.signal.addEventListener('abort', () => {
      const why: unknown = lease.signal.reason;
      if (why instanceof LeaseLostError) why.lock?.toUpperCase();
    });
    try {
      await lease.put('invoice-7', { total: 121 });
    } catch (err) {
      if (err instanceof StaleTokenError) {
        const p: string | null = err.presented;
        const c: string | null = err.current;
        void p, c;
      } else if (err instanceof LeaseLostError) {
        // stop working
      } else if (err instanceof FencegateError) {
        err.status.toFixed();
      }
    }
    lease.throwIfLost();
  }

  try {
    await client.acquire('x', { ttlMs: 100 });
  } catch (err) {
    if (err instanceof LockHeldError) err.remainingMs?.toFixed();
    if (err instanceof UnavailableError) err.retryAfter?.toFixed();
  }
  const audit = await client.admin.audit({ limit: 5 });
  audit.entries[0]?.actor.toUpperCase();
  await client.admin.resetFence('billing', { to: '5', reason: 'why' });
  const row = await client.tableGet<{ total: number }>('orders', ['acme', 42]);
  row?.row.total.toFixed();
}
