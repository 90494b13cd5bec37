// How an inline request ended, as the server tells it (docs/INTERNALS.md, "LSP ⟷ clients"):
// `dice/suggestionStatus` after every request that ran the model, and the client-only command
// `dice.suggestionAccepted` that every inline item carries (its title is the candidate's verdict label).
// No `vscode` import: pure parsing and wording, unit-tested on its own.

import { NotificationType } from 'vscode-languageserver-protocol';

/** Client-only: runs when an inline item is accepted; only carries its label. */
export const SUGGESTION_ACCEPTED_COMMAND = 'dice.suggestionAccepted';

/** The argument of `dice.suggestionAccepted`. `usable` false: the candidate failed validation and was shown
 * only because `dice.showFailingSuggestions` asks for the best failing one when none is usable. */
export interface SuggestionAccepted {
    uri: string;
    label: string;
    usable: boolean;
}

/** Payload of the server -> client `dice/suggestionStatus` notification. */
export interface SuggestionStatus {
    uri: string;
    position: { line: number; character: number };
    candidates: number;
    usable: number;
    shown: number;
    /** Set when no candidate is usable, e.g. "3 candidates, none compiled: k.cu(40): error: ..." */
    message: string | null;
}
export const SuggestionStatusNotification = new NotificationType<SuggestionStatus>('dice/suggestionStatus');

const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= 0;

/** Validates a `dice/suggestionStatus` payload; undefined when it does not follow the contract. */
export function parseSuggestionStatus(payload: unknown): SuggestionStatus | undefined {
    if (typeof payload !== 'object' || payload === null) {
        return undefined;
    }
    const p = payload as Record<string, unknown>;
    const pos = p.position as Record<string, unknown> | null | undefined;
    if (typeof p.uri !== 'string' || p.uri.length === 0 || typeof pos !== 'object' || pos === null) {
        return undefined;
    }
    if (!isCount(pos.line) || !isCount(pos.character) || !isCount(p.candidates) || !isCount(p.usable) || !isCount(p.shown)) {
        return undefined;
    }
    if (p.message !== null && p.message !== undefined && typeof p.message !== 'string') {
        return undefined;
    }
    const message = typeof p.message === 'string' && p.message.trim().length > 0 ? p.message.trim() : null;
    return {
        uri: p.uri,
        position: { line: pos.line, character: pos.character },
        candidates: p.candidates,
        usable: p.usable,
        shown: p.shown,
        message,
    };
}

/** The argument of a `dice.suggestionAccepted` call, tolerating missing fields (it is only logged). */
export function parseAccepted(args: unknown[]): SuggestionAccepted | undefined {
    const a = args[0];
    if (typeof a !== 'object' || a === null) {
        return undefined;
    }
    const r = a as Record<string, unknown>;
    if (typeof r.label !== 'string') {
        return undefined;
    }
    return { uri: typeof r.uri === 'string' ? r.uri : '', label: r.label, usable: r.usable !== false };
}

function fileName(uri: string): string {
    const last = uri.split('/').pop() ?? uri;
    try {
        return decodeURIComponent(last);
    } catch {
        return last;
    }
}

/** A log line for an accepted suggestion. */
export function describeAccepted(accepted: SuggestionAccepted): string {
    const where = accepted.uri ? ` in ${fileName(accepted.uri)}` : '';
    return `Accepted a suggestion${where}: ${accepted.label}${accepted.usable ? '' : ' (it failed validation)'}`;
}

/** A log line for a suggestion status with a message: where (1-based, as editors show it) and why. */
export function describeSuggestionStatus(status: SuggestionStatus): string {
    const { line, character } = status.position;
    return `No usable suggestion at ${fileName(status.uri)}:${line + 1}:${character + 1}: ${status.message ?? ''}`.trimEnd();
}

/** Cuts `text` to `limit` characters (with an ellipsis) for the status bar. */
export function shorten(text: string, limit = 60): string {
    const chars = Array.from(text);
    return chars.length <= limit ? text : `${chars.slice(0, limit - 1).join('')}…`;
}
