// Disposable and EventEmitter of the stub, shared by vscode.ts and host.ts without an import cycle.

export class Disposable {
    constructor(private readonly callOnDispose: () => void) {}
    static from(...items: { dispose(): unknown }[]): Disposable {
        return new Disposable(() => items.forEach((i) => i.dispose()));
    }
    dispose(): void {
        this.callOnDispose();
    }
}

export class EventEmitter<T> {
    private listeners: ((e: T) => unknown)[] = [];
    event = (listener: (e: T) => unknown, thisArgs?: unknown, disposables?: Disposable[]): Disposable => {
        const bound = thisArgs === undefined ? listener : listener.bind(thisArgs);
        this.listeners.push(bound);
        const disposable = new Disposable(() => {
            this.listeners = this.listeners.filter((l) => l !== bound);
        });
        disposables?.push(disposable);
        return disposable;
    };
    fire(e: T): void {
        [...this.listeners].forEach((l) => l(e));
    }
    dispose(): void {
        this.listeners = [];
    }
}
