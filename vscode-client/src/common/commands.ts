// Palette commands. The four server commands are registered by the language client itself (from the
// server's executeCommandProvider) and reach the middleware; while no server runs, fallbacks stand in
// under the same ids so the palette never answers "command not found".

import { removeMaskComment, REMOVE_MASK_COMMAND, RemoveMaskArgs } from './ghostText';
import { ClientCommands, ServerCommands } from './protocol';
import type { ClientPhase } from './status';
import { parseAccepted, SUGGESTION_ACCEPTED_COMMAND, SuggestionAccepted } from './suggestionStatus';
import { Disposable, registerCommand } from './vscodeapi';

export interface ServerControl {
    readonly state: ClientPhase;
    ensureStarted(): Promise<void>;
    restart(manual: boolean): Promise<void>;
}

export interface CommandDeps {
    server: ServerControl;
    showLog(): void;
    /** Flips `dice.automaticTrigger`; resolves to the new value. */
    toggleAutomatic(): Promise<boolean>;
    executeCommand(command: string, ...args: unknown[]): Thenable<unknown>;
    showError(message: string, ...actions: string[]): Thenable<string | undefined>;
    showInfo(message: string): void;
    /** An inline item was accepted (its `dice.suggestionAccepted` command ran); undefined: malformed args. */
    onSuggestionAccepted?(accepted: SuggestionAccepted | undefined, args: unknown[]): void;
}

export function registerClientCommands(deps: CommandDeps): Disposable[] {
    return [
        registerCommand(ClientCommands.restartServer, () => deps.server.restart(true)),
        registerCommand(ClientCommands.showLog, () => deps.showLog()),
        // Internal (not in the palette): runs after a mask fill is accepted as ghost text.
        registerCommand(REMOVE_MASK_COMMAND, (args) => removeMaskComment(args as RemoveMaskArgs)),
        // Internal: every inline item from the server carries it (title = the verdict label); accepting an
        // item runs it, so it must exist. It only reports the label.
        registerCommand(SUGGESTION_ACCEPTED_COMMAND, (...args: unknown[]) => {
            deps.onSuggestionAccepted?.(parseAccepted(args), args);
        }),
        registerCommand(ClientCommands.toggleAutomaticSuggestions, async () => {
            const on = await deps.toggleAutomatic();
            deps.showInfo(
                on
                    ? 'DICE: automatic suggestions on.'
                    : 'DICE: automatic suggestions off. Ask for one with "Trigger Inline Suggestion" (Alt+\\).',
            );
        }),
    ];
}

/** Offers Restart / Show log after a failure; both buttons do what they say. */
export async function offerRecovery(deps: CommandDeps, message: string): Promise<void> {
    const choice = await deps.showError(message, 'Restart server', 'Show log');
    if (choice === 'Restart server') {
        await deps.server.restart(true);
    } else if (choice === 'Show log') {
        deps.showLog();
    }
}

export class ServerCommandFallbacks {
    private registered: Disposable[] = [];

    constructor(private readonly deps: CommandDeps) {}

    get active(): boolean {
        return this.registered.length > 0;
    }

    /** Call while no language client owns the ids. */
    register(): void {
        if (this.active) {
            return;
        }
        for (const id of Object.values(ServerCommands)) {
            try {
                this.registered.push(registerCommand(id, (...args: unknown[]) => this.startThenRun(id, args)));
            } catch {
                // A client that is still shutting down owns the id; its handler still works.
            }
        }
    }

    /** Call before a language client starts: it registers the same ids. */
    unregister(): void {
        this.registered.forEach((d) => d.dispose());
        this.registered = [];
    }

    private async startThenRun(id: string, args: unknown[]): Promise<unknown> {
        if (this.deps.server.state !== 'failed') {
            await this.deps.server.ensureStarted();
        }
        if (this.deps.server.state !== 'running') {
            await offerRecovery(this.deps, 'DICE: the server is not running.');
            return undefined;
        }
        // The client registered the real handler (and its middleware) while starting; the fallbacks are
        // gone by now, so this cannot come back here.
        try {
            return await this.deps.executeCommand(id, ...args);
        } catch (error) {
            // "command not found": the server's executeCommandProvider lacks it (an older dice-lsp).
            await offerRecovery(this.deps, `DICE: the server does not provide ${id} (${String(error)}).`);
            return undefined;
        }
    }
}
