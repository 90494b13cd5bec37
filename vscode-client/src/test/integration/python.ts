// The Python side of the integration tests: which interpreter, whether it has the package, and one
// tiny checkpoint per test run (engine.testing.make_tiny_checkpoint) shared by the test files.

import * as assert from 'assert/strict';
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

export const REPO_ROOT = path.resolve(__dirname, '..', '..', '..', '..');
export const PYTHON = process.env.PYTHON || 'python3';
/** DICE_SKIP_SERVER_TESTS=1 skips the tests that start dice-lsp (a machine without the Python package). */
export const SKIP_SERVER_TESTS = process.env.DICE_SKIP_SERVER_TESTS === '1';

let checkpoint: string | undefined;

/** Fails with the reason (and the fix) when the interpreter cannot import the server. */
export function assertPythonHasPackage(): void {
    const probe = spawnSync(PYTHON, ['-c', 'import lsp_server.server, engine.testing'], { cwd: REPO_ROOT, encoding: 'utf8' });
    const problem = probe.error
        ? `cannot run ${PYTHON}: ${probe.error.message}`
        : probe.status !== 0
          ? `${PYTHON} cannot import the dice-cuda package:\n${probe.stderr}`
          : undefined;
    assert.equal(problem, undefined, `${problem}\n(install it with \`pip install -e .\`, or point $PYTHON at the right interpreter)`);
}

export function tinyCheckpoint(): string {
    if (checkpoint === undefined) {
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dice-vscode-ckpt-'));
        const code = 'import sys\nfrom engine.testing import make_tiny_checkpoint\nmake_tiny_checkpoint(sys.argv[1])\n';
        const run = spawnSync(PYTHON, ['-c', code, dir], { cwd: REPO_ROOT, encoding: 'utf8', timeout: 120_000 });
        assert.equal(run.status, 0, `make_tiny_checkpoint failed:\n${run.stderr}`);
        checkpoint = dir;
        process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
    }
    return checkpoint;
}

/** A 2-line kernel whose mask sits at line 2, columns 4-18, as both tests use it. */
export const KERNEL = [
    '__global__ void scale(const float* x, float* y, float a, int n) {',
    '    int i = blockIdx.x * blockDim.x + threadIdx.x;',
    '    /* <MASK:8> */',
    '}',
    '',
].join('\n');
export const MASK_RANGE = { start: { line: 2, character: 4 }, end: { line: 2, character: 18 } };
