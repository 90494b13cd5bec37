// The wire contract between this extension and `dice-lsp` (docs/INTERNALS.md, "LSP ⟷ clients").
// No `vscode` import: the Node integration test speaks to the real server through this module too.

import { NotificationType } from 'vscode-languageserver-protocol';

/** Commands the server executes (`workspace/executeCommand`). */
export const ServerCommands = {
    fillAllMasks: 'dice.fillAllMasks', // [uri]
    fillMask: 'dice.fillMask', // [uri, {line, character}]
    generateKernel: 'dice.generateKernel', // [uri]
    validateKernel: 'dice.validateKernel', // [uri]
} as const;
export type ServerCommand = (typeof ServerCommands)[keyof typeof ServerCommands];

/** Commands only this extension handles. */
export const ClientCommands = {
    restartServer: 'dice.restartServer',
    showLog: 'dice.showLog',
    toggleAutomaticSuggestions: 'dice.toggleAutomaticSuggestions',
    setServerApiKey: 'dice.setServerApiKey',
    clearServerApiKey: 'dice.clearServerApiKey',
} as const;

export function isServerCommand(command: string): command is ServerCommand {
    return (Object.values(ServerCommands) as string[]).includes(command);
}

export type DiceState = 'loading' | 'ready' | 'busy' | 'validating' | 'error';
export const DICE_STATES: readonly DiceState[] = ['loading', 'ready', 'busy', 'validating', 'error'];

/** Payload of the server -> client `dice/status` notification. */
export interface DiceStatus {
    state: DiceState;
    model: string | null;
    device: string | null;
    message: string | null;
}
export const DiceStatusNotification = new NotificationType<DiceStatus>('dice/status');

export type Device = 'auto' | 'cpu' | 'cuda';
export type Policy = 'static' | 'dynamic' | 'entropy';
export type ValidationLevel = 'none' | 'compile' | 'run';

/**
 * The `dice` settings object: `initializationOptions` is exactly this, and
 * `workspace/didChangeConfiguration` carries `{"dice": DiceServerSettings}`.
 */
export interface DiceServerSettings {
    modelPath: string; // "" = the embedded model
    device: Device;
    candidates: number;
    blockSize: number;
    stepsPerBlock: number;
    policy: Policy;
    threshold: number;
    maxLatencyMs: number;
    automaticTrigger: boolean;
    validationLevel: ValidationLevel;
    maxNewTokens: number;
    compileCommands: string; // "" = discovered beside the file, as clangd does
    includePaths: string[];
    defines: string[];
    showFailingSuggestions: boolean;
    // run the workspace's dice-spec / KernelBench code; VS Code sends workspace.isTrusted here
    trustedWorkspace: boolean;
    // an OpenAI-compatible model server (`dice serve`, SGLang, LMDeploy); "" = $DICE_SERVER, else the model
    // runs in the server's own process. Its API key is never a setting: $DICE_SERVER_API_KEY (apiKey.ts).
    modelServer: string;
    modelServerModel: string; // which of its models ("" = its only one)
}

export const DEFAULT_SERVER_SETTINGS: Readonly<DiceServerSettings> = Object.freeze({
    modelPath: '',
    device: 'auto',
    candidates: 3,
    blockSize: 4,
    stepsPerBlock: 4,
    policy: 'dynamic',
    threshold: 0.9,
    maxLatencyMs: 2000,
    automaticTrigger: true,
    validationLevel: 'run',
    maxNewTokens: 256,
    compileCommands: '',
    includePaths: [],
    defines: [],
    showFailingSuggestions: true,
    trustedWorkspace: false,
    modelServer: '',
    modelServerModel: '',
});

export const SERVER_SETTING_KEYS = Object.keys(DEFAULT_SERVER_SETTINGS) as (keyof DiceServerSettings)[];

export const CONFIG_SECTION = 'dice';
