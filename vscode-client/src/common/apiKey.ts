// The model server's API key (`dice.modelServer`). Never a setting: settings files are shared, synced and
// committed. It lives in VS Code's SecretStorage and reaches the language server only as
// $DICE_SERVER_API_KEY in the environment of its process, so changing it restarts the server.

import type { SecretStorage } from 'vscode';
import { ClientCommands } from './protocol';
import { Disposable, registerCommand } from './vscodeapi';

/** The variable the language server reads the key from. */
export const SERVER_API_KEY_ENV = 'DICE_SERVER_API_KEY';
/** The key's name in this extension's SecretStorage. */
export const SERVER_API_KEY_SECRET = 'dice.modelServer.apiKey';

export type Environment = Record<string, string | undefined>;

/**
 * The environment of the server process. No stored key: undefined, i.e. the process inherits ours
 * unchanged (a $DICE_SERVER_API_KEY VS Code was started with still applies). A stored key: a copy of
 * `inherited` with $DICE_SERVER_API_KEY set to it (a spawn's `env` replaces the whole environment).
 */
export function serverEnvironment(inherited: Environment, apiKey: string | undefined): Environment | undefined {
    if (apiKey === undefined || apiKey.length === 0) {
        return undefined;
    }
    return { ...inherited, [SERVER_API_KEY_ENV]: apiKey };
}

export interface ApiKeyCommandDeps {
    secrets: Pick<SecretStorage, 'get' | 'store' | 'delete'>;
    /** Asks for the key (a password box); undefined: the user cancelled. */
    askForKey(): Thenable<string | undefined>;
    showInfo(message: string): void;
}

/**
 * *Set model server API key* (an empty answer deletes it) and *Clear model server API key*. They only
 * write the SecretStorage; its onDidChange restarts the server (also when another window changed it).
 */
export function registerApiKeyCommands(deps: ApiKeyCommandDeps): Disposable[] {
    const clear = async (): Promise<void> => {
        if ((await deps.secrets.get(SERVER_API_KEY_SECRET)) === undefined) {
            deps.showInfo('DICE: no model server API key is stored.');
            return;
        }
        await deps.secrets.delete(SERVER_API_KEY_SECRET);
        deps.showInfo('DICE: model server API key removed.');
    };
    return [
        registerCommand(ClientCommands.setServerApiKey, async () => {
            const key = await deps.askForKey();
            if (key === undefined) {
                return;
            }
            if (key.trim().length === 0) {
                await clear();
                return;
            }
            await deps.secrets.store(SERVER_API_KEY_SECRET, key.trim());
            deps.showInfo('DICE: model server API key stored in the secret storage.');
        }),
        registerCommand(ClientCommands.clearServerApiKey, clear),
    ];
}
