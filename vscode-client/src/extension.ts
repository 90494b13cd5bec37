// Entry point: activation only. The pieces live in src/common/.

import type { ExtensionContext } from 'vscode';
import { activateDice, DiceExtension } from './common/activation';
import { createLanguageClientHandle } from './common/client';

let extension: DiceExtension | undefined;

export function activate(context: ExtensionContext): void {
    extension = activateDice(context, createLanguageClientHandle);
}

export async function deactivate(): Promise<void> {
    await extension?.dispose();
    extension = undefined;
}
