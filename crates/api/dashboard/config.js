// The config editor: config.toml as written (comments kept), saved whole
// through PUT /v1/config; a refused text is marked at its line.

import * as api from './api.js';
import { clear, flash, h, section } from './dom.js';

const LINE_HEIGHT = 20;
const PAD = 10;

export function editor(main) {
  const text = h('textarea', { id: 'config-text', class: 'code', spellcheck: 'false', wrap: 'off', 'aria-label': 'config.toml' });
  const gutter = h('div', { class: 'gutter', 'aria-hidden': 'true' });
  const band = h('div', { class: 'error-band', hidden: true });
  const bubble = h('div', { class: 'error-inline', id: 'config-error', role: 'alert', hidden: true });
  const wrap = h('div', { class: 'editor' }, gutter, h('div', { class: 'editor-body' }, band, text, bubble));
  const save = h('button', { type: 'button', class: 'primary', id: 'config-save' }, 'Save');
  const revert = h('button', { type: 'button', id: 'config-revert' }, 'Revert');
  const notice = h('p', { class: 'flash', id: 'config-notice', hidden: true });
  const info = h('div', { id: 'config-info', class: 'muted' });
  const state = h('div', { id: 'config-state' });
  main.append(h('h1', {}, 'Config'),
    section('config.toml', null, info, state, wrap, h('div', { class: 'row' }, save, revert, notice)));

  let saved = '';
  let errorAt = null;

  function renderGutter() {
    const lines = text.value.split('\n').length;
    clear(gutter);
    for (let i = 1; i <= lines; i += 1) {
      gutter.appendChild(h('div', { class: errorAt && errorAt.line === i ? 'error-line' : null }, String(i)));
    }
    gutter.scrollTop = text.scrollTop;
    place();
  }

  // The band and the message sit on the error's line, following the scroll.
  function place() {
    if (!errorAt || !errorAt.line) { band.hidden = true; return; }
    const top = PAD + (errorAt.line - 1) * LINE_HEIGHT - text.scrollTop;
    band.hidden = false;
    band.style.top = `${top}px`;
    bubble.style.top = `${top + LINE_HEIGHT}px`;
  }

  function showError(message, line, column) {
    errorAt = line ? { line, column } : null;
    bubble.hidden = false;
    // The message names the file and place first; the place is shown as words.
    const bare = line ? message.replace(/^.*?:\d+:\d+: /, '') : message;
    bubble.textContent = line ? `Line ${line}, column ${column}: ${bare}` : message;
    bubble.classList.toggle('floating', Boolean(line));
    if (!line) bubble.style.top = '';
    renderGutter();
  }

  function clearError() {
    errorAt = null;
    bubble.hidden = true;
    renderGutter();
  }

  async function loadState() {
    const report = await api.get('/v1/config');
    clear(state);
    if (report.rejected) {
      state.appendChild(h('p', { class: 'error' }, `The file on disk was refused: ${report.rejected.error}`));
    }
    for (const p of report.pending_restart || []) {
      state.appendChild(h('p', { class: 'warn' }, `${p.key} waits for a restart (running ${JSON.stringify(p.running)}, file ${JSON.stringify(p.file)}).`));
    }
    return report;
  }

  async function load() {
    try {
      const file = await api.get('/v1/config/file');
      const report = await loadState();
      saved = file.text;
      text.value = file.text;
      info.textContent = `${file.path}${file.exists ? '' : ' (not created yet)'} · generation ${report.generation}`;
      clearError();
    } catch (err) {
      if (err.status === 404) {
        clear(wrap).appendChild(h('p', { class: 'empty' }, 'This gateway has no config file to edit.'));
        save.disabled = true;
        revert.disabled = true;
      } else {
        flash(notice, err.message, 'error');
      }
    }
  }

  // After a save the gateway's watch applies the file; this waits (bounded)
  // for the new generation or a refusal and says which.
  async function settle(before) {
    for (let i = 0; i < 30; i += 1) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      const report = await api.get('/v1/config');
      if (report.generation !== before.generation) {
        await loadState();
        info.textContent = info.textContent.replace(/generation \d+/, `generation ${report.generation}`);
        return flash(notice, `Saved and applied (generation ${report.generation}).`, 'ok');
      }
      if (report.rejected && (!before.rejected || report.rejected.at_ms !== before.rejected.at_ms)) {
        await loadState();
        // `path:line:column: message`, placed like a refusal of the save.
        const at = /:(\d+):(\d+): /.exec(report.rejected.error);
        return showError(report.rejected.error, at && Number(at[1]), at && Number(at[2]));
      }
    }
    await loadState();
    flash(notice, 'Saved. Nothing in it changes a running setting.', 'info');
  }

  save.addEventListener('click', async () => {
    save.disabled = true;
    flash(notice, '', 'ok');
    try {
      const before = await api.get('/v1/config');
      const answer = await api.put('/v1/config', { text: text.value });
      saved = text.value;
      clearError();
      const warnings = (answer.warnings || []).join(' ');
      flash(notice, `Saved${warnings ? ` with warnings: ${warnings}` : '; applying…'}`, warnings ? 'info' : 'ok');
      await settle(before);
    } catch (err) {
      if (err.status === 422) showError(err.body.error, err.body.line, err.body.column);
      else flash(notice, err.message, 'error');
    } finally {
      save.disabled = false;
    }
  });
  revert.addEventListener('click', () => { text.value = saved; clearError(); flash(notice, '', 'ok'); });
  text.addEventListener('input', renderGutter);
  text.addEventListener('scroll', () => { gutter.scrollTop = text.scrollTop; place(); });
  load();
}
