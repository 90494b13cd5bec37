import * as assert from 'assert/strict';
import { registerApiKeyCommands, SERVER_API_KEY_ENV, SERVER_API_KEY_SECRET, serverEnvironment } from '../../common/apiKey';
import { stub, StubSecretStorage } from '../stub/vscode';

describe('apiKey: the environment of the server process', () => {
    const inherited = { PATH: '/usr/bin', HOME: '/home/ada', DICE_SERVER: 'http://gpu-box:8000' };

    it('is the inherited environment plus $DICE_SERVER_API_KEY when a key is stored', () => {
        const env = serverEnvironment(inherited, 'sk-secret');
        assert.deepEqual(env, { ...inherited, DICE_SERVER_API_KEY: 'sk-secret' });
        assert.equal(SERVER_API_KEY_ENV, 'DICE_SERVER_API_KEY', 'the variable the language server reads');
        assert.deepEqual(inherited, { PATH: '/usr/bin', HOME: '/home/ada', DICE_SERVER: 'http://gpu-box:8000' }, 'a copy');
    });

    it('replaces a key the editor was started with by the stored one', () => {
        assert.equal(serverEnvironment({ ...inherited, DICE_SERVER_API_KEY: 'from-shell' }, 'stored')!.DICE_SERVER_API_KEY, 'stored');
    });

    it('is undefined (inherit ours unchanged) without a stored key', () => {
        assert.equal(serverEnvironment(inherited, undefined), undefined);
        assert.equal(serverEnvironment(inherited, ''), undefined);
        assert.equal(serverEnvironment({ ...inherited, DICE_SERVER_API_KEY: 'from-shell' }, undefined), undefined);
    });
});

describe('apiKey: the set and clear commands', () => {
    let secrets: StubSecretStorage;
    let changes: string[];
    let infos: string[];
    let answers: (string | undefined)[];

    beforeEach(() => {
        stub.reset();
        secrets = new StubSecretStorage();
        changes = [];
        infos = [];
        answers = [];
        secrets.onDidChange((e) => changes.push(e.key));
        registerApiKeyCommands({ secrets, askForKey: () => Promise.resolve(answers.shift()), showInfo: (m) => infos.push(m) });
    });

    const run = (id: string) => stub.commands.get(id)!();

    it('stores a trimmed key under its fixed name and never shows it', async () => {
        answers.push('  sk-secret\n');
        await run('dice.setServerApiKey');
        assert.equal(secrets.values.get(SERVER_API_KEY_SECRET), 'sk-secret');
        assert.deepEqual(changes, [SERVER_API_KEY_SECRET]);
        assert.ok(!infos.join('\n').includes('sk-secret'));
    });

    it('changes nothing when the box is cancelled', async () => {
        await secrets.store(SERVER_API_KEY_SECRET, 'sk-old');
        changes = [];
        await run('dice.setServerApiKey');
        assert.equal(secrets.values.get(SERVER_API_KEY_SECRET), 'sk-old');
        assert.deepEqual(changes, []);
        assert.deepEqual(infos, []);
    });

    it('deletes the key on an empty answer and on clear; clearing nothing fires no change', async () => {
        await secrets.store(SERVER_API_KEY_SECRET, 'sk-old');
        answers.push('   ');
        await run('dice.setServerApiKey');
        assert.equal(secrets.values.has(SERVER_API_KEY_SECRET), false);
        await secrets.store(SERVER_API_KEY_SECRET, 'sk-old');
        await run('dice.clearServerApiKey');
        assert.equal(secrets.values.has(SERVER_API_KEY_SECRET), false);
        changes = [];
        await run('dice.clearServerApiKey');
        assert.deepEqual(changes, []);
        assert.match(infos.at(-1)!, /no model server API key is stored/);
    });
});
