import * as assert from 'assert/strict';
import * as fs from 'fs';
import * as path from 'path';
import { DEFAULT_SERVER_SETTINGS, SERVER_SETTING_KEYS } from '../../common/protocol';
import { expandPath, resolveServerLaunch, resolveServerSettings } from '../../common/settings';

const packageJson = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', '..', 'package.json'), 'utf8'));
const properties: Record<string, Record<string, unknown>> = packageJson.contributes.configuration.properties;

const getter =
    (values: Record<string, unknown>) =>
    (key: string): unknown =>
        values[key];

describe('settings: dice.* -> the server settings object', () => {
    it('gives exactly the INTERNALS defaults when nothing is set', () => {
        const { settings, problems } = resolveServerSettings(getter({}));
        assert.deepEqual(settings, {
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
        assert.deepEqual(problems, []);
    });

    it('passes valid values through and never leaks client-only keys', () => {
        const { settings } = resolveServerSettings(
            getter({ candidates: 8, policy: 'entropy', threshold: 0.5, device: 'cuda', 'server.command': ['dice-lsp'] }),
        );
        assert.equal(settings.candidates, 8);
        assert.equal(settings.policy, 'entropy');
        assert.equal(settings.threshold, 0.5);
        assert.equal(settings.device, 'cuda');
        assert.deepEqual(Object.keys(settings).sort(), [...SERVER_SETTING_KEYS].sort());
    });

    it('replaces each bad value by its default and says so', () => {
        const { settings, problems } = resolveServerSettings(
            getter({ candidates: 0, policy: 'greedy', threshold: 0, blockSize: 2.5, automaticTrigger: 'yes' }),
        );
        assert.equal(settings.candidates, 3);
        assert.equal(settings.policy, 'dynamic');
        assert.equal(settings.threshold, 0.9);
        assert.equal(settings.blockSize, 4);
        assert.equal(settings.automaticTrigger, true);
        assert.equal(problems.length, 5);
        assert.match(problems.join('\n'), /dice\.policy = "greedy" is not static \| dynamic \| entropy; using "dynamic"/);
    });

    it("lets VS Code's workspace trust decide trustedWorkspace; the setting only without it", () => {
        assert.equal(resolveServerSettings(getter({ trustedWorkspace: true })).settings.trustedWorkspace, true);
        assert.equal(resolveServerSettings(getter({ trustedWorkspace: true }), {}, false).settings.trustedWorkspace, false);
        assert.equal(resolveServerSettings(getter({}), {}, true).settings.trustedWorkspace, true);
    });

    it('passes the model server and its model through, trimmed, and rejects non-strings', () => {
        const { settings, problems } = resolveServerSettings(getter({ modelServer: ' http://gpu-box:8000 ', modelServerModel: 'dice-8b ' }));
        assert.equal(settings.modelServer, 'http://gpu-box:8000');
        assert.equal(settings.modelServerModel, 'dice-8b');
        assert.deepEqual(problems, []);
        const bad = resolveServerSettings(getter({ modelServer: 8000 }));
        assert.equal(bad.settings.modelServer, '');
        assert.match(bad.problems[0], /dice\.modelServer = 8000 is not a URL/);
    });

    it('never has a setting for the API key', () => {
        const names = [...SERVER_SETTING_KEYS, ...Object.keys(properties)].map((k) => k.toLowerCase());
        assert.ok(!names.some((k) => /api.?key|secret|password/.test(k)), names.join(' '));
    });

    it('expands ~ and ${workspaceFolder} in the model path', () => {
        const vars = { home: '/home/ada', workspaceFolder: '/src/kernels' };
        assert.equal(resolveServerSettings(getter({ modelPath: '~/models/dice-8b' }), vars).settings.modelPath, '/home/ada/models/dice-8b');
        assert.equal(resolveServerSettings(getter({ modelPath: ' ${workspaceFolder}/ckpt ' }), vars).settings.modelPath, '/src/kernels/ckpt');
        assert.equal(expandPath('a~b', vars), 'a~b');
    });
});

describe('settings: the server command line', () => {
    it('defaults to python3 -m lsp_server (python on Windows)', () => {
        assert.deepEqual(resolveServerLaunch(getter({}), {}, 'linux'), { command: 'python3', args: ['-m', 'lsp_server'] });
        assert.deepEqual(resolveServerLaunch(getter({}), {}, 'win32'), { command: 'python', args: ['-m', 'lsp_server'] });
    });

    it('uses dice.server.pythonPath with -m lsp_server', () => {
        const launch = resolveServerLaunch(getter({ 'server.pythonPath': '~/venv/bin/python' }), { home: '/h' }, 'linux');
        assert.deepEqual(launch, { command: '/h/venv/bin/python', args: ['-m', 'lsp_server'] });
    });

    it('lets dice.server.command win over the interpreter', () => {
        const launch = resolveServerLaunch(
            getter({ 'server.command': ['${workspaceFolder}/.venv/bin/dice-lsp', '--tcp', ''], 'server.pythonPath': '/usr/bin/python3' }),
            { workspaceFolder: '/w' },
        );
        assert.deepEqual(launch, { command: '/w/.venv/bin/dice-lsp', args: ['--tcp'] });
        assert.deepEqual(resolveServerLaunch(getter({ 'server.command': ' dice-lsp ' })), { command: 'dice-lsp', args: [] });
    });
});

describe('package.json contributes the settings the server reads', () => {
    it('has every server key with the protocol default and a description', () => {
        for (const key of SERVER_SETTING_KEYS) {
            const prop = properties[`dice.${key}`];
            assert.ok(prop, `dice.${key} is contributed`);
            assert.deepEqual(prop.default, DEFAULT_SERVER_SETTINGS[key], `default of dice.${key}`);
            assert.ok(prop.description || prop.markdownDescription, `dice.${key} has a description`);
        }
    });

    it('accepts in the client exactly what its JSON schema accepts', () => {
        for (const key of SERVER_SETTING_KEYS) {
            const prop = properties[`dice.${key}`];
            const accepts = (value: unknown): boolean => resolveServerSettings(getter({ [key]: value })).problems.length === 0;
            if (Array.isArray(prop.enum)) {
                prop.enum.forEach((v) => assert.ok(accepts(v), `dice.${key} accepts ${v}`));
                assert.ok(!accepts('bogus'), `dice.${key} rejects bogus`);
            }
            if (typeof prop.exclusiveMinimum === 'number') {
                assert.ok(!accepts(prop.exclusiveMinimum), `dice.${key} rejects its exclusive minimum`);
                assert.ok(accepts(prop.exclusiveMinimum + 0.01), `dice.${key} accepts just above it`);
            }
            if (typeof prop.minimum === 'number' && typeof prop.maximum === 'number') {
                const step = prop.type === 'integer' ? 1 : 0.01;
                assert.ok(accepts(prop.minimum) && accepts(prop.maximum), `dice.${key} accepts its bounds`);
                assert.ok(!accepts(prop.minimum - step) && !accepts(prop.maximum + step), `dice.${key} rejects beyond its bounds`);
            }
        }
    });

    it('contributes the client-only server settings', () => {
        assert.deepEqual(properties['dice.server.command'].default, []);
        assert.equal(properties['dice.server.pythonPath'].default, '');
    });
});
