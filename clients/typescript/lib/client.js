// The client: one method per endpoint. Types come from ../index.d.ts (the declarations users
// compile against); `tsc` (checkJs, test.sh) holds this file to them. Options that index.d.ts
// requires are typed Partial here where the library checks them at run time for JS callers.
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { problemError, FencegateError, LockHeldError, UnavailableError } from './errors.js';
import { toToken, encodeName, encodeRowKey } from './tokens.js';
import { Lease } from './lease.js';

/** @typedef {import('../index.js').TokenInput} TokenInput */
/** @typedef {import('../index.js').JsonValue} JsonValue */
/** @typedef {import('../index.js').ClientOptions} ClientOptions */
/** @typedef {import('../index.js').RequestOptions} RequestOptions */
/** @typedef {import('../index.js').RawRequestOptions} RawRequestOptions */
/** @typedef {import('../index.js').FencingOptions} FencingOptions */
/** @typedef {import('../index.js').IdempotencyOptions} IdempotencyOptions */
/** @typedef {import('../index.js').ClaimOptions} ClaimOptions */
/** @typedef {import('../index.js').AcquireOptions} AcquireOptions */
/** @typedef {import('../index.js').LeaseOptions} LeaseOptions */
/** @typedef {import('../index.js').RenewOptions} RenewOptions */
/** @typedef {import('../index.js').ReleaseOptions} ReleaseOptions */
/** @typedef {import('../index.js').ResetOptions} ResetOptions */
/** @typedef {import('../index.js').BatchOp} BatchOp */
/** @typedef {import('../index.js').RowKey} RowKey */
/** @typedef {import('../index.js').KvWriteResult} KvWriteResult */
/** @typedef {import('../index.js').KvDeleteResult} KvDeleteResult */
/** @typedef {import('../index.js').BatchResult} BatchResult */
/** @typedef {import('../index.js').FenceInfo} FenceInfo */
/** @typedef {import('../index.js').LockGrant} LockGrant */
/** @typedef {import('../index.js').LockRelease} LockRelease */
/** @typedef {import('../index.js').LockHolder} LockHolder */
/** @typedef {import('../index.js').TableWriteResult} TableWriteResult */
/** @typedef {import('../index.js').AdminResult} AdminResult */
/** @typedef {import('../index.js').RebindResult} RebindResult */
/** @typedef {import('../index.js').AuditEntry} AuditEntry */
/**
 * @template V
 * @typedef {import('../index.js').KvEntry<V>} KvEntry
 */
/**
 * @template R
 * @typedef {import('../index.js').TableRow<R>} TableRow
 */

const DEFAULT_TIMEOUT_MS = 30_000;
// A keyed write is sent again at most this many times (after a lost answer, or a 503 whose
// Retry-After asks for it), all within the request's timeout.
const DEFAULT_RETRIES = 2;

/**
 * @param {string | null} value a Retry-After header
 * @returns {number | null} seconds
 */
function parseRetryAfter(value) {
  if (value == null) return null;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v);
  const t = Date.parse(v);
  return Number.isNaN(t) ? null : Math.max(0, Math.ceil((t - Date.now()) / 1000));
}

/**
 * @param {number} ms
 * @param {AbortSignal} [signal]
 * @returns {Promise<void>}
 */
function sleep(ms, signal) {
  return new Promise(/** @type {(resolve: () => void, reject: (e: unknown) => void) => void} */ (resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * @param {Partial<FencingOptions>} options
 * @returns {Record<string, string>}
 */
function fencingHeaders({ token, scope, proof } = {}) {
  /** @type {Record<string, string>} */
  const h = { 'X-Fencing-Token': toToken(token) };
  if (scope !== undefined && scope !== null) h['X-Fencing-Scope'] = encodeName(scope, 'scope');
  if (proof !== undefined && proof !== null) {
    if (typeof proof !== 'string' || proof.length === 0) throw new TypeError('proof must be a non-empty string');
    h['X-Fencing-Proof'] = proof;
  }
  return h;
}

/**
 * A write's Idempotency-Key: the caller's `idempotencyKey`, else a random UUIDv4 (122 random bits
 * from node:crypto's CSPRNG). Sent with the write and, unchanged, with each of its retries.
 *
 * @param {IdempotencyOptions} options
 * @returns {string}
 */
function idempotencyKey(options) {
  const k = options.idempotencyKey;
  if (k === undefined || k === null) return randomUUID();
  if (typeof k !== 'string' || !/^[\x21-\x7e]{1,255}$/.test(k)) {
    throw new TypeError('idempotencyKey must be 1..=255 characters of visible ASCII (a UUID, say)');
  }
  return k;
}

/**
 * @param {Partial<FencingOptions>} options
 * @returns {Record<string, string>}
 */
function writeHeaders(options) {
  return { ...fencingHeaders(options), 'Idempotency-Key': idempotencyKey(options) };
}

/**
 * Milliseconds to wait before sending a keyed write again, or null when it must not be: only a
 * lost answer (fetch failed: the write may have landed) and a 503 with Retry-After are retried,
 * and only while the request's own timeout leaves room. The key makes the retry safe: a write
 * that landed is answered with its first outcome.
 *
 * @param {unknown} err what the attempt threw
 * @param {number} attempt 0 for the first send
 * @param {number} retries
 * @param {number} deadline performance.now() when the request times out
 * @param {AbortSignal} signal
 * @returns {number | null}
 */
function retryPause(err, attempt, retries, deadline, signal) {
  if (attempt >= retries || signal.aborted) return null;
  let pause;
  if (err instanceof UnavailableError) {
    if (err.retryAfter === null || err.retryAfter === undefined) return null;
    pause = err.retryAfter * 1000;
  } else if (err instanceof Error && err.name === 'TypeError') {
    pause = 100 * 2 ** attempt * (0.8 + 0.4 * Math.random());
  } else {
    return null;
  }
  return performance.now() + pause < deadline ? pause : null;
}

/**
 * @param {unknown} ttlMs
 * @returns {number}
 */
function checkTtl(ttlMs) {
  if (typeof ttlMs !== 'number' || !Number.isSafeInteger(ttlMs) || ttlMs < 1) throw new TypeError(`ttlMs must be a positive integer of milliseconds, got ${ttlMs}`);
  return ttlMs;
}

/** A client of one fencegate server. Every method returns the server's JSON body (snake_case, tokens as strings). */
export class Client {
  /** @type {string} */
  #base;
  /** @type {string | null} */
  #apiKey;
  /** @type {typeof globalThis.fetch} */
  #fetch;
  /** @type {number} */
  #timeoutMs;
  /** @type {Record<string, string>} */
  #headers;
  /** @type {number} */
  #retries;

  /** @param {Partial<ClientOptions> | string} [options] */
  constructor(options = {}) {
    if (typeof options === 'string') options = { url: options };
    const { url, apiKey, fetch: fetchImpl, timeoutMs, headers, retries } = options;
    if (typeof url !== 'string' && !(url instanceof URL)) throw new TypeError('url is required (e.g. "http://127.0.0.1:8080")');
    const u = new URL(String(url));
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new TypeError(`url must be http: or https:, got ${u.protocol}`);
    this.#base = u.href.replace(/\/+$/, '');
    if (apiKey !== undefined && apiKey !== null && (typeof apiKey !== 'string' || apiKey.length === 0)) {
      throw new TypeError('apiKey must be a non-empty string');
    }
    this.#apiKey = apiKey ?? null;
    this.#fetch = fetchImpl ?? globalThis.fetch;
    if (typeof this.#fetch !== 'function') throw new TypeError('no fetch: Node 20+ has a global fetch, or pass options.fetch');
    this.#timeoutMs = timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!(this.#timeoutMs > 0)) throw new TypeError('timeoutMs must be positive');
    this.#headers = { ...(headers ?? {}) };
    this.#retries = retries ?? DEFAULT_RETRIES;
    if (!Number.isSafeInteger(this.#retries) || this.#retries < 0) throw new TypeError('retries must be a non-negative integer');
  }

  /**
   * The server's base URL, without a trailing slash.
   *
   * @returns {string}
   */
  get url() {
    return this.#base;
  }

  /**
   * Sends one request and returns its parsed JSON body (or text); a 4xx/5xx throws the
   * FencegateError subclass of its problem type. The escape hatch for anything not wrapped.
   *
   * @template [T=unknown]
   * @param {string} method
   * @param {string} path
   * @param {RawRequestOptions} [options]
   * @returns {Promise<T>}
   */
  async request(method, path, { headers, body, signal, timeoutMs } = {}) {
    if (typeof path !== 'string' || !path.startsWith('/')) throw new TypeError('path must start with "/"');
    /** @type {Record<string, string>} */
    const h = { Accept: 'application/json, application/problem+json', ...this.#headers, ...(headers ?? {}) };
    if (this.#apiKey) h.Authorization = `Bearer ${this.#apiKey}`;
    let payload;
    if (body !== undefined) {
      h['Content-Type'] = 'application/json';
      payload = JSON.stringify(body);
      if (payload === undefined) throw new TypeError('body is not JSON-serializable');
    }
    const ms = timeoutMs ?? this.#timeoutMs;
    const deadline = performance.now() + ms;
    const timeout = AbortSignal.timeout(ms);
    const sig = signal ? AbortSignal.any([signal, timeout]) : timeout;
    // A write with an Idempotency-Key is retried with that same key; anything else is sent once.
    const keyed = Object.keys(h).some((k) => k.toLowerCase() === 'idempotency-key');
    for (let attempt = 0; ; attempt += 1) {
      try {
        return /** @type {T} */ (await this.#once(method, path, h, payload, sig));
      } catch (e) {
        const pause = keyed ? retryPause(e, attempt, this.#retries, deadline, sig) : null;
        if (pause === null) throw e;
        await sleep(pause, sig);
      }
    }
  }

  /**
   * One send: the parsed body, or the problem's error.
   *
   * @param {string} method
   * @param {string} path
   * @param {Record<string, string>} h
   * @param {string | undefined} payload
   * @param {AbortSignal} sig
   * @returns {Promise<unknown>}
   */
  async #once(method, path, h, payload, sig) {
    const res = await this.#send(this.#base + path, { method, headers: h, body: payload, signal: sig });
    const text = await res.text();
    const ctype = res.headers.get('content-type') ?? '';
    let parsed = null;
    if (text.length > 0) {
      if (/json/i.test(ctype)) {
        try {
          parsed = JSON.parse(text);
        } catch {
          parsed = null;
        }
      } else {
        parsed = text;
      }
    }
    if (res.ok) return parsed;
    throw problemError(res.status, typeof parsed === 'object' ? parsed : null, {
      requestId: res.headers.get('x-request-id'),
      retryAfter: parseRetryAfter(res.headers.get('retry-after')),
    });
  }

  /**
   * fetch without following redirects on its own: a redirect carries the fencing headers, the
   * credential and the body wherever it points. Only a 307 or 308 to the same origin (scheme,
   * host and port) is followed, at most 5 times; any other redirect throws, sending nothing on.
   *
   * @param {string} url
   * @param {RequestInit & { method: string }} init
   * @returns {Promise<Response>}
   */
  async #send(url, init) {
    let target = url;
    for (let hops = 0; ; hops += 1) {
      const res = await this.#fetch(target, { ...init, redirect: 'manual' });
      if (res.type === 'opaqueredirect') {
        throw new Error(`fencegate at ${this.#base} answered a redirect; the client does not follow redirects`);
      }
      if (res.status < 300 || res.status > 399 || res.status === 304) return res;
      const location = res.headers.get('location');
      if (location === null) return res;
      const next = new URL(location, target);
      const sameOrigin = next.origin === new URL(target).origin;
      await res.body?.cancel();
      if (!sameOrigin || (res.status !== 307 && res.status !== 308) || hops >= 5) {
        throw new Error(
          `${init.method} ${target} was answered ${res.status} with a redirect to ${next.origin === new URL(target).origin ? next.href : next.origin}: ` +
            'not followed (a redirect to another origin would carry the credential, the fencing token, the scope and the body)',
        );
      }
      target = next.href;
    }
  }

  /**
   * The answer, or null for a 404 not-found.
   *
   * @template T
   * @param {Promise<T>} promise
   * @returns {Promise<T | null>}
   */
  async #orNull(promise) {
    try {
      return await promise;
    } catch (e) {
      if (e instanceof FencegateError && e.status === 404 && e.slug === 'not-found') return null;
      throw e;
    }
  }

  // ---- kv ----

  /**
   * GET /v1/kv/{key}: `{key, value, fence_token, scope, version, updated_at}`, or null when absent or deleted.
   *
   * @template [V=JsonValue]
   * @param {string} key
   * @param {RequestOptions} [options]
   * @returns {Promise<KvEntry<V> | null>}
   */
  get(key, options = {}) {
    return this.#orNull(this.request('GET', `/v1/kv/${encodeName(key, 'key')}`, { signal: options.signal }));
  }

  /**
   * PUT /v1/kv/{key} with the fencing headers: `{key, fence_token, scope, version}`.
   *
   * @param {string} key
   * @param {unknown} value
   * @param {Partial<FencingOptions>} [options]
   * @returns {Promise<KvWriteResult>}
   */
  put(key, value, options = {}) {
    if (value === undefined) throw new TypeError('value must be a JSON value (undefined is not)');
    return this.request('PUT', `/v1/kv/${encodeName(key, 'key')}`, {
      headers: writeHeaders(options),
      body: value,
      signal: options.signal,
    });
  }

  /**
   * DELETE /v1/kv/{key} (a tombstone keeps the fence): `{key, fence_token, scope, deleted: true}`.
   *
   * @param {string} key
   * @param {Partial<FencingOptions>} [options]
   * @returns {Promise<KvDeleteResult>}
   */
  delete(key, options = {}) {
    return this.request('DELETE', `/v1/kv/${encodeName(key, 'key')}`, { headers: writeHeaders(options), signal: options.signal });
  }

  /**
   * POST /v1/batch: all ops under one token (and scope), all or nothing.
   *
   * @param {BatchOp[]} ops
   * @param {Partial<FencingOptions>} [options]
   * @returns {Promise<BatchResult>}
   */
  batch(ops, options = {}) {
    if (!Array.isArray(ops) || ops.length === 0) throw new TypeError('ops must be a non-empty array');
    return this.request('POST', '/v1/batch', { headers: writeHeaders(options), body: { ops }, signal: options.signal });
  }

  // ---- fences ----

  /**
   * POST /v1/fences/{scope}: raise the scope's fence to the token without writing data.
   *
   * @param {string} scope
   * @param {Partial<ClaimOptions> & { scope?: unknown }} [options] (a scope is ignored: the path names it)
   * @returns {Promise<FenceInfo>}
   */
  claim(scope, options = {}) {
    const { scope: _ignored, ...rest } = options;
    return this.request('POST', `/v1/fences/${encodeName(scope, 'scope')}`, { headers: writeHeaders(rest), signal: options.signal });
  }

  /**
   * GET /v1/fences/{scope}: `{scope, fence_token}`, or null when the scope has no fence.
   *
   * @param {string} scope
   * @param {RequestOptions} [options]
   * @returns {Promise<FenceInfo | null>}
   */
  fence(scope, options = {}) {
    return this.#orNull(this.request('GET', `/v1/fences/${encodeName(scope, 'scope')}`, { signal: options.signal }));
  }

  // ---- built-in locks ----

  /**
   * POST /v1/locks/{name}: a grant `{name, token, owner, expires_at, ttl_ms, scope}`. With
   * `waitMs`, retries while the lock is held (LockHeldError once `waitMs` has passed).
   *
   * @param {string} name
   * @param {Partial<AcquireOptions>} [options]
   * @returns {Promise<LockGrant>}
   */
  async acquire(name, options = {}) {
    const ttlMs = checkTtl(options.ttlMs);
    const owner = options.owner ?? defaultOwner();
    const waitMs = options.waitMs ?? 0;
    const deadline = performance.now() + waitMs;
    const path = `/v1/locks/${encodeName(name, 'lock name')}`;
    for (;;) {
      try {
        return await this.request('POST', path, { body: { owner, ttl_ms: ttlMs }, signal: options.signal });
      } catch (e) {
        if (!(e instanceof LockHeldError)) throw e;
        const left = deadline - performance.now();
        if (left <= 0) throw e;
        const hint = e.remainingMs ?? 100;
        await sleep(Math.max(10, Math.min(left, hint + 5, 1000)), options.signal);
      }
    }
  }

  /**
   * POST /v1/locks/{name}/renew: the renewed grant; LockLostError when no longer the holder.
   *
   * @param {string} name
   * @param {Partial<RenewOptions>} [options]
   * @returns {Promise<LockGrant>}
   */
  renew(name, options = {}) {
    return this.request('POST', `/v1/locks/${encodeName(name, 'lock name')}/renew`, {
      headers: { 'X-Fencing-Token': toToken(options.token) },
      body: { ttl_ms: checkTtl(options.ttlMs) },
      signal: options.signal,
      timeoutMs: options.timeoutMs,
    });
  }

  /**
   * DELETE /v1/locks/{name}: `{name, token, released: true}`; LockLostError when not the holder.
   *
   * @param {string} name
   * @param {Partial<ReleaseOptions>} [options]
   * @returns {Promise<LockRelease>}
   */
  release(name, options = {}) {
    return this.request('DELETE', `/v1/locks/${encodeName(name, 'lock name')}`, {
      headers: { 'X-Fencing-Token': toToken(options.token) },
      signal: options.signal,
      timeoutMs: options.timeoutMs,
    });
  }

  /**
   * GET /v1/locks/{name}: `{name, owner, remaining_ms}` while held, null when free.
   *
   * @param {string} name
   * @param {RequestOptions} [options]
   * @returns {Promise<LockHolder | null>}
   */
  holder(name, options = {}) {
    return this.#orNull(this.request('GET', `/v1/locks/${encodeName(name, 'lock name')}`, { signal: options.signal }));
  }

  /**
   * Takes the built-in lock `name` and keeps it: renewed every ttl/3, `lease.signal` aborted
   * when it is lost. Release it with `await lease.release()` or `await using`.
   *
   * @param {string} name
   * @param {Partial<LeaseOptions>} [options]
   * @returns {Promise<Lease>}
   */
  async lease(name, options = {}) {
    const ttlMs = checkTtl(options.ttlMs);
    const owner = options.owner ?? defaultOwner();
    const waitMs = options.waitMs ?? 0;
    const deadline = performance.now() + waitMs;
    for (;;) {
      const sentAt = performance.now();
      try {
        /** @type {LockGrant} */
        const grant = await this.request('POST', `/v1/locks/${encodeName(name, 'lock name')}`, {
          body: { owner, ttl_ms: ttlMs },
          signal: options.signal,
        });
        return new Lease(this, name, grant, { ttlMs, sentAt });
      } catch (e) {
        if (!(e instanceof LockHeldError)) throw e;
        const left = deadline - performance.now();
        if (left <= 0) throw e;
        await sleep(Math.max(10, Math.min(left, (e.remainingMs ?? 100) + 5, 1000)), options.signal);
      }
    }
  }

  // ---- legacy tables ----

  /**
   * GET /v1/tables/{resource}/{key}: `{resource, key, row, fence_token, scope}`, or null when the row is absent.
   *
   * @template [R=Record<string, JsonValue>]
   * @param {string} resource
   * @param {RowKey} key
   * @param {RequestOptions} [options]
   * @returns {Promise<TableRow<R> | null>}
   */
  tableGet(resource, key, options = {}) {
    return this.#orNull(this.request('GET', tablePath(resource, key), { signal: options.signal }));
  }

  /**
   * PUT /v1/tables/{resource}/{key}: replace the row.
   *
   * @param {string} resource
   * @param {RowKey} key
   * @param {Record<string, unknown>} row
   * @param {Partial<FencingOptions>} [options]
   * @returns {Promise<TableWriteResult>}
   */
  tablePut(resource, key, row, options = {}) {
    return this.request('PUT', tablePath(resource, key), { headers: writeHeaders(options), body: row, signal: options.signal });
  }

  /**
   * PATCH /v1/tables/{resource}/{key}: update some columns of an existing row.
   *
   * @param {string} resource
   * @param {RowKey} key
   * @param {Record<string, unknown>} row
   * @param {Partial<FencingOptions>} [options]
   * @returns {Promise<TableWriteResult>}
   */
  tablePatch(resource, key, row, options = {}) {
    return this.request('PATCH', tablePath(resource, key), { headers: writeHeaders(options), body: row, signal: options.signal });
  }

  /**
   * DELETE /v1/tables/{resource}/{key}.
   *
   * @param {string} resource
   * @param {RowKey} key
   * @param {Partial<FencingOptions>} [options]
   * @returns {Promise<TableWriteResult>}
   */
  tableDelete(resource, key, options = {}) {
    return this.request('DELETE', tablePath(resource, key), { headers: writeHeaders(options), signal: options.signal });
  }

  // ---- admin (the admin right) ----

  /**
   * Admin calls: resets, retires, rebinds, the audit log.
   *
   * @returns {Admin}
   */
  get admin() {
    return new Admin(this);
  }

  // ---- probes ----

  /**
   * GET /healthz.
   *
   * @param {RequestOptions} [options]
   * @returns {Promise<{ status: string }>}
   */
  health(options = {}) {
    return this.request('GET', '/healthz', { signal: options.signal });
  }

  /**
   * GET /readyz (UnavailableError when not ready).
   *
   * @param {RequestOptions} [options]
   * @returns {Promise<{ status: string }>}
   */
  ready(options = {}) {
    return this.request('GET', '/readyz', { signal: options.signal });
  }
}

/**
 * @param {string} resource
 * @param {RowKey} key
 * @returns {string}
 */
function tablePath(resource, key) {
  return `/v1/tables/${encodeName(resource, 'resource')}/${encodeRowKey(key)}`;
}

/**
 * @param {unknown} r
 * @returns {string}
 */
function reason(r) {
  if (typeof r !== 'string' || r.length === 0) throw new TypeError('reason is required (1..=1000 bytes, no control characters)');
  return r;
}

/**
 * @param {Partial<ResetOptions>} options
 * @returns {{ reason: string, to?: string, scope?: string | null }}
 */
function resetBody(options) {
  /** @type {{ reason: string, to?: string, scope?: string | null }} */
  const body = { reason: reason(options.reason) };
  if (options.to !== undefined) body.to = toToken(options.to, 'to');
  if (options.scope !== undefined) body.scope = options.scope;
  return body;
}

/** Admin endpoints, `client.admin`. Every call is audited by the server. */
export class Admin {
  /** @type {Client} */
  #c;
  /** @param {Client} client */
  constructor(client) {
    this.#c = client;
  }

  /**
   * POST /v1/admin/fences/{scope}/reset `{to, reason}`.
   *
   * @param {string} scope
   * @param {Partial<{ to: TokenInput, reason: string, scope: unknown }>} options (a scope is ignored: the path names it)
   * @returns {Promise<AdminResult>}
   */
  resetFence(scope, options) {
    const { scope: _s, ...rest } = options ?? {};
    return this.#c.request('POST', `/v1/admin/fences/${encodeName(scope, 'scope')}/reset`, { body: resetBody(rest) });
  }

  /**
   * POST /v1/admin/kv/{key}/reset `{to?, scope?, reason}` (`scope: null` unbinds).
   *
   * @param {string} key
   * @param {Partial<ResetOptions>} options
   * @returns {Promise<AdminResult>}
   */
  resetKey(key, options) {
    return this.#c.request('POST', `/v1/admin/kv/${encodeName(key, 'key')}/reset`, { body: resetBody(options ?? {}) });
  }

  /**
   * POST /v1/admin/tables/{resource}/{key}/reset `{to?, scope?, reason}`.
   *
   * @param {string} resource
   * @param {RowKey} key
   * @param {Partial<ResetOptions>} options
   * @returns {Promise<AdminResult>}
   */
  resetRow(resource, key, options) {
    return this.#c.request('POST', `${tablePath(resource, key).replace('/v1/tables/', '/v1/admin/tables/')}/reset`, {
      body: resetBody(options ?? {}),
    });
  }

  /**
   * POST /v1/admin/locks/{name}/retire `{reason}`.
   *
   * @param {string} name
   * @param {Partial<{ reason: string }>} options
   * @returns {Promise<AdminResult>}
   */
  retireLock(name, options) {
    return this.#c.request('POST', `/v1/admin/locks/${encodeName(name, 'lock name')}/retire`, {
      body: { reason: reason(options?.reason) },
    });
  }

  /**
   * POST /v1/admin/kv/rebind `{prefix, scope, reason}`.
   *
   * @param {Partial<{ prefix: string, scope: string | null, reason: string }>} options
   * @returns {Promise<RebindResult>}
   */
  rebindKeys(options) {
    const { prefix, scope, reason: r } = options ?? {};
    if (typeof prefix !== 'string') throw new TypeError('prefix must be a string ("" for every key)');
    if (scope !== null && typeof scope !== 'string') throw new TypeError('scope must be a string or null');
    return this.#c.request('POST', '/v1/admin/kv/rebind', { body: { prefix, scope, reason: reason(r) } });
  }

  /**
   * POST /v1/admin/tables/{resource}/rebind `{scope, reason}`.
   *
   * @param {string} resource
   * @param {Partial<{ scope: string | null, reason: string }>} options
   * @returns {Promise<RebindResult>}
   */
  rebindTable(resource, options) {
    const { scope, reason: r } = options ?? {};
    if (scope !== null && typeof scope !== 'string') throw new TypeError('scope must be a string or null');
    return this.#c.request('POST', `/v1/admin/tables/${encodeName(resource, 'resource')}/rebind`, {
      body: { scope, reason: reason(r) },
    });
  }

  /**
   * GET /v1/admin/audit?limit=N: `{entries: [...]}`, newest first.
   *
   * @param {{ limit?: number }} [options]
   * @returns {Promise<{ entries: AuditEntry[] }>}
   */
  audit(options = {}) {
    const q = options.limit !== undefined ? `?limit=${Number(options.limit)}` : '';
    return this.#c.request('GET', `/v1/admin/audit${q}`);
  }
}

/** @returns {string} "<hostname>:<pid>" */
export function defaultOwner() {
  return `${hostname()}:${process.pid}`;
}

export { sleep as _sleep };
