// A small stand-in for the `vscode` module: just the API this extension touches, with state the tests
// can inspect (registered commands, messages shown, status bar items, settings) and drive.

/* eslint-disable @typescript-eslint/no-explicit-any */

import { Disposable, EventEmitter } from './events';
import { CancellationTokenSource } from './host';

export { Disposable, EventEmitter };

export enum StatusBarAlignment {
    Left = 1,
    Right = 2,
}
export enum ProgressLocation {
    SourceControl = 1,
    Window = 10,
    Notification = 15,
}
export enum ConfigurationTarget {
    Global = 1,
    Workspace = 2,
    WorkspaceFolder = 3,
}
export enum InlineCompletionTriggerKind {
    Invoke = 0,
    Automatic = 1,
}
export class ThemeColor {
    constructor(public readonly id: string) {}
}

export class Uri {
    private constructor(
        public readonly scheme: string,
        public readonly fsPath: string,
    ) {}
    static parse(value: string): Uri {
        const [scheme, rest] = value.split('://');
        return new Uri(scheme, decodeURIComponent(rest ?? ''));
    }
    static file(path: string): Uri {
        return new Uri('file', path);
    }
    toString(): string {
        return `${this.scheme}://${encodeURI(this.fsPath)}`;
    }
}

export interface StubStatusBarItem {
    id: string;
    text: string;
    tooltip: string | undefined;
    command: string | undefined;
    name: string | undefined;
    backgroundColor: ThemeColor | undefined;
    visible: boolean;
    disposed: boolean;
    show(): void;
    hide(): void;
    dispose(): void;
}

export interface StubLogChannel {
    name: string;
    lines: string[];
    shown: number;
    info(m: string): void;
    warn(m: string): void;
    error(m: string): void;
    debug(m: string): void;
    trace(m: string): void;
    append(m: string): void;
    appendLine(m: string): void;
    show(preserveFocus?: boolean): void;
    dispose(): void;
}

/** Everything the stub records; `reset()` between tests. */
export const stub = {
    commands: new Map<string, (...args: any[]) => any>(),
    executed: [] as { command: string; args: unknown[] }[],
    messages: [] as { level: 'info' | 'warning' | 'error'; text: string; actions: string[] }[],
    /** Answer the next message boxes with these choices (first in, first out); default undefined. */
    answers: [] as (string | undefined)[],
    /** Answer the next input boxes with these (first in, first out); default undefined (cancelled). */
    inputAnswers: [] as (string | undefined)[],
    inputBoxes: [] as { title?: string; prompt?: string; password?: boolean }[],
    statusItems: [] as StubStatusBarItem[],
    channels: [] as StubLogChannel[],
    progress: [] as { title: string; reports: { message?: string; increment?: number }[] }[],
    /** Called on every progress report with a function that cancels the notification (the user's ✕). */
    onProgressReport: undefined as ((report: { message?: string; increment?: number }, cancel: () => void) => void) | undefined,
    settings: new Map<string, unknown>(),
    workspaceSettings: new Map<string, unknown>(),
    updates: [] as { key: string; value: unknown; target: ConfigurationTarget }[],
    textDocuments: [] as any[],
    activeTextEditor: undefined as any,
    configChanged: new EventEmitter<{ affectsConfiguration(section: string): boolean }>(),
    documentOpened: new EventEmitter<any>(),
    documentChanged: new EventEmitter<any>(),
    documentClosed: new EventEmitter<any>(),
    /** `workspace.isTrusted` (VS Code's default for a folder it has not been told to trust: false). */
    isTrusted: false,
    trustGranted: new EventEmitter<void>(),
    /** Edits the language client asked VS Code to apply (workspace/applyEdit). */
    appliedEdits: [] as any[],
    shownDocuments: [] as unknown[],
    reset(): void {
        this.commands.clear();
        this.executed = [];
        this.messages = [];
        this.answers = [];
        this.inputAnswers = [];
        this.inputBoxes = [];
        this.statusItems = [];
        this.channels = [];
        this.progress = [];
        this.onProgressReport = undefined;
        this.settings.clear();
        this.workspaceSettings.clear();
        this.updates = [];
        this.textDocuments = [];
        this.activeTextEditor = undefined;
        this.configChanged.dispose();
        this.documentOpened.dispose();
        this.documentChanged.dispose();
        this.documentClosed.dispose();
        this.isTrusted = false;
        this.trustGranted.dispose();
        this.appliedEdits = [];
        this.shownDocuments = [];
    },
    /** Sets `section.key` (user scope) and fires onDidChangeConfiguration like VS Code does. */
    setSetting(key: string, value: unknown): void {
        this.settings.set(key, value);
        this.configChanged.fire({ affectsConfiguration: (s: string) => key === s || key.startsWith(`${s}.`) });
    },
};

function message(level: 'info' | 'warning' | 'error') {
    return (text: string, ...actions: string[]): Promise<string | undefined> => {
        stub.messages.push({ level, text, actions });
        return Promise.resolve(stub.answers.shift());
    };
}

export const window = {
    createOutputChannel(name: string): StubLogChannel {
        const lines: string[] = [];
        const channel: StubLogChannel = {
            name,
            lines,
            shown: 0,
            info: (m) => lines.push(`[info] ${m}`),
            warn: (m) => lines.push(`[warning] ${m}`),
            error: (m) => lines.push(`[error] ${m}`),
            debug: (m) => lines.push(`[debug] ${m}`),
            trace: (m) => lines.push(`[trace] ${m}`),
            append: (m) => lines.push(m),
            appendLine: (m) => lines.push(m),
            show: () => {
                channel.shown += 1;
            },
            dispose: () => undefined,
        };
        // What vscode-languageclient reads off a LogOutputChannel.
        Object.assign(channel, { logLevel: 3, onDidChangeLogLevel: new EventEmitter<number>().event, replace: () => undefined, clear: () => undefined, hide: () => undefined });
        stub.channels.push(channel);
        return channel;
    },
    createStatusBarItem(id: string): StubStatusBarItem {
        const item: StubStatusBarItem = {
            id,
            text: '',
            tooltip: undefined,
            command: undefined,
            name: undefined,
            backgroundColor: undefined,
            visible: false,
            disposed: false,
            show: () => {
                item.visible = true;
            },
            hide: () => {
                item.visible = false;
            },
            dispose: () => {
                item.disposed = true;
            },
        };
        stub.statusItems.push(item);
        return item;
    },
    showInformationMessage: message('info'),
    showWarningMessage: message('warning'),
    showErrorMessage: message('error'),
    showInputBox(options: { title?: string; prompt?: string; password?: boolean }): Promise<string | undefined> {
        stub.inputBoxes.push(options);
        return Promise.resolve(stub.inputAnswers.shift());
    },
    withProgress<T>(
        options: { title: string },
        task: (progress: { report(v: object): void }, token: CancellationTokenSource['token']) => Promise<T>,
    ): Promise<T> {
        const record = { title: options.title, reports: [] as { message?: string; increment?: number }[] };
        stub.progress.push(record);
        const source = new CancellationTokenSource();
        const report = (v: { message?: string; increment?: number }): void => {
            record.reports.push(v);
            stub.onProgressReport?.(v, () => source.cancel());
        };
        return task({ report }, source.token);
    },
    get activeTextEditor(): unknown {
        return stub.activeTextEditor;
    },
    showTextDocument: (doc: unknown): Promise<void> => {
        stub.shownDocuments.push(doc);
        return Promise.resolve();
    },
    visibleTextEditors: [] as unknown[],
    onDidChangeVisibleTextEditors: new EventEmitter<unknown>().event,
    onDidChangeActiveTextEditor: new EventEmitter<unknown>().event,
    tabGroups: { all: [] as unknown[], onDidChangeTabs: new EventEmitter<unknown>().event },
};

export const commands = {
    registerCommand(id: string, callback: (...args: any[]) => any): Disposable {
        if (stub.commands.has(id)) {
            // What VS Code does too.
            throw new Error(`command '${id}' already exists`);
        }
        stub.commands.set(id, callback);
        return new Disposable(() => {
            if (stub.commands.get(id) === callback) {
                stub.commands.delete(id);
            }
        });
    },
    async executeCommand(id: string, ...args: unknown[]): Promise<unknown> {
        stub.executed.push({ command: id, args });
        const handler = stub.commands.get(id);
        if (!handler) {
            throw new Error(`command '${id}' not found`);
        }
        return handler(...args);
    },
};

export const workspace = {
    getConfiguration(section: string) {
        const full = (key: string): string => `${section}.${key}`;
        return {
            get: (key: string, fallback?: unknown): unknown =>
                stub.workspaceSettings.get(full(key)) ?? stub.settings.get(full(key)) ?? fallback,
            inspect: (key: string) => ({
                key: full(key),
                globalValue: stub.settings.get(full(key)),
                workspaceValue: stub.workspaceSettings.get(full(key)),
                workspaceFolderValue: undefined,
            }),
            update: (key: string, value: unknown, target: ConfigurationTarget): Promise<void> => {
                stub.updates.push({ key: full(key), value, target });
                if (target === ConfigurationTarget.Workspace) {
                    stub.workspaceSettings.set(full(key), value);
                    stub.configChanged.fire({ affectsConfiguration: (s: string) => full(key) === s || full(key).startsWith(`${s}.`) });
                } else {
                    stub.setSetting(full(key), value);
                }
                return Promise.resolve();
            },
        };
    },
    onDidChangeConfiguration: (listener: (e: { affectsConfiguration(section: string): boolean }) => unknown) =>
        stub.configChanged.event(listener),
    onDidOpenTextDocument: (listener: (d: unknown) => unknown) => stub.documentOpened.event(listener),
    get isTrusted(): boolean {
        return stub.isTrusted;
    },
    onDidGrantWorkspaceTrust: (listener: () => unknown) => stub.trustGranted.event(listener),
    get textDocuments(): unknown[] {
        return stub.textDocuments;
    },
    onDidChangeTextDocument: (listener: (e: unknown) => unknown, thisArg?: unknown) => stub.documentChanged.event(listener, thisArg),
    onDidCloseTextDocument: (listener: (d: unknown) => unknown, thisArg?: unknown) => stub.documentClosed.event(listener, thisArg),
    onDidSaveTextDocument: new EventEmitter<unknown>().event,
    onWillSaveTextDocument: new EventEmitter<unknown>().event,
    onDidChangeWorkspaceFolders: new EventEmitter<unknown>().event,
    onDidOpenNotebookDocument: new EventEmitter<unknown>().event,
    onDidCloseNotebookDocument: new EventEmitter<unknown>().event,
    onDidSaveNotebookDocument: new EventEmitter<unknown>().event,
    onDidChangeNotebookDocument: new EventEmitter<unknown>().event,
    notebookDocuments: [] as unknown[],
    createFileSystemWatcher: () => ({
        onDidCreate: new EventEmitter<unknown>().event,
        onDidChange: new EventEmitter<unknown>().event,
        onDidDelete: new EventEmitter<unknown>().event,
        dispose: () => undefined,
    }),
    applyEdit: (edit: unknown): Promise<boolean> => {
        stub.appliedEdits.push(edit);
        return Promise.resolve(true);
    },
    workspaceFolders: undefined as unknown,
    openTextDocument: (what: unknown): Promise<unknown> =>
        Promise.resolve(stub.textDocuments.find((d) => d.uri.toString() === String(what)) ?? { uri: what }),
};

/** ExtensionContext.secrets: what activation passes on; each store and delete fires onDidChange, as in VS Code. */
export class StubSecretStorage {
    readonly values = new Map<string, string>();
    private readonly changed = new EventEmitter<{ key: string }>();
    readonly onDidChange = this.changed.event;

    get(key: string): Promise<string | undefined> {
        return Promise.resolve(this.values.get(key));
    }
    store(key: string, value: string): Promise<void> {
        this.values.set(key, value);
        this.changed.fire({ key });
        return Promise.resolve();
    }
    delete(key: string): Promise<void> {
        this.values.delete(key);
        this.changed.fire({ key });
        return Promise.resolve();
    }
}

type Pos = { line: number; character: number };

/** A TextDocument-shaped object for tests; getText(range) slices by line and UTF-16 column. */
export function makeDocument(path: string, languageId: string, text: string): any {
    const uri = Uri.file(path);
    const offset = (p: Pos): number => {
        const lines = text.split('\n');
        return lines.slice(0, p.line).reduce((n, l) => n + l.length + 1, 0) + p.character;
    };
    return {
        uri,
        fileName: path,
        languageId,
        version: 1,
        getText: (range?: { start: Pos; end: Pos }) => (range ? text.slice(offset(range.start), offset(range.end)) : text),
    };
}

export * from './host';
