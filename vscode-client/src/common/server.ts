// Owns the server process: start on demand, restart on crash with backoff (never two at once),
// push settings live, stop on deactivate.

import type { LogOutputChannel } from 'vscode';
import type { Middleware } from 'vscode-languageclient';
import { SERVER_API_KEY_ENV } from './apiKey';
import { HandleFactory, ServerHandle } from './client';
import { DiceServerSettings } from './protocol';
import { realTimer, RestartPolicy, SerialRunner, Timer } from './restart';
import { ServerLaunch } from './settings';
import type { ClientPhase } from './status';

export interface ServerManagerDeps {
    createHandle: HandleFactory;
    /** Read at each start (the API key comes from the SecretStorage, which answers asynchronously). */
    launch(): ServerLaunch | Promise<ServerLaunch>;
    settings(): DiceServerSettings;
    middleware: Middleware;
    log: LogOutputChannel;
    onPhase(phase: ClientPhase): void;
    onStatus(payload: unknown): void;
    onSuggestionStatus?(payload: unknown): void;
    /** Called before a process starts and after one is gone (palette fallbacks hang off these). */
    beforeStart?(): void;
    afterStop?(): void;
    onGiveUp(message: string): void;
    policy?: RestartPolicy;
    now?(): number;
    setTimer?(callback: () => void, ms: number): Timer;
}

export class ServerManager {
    private handle: ServerHandle | undefined;
    private readonly crashed = new WeakSet<ServerHandle>();
    private readonly started = new WeakSet<ServerHandle>();
    private readonly restarter: SerialRunner;
    private readonly policy: RestartPolicy;
    private pendingRestart: Timer | undefined;
    private disposed = false;
    private phase: ClientPhase = 'idle';

    constructor(private readonly deps: ServerManagerDeps) {
        this.policy = deps.policy ?? new RestartPolicy();
        this.restarter = new SerialRunner(() => this.replaceServer());
    }

    get state(): ClientPhase {
        return this.phase;
    }

    get current(): ServerHandle | undefined {
        return this.handle?.running ? this.handle : undefined;
    }

    /** Starts the server unless one is running or starting. */
    async ensureStarted(): Promise<void> {
        if (this.restarter.running) {
            await this.restarter.settled();
        } else if (this.phase === 'idle' || (this.phase === 'stopped' && !this.pendingRestart)) {
            await this.restart(false);
        }
    }

    /** `manual`: the user asked, so a server that gave up after crashing gets a fresh budget. */
    async restart(manual: boolean): Promise<void> {
        if (this.disposed) {
            return;
        }
        if (manual) {
            this.policy.reset();
        }
        this.cancelPendingRestart();
        await this.restarter.run();
    }

    async pushSettings(): Promise<void> {
        const handle = this.current;
        if (handle) {
            await handle.pushSettings(this.deps.settings());
        }
    }

    async stop(): Promise<void> {
        this.disposed = true;
        this.cancelPendingRestart();
        await this.stopCurrent();
        this.setPhase('stopped');
    }

    private async replaceServer(): Promise<void> {
        await this.stopCurrent();
        if (this.disposed) {
            return;
        }
        let launch: ServerLaunch;
        try {
            launch = await this.deps.launch();
        } catch (error) {
            this.deps.log.error(`Cannot prepare the DICE server's command line: ${String(error)}`);
            this.setPhase('failed');
            this.deps.onGiveUp(`cannot start the server: ${String(error)}`);
            return;
        }
        if (this.disposed) {
            return;
        }
        // Never the environment itself: it may hold the model server's API key.
        const withKey = launch.env?.[SERVER_API_KEY_ENV] !== undefined ? ` (with $${SERVER_API_KEY_ENV} from the secret storage)` : '';
        this.deps.log.info(`Starting the DICE server: ${[launch.command, ...launch.args].join(' ')}${withKey}`);
        this.deps.beforeStart?.();
        this.setPhase('starting');
        let handle: ServerHandle;
        try {
            handle = this.createHandle(launch);
        } catch (error) {
            // Not a crash: retrying the same construction would fail the same way.
            this.deps.log.error(`Cannot create the DICE language client: ${String(error)}`);
            this.setPhase('failed');
            this.deps.onGiveUp(`cannot start the server: ${String(error)}`);
            return;
        }
        this.handle = handle;
        try {
            await handle.start();
            if (this.handle === handle && handle.running) {
                this.deps.log.info(`The DICE server is running (pid ${handle.pid ?? 'unknown'}).`);
                this.setPhase('running');
            }
        } catch (error) {
            this.deps.log.error(`The DICE server did not start: ${String(error)}`);
            // A process that answered initialize with an error is still alive: the client reaps it on stop.
            handle.stop().catch(() => undefined);
            this.onCrash(handle);
        }
        if (this.handle === handle && handle.running) {
            this.started.add(handle);
        }
    }

    private createHandle(launch: ServerLaunch): ServerHandle {
        const handle: ServerHandle = this.deps.createHandle({
            launch,
            settings: this.deps.settings(),
            log: this.deps.log,
            middleware: this.deps.middleware,
            onUnexpectedClose: () => this.onCrash(handle),
            onStatus: (payload) => {
                if (this.handle === handle) {
                    this.deps.onStatus(payload);
                }
            },
            onSuggestionStatus: (payload) => {
                if (this.handle === handle) {
                    this.deps.onSuggestionStatus?.(payload);
                }
            },
            onRunning: () => {
                this.started.add(handle);
                if (this.handle === handle) {
                    this.setPhase('running');
                }
            },
        });
        return handle;
    }

    private async stopCurrent(): Promise<void> {
        const handle = this.handle;
        this.handle = undefined;
        if (!handle) {
            return;
        }
        try {
            await handle.stop();
        } catch (error) {
            this.deps.log.warn(`Stopping the DICE server failed: ${String(error)}`);
        }
        this.deps.afterStop?.();
    }

    /** Once per process: both the client's close event and a failed start may report the same death. */
    private onCrash(handle: ServerHandle): void {
        if (this.crashed.has(handle) || this.disposed) {
            return;
        }
        this.crashed.add(handle);
        if (this.handle === handle) {
            this.handle = undefined;
            // The client disposes its command registrations only after its close handler returns.
            this.timer(() => {
                if (this.handle === undefined && !this.disposed) {
                    this.deps.afterStop?.();
                }
            }, 0);
        }
        if (!this.started.has(handle)) {
            // Never got as far as initialize: a wrong interpreter or a missing package, which retrying
            // does not fix.
            this.setPhase('failed');
            this.deps.onGiveUp(
                'the server did not start. Check dice.server.pythonPath (an interpreter with the dice-cuda package) ' +
                    'or dice.server.command; the log has the details.',
            );
            return;
        }
        const decision = this.policy.onCrash((this.deps.now ?? Date.now)());
        if (decision.action === 'giveUp') {
            this.setPhase('failed');
            this.deps.onGiveUp(
                `The DICE server stopped ${decision.crashes} times in a few minutes and will not be restarted. See the log.`,
            );
            return;
        }
        this.setPhase('stopped');
        this.deps.log.warn(`The DICE server stopped unexpectedly; restarting in ${decision.delayMs} ms.`);
        this.cancelPendingRestart();
        this.pendingRestart = this.timer(() => {
            this.pendingRestart = undefined;
            this.restarter.run().catch((error) => this.deps.log.error(`Restart failed: ${String(error)}`));
        }, decision.delayMs);
    }

    private timer(callback: () => void, ms: number): Timer {
        return (this.deps.setTimer ?? realTimer)(callback, ms);
    }

    private cancelPendingRestart(): void {
        this.pendingRestart?.dispose();
        this.pendingRestart = undefined;
    }

    private setPhase(phase: ClientPhase): void {
        if (phase === this.phase) {
            return;
        }
        this.phase = phase;
        this.deps.onPhase(phase);
    }
}
