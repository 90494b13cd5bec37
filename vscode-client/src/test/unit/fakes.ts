// A fake ServerHandle that behaves like the language client where the extension can tell: it registers
// the server's commands on start (as ExecuteCommandFeature does) and routes them through the middleware.

import type { CancellationToken } from 'vscode';
import type { HandleFactory, HandleOptions, ServerHandle, WorkDoneValue } from '../../common/client';
import { DiceServerSettings, ServerCommands } from '../../common/protocol';
import { commands, Disposable } from '../stub/vscode';

export interface FakeServerScript {
    /** Makes start() reject (e.g. python not found). */
    failStart?: boolean;
    /** Resolves start() only when the test calls `release()`. */
    holdStart?: boolean;
    /** What executeCommand answers; progress values are sent first. */
    answer?: (command: string, args: unknown[]) => unknown;
    progress?: WorkDoneValue[];
    /** False: an older server whose executeCommandProvider lacks the DICE commands. */
    advertise?: boolean;
}

export class FakeHandle implements ServerHandle {
    running = false;
    readonly pid = undefined;
    starts = 0;
    stops = 0;
    pushed: DiceServerSettings[] = [];
    executed: { command: string; args: unknown[]; workDoneToken: string }[] = [];
    private registrations: Disposable[] = [];
    private progressHandlers = new Map<string, (v: WorkDoneValue) => void>();
    private releaseStart: (() => void) | undefined;

    constructor(
        readonly options: HandleOptions,
        private readonly script: FakeServerScript,
        private readonly world: FakeWorld,
    ) {}

    async start(): Promise<void> {
        this.starts += 1;
        this.world.inFlight += 1;
        this.world.maxInFlight = Math.max(this.world.maxInFlight, this.world.inFlight);
        try {
            if (this.script.holdStart) {
                await new Promise<void>((resolve) => (this.releaseStart = resolve));
            }
            await Promise.resolve();
            if (this.script.failStart) {
                throw new Error('spawn python3 ENOENT');
            }
            // Throws if the extension left its fallbacks registered: exactly VS Code's behaviour.
            for (const id of this.script.advertise === false ? [] : Object.values(ServerCommands)) {
                this.registrations.push(
                    commands.registerCommand(id, (...args: unknown[]) =>
                        this.options.middleware.executeCommand!(id, args, () => Promise.resolve('next-called')),
                    ),
                );
            }
            this.running = true;
            this.options.onRunning();
        } finally {
            this.world.inFlight -= 1;
        }
    }

    release(): void {
        this.releaseStart?.();
    }

    async stop(): Promise<void> {
        this.stops += 1;
        this.running = false;
        this.dropRegistrations();
    }

    /** The process died: the client calls the close handler, then cleans up its registrations. */
    crash(): void {
        this.running = false;
        this.options.onUnexpectedClose();
        this.dropRegistrations();
    }

    async executeCommand(command: string, args: unknown[], workDoneToken: string, _token: CancellationToken): Promise<unknown> {
        this.executed.push({ command, args, workDoneToken });
        for (const value of this.script.progress ?? []) {
            this.progressHandlers.get(workDoneToken)?.(value);
        }
        return this.script.answer?.(command, args);
    }

    onWorkDoneProgress(workDoneToken: string, handler: (value: WorkDoneValue) => void): Disposable {
        this.progressHandlers.set(workDoneToken, handler);
        return new Disposable(() => this.progressHandlers.delete(workDoneToken));
    }

    async pushSettings(settings: DiceServerSettings): Promise<void> {
        this.pushed.push(settings);
    }

    private dropRegistrations(): void {
        this.registrations.forEach((d) => d.dispose());
        this.registrations = [];
    }
}

export class FakeWorld {
    handles: FakeHandle[] = [];
    inFlight = 0;
    maxInFlight = 0;
    script: FakeServerScript = {};

    readonly factory: HandleFactory = (options) => {
        const handle = new FakeHandle(options, { ...this.script }, this);
        this.handles.push(handle);
        return handle;
    };

    get last(): FakeHandle {
        return this.handles[this.handles.length - 1];
    }
}

/** Lets pending promise callbacks and zero-delay timers run. */
export function settle(ms = 0): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, ms));
}
