// The cluster config editor on the status page's Cluster panel, in headless
// Chromium against a real cluster node: a refused body is shown with its
// line, a good one is saved as the next version, and a save from a version
// another node moved past is refused as stale.
//
// Run by tests/it/cluster_config_e2e.rs, which starts the node and passes:
//   DASHBOARD_URL, DASHBOARD_TOKEN, DASHBOARD_SCREENSHOTS (a folder),
//   PLAYWRIGHT_CORE (the playwright-core package folder), CHROMIUM (its binary).
// Prints one line per step and `CLUSTER CONFIG OK` at the end; exits non-zero
// on the first failure.

import { createRequire } from 'node:module';
import path from 'node:path';
import fs from 'node:fs';

const need = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const url = need('DASHBOARD_URL');
const token = need('DASHBOARD_TOKEN');
const shots = need('DASHBOARD_SCREENSHOTS');
const require = createRequire(import.meta.url);
const { chromium } = require(need('PLAYWRIGHT_CORE'));
fs.mkdirSync(shots, { recursive: true });

function check(condition, message) {
  if (!condition) throw new Error(message);
}

const browser = await chromium.launch({
  executablePath: need('CHROMIUM'),
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
});
let failed = false;
try {
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 1400 } })).newPage();
  page.setDefaultTimeout(20000);
  const problems = [];
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    // The refused body (422) and the stale save (409) answer so on purpose.
    if (msg.type() === 'error' && !/status of (404|409|422)/.test(msg.text())) problems.push(`console: ${msg.text()}`);
  });
  await page.goto(url);
  await page.locator('#login-token').fill(token);
  await page.locator('#login-form button[type=submit]').click();
  await page.locator('#shell').waitFor({ state: 'visible' });
  await page.goto(`${url}#/status`);

  console.log('step: the editor shows version 0');
  const info = page.locator('#cluster-config-info');
  await page.locator('#cluster-config-text').waitFor();
  await page.waitForFunction(() => (document.getElementById('cluster-config-info')?.textContent || '').includes('Version 0'));

  console.log('step: a node-local key is refused at its line');
  const text = page.locator('#cluster-config-text');
  await text.fill('[gateway]\nmax_concurrent_runs = 4\n\n[gateway.api]\nport = 1\n');
  await page.locator('#cluster-config-save').click();
  const error = page.locator('#cluster-config-error');
  await error.waitFor({ state: 'visible' });
  const said = await error.textContent();
  check(said.startsWith('Line 4,') && said.includes('stays in each node'), `refusal: ${said}`);
  await page.screenshot({ path: path.join(shots, 'cluster-config-error.png') });

  console.log('step: a good body is saved as version 1');
  await text.fill('[gateway]\nmax_concurrent_runs = 4\n');
  await page.locator('#cluster-config-save').click();
  await page.locator('#cluster-config-notice', { hasText: 'Saved as version 1' }).waitFor();
  check(await error.isHidden(), 'the refusal is gone');
  // The status refresh shows this node running it, and the cluster's slots.
  await page.waitForFunction(() => (document.getElementById('cluster-config-info')?.textContent || '').includes('This node runs version 1'), null, { timeout: 20000 });
  await page.locator('#cluster-stats', { hasText: '0 / 4' }).waitFor();
  await page.screenshot({ path: path.join(shots, 'cluster-config-saved.png') });

  console.log('step: a save from a version another node moved past is refused');
  const moved = await page.evaluate(async () => {
    const r = await fetch('/v1/cluster/config', {
      method: 'PUT',
      headers: { Authorization: `Bearer ${sessionStorage.getItem('lemon.token')}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ expected_version: 1, body: '[gateway]\nmax_concurrent_runs = 5\n' }),
    });
    return r.status;
  });
  check(moved === 200, `the other edit: ${moved}`);
  await page.locator('#cluster-config-text').focus();
  await text.fill('[gateway]\nmax_concurrent_runs = 6\n');
  await page.locator('#cluster-config-save').click();
  await error.waitFor({ state: 'visible' });
  const stale = await error.textContent();
  check(stale.includes('version 2, not 1'), `stale: ${stale}`);
  check((await text.inputValue()).includes('= 6'), 'the text typed is kept');
  await page.locator('#cluster-config-reload').click();
  await page.waitForFunction(() => document.getElementById('cluster-config-text').value.includes('= 5'));
  check((await info.textContent()).includes('Version 2'), `after reload: ${await info.textContent()}`);
  check(problems.length === 0, problems.join('\n'));
  console.log('CLUSTER CONFIG OK');
} catch (err) {
  failed = true;
  console.error(err);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
