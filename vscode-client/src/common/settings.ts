// `dice.*` settings -> the server's settings object and the command that starts the server.
// Pure: takes a getter instead of a WorkspaceConfiguration so it runs under plain Node.

import {
    DEFAULT_SERVER_SETTINGS,
    DiceServerSettings,
    Device,
    Policy,
    SERVER_SETTING_KEYS,
    ValidationLevel,
} from './protocol';

/** Reads one key below `dice.` (e.g. "candidates", "server.command"); undefined when unset. */
export type SettingGetter = (key: string) => unknown;

/** Values that `${workspaceFolder}` and a leading `~` expand to in path settings. */
export interface PathVariables {
    home?: string;
    workspaceFolder?: string;
}

export interface ResolvedSettings {
    settings: DiceServerSettings;
    /** One readable line per rejected value; the default was used instead. */
    problems: string[];
}

const DEVICES: readonly Device[] = ['auto', 'cpu', 'cuda'];
const POLICIES: readonly Policy[] = ['static', 'dynamic', 'entropy'];
const VALIDATION_LEVELS: readonly ValidationLevel[] = ['none', 'compile', 'run'];

type Check = (value: unknown) => boolean;
const oneOf =
    (choices: readonly string[]): Check =>
    (v) =>
        typeof v === 'string' && choices.includes(v);
const integerIn =
    (min: number, max: number): Check =>
    (v) =>
        typeof v === 'number' && Number.isInteger(v) && v >= min && v <= max;
const stringList: Check = (v) => Array.isArray(v) && v.every((item) => typeof item === 'string');
const numberAbove =
    (exclusiveMin: number): Check =>
    (v) =>
        typeof v === 'number' && Number.isFinite(v) && v > exclusiveMin;

// Bounds match the JSON schema in package.json, which a Python test checks against the server's one table
// (dice/assistant/settings.py): what VS Code accepts, the server accepts too. The server alone applies the
// rule a schema cannot say: a threshold above 1 only for the entropy policy.
const CHECKS: Record<keyof DiceServerSettings, [Check, string]> = {
    modelPath: [(v) => typeof v === 'string', 'a path (empty for the embedded model)'],
    device: [oneOf(DEVICES), DEVICES.join(' | ')],
    candidates: [integerIn(1, 64), 'an integer from 1 to 64'],
    blockSize: [integerIn(1, 64), 'an integer from 1 to 64'],
    stepsPerBlock: [integerIn(1, 64), 'an integer from 1 to 64'],
    policy: [oneOf(POLICIES), POLICIES.join(' | ')],
    threshold: [numberAbove(0), 'a number above 0'],
    maxLatencyMs: [integerIn(50, 600_000), 'an integer from 50 to 600000'],
    automaticTrigger: [(v) => typeof v === 'boolean', 'true or false'],
    validationLevel: [oneOf(VALIDATION_LEVELS), VALIDATION_LEVELS.join(' | ')],
    maxNewTokens: [integerIn(1, 32768), 'an integer from 1 to 32768'],
    compileCommands: [(v) => typeof v === 'string', 'a path (empty: found beside the file)'],
    includePaths: [stringList, 'a list of folders'],
    defines: [stringList, 'a list of NAME or NAME=VALUE'],
    showFailingSuggestions: [(v) => typeof v === 'boolean', 'true or false'],
    trustedWorkspace: [(v) => typeof v === 'boolean', 'true or false'],
    modelServer: [(v) => typeof v === 'string', 'a URL (empty: $DICE_SERVER, else the model runs in the server)'],
    modelServerModel: [(v) => typeof v === 'string', "a model name (empty: the server's only model)"],
};

export function expandPath(value: string, vars: PathVariables): string {
    let out = value;
    if (vars.workspaceFolder !== undefined) {
        out = out.split('${workspaceFolder}').join(vars.workspaceFolder);
    }
    if (vars.home !== undefined && (out === '~' || out.startsWith('~/') || out.startsWith('~\\'))) {
        out = vars.home + out.slice(1);
    }
    return out;
}

/**
 * The `dice` object sent as initializationOptions and in didChangeConfiguration. `workspaceTrusted`: VS Code's
 * own workspace trust (`vscode.workspace.isTrusted`), which then decides `trustedWorkspace` (the setting is
 * for editors without workspace trust); undefined: the setting decides.
 */
export function resolveServerSettings(
    get: SettingGetter,
    vars: PathVariables = {},
    workspaceTrusted?: boolean,
): ResolvedSettings {
    const settings: Record<string, unknown> = { ...DEFAULT_SERVER_SETTINGS };
    const problems: string[] = [];
    for (const key of SERVER_SETTING_KEYS) {
        const value = get(key);
        if (value === undefined || value === null) {
            continue;
        }
        const [check, expected] = CHECKS[key];
        if (check(value)) {
            settings[key] = value;
        } else {
            const fallback = JSON.stringify(DEFAULT_SERVER_SETTINGS[key]);
            problems.push(`dice.${key} = ${JSON.stringify(value)} is not ${expected}; using ${fallback}.`);
        }
    }
    settings.modelPath = expandPath((settings.modelPath as string).trim(), vars);
    settings.compileCommands = expandPath((settings.compileCommands as string).trim(), vars);
    settings.includePaths = (settings.includePaths as string[]).map((p) => expandPath(p, vars));
    settings.modelServer = (settings.modelServer as string).trim();
    settings.modelServerModel = (settings.modelServerModel as string).trim();
    if (workspaceTrusted !== undefined) {
        settings.trustedWorkspace = workspaceTrusted;
    }
    return { settings: settings as unknown as DiceServerSettings, problems };
}

export interface ServerLaunch {
    command: string;
    args: string[];
    /** The process's whole environment; undefined: it inherits the extension host's (apiKey.ts). */
    env?: Record<string, string | undefined>;
}

export function defaultPython(platform: NodeJS.Platform): string {
    return platform === 'win32' ? 'python' : 'python3';
}

/**
 * `dice.server.command` (argv list, e.g. ["dice-lsp"]) wins; otherwise
 * `<dice.server.pythonPath> -m lsp_server`, with python3 (python on Windows) when the path is empty.
 */
export function resolveServerLaunch(
    get: SettingGetter,
    vars: PathVariables = {},
    platform: NodeJS.Platform = process.platform,
): ServerLaunch {
    const command = get('server.command');
    const argv = Array.isArray(command)
        ? command.filter((part): part is string => typeof part === 'string' && part.length > 0)
        : typeof command === 'string' && command.trim().length > 0
          ? [command.trim()]
          : [];
    if (argv.length > 0) {
        return { command: expandPath(argv[0], vars), args: argv.slice(1).map((a) => expandPath(a, vars)) };
    }
    const pythonPath = get('server.pythonPath');
    const python =
        typeof pythonPath === 'string' && pythonPath.trim().length > 0
            ? expandPath(pythonPath.trim(), vars)
            : defaultPython(platform);
    return { command: python, args: ['-m', 'lsp_server'] };
}

/** Settings whose change needs a new server process rather than a didChangeConfiguration. */
export const RESTART_SECTIONS = ['dice.server'];
