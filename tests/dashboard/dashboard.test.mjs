// The dashboard in headless Chromium against a real gateway: sign in (a wrong
// token first), start a prompt and watch it stream, cancel one, steer one,
// approve and deny a command on its card, edit the config (an error shown at its line, then a good edit applied
// live), the MCP servers on the engines page, and every page once, with a screenshot of each.
//
// Run by tests/it/dashboard_e2e.rs, which starts the gateway and passes:
//   DASHBOARD_URL, DASHBOARD_TOKEN, DASHBOARD_SCREENSHOTS (a folder),
//   PLAYWRIGHT_CORE (the playwright-core package folder), CHROMIUM (its binary).
// Prints one line per step and `DASHBOARD OK` at the end; exits non-zero on
// the first failure.

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

const STEP_TIMEOUT = 20000;
fs.mkdirSync(shots, { recursive: true });

function check(condition, message) {
  if (!condition) throw new Error(message);
}

function step(name) {
  console.log(`step: ${name}`);
}

const browser = await chromium.launch({
  executablePath: need('CHROMIUM'),
  headless: true,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});

let failed = false;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  page.setDefaultTimeout(STEP_TIMEOUT);
  const origin = new URL(url).origin;
  const problems = [];
  const foreign = [];
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    // The refused sign-in answers 401, the missing components 404 and the bad
    // config edit 422, on purpose.
    if (msg.type() === 'error' && !/status of (401|404|422)/.test(msg.text())) problems.push(`console: ${msg.text()}`);
  });
  page.on('request', (req) => {
    if (!req.url().startsWith(origin)) foreign.push(req.url());
    if (req.url().includes(token)) problems.push(`the token is in a URL: ${req.url()}`);
  });
  const shot = (name) => page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: false });

  step('a wrong token is refused');
  await page.goto(url);
  await page.locator('#login-token').fill('not-the-token');
  await page.locator('#login-form button[type=submit]').click();
  const loginError = page.locator('#login-error');
  await loginError.waitFor({ state: 'visible' });
  check((await loginError.textContent()).includes('refused'), `login error: ${await loginError.textContent()}`);
  check(await page.locator('#shell').isHidden(), 'the dashboard stays closed');
  await shot('login-refused');

  step('the right token opens the live page');
  await page.locator('#login-token').fill(token);
  await page.locator('#login-form button[type=submit]').click();
  await page.locator('#shell').waitFor({ state: 'visible' });
  check(await page.evaluate(() => sessionStorage.getItem('lemon.token')) === token, 'token kept in session storage');
  check(await page.evaluate(() => localStorage.length) === 0, 'nothing in local storage');
  await page.locator('h1 .dot-on').waitFor();

  step('a prompt streams back');
  await page.evaluate(() => {
    window.answerChanges = 0;
    new MutationObserver((records) => {
      for (const r of records) if (r.target.closest && r.target.closest('.answer')) window.answerChanges += 1;
    }).observe(document.getElementById('active-runs'), { subtree: true, childList: true, characterData: true });
  });
  await page.locator('#engine').selectOption('echo');
  await page.locator('#prompt').fill('hello from the dashboard page');
  await page.locator('.prompt-form button[type=submit]').click();
  const first = page.locator('.run', { hasText: 'hello from the dashboard page' }).first();
  await first.locator('.badge-completed').waitFor();
  check((await first.locator('.answer').textContent()) === 'hello from the dashboard page', 'the answer is the echo');
  const changes = await page.evaluate(() => window.answerChanges);
  check(changes >= 3, `the answer grew word by word (${changes} changes)`);

  step('a long run is cancelled');
  const long = Array.from({ length: 150 }, (_, i) => `word${i}`).join(' ');
  await page.locator('#prompt').fill(long);
  await page.locator('#session').fill('cancel-me');
  await page.locator('.prompt-form button[type=submit]').click();
  const cancelled = page.locator('.run', { hasText: 'word149' }).first();
  await cancelled.locator('.answer', { hasText: 'word2' }).waitFor();
  await shot('live');
  await cancelled.locator('button.cancel').click();
  await cancelled.locator('.badge-cancelled').waitFor();
  check(!(await cancelled.locator('.answer').textContent()).includes('word149'), 'the run stopped before its end');

  step('a Claude run is steered');
  await page.locator('#engine').selectOption('claude');
  await page.locator('#session').fill('steer-me');
  await page.locator('#prompt').fill('first request');
  await page.locator('.prompt-form button[type=submit]').click();
  const steered = page.locator('.run', { hasText: 'first request' }).first();
  await steered.locator('.answer', { hasText: 'Working on the first request.' }).waitFor();
  await steered.locator('.steer-input').fill('and also this');
  await steered.locator('button.steer').click();
  await steered.locator('.flash-ok', { hasText: 'Steer accepted' }).waitFor();
  await steered.locator('.badge-completed').waitFor();
  await steered.locator('.answer', { hasText: 'Now the steered request.' }).waitFor();
  await page.locator('#session').fill('dashboard');
  await page.locator('#engine').selectOption('echo');
  await page.locator('#prompt').fill('');
  await page.locator('#prompt').blur();
  check(await cancelled.locator('.flash-info').textContent() === 'Cancelled.', 'the cancelled run says so');
  await shot('live-finished');

  step('a command waits on its card: Approve runs it, Deny does not');
  for (const [prompt, button, outcome, answer] of [
    ['make the approved file', 'button.approve', 'approved by api via dashboard', 'Made it.'],
    ['make the denied file', 'button.deny', 'denied by api via dashboard', 'Not made.'],
  ]) {
    await page.locator('#engine').selectOption('lemon');
    await page.locator('#session').fill('approve-me');
    await page.locator('#prompt').fill(prompt);
    await page.locator('.prompt-form button[type=submit]').click();
    const asking = page.locator('.run', { hasText: prompt }).first();
    const card = asking.locator('.approval-asked');
    await card.waitFor();
    const file = prompt.includes('approved') ? 'approved.txt' : 'denied.txt';
    check((await card.locator('.approval-subject').textContent()) === `touch ${file}`, 'the card shows the command');
    check((await card.locator('.approval-rule').textContent()).includes('rule: tool = "*", action = "ask"'), 'the card names the rule');
    check(await asking.locator('.badge-completed').count() === 0, 'the run waits for the answer');
    if (button === 'button.approve') await shot('approval');
    await card.locator(button).click();
    await asking.locator('.approval', { hasText: outcome }).waitFor();
    await asking.locator('.badge-completed').waitFor();
    check((await asking.locator('.answer').textContent()) === answer, `the run answered ${answer}`);
    check(await asking.locator('.approval-asked').count() === 0, 'the card is settled');
  }
  await page.locator('#session').fill('dashboard');
  await page.locator('#engine').selectOption('echo');

  step('history finds a run by a word of its prompt');
  await page.goto(`${url}#/history`);
  await page.locator('#history-results table').waitFor();
  await page.locator('#history-search').fill('dashboard page');
  await page.locator('#history-results tbody tr').first().waitFor();
  check(await page.locator('#history-results tbody tr').count() === 1, 'one run matches');
  await page.locator('#history-search').fill('');
  check(await page.locator('#history-results tbody tr').count() >= 3, 'all runs listed');
  await shot('history');

  step('sessions show their queues, and a queue is aborted');
  const queued = await page.evaluate(async (words) => {
    const headers = { Authorization: `Bearer ${sessionStorage.getItem('lemon.token')}`, 'Content-Type': 'application/json' };
    const ids = [];
    for (let i = 0; i < 2; i += 1) {
      const body = JSON.stringify({ prompt: words, engine: 'echo', session_key: 'queue-me' });
      ids.push((await (await fetch('/v1/runs', { method: 'POST', headers, body })).json()).run_id);
    }
    return ids;
  }, long);
  await page.goto(`${url}#/sessions`);
  const card = page.locator('.session[data-session="queue-me"]');
  await card.locator('.queue code', { hasText: queued[1] }).waitFor();
  await page.locator('.session[data-session="steer-me"]').waitFor();
  await shot('sessions');
  await card.locator('button.danger').click();
  await page.locator('.flash-info', { hasText: 'queue-me: 1 cancelled, 1 dropped' }).waitFor();

  step('a bad config edit is shown at its line');
  await page.goto(`${url}#/config`);
  const editor = page.locator('#config-text');
  await page.waitForFunction(() => document.getElementById('config-text').value.includes('# dashboard test'));
  const original = await editor.inputValue();
  const lines = original.split('\n');
  const at = lines.findIndex((l) => l.startsWith('max_concurrent_runs')) + 1;
  check(at > 0, 'the config has max_concurrent_runs');
  await editor.fill(original.replace(/^max_concurrent_runs = \d+$/m, 'max_concurrent_runs = "four"'));
  await page.locator('#config-save').click();
  const inline = page.locator('#config-error');
  await inline.waitFor({ state: 'visible' });
  const message = await inline.textContent();
  check(message.startsWith(`Line ${at}, column `), `error placed at line ${at}: ${message}`);
  check(await page.locator('.gutter .error-line').textContent() === String(at), 'the line number is marked');
  await shot('config-error');

  step('a good config edit is applied live');
  await editor.fill(original.replace(/^max_concurrent_runs = \d+$/m, 'max_concurrent_runs = 3'));
  await page.locator('#config-save').click();
  await page.locator('#config-notice', { hasText: 'applied' }).waitFor();
  check(await inline.isHidden(), 'the error is gone');
  const max = await page.evaluate(async () => {
    const r = await fetch('/v1/status', { headers: { Authorization: `Bearer ${sessionStorage.getItem('lemon.token')}` } });
    return (await r.json()).scheduler.max;
  });
  check(max === 3, `the scheduler runs 3 at a time now (${max})`);
  await shot('config-applied');

  step('the other pages');
  for (const [name, ready] of [
    ['cron', '#cron-list > *'],
    ['inbox', '#sms-list > *'],
    ['usage', '#usage-body .stats'],
    ['status', '#status-body table'],
    ['secrets', '#secrets-body > *'],
  ]) {
    await page.goto(`${url}#/${name}`);
    await page.locator(ready).first().waitFor();
    await shot(name);
  }
  step('the engines page lists the MCP servers');
  await page.goto(`${url}#/status`);
  const mcp = page.locator('#mcp-servers');
  await mcp.locator('tr', { hasText: 'docs' }).waitFor();
  const docs = mcp.locator('tr', { hasText: 'docs' });
  check(await docs.locator('.badge-disabled').count() === 1, `docs is disabled: ${await docs.textContent()}`);
  check((await docs.textContent()).includes('http'), `docs is reached over http: ${await docs.textContent()}`);
  const missing = mcp.locator('tr', { hasText: 'missing' });
  check(await missing.count() === 1, 'the server whose command is missing is listed');
  const missingText = await missing.textContent();
  check(/stdio/.test(missingText), `missing is a stdio server: ${missingText}`);
  check(await missing.locator('.badge-failed').count() === 1, `missing failed to start: ${missingText}`);
  check(missingText.includes('lemon-no-such-mcp-server'), `its last error names the command: ${missingText}`);
  const headings = await mcp.locator('th').allTextContents();
  check(['Server', 'Transport', 'State', 'Tools', 'Last error', 'Calls'].every((h) => headings.includes(h)), `MCP columns: ${headings}`);
  await mcp.scrollIntoViewIfNeeded();
  await shot('mcp-servers');
  await page.goto(`${url}#/secrets`);
  const secretsText = await page.locator('#secrets-body').textContent();
  const secretsRoute = await page.evaluate(async () => (await fetch('/v1/secrets', { headers: { Authorization: `Bearer ${sessionStorage.getItem('lemon.token')}` } })).status);
  if (secretsRoute === 404) {
    check(secretsText.includes('not configured'), `secrets page without the route: ${secretsText}`);
  } else {
    step('a secret is set, listed by name only, and deleted');
    await page.locator('#secret-name').fill('dashboard_test_key');
    await page.locator('#secret-value').fill('s3cr3t-value-never-shown');
    await page.locator('#secret-form button[type=submit]').click();
    await page.locator('#secrets-body code', { hasText: 'dashboard_test_key' }).waitFor();
    check(!(await page.content()).includes('s3cr3t-value-never-shown'), 'the value is never shown back');
    await shot('secrets');
    await page.locator('tr', { hasText: 'dashboard_test_key' }).locator('button.danger').click();
    await page.locator('#secrets-notice', { hasText: 'deleted' }).waitFor();
  }
  const usageRuns = await page.evaluate(async () => (await (await fetch('/v1/usage', { headers: { Authorization: `Bearer ${sessionStorage.getItem('lemon.token')}` } })).json()).total.runs);
  check(usageRuns >= 3, `usage counts the runs (${usageRuns})`);

  step('signing out forgets the token');
  await page.locator('#logout').click();
  await page.locator('#login').waitFor({ state: 'visible' });
  check(await page.evaluate(() => sessionStorage.getItem('lemon.token')) === null, 'token forgotten');

  check(foreign.length === 0, `requests to other origins: ${foreign.join(', ')}`);
  check(problems.length === 0, problems.join('\n'));
  console.log('DASHBOARD OK');
} catch (err) {
  failed = true;
  console.error(`DASHBOARD FAILED: ${err.stack || err}`);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
