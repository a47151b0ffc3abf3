// Quiver's admin page: a front end to the admin API (/admin/api/mcp/) and the approvals
// (/v1/approvals). It holds no data of its own and keeps the client's token in this tab's
// sessionStorage only. It asks /v1/whoami for the token's roles and offers only what they
// allow: the registry views with `registry`, the pending calls with `approve`.
//
// Everything the API returns (ids, documents, errors, tool names and descriptions) is
// treated as hostile: it reaches the page through textContent, form values and
// attributes set with setAttribute, never parsed as HTML. The node's
// Content-Security-Policy forbids inline script on top of that.
'use strict';

(() => {
  const TOKEN_KEY = 'quiver.adminToken';
  const API = 'api/mcp/';
  // The node refuses larger bodies by default ([serve] max_request_bytes).
  const MAX_IMPORT_BYTES = 1024 * 1024;
  // Long strings from the API are cut for display; the document editor shows all.
  const MAX_SHOWN_CHARS = 2000;
  const BUDGETS = [
    'tool_timeout_ms',
    'max_concurrency',
    'max_tool_output_bytes',
    'max_tool_list_bytes',
    'connect_timeout_ms',
  ];
  const STATES = ['connected', 'degraded', 'down', 'idle'];
  const TABS = ['servers', 'profiles', 'approvals'];
  // How often the approvals view asks for the pending calls while it is shown.
  const APPROVALS_POLL_MS = 1500;
  // The node cuts longer reasons (MAX_APPROVAL_REASON_BYTES).
  const MAX_REASON_CHARS = 512;

  const $ = (id) => document.getElementById(id);

  /** A failed request: the API's error code, message and field. */
  class Failure extends Error {
    constructor(status, code, message, field) {
      super(message);
      this.status = status;
      this.code = code;
      this.field = field;
    }
  }

  /** A form value the page refuses before sending, naming the record's field. */
  const formFailure = (field, message) => new Failure(0, 'invalid_form', message, field);

  const text = (value) => {
    if (value === null || value === undefined) return '';
    const s = typeof value === 'string' ? value : String(value);
    return s.length > MAX_SHOWN_CHARS ? s.slice(0, MAX_SHOWN_CHARS) + '…' : s;
  };
  const isObject = (value) =>
    value !== null && typeof value === 'object' && !Array.isArray(value);
  const enc = encodeURIComponent;

  /** An element with text children only: strings become text nodes, never markup. */
  function el(tag, options, ...children) {
    const node = document.createElement(tag);
    const opts = options || {};
    if (opts.className) node.className = opts.className;
    if (opts.text !== undefined) node.textContent = text(opts.text);
    if (opts.type) node.type = opts.type;
    for (const [name, value] of Object.entries(opts.attrs || {})) {
      node.setAttribute(name, text(value));
    }
    for (const child of children) node.append(child);
    return node;
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  }

  async function api(method, path, body, extraHeaders) {
    const headers = Object.assign({ Authorization: 'Bearer ' + token() }, extraHeaders || {});
    const init = { method, headers, cache: 'no-store', credentials: 'omit', redirect: 'error' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      // Paths from the root (/v1/...) are the task API's; the rest the admin API's.
      response = await fetch(path.startsWith('/') ? path : API + path, init);
    } catch (e) {
      throw new Failure(0, 'network', 'cannot reach the node: ' + text(e && e.message), null);
    }
    const raw = await response.text();
    let json = null;
    try {
      json = JSON.parse(raw);
    } catch (_) {
      json = null;
    }
    if (!response.ok) {
      const err = isObject(json) && isObject(json.error) ? json.error : {};
      const failure = new Failure(
        response.status,
        text(err.code) || 'http_' + response.status,
        text(err.message) || text(raw.slice(0, 300)) || response.statusText,
        text(err.field) || null,
      );
      if (response.status === 401) signOut(failure);
      throw failure;
    }
    if (!isObject(json)) {
      throw new Failure(response.status, 'bad_answer', 'the node did not answer a JSON object', null);
    }
    return json;
  }

  // ---- messages -------------------------------------------------------------------

  function showError(failure) {
    const f = failure instanceof Failure ? failure : new Failure(0, 'error', text(failure), null);
    $('error-title').textContent = f.status ? `Error ${f.status} ${f.code}:` : `Error (${f.code}):`;
    $('error-message').textContent = text(f.message);
    $('error-field').textContent = f.field ? `(field: ${text(f.field)})` : '';
    $('error').dataset.code = text(f.code);
    $('error').hidden = false;
    $('notice').hidden = true;
  }

  function clearError() {
    $('error').hidden = true;
  }

  function notice(message) {
    $('notice').textContent = message;
    $('notice').hidden = false;
  }

  /** Runs a user action: clears the last message, shows any failure. */
  async function act(action) {
    clearError();
    $('notice').hidden = true;
    document.body.setAttribute('aria-busy', 'true');
    try {
      await action();
    } catch (e) {
      showError(e);
    } finally {
      document.body.removeAttribute('aria-busy');
    }
  }

  // ---- sign in ----------------------------------------------------------------------

  /** The roles of the signed-in token, as /v1/whoami lists them. */
  let roles = [];
  const has = (role) => roles.includes(role);

  function signOut(failure) {
    sessionStorage.removeItem(TOKEN_KEY);
    stopPolling();
    approvalRows.clear();
    $('approvals-body').replaceChildren();
    roles = [];
    for (const tab of TABS) $(`${tab}-view`).hidden = true;
    $('tabs').hidden = true;
    $('logout').hidden = true;
    $('whoami').hidden = true;
    $('login').hidden = false;
    $('token').value = '';
    if (failure) showError(failure);
  }

  /** /v1/whoami's answer for the signed-in token. */
  let me = {};

  async function signIn() {
    me = await api('GET', '/v1/whoami');
    roles = Array.isArray(me.roles) ? me.roles.filter((r) => typeof r === 'string') : [];
    $('login').hidden = true;
    $('tabs').hidden = false;
    $('logout').hidden = false;
    $('whoami').textContent = `${text(me.client || 'anonymous')}: ${roles.join(', ') || 'no roles'}`;
    $('whoami').hidden = false;
    // Registry editing is not offered to a token that cannot do it.
    $('tab-servers').hidden = !has('registry');
    $('tab-profiles').hidden = !has('registry');
    $('tab-approvals').hidden = !has('approve');
    if (has('registry')) return showTab('servers');
    if (has('approve')) return showTab('approvals');
    notice('This token holds neither the registry nor the approve role: nothing to do here.');
    return undefined;
  }

  // ---- the server list ----------------------------------------------------------------

  function formatTime(seconds) {
    if (typeof seconds !== 'number' || !Number.isFinite(seconds)) return '—';
    const date = new Date(seconds * 1000);
    return Number.isNaN(date.getTime()) ? '—' : date.toLocaleString();
  }

  async function loadServers() {
    const answer = await api('GET', 'servers');
    const servers = Array.isArray(answer.servers) ? answer.servers.filter(isObject) : [];
    $('revision').textContent = `revision ${text(answer.revision)}`;
    const rows = servers.map(serverRow);
    $('servers-body').replaceChildren(...rows);
    $('servers-empty').hidden = rows.length > 0;
  }

  /** A row's button running `action` as a user action; `name` is the row's server or profile. */
  function actionButton(label, name, className, action) {
    const attrs = { 'aria-label': `${label} ${name}` };
    const button = el('button', { type: 'button', text: label, className, attrs });
    button.addEventListener('click', () => act(action));
    return button;
  }

  function serverRow(server) {
    const id = text(server.server_id);
    const state = typeof server.state === 'string' ? server.state : null;
    const stateCell = el('td', { text: state || 'not started', className: 'state' });
    if (state && STATES.includes(state)) stateCell.classList.add('state-' + state);
    const count = typeof server.tool_count === 'number' ? server.tool_count : '—';
    return el(
      'tr',
      { attrs: { 'data-server-id': id } },
      el('td', { text: id, className: 'server-id' }),
      el('td', { text: server.transport || '—', className: 'transport' }),
      stateCell,
      el('td', { text: server.last_error || '', className: 'last-error error-text' }),
      el('td', { text: count, className: 'tool-count' }),
      el('td', { text: formatTime(server.updated_at), className: 'updated' }),
      el(
        'td',
        { className: 'actions' },
        actionButton('Edit', id, 'edit', () => editServer(id)),
        actionButton('Test', id, 'test', () => testServer(id)),
        actionButton('Tools', id, 'tools', () => showTools(id)),
        actionButton('Pin', id, 'pin', () => pinServer(id)),
        ...(typeof server.auth_ref === 'string' && has('authorize')
          ? [
              actionButton('Authorize', id, 'authorize', () => authorizeServer(id)),
              actionButton('Grant', id, 'grant', () => grantStatus(id)),
            ]
          : []),
        actionButton('Delete', id, 'delete danger', () => deleteServer(id)),
      ),
    );
  }

  // ---- user authorization ---------------------------------------------------------------

  /** The principal to authorize for: the signed-in client, or one it may act for. */
  function askPrincipal(id) {
    const given = window.prompt(`Principal to authorize ${id} for (yourself, or a user your client may act for):`, text(me.client || ''));
    return given ? given.trim() : '';
  }

  function authorizationPath(id, principal) {
    return `/v1/authorizations/${enc(id)}/${enc(principal)}`;
  }

  /**
   * Starts the flow at the node and opens the node's own page for it in a new window: that
   * page names the server and principal, and its button sends this browser on to the
   * authorization server (the flow is bound to the browser that presses it).
   */
  async function authorizeServer(id) {
    const principal = askPrincipal(id);
    if (!principal) return;
    const answer = await api('POST', authorizationPath(id, principal));
    const url = text(answer.authorization_url);
    if (!/^https?:\/\/[^/]+\/(.*\/)?oauth\/authorize\/[0-9a-f]{64}$/.test(url)) {
      throw new Failure(0, 'bad_answer', 'the node answered no authorization link of its own', null);
    }
    window.open(url, '_blank', 'noopener,noreferrer');
    showResult(`Authorize ${id} for ${principal}`, `the node's authorization page opened in a new window: continue there only if you are ${principal}, log in, then check Grant`, 'pending');
  }

  /** Shows whether the principal holds a grant for the server: scopes and expiry, never a token. */
  async function grantStatus(id) {
    const principal = askPrincipal(id);
    if (!principal) return;
    const answer = await api('GET', authorizationPath(id, principal));
    if (answer.authorized === true) {
      const scopes = Array.isArray(answer.scopes) ? answer.scopes.map(text).join(' ') : '';
      const refresh = answer.refreshable === true ? ', refreshable' : '';
      showResult(`Grant of ${id} for ${principal}`, `authorized; scopes: ${scopes || '—'}; expires ${formatTime(answer.expires_at)}${refresh}`, 'ok');
    } else {
      const pending = answer.pending === true ? ' (an authorization is waiting for the browser)' : '';
      showResult(`Grant of ${id} for ${principal}`, `not authorized${pending}`, 'failed');
    }
  }

  function showResult(title, summary, outcome) {
    $('result-title').textContent = title;
    const line = $('result-summary');
    line.textContent = summary;
    line.className = outcome || '';
    $('tools').hidden = true;
    $('tools-body').replaceChildren();
    $('result').hidden = false;
  }

  async function testServer(id) {
    showResult(`Testing ${id}…`, 'connecting…', 'pending');
    const answer = await api('POST', `servers/${enc(id)}/test`);
    const tools = Array.isArray(answer.tools) ? answer.tools.map(text) : [];
    const elapsed = typeof answer.elapsed_ms === 'number' ? `${answer.elapsed_ms} ms` : '?';
    if (answer.ok === true) {
      const count = typeof answer.tool_count === 'number' ? answer.tool_count : tools.length;
      const listed = tools.length ? ': ' + tools.join(', ') : '';
      showResult(`Test of ${id}`, `ok: ${count} tools in ${elapsed}${listed}`, 'ok');
    } else {
      showResult(`Test of ${id}`, `failed after ${elapsed}: ${text(answer.error)}`, 'failed');
    }
  }

  /**
   * Pins the definitions the server lists now for every allowed tool: what the operator
   * reviewed (Tools) is what tasks get; a later change is refused until pinned again.
   */
  async function pinServer(id) {
    if (!window.confirm(`Pin the tool definitions ${id} lists now? Tasks are then refused any tool whose definition changes. Review them first (Tools).`)) return;
    showResult(`Pinning ${id}…`, 'listing…', 'pending');
    const answer = await api('POST', `servers/${enc(id)}/pin`, {});
    const pinned = isObject(answer.pins) ? Object.keys(answer.pins).length : 0;
    const changes = Array.isArray(answer.changes) ? answer.changes.filter(isObject) : [];
    const changed = changes
      .map((c) => `${text(c.tool)} ${c.old ? text(c.old).slice(0, 19) + '…' : '(new)'} → ${text(c.new).slice(0, 19)}…`)
      .join(', ');
    showResult(`Pins of ${id}`, `${pinned} tools pinned; ${changed ? 'changed: ' + changed : 'nothing changed'}`, 'ok');
    await loadServers();
  }

  async function showTools(id) {
    showResult(`Tools of ${id}`, 'listing…', 'pending');
    const answer = await api('GET', `servers/${enc(id)}/tools`);
    const tools = Array.isArray(answer.tools) ? answer.tools.filter(isObject) : [];
    const rows = tools.map((tool) =>
      el(
        'tr',
        {},
        el('td', { text: tool.model_name, className: 'model-name' }),
        el('td', { text: tool.name, className: 'tool-name' }),
        el('td', { text: tool.description, className: 'description' }),
      ),
    );
    const summary = `${rows.length} tools after the record's allowed_tools, as a model sees them`;
    showResult(`Tools of ${id}`, summary, 'ok');
    $('tools-body').replaceChildren(...rows);
    $('tools').hidden = false;
  }

  async function deleteServer(id) {
    if (!window.confirm(`Delete the MCP server "${id}"? Tasks stop seeing it at once.`)) return;
    await api('DELETE', `servers/${enc(id)}`);
    closeEditor();
    $('result').hidden = true;
    notice(`Deleted ${id}.`);
    await loadServers();
  }

  // ---- import -------------------------------------------------------------------------

  let pendingImport = null;

  async function previewImport(file) {
    if (file.size > MAX_IMPORT_BYTES) {
      throw formFailure('file', `the file has ${file.size} bytes; the node takes at most ${MAX_IMPORT_BYTES}`);
    }
    const format = /\.json$/i.test(file.name) ? 'json' : 'toml';
    const record = { format, body: await file.text() };
    const answer = await api('POST', 'servers/import?dry_run=true', record);
    pendingImport = record;
    const changes = Array.isArray(answer.changes) ? answer.changes.filter(isObject) : [];
    $('import-name').textContent = `${file.name} (${format})`;
    $('import-changes').replaceChildren(
      ...changes.map((c) =>
        el('li', {
          text: `${text(c.change)} ${text(c.kind)} ${text(c.name)}`,
          attrs: { 'data-change': c.change, 'data-name': c.name },
        }),
      ),
    );
    if (!changes.length) $('import-changes').append(el('li', { text: 'nothing to change' }));
    $('import').hidden = false;
  }

  async function applyImport() {
    if (!pendingImport) return;
    const answer = await api('POST', 'servers/import', pendingImport);
    pendingImport = null;
    $('import').hidden = true;
    const changes = Array.isArray(answer.changes) ? answer.changes.filter(isObject) : [];
    const written = changes.filter((c) => c.change !== 'unchanged').length;
    notice(`Imported: ${written} written, ${changes.length - written} unchanged.`);
    await loadServers();
  }

  // ---- create and edit ----------------------------------------------------------------

  // The record being edited ({id, format, revision, fields, body}), or null for a new one.
  let editing = null;
  // Each form control's value as fillForm left it (read back, as the browser keeps it): a
  // control still holding it is written back as the record had it, not re-parsed.
  let filled = {};

  function openEditor(record) {
    editing = record;
    $('result').hidden = true;
    $('editor-title').textContent = record ? `Edit ${record.id}` : 'Add an MCP server';
    $('f-server_id').readOnly = Boolean(record);
    $('f-format').disabled = Boolean(record);
    $('editor').hidden = false;
    if (record && (!isObject(record.fields) || hasInexactNumber(record.fields))) {
      // The document does not parse, or holds an integer JavaScript cannot keep exactly:
      // only the raw editor can mend it, or save it without changing it.
      if (isObject(record.fields)) {
        notice(`${record.id} holds a number larger than this form can keep exactly: edit it as a document.`);
      }
      showRaw(record.body, record.format);
      return;
    }
    fillForm(record ? record.fields : {}, record ? record.format : 'toml');
    $('raw-form').hidden = true;
    $('server-form').hidden = false;
    $('f-server_id').focus();
  }

  function closeEditor() {
    editing = null;
    $('editor').hidden = true;
  }

  // Form values are whole (not cut for display): saving them writes them back.
  const asLine = (value) => {
    if (value === null || value === undefined) return '';
    return isObject(value) || Array.isArray(value) ? JSON.stringify(value) : String(value);
  };
  const asLines = (value) => (Array.isArray(value) ? value.map(asLine).join('\n') : asLine(value));
  const asPairs = (value, sep) =>
    isObject(value) ? Object.entries(value).map(([k, v]) => `${k}${sep}${asLine(v)}`).join('\n') : '';

  /** Whether `v` holds an integer beyond 2^53, which JSON.parse has already rounded. */
  function hasInexactNumber(v) {
    if (typeof v === 'number') return Number.isInteger(v) && !Number.isSafeInteger(v);
    if (Array.isArray(v)) return v.some(hasInexactNumber);
    return isObject(v) && Object.values(v).some(hasInexactNumber);
  }

  // What a form line gives back exactly: lines() and pairs() trim and split on line breaks.
  const exactLine = (s) => typeof s === 'string' && s === s.trim() && !/[\r\n]/.test(s);
  const absent = (v) => v === undefined || v === null;
  // Per kind of control, whether it can show a record's value so that saving keeps it.
  const SHOWS_EXACTLY = {
    line: (v) => absent(v) || exactLine(v),
    lines: (v) => absent(v) || (Array.isArray(v) && v.every((x) => exactLine(x) && x !== '')),
    number: (v) => absent(v) || (Number.isSafeInteger(v) && v >= 0),
    env: (v) => absent(v) || pairsExact(v, '='),
    headers: (v) => absent(v) || pairsExact(v, ':'),
  };
  function pairsExact(v, sep) {
    if (!isObject(v)) return false;
    return Object.entries(v).every(
      ([k, x]) => k !== '' && exactLine(k) && !k.includes(sep) && exactLine(x),
    );
  }

  /**
   * Makes control `name` read-only with a note when it cannot show `v` (field `field`)
   * exactly, so a save keeps the record's value instead of a trimmed or split one.
   */
  function lockIfInexact(name, field, kind, v) {
    if (SHOWS_EXACTLY[kind](v)) return;
    const control = $('f-' + name);
    control.readOnly = true;
    control.classList.add('locked');
    const noteId = `f-${name}-locked`;
    control.setAttribute('aria-describedby', noteId);
    const why =
      `${field} holds a value this form cannot show exactly (an empty value, a line break, ` +
      `leading or trailing spaces, or not text), so saving keeps it as it is. ` +
      `Edit this record as a document to change ${field}.`;
    control.after(el('p', { className: 'locked-note', text: why, attrs: { id: noteId } }));
  }

  function fillForm(fields, format) {
    for (const note of document.querySelectorAll('#server-form .locked-note')) note.remove();
    for (const control of document.querySelectorAll('#server-form .locked')) {
      control.readOnly = false;
      control.classList.remove('locked');
      control.removeAttribute('aria-describedby');
    }
    const stdio = isObject(fields.stdio) ? fields.stdio : {};
    const http = isObject(fields.http) ? fields.http : {};
    const budgets = isObject(fields.budgets) ? fields.budgets : {};
    const set = (name, value) => {
      $('f-' + name).value = value;
    };
    set('server_id', asLine(fields.server_id));
    set('display_name', asLine(fields.display_name));
    set('transport', ['stdio', 'streamable_http', 'http_sse_legacy'].includes(fields.transport) ? fields.transport : 'stdio');
    set('format', format === 'json' ? 'json' : 'toml');
    set('command', asLine(stdio.command));
    set('args', asLines(stdio.args));
    set('env', asPairs(stdio.env, '='));
    set('cwd', asLine(stdio.cwd));
    set('url', asLine(http.url));
    set('headers', asPairs(http.headers, ': '));
    set('auth_ref', asLine(http.auth_ref));
    for (const name of ['allowed_tools', 'tags', 'approval_tools']) set(name, asLines(fields[name]));
    set('approval_policy', ['never', 'always', 'policy'].includes(fields.approval_policy) ? fields.approval_policy : 'never');
    set('approval_timeout_ms', asLine(fields.approval_timeout_ms));
    for (const name of BUDGETS) set(name, asLine(budgets[name]));
    if (editing) {
      const lock = lockIfInexact;
      lock('display_name', 'display_name', 'line', fields.display_name);
      lock('command', 'stdio.command', 'line', stdio.command);
      lock('args', 'stdio.args', 'lines', stdio.args);
      lock('env', 'stdio.env', 'env', stdio.env);
      lock('cwd', 'stdio.cwd', 'line', stdio.cwd);
      lock('url', 'http.url', 'line', http.url);
      lock('headers', 'http.headers', 'headers', http.headers);
      lock('auth_ref', 'http.auth_ref', 'line', http.auth_ref);
      for (const name of ['allowed_tools', 'tags', 'approval_tools']) lock(name, name, 'lines', fields[name]);
      lock('approval_timeout_ms', 'approval_timeout_ms', 'number', fields.approval_timeout_ms);
      for (const name of BUDGETS) lock(name, 'budgets.' + name, 'number', budgets[name]);
    }
    filled = {};
    for (const control of document.querySelectorAll('#server-form [id^="f-"]')) {
      filled[control.id] = control.value;
    }
    showTransport();
  }

  function showTransport() {
    const stdio = $('f-transport').value === 'stdio';
    $('stdio-fields').hidden = !stdio;
    $('http-fields').hidden = stdio;
  }

  const value = (name) => $('f-' + name).value.trim();
  const lines = (name) =>
    $('f-' + name)
      .value.split('\n')
      .map((l) => l.trim())
      .filter((l) => l.length > 0);

  /** `NAME<sep>value` lines as an object. */
  function pairs(name, sep, field) {
    const out = {};
    for (const line of lines(name)) {
      const at = line.indexOf(sep);
      if (at <= 0) throw formFailure(field, `"${line}" is not NAME${sep.trim()}value`);
      out[line.slice(0, at).trim()] = line.slice(at + sep.length).trim();
    }
    return out;
  }

  function number(name, field) {
    const raw = value(name);
    if (raw === '') return undefined;
    if (!/^[0-9]+$/.test(raw) || !Number.isSafeInteger(Number(raw))) {
      throw formFailure(field, `"${raw}" is not a whole number; leave it empty for the default`);
    }
    return Number(raw);
  }

  /** Sets `key`, or removes it when empty, so the record keeps the default. */
  function put(target, key, v) {
    const empty = v === undefined || v === '' || (Array.isArray(v) && !v.length) || (isObject(v) && !Object.keys(v).length);
    if (empty) delete target[key];
    else target[key] = v;
  }

  /** Whether the person changed control `name` (every control of a new record counts). */
  const changed = (name) => !editing || $('f-' + name).value !== filled['f-' + name];

  /**
   * The record the form describes, over the fields it does not show. A field whose control
   * the person did not change keeps the record's value exactly; only changed ones are read.
   */
  function formDocument() {
    const doc = editing && isObject(editing.fields) ? structuredClone(editing.fields) : {};
    /** Sets what `read` gives into `target` for each changed control; true if any was. */
    const update = (target, names, read) => {
      const touched = names.filter(changed);
      for (const name of touched) put(target, name, read(name));
      return touched.length > 0;
    };
    update(doc, ['server_id', 'display_name'], value);
    const transport = $('f-transport').value;
    if (changed('transport')) {
      doc.transport = transport;
      delete doc[transport === 'stdio' ? 'http' : 'stdio'];
    }
    const block = transport === 'stdio' ? 'stdio' : 'http';
    const own = isObject(doc[block]) ? doc[block] : {};
    const read = (name) => {
      if (name === 'env') return pairs('env', '=', 'stdio.env');
      if (name === 'headers') return pairs('headers', ':', 'http.headers');
      return name === 'args' ? lines(name) : value(name);
    };
    const names = block === 'stdio' ? ['command', 'args', 'env', 'cwd'] : ['url', 'headers', 'auth_ref'];
    if (update(own, names, read) || changed('transport')) doc[block] = own;
    update(doc, ['allowed_tools', 'tags', 'approval_tools'], lines);
    if (changed('approval_policy')) doc.approval_policy = $('f-approval_policy').value;
    update(doc, ['approval_timeout_ms'], (name) => number(name, name));
    const budgets = isObject(doc.budgets) ? doc.budgets : {};
    if (update(budgets, BUDGETS, (name) => number(name, 'budgets.' + name))) put(doc, 'budgets', budgets);
    return doc;
  }

  /** The form's record; an unchanged one keeps its text as written (comments included). */
  function formBody(format) {
    const doc = formDocument();
    const same = editing && JSON.stringify(doc) === JSON.stringify(editing.fields);
    return same ? editing.body : render(doc, format);
  }

  function render(doc, format) {
    return format === 'json' ? JSON.stringify(doc, null, 2) + '\n' : toToml(doc);
  }

  /** A 412 on a save: the record moved on since it was read; say what to do. */
  function explainConflict(e) {
    if (e instanceof Failure && e.status === 412) {
      e.message = `${e.message.replace(/\.$/, '')}. The registry changed since this editor was opened; ` +
        'your edits are still here: copy what you need, Cancel, open it again and save.';
    }
    return e;
  }

  async function saveRecord(format, body) {
    const record = { format, body };
    if (editing) {
      const ifMatch = editing.revision !== undefined ? { 'If-Match': text(editing.revision) } : {};
      await api('PUT', `servers/${enc(editing.id)}`, record, ifMatch).catch((e) => {
        throw explainConflict(e);
      });
      notice(`Saved ${editing.id}.`);
    } else {
      const answer = await api('POST', 'servers', record);
      notice(`Added ${text(answer.server_id)}.`);
    }
    closeEditor();
    await loadServers();
  }

  async function saveForm() {
    const format = editing ? editing.format : $('f-format').value;
    await saveRecord(format, formBody(format));
  }

  async function editServer(id) {
    const answer = await api('GET', `servers/${enc(id)}`);
    openEditor({
      id,
      format: answer.format === 'json' ? 'json' : 'toml',
      revision: answer.revision,
      fields: answer.fields,
      body: typeof answer.body === 'string' ? answer.body : '',
    });
  }

  function showRaw(body, format) {
    $('raw-format').textContent = format === 'json' ? 'JSON' : 'TOML';
    $('raw-form').dataset.format = format;
    $('raw-body').value = body;
    $('server-form').hidden = true;
    $('raw-form').hidden = false;
    $('raw-body').focus();
  }

  function rawFromForm() {
    const format = editing ? editing.format : $('f-format').value;
    const parsed = !editing || (isObject(editing.fields) && !hasInexactNumber(editing.fields));
    showRaw(parsed ? formBody(format) : editing.body, format);
  }

  // ---- TOML out (the form keeps a TOML record TOML) -------------------------------------

  const tomlKey = (key) => (/^[A-Za-z0-9_-]+$/.test(key) ? key : tomlString(key));
  // A JSON string is a TOML basic string, once DEL (raw in JSON, not in TOML) is escaped.
  const tomlString = (s) => JSON.stringify(s).replace(/\u007f/g, '\\u007f');

  function tomlValue(v, field) {
    if (typeof v === 'string') return tomlString(v);
    if (typeof v === 'boolean') return String(v);
    if (typeof v === 'number' && Number.isFinite(v)) return String(v);
    if (Array.isArray(v)) {
      return '[' + v.filter((x) => x !== null).map((x) => tomlValue(x, field)).join(', ') + ']';
    }
    if (isObject(v)) {
      const inner = Object.entries(v)
        .filter(([, x]) => x !== null)
        .map(([k, x]) => `${tomlKey(k)} = ${tomlValue(x, field)}`);
      return '{ ' + inner.join(', ') + ' }';
    }
    throw formFailure(field, 'this value cannot be written as TOML');
  }

  function toToml(doc) {
    const out = [];
    const table = (obj, prefix) => {
      const own = [];
      const subs = [];
      for (const [key, v] of Object.entries(obj)) {
        if (v === null || v === undefined) continue;
        if (isObject(v)) subs.push([key, v]);
        else own.push(`${tomlKey(key)} = ${tomlValue(v, prefix ? prefix + '.' + key : key)}`);
      }
      if (prefix && (own.length || !subs.length)) out.push('', `[${prefix}]`);
      out.push(...own);
      for (const [key, v] of subs) table(v, prefix ? `${prefix}.${tomlKey(key)}` : tomlKey(key));
    };
    table(doc, '');
    return out.join('\n').replace(/^\n+/, '') + '\n';
  }

  // ---- profiles (edited as documents) -------------------------------------------------

  // The profile being edited ({name, format, revision}), or null for a new one.
  let profileEditing = null;

  const PROFILE_TEMPLATES = {
    toml: 'name = "my-profile"\ndescription = ""\nserver_ids = []\ntags = []\n',
    json: '{\n  "name": "my-profile",\n  "description": "",\n  "server_ids": [],\n  "tags": []\n}\n',
  };

  function showTab(name) {
    for (const tab of TABS) {
      $(`${tab}-view`).hidden = tab !== name;
      $(`tab-${tab}`).setAttribute('aria-pressed', String(tab === name));
    }
    stopPolling();
    if (name === 'approvals') {
      startPolling();
      return loadApprovals();
    }
    return name === 'servers' ? loadServers() : loadProfiles();
  }

  // ---- approvals ----------------------------------------------------------------------

  /** Rows by approval id, kept across refreshes so a reason being typed survives. */
  const approvalRows = new Map();
  let pollTimer = null;

  function startPolling() {
    stopPolling();
    pollTimer = setInterval(() => {
      loadApprovals().catch(showError);
    }, APPROVALS_POLL_MS);
  }

  function stopPolling() {
    if (pollTimer !== null) clearInterval(pollTimer);
    pollTimer = null;
  }

  function timeLeft(expiresAt) {
    if (typeof expiresAt !== 'number' || !Number.isFinite(expiresAt)) return '—';
    const seconds = Math.max(0, Math.round(expiresAt - Date.now() / 1000));
    return seconds >= 60 ? `${Math.floor(seconds / 60)} min ${seconds % 60} s` : `${seconds} s`;
  }

  function argumentShape(args) {
    if (!isObject(args)) return '—';
    const keys = Array.isArray(args.keys) ? args.keys.map(text) : [];
    const more = typeof args.keys_omitted === 'number' && args.keys_omitted > 0 ? ` +${args.keys_omitted}` : '';
    const bytes = typeof args.bytes === 'number' ? `${args.bytes} bytes` : '';
    return `${keys.join(', ') || '(no keys)'}${more}; ${bytes}`;
  }

  // Who a waiting call acts for, and the client that submitted it when that is someone else.
  function whoFor(request) {
    const principal = request.principal || '—';
    if (request.client && request.client !== request.principal) {
      return `${principal} (via ${request.client})`;
    }
    return principal;
  }

  function approvalRow(request) {
    const id = text(request.id);
    const what = `${text(request.tool)} of task ${text(request.task_id)}`;
    const reason = el('input', {
      className: 'reason',
      attrs: { 'aria-label': `Reason for ${what}`, maxlength: String(MAX_REASON_CHARS), placeholder: 'optional' },
    });
    const decideWith = (approve) => () => decide(id, approve, reason.value.trim());
    return el(
      'tr',
      { attrs: { 'data-approval-id': id } },
      el('td', { text: request.task_id, className: 'task' }),
      el('td', { text: whoFor(request), className: 'principal' }),
      el('td', { text: request.server_id, className: 'server' }),
      el('td', { text: request.tool, className: 'tool' }),
      el('td', { text: argumentShape(request.arguments), className: 'arguments' }),
      el('td', { text: timeLeft(request.expires_at), className: 'time-left' }),
      el('td', {}, reason),
      el(
        'td',
        { className: 'actions' },
        actionButton('Approve', what, 'approve', decideWith(true)),
        actionButton('Deny', what, 'deny danger', decideWith(false)),
      ),
    );
  }

  async function loadApprovals() {
    const answer = await api('GET', '/v1/approvals');
    const pending = Array.isArray(answer.approvals) ? answer.approvals.filter(isObject) : [];
    const seen = new Set();
    for (const request of pending) {
      const id = text(request.id);
      seen.add(id);
      let row = approvalRows.get(id);
      if (!row) {
        row = approvalRow(request);
        approvalRows.set(id, row);
        $('approvals-body').append(row);
      }
      row.querySelector('.time-left').textContent = timeLeft(request.expires_at);
    }
    for (const [id, row] of approvalRows) {
      if (!seen.has(id)) {
        row.remove();
        approvalRows.delete(id);
      }
    }
    $('approvals-empty').hidden = approvalRows.size > 0;
  }

  async function decide(id, approve, reason) {
    const body = reason ? { approve, reason } : { approve };
    try {
      await api('POST', `/v1/approvals/${enc(id)}`, body);
      notice(`${approve ? 'Approved' : 'Denied'} call ${id}.`);
    } finally {
      // Decided or not (it may have timed out meanwhile), the list says what still waits.
      await loadApprovals();
    }
  }

  async function loadProfiles() {
    const answer = await api('GET', 'profiles');
    const profiles = Array.isArray(answer.profiles) ? answer.profiles.filter(isObject) : [];
    $('profiles-revision').textContent = `revision ${text(answer.revision)}`;
    const rows = profiles.map((profile) => {
      const name = text(profile.name);
      return el(
        'tr',
        { attrs: { 'data-profile-name': name } },
        el('td', { text: name, className: 'profile-name' }),
        el('td', { text: profile.format, className: 'format' }),
        el('td', { text: formatTime(profile.updated_at), className: 'updated' }),
        el(
          'td',
          { className: 'actions' },
          actionButton('Edit', name, 'edit', () => editProfile(name)),
          actionButton('Delete', name, 'delete danger', () => deleteProfile(name)),
        ),
      );
    });
    $('profiles-body').replaceChildren(...rows);
    $('profiles-empty').hidden = rows.length > 0;
  }

  function openProfileEditor(record, body) {
    profileEditing = record;
    $('profile-editor-title').textContent = record ? `Edit profile ${record.name}` : 'Add a profile';
    $('profile-format').value = record ? record.format : 'toml';
    $('profile-format').disabled = Boolean(record);
    $('profile-body').value = body;
    $('profile-editor').hidden = false;
    $('profile-body').focus();
  }

  async function editProfile(name) {
    const answer = await api('GET', `profiles/${enc(name)}`);
    const format = answer.format === 'json' ? 'json' : 'toml';
    openProfileEditor({ name, format, revision: answer.revision }, typeof answer.body === 'string' ? answer.body : '');
  }

  async function saveProfile() {
    const record = { format: $('profile-format').value, body: $('profile-body').value };
    if (profileEditing) {
      const ifMatch = profileEditing.revision !== undefined ? { 'If-Match': text(profileEditing.revision) } : {};
      await api('PUT', `profiles/${enc(profileEditing.name)}`, record, ifMatch).catch((e) => {
        throw explainConflict(e);
      });
      notice(`Saved profile ${profileEditing.name}.`);
    } else {
      const answer = await api('POST', 'profiles', record);
      notice(`Added profile ${text(answer.name)}.`);
    }
    profileEditing = null;
    $('profile-editor').hidden = true;
    await loadProfiles();
  }

  async function deleteProfile(name) {
    if (!window.confirm(`Delete the profile "${name}"? Tasks naming it fail from now on.`)) return;
    await api('DELETE', `profiles/${enc(name)}`);
    $('profile-editor').hidden = true;
    notice(`Deleted profile ${name}.`);
    await loadProfiles();
  }

  // ---- wiring -------------------------------------------------------------------------

  function wire() {
    $('login-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const given = $('token').value.trim();
      if (!given) return;
      sessionStorage.setItem(TOKEN_KEY, given);
      $('token').value = '';
      act(signIn);
    });
    $('logout').addEventListener('click', () => {
      clearError();
      signOut(null);
    });
    $('error-close').addEventListener('click', clearError);
    $('refresh').addEventListener('click', () => act(loadServers));
    $('tab-servers').addEventListener('click', () => act(() => showTab('servers')));
    $('tab-profiles').addEventListener('click', () => act(() => showTab('profiles')));
    $('tab-approvals').addEventListener('click', () => act(() => showTab('approvals')));
    $('profiles-refresh').addEventListener('click', () => act(loadProfiles));
    $('new-profile').addEventListener('click', () => openProfileEditor(null, PROFILE_TEMPLATES.toml));
    $('profile-format').addEventListener('change', () => {
      // Swap the template for the other format's while it is untouched.
      const body = $('profile-body').value;
      if (!profileEditing && Object.values(PROFILE_TEMPLATES).includes(body)) {
        $('profile-body').value = PROFILE_TEMPLATES[$('profile-format').value];
      }
    });
    $('profile-form').addEventListener('submit', (event) => {
      event.preventDefault();
      act(saveProfile);
    });
    $('profile-cancel').addEventListener('click', () => {
      profileEditing = null;
      $('profile-editor').hidden = true;
    });
    $('new-server').addEventListener('click', () => openEditor(null));
    $('f-transport').addEventListener('change', showTransport);
    $('server-form').addEventListener('submit', (event) => {
      event.preventDefault();
      act(saveForm);
    });
    $('form-cancel').addEventListener('click', closeEditor);
    $('show-raw').addEventListener('click', () => act(async () => rawFromForm()));
    $('raw-form').addEventListener('submit', (event) => {
      event.preventDefault();
      act(() => saveRecord($('raw-form').dataset.format || 'toml', $('raw-body').value));
    });
    $('raw-cancel').addEventListener('click', closeEditor);
    $('show-form').addEventListener('click', () => {
      if (editing && (!isObject(editing.fields) || hasInexactNumber(editing.fields))) return;
      $('raw-form').hidden = true;
      $('server-form').hidden = false;
    });
    $('result-close').addEventListener('click', () => {
      $('result').hidden = true;
    });
    $('import-file').addEventListener('change', () => {
      const input = $('import-file');
      const file = input.files && input.files[0];
      if (!file) return;
      act(() => previewImport(file)).finally(() => {
        // Choosing the same file again is a new import.
        input.value = '';
      });
    });
    $('import-apply').addEventListener('click', () => act(applyImport));
    $('import-cancel').addEventListener('click', () => {
      pendingImport = null;
      $('import').hidden = true;
    });
    if (token()) act(signIn);
  }

  wire();
})();
