import * as assert from 'assert/strict';
import { parseStatus, renderStatus, StatusBar } from '../../common/status';
import { stub, ThemeColor } from '../stub/vscode';

const ready = { state: 'ready' as const, model: 'dice-tiny', device: 'cpu', message: null };

describe('status: dice/status payloads', () => {
    it('accepts the contract shape and normalises empty strings to null', () => {
        assert.deepEqual(parseStatus({ state: 'busy', model: 'm', device: '', message: undefined }), {
            state: 'busy',
            model: 'm',
            device: null,
            message: null,
        });
    });

    it('rejects payloads that do not follow the contract', () => {
        assert.equal(parseStatus(null), undefined);
        assert.equal(parseStatus('ready'), undefined);
        assert.equal(parseStatus({ state: 'sleeping' }), undefined);
        assert.equal(parseStatus({}), undefined);
    });

    it('renders every server state', () => {
        const view = (state: 'loading' | 'ready' | 'busy' | 'validating' | 'error', message: string | null = null) =>
            renderStatus({ phase: 'running', status: { ...ready, state, message }, automatic: true });
        assert.equal(view('ready').text, '$(check) DICE dice-tiny · cpu');
        assert.equal(view('loading').text, '$(loading~spin) DICE: loading dice-tiny');
        assert.equal(view('busy').text, '$(sync~spin) DICE: generating');
        assert.equal(view('validating').text, '$(beaker) DICE: validating');
        const error = view('error', 'CUDA out of memory');
        assert.equal(error.text, '$(error) DICE: error');
        assert.equal(error.severity, 'error');
        assert.match(error.tooltip, /CUDA out of memory/);
        assert.match(view('ready').tooltip, /Model: dice-tiny\nDevice: cpu/);
    });

    it("puts an error's whole message in the tooltip, also after the server gave up", () => {
        const message =
            'cannot load the model (http://gpu-box:8000): cannot reach the model server at http://gpu-box:8000: connection failed';
        const error = { state: 'error' as const, model: null, device: null, message };
        const running = renderStatus({ phase: 'running', status: error, automatic: true });
        assert.equal(running.text, '$(error) DICE: error');
        assert.ok(running.tooltip.split('\n').includes(message), running.tooltip);
        const failed = renderStatus({ phase: 'failed', status: error, automatic: true });
        assert.equal(failed.severity, 'error');
        assert.ok(failed.tooltip.split('\n').includes(`Last error: ${message}`), failed.tooltip);
        assert.doesNotMatch(renderStatus({ phase: 'failed', status: ready, automatic: true }).tooltip, /Last error/);
    });

    it('shows the client side: starting, stopped, failed, automatic suggestions off', () => {
        assert.equal(renderStatus({ phase: 'starting', status: undefined, automatic: true }).text, '$(loading~spin) DICE: starting');
        assert.equal(renderStatus({ phase: 'stopped', status: ready, automatic: true }).severity, 'warning');
        const failed = renderStatus({ phase: 'failed', status: undefined, automatic: true });
        assert.equal(failed.severity, 'error');
        assert.match(failed.tooltip, /Server: failed/);
        const manual = renderStatus({ phase: 'running', status: ready, automatic: false });
        assert.match(manual.text, /\$\(eye-closed\)$/);
        assert.match(manual.tooltip, /Automatic suggestions: off/);
    });
});

describe('status: why the last suggestion was not usable', () => {
    const note = { uri: 'file:///k/a.cu', message: '3 candidates, none compiled: a.cu(40): error: expected an expression' };

    it('shows the message in the warning colour while the server is ready, with the full text in the tooltip', () => {
        const view = renderStatus({ phase: 'running', status: ready, automatic: true, suggestion: note });
        assert.equal(view.severity, 'warning');
        assert.match(view.text, /^\$\(warning\) DICE: 3 candidates, none compiled: a\.cu\(40\): error: expected an e…$/);
        assert.match(view.tooltip, /Last suggestion: 3 candidates, none compiled: a\.cu\(40\): error: expected an expression/);
        const manual = renderStatus({ phase: 'running', status: ready, automatic: false, suggestion: note });
        assert.match(manual.text, /^\$\(warning\).*\$\(eye-closed\)$/);
    });

    it('lets work in progress and failures show first', () => {
        const busy = renderStatus({ phase: 'running', status: { ...ready, state: 'busy' }, automatic: true, suggestion: note });
        assert.equal(busy.text, '$(sync~spin) DICE: generating');
        const error = renderStatus({ phase: 'running', status: { ...ready, state: 'error' }, automatic: true, suggestion: note });
        assert.equal(error.severity, 'error');
        assert.equal(renderStatus({ phase: 'stopped', status: ready, automatic: true, suggestion: note }).text, '$(debug-disconnect) DICE: stopped');
    });
});

describe('StatusBar', () => {
    beforeEach(() => stub.reset());

    it('is one visible item that opens the log and follows status and phase', () => {
        const bar = new StatusBar(true);
        assert.equal(stub.statusItems.length, 1);
        const item = stub.statusItems[0];
        assert.equal(item.visible, true);
        assert.equal(item.command, 'dice.showLog');

        bar.setPhase('starting');
        assert.equal(item.text, '$(loading~spin) DICE: starting');
        assert.equal(bar.onStatus({ ...ready, state: 'loading' }), true);
        bar.setPhase('running');
        assert.equal(item.text, '$(loading~spin) DICE: loading dice-tiny'); // kept across the phase change
        assert.equal(bar.onStatus({ state: 'nonsense' }), false);
        assert.equal(item.text, '$(loading~spin) DICE: loading dice-tiny');
        bar.onStatus({ ...ready, state: 'error', message: 'no model' });
        assert.ok(item.backgroundColor instanceof ThemeColor);
        assert.equal((item.backgroundColor as ThemeColor).id, 'statusBarItem.errorBackground');
        bar.onStatus(ready);
        assert.equal(item.backgroundColor, undefined);

        bar.setPhase('stopped');
        assert.equal((item.backgroundColor as ThemeColor).id, 'statusBarItem.warningBackground');
        bar.setPhase('starting');
        assert.equal(bar.view.status, undefined, 'a new process starts without the old status');
        bar.dispose();
        assert.equal(item.disposed, true);
    });

    it('shows a suggestion status message until the next status or an edit of that document', () => {
        const bar = new StatusBar(true);
        const item = stub.statusItems[0];
        bar.setPhase('running');
        bar.onStatus(ready);
        const status = { uri: 'file:///k/a.cu', position: { line: 39, character: 4 }, candidates: 3, usable: 0, shown: 1 };
        bar.onSuggestionStatus({ ...status, message: '3 candidates, none compiled: a.cu(40): error' });
        assert.equal(item.text, '$(warning) DICE: 3 candidates, none compiled: a.cu(40): error');
        assert.equal((item.backgroundColor as ThemeColor).id, 'statusBarItem.warningBackground');
        bar.onSuggestionStatus({ ...status, usable: 2, message: null });
        assert.equal(item.text, '$(check) DICE dice-tiny · cpu', 'a usable suggestion clears it');
        assert.equal(item.backgroundColor, undefined);

        bar.onSuggestionStatus({ ...status, message: 'no suggestion: every fill the model gave was blank' });
        bar.clearSuggestion('file:///k/other.cu');
        assert.match(item.text, /blank/, 'an edit elsewhere keeps it');
        bar.clearSuggestion('file:///k/a.cu');
        assert.equal(item.text, '$(check) DICE dice-tiny · cpu');

        bar.onSuggestionStatus({ ...status, message: 'none compiled' });
        bar.setPhase('starting');
        bar.setPhase('running');
        bar.onStatus(ready);
        assert.equal(item.text, '$(check) DICE dice-tiny · cpu', 'a new process starts without it');
        bar.dispose();
    });
});
