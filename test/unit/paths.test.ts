import { describe, expect, it } from 'vitest';
import { InvalidPathError, isScopedPath, scopedPath } from '../../functions/lib/paths.js';

describe('scopedPath (memdir.ScopedPath)', () => {
  it.each([
    ['', '/tmp/root'],
    ['.', '/tmp/root'],
    ['config', '/tmp/root/config'],
    ['config/', '/tmp/root/config'],
    ['a/b/../c', '/tmp/root/a/c'],
    ['./a//b', '/tmp/root/a/b'],
    // Go's filepath.Join treats an absolute second argument as relative: no escape.
    ['/etc/passwd', '/tmp/root/etc/passwd'],
    ['a/..', '/tmp/root'],
    // Root-dependent, as upstream: re-entering a root by its own name is inside it.
    ['../root/x', '/tmp/root/x'],
  ])('accepts %j -> %s', (userPath, expected) => {
    expect(scopedPath('/tmp/root', userPath)).toBe(expected);
  });

  it.each(['..', '../x', 'a/../../x', '../rootx', '/../../etc', 'a/b/../../..'])('rejects %j', (userPath) => {
    expect(() => scopedPath('/tmp/root', userPath)).toThrowError(new InvalidPathError(userPath));
    expect(() => scopedPath('/tmp/root', userPath)).toThrow(`Invalid path: ${userPath}`);
  });

  it('treats a sibling with the root as prefix as outside', () => {
    expect(() => scopedPath('/tmp/root', '../root-evil/x')).toThrow('Invalid path: ../root-evil/x');
  });

  it('normalises a root with a trailing slash and allows "/" as root', () => {
    expect(scopedPath('/tmp/root/', 'a')).toBe('/tmp/root/a');
    expect(scopedPath('/', 'a/b')).toBe('/a/b');
  });

  it('requires an absolute root', () => {
    expect(() => scopedPath('tmp', 'a')).toThrow(TypeError);
  });

  it('isScopedPath is root-independent', () => {
    expect(isScopedPath('a/b')).toBe(true);
    expect(isScopedPath('/abs')).toBe(true);
    expect(isScopedPath('')).toBe(true);
    expect(isScopedPath('../root/x')).toBe(false);
    expect(isScopedPath('a/../../x')).toBe(false);
  });
});
