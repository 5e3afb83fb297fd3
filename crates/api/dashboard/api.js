// Calls to the control API with the token from session storage, and event
// streams read with fetch so the token goes in the Authorization header.

const KEY = 'lemon.token';

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

export function token() {
  return sessionStorage.getItem(KEY) || '';
}

export function setToken(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

export async function call(method, path, body, bearer = token()) {
  const headers = { Authorization: `Bearer ${bearer}` };
  const init = { method, headers, cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { error: text }; }
  if (!response.ok) {
    if (response.status === 401 && bearer === token()) onUnauthorized();
    throw new ApiError(response.status, data);
  }
  return data;
}

export const get = (path) => call('GET', path);
export const post = (path, body = {}) => call('POST', path, body);
export const put = (path, body) => call('PUT', path, body);
export const del = (path) => call('DELETE', path);

// GET that answers null on 404: a component this gateway does not run.
export async function optional(path) {
  try {
    return await get(path);
  } catch (err) {
    if (err.status === 404) return null;
    throw err;
  }
}

// Reads Server-Sent Events from `path` until `signal` aborts or the stream
// ends; calls `onEvent({event, data, id})` with `data` parsed as JSON.
// Resolves once the stream is open (`opened`) and again when it ends (`done`).
export function stream(path, onEvent, signal) {
  let markOpen;
  const opened = new Promise((resolve) => { markOpen = resolve; });
  const done = (async () => {
    const response = await fetch(path, {
      headers: { Authorization: `Bearer ${token()}`, Accept: 'text/event-stream' },
      cache: 'no-store',
      credentials: 'omit',
      signal,
    });
    if (!response.ok) {
      if (response.status === 401) onUnauthorized();
      throw new ApiError(response.status, null);
    }
    markOpen();
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    let current = { event: 'message', data: [], id: null };
    for (;;) {
      const { value, done: ended } = await reader.read();
      if (ended) break;
      buffer += value;
      let newline;
      while ((newline = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, newline).replace(/\r$/, '');
        buffer = buffer.slice(newline + 1);
        if (line === '') {
          if (current.data.length) {
            let data = current.data.join('\n');
            try { data = JSON.parse(data); } catch { /* plain text */ }
            onEvent({ event: current.event, data, id: current.id });
          }
          current = { event: 'message', data: [], id: null };
        } else if (!line.startsWith(':')) {
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (field === 'event') current.event = text;
          else if (field === 'data') current.data.push(text);
          else if (field === 'id') current.id = text;
        }
      }
    }
  })();
  done.catch(() => markOpen());
  return { opened, done };
}
