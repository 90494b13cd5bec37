import * as assert from 'assert/strict';
import type { CancellationToken } from 'vscode';
import { LSPErrorCodes, ResponseError } from 'vscode-languageserver-protocol';
import type { ServerHandle } from '../../common/client';
import { describeResult, ProgressTranslator, runWithProgress } from '../../common/serverCommands';
import { Disposable } from '../stub/vscode';

describe('serverCommands: progress', () => {
    it('turns absolute work-done percentages into increments', () => {
        const reports: { message?: string; increment?: number }[] = [];
        const t = new ProgressTranslator({ report: (v) => reports.push(v) });
        t.accept({ kind: 'begin', title: 'DICE', percentage: 0 });
        t.accept({ kind: 'report', message: 'generating 1/3', percentage: 33 });
        t.accept({ kind: 'report', message: 'validating', percentage: 80 });
        t.accept({ kind: 'report', message: 'no percentage' });
        t.accept({ kind: 'report', percentage: 120 });
        t.accept({ kind: 'end', message: 'done' });
        assert.deepEqual(reports, [
            { message: undefined, increment: 0 },
            { message: 'generating 1/3', increment: 33 },
            { message: 'validating', increment: 47 },
            { message: 'no percentage', increment: undefined },
            { message: undefined, increment: 20 },
        ]);
    });
});

function handle(execute: ServerHandle['executeCommand']): ServerHandle & { subscribed: string[]; disposed: string[] } {
    const subscribed: string[] = [];
    const disposed: string[] = [];
    return {
        subscribed,
        disposed,
        running: true,
        pid: 1234,
        start: async () => undefined,
        stop: async () => undefined,
        pushSettings: async () => undefined,
        executeCommand: execute,
        onWorkDoneProgress: (workDoneToken) => {
            subscribed.push(workDoneToken);
            return new Disposable(() => disposed.push(workDoneToken));
        },
    };
}

const runner = (cancelled = false) => ({
    newToken: () => 'tok-1',
    withProgress: <T>(_title: string, task: (p: { report(): void }, t: CancellationToken) => Thenable<T>) =>
        task({ report: () => undefined }, { isCancellationRequested: cancelled } as CancellationToken),
});

describe('serverCommands: runWithProgress', () => {
    it('sends the work-done token with the request and unsubscribes afterwards', async () => {
        let sent: unknown[] = [];
        const h = handle(async (command, args, workDoneToken) => {
            sent = [command, args, workDoneToken];
            return { ok: true, label: 'compiled ✓ · not run' };
        });
        const outcome = await runWithProgress(h, 'dice.validateKernel', ['file:///a.cu'], runner());
        assert.deepEqual(outcome, { kind: 'done', result: { ok: true, label: 'compiled ✓ · not run' } });
        assert.deepEqual(sent, ['dice.validateKernel', ['file:///a.cu'], 'tok-1']);
        assert.deepEqual(h.subscribed, ['tok-1']);
        assert.deepEqual(h.disposed, ['tok-1']);
    });

    it('reports cancellation and failures distinctly', async () => {
        const cancelled = handle(async () => {
            throw new ResponseError(LSPErrorCodes.RequestCancelled, 'cancelled');
        });
        assert.deepEqual(await runWithProgress(cancelled, 'dice.fillAllMasks', ['u'], runner()), { kind: 'cancelled' });
        const failing = handle(async () => {
            throw new ResponseError(-32603, 'model file is corrupt');
        });
        assert.deepEqual(await runWithProgress(failing, 'dice.fillAllMasks', ['u'], runner()), {
            kind: 'failed',
            message: 'model file is corrupt',
        });
        assert.deepEqual(failing.disposed, ['tok-1']);
    });
});

describe('serverCommands: result summaries', () => {
    it('summarises each result shape of lsp_server/commands.py', () => {
        assert.equal(
            describeResult({ ok: true, applied: true, filled: [{}, {}], skipped: [{ mask: 2 }] }),
            'filled 2 mask(s), skipped 1',
        );
        assert.equal(describeResult({ ok: true, uri: 'file:///r_dice.py', path: '/r_dice.py', label: 'compiled ✓' }), 'wrote /r_dice.py, compiled ✓');
        assert.equal(describeResult({ ok: false, message: 'no mask at line 3' }), 'failed, no mask at line 3');
        assert.equal(describeResult(null), undefined);
    });
});
