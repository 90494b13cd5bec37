// The only module that touches `vscode` values: everything else goes through here, so unit tests
// can swap in the stub in src/test/stub/vscode.ts.

import * as vscode from 'vscode';

export type Disposable = vscode.Disposable;

export function createLogChannel(name: string): vscode.LogOutputChannel {
    return vscode.window.createOutputChannel(name, { log: true });
}

export function createStatusBarItem(id: string, priority: number): vscode.StatusBarItem {
    return vscode.window.createStatusBarItem(id, vscode.StatusBarAlignment.Right, priority);
}

export function themeColor(id: string): vscode.ThemeColor {
    return new vscode.ThemeColor(id);
}

export function registerCommand(command: string, callback: (...args: unknown[]) => unknown): vscode.Disposable {
    return vscode.commands.registerCommand(command, callback);
}

export function getConfiguration(section: string, scope?: vscode.ConfigurationScope): vscode.WorkspaceConfiguration {
    return vscode.workspace.getConfiguration(section, scope);
}

export function onDidChangeConfiguration(
    listener: (e: vscode.ConfigurationChangeEvent) => unknown,
): vscode.Disposable {
    return vscode.workspace.onDidChangeConfiguration(listener);
}

/** VS Code's workspace trust: false in Restricted Mode (nothing from the workspace may be run). */
export function isWorkspaceTrusted(): boolean {
    return vscode.workspace.isTrusted;
}

export function onDidGrantWorkspaceTrust(listener: () => unknown): vscode.Disposable {
    return vscode.workspace.onDidGrantWorkspaceTrust(listener);
}

export function onDidOpenTextDocument(listener: (d: vscode.TextDocument) => unknown): vscode.Disposable {
    return vscode.workspace.onDidOpenTextDocument(listener);
}

export function onDidChangeTextDocument(listener: (e: vscode.TextDocumentChangeEvent) => unknown): vscode.Disposable {
    return vscode.workspace.onDidChangeTextDocument(listener);
}

export function openTextDocuments(): readonly vscode.TextDocument[] {
    return vscode.workspace.textDocuments;
}

export function activeTextEditor(): vscode.TextEditor | undefined {
    return vscode.window.activeTextEditor;
}

export function firstWorkspaceFolder(): string | undefined {
    return vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
}

export function showError(message: string, ...actions: string[]): Thenable<string | undefined> {
    return vscode.window.showErrorMessage(message, ...actions);
}

export function showWarning(message: string, ...actions: string[]): Thenable<string | undefined> {
    return vscode.window.showWarningMessage(message, ...actions);
}

export function showInfo(message: string, ...actions: string[]): Thenable<string | undefined> {
    return vscode.window.showInformationMessage(message, ...actions);
}

/** A password input box that stays open when focus moves; undefined when the user cancels. */
export function askForSecret(title: string, prompt: string): Thenable<string | undefined> {
    return vscode.window.showInputBox({ title, prompt, password: true, ignoreFocusOut: true });
}

export function withNotificationProgress<T>(
    title: string,
    task: (progress: vscode.Progress<{ message?: string; increment?: number }>, token: vscode.CancellationToken) => Thenable<T>,
): Thenable<T> {
    return vscode.window.withProgress({ location: vscode.ProgressLocation.Notification, title, cancellable: true }, task);
}

export function isAutomaticInlineTrigger(context: vscode.InlineCompletionContext): boolean {
    return context.triggerKind === vscode.InlineCompletionTriggerKind.Automatic;
}

/** Writes where the effective value comes from, so a workspace override does not hide the change. */
export function updateSetting(section: string, key: string, value: unknown): Thenable<void> {
    const config = vscode.workspace.getConfiguration(section);
    const where = config.inspect(key);
    const target =
        where?.workspaceFolderValue !== undefined
            ? vscode.ConfigurationTarget.WorkspaceFolder
            : where?.workspaceValue !== undefined
              ? vscode.ConfigurationTarget.Workspace
              : vscode.ConfigurationTarget.Global;
    return config.update(key, value, target);
}

export function executeCommand(command: string, ...args: unknown[]): Thenable<unknown> {
    return vscode.commands.executeCommand(command, ...args);
}

export function newRange(start: vscode.Position, end: vscode.Position): vscode.Range {
    return new vscode.Range(start, end);
}

export function newInlineItem(insertText: string, range: vscode.Range, command: vscode.Command): vscode.InlineCompletionItem {
    return new vscode.InlineCompletionItem(insertText, range, command);
}

type PlainRange = { start: { line: number; character: number }; end: { line: number; character: number } };

/** Deletes `range` in the document at `uri` if it still holds `expected`; false otherwise. */
export async function deleteTextIfUnchanged(uri: string, range: PlainRange, expected: string): Promise<boolean> {
    const document = await vscode.workspace.openTextDocument(vscode.Uri.parse(uri));
    const target = new vscode.Range(range.start.line, range.start.character, range.end.line, range.end.character);
    if (document.getText(target) !== expected) {
        return false;
    }
    const edit = new vscode.WorkspaceEdit();
    edit.delete(document.uri, target);
    return vscode.workspace.applyEdit(edit);
}
