// Issuer proofs: the X-Fencing-Proof header value, base64url (no padding) of a signature over
// the bytes "fencegate-token-v1\n{scope}\n{token}".
// Types come from ../index.d.ts; `tsc` (checkJs, test.sh) holds this file to them.
import { createHmac, createPrivateKey, sign as cryptoSign, KeyObject } from 'node:crypto';
import { toToken } from './tokens.js';

/**
 * The bytes an issuer signs for a scope and a token.
 *
 * @param {string} scope
 * @param {import('../index.js').TokenInput} token
 * @returns {Buffer}
 */
export function proofMessage(scope, token) {
  if (typeof scope !== 'string' || scope.length === 0) throw new TypeError('scope must be a non-empty string');
  return Buffer.from(`fencegate-token-v1\n${scope}\n${toToken(token)}`, 'utf8');
}

/**
 * HMAC-SHA256 proof. `secret`: the shared secret (string as UTF-8 bytes, Buffer/Uint8Array, or a secret KeyObject).
 *
 * @param {string | Uint8Array | KeyObject} secret
 * @param {string} scope
 * @param {import('../index.js').TokenInput} token
 * @returns {string}
 */
export function signHmac(secret, scope, token) {
  const msg = proofMessage(scope, token);
  if (!(typeof secret === 'string' || secret instanceof Uint8Array || secret instanceof KeyObject)) {
    throw new TypeError('secret must be a string, Uint8Array or KeyObject');
  }
  return createHmac('sha256', secret).update(msg).digest('base64url');
}

// PKCS#8 DER prefix of an Ed25519 private key; the 32-byte seed follows.
const ED25519_PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

/**
 * @param {KeyObject | string | Uint8Array} privateKey
 * @returns {KeyObject}
 */
function ed25519Key(privateKey) {
  if (privateKey instanceof KeyObject) return privateKey;
  if (privateKey instanceof Uint8Array) {
    if (privateKey.length !== 32) throw new TypeError('an Ed25519 seed must be 32 bytes');
    return createPrivateKey({ key: Buffer.concat([ED25519_PKCS8_PREFIX, privateKey]), format: 'der', type: 'pkcs8' });
  }
  if (typeof privateKey === 'string') {
    if (privateKey.includes('-----BEGIN')) return createPrivateKey(privateKey);
    // The format of `fencegate sign --ed25519-key-file`: standard base64 of the 32-byte seed.
    const seed = Buffer.from(privateKey.trim(), 'base64');
    return ed25519Key(new Uint8Array(seed));
  }
  throw new TypeError('privateKey must be a KeyObject, a PEM string, a base64 seed string or a 32-byte Uint8Array seed');
}

/**
 * Ed25519 proof. `privateKey`: a KeyObject, a PKCS#8 PEM, a 32-byte seed, or the standard base64 of the seed.
 *
 * @param {KeyObject | string | Uint8Array} privateKey
 * @param {string} scope
 * @param {import('../index.js').TokenInput} token
 * @returns {string}
 */
export function signEd25519(privateKey, scope, token) {
  const key = ed25519Key(privateKey);
  if (key.asymmetricKeyType !== 'ed25519') throw new TypeError(`expected an Ed25519 key, got ${key.asymmetricKeyType}`);
  return cryptoSign(null, proofMessage(scope, token), key).toString('base64url');
}
