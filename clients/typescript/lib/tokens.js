// Fencing tokens: canonical decimal strings in 0..=9223372036854775807, never JS floats.
// Types come from ../index.d.ts; `tsc` (checkJs, test.sh) holds this file to them.

/** @typedef {import('../index.js').TokenInput} TokenInput */
/** @typedef {import('../index.js').Token} Token */
/** @typedef {import('../index.js').RowKey} RowKey */

/** @type {9223372036854775807n} */
export const MAX_TOKEN = 9223372036854775807n;
const CANONICAL = /^(0|[1-9][0-9]*)$/;

/**
 * Normalizes a token to its canonical decimal string. Accepts a canonical decimal string, a
 * bigint, or a number that is a safe integer (Number.isSafeInteger); anything else — a number
 * above 2^53 - 1 (already rounded), a float, a negative, a string with a sign, spaces or leading
 * zeros, or a value above 9223372036854775807 — is refused with a TypeError (or RangeError for
 * an out-of-range value), before any request is sent.
 *
 * @param {unknown} value a TokenInput (checked here, at run time, for JS callers)
 * @param {string} [what] how the value is named in the error
 * @returns {Token}
 */
export function toToken(value, what = 'token') {
  if (typeof value === 'string') {
    if (!CANONICAL.test(value)) {
      throw new TypeError(`${what} must be a canonical decimal string (no sign, spaces or leading zeros), got ${JSON.stringify(value)}`);
    }
    if (value.length > 19 || BigInt(value) > MAX_TOKEN) {
      throw new RangeError(`${what} ${value} is above 9223372036854775807`);
    }
    return value;
  }
  if (typeof value === 'bigint') {
    if (value < 0n || value > MAX_TOKEN) throw new RangeError(`${what} ${value} is outside 0..=9223372036854775807`);
    return value.toString();
  }
  if (typeof value === 'number') {
    if (!Number.isSafeInteger(value) || value < 0) {
      throw new TypeError(
        `${what} ${value} is not a non-negative safe integer: pass tokens as strings or bigints (a JS number above 2^53 - 1 has already lost digits)`,
      );
    }
    return String(value);
  }
  throw new TypeError(`${what} must be a string, bigint or safe integer, got ${value === null ? 'null' : typeof value}`);
}

/**
 * Encodes a key, scope or lock name as one path segment (and as the X-Fencing-Scope header).
 *
 * @param {string} name
 * @param {string} [what] how the name is named in the error
 * @returns {string}
 */
export function encodeName(name, what = 'name') {
  if (typeof name !== 'string' || name.length === 0) throw new TypeError(`${what} must be a non-empty string`);
  if (!name.isWellFormed()) throw new TypeError(`${what} is not well-formed Unicode (a lone surrogate)`);
  // "." and ".." are dot segments: a URL parser removes them (also as %2E), so such a name
  // cannot be sent in a path at all.
  if (name === '.' || name === '..') throw new TypeError(`${what} ${JSON.stringify(name)} cannot be sent in a URL path`);
  return encodeURIComponent(name);
}

/**
 * A legacy-table row key: an array of key-column values (joined by ","), or one value.
 *
 * @param {RowKey} key
 * @returns {string}
 */
export function encodeRowKey(key) {
  const parts = Array.isArray(key) ? key : [key];
  if (parts.length === 0) throw new TypeError('row key must have at least one part');
  const enc = parts.map((p) => {
    const s = typeof p === 'bigint' || typeof p === 'number' ? String(p) : p;
    if (typeof s !== 'string' || s.length === 0) throw new TypeError('row key parts must be non-empty strings or numbers');
    return encodeURIComponent(s).replace(/\./g, '%2E');
  });
  const seg = enc.join(',');
  if (seg === '%2E' || seg === '%2E%2E') throw new TypeError('row key "." or ".." cannot be sent in a URL path');
  return seg;
}
