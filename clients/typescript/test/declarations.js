// Compiled by `tsc` (npm run typecheck, test.sh), never run: the implementation in lib/ as
// index.d.ts declares it. With checkJs, every function and method in lib/*.js is typed from
// index.d.ts (JSDoc imports), and this assignment makes tsc compare the two module by module:
// an export, method or property missing from lib/, a constructor or function that takes other
// parameters, or a return type that differs fails the type check. (The reverse, a runtime export
// that index.d.ts lacks, is test/package.test.js's.)
import * as implementation from '../lib/index.js';

/** @type {typeof import('../index.js')} */
export const declared = implementation;
