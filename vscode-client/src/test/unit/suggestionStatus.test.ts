import * as assert from 'assert/strict';
import {
    describeAccepted,
    describeSuggestionStatus,
    parseAccepted,
    parseSuggestionStatus,
    shorten,
    SuggestionStatusNotification,
} from '../../common/suggestionStatus';

const status = {
    uri: 'file:///k/softmax%20rows.cu',
    position: { line: 39, character: 4 },
    candidates: 3,
    usable: 0,
    shown: 1,
    message: '3 candidates, none compiled: softmax rows.cu(40): error: expected an expression',
};

describe('suggestionStatus: dice/suggestionStatus payloads', () => {
    it('is the dice/suggestionStatus notification', () => {
        assert.equal(SuggestionStatusNotification.method, 'dice/suggestionStatus');
    });

    it('accepts the contract shape; a missing, null or blank message is null', () => {
        assert.deepEqual(parseSuggestionStatus(status), status);
        assert.equal(parseSuggestionStatus({ ...status, message: null })!.message, null);
        assert.equal(parseSuggestionStatus({ ...status, message: '  ' })!.message, null);
        assert.equal(parseSuggestionStatus({ ...status, message: undefined })!.message, null);
        assert.deepEqual(parseSuggestionStatus({ ...status, extra: 1 }), status, 'unknown keys are dropped');
    });

    it('rejects payloads that do not follow the contract', () => {
        assert.equal(parseSuggestionStatus(null), undefined);
        assert.equal(parseSuggestionStatus('3 candidates'), undefined);
        assert.equal(parseSuggestionStatus({ ...status, uri: '' }), undefined);
        assert.equal(parseSuggestionStatus({ ...status, position: null }), undefined);
        assert.equal(parseSuggestionStatus({ ...status, position: { line: -1, character: 0 } }), undefined);
        assert.equal(parseSuggestionStatus({ ...status, candidates: '3' }), undefined);
        assert.equal(parseSuggestionStatus({ ...status, shown: 1.5 }), undefined);
        assert.equal(parseSuggestionStatus({ ...status, message: 42 }), undefined);
    });

    it('says where (1-based) and why, for the log', () => {
        assert.equal(
            describeSuggestionStatus(parseSuggestionStatus(status)!),
            'No usable suggestion at softmax rows.cu:40:5: 3 candidates, none compiled: softmax rows.cu(40): error: expected an expression',
        );
    });
});

describe('suggestionStatus: dice.suggestionAccepted arguments', () => {
    it('reads {uri, label, usable}, tolerating missing fields, and words them for the log', () => {
        const accepted = parseAccepted([{ uri: 'file:///k/a.cu', label: 'compiled ✓ · not run', usable: true }]);
        assert.deepEqual(accepted, { uri: 'file:///k/a.cu', label: 'compiled ✓ · not run', usable: true });
        assert.equal(describeAccepted(accepted!), 'Accepted a suggestion in a.cu: compiled ✓ · not run');
        const failing = parseAccepted([{ label: 'compiled ✗ · a.cu(3): error', usable: false }]);
        assert.equal(describeAccepted(failing!), 'Accepted a suggestion: compiled ✗ · a.cu(3): error (it failed validation)');
        assert.equal(parseAccepted([]), undefined);
        assert.equal(parseAccepted(['label']), undefined);
        assert.equal(parseAccepted([{ uri: 'file:///k/a.cu' }]), undefined);
    });

    it('shortens long messages for the status bar by characters, not UTF-16 units', () => {
        assert.equal(shorten('short'), 'short');
        assert.equal(shorten('abcdefgh', 5), 'abcd…');
        assert.equal(shorten('𝄞𝄞𝄞𝄞𝄞𝄞', 4), '𝄞𝄞𝄞…');
    });
});
