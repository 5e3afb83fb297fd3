// The dashboard's shell: sign in, the sidebar, and one page at a time from
// the location's hash (#/live, #/history, …).

import * as api from './api.js';
import { clear, h } from './dom.js';
import * as runs from './runs.js';
import * as pages from './pages.js';
import * as config from './config.js';

const PAGES = {
  live: runs.live,
  history: runs.history,
  sessions: runs.sessions,
  cron: pages.cron,
  inbox: pages.inbox,
  usage: pages.usage,
  status: pages.status,
  config: config.editor,
  secrets: pages.secrets,
};

const $ = (id) => document.getElementById(id);
let cleanup = null;
let storageTimer = null;

// How often every page asks whether the store still saves.
const STORAGE_EVERY_MS = 10000;

// While the store cannot save (a full disk, a read-only file system), every
// page says so above everything else: new messages are refused until it can.
function showStorage(status) {
  const store = status && status.store;
  const failing = Boolean(store) && store.writable === false;
  const alert = $('storage-alert');
  alert.hidden = !failing;
  alert.textContent = failing
    ? `Storage failing: the gateway cannot save messages, so new messages are refused until it can.${store.error ? ` (${store.error})` : ''}`
    : '';
}

async function checkStorage() {
  try {
    showStorage(await api.get('/v1/status'));
  } catch {
    // The status page and the next check say more.
  }
}

async function signIn(event) {
  event.preventDefault();
  const field = $('login-token');
  const error = $('login-error');
  const value = field.value.trim();
  error.hidden = true;
  try {
    const status = await api.call('GET', '/v1/status', undefined, value);
    api.setToken(value);
    field.value = '';
    showShell(status);
  } catch (err) {
    error.textContent = err.status === 401
      ? 'That token was refused. Check LEMON_API_TOKEN or the token printed at the first start.'
      : `Cannot reach the gateway: ${err.message}`;
    error.hidden = false;
    field.select();
  }
}

function showLogin() {
  if (cleanup) { cleanup(); cleanup = null; }
  if (storageTimer) { clearInterval(storageTimer); storageTimer = null; }
  showStorage(null);
  api.setToken('');
  $('shell').hidden = true;
  $('login').hidden = false;
  $('login-token').focus();
}

function showShell(status) {
  $('login').hidden = true;
  $('shell').hidden = false;
  if (status && status.version) $('version').textContent = `v${status.version}`;
  showStorage(status);
  if (!storageTimer) storageTimer = setInterval(checkStorage, STORAGE_EVERY_MS);
  route();
}

function route() {
  if ($('shell').hidden) return;
  const name = (location.hash.replace(/^#\/?/, '').split('/')[0]) || 'live';
  const page = PAGES[name] ? name : 'live';
  for (const link of document.querySelectorAll('.sidebar a')) {
    link.classList.toggle('active', link.dataset.page === page);
  }
  if (cleanup) { cleanup(); cleanup = null; }
  const main = clear($('page'));
  main.dataset.page = page;
  try {
    cleanup = PAGES[page](main) || null;
  } catch (err) {
    main.appendChild(h('p', { class: 'error' }, String(err)));
  }
}

async function start() {
  $('login-form').addEventListener('submit', signIn);
  $('logout').addEventListener('click', showLogin);
  window.addEventListener('hashchange', route);
  api.whenUnauthorized(() => {
    showLogin();
    const error = $('login-error');
    error.textContent = 'The token is no longer accepted. Sign in again.';
    error.hidden = false;
  });
  if (!api.token()) return showLogin();
  try {
    showShell(await api.get('/v1/status'));
  } catch {
    showLogin();
  }
}

start();
