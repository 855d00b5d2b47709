// A lease: the built-in lock kept renewed. Types come from ../index.d.ts; `tsc` (checkJs,
// test.sh) holds this file to them.
import { FencegateError, LeaseLostError, LockLostError, StaleTokenError, TokenNotIssuedError } from './errors.js';

/** @typedef {import('../index.js').JsonValue} JsonValue */
/** @typedef {import('../index.js').RequestOptions} RequestOptions */
/** @typedef {import('../index.js').IdempotencyOptions} IdempotencyOptions */
/** @typedef {import('../index.js').LeaseWriteOptions} LeaseWriteOptions */
/** @typedef {import('../index.js').FencingOptions} FencingOptions */
/** @typedef {import('../index.js').LockGrant} LockGrant */
/** @typedef {import('../index.js').BatchOp} BatchOp */
/** @typedef {import('../index.js').RowKey} RowKey */
/** @typedef {import('../index.js').KvWriteResult} KvWriteResult */
/** @typedef {import('../index.js').KvDeleteResult} KvDeleteResult */
/** @typedef {import('../index.js').BatchResult} BatchResult */
/** @typedef {import('../index.js').FenceInfo} FenceInfo */
/** @typedef {import('../index.js').TableWriteResult} TableWriteResult */
/**
 * @template V
 * @typedef {import('../index.js').KvEntry<V>} KvEntry
 */
/**
 * A write's options as a JS caller may pass them: a token or scope given by habit is replaced by
 * the lease's own.
 * @typedef {LeaseWriteOptions & { token?: unknown, scope?: unknown }} WriteOptions
 */

/** `Symbol.asyncDispose` (Node 20 defines it as Symbol.for('nodejs.asyncDispose'); so does this fallback). */
/** @type {typeof Symbol.asyncDispose} */
export const asyncDispose = /** @type {typeof Symbol.asyncDispose} */ (Symbol.asyncDispose ?? Symbol.for('nodejs.asyncDispose'));

/**
 * A held built-in lock, renewed in the background every ttl/3 until it is released or lost.
 *
 * Lost means: a renew was answered 409 lock-lost; no renew succeeded before the lease's expiry
 * (counted on the monotonic clock from just before the request that granted or last renewed it
 * was sent, less a margin of max(ttl/10, 100 ms), at most ttl/3); or a write under it was refused
 * as stale (412) or as a token its lock no longer vouches for (422 token-not-issued: the lock
 * was retired). Then `signal` is aborted with a LeaseLostError and every write under the lease
 * rejects with LeaseLostError without being sent.
 */
export class Lease {
  /** @type {import('./client.js').Client} */
  #client;
  /** @type {string} */
  #name;
  /** @type {LockGrant} */
  #grant;
  /** @type {string} */
  #token;
  /** @type {number} */
  #ttlMs;
  /** @type {number} */
  #margin;
  /** @type {number} */
  #deadline = 0;
  /** @type {'held' | 'lost' | 'released'} */
  #state = 'held';
  #ac = new AbortController();
  /** @type {ReturnType<typeof setTimeout> | null} */
  #renewTimer = null;
  /** @type {ReturnType<typeof setTimeout> | null} */
  #expiryTimer = null;
  /** @type {LeaseLostError | null} */
  #lostError = null;

  /**
   * @internal use client.lease()
   * @param {import('./client.js').Client} client
   * @param {string} name
   * @param {LockGrant} grant
   * @param {{ ttlMs: number, sentAt: number }} timing sentAt: performance.now() just before the grant's request
   */
  constructor(client, name, grant, { ttlMs, sentAt }) {
    this.#client = client;
    this.#name = name;
    this.#grant = grant;
    this.#token = String(grant.token);
    this.#ttlMs = ttlMs;
    this.#margin = Math.min(Math.max(ttlMs / 10, 100), ttlMs / 3);
    this.#setDeadline(sentAt);
    this.#scheduleRenew(ttlMs / 3);
  }

  /**
   * The lock's name.
   *
   * @returns {string}
   */
  get name() {
    return this.#name;
  }
  /**
   * The fencing token of this lease (a decimal string).
   *
   * @returns {string}
   */
  get token() {
    return this.#token;
  }
  /**
   * The scope its writes are sent under: the lock's name.
   *
   * @returns {string}
   */
  get scope() {
    return this.#grant.scope ?? this.#name;
  }
  /**
   * The owner string the lease was granted to.
   *
   * @returns {string}
   */
  get owner() {
    return this.#grant.owner;
  }
  /**
   * The lease length asked for, in ms.
   *
   * @returns {number}
   */
  get ttlMs() {
    return this.#ttlMs;
  }
  /**
   * The server's last grant or renew answer.
   *
   * @returns {LockGrant}
   */
  get grant() {
    return this.#grant;
  }
  /**
   * Aborted when the lease ends: lost (reason: a LeaseLostError) or released (reason: an AbortError).
   *
   * @returns {AbortSignal}
   */
  get signal() {
    return this.#ac.signal;
  }
  /**
   * True once the lease is lost (not when it was released).
   *
   * @returns {boolean}
   */
  get lost() {
    this.#checkExpiry();
    return this.#state === 'lost';
  }
  /**
   * True while the lease is held (neither lost nor released).
   *
   * @returns {boolean}
   */
  get held() {
    this.#checkExpiry();
    return this.#state === 'held';
  }
  /**
   * Milliseconds left before this side counts the lease as expired (0 when not held).
   *
   * @returns {number}
   */
  get remainingMs() {
    if (!this.held) return 0;
    return Math.max(0, Math.floor(this.#deadline - performance.now()));
  }

  // ---- writes under the lease: token and scope sent for you ----

  /**
   * PUT a key under the lease.
   *
   * @param {string} key
   * @param {unknown} value
   * @param {WriteOptions} [options]
   * @returns {Promise<KvWriteResult>}
   */
  put(key, value, options = {}) {
    return this.#write(() => this.#client.put(key, value, this.#fencing(options)));
  }

  /**
   * GET a key (a read sends no token and works whether or not the lease is held).
   *
   * @template [V=JsonValue]
   * @param {string} key
   * @param {RequestOptions} [options]
   * @returns {Promise<KvEntry<V> | null>}
   */
  get(key, options = {}) {
    return this.#client.get(key, options);
  }

  /**
   * DELETE a key under the lease.
   *
   * @param {string} key
   * @param {WriteOptions} [options]
   * @returns {Promise<KvDeleteResult>}
   */
  delete(key, options = {}) {
    return this.#write(() => this.#client.delete(key, this.#fencing(options)));
  }

  /**
   * A batch under the lease.
   *
   * @param {BatchOp[]} ops
   * @param {WriteOptions} [options]
   * @returns {Promise<BatchResult>}
   */
  batch(ops, options = {}) {
    return this.#write(() => this.#client.batch(ops, this.#fencing(options)));
  }

  /**
   * Claim the lease's scope (the grant already did; harmless to repeat).
   *
   * @param {RequestOptions & IdempotencyOptions} [options]
   * @returns {Promise<FenceInfo>}
   */
  claim(options = {}) {
    return this.#write(() => this.#client.claim(this.scope, { token: this.#token, signal: options.signal, idempotencyKey: options.idempotencyKey }));
  }

  /**
   * PUT a legacy-table row under the lease.
   *
   * @param {string} resource
   * @param {RowKey} key
   * @param {Record<string, unknown>} row
   * @param {WriteOptions} [options]
   * @returns {Promise<TableWriteResult>}
   */
  tablePut(resource, key, row, options = {}) {
    return this.#write(() => this.#client.tablePut(resource, key, row, this.#fencing(options)));
  }
  /**
   * PATCH a legacy-table row under the lease.
   *
   * @param {string} resource
   * @param {RowKey} key
   * @param {Record<string, unknown>} row
   * @param {WriteOptions} [options]
   * @returns {Promise<TableWriteResult>}
   */
  tablePatch(resource, key, row, options = {}) {
    return this.#write(() => this.#client.tablePatch(resource, key, row, this.#fencing(options)));
  }
  /**
   * DELETE a legacy-table row under the lease.
   *
   * @param {string} resource
   * @param {RowKey} key
   * @param {WriteOptions} [options]
   * @returns {Promise<TableWriteResult>}
   */
  tableDelete(resource, key, options = {}) {
    return this.#write(() => this.#client.tableDelete(resource, key, this.#fencing(options)));
  }

  /**
   * Throws the LeaseLostError if the lease is no longer held. Use it between steps of long work.
   *
   * @returns {void}
   */
  throwIfLost() {
    this.#ensureHeld();
  }

  /**
   * Stops renewing and releases the lock. Idempotent; releasing a lease that was lost is not an
   * error (the lock is released if the server still thinks it is ours).
   *
   * @returns {Promise<void>}
   */
  async release() {
    if (this.#state === 'released') return;
    this.#checkExpiry();
    const wasLost = this.#state === 'lost';
    this.#clearTimers();
    if (!wasLost) {
      this.#state = 'released';
      this.#ac.abort(new DOMException(`lease on ${JSON.stringify(this.#name)} released`, 'AbortError'));
    }
    try {
      await this.#client.release(this.#name, { token: this.#token });
    } catch (e) {
      if (e instanceof LockLostError || wasLost) return;
      throw e;
    }
  }

  /** @returns {Promise<void>} */
  [asyncDispose]() {
    return this.release();
  }

  // ---- internals ----

  /**
   * @param {WriteOptions} options
   * @returns {FencingOptions}
   */
  #fencing(options) {
    const { token: _t, scope: _s, ...rest } = options;
    return { ...rest, token: this.#token, scope: this.scope };
  }

  #ensureHeld() {
    this.#checkExpiry();
    if (this.#state === 'held') return;
    if (this.#state === 'lost') throw this.#lostError;
    throw new LeaseLostError(`lease on ${JSON.stringify(this.#name)} was released`, { lock: this.#name, token: this.#token });
  }

  /**
   * @template T
   * @param {() => Promise<T>} fn
   * @returns {Promise<T>}
   */
  async #write(fn) {
    this.#ensureHeld();
    try {
      return await fn();
    } catch (e) {
      if (e instanceof StaleTokenError || (e instanceof TokenNotIssuedError && e.scope === this.scope)) {
        this.#lose(e, `a write under the lease was refused (${e.slug})`);
      }
      throw e;
    }
  }

  /** @param {number} sentAt */
  #setDeadline(sentAt) {
    this.#deadline = sentAt + this.#ttlMs - this.#margin;
    if (this.#expiryTimer) clearTimeout(this.#expiryTimer);
    const t = setTimeout(() => this.#checkExpiry(), Math.max(0, this.#deadline - performance.now()) + 1);
    t.unref?.();
    this.#expiryTimer = t;
  }

  #checkExpiry() {
    if (this.#state === 'held' && performance.now() >= this.#deadline) {
      this.#lose(null, 'its expiry passed without a successful renew');
    }
  }

  /** @param {number} delay ms */
  #scheduleRenew(delay) {
    if (this.#state !== 'held') return;
    if (this.#renewTimer) clearTimeout(this.#renewTimer);
    const t = setTimeout(() => {
      this.#renewTimer = null;
      void this.#renew();
    }, Math.max(1, delay));
    t.unref?.();
    this.#renewTimer = t;
  }

  async #renew() {
    this.#checkExpiry();
    if (this.#state !== 'held') return;
    const sentAt = performance.now();
    const left = this.#deadline - sentAt;
    try {
      const grant = await this.#client.renew(this.#name, {
        token: this.#token,
        ttlMs: this.#ttlMs,
        timeoutMs: Math.max(1, Math.floor(left)),
      });
      if (this.#state !== 'held') return;
      this.#grant = grant;
      this.#setDeadline(sentAt);
      this.#scheduleRenew(this.#ttlMs / 3);
    } catch (e) {
      if (this.#state !== 'held') return;
      if (e instanceof LockLostError || (e instanceof FencegateError && e.status === 403)) {
        this.#lose(e, `a renew was refused (${e.slug || e.status})`);
        return;
      }
      // Unknown (network, 503, timeout): try again soon, until the deadline says lost.
      this.#checkExpiry();
      this.#scheduleRenew(Math.max(10, this.#ttlMs / 10));
    }
  }

  /**
   * @param {unknown} cause
   * @param {string} why
   */
  #lose(cause, why) {
    if (this.#state !== 'held') return;
    this.#state = 'lost';
    this.#clearTimers();
    this.#lostError = new LeaseLostError(`lease on ${JSON.stringify(this.#name)} (token ${this.#token}) lost: ${why}`, {
      cause: cause ?? undefined,
      lock: this.#name,
      token: this.#token,
    });
    this.#ac.abort(this.#lostError);
  }

  #clearTimers() {
    if (this.#renewTimer) clearTimeout(this.#renewTimer);
    if (this.#expiryTimer) clearTimeout(this.#expiryTimer);
    this.#renewTimer = null;
    this.#expiryTimer = null;
  }
}
