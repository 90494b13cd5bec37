// The extension as VS Code would run it, minus VS Code: activateDice with the real
// vscode-languageclient LanguageClient (client.ts) under the vscode stub, starting the real dice-lsp.
// Inline completions come through the provider the client registers and this extension's middleware;
// palette commands through the client's ExecuteCommandFeature registrations; edits through
// workspace.applyEdit. A tiny random checkpoint stands in for a real model.

import * as assert from 'assert/strict';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { activateDice, DiceExtension } from '../../common/activation';
import { createLanguageClientHandle } from '../../common/client';
import { ServerCommands } from '../../common/protocol';
import {
    CancellationTokenSource,
    commands,
    InlineCompletionItem,
    InlineCompletionTriggerKind,
    makeDocument,
    Position,
    registeredProviders,
    stub,
    StubSecretStorage,
    WorkspaceEdit,
} from '../stub/vscode';
import { assertPythonHasPackage, KERNEL, MASK_RANGE, PYTHON, REPO_ROOT, SKIP_SERVER_TESTS, tinyCheckpoint } from './python';

const RELU_REFERENCE = [
    'import torch',
    'import torch.nn as nn',
    '',
    'class Model(nn.Module):',
    '    def forward(self, x):',
    '        return torch.relu(x)',
    '',
    'def get_inputs():',
    '    return [torch.randn(1024)]',
    '',
    'def get_init_inputs():',
    '    return []',
    '',
].join('\n');

/** Polls a condition the stub cannot signal as an event (the status bar text), with a deadline. */
async function until(what: string, condition: () => boolean, ms: number, detail: () => string): Promise<void> {
    const deadline = Date.now() + ms;
    while (!condition()) {
        if (Date.now() > deadline) {
            throw new Error(`timed out waiting for ${what}\n${detail()}`);
        }
        await new Promise((resolve) => setTimeout(resolve, 50));
    }
}

function isAlive(pid: number): boolean {
    try {
        process.kill(pid, 0);
        return true;
    } catch {
        return false;
    }
}

function plainRange(r: { start: { line: number; character: number }; end: { line: number; character: number } }) {
    return { start: { line: r.start.line, character: r.start.character }, end: { line: r.end.line, character: r.end.character } };
}

describe('integration: the extension with the real LanguageClient and dice-lsp', function () {
    this.timeout(90_000);
    let ext: DiceExtension | undefined;
    let subscriptions: { dispose(): unknown }[] = [];
    let tmp: string;
    let savedPythonPath: string | undefined;
    const secrets = new StubSecretStorage();
    const log = (): string => stub.channels[0]?.lines.join('\n') ?? '';
    const statusText = (): string => stub.statusItems[0]?.text ?? '';
    const doc = () => stub.textDocuments[0];

    before(async function () {
        if (SKIP_SERVER_TESTS) {
            this.skip();
        }
        assertPythonHasPackage();
        const checkpoint = tinyCheckpoint();
        tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dice-vscode-lc-'));
        // `python -m lsp_server` from any working directory, installed or not.
        savedPythonPath = process.env.PYTHONPATH;
        process.env.PYTHONPATH = [REPO_ROOT, savedPythonPath].filter(Boolean).join(path.delimiter);

        stub.reset();
        registeredProviders.clear();
        stub.settings.set('dice.modelPath', checkpoint);
        stub.settings.set('dice.device', 'cpu');
        stub.settings.set('dice.candidates', 2);
        stub.settings.set('dice.maxNewTokens', 8);
        stub.settings.set('dice.validationLevel', 'none');
        stub.settings.set('dice.server.pythonPath', PYTHON);
        const cu = makeDocument(path.join(tmp, 'scale.cu'), 'cuda-cpp', KERNEL);
        cu.version = 1;
        stub.textDocuments.push(cu);

        ext = activateDice({ subscriptions, secrets } as never, createLanguageClientHandle);
        await until('the ready status', () => statusText().startsWith('$(check)'), 60_000, () => `${statusText()}\n${log()}`);
    });

    after(async () => {
        process.env.PYTHONPATH = savedPythonPath;
        if (savedPythonPath === undefined) {
            delete process.env.PYTHONPATH;
        }
        const pid = ext?.manager.current?.pid;
        await ext?.dispose();
        subscriptions.forEach((d) => d.dispose());
        subscriptions = [];
        if (pid !== undefined) {
            await until('the server to exit after deactivate', () => !isAlive(pid), 10_000, log);
        }
        if (tmp) {
            fs.rmSync(tmp, { recursive: true, force: true });
        }
    });

    it('starts dice-lsp for an open .cu file and shows model and device in the status bar', () => {
        assert.equal(ext!.manager.state, 'running');
        assert.match(statusText(), /^\$\(check\) DICE \S+ · cpu$/);
        assert.ok(registeredProviders.has('registerInlineCompletionItemProvider'), 'inline completion provider registered');
        assert.ok(registeredProviders.has('registerCodeLensProvider'), 'verdict code lenses come from the server');
        assert.ok(registeredProviders.has('registerHoverProvider'), 'verdict hovers come from the server');
        for (const id of Object.values(ServerCommands)) {
            assert.ok(stub.commands.has(id), `${id} is registered`);
        }
    });

    it('offers an inline completion at the mask through the registered provider', async () => {
        const [{ provider }] = registeredProviders.get('registerInlineCompletionItemProvider')!;
        const token = new CancellationTokenSource().token;
        const context = { triggerKind: InlineCompletionTriggerKind.Invoke, selectedCompletionInfo: undefined };
        const result = await provider.provideInlineCompletionItems(doc(), new Position(2, 10), context, token);
        const items: InlineCompletionItem[] = Array.isArray(result) ? result : (result?.items ?? []);
        assert.ok(items.length >= 1, `no suggestion\n${log()}`);
        assert.ok(items[0] instanceof InlineCompletionItem);
        assert.equal(typeof items[0].insertText, 'string');
        assert.deepEqual(plainRange(items[0].range!), MASK_RANGE);
        // every item carries the server's label command; accepting it (VS Code runs it) only logs the label
        const command = items[0].command as { title: string; command: string; arguments: unknown[] };
        assert.equal(command.command, 'dice.suggestionAccepted');
        await commands.executeCommand(command.command, ...command.arguments);
        assert.ok(log().includes(`Accepted a suggestion in scale.cu: ${command.title}`), log());
        // dice/suggestionStatus reached the extension in the contract's shape; a usable item: no warning
        assert.doesNotMatch(log(), /malformed dice\/suggestionStatus/);
        assert.match(statusText(), /^\$\(check\)/);
    });

    it('turns the fill at a mask into ghost text VS Code can draw, and cleans up after acceptance', async () => {
        const [{ provider }] = registeredProviders.get('registerInlineCompletionItemProvider')!;
        const token = new CancellationTokenSource().token;
        const context = { triggerKind: InlineCompletionTriggerKind.Invoke, selectedCompletionInfo: undefined };
        const end = MASK_RANGE.end;
        const result = await provider.provideInlineCompletionItems(doc(), new Position(end.line, end.character), context, token);
        const items: InlineCompletionItem[] = Array.isArray(result) ? result : (result?.items ?? []);
        assert.ok(items.length >= 1, `no suggestion\n${log()}`);
        assert.deepEqual(plainRange(items[0].range!), { start: end, end }, 'an insertion right after the mask');
        const command = items[0].command as { title: string; command: string; arguments: unknown[] };
        assert.equal(command.command, 'dice.removeMaskComment');
        assert.notEqual(command.title, 'DICE: remove the mask comment', "the item's verdict label is kept");
        const applied = stub.appliedEdits.length;
        const acceptances = (): number => log().split('Accepted a suggestion').length - 1;
        const acceptedBefore = acceptances();
        assert.equal(await commands.executeCommand(command.command, ...command.arguments), true);
        const [[, edits]] = (stub.appliedEdits[applied] as WorkspaceEdit).entries();
        assert.deepEqual(edits.map((e) => [plainRange(e.range), e.newText]), [[MASK_RANGE, '']]);
        assert.equal(acceptances(), acceptedBefore + 1, "then the item's own label command ran");
    });

    it('runs "Fill mask at cursor" from the palette with progress and applies the edit', async () => {
        stub.activeTextEditor = { document: doc(), selection: { active: new Position(2, 8) } };
        const before = stub.appliedEdits.length;
        const result = (await commands.executeCommand(ServerCommands.fillMask)) as Record<string, unknown>;
        assert.equal(result?.ok, true, `${JSON.stringify(result)}\n${log()}`);
        assert.equal(stub.progress.length, 1);
        assert.equal(stub.progress[0].title, 'DICE: filling the mask');
        assert.ok(stub.progress[0].reports.length > 0, 'the server reported progress on the client token');
        assert.equal(stub.appliedEdits.length, before + 1);
        const [[uri, edits]] = (stub.appliedEdits[before] as WorkspaceEdit).entries();
        assert.equal(uri.toString(), doc().uri.toString());
        assert.deepEqual(edits.map((e) => plainRange(e.range)), [MASK_RANGE]);
        assert.match(log(), /dice\.fillMask: filled 1 mask\(s\)/);
    });

    it('generates a kernel from a KernelBench reference into a new file', async () => {
        const reference = makeDocument(path.join(tmp, '19_ReLU.py'), 'python', RELU_REFERENCE);
        reference.version = 1;
        stub.textDocuments.push(reference);
        stub.documentOpened.fire(reference);
        stub.activeTextEditor = { document: reference, selection: { active: new Position(0, 0) } };
        // A whole program is up to 2048 tokens: one greedy sample in big blocks keeps this quick. The
        // changes reach the running server through didChangeConfiguration.
        stub.setSetting('dice.candidates', 1);
        stub.setSetting('dice.blockSize', 64);
        stub.setSetting('dice.stepsPerBlock', 1);
        const edits = stub.appliedEdits.length;
        const result = (await commands.executeCommand(ServerCommands.generateKernel)) as Record<string, unknown>;
        assert.equal(result?.ok, true, `${JSON.stringify(result)}\n${log()}`);
        assert.equal(result.path, path.join(tmp, '19_ReLU_dice.py'));
        assert.equal(stub.progress.at(-1)!.title, 'DICE: generating a CUDA kernel');
        // The server creates the file through the editor (CreateFile + insert), so it can be undone.
        const edit = stub.appliedEdits[edits] as WorkspaceEdit;
        assert.deepEqual(
            edit.operations.map((o) => o.kind),
            ['create', 'edit'],
        );
        assert.match(edit.entries()[0][1][0].newText, /^# Generated by DICE from 19_ReLU\.py/);
    });

    it('stops a generation when its progress notification is cancelled', async () => {
        // Small blocks make the whole-program generation long enough to cancel in flight.
        stub.setSetting('dice.blockSize', 4);
        stub.setSetting('dice.stepsPerBlock', 4);
        stub.onProgressReport = (report, cancel) => {
            if (report.message) {
                cancel();
            }
        };
        const edits = stub.appliedEdits.length;
        const started = Date.now();
        await commands.executeCommand(ServerCommands.generateKernel);
        const elapsed = Date.now() - started;
        stub.onProgressReport = undefined;
        assert.equal(stub.appliedEdits.length, edits, 'nothing was written');
        assert.match(log(), /dice\.generateKernel: (cancelled|failed, cancelled)/);
        // Uncancelled, this generation runs for many seconds with the status bar on "generating".
        await until('the server to go idle after the cancel', () => statusText().startsWith('$(check)'), 5_000, () => `${statusText()}\n${log()}`);
        console.log(`      generation cancelled after ${elapsed} ms: ${log().split("\n").filter((l) => l.includes("generateKernel")).pop()}`);
    });

    it('restarts the server after it is killed', async () => {
        const pid = ext!.manager.current!.pid!;
        process.kill(pid, 'SIGKILL');
        await until('a new server process', () => ext!.manager.state === 'running' && ext!.manager.current?.pid !== pid, 30_000, log);
        assert.match(log(), /stopped unexpectedly; restarting in 500 ms/);
        assert.ok(!isAlive(pid));
        assert.ok(stub.commands.has(ServerCommands.fillAllMasks), 'the new client took the command ids over again');
    });

    it('restarts the server with the stored model server API key in its environment', async function () {
        if (process.platform !== 'linux') {
            this.skip(); // reads the process's environment from /proc
        }
        const environ = (pid: number): string[] => fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
        await until('a running server', () => ext!.manager.current?.pid !== undefined, 30_000, () => `${ext!.manager.state}\n${log()}`);
        const before = ext!.manager.current!.pid!;
        const inherited = process.env.DICE_SERVER_API_KEY;
        const expected = inherited === undefined ? undefined : `DICE_SERVER_API_KEY=${inherited}`;
        assert.equal(environ(before).find((v) => v.startsWith('DICE_SERVER_API_KEY=')), expected, 'no key stored: inherited as is');
        stub.inputAnswers.push('sk-integration-test');
        await stub.commands.get('dice.setServerApiKey')!();
        // (while the old one stops, the phase still says running and there is no current server)
        const started = (): number | undefined => (ext!.manager.state === 'running' ? ext!.manager.current?.pid : undefined);
        await until('a server started with the key', () => ![undefined, before].includes(started()), 30_000, log);
        const pid = started()!;
        assert.ok(environ(pid).includes('DICE_SERVER_API_KEY=sk-integration-test'));
        assert.ok(environ(pid).includes(`PYTHONPATH=${process.env.PYTHONPATH}`), 'the rest of the environment is inherited');
        assert.ok(!log().includes('sk-integration-test'), 'the key is never logged');
        await until('the ready status', () => statusText().startsWith('$(check)'), 60_000, () => `${statusText()}\n${log()}`);
    });
});
