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
});
