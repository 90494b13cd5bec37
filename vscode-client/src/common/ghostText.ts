// VS Code draws ghost text only for insertions: an inline item that replaces `/* <MASK> */` (what the
// server returns at a mask) would be dropped silently. So, with the cursor right after the mask, the
// item becomes an insertion there, and a command run after acceptance deletes the mask comment. The
// document ends up exactly as the server's replacement would leave it. The item's own command (the
// server's `dice.suggestionAccepted`, which carries its verdict label) still runs, after the deletion.

import type { InlineCompletionItem, InlineCompletionList, Position, TextDocument } from 'vscode';
import { SUGGESTION_ACCEPTED_COMMAND } from './suggestionStatus';
import { deleteTextIfUnchanged, executeCommand, newInlineItem, newRange } from './vscodeapi';

export { SUGGESTION_ACCEPTED_COMMAND };
export const REMOVE_MASK_COMMAND = 'dice.removeMaskComment';

/** Arguments of REMOVE_MASK_COMMAND: where the comment was and what it said (checked before deleting). */
export interface RemoveMaskArgs {
    uri: string;
    range: { start: { line: number; character: number }; end: { line: number; character: number } };
    text: string;
    /** The item's own command, run after the deletion (whether or not the comment was still there). */
    after?: { command: string; arguments?: unknown[] };
}

/** The item to show instead of `item`, or `item` itself when VS Code can draw it as it is. */
export function asInsertion(item: InlineCompletionItem, document: TextDocument, cursor: Position): InlineCompletionItem {
    const range = item.range;
    // the server's own command only carries the verdict label: an item with any other command is left alone
    const ownCommand = item.command === undefined || item.command.command === SUGGESTION_ACCEPTED_COMMAND;
    if (!range || range.isEmpty || !range.isSingleLine || typeof item.insertText !== 'string' || !ownCommand) {
        return item;
    }
    const replaced = document.getText(range);
    if ((item.filterText ?? item.insertText).startsWith(replaced)) {
        return item; // already a continuation of what is there
    }
    if (range.end.line !== cursor.line || range.end.character !== cursor.character) {
        return item; // the cursor sits inside the mask: nothing VS Code can draw as ghost text
    }
    const args: RemoveMaskArgs = {
        uri: document.uri.toString(),
        range: {
            start: { line: range.start.line, character: range.start.character },
            end: { line: range.end.line, character: range.end.character },
        },
        text: replaced,
    };
    if (item.command) {
        args.after = { command: item.command.command, arguments: item.command.arguments ?? [] };
    }
    return newInlineItem(item.insertText, newRange(range.end, range.end), {
        title: item.command?.title ?? 'DICE: remove the mask comment',
        command: REMOVE_MASK_COMMAND,
        arguments: [args],
    });
}

export function asInsertions(
    result: InlineCompletionItem[] | InlineCompletionList | null | undefined,
    document: TextDocument,
    cursor: Position,
): InlineCompletionItem[] | InlineCompletionList | null | undefined {
    if (!result) {
        return result;
    }
    if (Array.isArray(result)) {
        return result.map((item) => asInsertion(item, document, cursor));
    }
    result.items = result.items.map((item) => asInsertion(item, document, cursor));
    return result;
}

/** REMOVE_MASK_COMMAND's handler: deletes the comment unless the user changed it meanwhile, then runs the
 * item's own command. Resolves to whether the comment was deleted. */
export async function removeMaskComment(args: RemoveMaskArgs): Promise<boolean> {
    const deleted = await deleteTextIfUnchanged(args.uri, args.range, args.text);
    if (args.after) {
        try {
            await executeCommand(args.after.command, ...(args.after.arguments ?? []));
        } catch {
            // the label command only logs; failing to run it must not undo an accepted suggestion
        }
    }
    return deleted;
}

