// Loaded by mocha (--require): `import ... from 'vscode'` resolves to the stub next to this file.

// eslint-disable-next-line @typescript-eslint/no-require-imports -- the resolver hook lives on the CommonJS Module class
import Module = require('module');
import * as path from 'path';

type Resolve = (request: string, ...rest: unknown[]) => string;
const moduleWithResolver = Module as unknown as { _resolveFilename: Resolve };
const original = moduleWithResolver._resolveFilename;
const stubPath = path.join(__dirname, 'vscode.js');

moduleWithResolver._resolveFilename = function (request: string, ...rest: unknown[]): string {
    return request === 'vscode' ? stubPath : original.call(this, request, ...rest);
};
