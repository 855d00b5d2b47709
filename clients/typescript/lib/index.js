export { Client, Admin } from './client.js';
export { Lease, asyncDispose } from './lease.js';
export {
  FencegateError,
  StaleTokenError,
  ScopeMismatchError,
  TokenNotIssuedError,
  TokenJumpError,
  MissingTokenProofError,
  InvalidTokenProofError,
  LockHeldError,
  LockLostError,
  LockExhaustedError,
  ScopeHasIssuerError,
  MissingTokenError,
  UnauthorizedError,
  ForbiddenError,
  NotFoundError,
  UnavailableError,
  LeaseLostError,
  PROBLEM_BASE,
  problemError,
} from './errors.js';
export { signHmac, signEd25519, proofMessage } from './proof.js';
export { toToken, MAX_TOKEN } from './tokens.js';
