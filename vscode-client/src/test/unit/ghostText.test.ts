import * as assert from 'assert/strict';
import type { InlineCompletionItem as VItem, Position as VPosition, TextDocument } from 'vscode';
import { asInsertion, asInsertions, removeMaskComment, REMOVE_MASK_COMMAND, RemoveMaskArgs, SUGGESTION_ACCEPTED_COMMAND } from '../../common/ghostText';
import { InlineCompletionItem, InlineCompletionList, makeDocument, Position, Range, stub, WorkspaceEdit } from '../stub/vscode';

const TEXT = '__global__ void f(float* x) {\n    /* <MASK:8> */\n    x[0] = 1;\n}\n';
const MASK = new Range(1, 4, 1, 18);
const FILL = 'x[threadIdx.x] *= 2.0f;';

const doc = () => makeDocument('/k/f.cu', 'cuda-cpp', TEXT) as TextDocument;
const at = (line: number, character: number) => new Position(line, character) as unknown as VPosition;
const item = (text: string, range: Range) => new InlineCompletionItem(text, range) as unknown as VItem;

describe('ghostText: mask fills VS Code can draw', () => {
    beforeEach(() => stub.reset());

    it('turns a replacement of the mask into an insertion after it plus a clean-up command', () => {
        const out = asInsertion(item(FILL, MASK), doc(), at(1, 18));
        assert.equal(out.insertText, FILL);
        assert.deepEqual([out.range!.start, out.range!.end], [new Position(1, 18), new Position(1, 18)]);
        assert.deepEqual(out.command, {
            title: 'DICE: remove the mask comment',
            command: REMOVE_MASK_COMMAND,
            arguments: [
                {
                    uri: 'file:///k/f.cu',
                    range: { start: { line: 1, character: 4 }, end: { line: 1, character: 18 } },
                    text: '/* <MASK:8> */',
                },
            ],
        });
    });

    it('leaves items VS Code can already draw, or cannot draw at all, as they are', () => {
        const inside = item(FILL, MASK);
        assert.equal(asInsertion(inside, doc(), at(1, 9)), inside, 'cursor inside the comment');
        const empty = item(FILL, new Range(2, 13, 2, 13));
        assert.equal(asInsertion(empty, doc(), at(2, 13)), empty, 'an insertion already');
        const continuation = item('x[0] = 1; // done', new Range(2, 4, 2, 13));
        assert.equal(asInsertion(continuation, doc(), at(2, 13)), continuation, 'continues the text it replaces');
    });

    it("keeps the server's label command: its title on the insertion, run after the clean-up", async () => {
        const accepted = { uri: 'file:///k/f.cu', label: 'compiled ✓ · not run', usable: true };
        const labelled = new InlineCompletionItem(FILL, MASK, {
            title: 'compiled ✓ · not run',
            command: SUGGESTION_ACCEPTED_COMMAND,
            arguments: [accepted],
        }) as unknown as VItem;
        const out = asInsertion(labelled, doc(), at(1, 18));
        assert.deepEqual([out.range!.start, out.range!.end], [new Position(1, 18), new Position(1, 18)]);
        const command = out.command as { title: string; command: string; arguments: RemoveMaskArgs[] };
        assert.equal(command.title, 'compiled ✓ · not run');
        assert.equal(command.command, REMOVE_MASK_COMMAND);
        assert.deepEqual(command.arguments[0].after, { command: SUGGESTION_ACCEPTED_COMMAND, arguments: [accepted] });

        stub.textDocuments = [doc()];
        const seen: unknown[] = [];
        stub.commands.set(SUGGESTION_ACCEPTED_COMMAND, (...args: unknown[]) => seen.push(args));
        assert.equal(await removeMaskComment(command.arguments[0]), true);
        assert.deepEqual(seen, [[accepted]], 'the label command ran once, after the deletion');
        assert.equal(stub.appliedEdits.length, 1);
        // the comment changed meanwhile: nothing is deleted, the label command still runs
        assert.equal(await removeMaskComment({ ...command.arguments[0], text: '/* <MASK> */' }), false);
        assert.equal(seen.length, 2);
        // a missing command does not turn the accepted fill into an error
        stub.commands.delete(SUGGESTION_ACCEPTED_COMMAND);
        assert.equal(await removeMaskComment(command.arguments[0]), true);
    });

    it('leaves items with some other command alone', () => {
        const other = new InlineCompletionItem(FILL, MASK, { title: 'x', command: 'other.extension.cmd' }) as unknown as VItem;
        assert.equal(asInsertion(other, doc(), at(1, 18)), other);
    });

    it('maps both result shapes', () => {
        const list = new InlineCompletionList([new InlineCompletionItem(FILL, MASK)]);
        const out = asInsertions(list as never, doc(), at(1, 18)) as unknown as InlineCompletionList;
        assert.equal(out.items[0].range!.start.character, 18);
        assert.equal(asInsertions(undefined, doc(), at(1, 18)), undefined);
    });

    it('removes the mask comment after acceptance, unless it changed', async () => {
        stub.textDocuments = [doc()];
        const args = { uri: 'file:///k/f.cu', range: { start: { line: 1, character: 4 }, end: { line: 1, character: 18 } }, text: '/* <MASK:8> */' };
        assert.equal(await removeMaskComment(args), true);
        const edit = stub.appliedEdits[0] as WorkspaceEdit;
        const [[uri, edits]] = edit.entries();
        assert.equal(uri.toString(), 'file:///k/f.cu');
        assert.deepEqual(edits.map((e) => [e.range.start, e.range.end, e.newText]), [[new Position(1, 4), new Position(1, 18), '']]);
        assert.equal(await removeMaskComment({ ...args, text: '/* <MASK> */' }), false);
        assert.equal(stub.appliedEdits.length, 1);
    });
});
