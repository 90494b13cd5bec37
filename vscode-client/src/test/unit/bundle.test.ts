// The file the .vsix ships (dist/extension.js, built by `npm run bundle` in pretest) loads with only
// `vscode` external, activates, answers every contributed command and deactivates.

import * as assert from 'assert/strict';
import * as fs from 'fs';
import * as path from 'path';
import { stub, StubSecretStorage } from '../stub/vscode';

const ROOT = path.join(__dirname, '..', '..', '..');
const packageJson = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'));

describe('bundle: dist/extension.js as packaged', () => {
    beforeEach(() => stub.reset());

    it('is package.json main, activates and deactivates under the stub', async () => {
        const main = path.join(ROOT, packageJson.main);
        assert.ok(fs.existsSync(main), `${packageJson.main} is missing: run \`npm run bundle\``);
        // eslint-disable-next-line @typescript-eslint/no-require-imports -- loading the bundle is the point
        const extension = require(main) as { activate(c: unknown): void; deactivate(): Promise<void> };
        const subscriptions: { dispose(): unknown }[] = [];
        extension.activate({ subscriptions, secrets: new StubSecretStorage() });
        const contributed = packageJson.contributes.commands.map((c: { command: string }) => c.command);
        // plus the two internal ones: the mask clean-up after a fill, and the label command of every inline item
        const internal = ['dice.removeMaskComment', 'dice.suggestionAccepted'];
        assert.deepEqual([...stub.commands.keys()].sort(), [...new Set([...contributed, ...internal])].sort());
        assert.equal(stub.statusItems.length, 1);
        await extension.deactivate();
        subscriptions.forEach((d) => d.dispose());
        assert.equal(stub.commands.size, 0, 'every registration is disposed');
    });
});
