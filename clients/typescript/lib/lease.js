import { LeaseLostError, LockLostError, StaleTokenError, TokenNotIssuedError } from './errors.js';

/** `Symbol.asyncDispose` (Node 20 defines it as Symbol.for('nodejs.asyncDispose'); so does this fallback). */
export const asyncDispose = Symbol.asyncDispose ?? Symbol.for('nodejs.asyncDispose');

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
  #client;
  #name;
  #grant;
  #token;
  #ttlMs;
  #margin;
  #deadline;
  #state = 'held';
  #ac = new AbortController();
  #renewTimer = null;
  #expiryTimer = null;
  #renewing = null;
  #lostError = null;

  /** @internal use client.lease() */
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

  /** The lock's name. */
  get name() {
    return this.#name;
  }
  /** The fencing token of this lease (a decimal string). */
  get token() {
    return this.#token;
  }
  /** The scope its writes are sent under: the lock's name. */
  get scope() {
    return this.#grant.scope ?? this.#name;
  }
  /** The owner string the lease was granted to. */
  get owner() {
    return this.#grant.owner;
  }
  /** The lease length asked for, in ms. */
  get ttlMs() {
    return this.#ttlMs;
  }
  /** The server's last grant or renew answer. */
  get grant() {
    return this.#grant;
  }
  /** Aborted when the lease ends: lost (reason: a LeaseLostError) or released (reason: an AbortError). */
  get signal() {
    return this.#ac.signal;
  }
  /** True once the lease is lost (not when it was released). */
  get lost() {
    this.#checkExpiry();
    return this.#state === 'lost';
  }
  /** True while the lease is held (neither lost nor released). */
  get held() {
    this.#checkExpiry();
    return this.#state === 'held';
  }
  /** Milliseconds left before this side counts the lease as expired (0 when not held). */
  get remainingMs() {
    if (!this.held) return 0;
    return Math.max(0, Math.floor(this.#deadline - performance.now()));
  }

  // ---- writes under the lease: token and scope sent for you ----

  /** PUT a key under the lease. */
  put(key, value, options = {}) {
    return this.#write(() => this.#client.put(key, value, this.#fencing(options)));
  }

  /** GET a key (a read sends no token and works whether or not the lease is held). */
  get(key, options = {}) {
    return this.#client.get(key, options);
  }

  /** DELETE a key under the lease. */
  delete(key, options = {}) {
    return this.#write(() => this.#client.delete(key, this.#fencing(options)));
  }

  /** A batch under the lease. */
  batch(ops, options = {}) {
    return this.#write(() => this.#client.batch(ops, this.#fencing(options)));
  }

  /** Claim the lease's scope (the grant already did; harmless to repeat). */
  claim(options = {}) {
    return this.#write(() => this.#client.claim(this.scope, { token: this.#token, signal: options.signal, idempotencyKey: options.idempotencyKey }));
  }

  /** Table writes under the lease. */
  tablePut(resource, key, row, options = {}) {
    return this.#write(() => this.#client.tablePut(resource, key, row, this.#fencing(options)));
  }
  tablePatch(resource, key, row, options = {}) {
    return this.#write(() => this.#client.tablePatch(resource, key, row, this.#fencing(options)));
  }
  tableDelete(resource, key, options = {}) {
    return this.#write(() => this.#client.tableDelete(resource, key, this.#fencing(options)));
  }

  /** Throws the LeaseLostError if the lease is no longer held. Use it between steps of long work. */
  throwIfLost() {
    this.#ensureHeld();
  }

  /**
   * Stops renewing and releases the lock. Idempotent; releasing a lease that was lost is not an
   * error (the lock is released if the server still thinks it is ours).
   */
  async release() {
    if (this.#state === 'released') return;
    const wasLost = this.#state === 'lost' || (this.#checkExpiry(), this.#state === 'lost');
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

  [asyncDispose]() {
    return this.release();
  }

  // ---- internals ----

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

  #scheduleRenew(delay) {
    if (this.#state !== 'held') return;
    if (this.#renewTimer) clearTimeout(this.#renewTimer);
    const t = setTimeout(() => {
      this.#renewTimer = null;
      this.#renewing = this.#renew();
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
      if (e instanceof LockLostError || e?.status === 403) {
        this.#lose(e, `a renew was refused (${e.slug || e.status})`);
        return;
      }
      // Unknown (network, 503, timeout): try again soon, until the deadline says lost.
      this.#checkExpiry();
      this.#scheduleRenew(Math.max(10, this.#ttlMs / 10));
    }
  }

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
