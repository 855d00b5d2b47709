// The type check that ties lib/*.js to index.d.ts can fail: tsc passes on the package as shipped
// and fails for each kind of drift it is there to catch (the negative control of
// test/declarations.js and the JSDoc in lib/). Each drift is one edit made in memory, through
// the compiler API (one program reused, so a check takes seconds, not a cold tsc each).
// Needs the dev dependencies (typescript), not a server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import ts from 'typescript';
import { PKG_DIR } from './helpers.js';

const config = ts.getParsedCommandLineOfConfigFile(join(PKG_DIR, 'tsconfig.json'), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => assert.fail(ts.flattenDiagnosticMessageText(d.messageText, '\n')) });
let previous;

/** tsc's errors for the package with `file`'s text `from` replaced by `to` (none: as shipped). */
function typeErrors(edit) {
  const host = ts.createCompilerHost(config.options);
  const getSourceFile = host.getSourceFile.bind(host);
  if (edit) {
    const [file, from, to] = edit;
    const path = join(PKG_DIR, file);
    const text = ts.sys.readFile(path);
    assert.equal(text.split(from).length, 2, `${file} should contain ${JSON.stringify(from)} exactly once`);
    host.getSourceFile = (name, lang, ...rest) =>
      name === path ? ts.createSourceFile(name, text.replace(from, to), lang) : getSourceFile(name, lang, ...rest);
    host.readFile = (name) => (name === path ? text.replace(from, to) : ts.sys.readFile(name));
  }
  const program = ts.createProgram({ rootNames: config.fileNames, options: config.options, host, oldProgram: previous });
  previous = program;
  // The package's own files only: checking @types/node again for every edit would take minutes
  // on a loaded machine (test.sh's tsc run checks everything once).
  const own = program.getSourceFiles().filter((f) => f.fileName.startsWith(PKG_DIR) && !f.fileName.includes('/node_modules/'));
  const diagnostics = [...program.getOptionsDiagnostics(), ...own.flatMap((f) => [...program.getSyntacticDiagnostics(f), ...program.getSemanticDiagnostics(f)])];
  return diagnostics.map((d) => `${d.file?.fileName ?? ''}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`);
}

test('the declarations and the implementation agree as shipped', () => {
  assert.deepEqual(typeErrors(null), []);
});

const DRIFTS = [
  ['a declared method missing from lib/', 'lib/client.js', '  holder(name, options = {}) {', '  holderOf(name, options = {}) {'],
  ['a method declared that lib/ lacks', 'index.d.ts', '  throwIfLost(): void;', '  throwIfLost(): void;\n  extend(ttlMs: number): Promise<void>;'],
  ['an option renamed in index.d.ts', 'index.d.ts', '  waitMs?: number;', '  wait?: number;'],
  ['an option read under another name in lib/', 'lib/lease.js', 'timeoutMs: Math.max(1, Math.floor(left)),', 'timeout: Math.max(1, Math.floor(left)),'],
  ['a parameter added in lib/', 'lib/proof.js', 'export function signHmac(secret, scope, token) {', 'export function signHmac(secret, scope, token, encoding) {'],
  ['an error field of another type', 'lib/errors.js', 'this.latestIssued = str(p.latest_issued);', 'this.latestIssued = p.latest_issued;'],
  ['a getter returning another shape', 'lib/lease.js', 'return Math.max(0, Math.floor(this.#deadline - performance.now()));', 'return String(Math.max(0, Math.floor(this.#deadline - performance.now())));'],
];

for (const [what, ...edit] of DRIFTS) {
  test(`tsc fails on drift: ${what}`, () => {
    const errors = typeErrors(edit);
    assert.notDeepEqual(errors, [], `tsc passed although ${what} (${edit[0]})`);
  });
}
