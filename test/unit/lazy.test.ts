/** `lazily` (functions/lib/api/lazy.ts): built on the first call, once, and again after a throw. */
import { describe, expect, it } from 'vitest';
import { lazily } from '../../functions/lib/api/lazy.js';

describe('lazily', () => {
  it('builds on the first call, not before, and returns the same value after', () => {
    let builds = 0;
    const get = lazily(() => ({ n: ++builds }));
    expect(builds).toBe(0);
    const first = get();
    expect(get()).toBe(first);
    expect(builds).toBe(1);
  });

  it('keeps nothing when the build throws: the next call builds again', () => {
    let calls = 0;
    const get = lazily(() => {
      calls += 1;
      if (calls === 1) throw new Error('first build fails');
      return calls;
    });
    expect(() => get()).toThrow('first build fails');
    expect(get()).toBe(2);
    expect(get()).toBe(2);
  });
});
