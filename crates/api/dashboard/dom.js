// Building DOM nodes without HTML strings: text always goes in as text.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (value === true) el.setAttribute(key, '');
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function ago(ms) {
  if (!ms) return '';
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return new Date(ms).toLocaleString();
}

export function duration(ms) {
  if (ms === undefined || ms === null) return '';
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)}m ${Math.round((ms % 60000) / 1000)}s`;
}

export function usd(value) {
  return `$${Number(value || 0).toFixed(4)}`;
}

export function badge(status) {
  return h('span', { class: `badge badge-${status || 'unknown'}` }, status || 'unknown');
}

// A section with a heading and an optional line under it.
export function section(title, lead, ...body) {
  return h('section', { class: 'card' }, h('h2', {}, title), lead ? h('p', { class: 'muted' }, lead) : null, ...body);
}

// A table from rows: columns are [heading, row => cell].
export function table(columns, rows, empty = 'Nothing yet.') {
  if (!rows.length) return h('p', { class: 'empty' }, empty);
  return h('table', {},
    h('thead', {}, h('tr', {}, columns.map(([title]) => h('th', {}, title)))),
    h('tbody', {}, rows.map((row) => h('tr', {}, columns.map(([, cell]) => h('td', {}, cell(row)))))));
}

// A message that replaces itself: flash(el, 'Saved', 'ok').
export function flash(el, text, kind = 'ok') {
  el.hidden = !text;
  el.className = `flash flash-${kind}`;
  el.textContent = text || '';
}
