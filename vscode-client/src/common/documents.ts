// Which documents the server handles, and which of them are worth starting a server for.

import type { DocumentFilter } from 'vscode-languageclient';

export const CUDA_LANGUAGES = ['cuda-cpp', 'cuda'];

/** Sent to the language client: CUDA sources by language or extension, and Python (KernelBench references). */
export const DOCUMENT_SELECTOR: DocumentFilter[] = [
    ...CUDA_LANGUAGES.map((language) => ({ language })),
    { scheme: 'file', pattern: '**/*.{cu,cuh}' },
    { scheme: 'untitled', pattern: '**/*.{cu,cuh}' },
    { language: 'python' },
];

/** The parts of a TextDocument this module looks at. */
export interface DocumentLike {
    languageId: string;
    fileName: string;
    getText(): string;
}

const CUDA_FILE = /\.(cu|cuh)$/i;
// KernelBench format: `class Model(nn.Module)` plus `get_inputs()` (and usually `get_init_inputs()`).
const MODEL_CLASS = /^class\s+Model\s*\(\s*(?:torch\.)?nn\.Module\s*\)\s*:/m;
const GET_INPUTS = /^def\s+get_inputs\s*\(/m;

export function isCudaDocument(doc: DocumentLike): boolean {
    return CUDA_LANGUAGES.includes(doc.languageId) || CUDA_FILE.test(doc.fileName);
}

export function isKernelBenchReference(text: string): boolean {
    return MODEL_CLASS.test(text) && GET_INPUTS.test(text);
}

/**
 * The extension activates on every Python file (VS Code cannot activate on file content), but
 * the server, which loads a model, starts only for CUDA sources and KernelBench-style references.
 */
export function warrantsServer(doc: DocumentLike): boolean {
    if (isCudaDocument(doc)) {
        return true;
    }
    return doc.languageId === 'python' && isKernelBenchReference(doc.getText());
}
