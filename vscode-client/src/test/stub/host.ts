// The rest of the `vscode` API that vscode-languageclient itself touches when it loads, starts and
// runs features. With it, the real LanguageClient runs under plain Node (integration test
// languageClient.test.ts). Value classes keep the fields the client reads; the rest only need to exist.

/* eslint-disable @typescript-eslint/no-explicit-any */
/* eslint-disable @typescript-eslint/no-extraneous-class -- classes the client extends or checks with instanceof */

import { Disposable, EventEmitter } from './events';

export class Position {
    constructor(
        public readonly line: number,
        public readonly character: number,
    ) {}
}

export class Range {
    readonly start: Position;
    readonly end: Position;
    constructor(a: Position | number, b: Position | number, c?: number, d?: number) {
        if (typeof a === 'number') {
            this.start = new Position(a, b as number);
            this.end = new Position(c!, d!);
        } else {
            this.start = a;
            this.end = b as Position;
        }
    }
    get isEmpty(): boolean {
        return this.start.line === this.end.line && this.start.character === this.end.character;
    }
    get isSingleLine(): boolean {
        return this.start.line === this.end.line;
    }
}

export class Selection extends Range {}
export class Location {
    constructor(
        public uri: unknown,
        public range: unknown,
    ) {}
}
export class MarkdownString {
    constructor(
        public value = '',
        public supportThemeIcons = false,
    ) {}
    appendMarkdown(value: string): this {
        this.value += value;
        return this;
    }
    appendText(value: string): this {
        this.value += value;
        return this;
    }
}
export class Hover {
    constructor(
        public contents: unknown,
        public range?: Range,
    ) {}
}
export class TextEdit {
    constructor(
        public range: Range,
        public newText: string,
    ) {}
    static replace(range: Range, newText: string): TextEdit {
        return new TextEdit(range, newText);
    }
    static insert(position: Position, newText: string): TextEdit {
        return new TextEdit(new Range(position, position), newText);
    }
}
export class SnippetString {
    constructor(public value = '') {}
}
export class SnippetTextEdit {
    constructor(
        public range: Range,
        public snippet: SnippetString,
    ) {}
}
/** Records the operations; `entries()` gives [uri, TextEdit[]] pairs like VS Code's. */
export class WorkspaceEdit {
    readonly operations: { kind: string; uri: any; edits?: TextEdit[]; options?: unknown }[] = [];
    replace(uri: any, range: Range, newText: string): void {
        this.set(uri, [new TextEdit(range, newText)]);
    }
    insert(uri: any, position: Position, newText: string): void {
        this.set(uri, [TextEdit.insert(position, newText)]);
    }
    delete(uri: any, range: Range): void {
        this.set(uri, [new TextEdit(range, '')]);
    }
    /** Accepts VS Code's forms: TextEdit[] or [TextEdit, metadata][] (what the language client passes). */
    set(uri: any, edits: (TextEdit | [TextEdit, unknown])[]): void {
        this.operations.push({ kind: 'edit', uri, edits: edits.map((e) => (Array.isArray(e) ? e[0] : e)) });
    }
    createFile(uri: any, options?: unknown): void {
        this.operations.push({ kind: 'create', uri, options });
    }
    renameFile(): void {
        this.operations.push({ kind: 'rename', uri: undefined });
    }
    deleteFile(uri: any): void {
        this.operations.push({ kind: 'delete', uri });
    }
    entries(): [any, TextEdit[]][] {
        return this.operations.filter((o) => o.kind === 'edit').map((o) => [o.uri, o.edits!]);
    }
    get size(): number {
        return this.operations.length;
    }
}
export class InlineCompletionItem {
    constructor(
        public insertText: string | SnippetString,
        public range?: Range,
        public command?: unknown,
    ) {}
}
export class InlineCompletionList {
    constructor(public items: InlineCompletionItem[]) {}
}
export class CodeLens {
    constructor(
        public range: Range,
        public command?: unknown,
    ) {}
}
export class CompletionItem {
    constructor(public label: unknown) {}
}
export class CodeAction {
    constructor(
        public title: string,
        public kind?: unknown,
    ) {}
}
export class CodeActionKind {
    static readonly Empty = new CodeActionKind('');
    constructor(public readonly value: string) {}
    append(part: string): CodeActionKind {
        return new CodeActionKind(this.value ? `${this.value}.${part}` : part);
    }
}
export class Diagnostic {
    constructor(
        public range: Range,
        public message: string,
        public severity?: number,
    ) {}
}
export class DocumentLink {
    constructor(public range: Range) {}
}
export class InlayHint {
    constructor(public position: Position) {}
}
export class CallHierarchyItem {}
export class SymbolInformation {}
export class TypeHierarchyItem {}
export class RelativePattern {
    constructor(
        public base: unknown,
        public pattern: string,
    ) {}
}
export class CancellationError extends Error {}
export class CancellationTokenSource {
    private readonly emitter = new EventEmitter<void>();
    readonly token = { isCancellationRequested: false, onCancellationRequested: this.emitter.event };
    cancel(): void {
        if (!this.token.isCancellationRequested) {
            this.token.isCancellationRequested = true;
            this.emitter.fire();
        }
    }
    dispose(): void {
        this.emitter.dispose();
    }
}
export class TabInputText {}
export class TabInputTextDiff {}
export class TabInputCustom {}
export class TabInputNotebook {}

export enum LogLevel {
    Off = 0,
    Trace = 1,
    Debug = 2,
    Info = 3,
    Warning = 4,
    Error = 5,
}
export enum DiagnosticSeverity {
    Error = 0,
    Warning = 1,
    Information = 2,
    Hint = 3,
}
export enum TextDocumentSaveReason {
    Manual = 1,
    AfterDelay = 2,
    FocusOut = 3,
}

/** Providers the client registered, by API name (e.g. "registerInlineCompletionItemProvider"). */
export const registeredProviders = new Map<string, { selector: unknown; provider: any }[]>();

function globToRegExp(glob: string): RegExp {
    let out = '';
    for (let i = 0; i < glob.length; i++) {
        const c = glob[i];
        if (c === '*' && glob[i + 1] === '*') {
            out += '.*';
            i += glob[i + 2] === '/' ? 2 : 1;
        } else if (c === '*') {
            out += '[^/]*';
        } else if (c === '{') {
            out += '(';
        } else if (c === '}') {
            out += ')';
        } else if (c === ',') {
            out += '|';
        } else {
            out += c.replace(/[.+?^$()|[\]\\]/g, '\\$&');
        }
    }
    return new RegExp(`^${out}$`);
}

function matchFilter(filter: any, doc: any): boolean {
    if (typeof filter === 'string') {
        return filter === doc.languageId || filter === '*';
    }
    if (filter.language && filter.language !== doc.languageId) {
        return false;
    }
    if (filter.scheme && filter.scheme !== doc.uri.scheme) {
        return false;
    }
    if (filter.pattern && !globToRegExp(String(filter.pattern.pattern ?? filter.pattern)).test(doc.uri.fsPath)) {
        return false;
    }
    return Boolean(filter.language || filter.scheme || filter.pattern);
}

const languagesBase = {
    match(selector: any, doc: any): number {
        const filters = Array.isArray(selector) ? selector : [selector];
        return filters.some((f) => matchFilter(f, doc)) ? 10 : 0;
    },
    createDiagnosticCollection: () => {
        const entries = new Map<string, unknown>();
        return {
            set: (uri: any, d: unknown) => entries.set(String(uri), d),
            delete: (uri: any) => entries.delete(String(uri)),
            clear: () => entries.clear(),
            forEach: () => undefined,
            get: (uri: any) => entries.get(String(uri)),
            has: (uri: any) => entries.has(String(uri)),
            dispose: () => entries.clear(),
        };
    },
};

/** Every `languages.registerXProvider` records its provider and returns a Disposable. */
export const languages: any = new Proxy(languagesBase, {
    get(target: any, name: string) {
        if (name in target) {
            return target[name];
        }
        if (name.startsWith('register')) {
            return (selector: unknown, provider: unknown) => {
                const list = registeredProviders.get(name) ?? [];
                const entry = { selector, provider };
                list.push(entry);
                registeredProviders.set(name, list);
                return new Disposable(() => list.splice(list.indexOf(entry), 1));
            };
        }
        return undefined;
    },
});

const logLevelChanged = new EventEmitter<LogLevel>();
export const env = {
    language: 'en',
    appName: 'vscode-stub',
    appRoot: '',
    uriScheme: 'vscode',
    machineId: 'stub',
    sessionId: 'stub',
    logLevel: LogLevel.Info,
    onDidChangeLogLevel: logLevelChanged.event,
    openExternal: (): Promise<boolean> => Promise.resolve(false),
};

/** The VS Code version the client checks against its engines range. */
export const version = '1.91.0';
