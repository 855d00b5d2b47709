// Problem types (RFC 9457) as error classes. One class per `type` slug the library maps; any other
// problem becomes a FencegateError carrying its status, type and body.
// Types come from ../index.d.ts; `tsc` (checkJs, test.sh) holds this file to them.

/** @typedef {import('../index.js').ProblemBody} ProblemBody */
/**
 * What an error is built with besides its body (retryAfter: UnavailableError only).
 * @typedef {{ status?: number, requestId?: string | null, cause?: unknown, retryAfter?: number | null }} ErrorOptions
 */

export const PROBLEM_BASE = 'https://fencegate.dev/problems/';

/** Any problem answered by fencegate (an HTTP status >= 400 with a problem body, or without one). */
export class FencegateError extends Error {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options = {}) {
    const p = problem ?? {};
    const status = typeof p.status === 'number' ? p.status : (options.status ?? 0);
    const title = typeof p.title === 'string' ? p.title : '';
    const detail = typeof p.detail === 'string' ? p.detail : '';
    super(detail || title || `fencegate answered ${status}`, options.cause ? { cause: options.cause } : undefined);
    this.name = new.target.name;
    /** HTTP status of the answer. */
    this.status = status;
    /** The problem type URI, e.g. https://fencegate.dev/problems/stale-token ('about:blank' when the body had none). */
    this.type = typeof p.type === 'string' ? p.type : 'about:blank';
    /** The last path segment of `type`, e.g. 'stale-token'. */
    this.slug = slugOf(this.type);
    this.title = title;
    this.detail = detail;
    /** The whole problem body as parsed (null when the answer had no JSON body). */
    this.body = problem ?? null;
    /** The X-Request-Id of the answer, for the server's logs. */
    this.requestId = options.requestId ?? null;
  }
}

/**
 * @param {string} type
 * @returns {string}
 */
function slugOf(type) {
  if (typeof type !== 'string') return '';
  if (type.startsWith(PROBLEM_BASE)) return type.slice(PROBLEM_BASE.length);
  const i = type.lastIndexOf('/');
  return i >= 0 ? type.slice(i + 1) : type;
}

/** @type {(v: unknown) => string | null} */
const str = (v) => (v === undefined || v === null ? null : String(v));

/** 412 stale-token: the token is below the fence. */
export class StaleTokenError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options) {
    super(problem, options);
    const p = problem ?? {};
    /** The token the request carried (a decimal string). */
    this.presented = str(p.presented_token);
    /** The fence that refused it (a decimal string). */
    this.current = str(p.current_token);
    this.key = str(p.key);
    this.scope = str(p.scope);
    this.resource = str(p.resource);
    /** For a batch: every stale key with its fence. */
    this.staleKeys = Array.isArray(p.stale_keys) ? p.stale_keys : [];
  }
}

/** 409 scope-mismatch: the key (or row) is bound to another scope than the write's. */
export class ScopeMismatchError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options) {
    super(problem, options);
    const p = problem ?? {};
    this.key = str(p.key);
    this.resource = str(p.resource);
    /** The scope the key is bound to (null: unscoped). */
    this.scope = str(p.scope);
    /** The write's scope (null: none). */
    this.presentedScope = str(p.presented_scope);
  }
}

/** 422 token-not-issued: a token above the latest the scope's built-in lock granted. */
export class TokenNotIssuedError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options) {
    super(problem, options);
    const p = problem ?? {};
    this.scope = str(p.scope);
    this.presented = str(p.presented_token);
    this.latestIssued = str(p.latest_issued);
  }
}

/** 422 token-jump: the token would raise the fence by more than kv.max_token_jump. */
export class TokenJumpError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options) {
    super(problem, options);
    const p = problem ?? {};
    this.presented = str(p.presented_token);
    this.current = str(p.current_token);
    this.maxJump = str(p.max_jump);
    this.key = str(p.key);
    this.scope = str(p.scope);
    this.resource = str(p.resource);
  }
}

/** 422 missing-token-proof: the scope is an issuer's and no X-Fencing-Proof was sent. */
export class MissingTokenProofError extends FencegateError {}

/** 422 invalid-token-proof: the X-Fencing-Proof does not verify. */
export class InvalidTokenProofError extends FencegateError {}

/** 409 lock-held: someone else holds the lock. */
export class LockHeldError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options) {
    super(problem, options);
    const p = problem ?? {};
    this.holder = str(p.holder);
    this.remainingMs = typeof p.remaining_ms === 'number' ? p.remaining_ms : null;
  }
}

/** 409 lock-lost: renew or release of a lease the caller no longer holds. */
export class LockLostError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options) {
    super(problem, options);
    const p = problem ?? {};
    this.holder = str(p.holder);
    this.remainingMs = typeof p.remaining_ms === 'number' ? p.remaining_ms : null;
  }
}

/** 409 lock-exhausted: no token above 9223372036854775807 exists for this lock. */
export class LockExhaustedError extends FencegateError {}

/** 409 scope-has-issuer: no built-in lock on a scope an issuer covers. */
export class ScopeHasIssuerError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options) {
    super(problem, options);
    const p = problem ?? {};
    this.scope = str(p.scope);
    this.issuer = str(p.issuer);
  }
}

/** 428 missing-token: a write without X-Fencing-Token (only reachable through client.request()). */
export class MissingTokenError extends FencegateError {}

/** 401 unauthenticated: no valid credential. */
export class UnauthorizedError extends FencegateError {}

/** 403 forbidden: the credential lacks the right on the name. */
export class ForbiddenError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options) {
    super(problem, options);
    const p = problem ?? {};
    this.right = str(p.right);
    this.key = str(p.key);
    this.scope = str(p.scope);
    this.lock = str(p.lock);
    this.resource = str(p.resource);
  }
}

/** 404 not-found. */
export class NotFoundError extends FencegateError {}

/** 503 unavailable: retry (with the same token) after `retryAfter` seconds. */
export class UnavailableError extends FencegateError {
  /**
   * @param {ProblemBody | null} problem
   * @param {ErrorOptions} [options]
   */
  constructor(problem, options = {}) {
    super(problem, options);
    /** Seconds from the Retry-After header (null when absent). */
    this.retryAfter = options.retryAfter ?? null;
  }
}

/**
 * The lease is no longer held (a renew was refused, its expiry passed without a renew, or a write
 * under it was refused as stale), or it was released. Thrown by a Lease's writes without sending
 * anything; also `lease.signal.reason` when the lease is lost.
 */
export class LeaseLostError extends Error {
  /**
   * @param {string} message
   * @param {{ cause?: unknown, lock?: string, token?: string }} [options]
   */
  constructor(message, options = {}) {
    super(message, options.cause ? { cause: options.cause } : undefined);
    this.name = 'LeaseLostError';
    this.lock = options.lock ?? null;
    this.token = options.token ?? null;
  }
}

/** 405: the route exists, not with this method. */
export class MethodNotAllowedError extends FencegateError {}

/** 408: the request body arrived too slowly. */
export class BodyTimeoutError extends FencegateError {}

/** 413: the body (or a value in it) is over the limit. */
export class PayloadTooLargeError extends FencegateError {}

/** 415: a body needs Content-Type: application/json. */
export class UnsupportedMediaTypeError extends FencegateError {}

/** 421: the Host is not one this server answers for. */
export class MisdirectedRequestError extends FencegateError {}

/** 500: the server failed; its log has the request id. */
export class InternalError extends FencegateError {}

/** 501: a transfer coding the server does not take. */
export class UnsupportedTransferCodingError extends FencegateError {}

/** 400: X-Fencing-Token is not a canonical decimal in 0..=2^63-1. */
export class MalformedTokenError extends FencegateError {}

/** 400: the key (or a table row key) is not acceptable. */
export class InvalidKeyError extends FencegateError {}

/** 400: the scope or lock name is not acceptable. */
export class InvalidScopeError extends FencegateError {}

/** 400: the body is not JSON the server takes. */
export class InvalidJsonError extends FencegateError {}

/** 400: the batch is malformed (ops, sizes). */
export class InvalidBatchError extends FencegateError {}

/** 400: a table row body names unknown or key columns. */
export class InvalidRowError extends FencegateError {}

/** 400: a field is out of range or malformed. */
export class InvalidRequestError extends FencegateError {}

/** 409: an admin reset must lower the fence. */
export class ResetNotBelowError extends FencegateError {}

/** 409: a rebind contradicts a configured binding. */
export class BindingConflictError extends FencegateError {}

/** 422: the table refused a value (a constraint, a trigger). */
export class InvalidValueError extends FencegateError {}
/** 422 idempotency-key-reused: the Idempotency-Key was already used for another request; nothing was done. */
export class IdempotencyKeyReusedError extends FencegateError {}

/** @type {Record<string, typeof FencegateError>} */
const BY_SLUG = {
  'stale-token': StaleTokenError,
  'scope-mismatch': ScopeMismatchError,
  'token-not-issued': TokenNotIssuedError,
  'token-jump': TokenJumpError,
  'missing-token-proof': MissingTokenProofError,
  'invalid-token-proof': InvalidTokenProofError,
  'lock-held': LockHeldError,
  'lock-lost': LockLostError,
  'lock-exhausted': LockExhaustedError,
  'scope-has-issuer': ScopeHasIssuerError,
  'missing-token': MissingTokenError,
  unauthenticated: UnauthorizedError,
  forbidden: ForbiddenError,
  'not-found': NotFoundError,
  unavailable: UnavailableError,
  'method-not-allowed': MethodNotAllowedError,
  'body-timeout': BodyTimeoutError,
  'payload-too-large': PayloadTooLargeError,
  'unsupported-media-type': UnsupportedMediaTypeError,
  'misdirected-request': MisdirectedRequestError,
  'internal': InternalError,
  'unsupported-transfer-coding': UnsupportedTransferCodingError,
  'malformed-token': MalformedTokenError,
  'invalid-key': InvalidKeyError,
  'invalid-scope': InvalidScopeError,
  'invalid-json': InvalidJsonError,
  'invalid-batch': InvalidBatchError,
  'invalid-row': InvalidRowError,
  'invalid-request': InvalidRequestError,
  'reset-not-below': ResetNotBelowError,
  'binding-conflict': BindingConflictError,
  'invalid-value': InvalidValueError,
  'idempotency-key-reused': IdempotencyKeyReusedError,
};

/** Every problem type slug this library maps to a class of its own. */
export const PROBLEM_SLUGS = Object.freeze(Object.keys(BY_SLUG));

/** @type {Record<number, typeof FencegateError>} */
const BY_STATUS = {
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  412: StaleTokenError,
  503: UnavailableError,
};

/**
 * Builds the error for a problem answer: by its type slug, else by status for the unambiguous ones.
 *
 * @param {number} status
 * @param {ProblemBody | null} problem
 * @param {{ requestId?: string | null, retryAfter?: number | null }} [options]
 * @returns {FencegateError}
 */
export function problemError(status, problem, options = {}) {
  const body = problem && typeof problem === 'object' && !Array.isArray(problem) ? problem : null;
  const type = body && typeof body.type === 'string' ? body.type : null;
  let Cls = null;
  if (type && type.startsWith(PROBLEM_BASE)) Cls = BY_SLUG[type.slice(PROBLEM_BASE.length)] ?? null;
  if (!Cls && !type) Cls = BY_STATUS[status] ?? null;
  Cls ??= FencegateError;
  const merged = body ? { ...body, status: typeof body.status === 'number' ? body.status : status } : { status };
  return new Cls(merged, { ...options, status });
}
