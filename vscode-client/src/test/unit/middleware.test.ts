import * as assert from 'assert/strict';
import type { CancellationToken, InlineCompletionContext, Position, TextDocument } from 'vscode';
import type { ConfigurationParams } from 'vscode-languageserver-protocol';
import { completeArguments, createMiddleware, MiddlewareDeps } from '../../common/middleware';
import { DEFAULT_SERVER_SETTINGS } from '../../common/protocol';
import { InlineCompletionTriggerKind, Uri } from '../stub/vscode';

const editor = { uri: 'file:///k/softmax.cu', line: 4, character: 8 };
const token = { isCancellationRequested: false } as CancellationToken;

describe('middleware: palette arguments', () => {
    it('takes the active document (and cursor for fillMask) when the palette passes nothing', () => {
        assert.deepEqual(completeArguments('dice.fillAllMasks', [], editor), { ok: true, args: [editor.uri] });
        assert.deepEqual(completeArguments('dice.fillMask', [], editor), {
            ok: true,
            args: [editor.uri, { line: 4, character: 8 }],
        });
        assert.deepEqual(completeArguments('dice.generateKernel', [], editor), { ok: true, args: [editor.uri] });
    });

    it('keeps the arguments a code lens or code action sent', () => {
        const at = { line: 1, character: 2 };
        assert.deepEqual(completeArguments('dice.fillMask', ['file:///other.cu', at], editor), {
            ok: true,
            args: ['file:///other.cu', at],
        });
    });

    it('turns an explorer Uri into its string form', () => {
        const uri = Uri.file('/refs/level1/19_ReLU.py');
        assert.deepEqual(completeArguments('dice.generateKernel', [uri], undefined), { ok: true, args: ['file:///refs/level1/19_ReLU.py'] });
    });

    it('explains what is missing instead of sending a bad request', () => {
        const noEditor = completeArguments('dice.validateKernel', [], undefined);
        assert.equal(noEditor.ok, false);
        // A cursor in another document does not locate a mask in this one.
        const otherDoc = completeArguments('dice.fillMask', ['file:///other.cu'], editor);
        assert.equal(otherDoc.ok, false);
        assert.match(otherDoc.ok ? '' : otherDoc.reason, /cursor/);
    });
});

function deps(overrides: Partial<MiddlewareDeps> = {}): MiddlewareDeps & { ran: unknown[][]; warnings: string[] } {
    const ran: unknown[][] = [];
    const warnings: string[] = [];
    return {
        ran,
        warnings,
        automaticSuggestions: () => true,
        serverSettings: () => ({ ...DEFAULT_SERVER_SETTINGS, candidates: 7 }),
        activeEditor: () => editor,
        runServerCommand: async (command, args) => {
            ran.push([command, ...args]);
            return { ok: true };
        },
        warn: (m) => warnings.push(m),
        ...overrides,
    };
}

describe('middleware: inline completion gate', () => {
    const doc = {} as TextDocument;
    const pos = {} as Position;
    const context = (triggerKind: InlineCompletionTriggerKind) =>
        ({ triggerKind, selectedCompletionInfo: undefined }) as unknown as InlineCompletionContext;

    it('asks the server unless automatic suggestions are off and the trigger is automatic', async () => {
        let asked = 0;
        const next = async () => {
            asked += 1;
            return [];
        };
        const on = createMiddleware(deps());
        const off = createMiddleware(deps({ automaticSuggestions: () => false }));
        await on.provideInlineCompletionItems!(doc, pos, context(InlineCompletionTriggerKind.Automatic), token, next);
        assert.equal(asked, 1);
        assert.deepEqual(await off.provideInlineCompletionItems!(doc, pos, context(InlineCompletionTriggerKind.Automatic), token, next), []);
        assert.equal(asked, 1);
        // Explicit "Trigger Inline Suggestion" still works with automatic suggestions off.
        await off.provideInlineCompletionItems!(doc, pos, context(InlineCompletionTriggerKind.Invoke), token, next);
        assert.equal(asked, 2);
    });
});

describe('middleware: executeCommand', () => {
    it('routes DICE commands through the progress runner with completed arguments', async () => {
        const d = deps();
        const m = createMiddleware(d);
        let nextCalled = false;
        const result = await m.executeCommand!('dice.fillMask', [], async () => {
            nextCalled = true;
        });
        assert.deepEqual(result, { ok: true });
        assert.equal(nextCalled, false);
        assert.deepEqual(d.ran, [['dice.fillMask', editor.uri, { line: 4, character: 8 }]]);
    });

    it('leaves other commands to the client and warns instead of sending incomplete ones', async () => {
        const d = deps({ activeEditor: () => undefined });
        const m = createMiddleware(d);
        assert.equal(await m.executeCommand!('other.command', [1], async (c: string, a: unknown[]) => `${c}:${a}`), 'other.command:1');
        assert.equal(await m.executeCommand!('dice.fillAllMasks', [], async () => 'unused'), undefined);
        assert.deepEqual(d.ran, []);
        assert.equal(d.warnings.length, 1);
    });
});

describe('middleware: workspace/configuration', () => {
    it('answers the dice section with the validated server object and passes others through', async () => {
        const m = createMiddleware(deps());
        const params: ConfigurationParams = { items: [{ section: 'dice' }, { section: 'editor' }] };
        const answer = await m.workspace!.configuration!(params, token, async () => [{ server: { command: [] } }, { tabSize: 4 }]);
        assert.deepEqual(answer, [{ ...DEFAULT_SERVER_SETTINGS, candidates: 7 }, { tabSize: 4 }]);
    });
});
