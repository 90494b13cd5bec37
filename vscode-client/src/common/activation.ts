// Wires the pieces together; extension.ts only calls this. Takes the handle factory as a parameter so
// the unit tests can run the whole activation against the vscode stub and a fake server.

import * as os from 'os';
import type { ExtensionContext, TextDocument } from 'vscode';
import { registerApiKeyCommands, SERVER_API_KEY_ENV, SERVER_API_KEY_SECRET, serverEnvironment } from './apiKey';
import type { HandleFactory } from './client';
import { offerRecovery, registerClientCommands, ServerCommandFallbacks, CommandDeps } from './commands';
import { warrantsServer } from './documents';
import { createMiddleware, EditorContext } from './middleware';
import { CONFIG_SECTION, DiceServerSettings } from './protocol';
import { describeResult, runWithProgress } from './serverCommands';
import { ServerManager } from './server';
import { PathVariables, resolveServerLaunch, resolveServerSettings, RESTART_SECTIONS, ServerLaunch } from './settings';
import { StatusBar } from './status';
import { describeAccepted, describeSuggestionStatus, parseSuggestionStatus } from './suggestionStatus';
import * as api from './vscodeapi';

export interface DiceExtension {
    readonly manager: ServerManager;
    readonly status: StatusBar;
    dispose(): Promise<void>;
}

export function activateDice(context: Pick<ExtensionContext, 'subscriptions' | 'secrets'>, createHandle: HandleFactory): DiceExtension {
    const log = api.createLogChannel('DICE');
    const get = (key: string): unknown => api.getConfiguration(CONFIG_SECTION).get(key);
    const vars = (): PathVariables => ({ home: os.homedir(), workspaceFolder: api.firstWorkspaceFolder() });

    let reported = '';
    const serverSettings = (): DiceServerSettings => {
        const { settings, problems } = resolveServerSettings(get, vars(), api.isWorkspaceTrusted());
        const joined = problems.join('\n');
        if (joined !== reported) {
            reported = joined;
            problems.forEach((p) => log.warn(p));
            if (problems.length > 0) {
                void api.showWarning(`DICE settings: ${problems.join(' ')}`);
            }
        }
        return settings;
    };

    const status = new StatusBar(serverSettings().automaticTrigger);
    const commandDeps: CommandDeps = {
        server: {
            get state() {
                return manager.state;
            },
            ensureStarted: () => manager.ensureStarted(),
            restart: (manual) => manager.restart(manual),
        },
        showLog: () => log.show(true),
        toggleAutomatic: async () => {
            const next = !serverSettings().automaticTrigger;
            await api.updateSetting(CONFIG_SECTION, 'automaticTrigger', next);
            return next;
        },
        executeCommand: api.executeCommand,
        showError: api.showError,
        showInfo: (m) => void api.showInfo(m),
        onSuggestionAccepted: (accepted, args) => {
            if (accepted) {
                log.info(describeAccepted(accepted));
            } else {
                log.info(`Accepted a suggestion (${JSON.stringify(args)})`);
            }
        },
    };
    const fallbacks = new ServerCommandFallbacks(commandDeps);

    const middleware = createMiddleware({
        automaticSuggestions: () => serverSettings().automaticTrigger,
        serverSettings,
        activeEditor: (): EditorContext | undefined => {
            const editor = api.activeTextEditor();
            return editor && {
                uri: editor.document.uri.toString(),
                line: editor.selection.active.line,
                character: editor.selection.active.character,
            };
        },
        warn: (m) => void api.showWarning(m),
        runServerCommand: async (command, args) => {
            const handle = manager.current;
            if (!handle) {
                await offerRecovery(commandDeps, 'DICE: the server is not running.');
                return undefined;
            }
            const outcome = await runWithProgress(handle, command, args, { withProgress: api.withNotificationProgress });
            if (outcome.kind === 'failed') {
                log.error(`${command} failed: ${outcome.message}`);
                void offerRecovery(commandDeps, `DICE: ${outcome.message}`);
                return undefined;
            }
            if (outcome.kind === 'cancelled') {
                log.info(`${command}: cancelled`);
                return undefined;
            }
            log.info(`${command}: ${describeResult(outcome.result) ?? 'done'}`);
            return outcome.result;
        },
    });

    // Read at every start: the model server's API key reaches the process only through its environment.
    const launch = async (): Promise<ServerLaunch> => {
        const command = resolveServerLaunch(get, vars());
        let apiKey: string | undefined;
        try {
            apiKey = await context.secrets.get(SERVER_API_KEY_SECRET);
        } catch (error) {
            log.warn(`Cannot read the model server API key from the secret storage: ${String(error)}`);
        }
        const env = serverEnvironment(process.env, apiKey);
        return env ? { ...command, env } : command;
    };

    const manager: ServerManager = new ServerManager({
        createHandle,
        launch,
        settings: serverSettings,
        middleware,
        log,
        onPhase: (phase) => status.setPhase(phase),
        onStatus: (payload) => {
            if (!status.onStatus(payload)) {
                log.warn(`Ignored a malformed dice/status notification: ${JSON.stringify(payload)}`);
            }
        },
        onSuggestionStatus: (payload) => {
            const parsed = parseSuggestionStatus(payload);
            if (!parsed) {
                log.warn(`Ignored a malformed dice/suggestionStatus notification: ${JSON.stringify(payload)}`);
                return;
            }
            status.onSuggestionStatus(parsed);
            if (parsed.message) {
                log.warn(describeSuggestionStatus(parsed));
            }
        },
        beforeStart: () => fallbacks.unregister(),
        afterStop: () => fallbacks.register(),
        onGiveUp: (message) => void offerRecovery(commandDeps, `DICE: ${message}`),
    });
    fallbacks.register();

    const startFor = (doc: TextDocument): void => {
        if (manager.state === 'idle' && warrantsServer(doc)) {
            manager.ensureStarted().catch((e) => log.error(`Starting the DICE server failed: ${String(e)}`));
        }
    };

    context.subscriptions.push(
        log,
        status,
        { dispose: () => fallbacks.unregister() },
        ...registerClientCommands(commandDeps),
        ...registerApiKeyCommands({
            secrets: context.secrets,
            askForKey: () =>
                api.askForSecret(
                    'DICE: model server API key',
                    `The key of dice.modelServer, kept in VS Code's secret storage (never in settings) and given to the ` +
                        `language server as $${SERVER_API_KEY_ENV}. Empty: remove the stored key.`,
                ),
            showInfo: (m) => void api.showInfo(m),
        }),
        // A new key needs a new process (it is in the environment); also when another window changed it.
        context.secrets.onDidChange((e) => {
            if (e.key === SERVER_API_KEY_SECRET && manager.state !== 'idle') {
                log.info('The model server API key changed: restarting the DICE server.');
                void manager.restart(true);
            }
        }),
        api.onDidOpenTextDocument(startFor),
        api.onDidChangeTextDocument((e) => {
            if (e.contentChanges.length > 0) {
                status.clearSuggestion(e.document.uri.toString());
            }
        }),
        // Restricted Mode left: the server may now run the workspace's dice-spec and KernelBench code.
        api.onDidGrantWorkspaceTrust(() => {
            manager.pushSettings().catch((err) => log.error(`Sending settings failed: ${String(err)}`));
        }),
        api.onDidChangeConfiguration((e) => {
            if (!e.affectsConfiguration(CONFIG_SECTION)) {
                return;
            }
            status.setAutomatic(serverSettings().automaticTrigger);
            if (RESTART_SECTIONS.some((s) => e.affectsConfiguration(s))) {
                if (manager.state !== 'idle') {
                    void manager.restart(false);
                }
            } else {
                manager.pushSettings().catch((err) => log.error(`Sending settings failed: ${String(err)}`));
            }
        }),
    );
    api.openTextDocuments().forEach(startFor);

    return { manager, status, dispose: () => manager.stop() };
}
