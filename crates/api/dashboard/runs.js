// Runs: the live page (prompt box, streaming runs with cancel and steer),
// the history with search, and sessions with their queues.

import * as api from './api.js';
import { ago, badge, clear, duration, flash, h, section, table, usd } from './dom.js';

const FINISHED_KEPT = 8;

// One run on the live page, fed by events in index order.
class RunView {
  constructor(runId, info = {}) {
    this.runId = runId;
    this.last = 0;
    this.pending = [];
    this.backfill = null;
    this.done = false;
    this.actions = new Map();
    this.status = badge(info.status || 'queued');
    this.meta = h('span', { class: 'muted' }, runMeta(info));
    this.answer = h('pre', { class: 'answer', 'aria-live': 'polite' }, info.answer || '');
    this.actionList = h('ul', { class: 'actions' });
    this.notice = h('p', { class: 'flash', hidden: true });
    this.steerInput = h('input', { type: 'text', class: 'steer-input', placeholder: 'Steer this run…', 'aria-label': 'Steer text' });
    this.steerButton = h('button', { type: 'submit', class: 'steer' }, 'Steer');
    this.cancelButton = h('button', { type: 'button', class: 'danger cancel', onclick: () => this.cancel() }, 'Cancel');
    this.controls = h('form', { class: 'run-controls', onsubmit: (e) => { e.preventDefault(); this.steer(); } },
      this.steerInput, this.steerButton, this.cancelButton);
    this.prompt = h('p', { class: 'prompt', hidden: !info.prompt }, info.prompt || '');
    this.el = h('article', { class: 'run', dataset: { runId } },
      h('header', {}, this.status, h('code', { class: 'run-id' }, runId), this.meta),
      this.prompt,
      // The controls stay put above the answer while it grows.
      this.controls, this.notice, this.actionList, this.answer);
  }

  // The prompt, once known (a run seen first on the event stream has none).
  describe(info) {
    if (info.prompt && !this.prompt.textContent) {
      this.prompt.textContent = info.prompt;
      this.prompt.hidden = false;
    }
  }

  // An event from the firehose: held back while stored events are replayed.
  live(event) {
    if (event.index <= this.last) return;
    if (this.backfill) { this.pending.push(event); return; }
    this.apply(event);
  }

  // An event replayed from the run's own stream, in order from the first.
  replayed(event) {
    if (event.index > this.last) this.apply(event);
    if (this.pending.length && this.last + 1 >= this.pending[0].index) this.endBackfill();
  }

  endBackfill() {
    if (this.backfill) { this.backfill.abort(); this.backfill = null; }
    const held = this.pending.sort((a, b) => a.index - b.index);
    this.pending = [];
    for (const event of held) if (event.index > this.last) this.apply(event);
  }

  apply(event) {
    this.last = event.index;
    switch (event.type) {
      case 'run_started':
        this.setStatus('running');
        this.meta.textContent = runMeta({ engine: event.engine, session_key: event.session_key });
        break;
      case 'run_status':
      case 'run_phase':
        if (!this.done) this.setStatus(event.status || event.phase);
        break;
      case 'engine_action':
        this.action(event.action);
        break;
      case 'delta':
        this.answer.textContent += event.text;
        break;
      case 'run_completed':
        this.complete(event);
        break;
      default:
        break;
    }
  }

  action(action) {
    if (action.kind === 'approval') { this.approval(action); return; }
    let item = this.actions.get(action.id);
    if (!item) {
      item = h('li', {});
      this.actions.set(action.id, item);
      this.actionList.appendChild(item);
    }
    const state = action.phase === 'completed' ? (action.ok === false ? 'failed' : 'done') : 'working';
    clear(item).className = `action action-${state}`;
    item.append(h('span', { class: 'action-kind' }, action.kind), ' ', action.title || action.detail || action.id);
    if (action.message && action.ok === false) item.append(h('span', { class: 'muted' }, ` — ${action.message}`));
  }

  // A call waiting for the owner: a card with the call and Approve / Deny,
  // replaced by how it was settled once it is (here or on any surface).
  approval(action) {
    const request = (action.detail && action.detail.approval) || {};
    let card = this.actions.get(action.id);
    if (!card) {
      card = h('li', { class: 'approval', dataset: { approval: request.id || '' } });
      this.actions.set(action.id, card);
      this.actionList.appendChild(card);
    }
    clear(card);
    if (action.phase !== 'completed') {
      const notice = h('p', { class: 'flash', hidden: true });
      const answer = async (decision, buttons) => {
        for (const button of buttons) button.disabled = true;
        try {
          await api.post(`/v1/approvals/${encodeURIComponent(request.id)}`, { decision, via: 'dashboard' });
        } catch (err) {
          flash(notice, err.message, 'error');
          for (const button of buttons) button.disabled = false;
        }
      };
      const approve = h('button', { type: 'button', class: 'primary approve' }, 'Approve');
      const deny = h('button', { type: 'button', class: 'danger deny' }, 'Deny');
      const always = h('button', { type: 'button', class: 'always', title: 'Approve, and do not ask again in this session for the same command, directory or host' }, 'Always for this session');
      const buttons = [approve, deny, always];
      approve.addEventListener('click', () => answer('approve', buttons));
      deny.addEventListener('click', () => answer('deny', buttons));
      always.addEventListener('click', () => answer('always', buttons));
      const expires = request.expires_at_ms ? ` · denied ${untilText(request.expires_at_ms)} without an answer` : '';
      card.className = 'approval approval-asked';
      card.append(
        h('p', { class: 'approval-question' }, 'Allow this? ', h('strong', {}, request.tool || ''), ': ',
          h('code', { class: 'approval-subject' }, request.subject || '')),
        h('p', { class: 'muted approval-rule' },
          request.untrusted ? h('span', { class: 'badge badge-untrusted' }, 'untrusted') : null,
          request.untrusted ? ' ' : null,
          `rule: ${request.rule || ''}${expires}`),
        h('div', { class: 'row' }, approve, deny, always),
        notice);
      return;
    }
    card.className = `approval approval-${action.ok ? 'approved' : 'denied'}`;
    card.append(h('span', { class: 'action-kind' }, 'approval'), ' ',
      h('strong', {}, request.tool || ''), ': ', h('code', {}, request.subject || ''),
      h('span', { class: 'approval-outcome' }, ` — ${action.message || (action.ok ? 'approved' : 'denied')}`));
  }

  complete(event) {
    this.done = true;
    this.setStatus(event.status);
    if (event.answer && !this.answer.textContent.trim()) this.answer.textContent = event.answer;
    if (event.status === 'cancelled') flash(this.notice, 'Cancelled.', 'info');
    else if (event.error) flash(this.notice, event.error, 'error');
    this.meta.textContent = `${runMeta({ engine: event.engine, session_key: event.session_key })} · ${duration(event.duration_ms)}`;
    this.controls.hidden = true;
    this.el.classList.add('finished');
    if (this.onDone) this.onDone(this);
  }

  setStatus(status) {
    this.status.className = `badge badge-${status}`;
    this.status.textContent = status;
  }

  async cancel() {
    this.cancelButton.disabled = true;
    try {
      const answer = await api.post(`/v1/runs/${encodeURIComponent(this.runId)}/cancel`);
      // The run may have ended before the answer came back.
      if (!this.done) flash(this.notice, `Cancel requested (${answer.status}).`, 'info');
    } catch (err) {
      flash(this.notice, err.message, 'error');
      this.cancelButton.disabled = false;
    }
  }

  async steer() {
    const text = this.steerInput.value.trim();
    if (!text) return;
    this.steerButton.disabled = true;
    try {
      const answer = await api.post(`/v1/runs/${encodeURIComponent(this.runId)}/steer`, { text });
      if (answer.accepted) {
        this.steerInput.value = '';
        flash(this.notice, 'Steer accepted: the run takes it now.', 'ok');
      } else {
        flash(this.notice, `Steer not accepted: ${answer.reason || 'the engine cannot be steered'}.`, 'error');
      }
    } catch (err) {
      flash(this.notice, err.message, 'error');
    } finally {
      this.steerButton.disabled = false;
    }
  }
}

// "in 9 min" until a time in ms.
function untilText(ms) {
  const s = Math.max(0, Math.round((ms - Date.now()) / 1000));
  return s < 90 ? `in ${s} s` : `in ${Math.round(s / 60)} min`;
}

function runMeta(info) {
  return [info.engine, info.session_key && `session ${info.session_key}`].filter(Boolean).join(' · ');
}

async function engineOptions(select) {
  const status = await api.get('/v1/status');
  clear(select);
  for (const engine of status.engines) {
    const label = engine.available ? engine.id : `${engine.id} (unavailable)`;
    const option = h('option', { value: engine.id, disabled: !engine.available }, label);
    if (engine.id === status.default_engine) option.selected = true;
    select.appendChild(option);
  }
  return status;
}

export function live(main) {
  const controller = new AbortController();
  const views = new Map();
  const activeList = h('div', { class: 'runs', id: 'active-runs' });
  const finishedList = h('div', { class: 'runs', id: 'finished-runs' });
  const emptyActive = h('p', { class: 'empty' }, 'No run is active. Start one above.');
  const connection = h('span', { class: 'dot dot-off', title: 'event stream' });

  const prompt = h('textarea', { id: 'prompt', rows: 3, placeholder: 'Ask an engine to do something…', required: true });
  const engine = h('select', { id: 'engine', 'aria-label': 'Engine' });
  const session = h('input', { id: 'session', type: 'text', value: 'dashboard', 'aria-label': 'Session key', spellcheck: 'false' });
  const submitButton = h('button', { type: 'submit', class: 'primary', disabled: true }, 'Run');
  const formNotice = h('p', { class: 'flash', hidden: true });
  const form = h('form', { class: 'prompt-form', onsubmit: submit },
    prompt,
    h('div', { class: 'row' },
      h('label', {}, 'Engine ', engine),
      h('label', {}, 'Session ', session),
      h('span', { class: 'grow' }),
      submitButton),
    formNotice);

  main.append(
    h('h1', {}, 'Live runs ', connection),
    section('Start a run', null, form),
    section('Active', null, emptyActive, activeList),
    section('Recently finished', null, finishedList));

  function refreshEmpty() {
    emptyActive.hidden = activeList.children.length > 0;
  }

  function view(runId, info) {
    let existing = views.get(runId);
    if (existing) {
      existing.describe(info);
      return existing;
    }
    existing = new RunView(runId, info);
    existing.onDone = (done) => {
      finishedList.prepend(done.el);
      while (finishedList.children.length > FINISHED_KEPT) {
        const old = finishedList.lastChild;
        views.delete(old.dataset.runId);
        old.remove();
      }
      refreshEmpty();
    };
    views.set(runId, existing);
    activeList.prepend(existing.el);
    refreshEmpty();
    return existing;
  }

  function backfill(target) {
    if (target.backfill || target.done) return;
    target.backfill = new AbortController();
    const abort = () => target.backfill && target.backfill.abort();
    controller.signal.addEventListener('abort', abort);
    const { done } = api.stream(`/v1/runs/${encodeURIComponent(target.runId)}/events`, ({ data }) => {
      if (data && data.run_id) target.replayed(data);
    }, target.backfill.signal);
    done.catch(() => {}).finally(() => {
      controller.signal.removeEventListener('abort', abort);
      if (target.backfill) target.endBackfill();
    });
  }

  async function submit(event) {
    event.preventDefault();
    const text = prompt.value.trim();
    if (!text) return;
    submitButton.disabled = true;
    try {
      const body = { prompt: text, engine: engine.value || undefined, session_key: session.value.trim() || undefined };
      const answer = await api.post('/v1/runs', body);
      if (answer.run_id) {
        view(answer.run_id, { status: 'queued', prompt: text, engine: answer.engine, session_key: answer.session_key });
        flash(formNotice, '', 'ok');
        prompt.value = '';
      } else if (answer.reply) {
        flash(formNotice, answer.reply, 'info');
      }
    } catch (err) {
      flash(formNotice, err.message, 'error');
    } finally {
      submitButton.disabled = false;
    }
  }

  async function follow() {
    let delay = 500;
    while (!controller.signal.aborted) {
      const { opened, done } = api.stream('/v1/events', ({ data }) => {
        if (!data || !data.run_id || typeof data.index !== 'number') return;
        const known = views.get(data.run_id);
        const target = known || view(data.run_id, { status: 'running', engine: data.engine, session_key: data.session_key });
        if (!known) {
          if (data.index > 1) backfill(target);
          api.get(`/v1/runs/${encodeURIComponent(data.run_id)}`).then((run) => target.describe(run), () => {});
        }
        target.live(data);
      }, controller.signal);
      await opened;
      if (!controller.signal.aborted) {
        connection.className = 'dot dot-on';
        submitButton.disabled = false;
        delay = 500;
        // Whatever ran while the stream was closed is read back.
        for (const known of views.values()) if (!known.done) backfill(known);
      }
      await done.catch(() => {});
      connection.className = 'dot dot-off';
      if (controller.signal.aborted) return;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }

  (async () => {
    try {
      await engineOptions(engine);
      for (const status of ['running', 'queued']) {
        const list = await api.get(`/v1/runs?status=${status}&limit=50`);
        for (const run of list.runs.reverse()) backfill(view(run.run_id, run));
      }
    } catch (err) {
      flash(formNotice, err.message, 'error');
    }
    follow();
  })();

  return () => controller.abort();
}

export function history(main) {
  const search = h('input', { type: 'search', id: 'history-search', placeholder: 'Search prompts, answers, sessions, run ids…', 'aria-label': 'Search runs' });
  const status = h('select', { id: 'history-status', 'aria-label': 'Status' },
    ['', 'completed', 'failed', 'cancelled', 'running', 'queued'].map((s) => h('option', { value: s }, s || 'any status')));
  const results = h('div', { id: 'history-results' });
  const count = h('span', { class: 'muted' });
  let runs = [];
  main.append(h('h1', {}, 'History'),
    section('Runs', null, h('div', { class: 'row' }, search, status, count), results));

  function render() {
    const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
    const matching = runs.filter((run) => {
      const text = [run.run_id, run.session_key, run.engine, run.prompt, run.answer, run.error].join(' ').toLowerCase();
      return words.every((word) => text.includes(word));
    });
    count.textContent = `${matching.length} of ${runs.length}`;
    clear(results).appendChild(table([
      ['Status', (r) => badge(r.status)],
      ['Prompt', (r) => h('details', {}, h('summary', {}, clip(r.prompt, 90)), runDetail(r))],
      ['Engine', (r) => r.engine],
      ['Session', (r) => r.session_key],
      ['Spend', (r) => usd(r.spend && r.spend.usd)],
      ['Took', (r) => h('span', { class: 'nowrap' }, duration(r.duration_ms))],
      ['When', (r) => h('span', { class: 'nowrap' }, ago(r.created_at_ms))],
    ], matching, runs.length ? 'No run matches.' : 'No runs yet.'));
  }

  async function load() {
    try {
      const query = status.value ? `&status=${status.value}` : '';
      runs = (await api.get(`/v1/runs?limit=500${query}`)).runs;
      render();
    } catch (err) {
      clear(results).appendChild(h('p', { class: 'error' }, err.message));
    }
  }
  search.addEventListener('input', render);
  status.addEventListener('change', load);
  // #/history/<run id> (the desktop tray's run items) shows that run.
  const wanted = location.hash.replace(/^#\/?/, '').split('/')[1];
  if (wanted) search.value = decodeURIComponent(wanted);
  load();
}

function clip(text, n) {
  const value = (text || '').replace(/\s+/g, ' ').trim();
  return value.length > n ? `${value.slice(0, n - 1)}…` : value;
}

function runDetail(run) {
  return h('dl', { class: 'detail' },
    h('dt', {}, 'Run'), h('dd', {}, h('code', {}, run.run_id)),
    h('dt', {}, 'Prompt'), h('dd', {}, h('pre', {}, run.prompt || '')),
    run.answer ? [h('dt', {}, 'Answer'), h('dd', {}, h('pre', {}, run.answer))] : null,
    run.error ? [h('dt', {}, 'Error'), h('dd', { class: 'error' }, run.error)] : null,
    run.resume_line ? [h('dt', {}, 'Resume'), h('dd', {}, h('code', {}, run.resume_line))] : null,
    run.spend ? [h('dt', {}, 'Tokens'), h('dd', {}, `${run.spend.input_tokens} in · ${run.spend.output_tokens} out`)] : null);
}

export function sessions(main) {
  const list = h('div', { id: 'session-list', class: 'grid' });
  const notice = h('p', { class: 'flash', hidden: true });
  main.append(h('h1', {}, 'Sessions'),
    h('p', { class: 'muted' }, 'Sessions with recent runs: what runs now, what waits in the queue, and the engine the session sticks to.'),
    notice, list);
  let timer = null;

  async function load() {
    try {
      const { runs } = await api.get('/v1/runs?limit=300');
      const keys = [...new Set(runs.map((run) => run.session_key))].slice(0, 24);
      const views = await Promise.all(keys.map((key) => api.get(`/v1/sessions/${encodeURIComponent(key)}`)));
      clear(list);
      if (!views.length) list.appendChild(h('p', { class: 'empty' }, 'No sessions yet.'));
      for (const view of views) {
        const last = runs.find((run) => run.session_key === view.session_key);
        list.appendChild(sessionCard(view, last));
      }
    } catch (err) {
      flash(notice, err.message, 'error');
    }
  }

  function sessionCard(view, last) {
    const act = async (what) => {
      try {
        const answer = await api.post(`/v1/sessions/${encodeURIComponent(view.session_key)}/${what}`);
        flash(notice, `${view.session_key}: ${answer.cancelled} cancelled, ${answer.dropped} dropped from the queue.`, 'info');
        load();
      } catch (err) {
        flash(notice, err.message, 'error');
      }
    };
    const busy = view.active_runs.length > 0;
    return h('article', { class: 'card session', dataset: { session: view.session_key } },
      h('h3', {}, view.session_key, ' ', busy ? badge('running') : badge('idle')),
      h('p', { class: 'muted' }, [view.engine && `engine ${view.engine}`, last && `last run ${ago(last.created_at_ms)}`].filter(Boolean).join(' · ')),
      h('dl', { class: 'detail' },
        h('dt', {}, 'Active'), h('dd', {}, view.active_runs.length ? view.active_runs.map((id) => h('code', {}, id, ' ')) : 'none'),
        h('dt', {}, 'Queue'), h('dd', { class: 'queue' }, view.queue.length ? h('ol', {}, view.queue.map((id) => h('li', {}, h('code', {}, id)))) : 'empty'),
        view.pending_steers ? [h('dt', {}, 'Steers'), h('dd', {}, String(view.pending_steers))] : null),
      h('div', { class: 'row' },
        h('button', { type: 'button', disabled: !busy, onclick: () => act('cancel') }, 'Cancel active'),
        h('button', { type: 'button', class: 'danger', disabled: !busy && !view.queue.length, onclick: () => act('abort') }, 'Abort queue')));
  }

  load();
  timer = setInterval(load, 4000);
  return () => clearInterval(timer);
}
