// The real `dice-lsp` over stdio, driven through this extension's own protocol, settings and argument
// code (src/common/{protocol,settings,middleware,serverCommands}.ts) and vscode-languageserver-protocol,
// the library under vscode-languageclient. A tiny random checkpoint (engine.testing) stands in for a
// real model, so suggestions are gibberish but every message on the way is real.
//
// Needs the Python that has the dice-cuda package: $PYTHON, else python3 (see python.ts).

import * as assert from 'assert/strict';
import { ChildProcess, spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { pathToFileURL } from 'url';
import {
    ApplyWorkspaceEditParams,
    ApplyWorkspaceEditRequest,
    ClientCapabilities,
    ConfigurationRequest,
    DidOpenTextDocumentNotification,
    ExecuteCommandRequest,
    ExitNotification,
    InitializeRequest,
    InitializedNotification,
    InlineCompletionItem,
    InlineCompletionList,
    InlineCompletionRequest,
    InlineCompletionTriggerKind,
    LogMessageNotification,
    RegistrationRequest,
    ShowMessageNotification,
    ShutdownRequest,
    TextEdit,
    WorkDoneProgress,
    WorkDoneProgressCreateRequest,
} from 'vscode-languageserver-protocol';
import { createProtocolConnection, ProtocolConnection, StreamMessageReader, StreamMessageWriter } from 'vscode-languageserver-protocol/node';
import { completeArguments } from '../../common/middleware';
import { DiceServerSettings, DiceStatus, DiceStatusNotification, ServerCommands } from '../../common/protocol';
import { describeResult, ProgressTranslator } from '../../common/serverCommands';
import { resolveServerLaunch, resolveServerSettings } from '../../common/settings';
import { assertPythonHasPackage, KERNEL, MASK_RANGE, PYTHON, REPO_ROOT, SKIP_SERVER_TESTS, tinyCheckpoint } from './python';

// What vscode-languageclient 11 announces for the features this extension relies on.
const CAPABILITIES: ClientCapabilities = {
    general: { positionEncodings: ['utf-16'] },
    window: { workDoneProgress: true, showDocument: { support: true }, showMessage: {} },
    workspace: {
        applyEdit: true,
        configuration: true,
        didChangeConfiguration: { dynamicRegistration: true },
        executeCommand: { dynamicRegistration: true },
        workspaceEdit: { documentChanges: true, resourceOperations: ['create', 'rename', 'delete'] },
        codeLens: { refreshSupport: true },
    },
    textDocument: {
        synchronization: { dynamicRegistration: true, didSave: true },
        inlineCompletion: { dynamicRegistration: true },
        codeLens: { dynamicRegistration: true },
        hover: { dynamicRegistration: true, contentFormat: ['markdown', 'plaintext'] },
        publishDiagnostics: { relatedInformation: true },
    },
};

/** Resolves with the first value `accept` returns for a notification; rejects with the server's stderr on timeout. */
function waitFor<T>(what: string, subscribe: (accept: (v: T) => void) => void, ms: number, stderr: () => string): Promise<T> {
    return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}\n--- server stderr ---\n${stderr()}`)), ms);
        subscribe((v) => {
            clearTimeout(timer);
            resolve(v);
        });
    });
}

describe('integration: the real dice-lsp over stdio', function () {
    this.timeout(90_000);
    let tmp: string;
    let server: ChildProcess;
    let connection: ProtocolConnection;
    let stderr = '';
    let settings: DiceServerSettings;
    const statuses: DiceStatus[] = [];
    const edits: ApplyWorkspaceEditParams[] = [];
    const messages: string[] = [];
    let onStatus: ((s: DiceStatus) => void) | undefined;

    before(function () {
        if (SKIP_SERVER_TESTS) {
            this.skip();
        }
        assertPythonHasPackage();
        tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dice-vscode-'));
        const checkpoint = tinyCheckpoint();

        // The extension's own settings code builds the initialization options and the command line.
        const userSettings: Record<string, unknown> = {
            modelPath: checkpoint,
            device: 'cpu',
            candidates: 2,
            maxNewTokens: 8,
            validationLevel: 'none', // a random model's text never compiles; validation is the server's own test
            'server.pythonPath': PYTHON,
        };
        const resolved = resolveServerSettings((key) => userSettings[key]);
        assert.deepEqual(resolved.problems, []);
        settings = resolved.settings;
        const launch = resolveServerLaunch((key) => userSettings[key]);
        assert.deepEqual(launch.args, ['-m', 'lsp_server']);

        server = spawn(launch.command, launch.args, { cwd: REPO_ROOT, stdio: ['pipe', 'pipe', 'pipe'] });
        server.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
        connection = createProtocolConnection(new StreamMessageReader(server.stdout!), new StreamMessageWriter(server.stdin!));
        connection.onNotification(DiceStatusNotification, (s) => {
            statuses.push(s);
            onStatus?.(s);
        });
        connection.onNotification(LogMessageNotification.type, (p) => {
            messages.push(p.message);
        });
        connection.onNotification(ShowMessageNotification.type, (p) => {
            messages.push(p.message);
        });
        connection.onRequest(ConfigurationRequest.type, (p) => p.items.map((i) => (i.section === 'dice' ? settings : null)));
        connection.onRequest(WorkDoneProgressCreateRequest.type, () => undefined);
        connection.onRequest(RegistrationRequest.type, () => undefined);
        connection.onRequest(ApplyWorkspaceEditRequest.type, (p) => {
            edits.push(p);
            return { applied: true };
        });
        connection.listen();
    });

    after(async () => {
        if (connection && server && server.exitCode === null) {
            const exited = new Promise<number | null>((resolve) => server.once('exit', (code) => resolve(code)));
            await connection.sendRequest(ShutdownRequest.type);
            await connection.sendNotification(ExitNotification.type);
            const code = await Promise.race([exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), 10_000))]);
            if (code === 'hung') {
                server.kill();
            }
            assert.equal(code, 0, `dice-lsp exit code after shutdown + exit\n${stderr}`);
        }
        connection?.dispose();
        if (tmp) {
            fs.rmSync(tmp, { recursive: true, force: true });
        }
    });

    it('initializes, advertises the DICE commands and inline completion, and reports ready', async () => {
        const ready = waitFor<DiceStatus>('dice/status ready', (accept) => (onStatus = (s) => (s.state === 'ready' || s.state === 'error') && accept(s)), 60_000, () => stderr);
        const init = await connection.sendRequest(InitializeRequest.type, {
            processId: process.pid,
            rootUri: pathToFileURL(tmp).toString(),
            capabilities: CAPABILITIES,
            initializationOptions: settings,
            workspaceFolders: null,
        });
        assert.deepEqual([...(init.capabilities.executeCommandProvider?.commands ?? [])].sort(), Object.values(ServerCommands).sort());
        assert.ok(init.capabilities.inlineCompletionProvider, 'inline completion is advertised');
        await connection.sendNotification(InitializedNotification.type, {});
        const status = await ready;
        assert.equal(status.state, 'ready', `model did not load: ${status.message}\n${messages.join('\n')}\n${stderr}`);
        assert.ok(statuses.some((s) => s.state === 'loading'), 'loading was reported first');
        assert.ok(status.device, 'the ready status names the device');
    });

    it('answers an inline completion at a mask in a .cu file', async () => {
        const uri = pathToFileURL(path.join(tmp, 'scale.cu')).toString();
        await connection.sendNotification(DidOpenTextDocumentNotification.type, {
            textDocument: { uri, languageId: 'cuda-cpp', version: 1, text: KERNEL },
        });
        const started = Date.now();
        const answer = await connection.sendRequest(InlineCompletionRequest.type, {
            textDocument: { uri },
            position: { line: 2, character: 10 },
            context: { triggerKind: InlineCompletionTriggerKind.Invoked },
        });
        const items: InlineCompletionItem[] = Array.isArray(answer) ? answer : ((answer as InlineCompletionList | null)?.items ?? []);
        assert.ok(items.length >= 1, `no inline completion items\n${messages.join('\n')}\n${stderr}`);
        for (const item of items) {
            assert.equal(typeof item.insertText, 'string');
            assert.ok((item.insertText as string).trim().length > 0);
            assert.deepEqual(item.range, MASK_RANGE, 'the suggestion replaces the mask comment');
        }
        console.log(`      inline completion: ${items.length} item(s) in ${Date.now() - started} ms`);
    });

    it('fills all masks through workspace/executeCommand with work-done progress and an applied edit', async () => {
        const uri = pathToFileURL(path.join(tmp, 'scale.cu')).toString();
        const args = completeArguments('dice.fillAllMasks', [], { uri, line: 0, character: 0 });
        assert.ok(args.ok);
        const reports: { message?: string; increment?: number }[] = [];
        const translator = new ProgressTranslator({ report: (v) => reports.push(v) });
        const token = 'dice-integration-1';
        const progress = connection.onProgress(WorkDoneProgress.type, token, (v) => translator.accept(v));
        const result = (await connection.sendRequest(ExecuteCommandRequest.type, {
            command: ServerCommands.fillAllMasks,
            arguments: args.args,
            workDoneToken: token,
        })) as Record<string, unknown>;
        progress.dispose();
        assert.equal(result.ok, true, `fillAllMasks: ${describeResult(result)}\n${messages.join('\n')}\n${stderr}`);
        assert.equal(result.applied, true);
        assert.ok(reports.length > 0, 'progress was reported on the client token');
        assert.equal(edits.length, 1);
        const change = edits[0].edit.documentChanges?.[0] as { textDocument: { uri: string; version: number | null }; edits: TextEdit[] };
        assert.equal(change.textDocument.uri, uri);
        assert.equal(change.textDocument.version, 1, 'the edit is versioned against the text it was computed for');
        assert.deepEqual(change.edits.map((e) => e.range), [MASK_RANGE]);
    });
});
