/**
 * Encodings of a referenced Secret's value that a hostile template can print into its own error
 * (ytt `fail()`, helm `fail`) and that {@link SecretMask} does not recognise. The mask covers the
 * value as text, trimmed lines, env pairs, YAML/JSON leaves, standard base64 (aligned at the
 * value's start) and JSON escaping; the cases below held.
 *
 * Out of reach by design (docs/security.md, "What the functions hold"): a template that wants to show a value it
 * was given can always re-encode it (base64 of a prefixed value, upper case, characters spaced
 * apart, URL encoding), and no finite set of needles catches every encoding. The value belongs
 * to the App's own Secret and reaches only the App's own status, so masking is defense in
 * depth (kapp-controller masks nothing), not a tenant boundary.
 */
import { describe, expect, it } from 'vitest';
import { SecretMask } from '../../functions/lib/reconcile/secret-mask.js';

const SECRET = 'hunter2-very-secret-token';
const mask = new SecretMask();
mask.addValue(SECRET);

describe('secret masking against a hostile template', () => {
  it.each<[string, string]>([
    ['plain', SECRET],
    ['standard base64', Buffer.from(SECRET).toString('base64')],
    ['JSON-escaped inside a quoted string', JSON.stringify({ v: SECRET })],
  ])('%s is masked', (_n, shown) => {
    expect(mask.text(`fail: ${shown}`)).not.toContain(SECRET);
    expect(mask.text(`fail: ${shown}`)).toContain('***');
  });
});
