// Type declarations of the `fencegate` package, hand-written and held to the implementation:
// `npm run typecheck` (test.sh, prepack) compiles test/types.ts against them, type-checks
// lib/*.js (checkJs, its JSDoc typed from this file) and test/declarations.js, which fails when
// lib/ lacks an export, method or property declared here or types one differently; the tests
// check the runtime exports are the declared names.

/// <reference types="node" />
import type { KeyObject } from 'node:crypto';

/** A fencing token as accepted: a canonical decimal string, a bigint, or a non-negative safe integer. */
export type TokenInput = string | bigint | number;
/** A fencing token as returned: always a canonical decimal string ("0".."9223372036854775807"). */
export type Token = string;

/** Any JSON value. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

export interface ClientOptions {
  /** The server's base URL, e.g. "http://127.0.0.1:8080". */
  url: string | URL;
  /** Sent as `Authorization: Bearer <apiKey>` (an API key or a JWT). */
  apiKey?: string;
  /** A fetch implementation (default: the global fetch). */
  fetch?: typeof globalThis.fetch;
  /** Per-request timeout in ms (default 30000). A timeout means "unknown": retry with the same token. */
  timeoutMs?: number;
  /** Extra headers sent on every request. */
  headers?: Record<string, string>;
  /**
   * How many times a write is sent again, with the same Idempotency-Key, after a lost answer
   * (fetch failed) or a 503 with Retry-After, within `timeoutMs` (default 2; 0: never).
   */
  retries?: number;
}

/** A write's Idempotency-Key (1..=255 visible ASCII characters); by default a fresh random UUID per call. */
export interface IdempotencyOptions {
  idempotencyKey?: string;
}

export interface RequestOptions {
  signal?: AbortSignal;
}

export interface FencingOptions extends RequestOptions, IdempotencyOptions {
  /** The fencing token (X-Fencing-Token). */
  token: TokenInput;
  /** The scope (X-Fencing-Scope), normally the lock's name; percent-encoded for you. */
  scope?: string | null;
  /** The issuer's proof (X-Fencing-Proof), from signHmac / signEd25519. */
  proof?: string | null;
}

export interface ClaimOptions extends RequestOptions, IdempotencyOptions {
  token: TokenInput;
  proof?: string | null;
}

export interface KvEntry<V = JsonValue> {
  key: string;
  value: V;
  fence_token: Token;
  scope: string | null;
  version: number;
  updated_at: string;
}

export interface KvWriteResult {
  key: string;
  fence_token: Token;
  scope: string | null;
  version: number;
}

export interface KvDeleteResult {
  key: string;
  fence_token: Token;
  scope: string | null;
  deleted: true;
}

export type BatchOp =
  | { op: 'put'; key: string; value: JsonValue }
  | { op: 'delete'; key: string }
  | { op: 'put' | 'patch'; resource: string; key: string; row: Record<string, JsonValue> }
  | { op: 'delete'; resource: string; key: string };

export interface BatchResult {
  fence_token: Token;
  scope: string | null;
  results: Array<{ op: string; key: string; resource?: string; status: number }>;
}

export interface FenceInfo {
  scope: string;
  fence_token: Token;
}

export interface LockGrant {
  name: string;
  token: Token;
  owner: string;
  expires_at: string;
  ttl_ms: number;
  scope: string;
}

export interface LockRelease {
  name: string;
  token: Token;
  released: true;
}

export interface LockHolder {
  name: string;
  owner: string;
  remaining_ms: number;
}

export interface AcquireOptions extends RequestOptions {
  /** Lease length in ms (1..=locks.max_ttl_ms). */
  ttlMs: number;
  /** Who holds it (1..=256 bytes, no control characters). Default: "<hostname>:<pid>". */
  owner?: string;
  /** Keep trying this long while the lock is held by someone else (default 0: one try). */
  waitMs?: number;
}

export type LeaseOptions = AcquireOptions;

export interface RenewOptions extends RequestOptions {
  token: TokenInput;
  ttlMs: number;
  timeoutMs?: number;
}

export interface ReleaseOptions extends RequestOptions {
  token: TokenInput;
  timeoutMs?: number;
}

/** A legacy-table row key: the key columns' values in order (or one value for a one-column key). */
export type RowKey = string | number | bigint | Array<string | number | bigint>;

export interface TableRow<R = Record<string, JsonValue>> {
  resource: string;
  key: string;
  row: R;
  fence_token: Token | null;
  scope: string | null;
}

export interface TableWriteResult {
  resource: string;
  key: string;
  fence_token: Token;
  scope: string | null;
  deleted?: true;
}

export interface ResetOptions {
  /** The new fence, below the current one. */
  to?: TokenInput;
  /** Keys and rows only: rebind the sticky scope (null: unscoped). */
  scope?: string | null;
  /** Why (1..=1000 bytes, no control characters); recorded in the audit log. */
  reason: string;
}

export interface AdminResult {
  target: 'scope' | 'key' | 'table' | 'lock';
  name: string;
  resource?: string;
  from: Token;
  to: Token;
  scope?: string | null;
  audit_id: string;
}

export interface RebindResult {
  target: 'kv' | 'table';
  prefix?: string;
  resource?: string;
  scope: string | null;
  rebound: number;
  audit_id: string;
}

export interface AuditEntry {
  id: string;
  at: string;
  actor: string;
  action: 'reset' | 'retire' | 'rebind' | string;
  target: string;
  name: string | null;
  resource: string | null;
  from: Token | null;
  to: Token | null;
  from_scope: string | null;
  to_scope: string | null;
  reason: string;
}

export interface RawRequestOptions extends RequestOptions {
  headers?: Record<string, string>;
  body?: unknown;
  timeoutMs?: number;
}

export declare class Client {
  constructor(options: ClientOptions | string);
  /** The server's base URL, without a trailing slash. */
  readonly url: string;

  /** Any request; returns the parsed JSON body; a problem answer throws its FencegateError subclass. */
  request<T = unknown>(method: string, path: string, options?: RawRequestOptions): Promise<T>;

  /** The value of a key, or null when it is absent or deleted. */
  get<V = JsonValue>(key: string, options?: RequestOptions): Promise<KvEntry<V> | null>;
  put(key: string, value: unknown, options: FencingOptions): Promise<KvWriteResult>;
  delete(key: string, options: FencingOptions): Promise<KvDeleteResult>;
  batch(ops: BatchOp[], options: FencingOptions): Promise<BatchResult>;

  /** Raise a scope's fence to the token without writing data. */
  claim(scope: string, options: ClaimOptions): Promise<FenceInfo>;
  /** A scope's fence, or null when it has none. */
  fence(scope: string, options?: RequestOptions): Promise<FenceInfo | null>;

  /** One grant of the built-in lock (no renewing: see lease()). */
  acquire(name: string, options: AcquireOptions): Promise<LockGrant>;
  renew(name: string, options: RenewOptions): Promise<LockGrant>;
  release(name: string, options: ReleaseOptions): Promise<LockRelease>;
  /** Who holds the lock, or null when it is free. */
  holder(name: string, options?: RequestOptions): Promise<LockHolder | null>;
  /** Take the lock and keep it renewed until released or lost. */
  lease(name: string, options: LeaseOptions): Promise<Lease>;

  tableGet<R = Record<string, JsonValue>>(resource: string, key: RowKey, options?: RequestOptions): Promise<TableRow<R> | null>;
  tablePut(resource: string, key: RowKey, row: Record<string, unknown>, options: FencingOptions): Promise<TableWriteResult>;
  tablePatch(resource: string, key: RowKey, row: Record<string, unknown>, options: FencingOptions): Promise<TableWriteResult>;
  tableDelete(resource: string, key: RowKey, options: FencingOptions): Promise<TableWriteResult>;

  /** Admin calls (the admin right); every one is audited by the server. */
  readonly admin: Admin;

  health(options?: RequestOptions): Promise<{ status: string }>;
  ready(options?: RequestOptions): Promise<{ status: string }>;
}

/** `client.admin`; not constructed by hand. */
export declare class Admin {
  private constructor(client: Client);
  resetFence(scope: string, options: { to: TokenInput; reason: string }): Promise<AdminResult>;
  resetKey(key: string, options: ResetOptions): Promise<AdminResult>;
  resetRow(resource: string, key: RowKey, options: ResetOptions): Promise<AdminResult>;
  retireLock(name: string, options: { reason: string }): Promise<AdminResult>;
  rebindKeys(options: { prefix: string; scope: string | null; reason: string }): Promise<RebindResult>;
  rebindTable(resource: string, options: { scope: string | null; reason: string }): Promise<RebindResult>;
  audit(options?: { limit?: number }): Promise<{ entries: AuditEntry[] }>;
}

/** `Symbol.asyncDispose` (Node 20: Symbol.for('nodejs.asyncDispose')). */
export declare const asyncDispose: typeof Symbol.asyncDispose;

export interface LeaseWriteOptions extends RequestOptions, IdempotencyOptions {
  proof?: string | null;
}

export declare class Lease implements AsyncDisposable {
  /** Made by client.lease(). */
  private constructor(client: Client, name: string, grant: LockGrant, timing: { ttlMs: number; sentAt: number });
  readonly name: string;
  /** This lease's fencing token. */
  readonly token: Token;
  /** The scope its writes go under: the lock's name. */
  readonly scope: string;
  readonly owner: string;
  readonly ttlMs: number;
  /** The last grant or renew answer. */
  readonly grant: LockGrant;
  /** Aborted when the lease ends: lost (reason: LeaseLostError) or released (reason: an AbortError DOMException). */
  readonly signal: AbortSignal;
  /** True once lost (a renew refused, the expiry passed without a renew, or a write refused as stale). */
  readonly lost: boolean;
  /** True while neither lost nor released. */
  readonly held: boolean;
  /** Ms left before this side counts the lease as expired (0 when not held). */
  readonly remainingMs: number;

  put(key: string, value: unknown, options?: LeaseWriteOptions): Promise<KvWriteResult>;
  get<V = JsonValue>(key: string, options?: RequestOptions): Promise<KvEntry<V> | null>;
  delete(key: string, options?: LeaseWriteOptions): Promise<KvDeleteResult>;
  batch(ops: BatchOp[], options?: LeaseWriteOptions): Promise<BatchResult>;
  claim(options?: RequestOptions & IdempotencyOptions): Promise<FenceInfo>;
  tablePut(resource: string, key: RowKey, row: Record<string, unknown>, options?: LeaseWriteOptions): Promise<TableWriteResult>;
  tablePatch(resource: string, key: RowKey, row: Record<string, unknown>, options?: LeaseWriteOptions): Promise<TableWriteResult>;
  tableDelete(resource: string, key: RowKey, options?: LeaseWriteOptions): Promise<TableWriteResult>;
  /** Throws the LeaseLostError when the lease is no longer held. */
  throwIfLost(): void;
  /** Stop renewing and release the lock. Idempotent; a lost lease releases without error. */
  release(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** The fields of an RFC 9457 problem body as sent by fencegate. */
export interface ProblemBody {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  [field: string]: unknown;
}

export declare const PROBLEM_BASE: 'https://fencegate.dev/problems/';

/** Any problem answered by fencegate. */
export declare class FencegateError extends Error {
  constructor(problem: ProblemBody | null, options?: { status?: number; requestId?: string | null; cause?: unknown });
  /** The HTTP status. */
  readonly status: number;
  /** The problem type URI (https://fencegate.dev/problems/<slug>). */
  readonly type: string;
  /** The last segment of `type`, e.g. "stale-token". */
  readonly slug: string;
  readonly title: string;
  readonly detail: string;
  /** The problem body as parsed (null when the answer had none). */
  readonly body: ProblemBody | null;
  /** The answer's X-Request-Id. */
  readonly requestId: string | null;
}

/** 412 stale-token. */
export declare class StaleTokenError extends FencegateError {
  /** The token sent (decimal string). */
  readonly presented: Token | null;
  /** The fence that refused it (decimal string). */
  readonly current: Token | null;
  readonly key: string | null;
  readonly scope: string | null;
  readonly resource: string | null;
  readonly staleKeys: Array<{ key: string; resource?: string; current_token: Token }>;
}
/** 409 scope-mismatch. */
export declare class ScopeMismatchError extends FencegateError {
  readonly key: string | null;
  readonly resource: string | null;
  /** The scope the key is bound to (null: unscoped). */
  readonly scope: string | null;
  readonly presentedScope: string | null;
}
/** 422 token-not-issued. */
export declare class TokenNotIssuedError extends FencegateError {
  readonly scope: string | null;
  readonly presented: Token | null;
  readonly latestIssued: Token | null;
}
/** 422 token-jump. */
export declare class TokenJumpError extends FencegateError {
  readonly presented: Token | null;
  readonly current: Token | null;
  readonly maxJump: Token | null;
  readonly key: string | null;
  readonly scope: string | null;
  readonly resource: string | null;
}
/** 422 missing-token-proof. */
export declare class MissingTokenProofError extends FencegateError {}
/** 422 invalid-token-proof. */
export declare class InvalidTokenProofError extends FencegateError {}
/** 409 lock-held. */
export declare class LockHeldError extends FencegateError {
  readonly holder: string | null;
  readonly remainingMs: number | null;
}
/** 409 lock-lost. */
export declare class LockLostError extends FencegateError {
  readonly holder: string | null;
  readonly remainingMs: number | null;
}
/** 409 lock-exhausted. */
export declare class LockExhaustedError extends FencegateError {}
/** 409 scope-has-issuer. */
export declare class ScopeHasIssuerError extends FencegateError {
  readonly scope: string | null;
  readonly issuer: string | null;
}
/** 428 missing-token. */
export declare class MissingTokenError extends FencegateError {}
/** 401 unauthenticated. */
export declare class UnauthorizedError extends FencegateError {}
/** 403 forbidden. */
export declare class ForbiddenError extends FencegateError {
  readonly right: string | null;
  readonly key: string | null;
  readonly scope: string | null;
  readonly lock: string | null;
  readonly resource: string | null;
}
/** 404 not-found. */
/** 405: the route exists, not with this method. */
export declare class MethodNotAllowedError extends FencegateError {}
/** 408: the request body arrived too slowly. */
export declare class BodyTimeoutError extends FencegateError {}
/** 413: the body (or a value in it) is over the limit. */
export declare class PayloadTooLargeError extends FencegateError {}
/** 415: a body needs Content-Type: application/json. */
export declare class UnsupportedMediaTypeError extends FencegateError {}
/** 421: the Host is not one this server answers for. */
export declare class MisdirectedRequestError extends FencegateError {}
/** 500: the server failed; its log has the request id. */
export declare class InternalError extends FencegateError {}
/** 501: a transfer coding the server does not take. */
export declare class UnsupportedTransferCodingError extends FencegateError {}
/** 400: X-Fencing-Token is not a canonical decimal in 0..=2^63-1. */
export declare class MalformedTokenError extends FencegateError {}
/** 400: the key (or a table row key) is not acceptable. */
export declare class InvalidKeyError extends FencegateError {}
/** 400: the scope or lock name is not acceptable. */
export declare class InvalidScopeError extends FencegateError {}
/** 400: the body is not JSON the server takes. */
export declare class InvalidJsonError extends FencegateError {}
/** 400: the batch is malformed (ops, sizes). */
export declare class InvalidBatchError extends FencegateError {}
/** 400: a table row body names unknown or key columns. */
export declare class InvalidRowError extends FencegateError {}
/** 400: a field is out of range or malformed. */
export declare class InvalidRequestError extends FencegateError {}
/** 409: an admin reset must lower the fence. */
export declare class ResetNotBelowError extends FencegateError {}
/** 409: a rebind contradicts a configured binding. */
export declare class BindingConflictError extends FencegateError {}
/** 422: the table refused a value (a constraint, a trigger). */
export declare class InvalidValueError extends FencegateError {}
/** 422 idempotency-key-reused: the Idempotency-Key was already used for another request; nothing was done. */
export declare class IdempotencyKeyReusedError extends FencegateError {}
export declare class NotFoundError extends FencegateError {}
/** 503 unavailable. */
export declare class UnavailableError extends FencegateError {
  /** Seconds from Retry-After (null when absent). */
  readonly retryAfter: number | null;
}

/** The lease is no longer held; thrown by a Lease's writes without sending, and `lease.signal.reason` when lost. */
export declare class LeaseLostError extends Error {
  constructor(message: string, options?: { cause?: unknown; lock?: string; token?: string });
  readonly lock: string | null;
  readonly token: Token | null;
}

/** The error for a problem answer (by type slug; by status when the body has no type). */
export declare function problemError(
  status: number,
  problem: ProblemBody | null,
  options?: { requestId?: string | null; retryAfter?: number | null },
): FencegateError;

/** HMAC-SHA256 issuer proof (the X-Fencing-Proof value) for a scope and a token. */
export declare function signHmac(secret: string | Uint8Array | KeyObject, scope: string, token: TokenInput): string;
/** Ed25519 issuer proof. privateKey: a KeyObject, a PKCS#8 PEM, a 32-byte seed, or the standard base64 of the seed. */
export declare function signEd25519(privateKey: KeyObject | string | Uint8Array, scope: string, token: TokenInput): string;
/** The bytes an issuer signs: "fencegate-token-v1\n{scope}\n{token}". */
export declare function proofMessage(scope: string, token: TokenInput): Buffer;

/** Canonical decimal string of a token; TypeError/RangeError for anything else (numbers must be safe integers). */
export declare function toToken(value: TokenInput, what?: string): Token;
export declare const MAX_TOKEN: 9223372036854775807n;
/** Every problem type slug the library maps to a class of its own. */
export declare const PROBLEM_SLUGS: readonly string[];
