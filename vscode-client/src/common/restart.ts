// When to restart a crashed server, and a runner that never lets two restarts overlap.

export interface Timer {
    dispose(): void;
}

export function realTimer(callback: () => void, ms: number): Timer {
    const t = setTimeout(callback, ms);
    return { dispose: () => clearTimeout(t) };
}

export interface RestartPolicyOptions {
    /** Crashes tolerated inside `windowMs` before giving up. */
    maxCrashes: number;
    windowMs: number;
    /** Delay before the first restart; doubles per crash in the window, capped at `maxDelayMs`. */
    baseDelayMs: number;
    maxDelayMs: number;
}

export const DEFAULT_RESTART_POLICY: Readonly<RestartPolicyOptions> = Object.freeze({
    maxCrashes: 5,
    windowMs: 3 * 60_000,
    baseDelayMs: 500,
    maxDelayMs: 8_000,
});

export type CrashDecision = { action: 'restart'; delayMs: number; crashes: number } | { action: 'giveUp'; crashes: number };

export class RestartPolicy {
    private crashes: number[] = [];

    constructor(private readonly options: RestartPolicyOptions = DEFAULT_RESTART_POLICY) {}

    /** Records a crash at `now` (ms) and says what to do about it. */
    onCrash(now: number): CrashDecision {
        this.crashes = this.crashes.filter((t) => now - t < this.options.windowMs);
        this.crashes.push(now);
        const count = this.crashes.length;
        if (count > this.options.maxCrashes) {
            return { action: 'giveUp', crashes: count };
        }
        const delayMs = Math.min(this.options.baseDelayMs * 2 ** (count - 1), this.options.maxDelayMs);
        return { action: 'restart', delayMs, crashes: count };
    }

    /** A restart the user asked for starts a fresh budget. */
    reset(): void {
        this.crashes = [];
    }
}

/**
 * Runs an async task so that at most one instance is in flight. Calls made while it runs are
 * coalesced into exactly one further run after it (the latest request wins: e.g. a settings change
 * during a restart still gets a server started with the new settings).
 */
export class SerialRunner {
    private current: Promise<void> | undefined;
    private rerun = false;

    constructor(private readonly task: () => Promise<void>) {}

    get running(): boolean {
        return this.current !== undefined;
    }

    /** Waits for the run in flight (if any) without asking for another. */
    settled(): Promise<void> {
        return (this.current ?? Promise.resolve()).catch(() => undefined);
    }

    run(): Promise<void> {
        if (this.current) {
            this.rerun = true;
            return this.current;
        }
        this.current = this.loop().finally(() => {
            this.current = undefined;
        });
        return this.current;
    }

    private async loop(): Promise<void> {
        // Only the outcome of the last run matters: it reflects the latest request.
        let failure: { error: unknown } | undefined;
        do {
            this.rerun = false;
            failure = undefined;
            try {
                await this.task();
            } catch (error) {
                failure = { error };
            }
        } while (this.rerun);
        if (failure) {
            throw failure.error;
        }
    }
}
