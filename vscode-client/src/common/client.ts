// The one place that constructs a vscode-languageclient LanguageClient; the rest of the extension
// sees it through the small ServerHandle interface (which the unit tests fake).

import type { CancellationToken, Disposable, LogOutputChannel } from 'vscode';
import {
    CloseAction,
    DidChangeConfigurationNotification,
    ErrorAction,
    ExecuteCommandRequest,
    LanguageClient,
    LanguageClientOptions,
    Middleware,
    RevealOutputChannelOn,
    State,
    WorkDoneProgress,
} from 'vscode-languageclient/node';
import type { WorkDoneProgressBegin, WorkDoneProgressEnd, WorkDoneProgressReport } from 'vscode-languageclient/node';
import { DOCUMENT_SELECTOR } from './documents';
import { CONFIG_SECTION, DiceServerSettings, DiceStatusNotification } from './protocol';
import { ServerLaunch } from './settings';
import { SuggestionStatusNotification } from './suggestionStatus';

export type WorkDoneValue = WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd;

export interface ServerHandle {
    start(): Promise<void>;
    /** Asks the server to shut down and exit; kills it after the client's grace period. */
    stop(): Promise<void>;
    readonly running: boolean;
    /** The server's process id while it runs (for the log and for tests that kill it). */
    readonly pid: number | undefined;
    executeCommand(command: string, args: unknown[], workDoneToken: string, token: CancellationToken): Promise<unknown>;
    onWorkDoneProgress(workDoneToken: string, handler: (value: WorkDoneValue) => void): Disposable;
    pushSettings(settings: DiceServerSettings): Promise<void>;
}

export interface HandleOptions {
    launch: ServerLaunch;
    settings: DiceServerSettings;
    log: LogOutputChannel;
    middleware: Middleware;
    /** The server went away without being asked to: the owner decides about restarting. */
    onUnexpectedClose(): void;
    onStatus(payload: unknown): void;
    /** A raw `dice/suggestionStatus` payload (validated by the receiver). */
    onSuggestionStatus(payload: unknown): void;
    onRunning(): void;
}

export type HandleFactory = (options: HandleOptions) => ServerHandle;

export const createLanguageClientHandle: HandleFactory = (options) => {
    const clientOptions: LanguageClientOptions = {
        documentSelector: DOCUMENT_SELECTOR,
        outputChannel: options.log,
        revealOutputChannelOn: RevealOutputChannelOn.Never,
        initializationOptions: options.settings,
        middleware: options.middleware,
        // Restarts belong to ServerManager (backoff, one at a time), not to the client's default policy.
        errorHandler: {
            error: () => ({ action: ErrorAction.Continue }),
            closed: () => {
                options.onUnexpectedClose();
                return { action: CloseAction.DoNotRestart, handled: true };
            },
        },
    };
    const client = new LanguageClient(
        'dice',
        'DICE',
        {
            command: options.launch.command,
            args: options.launch.args,
            options: options.launch.env ? { env: options.launch.env } : undefined,
        },
        clientOptions,
    );
    client.onNotification(DiceStatusNotification, (payload) => options.onStatus(payload));
    client.onNotification(SuggestionStatusNotification, (payload) => options.onSuggestionStatus(payload));
    client.onDidChangeState((e) => {
        if (e.newState === State.Running) {
            options.onRunning();
        }
    });
    return {
        start: () => client.start(),
        stop: () => (client.state === State.Stopped ? Promise.resolve() : client.stop()),
        get running() {
            return client.state === State.Running;
        },
        get pid() {
            return client.serverProcess?.pid;
        },
        executeCommand: (command, args, workDoneToken, token) =>
            client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args, workDoneToken }, token),
        onWorkDoneProgress: (workDoneToken, handler) => client.onProgress(WorkDoneProgress.type, workDoneToken, handler),
        pushSettings: (settings) =>
            client.sendNotification(DidChangeConfigurationNotification.type, { settings: { [CONFIG_SECTION]: settings } }),
    };
};
