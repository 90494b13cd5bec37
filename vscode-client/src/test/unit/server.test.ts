import * as assert from 'assert/strict';
import type { LogOutputChannel } from 'vscode';
import { DEFAULT_SERVER_SETTINGS } from '../../common/protocol';
import { RestartPolicy, Timer } from '../../common/restart';
import { ServerManager } from '../../common/server';
import type { ClientPhase } from '../../common/status';
import { stub, window } from '../stub/vscode';
import { FakeWorld, settle } from './fakes';

/** Timers the test fires by hand, so restart delays are checked without waiting. */
class ManualTimers {
    pending: { callback: () => void; ms: number; cancelled: boolean }[] = [];
    set = (callback: () => void, ms: number): Timer => {
        const entry = { callback, ms, cancelled: false };
        this.pending.push(entry);
        return { dispose: () => (entry.cancelled = true) };
    };
    live(): number[] {
        return this.pending.filter((t) => !t.cancelled).map((t) => t.ms);
    }
    async fireAll(): Promise<void> {
        const due = this.pending.filter((t) => !t.cancelled);
        this.pending = [];
        due.forEach((t) => t.callback());
        await settle();
    }
}

function setup(options: { maxCrashes?: number } = {}) {
    stub.reset();
    const world = new FakeWorld();
    const timers = new ManualTimers();
    const phases: ClientPhase[] = [];
    const statuses: unknown[] = [];
    const suggestionStatuses: unknown[] = [];
    const gaveUp: string[] = [];
    let afterStops = 0;
    let beforeStarts = 0;
    const log = window.createOutputChannel('DICE') as unknown as LogOutputChannel;
    const manager = new ServerManager({
        createHandle: world.factory,
        launch: () => ({ command: 'python3', args: ['-m', 'lsp_server'] }),
        settings: () => ({ ...DEFAULT_SERVER_SETTINGS, candidates: 5 }),
        middleware: {},
        log,
        onPhase: (p) => phases.push(p),
        onStatus: (s) => statuses.push(s),
        onSuggestionStatus: (s) => suggestionStatuses.push(s),
        beforeStart: () => (beforeStarts += 1),
        afterStop: () => (afterStops += 1),
        onGiveUp: (m) => gaveUp.push(m),
        policy: new RestartPolicy({ maxCrashes: options.maxCrashes ?? 2, windowMs: 60_000, baseDelayMs: 100, maxDelayMs: 1000 }),
        now: () => 0,
        setTimer: timers.set,
    });
    return { world, timers, phases, statuses, suggestionStatuses, gaveUp, manager, counts: () => ({ afterStops, beforeStarts }) };
}

describe('ServerManager', () => {
    it('starts one server with the settings as initialization options', async () => {
        const { world, manager, phases } = setup();
        await manager.ensureStarted();
        await manager.ensureStarted();
        assert.equal(world.handles.length, 1);
        assert.equal(world.last.options.settings.candidates, 5);
        assert.deepEqual(world.last.options.launch, { command: 'python3', args: ['-m', 'lsp_server'] });
        assert.deepEqual(phases, ['starting', 'running']);
        assert.equal(manager.current, world.last);
    });

    it('forwards dice/status only from the current process', async () => {
        const { world, manager, statuses } = setup();
        await manager.ensureStarted();
        const first = world.last;
        await manager.restart(true);
        first.options.onStatus({ state: 'ready' });
        world.last.options.onStatus({ state: 'busy' });
        assert.deepEqual(statuses, [{ state: 'busy' }]);
    });

    it('forwards dice/suggestionStatus only from the current process', async () => {
        const { world, manager, suggestionStatuses } = setup();
        await manager.ensureStarted();
        const first = world.last;
        await manager.restart(true);
        first.options.onSuggestionStatus({ uri: 'file:///old.cu' });
        world.last.options.onSuggestionStatus({ uri: 'file:///new.cu' });
        assert.deepEqual(suggestionStatuses, [{ uri: 'file:///new.cu' }]);
    });

    it('restarts a crashed server after the backoff delay', async () => {
        const { world, manager, timers, phases, counts } = setup();
        await manager.ensureStarted();
        world.last.crash();
        assert.equal(manager.state, 'stopped');
        assert.deepEqual(timers.live(), [0, 100]); // fallbacks come back on the next tick; restart after 100 ms
        await timers.fireAll();
        assert.equal(counts().afterStops, 1);
        assert.equal(world.handles.length, 2);
        assert.equal(manager.state, 'running');
        assert.deepEqual(phases, ['starting', 'running', 'stopped', 'starting', 'running']);
    });

    it('never runs two restarts at once, however many are asked for', async () => {
        const { world, manager } = setup();
        world.script = { holdStart: true };
        const requests = [manager.restart(true), manager.restart(true), manager.restart(false), manager.ensureStarted()];
        await settle();
        assert.equal(world.handles.length, 1);
        world.last.release();
        await settle();
        // The requests made during the first start coalesce into exactly one more.
        assert.equal(world.handles.length, 2);
        world.last.release();
        await Promise.all(requests);
        assert.equal(world.maxInFlight, 1);
        assert.equal(world.handles[0].stops, 1, 'the first server was stopped before the second started');
        assert.equal(manager.state, 'running');
    });

    it('gives up after repeated crashes and a manual restart starts a fresh budget', async () => {
        const { world, manager, timers, gaveUp } = setup({ maxCrashes: 2 });
        await manager.ensureStarted();
        world.last.crash();
        await timers.fireAll();
        world.last.crash();
        await timers.fireAll();
        world.last.crash();
        await timers.fireAll();
        assert.equal(world.handles.length, 3);
        assert.equal(manager.state, 'failed');
        assert.equal(gaveUp.length, 1);
        assert.match(gaveUp[0], /stopped 3 times/);
        await manager.ensureStarted(); // a failed server is not restarted implicitly
        assert.equal(world.handles.length, 3);
        await manager.restart(true);
        assert.equal(world.handles.length, 4);
        assert.equal(manager.state, 'running');
    });

    it('does not retry a server that never started, and says what to check', async () => {
        const { world, manager, timers, gaveUp } = setup();
        world.script = { failStart: true };
        await manager.ensureStarted();
        assert.equal(manager.state, 'failed');
        assert.deepEqual(timers.live(), [0], 'no restart is scheduled');
        assert.equal(world.last.stops, 1, 'the failed client is stopped so its process is reaped');
        assert.equal(gaveUp.length, 1);
        assert.match(gaveUp[0], /dice\.server\.pythonPath/);
        world.script = {};
        await manager.restart(true);
        assert.equal(manager.state, 'running');
    });

    it('pushes settings to a running server only', async () => {
        const { world, manager } = setup();
        await manager.pushSettings(); // nothing running: nothing to send, no error
        await manager.ensureStarted();
        await manager.pushSettings();
        assert.equal(world.last.pushed.length, 1);
        assert.equal(world.last.pushed[0].candidates, 5);
    });

    it('stops the server on deactivate and does not restart afterwards', async () => {
        const { world, manager, timers } = setup();
        await manager.ensureStarted();
        const handle = world.last;
        handle.crash();
        await manager.stop();
        assert.deepEqual(timers.live(), [0], 'the pending restart was cancelled');
        await timers.fireAll();
        await manager.restart(true);
        assert.equal(world.handles.length, 1);

        const second = setup();
        await second.manager.ensureStarted();
        await second.manager.stop();
        assert.equal(second.world.last.stops, 1);
        assert.equal(second.manager.state, 'stopped');
    });
});
