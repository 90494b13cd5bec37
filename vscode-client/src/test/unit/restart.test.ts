import * as assert from 'assert/strict';
import { RestartPolicy, SerialRunner } from '../../common/restart';
import { settle } from './fakes';

describe('RestartPolicy', () => {
    const options = { maxCrashes: 3, windowMs: 60_000, baseDelayMs: 100, maxDelayMs: 300 };

    it('backs off exponentially, capped, then gives up past the crash budget', () => {
        const policy = new RestartPolicy(options);
        assert.deepEqual(policy.onCrash(0), { action: 'restart', delayMs: 100, crashes: 1 });
        assert.deepEqual(policy.onCrash(1_000), { action: 'restart', delayMs: 200, crashes: 2 });
        assert.deepEqual(policy.onCrash(2_000), { action: 'restart', delayMs: 300, crashes: 3 });
        assert.deepEqual(policy.onCrash(3_000), { action: 'giveUp', crashes: 4 });
    });

    it('forgets crashes older than the window', () => {
        const policy = new RestartPolicy(options);
        policy.onCrash(0);
        policy.onCrash(10_000);
        policy.onCrash(20_000);
        // The crash at 0 has left the window: 3 in the window, still allowed, delay for the 3rd.
        assert.deepEqual(policy.onCrash(65_000), { action: 'restart', delayMs: 300, crashes: 3 });
    });

    it('starts a fresh budget after reset (a restart the user asked for)', () => {
        const policy = new RestartPolicy(options);
        [0, 1, 2, 3].forEach((t) => policy.onCrash(t));
        policy.reset();
        assert.deepEqual(policy.onCrash(4), { action: 'restart', delayMs: 100, crashes: 1 });
    });
});

describe('SerialRunner', () => {
    it('never runs two tasks at once and coalesces requests made meanwhile into one more run', async () => {
        let active = 0;
        let maxActive = 0;
        let runs = 0;
        const runner = new SerialRunner(async () => {
            active += 1;
            maxActive = Math.max(maxActive, active);
            runs += 1;
            await settle(5);
            active -= 1;
        });
        await Promise.all([runner.run(), runner.run(), runner.run(), runner.run()]);
        assert.equal(maxActive, 1);
        assert.equal(runs, 2);
        assert.equal(runner.running, false);
        await runner.run();
        assert.equal(runs, 3);
    });

    it('reports the failure of the last run only', async () => {
        let call = 0;
        const runner = new SerialRunner(async () => {
            call += 1;
            await settle(1);
            if (call === 1) {
                throw new Error('first failed');
            }
        });
        const first = runner.run();
        const second = runner.run(); // coalesced: its outcome is the rerun's
        await Promise.all([first, second]);
        assert.equal(call, 2);

        const failing = new SerialRunner(async () => {
            throw new Error('boom');
        });
        await assert.rejects(failing.run(), /boom/);
        assert.equal(failing.running, false);
    });

    it('settled() waits for the run in flight without starting another', async () => {
        let runs = 0;
        const runner = new SerialRunner(async () => {
            runs += 1;
            await settle(5);
        });
        const running = runner.run();
        await runner.settled();
        await running;
        assert.equal(runs, 1);
        await runner.settled();
        assert.equal(runs, 1);
    });
});
