// Everything custom about the language client goes through its middleware: gating automatic inline
// completions and making mask fills drawable (ghostText.ts), filling palette-command arguments from the
// editor, and answering workspace/configuration.

import type { Middleware } from 'vscode-languageclient';
import { asInsertions } from './ghostText';
import { CONFIG_SECTION, DiceServerSettings, isServerCommand, ServerCommand, ServerCommands } from './protocol';
import { isAutomaticInlineTrigger } from './vscodeapi';

/** The editor state a palette command or keybinding runs against. */
export interface EditorContext {
    uri: string;
    line: number;
    character: number;
}

export type ArgumentResult = { ok: true; args: unknown[] } | { ok: false; reason: string };

/** A URI as the server expects it: the string form. Explorer menus pass a vscode.Uri object. */
function uriString(value: unknown): string | undefined {
    if (typeof value === 'string' && value.length > 0) {
        return value;
    }
    if (typeof value === 'object' && value !== null && 'scheme' in value && typeof value.toString === 'function') {
        return value.toString();
    }
    return undefined;
}

/**
 * Code lenses from the server arrive with their arguments; palette entries and keybindings arrive with
 * none, so take the active editor's document (and cursor, for fillMask).
 */
export function completeArguments(command: ServerCommand, args: unknown[], editor: EditorContext | undefined): ArgumentResult {
    const uri = uriString(args[0]) ?? editor?.uri;
    if (uri === undefined) {
        return { ok: false, reason: 'Open a CUDA file (or a KernelBench reference for generation) first.' };
    }
    if (command !== ServerCommands.fillMask) {
        return { ok: true, args: [uri, ...args.slice(1)] };
    }
    const position = args[1] ?? (editor && editor.uri === uri ? { line: editor.line, character: editor.character } : undefined);
    if (position === undefined) {
        return { ok: false, reason: 'Place the cursor on a mask or inside a kernel body first.' };
    }
    return { ok: true, args: [uri, position, ...args.slice(2)] };
}

export interface MiddlewareDeps {
    automaticSuggestions(): boolean;
    serverSettings(): DiceServerSettings;
    activeEditor(): EditorContext | undefined;
    /** Runs a server command with progress and shows its outcome. */
    runServerCommand(command: ServerCommand, args: unknown[]): Promise<unknown>;
    warn(message: string): void;
}

export function createMiddleware(deps: MiddlewareDeps): Middleware {
    return {
        provideInlineCompletionItems: async (document, position, context, token, next) => {
            if (isAutomaticInlineTrigger(context) && !deps.automaticSuggestions()) {
                return [];
            }
            return asInsertions(await next(document, position, context, token), document, position);
        },
        executeCommand: async (command, args, next) => {
            if (!isServerCommand(command)) {
                return next(command, args);
            }
            const completed = completeArguments(command, args, deps.activeEditor());
            if (!completed.ok) {
                deps.warn(`DICE: ${completed.reason}`);
                return undefined;
            }
            return deps.runServerCommand(command, completed.args);
        },
        workspace: {
            // The server may pull settings instead of reading them from didChangeConfiguration: give it the
            // same validated object, not the raw section (which also holds client-only keys).
            configuration: async (params, token, next) => {
                const raw = await next(params, token);
                if (!Array.isArray(raw)) {
                    return raw;
                }
                return params.items.map((item, i) => (item.section === CONFIG_SECTION ? deps.serverSettings() : raw[i]));
            },
        },
    };
}
