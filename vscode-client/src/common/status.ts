// The status bar item: what the server says over `dice/status`, plus the client's own view of it, plus
// why the last inline request gave nothing usable (`dice/suggestionStatus` with a message), shown in the
// warning colour until the next suggestion status or an edit of that document.

import type { StatusBarItem } from 'vscode';
import { ClientCommands, DICE_STATES, DiceStatus } from './protocol';
import { shorten, SuggestionStatus } from './suggestionStatus';
import { createStatusBarItem, themeColor } from './vscodeapi';

/** The language client's lifecycle as this extension sees it. */
export type ClientPhase = 'idle' | 'starting' | 'running' | 'stopped' | 'failed';

export interface StatusView {
    text: string;
    tooltip: string;
    severity: 'normal' | 'warning' | 'error';
}

/** Why the last inline request in `uri` gave nothing usable. */
export interface SuggestionNote {
    uri: string;
    message: string;
}

export interface StatusInput {
    phase: ClientPhase;
    status: DiceStatus | undefined;
    automatic: boolean;
    suggestion?: SuggestionNote;
}

/** Validates a `dice/status` payload from the wire; undefined when it does not follow the contract. */
export function parseStatus(payload: unknown): DiceStatus | undefined {
    if (typeof payload !== 'object' || payload === null) {
        return undefined;
    }
    const p = payload as Record<string, unknown>;
    if (!DICE_STATES.includes(p.state as DiceStatus['state'])) {
        return undefined;
    }
    const text = (v: unknown): string | null => (typeof v === 'string' && v.length > 0 ? v : null);
    return { state: p.state as DiceStatus['state'], model: text(p.model), device: text(p.device), message: text(p.message) };
}

function headline(input: StatusInput): Pick<StatusView, 'text' | 'severity'> {
    const { phase, status } = input;
    if (phase === 'failed') {
        return { text: '$(error) DICE: server failed', severity: 'error' };
    }
    if (phase === 'stopped') {
        return { text: '$(debug-disconnect) DICE: stopped', severity: 'warning' };
    }
    if (phase === 'idle') {
        return { text: '$(circle-outline) DICE', severity: 'normal' };
    }
    if (phase === 'starting' || status === undefined) {
        return { text: '$(loading~spin) DICE: starting', severity: 'normal' };
    }
    const model = status.model ?? 'model';
    switch (status.state) {
        case 'loading':
            return { text: `$(loading~spin) DICE: loading${status.model ? ` ${status.model}` : ""}`, severity: "normal" };
        case 'busy':
            return { text: '$(sync~spin) DICE: generating', severity: 'normal' };
        case 'validating':
            return { text: '$(beaker) DICE: validating', severity: 'normal' };
        case 'error':
            return { text: '$(error) DICE: error', severity: 'error' };
        case 'ready':
            if (input.suggestion) {
                return { text: `$(warning) DICE: ${shorten(input.suggestion.message)}`, severity: 'warning' };
            }
            return { text: `$(check) DICE ${model}${status.device ? ` · ${status.device}` : ''}`, severity: 'normal' };
    }
}

export function renderStatus(input: StatusInput): StatusView {
    const { text, severity } = headline(input);
    const lines = ['DICE kernel assistant'];
    const s = input.status;
    if (input.phase === 'running' && s) {
        lines.push(`State: ${s.state}`);
        if (s.model) {
            lines.push(`Model: ${s.model}`);
        }
        if (s.device) {
            lines.push(`Device: ${s.device}`);
        }
        if (s.message) {
            lines.push(s.message);
        }
        if (input.suggestion) {
            lines.push(`Last suggestion: ${input.suggestion.message}`);
        }
    } else {
        lines.push(`Server: ${input.phase}`);
        // The server's last word before it gave up (e.g. the model server it could not reach).
        if (input.phase === 'failed' && s?.state === 'error' && s.message) {
            lines.push(`Last error: ${s.message}`);
        }
    }
    lines.push(`Automatic suggestions: ${input.automatic ? 'on' : 'off'}`, 'Click to show the log.');
    return { text: input.automatic ? text : `${text} $(eye-closed)`, tooltip: lines.join('\n'), severity };
}

export class StatusBar {
    private readonly item: StatusBarItem;
    private input: StatusInput;

    constructor(automatic: boolean) {
        this.item = createStatusBarItem('dice.status', 100);
        this.item.name = 'DICE';
        this.item.command = ClientCommands.showLog;
        this.input = { phase: 'idle', status: undefined, automatic };
        this.render();
        this.item.show();
    }

    get view(): StatusInput {
        return this.input;
    }

    setPhase(phase: ClientPhase): void {
        // A new process has not said anything yet: forget what the old one said.
        const status = phase === 'running' || phase === 'failed' ? this.input.status : undefined;
        const suggestion = phase === 'running' ? this.input.suggestion : undefined;
        this.update({ phase, status, suggestion });
    }

    /** Applies a raw `dice/status` payload; malformed payloads are ignored and reported as false. */
    onStatus(payload: unknown): boolean {
        const status = parseStatus(payload);
        if (status) {
            this.update({ status });
        }
        return status !== undefined;
    }

    /** Applies a validated `dice/suggestionStatus`: its message replaces the last one; none clears it. */
    onSuggestionStatus(status: SuggestionStatus): void {
        this.update({ suggestion: status.message ? { uri: status.uri, message: status.message } : undefined });
    }

    /** An edit of `uri` (any document when undefined) makes the last suggestion's message out of date. */
    clearSuggestion(uri?: string): void {
        if (this.input.suggestion && (uri === undefined || uri === this.input.suggestion.uri)) {
            this.update({ suggestion: undefined });
        }
    }

    setAutomatic(automatic: boolean): void {
        this.update({ automatic });
    }

    dispose(): void {
        this.item.dispose();
    }

    private update(change: Partial<StatusInput>): void {
        this.input = { ...this.input, ...change };
        this.render();
    }

    private render(): void {
        const view = renderStatus(this.input);
        this.item.text = view.text;
        this.item.tooltip = view.tooltip;
        this.item.backgroundColor =
            view.severity === 'normal' ? undefined : themeColor(`statusBarItem.${view.severity}Background`);
    }
}
