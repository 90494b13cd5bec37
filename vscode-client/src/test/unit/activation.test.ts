import * as assert from 'assert/strict';
import * as fs from 'fs';
import * as path from 'path';
import { activateDice, DiceExtension } from '../../common/activation';
import { SERVER_API_KEY_SECRET } from '../../common/apiKey';
import { ConfigurationTarget, makeDocument, stub, StubSecretStorage, ThemeColor } from '../stub/vscode';
import { FakeWorld, settle } from './fakes';

const packageJson = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', '..', 'package.json'), 'utf8'));
const contributed: string[] = packageJson.contributes.commands.map((c: { command: string }) => c.command);
// Registered but not in the palette: runs after a mask fill is accepted (ghostText.ts), and the command
// every inline item carries (its verdict label).
const registered = [...new Set([...contributed, 'dice.removeMaskComment', 'dice.suggestionAccepted'])].sort();

const CU = makeDocument('/k/softmax.cu', 'cuda-cpp', '__global__ void f(float* x) {\n    /* <MASK> */\n}\n');
const REFERENCE = makeDocument(
    '/refs/19_ReLU.py',
    'python',
    'import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n\ndef get_inputs():\n    return [torch.randn(16)]\n',
);
const PLAIN_PY = makeDocument('/src/app.py', 'python', 'print("hello")\n');

describe('activation: command wiring and life cycle', () => {
    let world: FakeWorld;
    let ext: DiceExtension | undefined;
    let subscriptions: { dispose(): unknown }[];
    let secrets: StubSecretStorage;

    const activate = (): DiceExtension => {
        subscriptions = [];
        ext = activateDice({ subscriptions, secrets } as never, world.factory);
        return ext;
    };
    const log = () => stub.channels[0];
    const item = () => stub.statusItems[0];

    beforeEach(() => {
        stub.reset();
        world = new FakeWorld();
        secrets = new StubSecretStorage();
    });
    afterEach(async () => {
        await ext?.dispose();
        subscriptions.forEach((d) => d.dispose());
        ext = undefined;
    });

    it('answers every contributed command before any server runs, and starts none for plain Python', async () => {
        stub.textDocuments = [PLAIN_PY];
        activate();
        await settle();
        assert.deepEqual([...stub.commands.keys()].sort(), registered);
        assert.equal(world.handles.length, 0);
        assert.equal(item().text, '$(circle-outline) DICE');
        assert.equal(item().command, 'dice.showLog');
    });

    it('starts the server for a CUDA file or a KernelBench reference, once', async () => {
        activate();
        stub.documentOpened.fire(PLAIN_PY);
        await settle();
        assert.equal(world.handles.length, 0);
        stub.documentOpened.fire(REFERENCE);
        stub.documentOpened.fire(CU);
        await settle();
        assert.equal(world.handles.length, 1);
        assert.equal(ext!.manager.state, 'running');
        // The client now owns the server command ids (the fake registers them like ExecuteCommandFeature).
        assert.equal(world.last.options.launch.command, 'python3');
    });

    it('runs "Fill mask at cursor" from the palette with the cursor, a progress notification and the token', async () => {
        stub.textDocuments = [CU];
        stub.activeTextEditor = { document: CU, selection: { active: { line: 1, character: 6 } } };
        world.script = {
            answer: () => ({ ok: true, applied: true, filled: [{ mask: 0 }], skipped: [] }),
            progress: [
                { kind: 'begin', title: 'DICE: filling a mask', percentage: 0 },
                { kind: 'report', message: 'generating 1/1', percentage: 50 },
                { kind: 'end' },
            ],
        };
        activate();
        await settle();
        const result = await stub.commands.get('dice.fillMask')!();
        assert.deepEqual(result, { ok: true, applied: true, filled: [{ mask: 0 }], skipped: [] });
        const sent = world.last.executed[0];
        assert.equal(sent.command, 'dice.fillMask');
        assert.deepEqual(sent.args, ['file:///k/softmax.cu', { line: 1, character: 6 }]);
        assert.match(sent.workDoneToken, /^dice-/);
        assert.deepEqual(stub.progress, [
            {
                title: 'DICE: filling the mask',
                reports: [
                    { message: undefined, increment: 0 },
                    { message: 'generating 1/1', increment: 50 },
                ],
            },
        ]);
        assert.ok(log().lines.some((l) => l.includes('dice.fillMask: filled 1 mask(s)')));
        assert.deepEqual(stub.messages, [], 'the server shows its own result message');
    });

    it('starts the server when a server command comes before any CUDA file', async () => {
        stub.activeTextEditor = { document: CU, selection: { active: { line: 0, character: 0 } } };
        world.script = { answer: () => ({ ok: true, verdict: {}, label: 'compiled ✓ · not run' }) };
        activate();
        const result = await stub.commands.get('dice.validateKernel')!();
        assert.deepEqual(result, { ok: true, verdict: {}, label: 'compiled ✓ · not run' });
        assert.equal(world.handles.length, 1);
        assert.deepEqual(world.last.executed[0].args, ['file:///k/softmax.cu']);
    });

    it('says so when the server does not provide a command', async () => {
        stub.activeTextEditor = { document: CU, selection: { active: { line: 0, character: 0 } } };
        world.script = { advertise: false };
        activate();
        await stub.commands.get('dice.validateKernel')!();
        assert.equal(world.handles.length, 1);
        assert.equal(world.last.executed.length, 0);
        assert.match(stub.messages.at(-1)!.text, /does not provide dice\.validateKernel/);
    });

    it('drives the status bar from dice/status and logs malformed payloads', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        world.last.options.onStatus({ state: 'ready', model: 'dice-tiny', device: 'cpu', message: null });
        assert.equal(item().text, '$(check) DICE dice-tiny · cpu');
        world.last.options.onStatus({ state: 'validating', model: 'dice-tiny', device: 'cpu', message: 'validating k.cu' });
        assert.equal(item().text, '$(beaker) DICE: validating');
        world.last.options.onStatus({ nonsense: true });
        assert.ok(log().lines.some((l) => l.includes('malformed dice/status')));
    });

    it('answers dice.suggestionAccepted (accepting an item never errors) by logging its label', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        await stub.commands.get('dice.suggestionAccepted')!({ uri: 'file:///k/softmax.cu', label: 'compiled ✓ · not run', usable: true });
        assert.ok(log().lines.includes('[info] Accepted a suggestion in softmax.cu: compiled ✓ · not run'), log().lines.join('\n'));
        await stub.commands.get('dice.suggestionAccepted')!({ uri: 'file:///k/softmax.cu', label: 'compiled ✗ · k.cu(40): error', usable: false });
        assert.match(log().lines.at(-1)!, /compiled ✗ · k\.cu\(40\): error \(it failed validation\)$/);
        await stub.commands.get('dice.suggestionAccepted')!();
        assert.match(log().lines.at(-1)!, /^\[info\] Accepted a suggestion/);
        assert.deepEqual(stub.messages, []);
    });

    it('shows why no suggestion was usable in the status bar until an edit, and logs it', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        world.last.options.onStatus({ state: 'ready', model: 'dice-tiny', device: 'cpu', message: null });
        const message = '3 candidates, none compiled: softmax.cu(2): error: expected an expression';
        world.last.options.onSuggestionStatus({
            uri: 'file:///k/softmax.cu',
            position: { line: 1, character: 4 },
            candidates: 3,
            usable: 0,
            shown: 1,
            message,
        });
        assert.match(item().text, /^\$\(warning\) DICE: 3 candidates, none compiled/);
        assert.equal((item().backgroundColor as ThemeColor).id, 'statusBarItem.warningBackground');
        assert.ok(log().lines.includes(`[warning] No usable suggestion at softmax.cu:2:5: ${message}`), log().lines.join('\n'));
        assert.deepEqual(stub.messages, [], 'no pop-up: the status bar says it');

        stub.documentChanged.fire({ document: CU, contentChanges: [] }); // a dirty-state change only
        assert.match(item().text, /^\$\(warning\)/);
        stub.documentChanged.fire({ document: CU, contentChanges: [{ text: 'x' }] });
        assert.equal(item().text, '$(check) DICE dice-tiny · cpu');

        world.last.options.onSuggestionStatus({ uri: 'file:///k/softmax.cu' });
        assert.ok(log().lines.some((l) => l.includes('malformed dice/suggestionStatus')));
    });

    it('sends changed settings live and restarts only for server settings', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        stub.setSetting('dice.candidates', 5);
        await settle();
        assert.equal(world.last.pushed.length, 1);
        assert.equal(world.last.pushed[0].candidates, 5);
        assert.equal(world.handles.length, 1);

        stub.setSetting('dice.server.pythonPath', '/opt/venv/bin/python');
        await settle();
        assert.equal(world.handles.length, 2);
        assert.equal(world.handles[0].stops, 1);
        assert.deepEqual(world.last.options.launch, { command: '/opt/venv/bin/python', args: ['-m', 'lsp_server'] });
        assert.equal(world.last.options.settings.candidates, 5, 'the new process starts with the current settings');
    });

    it('sends the model server settings live: the server reloads the model, the process stays', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        stub.setSetting('dice.modelServer', ' http://gpu-box:8000 ');
        stub.setSetting('dice.modelServerModel', 'dice-8b');
        await settle();
        assert.equal(world.handles.length, 1);
        assert.equal(world.last.pushed.at(-1)!.modelServer, 'http://gpu-box:8000');
        assert.equal(world.last.pushed.at(-1)!.modelServerModel, 'dice-8b');
    });

    it('starts the server with the stored API key in its environment', async () => {
        stub.textDocuments = [CU];
        await secrets.store(SERVER_API_KEY_SECRET, 'sk-stored');
        activate();
        await settle();
        const env = world.last.options.launch.env!;
        assert.equal(env.DICE_SERVER_API_KEY, 'sk-stored');
        assert.equal(env.PATH, process.env.PATH, 'the rest is the inherited environment');
        assert.match(log().lines.join('\n'), /Starting the DICE server: python3 -m lsp_server \(with \$DICE_SERVER_API_KEY from the secret storage\)/);
        assert.ok(!log().lines.some((l) => l.includes('sk-stored')), 'the key is never logged');
    });

    it('starts the server with the inherited environment as is when no API key is stored', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        assert.deepEqual(world.last.options.launch, { command: 'python3', args: ['-m', 'lsp_server'] }, 'no env: spawn inherits ours');
    });

    it('stores the key from a password box and restarts the server with it; an empty answer removes it', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        assert.equal(world.last.options.launch.env, undefined);

        stub.inputAnswers.push(undefined); // Escape: nothing changes
        await stub.commands.get('dice.setServerApiKey')!();
        await settle();
        assert.equal(stub.inputBoxes[0].password, true);
        assert.match(stub.inputBoxes[0].prompt!, /DICE_SERVER_API_KEY/);
        assert.equal(world.handles.length, 1);

        stub.inputAnswers.push(' sk-new ');
        await stub.commands.get('dice.setServerApiKey')!();
        await settle();
        assert.equal(secrets.values.get(SERVER_API_KEY_SECRET), 'sk-new');
        assert.equal(world.handles.length, 2);
        assert.equal(world.handles[0].stops, 1);
        assert.equal(world.last.options.launch.env!.DICE_SERVER_API_KEY, 'sk-new');
        assert.equal(ext!.manager.state, 'running');

        stub.inputAnswers.push('');
        await stub.commands.get('dice.setServerApiKey')!();
        await settle();
        assert.equal(secrets.values.has(SERVER_API_KEY_SECRET), false);
        assert.equal(world.handles.length, 3);
        assert.equal(world.last.options.launch.env, undefined);
        assert.ok(!log().lines.some((l) => l.includes('sk-new')), 'the key is never logged');
    });

    it('clears the key (restarting the server) and leaves a server that never started alone', async () => {
        activate();
        await secrets.store(SERVER_API_KEY_SECRET, 'sk-old'); // e.g. from another window
        await settle();
        assert.equal(world.handles.length, 0, 'no server yet: the next start reads the key');

        stub.textDocuments = [CU];
        stub.documentOpened.fire(CU);
        await settle();
        assert.equal(world.last.options.launch.env!.DICE_SERVER_API_KEY, 'sk-old');
        await stub.commands.get('dice.clearServerApiKey')!();
        await settle();
        assert.equal(world.handles.length, 2);
        assert.equal(world.last.options.launch.env, undefined);
        assert.match(stub.messages.at(-1)!.text, /API key removed/);

        await stub.commands.get('dice.clearServerApiKey')!();
        await settle();
        assert.equal(world.handles.length, 2, 'nothing stored: no restart');
        assert.match(stub.messages.at(-1)!.text, /no model server API key is stored/);
    });

    it('declares limited support for untrusted workspaces', () => {
        const untrusted = packageJson.capabilities?.untrustedWorkspaces;
        assert.equal(untrusted?.supported, 'limited');
        assert.match(untrusted.description, /not trusted/);
        assert.ok(untrusted.restrictedConfigurations.includes('dice.server.command'));
        // a workspace must not send the user's API key (and code) to a server of its choosing
        assert.ok(untrusted.restrictedConfigurations.includes('dice.modelServer'));
    });

    it("sends VS Code's workspace trust, not the setting, and again once trust is granted", async () => {
        stub.textDocuments = [CU];
        stub.setSetting('dice.trustedWorkspace', true); // a workspace may not declare itself trusted
        activate();
        await settle();
        assert.equal(world.last.options.settings.trustedWorkspace, false, 'Restricted Mode: compile-only');

        stub.isTrusted = true;
        stub.trustGranted.fire();
        await settle();
        assert.equal(world.last.pushed.length, 1);
        assert.equal(world.last.pushed[0].trustedWorkspace, true);
        assert.equal(world.handles.length, 1, 'no restart: the running server is told');
    });

    it('toggles automatic suggestions where the effective value lives', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        await stub.commands.get('dice.toggleAutomaticSuggestions')!();
        await settle();
        assert.deepEqual(stub.updates, [{ key: 'dice.automaticTrigger', value: false, target: ConfigurationTarget.Global }]);
        assert.equal(world.last.pushed.at(-1)!.automaticTrigger, false);
        assert.match(item().text, /eye-closed/);
        assert.match(stub.messages[0].text, /automatic suggestions off/);

        stub.workspaceSettings.set('dice.automaticTrigger', false);
        await stub.commands.get('dice.toggleAutomaticSuggestions')!();
        assert.deepEqual(stub.updates[1], { key: 'dice.automaticTrigger', value: true, target: ConfigurationTarget.Workspace });
    });

    it('restarts on request and shows the log', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        await stub.commands.get('dice.restartServer')!();
        assert.equal(world.handles.length, 2);
        stub.commands.get('dice.showLog')!();
        assert.equal(log().shown, 1);
    });

    it('keeps the palette answering after a crash', async () => {
        stub.textDocuments = [CU];
        activate();
        await settle();
        world.last.crash();
        await settle();
        assert.equal(ext!.manager.state, 'stopped');
        assert.equal(item().text, '$(debug-disconnect) DICE: stopped');
        assert.deepEqual([...stub.commands.keys()].sort(), registered, 'fallbacks are back');
        // While the restart is pending, a server command offers recovery instead of failing silently.
        stub.answers.push('Show log');
        await stub.commands.get('dice.fillAllMasks')!('file:///k/softmax.cu');
        assert.equal(stub.messages.at(-1)!.level, 'error');
        assert.deepEqual(stub.messages.at(-1)!.actions, ['Restart server', 'Show log']);
        assert.equal(log().shown, 1);
    });

    it('reports bad settings once and uses the defaults', async () => {
        stub.settings.set('dice.policy', 'greedy');
        stub.textDocuments = [CU];
        activate();
        await settle();
        assert.equal(world.last.options.settings.policy, 'dynamic');
        const warnings = stub.messages.filter((m) => m.level === 'warning');
        assert.equal(warnings.length, 1);
        assert.match(warnings[0].text, /dice\.policy = "greedy"/);
    });

    it('stops the server on deactivate', async () => {
        stub.textDocuments = [CU];
        const e = activate();
        await settle();
        await e.dispose();
        assert.equal(world.last.stops, 1);
        assert.equal(e.manager.state, 'stopped');
    });
});
