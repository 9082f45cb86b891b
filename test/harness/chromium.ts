/**
 * Debian's headless Chromium (`/usr/bin/chromium`, installed by `npm run setup`'s full profile)
 * driven by playwright-core (no browser download), for the tests that load the fleet page.
 */
import { type Browser, chromium, type Page } from 'playwright-core';

/** The flags a root, offline machine needs (docs: /work/.library/env, "Chromium"). */
export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/** Launches the browser with {@link CHROMIUM_ARGS}. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: '/usr/bin/chromium', args: CHROMIUM_ARGS });
}

/**
 * A new page of `browser` that records into `problems` every console error or warning (a CSP
 * violation is one), uncaught page error and failed request.
 */
export async function watchedPage(
  browser: Browser,
  problems: string[],
  viewport = { width: 1100, height: 800 },
): Promise<Page> {
  const page = await browser.newPage({ viewport });
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()}`));
  return page;
}
