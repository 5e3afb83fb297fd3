// The other pages: cron jobs, the SMS inbox and calls, usage and spend,
// engines and transports, and secrets.

import * as api from './api.js';
import { ago, badge, clear, duration, flash, h, section, table, usd } from './dom.js';

function failed(el, err) {
  clear(el).appendChild(h('p', { class: 'error' }, err.message));
}

function notConfigured(what) {
  return h('p', { class: 'empty not-configured' }, `${what} is not configured on this gateway.`);
}

export function cron(main) {
  const list = h('div', { id: 'cron-list' });
  const notice = h('p', { class: 'flash', hidden: true });
  const name = h('input', { type: 'text', placeholder: 'nightly-report', 'aria-label': 'Name' });
  const schedule = h('input', { type: 'text', placeholder: '0 9 * * 1-5', 'aria-label': 'Schedule', required: true });
  const session = h('input', { type: 'text', placeholder: 'cron', 'aria-label': 'Session key' });
  const prompt = h('input', { type: 'text', class: 'grow', placeholder: 'What to ask, every time', 'aria-label': 'Prompt', required: true });
  const form = h('form', { class: 'row wrap', onsubmit: create },
    name, schedule, session, prompt, h('button', { type: 'submit', class: 'primary' }, 'Add job'));
  main.append(h('h1', {}, 'Cron jobs'),
    section('New job', 'Five-field cron expressions (minute hour day month weekday) or @hourly, @daily, @weekly.', form, notice),
    section('Jobs', null, list));

  async function create(event) {
    event.preventDefault();
    try {
      const body = { schedule: schedule.value.trim(), prompt: prompt.value.trim() };
      if (name.value.trim()) body.name = name.value.trim();
      if (session.value.trim()) body.sessionKey = session.value.trim();
      await api.post('/v1/cron', body);
      for (const field of [name, schedule, session, prompt]) field.value = '';
      flash(notice, 'Job added.', 'ok');
      load();
    } catch (err) {
      flash(notice, err.message, 'error');
    }
  }

  async function act(what, job) {
    try {
      const path = `/v1/cron/${encodeURIComponent(job.id)}`;
      if (what === 'run') await api.post(`${path}/run`);
      if (what === 'toggle') await api.call('PATCH', path, { enabled: !job.enabled });
      if (what === 'delete') await api.del(path);
      flash(notice, what === 'run' ? `${job.name || job.id} started.` : 'Saved.', 'ok');
      load();
    } catch (err) {
      flash(notice, err.message, 'error');
    }
  }

  async function load() {
    try {
      const { jobs } = await api.get('/v1/cron');
      clear(list).appendChild(table([
        ['Job', (j) => h('span', {}, h('strong', {}, j.name || j.id), j.source === 'config' ? h('span', { class: 'muted' }, ' (config.toml)') : null)],
        ['Schedule', (j) => h('code', {}, j.schedule, j.timezone ? ` ${j.timezone}` : '')],
        ['Prompt', (j) => j.prompt],
        ['Session', (j) => j.sessionKey || ''],
        ['Next', (j) => (j.enabled ? (j.nextRunAtMs ? new Date(j.nextRunAtMs).toLocaleString() : '') : badge('disabled'))],
        ['Last', (j) => ago(j.lastRunAtMs)],
        ['', (j) => h('span', { class: 'row' },
          h('button', { type: 'button', onclick: () => act('run', j) }, 'Run now'),
          h('button', { type: 'button', onclick: () => act('toggle', j) }, j.enabled ? 'Disable' : 'Enable'),
          j.source === 'config' ? null : h('button', { type: 'button', class: 'danger', onclick: () => act('delete', j) }, 'Delete'))],
      ], jobs, 'No cron jobs. Add one above or under [[gateway.cron]] in config.toml.'));
    } catch (err) {
      failed(list, err);
    }
  }
  load();
}

// The first of `keys` that `item` has, for shapes that name a field two ways.
function pick(item, ...keys) {
  for (const key of keys) if (item[key] !== undefined && item[key] !== null) return item[key];
  return '';
}

function when(value) {
  if (typeof value === 'number') return ago(value);
  return value ? new Date(value).toLocaleString() : '';
}

export function inbox(main) {
  const sms = h('div', { id: 'sms-list' });
  const calls = h('div', { id: 'call-list' });
  const notice = h('p', { class: 'flash', hidden: true });
  main.append(h('h1', {}, 'SMS & calls'), notice,
    section('SMS inbox', 'Messages received on the gateway’s numbers; a claimed one was taken by a run.', sms),
    section('Recent calls', null, calls));

  async function claim(message) {
    try {
      await api.post(`/v1/sms/messages/${encodeURIComponent(pick(message, 'sid', 'id'))}/claim`);
      flash(notice, 'Message claimed.', 'ok');
      loadSms();
    } catch (err) {
      flash(notice, err.message, 'error');
    }
  }

  async function loadSms() {
    try {
      const answer = await api.optional('/v1/sms/messages');
      if (!answer) return clear(sms).appendChild(notConfigured('SMS'));
      clear(sms).appendChild(table([
        ['From', (m) => pick(m, 'from', 'from_number')],
        ['To', (m) => pick(m, 'to', 'to_number')],
        ['Message', (m) => pick(m, 'body', 'text')],
        ['Received', (m) => when(pick(m, 'received_at_ms', 'receivedAtMs', 'received_at'))],
        ['', (m) => (pick(m, 'claimed', 'claimed_by', 'claimedBy')
          ? badge('claimed')
          : h('button', { type: 'button', onclick: () => claim(m) }, 'Claim'))],
      ], answer.messages || [], 'No messages yet.'));
    } catch (err) {
      failed(sms, err);
    }
  }

  async function loadCalls() {
    try {
      const answer = await api.optional('/v1/calls');
      if (!answer) return clear(calls).appendChild(notConfigured('Voice'));
      clear(calls).appendChild(table([
        ['Call', (c) => h('code', {}, pick(c, 'id', 'call_id', 'sid'))],
        ['From', (c) => pick(c, 'from')],
        ['To', (c) => pick(c, 'to')],
        ['State', (c) => badge(pick(c, 'state', 'status'))],
        ['Started', (c) => when(pick(c, 'started_at_ms', 'startedAtMs', 'started_at'))],
        ['Length', (c) => duration(pick(c, 'duration_ms', 'durationMs') || undefined)],
      ], answer.calls || [], 'No calls yet.'));
    } catch (err) {
      failed(calls, err);
    }
  }
  loadSms();
  loadCalls();
}

export function usage(main) {
  const since = h('select', { id: 'usage-since', 'aria-label': 'Period' },
    h('option', { value: 'today' }, 'Today (UTC)'),
    h('option', { value: '7' }, 'Last 7 days'),
    h('option', { value: '30' }, 'Last 30 days'),
    h('option', { value: 'all' }, 'All time'));
  const body = h('div', { id: 'usage-body' });
  main.append(h('h1', {}, 'Usage ', since), body);

  function sinceMs() {
    const now = new Date();
    if (since.value === 'all') return 0;
    if (since.value === 'today') return Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate());
    return Date.now() - Number(since.value) * 86400000;
  }

  const columns = (first, key) => [
    [first, (g) => g[key] || '—'],
    ['Runs', (g) => g.runs],
    ['Input tokens', (g) => g.input_tokens.toLocaleString()],
    ['Output tokens', (g) => g.output_tokens.toLocaleString()],
    ['Cached', (g) => (g.cache_read_tokens + g.cache_write_tokens).toLocaleString()],
    ['Spend', (g) => usd(g.usd)],
  ];

  async function load() {
    try {
      const answer = await api.get(`/v1/usage?since=${sinceMs()}`);
      const total = answer.total;
      clear(body).append(
        h('div', { class: 'stats' },
          stat('Runs', total.runs),
          stat('Tokens', total.tokens.toLocaleString()),
          stat('Spend', usd(total.usd))),
        section('By engine', null, table(columns('Engine', 'engine'), answer.engines, 'No runs in this period.')),
        section('By session', null, table(columns('Session', 'session_key'), answer.sessions, 'No runs in this period.')));
    } catch (err) {
      failed(body, err);
    }
  }
  since.addEventListener('change', load);
  load();
}

function stat(label, value) {
  return h('div', { class: 'stat' }, h('span', { class: 'stat-value' }, String(value)), h('span', { class: 'stat-label' }, label));
}

// Bytes in powers of a thousand, as the command line shows them.
function size(bytes) {
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let value = Number(bytes || 0);
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) { value /= 1000; unit += 1; }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

// The store: whether it saves, its size, rows per table, the last
// retention pass and the last scheduled backup.
function storage(store) {
  const removed = (counts) => Object.entries(counts || {}).map(([kind, n]) => `${n} ${kind}`).join(', ');
  const prune = store.last_prune;
  const backup = store.last_backup;
  const rows = Object.entries(store.rows || {}).map(([table, n]) => ({ table, n }));
  return section('Storage', store.path,
    h('div', { class: 'stats', id: 'storage-stats' },
      stat('State', store.writable === false ? 'failing' : 'saving'),
      stat('Database', size(store.bytes)),
      store.log_bytes == null ? stat('Backend', store.backend || 'sqlite') : stat('Log', size(store.log_bytes)),
      stat('Last prune', prune ? ago(prune.at_ms) : 'none yet'),
      stat('Last backup', backup ? ago(backup.at_ms) : 'none')),
    store.writable === false && store.error ? h('p', { class: 'reason' }, store.error) : null,
    h('p', { class: 'muted', id: 'storage-upkeep' },
      prune ? `Last retention pass: ${removed(prune.removed) || 'nothing to remove'}${prune.error ? ` (stopped: ${prune.error})` : ''}. ` : '',
      Object.keys(store.pruned_total || {}).length ? `Removed since start: ${removed(store.pruned_total)}. ` : '',
      backup ? `Last backup: ${backup.path}.` : 'No scheduled backup: [gateway.backup] sets one.',
      store.backup_error ? ` Backup failing: ${store.backup_error}` : ''),
    table([
      ['Table', (r) => h('code', {}, r.table)],
      ['Rows', (r) => String(r.n)],
    ], rows, 'The store could not be read.'));
}

// A cluster node's view of the cluster: its nodes and their heartbeats,
// who owns each single-consumer channel, the cluster's run slots.
function clusterPanel(c) {
  const lead = `This gateway is node ${c.node} of a cluster; leases last ${duration(c.term_ms)}.` +
    (c.fenced ? ' This node is fenced: it writes nothing more and is stopping.' : '');
  const slots = c.slots || {};
  return section('Cluster', lead,
    h('div', { class: 'stats', id: 'cluster-stats' },
      stat('Nodes alive', c.nodes ? `${c.nodes.filter((n) => n.alive).length} / ${c.nodes.length}` : '?'),
      stat('Cluster slots', c.slots ? `${slots.in_use} / ${slots.total}` : '?'),
      stat('Sessions here', c.sessions_here)),
    c.error ? h('p', { class: 'reason' }, c.error) : null,
    h('div', { id: 'cluster-nodes' }, table([
      ['Node', (n) => h('strong', { class: 'nowrap' }, n.id === c.node ? `${n.id} (this one)` : n.id)],
      ['State', (n) => badge(n.alive ? 'alive' : 'gone')],
      ['Heartbeat', (n) => ago(n.last_heartbeat_ms)],
      ['Started', (n) => ago(n.started_at_ms)],
      ['Version', (n) => n.version],
      ['API', (n) => (n.api_base_url ? h('code', {}, n.api_base_url) : '')],
    ], c.nodes || [], 'No node is registered.')),
    h('div', { id: 'cluster-channels' }, table([
      ['Channel', (o) => h('code', {}, o.channel)],
      ['Owner', (o) => o.node],
      ['State', (o) => badge(o.live ? 'owned' : 'free')],
      ['Epoch', (o) => String(o.epoch)],
    ], c.channels || [], 'No single-consumer channel is owned.')));
}

// The cluster config: the keys of [gateway] every node takes from the
// database over its own config.toml. Saved with the version it was read at;
// a save another node beat is refused (409) and says so. Built once and moved
// into each new Cluster panel, so what is typed survives the refresh.
function clusterConfigEditor() {
  const text = h('textarea', { id: 'cluster-config-text', class: 'code', spellcheck: 'false', wrap: 'off', 'aria-label': 'Cluster config' });
  const info = h('p', { class: 'muted', id: 'cluster-config-info' });
  const error = h('p', { class: 'error', id: 'cluster-config-error', role: 'alert', hidden: true });
  const notice = h('p', { class: 'flash', id: 'cluster-config-notice', hidden: true });
  const save = h('button', { type: 'button', class: 'primary', id: 'cluster-config-save' }, 'Save');
  const reload = h('button', { type: 'button', id: 'cluster-config-reload' }, 'Reload');
  const box = h('div', { class: 'cluster-config', id: 'cluster-config' },
    h('h3', {}, 'Cluster config'),
    h('p', { class: 'muted' }, 'Shared by every node and applied live: max_concurrent_runs, [gateway.queue], [[gateway.bindings]], [gateway.projects], [gateway.budgets], [gateway.approvals]. A key set here replaces that key of each node\'s config.toml; ports, paths, engines and secrets stay in the file.'),
    info, text, error, h('div', { class: 'row' }, save, reload, notice));
  let row = null;
  let applied = null;
  let edited = false;
  // The error shown is this node's refusal of a version, not a save's.
  let refusal = false;

  function describe() {
    if (!row) return;
    const here = applied == null ? '' : ` This node runs version ${applied}.`;
    info.textContent = row.version
      ? `Version ${row.version}, written by ${row.updated_by || 'a node'} ${ago(row.updated_at_ms)}.${here}`
      : `Version 0: nothing is shared yet; each node's config.toml is in force.${here}`;
  }

  function showError(body) {
    refusal = false;
    error.hidden = false;
    const bare = body.line ? body.error.replace(/^.*?:\d+:\d+: /, '') : body.error;
    error.textContent = body.line ? `Line ${body.line}, column ${body.column}: ${bare}` : body.error;
  }

  async function load() {
    try {
      row = await api.get('/v1/cluster/config');
      applied = row.applied_version;
      text.value = row.body;
      edited = false;
      error.hidden = true;
      describe();
    } catch (err) {
      flash(notice, err.message, 'error');
    }
  }

  save.addEventListener('click', async () => {
    if (!row) return;
    save.disabled = true;
    flash(notice, '', 'ok');
    error.hidden = true;
    try {
      row = await api.put('/v1/cluster/config', { expected_version: row.version, body: text.value });
      edited = false;
      describe();
      flash(notice, `Saved as version ${row.version}; every node applies it.`, 'ok');
    } catch (err) {
      if (err.status === 409) showError({ error: `${err.message} (Reload shows it; your text stays until then.)` });
      else if (err.status === 400 || err.status === 422) showError(err.body);
      else flash(notice, err.message, 'error');
    } finally {
      save.disabled = false;
    }
  });
  reload.addEventListener('click', () => { flash(notice, '', 'ok'); load(); });
  text.addEventListener('input', () => { edited = true; });
  load();

  return {
    box,
    // A refresh of the status: the version this node runs, and a newer
    // version another node wrote (loaded unless the text is being edited).
    update(config) {
      if (!config) return;
      applied = config.applied_version;
      if (row && config.version != null && config.version !== row.version && !edited) load();
      else describe();
      if (config.error) {
        showError({ error: `This node refused version ${config.version}: ${config.error}` });
        refusal = true;
      } else if (refusal) {
        error.hidden = true;
        refusal = false;
      }
    },
  };
}

// A server's tools: how many, then their names without the `<server>__` prefix.
function mcpTools(server) {
  const prefix = `${server.name}__`;
  const names = (server.tools || []).map((t) => (t.startsWith(prefix) ? t.slice(prefix.length) : t));
  if (!names.length) return h('span', { class: 'muted' }, server.state === 'running' ? 'none offered' : '');
  return h('span', { class: 'mcp-tools' }, h('strong', {}, String(names.length)), ' ', h('span', { class: 'muted' }, names.join(', ')));
}

// Tool calls by outcome: `12 ok, 1 timeout`.
function mcpCalls(calls) {
  const parts = Object.entries(calls || {}).filter(([, n]) => n > 0).map(([outcome, n]) => `${n} ${outcome}`);
  return parts.length ? parts.join(', ') : 'none';
}

export function status(main) {
  const body = h('div', { id: 'status-body' });
  main.append(h('h1', {}, 'Engines & transports'), body);
  let timer = null;
  let clusterConfig = null;

  async function load() {
    try {
      const s = await api.get('/v1/status');
      // Not rebuilt under the hands of someone typing in the cluster config.
      if (clusterConfig && clusterConfig.box.contains(document.activeElement)) return;
      const cluster = s.cluster ? clusterPanel(s.cluster) : null;
      if (cluster) {
        clusterConfig = clusterConfig || clusterConfigEditor();
        cluster.appendChild(clusterConfig.box);
        clusterConfig.update(s.cluster.config);
      }
      const transports = Object.entries(s.transports).map(([id, t]) => ({ id, ...t }));
      const secrets = Object.entries(s.secrets || {}).map(([name, origin]) => ({ name, ...origin }));
      clear(body).append(
        h('div', { class: 'stats' },
          stat('Running', `${s.scheduler.in_flight} / ${s.scheduler.max}`),
          stat('Waiting', s.scheduler.waitq),
          stat('Queued', s.scheduler.queued),
          stat('Up', duration(s.uptime_ms))),
        section('Engines', `Requests that name no engine go to ${s.default_engine} (${s.default_engine_reason}).`,
          table([
            ['Engine', (e) => h('strong', {}, e.id)],
            ['State', (e) => badge(e.available ? 'available' : 'unavailable')],
            ['Version', (e) => h('span', { class: 'nowrap' }, e.version || '')],
            ['Program', (e) => (e.path ? h('code', {}, e.path) : h('span', { class: 'reason' }, e.reason || 'built in'))],
            ['Steer', (e) => (e.steer ? 'yes' : 'no')],
          ], s.engines)),
        section('MCP servers', 'Servers of [[gateway.mcp_servers]]: native runs are offered their tools as <server>__<tool>. A server starts with the first run that offers it.',
          h('div', { id: 'mcp-servers' }, table([
            ['Server', (m) => h('strong', { class: 'nowrap' }, m.name)],
            ['Transport', (m) => m.transport],
            ['State', (m) => badge(m.state)],
            ['Tools', (m) => mcpTools(m)],
            ['Last error', (m) => (m.error ? h('span', { class: 'reason' }, m.error) : '')],
            ['Calls', (m) => h('span', { class: 'nowrap' }, mcpCalls(m.calls))],
          ], s.mcp_servers || [], 'No MCP servers configured.'))),
        section('Provider keys and secrets', 'Where each secret the config names was found. Values are never shown.',
          table([
            ['Secret', (x) => h('code', {}, x.name)],
            ['Source', (x) => x.source],
            ['Also set in', (x) => (x.overrides || []).join(', ')],
          ], secrets, 'The config names no secrets.')),
        section('Transports', null, table([
          ['Transport', (t) => h('strong', {}, t.id)],
          ['State', (t) => badge(t.state)],
          ['Detail', (t) => t.detail || (t.reason ? `${t.reason} (attempt ${t.attempts}, retry in ${duration(t.retry_in_ms)})` : '')],
        ], transports)),
        cluster,
        s.store ? storage(s.store) : null);
    } catch (err) {
      failed(body, err);
    }
  }
  load();
  timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}

export function secrets(main) {
  const body = h('div', { id: 'secrets-body' });
  const notice = h('p', { class: 'flash', id: 'secrets-notice', hidden: true });
  const name = h('input', { type: 'text', id: 'secret-name', placeholder: 'openai_api_key', 'aria-label': 'Secret name', spellcheck: 'false', required: true });
  const value = h('input', { type: 'password', id: 'secret-value', placeholder: 'value', 'aria-label': 'Secret value', autocomplete: 'new-password', required: true });
  const form = h('form', { class: 'row wrap', id: 'secret-form', onsubmit: save },
    name, value, h('button', { type: 'submit', class: 'primary' }, 'Save secret'));
  main.append(h('h1', {}, 'Secrets'), notice, body);

  async function save(event) {
    event.preventDefault();
    const key = name.value.trim();
    try {
      await api.put(`/v1/secrets/${encodeURIComponent(key)}`, { value: value.value });
      value.value = '';
      name.value = '';
      flash(notice, `${key} saved.`, 'ok');
      load();
    } catch (err) {
      flash(notice, err.message, 'error');
    }
  }

  async function remove(secret) {
    try {
      await api.del(`/v1/secrets/${encodeURIComponent(secret.name)}`);
      flash(notice, `${secret.name} deleted.`, 'ok');
      load();
    } catch (err) {
      flash(notice, err.message, 'error');
    }
  }

  async function load() {
    try {
      const answer = await api.optional('/v1/secrets');
      if (!answer) return clear(body).appendChild(section('Secrets', null, notConfigured('Managing secrets from the dashboard')));
      const keychain = answer.keychain || {};
      clear(body).append(
        section('Set or replace', 'The value is sent once and never shown back.', form),
        section('Stored secrets',
          keychain.available ? `Keychain: ${keychain.detail || 'available'}.` : `No keychain: ${keychain.detail || 'unavailable'}; secrets go to secrets.toml.`,
          table([
            ['Name', (s) => h('code', {}, s.name)],
            ['Stored in', (s) => s.source || 'not set'],
            ['Used by', (s) => (s.used_by || []).join(', ')],
            ['', (s) => h('span', { class: 'row' },
              h('button', { type: 'button', onclick: () => { name.value = s.name; value.focus(); } }, 'Replace'),
              h('button', { type: 'button', class: 'danger', onclick: () => remove(s) }, 'Delete'))],
          ], answer.secrets || [], 'No secrets stored yet.')));
    } catch (err) {
      failed(body, err);
    }
  }
  load();
}
