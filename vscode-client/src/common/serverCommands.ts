// Running a server command from the palette: a cancellable progress notification fed by the server's
// work-done progress, then the outcome as a message.

import { randomUUID } from 'crypto';
import type { CancellationToken } from 'vscode';
import { LSPErrorCodes, ResponseError } from 'vscode-languageserver-protocol';
import type { ServerHandle, WorkDoneValue } from './client';
import { ServerCommand, ServerCommands } from './protocol';

export const COMMAND_TITLES: Record<ServerCommand, string> = {
    [ServerCommands.fillAllMasks]: 'DICE: filling all masks',
    [ServerCommands.fillMask]: 'DICE: filling the mask',
    [ServerCommands.generateKernel]: 'DICE: generating a CUDA kernel',
    [ServerCommands.validateKernel]: 'DICE: validating the kernel',
};

export interface ProgressSink {
    report(value: { message?: string; increment?: number }): void;
}

/** Turns LSP work-done values (absolute percentages) into VS Code's increments. */
export class ProgressTranslator {
    private percent = 0;

    constructor(private readonly sink: ProgressSink) {}

    accept(value: WorkDoneValue): void {
        if (value.kind === 'end') {
            return;
        }
        const increment =
            typeof value.percentage === 'number' ? Math.max(0, Math.min(100, value.percentage) - this.percent) : undefined;
        if (increment !== undefined) {
            this.percent += increment;
        }
        this.sink.report({ message: value.message, increment });
    }
}

export type CommandOutcome =
    | { kind: 'done'; result: unknown }
    | { kind: 'cancelled' }
    | { kind: 'failed'; message: string };

export interface CommandRunnerDeps {
    withProgress<T>(title: string, task: (progress: ProgressSink, token: CancellationToken) => Thenable<T>): Thenable<T>;
    newToken?(): string;
}

export async function runWithProgress(
    handle: ServerHandle,
    command: ServerCommand,
    args: unknown[],
    deps: CommandRunnerDeps,
): Promise<CommandOutcome> {
    return deps.withProgress(COMMAND_TITLES[command], async (progress, token) => {
        const workDoneToken = deps.newToken?.() ?? `dice-${randomUUID()}`;
        const translator = new ProgressTranslator(progress);
        const subscription = handle.onWorkDoneProgress(workDoneToken, (value) => translator.accept(value));
        try {
            const result = await handle.executeCommand(command, args, workDoneToken, token);
            return { kind: 'done', result } as const;
        } catch (error) {
            if (token.isCancellationRequested || (error instanceof ResponseError && error.code === LSPErrorCodes.RequestCancelled)) {
                return { kind: 'cancelled' } as const;
            }
            return { kind: 'failed', message: error instanceof Error ? error.message : String(error) } as const;
        } finally {
            subscription.dispose();
        }
    });
}

/**
 * A one-line summary of a command's result for the log. The server shows its own messages (results,
 * warnings, errors) through window/showMessage, so the client does not pop up a second one.
 * Result shapes (lsp_server/commands.py): {ok, message} on failure; {ok, applied, filled, skipped} for
 * fills; {ok, uri, path, verdict, label} for generation; {ok, verdict, label} for validation.
 */
export function describeResult(result: unknown): string | undefined {
    if (typeof result !== 'object' || result === null) {
        return typeof result === 'string' && result.length > 0 ? result : undefined;
    }
    const r = result as Record<string, unknown>;
    const parts: string[] = [];
    if (r.ok === false) {
        parts.push('failed');
    }
    if (Array.isArray(r.filled)) {
        parts.push(`filled ${r.filled.length} mask(s)${r.applied === false ? ' (not applied)' : ''}`);
    }
    if (Array.isArray(r.skipped) && r.skipped.length > 0) {
        parts.push(`skipped ${r.skipped.length}`);
    }
    if (typeof r.path === 'string') {
        parts.push(`wrote ${r.path}`);
    }
    for (const key of ['label', 'message']) {
        if (typeof r[key] === 'string' && r[key].length > 0) {
            parts.push(r[key]);
        }
    }
    return parts.length > 0 ? parts.join(', ') : undefined;
}
