// The chat page of atlas serve: models from /v1/models, answers streamed from
// /v1/chat/completions, conversations and settings in localStorage, the API key (when the
// server wants one) in sessionStorage. Model output only ever reaches the page as text
// nodes: the Markdown renderer below builds elements itself and never parses HTML.
'use strict';

const $ = (id) => document.getElementById(id);
const KEYS = { convs: 'atlas.conversations', current: 'atlas.current', settings: 'atlas.settings',
  model: 'atlas.model', apiKey: 'atlas.key' };

let conversations = load(KEYS.convs, []);
let currentId = localStorage.getItem(KEYS.current);
let settings = load(KEYS.settings, { system: '', temperature: '', top_p: '', max_tokens: '' });
let models = [];
let controller = null; // the AbortController of the answer being streamed

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v === null ? fallback : v;
  } catch {
    return fallback;
  }
}

function save() {
  localStorage.setItem(KEYS.convs, JSON.stringify(conversations));
  if (currentId) localStorage.setItem(KEYS.current, currentId);
  else localStorage.removeItem(KEYS.current);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function setStatus(text) { $('status').textContent = text; }

function setBusy(busy) {
  document.body.dataset.state = busy ? 'busy' : 'ready';
  $('send').disabled = busy;
  $('stop').disabled = !busy;
}

// --- the API ------------------------------------------------------------------------------

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  const key = sessionStorage.getItem(KEYS.apiKey);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorText(res) {
  const body = await res.text();
  try {
    const v = JSON.parse(body);
    if (v && v.error) return typeof v.error === 'string' ? v.error : v.error.message;
  } catch { /* not JSON: the body as it is */ }
  return body || `${res.status} ${res.statusText}`;
}

function needKey(message) {
  $('key-form').hidden = false;
  setStatus(message);
  $('api-key').focus();
}

async function loadModels() {
  let res;
  try {
    res = await fetch('/v1/models', { headers: headers(false) });
  } catch (e) {
    setStatus(`cannot reach the server: ${e.message}`);
    return;
  }
  if (res.status === 401) {
    needKey(await errorText(res));
    return;
  }
  if (!res.ok) {
    setStatus(`/v1/models: ${await errorText(res)}`);
    return;
  }
  $('key-form').hidden = true;
  models = (await res.json()).data || [];
  const select = $('model');
  const label = (m) => `${m.id} (${m.state || (m.resident ? 'resident' : 'unloaded')})`;
  const same = select.options.length === models.length &&
    models.every((m, k) => select.options[k].value === m.id);
  if (same) { // the states only: an open list stays open
    models.forEach((m, k) => { select.options[k].textContent = label(m); });
  } else {
    const want = select.value || currentConversation()?.model || localStorage.getItem(KEYS.model);
    select.replaceChildren();
    for (const m of models) {
      const o = el('option', null, label(m));
      o.value = m.id;
      select.appendChild(o);
    }
    if (models.some((m) => m.id === want)) select.value = want;
  }
  showModelState();
  if (document.body.dataset.state === 'loading') setBusy(false);
}

function showModelState() {
  const m = models.find((x) => x.id === $('model').value);
  $('model-state').textContent = m ? describe(m) : '';
}

function describe(m) {
  const parts = [m.state || (m.resident ? 'resident' : 'unloaded')];
  if (m.max_model_len) parts.push(`context ${m.max_model_len}`);
  if (m.running) parts.push(`${m.running} running`);
  if (m.waiting) parts.push(`${m.waiting} waiting`);
  if (m.last_error) parts.push(`last error: ${m.last_error}`);
  return parts.join(' · ');
}

// The OpenAI request of the conversation: its messages after the system prompt, and the
// sampling settings that are filled in (the rest are the model's own).
function request(conv) {
  const body = { model: conv.model, stream: true, messages: [] };
  if (settings.system.trim()) body.messages.push({ role: 'system', content: settings.system });
  for (const m of conv.messages) if (!m.error) body.messages.push({ role: m.role, content: m.content });
  for (const k of ['temperature', 'top_p']) if (settings[k] !== '') body[k] = Number(settings[k]);
  if (settings.max_tokens !== '') body.max_tokens = parseInt(settings.max_tokens, 10);
  return body;
}

// Reads a server-sent-event stream, calling onEvent with each "data:" payload parsed and
// onChunk after each piece that arrived.
async function readEvents(res, onEvent, onChunk) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let pending = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, cut).replace(/\r$/, '');
      pending = pending.slice(cut + 1);
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') return;
      onEvent(JSON.parse(data));
    }
    onChunk();
  }
}

async function send(text) {
  let conv = currentConversation();
  if (!conv) conv = newConversation();
  conv.model = $('model').value;
  localStorage.setItem(KEYS.model, conv.model);
  conv.messages.push({ role: 'user', content: text });
  if (!conv.title) conv.title = text.slice(0, 60);
  const answer = { role: 'assistant', content: '', reasoning: '', model: conv.model };
  conv.messages.push(answer);
  conv.updated = Date.now();
  save();
  renderConversations();
  renderMessages();
  const view = $('messages').lastElementChild;
  controller = new AbortController();
  setBusy(true);
  setStatus(`${conv.model}: answering…`);
  try {
    const body = request({ ...conv, messages: conv.messages.slice(0, -1) });
    const res = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(true),
      body: JSON.stringify(body), signal: controller.signal });
    if (res.status === 401) needKey(await errorText(res));
    if (!res.ok) throw new Error(await errorText(res));
    await readEvents(res, (ev) => {
      if (ev.error) throw new Error(ev.error.message || JSON.stringify(ev.error));
      const d = ev.choices?.[0]?.delta || {};
      if (d.reasoning_content) answer.reasoning += d.reasoning_content;
      if (d.content) answer.content += d.content;
      const why = ev.choices?.[0]?.finish_reason;
      if (why && why !== 'stop') answer.note = `finished: ${why}`;
    }, () => fillMessage(view, answer));
    setStatus('');
  } catch (e) {
    if (e.name === 'AbortError') {
      answer.note = 'stopped';
      setStatus('stopped');
    } else {
      answer.error = e.message;
      setStatus('');
    }
  } finally {
    controller = null;
    conv.updated = Date.now();
    save();
    fillMessage(view, answer);
    setBusy(false);
    loadModels();
  }
}

// --- Markdown, as DOM nodes ---------------------------------------------------------------

function safeUrl(s) {
  try {
    const u = new URL(s);
    return u.protocol === 'http:' || u.protocol === 'https:' ? u.href : null;
  } catch {
    return null;
  }
}

// Inline Markdown: `code`, **bold**, *italic*, _italic_, [text](http…) and bare http(s)
// links; everything else is text.
function inline(text, parent) {
  let buf = '';
  const flush = () => {
    if (buf) parent.appendChild(document.createTextNode(buf));
    buf = '';
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    const rest = text.slice(i);
    if (c === '`') {
      const end = text.indexOf('`', i + 1);
      if (end > i + 1) {
        flush();
        parent.appendChild(el('code', null, text.slice(i + 1, end)));
        i = end + 1;
        continue;
      }
    }
    if ((c === '*' || c === '_') && (c === '*' || i === 0 || !/\w/.test(text[i - 1]))) {
      const mark = text.startsWith(c + c, i) ? c + c : c;
      const from = i + mark.length;
      const end = text.indexOf(mark, from);
      if (end > from && !/\s/.test(text[from]) && !/\s/.test(text[end - 1])) {
        flush();
        const e = el(mark.length === 2 ? 'strong' : 'em');
        inline(text.slice(from, end), e);
        parent.appendChild(e);
        i = end + mark.length;
        continue;
      }
    }
    const link = c === '[' && /^\[([^\]\n]+)\]\(([^)\s]+)\)/.exec(rest);
    const bare = (c === 'h' && (i === 0 || /\W/.test(text[i - 1]))) && /^https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/.exec(rest);
    if (link || bare) {
      const url = safeUrl(link ? link[2] : bare[0]);
      if (url) {
        flush();
        const a = el('a');
        a.href = url;
        a.rel = 'noopener noreferrer';
        a.target = '_blank';
        if (link) inline(link[1], a);
        else a.textContent = bare[0];
        parent.appendChild(a);
        i += (link || bare)[0].length;
        continue;
      }
    }
    buf += c;
    i++;
  }
  flush();
}

// Lines of text with their breaks kept, for a paragraph.
function inlineLines(lines, parent) {
  lines.forEach((line, k) => {
    if (k) parent.appendChild(el('br'));
    inline(line, parent);
  });
}

// Block Markdown: fenced code (an open fence runs to the end, as while it streams), headings,
// lists, quotes, rules and paragraphs.
function markdown(text, parent) {
  const lines = text.split('\n');
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^\s*(`{3,}|~{3,})\s*([\w+-]*)/.exec(line);
    if (fence) {
      const code = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) code.push(lines[i]);
      i++;
      const pre = el('pre');
      const c = el('code', fence[2] ? `language-${fence[2]}` : null, code.join('\n'));
      pre.appendChild(c);
      parent.appendChild(pre);
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      const h = el(`h${Math.min(6, heading[1].length + 2)}`);
      inline(heading[2], h);
      parent.appendChild(h);
      i++;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      parent.appendChild(el('hr'));
      i++;
      continue;
    }
    const item = /^\s*([-*+]|\d+[.)])\s+/;
    if (item.test(line)) {
      const ordered = /\d/.test(item.exec(line)[1]);
      const list = el(ordered ? 'ol' : 'ul');
      const start = ordered ? parseInt(line.trim(), 10) : 1;
      if (ordered && start !== 1) list.start = start;
      while (i < lines.length && item.test(lines[i]) && /\d/.test(item.exec(lines[i])[1]) === ordered) {
        const li = el('li');
        const body = [lines[i].replace(item, '')];
        // continuation lines, indented, belong to the item
        for (i++; i < lines.length && /^\s{2,}\S/.test(lines[i]) && !item.test(lines[i]); i++) body.push(lines[i].trim());
        inlineLines(body, li);
        list.appendChild(li);
      }
      parent.appendChild(list);
      continue;
    }
    if (/^\s*>/.test(line)) {
      const quoted = [];
      for (; i < lines.length && /^\s*>/.test(lines[i]); i++) quoted.push(lines[i].replace(/^\s*>\s?/, ''));
      const q = el('blockquote');
      markdown(quoted.join('\n'), q);
      parent.appendChild(q);
      continue;
    }
    if (!line.trim()) {
      i++;
      continue;
    }
    const para = [];
    for (; i < lines.length && lines[i].trim() && !/^\s*(`{3,}|~{3,}|#{1,6}\s|>)/.test(lines[i]) &&
         !(para.length && item.test(lines[i])); i++) para.push(lines[i]);
    const p = el('p');
    inlineLines(para, p);
    parent.appendChild(p);
  }
}

// --- the view -----------------------------------------------------------------------------

function currentConversation() { return conversations.find((c) => c.id === currentId); }

function newConversation() {
  const conv = { id: `${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`,
    title: '', model: $('model').value, messages: [], updated: Date.now() };
  conversations.unshift(conv);
  currentId = conv.id;
  save();
  return conv;
}

function fillMessage(view, m) {
  const content = view.querySelector('.content');
  content.replaceChildren();
  if (m.role === 'user') content.textContent = m.content;
  else markdown(m.content, content);
  let details = view.querySelector('details.reasoning');
  if (m.reasoning && !details) {
    details = el('details', 'reasoning');
    details.appendChild(el('summary', null, 'Reasoning'));
    details.appendChild(el('div', 'text'));
    view.insertBefore(details, content);
  }
  if (details) details.querySelector('.text').textContent = m.reasoning;
  view.querySelector('.note').textContent = m.note || '';
  view.querySelector('.error').textContent = m.error ? `error: ${m.error}` : '';
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren();
  for (const m of currentConversation()?.messages || []) {
    const view = el('div', `msg ${m.role}`);
    view.appendChild(el('div', 'who', m.role === 'user' ? 'you' : m.model || 'assistant'));
    view.appendChild(el('div', 'content'));
    view.appendChild(el('div', 'note'));
    view.appendChild(el('div', 'error'));
    fillMessage(view, m);
    box.appendChild(view);
  }
  box.scrollTop = box.scrollHeight;
}

function renderConversations() {
  const list = $('conversations');
  list.replaceChildren();
  for (const c of [...conversations].sort((a, b) => b.updated - a.updated)) {
    const li = el('li', c.id === currentId ? 'current' : null);
    const open = el('button', 'open', c.title || 'New chat');
    open.type = 'button';
    open.title = c.title;
    open.addEventListener('click', () => {
      if (controller) return;
      currentId = c.id;
      save();
      if (models.some((m) => m.id === c.model)) $('model').value = c.model;
      showModelState();
      renderConversations();
      renderMessages();
    });
    const del = el('button', 'delete', '×');
    del.type = 'button';
    del.title = 'Delete this conversation';
    del.addEventListener('click', () => {
      if (controller && c.id === currentId) return;
      conversations = conversations.filter((x) => x.id !== c.id);
      if (currentId === c.id) currentId = null;
      save();
      renderConversations();
      renderMessages();
    });
    li.append(open, del);
    list.appendChild(li);
  }
}

function bindSettings() {
  for (const k of ['system', 'temperature', 'top_p', 'max_tokens']) {
    $(k).value = settings[k] ?? '';
    $(k).addEventListener('input', () => {
      settings[k] = $(k).value;
      localStorage.setItem(KEYS.settings, JSON.stringify(settings));
    });
  }
  $('settings-toggle').addEventListener('click', () => {
    const hidden = !$('settings').hidden;
    $('settings').hidden = hidden;
    $('settings-toggle').setAttribute('aria-expanded', String(!hidden));
  });
  $('forget-key').addEventListener('click', () => {
    sessionStorage.removeItem(KEYS.apiKey);
    loadModels();
  });
}

function bindComposer() {
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = $('input').value;
    if (!text.trim() || controller || !$('model').value) return;
    $('input').value = '';
    send(text);
  });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').addEventListener('click', () => controller?.abort());
  $('new-chat').addEventListener('click', () => {
    if (controller) return;
    currentId = null;
    save();
    renderConversations();
    renderMessages();
    $('input').focus();
  });
  $('model').addEventListener('change', () => {
    localStorage.setItem(KEYS.model, $('model').value);
    showModelState();
  });
  $('model').addEventListener('focus', loadModels);
  $('key-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const key = $('api-key').value.trim();
    if (key) sessionStorage.setItem(KEYS.apiKey, key);
    $('api-key').value = '';
    setStatus('');
    loadModels();
  });
}

bindSettings();
bindComposer();
renderConversations();
renderMessages();
loadModels();
