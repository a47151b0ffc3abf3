// Drives quiver's web admin page in a real headless Chromium as a person would, for
// tests/admin_web.rs (which starts the node and checks the API at each checkpoint).
//
// Input (environment): QUIVER_URL (the node, http://127.0.0.1:PORT), QUIVER_ADMIN_TOKEN,
// FIXTURE_SERVER (the fixture-mcp-server binary), CHROMIUM (the browser), NPM_DIR
// (fixtures/npm, where puppeteer-core is installed), SCREENSHOT (where a failure's
// screenshot goes), HOSTILE_ID and HOSTILE_MARKUP (a record the test made whose fields
// and tool descriptions hold markup), IMPORT_FILE (a TOML bundle adding server
// `imported`).
//
// Protocol: progress lines go to stderr. At a checkpoint the driver prints
// `checkpoint NAME JSON` on stdout and waits for `continue` (or `fail MESSAGE`) on stdin.
// It ends with `done` on stdout and exit 0, or `FAIL step: message` on stderr and exit 1.
// Every wait is bounded, and so is the whole run.
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import path from 'node:path';

const env = (name) => {
  const value = process.env[name];
  if (!value) {
    console.error(`FAIL setup: ${name} is not set`);
    process.exit(1);
  }
  return value;
};
const BASE = env('QUIVER_URL');
const TOKEN = env('QUIVER_ADMIN_TOKEN');
const FIXTURE = env('FIXTURE_SERVER');
const CHROMIUM = env('CHROMIUM');
const SCREENSHOT = env('SCREENSHOT');
const HOSTILE_ID = env('HOSTILE_ID');
const HOSTILE_MARKUP = env('HOSTILE_MARKUP');
const IMPORT_FILE = env('IMPORT_FILE');
const require = createRequire(path.join(env('NPM_DIR'), 'package.json'));
const puppeteer = require('puppeteer-core');

// A loaded 2-core machine with several builds running: generous, but bounded.
const STEP_MS = 30_000;
const RUN_MS = 240_000;

let step = 'start';
let browser = null;
let page = null;
const pageErrors = [];

function log(message) {
  console.error(`[admin_page] ${message}`);
}

async function fail(message) {
  let shot = '(no screenshot)';
  try {
    if (page) {
      await page.screenshot({ path: SCREENSHOT, fullPage: true });
      shot = SCREENSHOT;
    }
  } catch (e) {
    shot = `(screenshot failed: ${e.message})`;
  }
  console.error(`FAIL ${step}: ${message}; screenshot: ${shot}`);
  const child = browser && browser.process();
  if (child) child.kill('SIGKILL');
  process.exit(1);
}

setTimeout(() => fail(`the whole run took longer than ${RUN_MS} ms`), RUN_MS).unref();

const stdin = createInterface({ input: process.stdin });
const answers = stdin[Symbol.asyncIterator]();

/** Hands `name` and `data` to the Rust test, which checks the API and says go on. */
async function checkpoint(name, data) {
  process.stdout.write(`checkpoint ${name} ${JSON.stringify(data ?? null)}\n`);
  const timer = new Promise((resolve) => setTimeout(() => resolve({ timeout: true }), STEP_MS));
  const next = await Promise.race([answers.next(), timer]);
  if (next.timeout) await fail(`no answer from the test at checkpoint ${name}`);
  if (next.done) await fail(`the test closed stdin at checkpoint ${name}`);
  if (next.value !== 'continue') await fail(`the test refused checkpoint ${name}: ${next.value}`);
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

const visible = (selector) => page.waitForSelector(selector, { visible: true, timeout: STEP_MS });
const gone = (selector) => page.waitForSelector(selector, { hidden: true, timeout: STEP_MS });
const textOf = (selector) => page.$eval(selector, (e) => e.textContent);
const row = (id) => `#servers-body tr[data-server-id="${id}"]`;

/**
 * Clicks button `name` of server `id`'s row. The list is drawn again when the registry
 * reloads (after a save, for one), which can detach the row between finding the button and
 * clicking it; puppeteer then throws before any click, and the new row's button is tried.
 */
async function clickRow(id, name) {
  const selector = `${row(id)} button.${name}`;
  const until = Date.now() + STEP_MS;
  for (;;) {
    try {
      return await page.click(selector);
    } catch (e) {
      if (!/detached/i.test(String(e)) || Date.now() > until) throw e;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}

/** Control `name` is read-only and its note says how to change `field`. */
async function expectLocked(name, field) {
  const readOnly = await page.$eval(`#f-${name}`, (e) => e.readOnly);
  expect(readOnly, `#f-${name} is not read-only`);
  const note = await textOf(`#f-${name}-locked`);
  const says = `Edit this record as a document to change ${field}.`;
  expect(note.includes(says), `the note by #f-${name} says: ${note}`);
}

async function type(selector, value) {
  await page.$eval(selector, (e) => {
    e.value = '';
  });
  await page.type(selector, value);
}

/** Waits for the result panel to leave its pending state; its class and text. */
async function result() {
  await page.waitForFunction(
    () => {
      const line = document.getElementById('result-summary');
      return !document.getElementById('result').hidden && line.className !== 'pending';
    },
    { timeout: STEP_MS },
  );
  return page.$eval('#result-summary', (e) => ({ outcome: e.className, text: e.textContent }));
}

async function noErrorShown() {
  const shown = await page.$eval('#error', (e) => (e.hidden ? null : e.textContent));
  expect(shown === null, `the page shows an error: ${shown}`);
}

/** Markup from the API must stay text: no element made from it, no script run. */
async function nothingInjected() {
  const state = await page.evaluate(() => ({
    images: document.querySelectorAll('img').length,
    pwned: window.__quiverPwned ?? null,
  }));
  expect(state.images === 0, `${state.images} <img> elements were created from API data`);
  expect(state.pwned === null, `a script from API data ran (window.__quiverPwned=${state.pwned})`);
}

async function main() {
  step = 'launch chromium';
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu', '--no-first-run'],
    // Over a pipe, Chromium exits with this process, even one killed by the test.
    pipe: true,
    timeout: STEP_MS,
    protocolTimeout: STEP_MS,
  });
  page = await browser.newPage();
  page.setDefaultTimeout(STEP_MS);
  page.on('pageerror', (e) => pageErrors.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of (4|5)\d\d/.test(m.text())) {
      pageErrors.push(`console error: ${m.text()}`);
    }
  });
  let dialogs = [];
  page.on('dialog', async (dialog) => {
    dialogs.push(dialog.message());
    await dialog.accept();
  });

  step = 'open /admin';
  const response = await page.goto(`${BASE}/admin`, { waitUntil: 'load', timeout: STEP_MS });
  expect(page.url() === `${BASE}/admin/`, `/admin did not lead to /admin/ but ${page.url()}`);
  expect(response.status() === 200, `GET /admin/ is ${response.status()}`);
  const csp = response.headers()['content-security-policy'] || '';
  expect(csp.includes("default-src 'self'"), `the page's CSP is "${csp}"`);
  await visible('#login');
  log('the page asks for the token');

  step = 'enter a wrong token';
  await type('#token', 'not-the-token');
  await page.click('#login-submit');
  await visible('#error');
  expect((await textOf('#error')).includes('401'), `a wrong token shows: ${await textOf('#error')}`);
  await visible('#login');

  step = 'enter the token';
  await type('#token', TOKEN);
  await page.click('#login-submit');
  await visible('#servers-view');
  await visible(row(HOSTILE_ID));
  const stored = await page.evaluate(() => sessionStorage.getItem('quiver.adminToken'));
  expect(stored === TOKEN, 'the token is not in sessionStorage');
  const kept = await page.evaluate(() => localStorage.length);
  expect(kept === 0, 'something was written to localStorage');
  log('signed in; the list shows the hostile record');

  step = 'add a stdio server with the form';
  await page.click('#new-server');
  await visible('#server-form');
  await type('#f-server_id', 'fx');
  await type('#f-display_name', 'Fixture server');
  await type('#f-command', FIXTURE);
  await type('#f-args', '--name\nfx');
  // Quotes, a backslash and a reference must survive the page's TOML writer as written.
  await type('#f-env', 'QV_NOTE=say "hi" \\ ${ENV:HOME}');
  await type('#f-allowed_tools', 'echo\nadd');
  await type('#f-tool_timeout_ms', '30000');
  await type('#f-max_concurrency', '2');
  await page.select('#f-approval_policy', 'never');
  await page.click('#form-save');
  await visible(row('fx'));
  await noErrorShown();
  expect((await textOf(`${row('fx')} .transport`)) === 'stdio', 'fx is not listed as stdio');
  log('fx is listed');
  await checkpoint('created');

  step = 'test fx';
  await clickRow('fx', 'test');
  const tested = await result();
  expect(tested.outcome === 'ok', `the test of fx says: ${tested.text}`);
  const count = /ok: (\d+) tools/.exec(tested.text);
  expect(count, `no tool count in "${tested.text}"`);
  log(`test: ${tested.text}`);
  await checkpoint('tested', { tool_count: Number(count[1]) });

  step = 'see the tools of fx';
  await clickRow('fx', 'tools');
  await visible('#tools-body tr');
  const names = await page.$$eval('#tools-body .model-name', (cells) => cells.map((c) => c.textContent));
  expect(names.includes('mcp__fx__echo'), `the tools view shows ${JSON.stringify(names)}`);
  log(`tools: ${names.join(', ')}`);
  await checkpoint('tools', { model_names: names });

  step = 'pin the tools of fx';
  dialogs = [];
  await clickRow('fx', 'pin');
  const pinned = await result();
  expect(dialogs.length === 1 && dialogs[0].includes('fx'), `confirmations: ${JSON.stringify(dialogs)}`);
  expect(
    pinned.outcome === 'ok' && /^2 tools pinned; changed: /.test(pinned.text) && pinned.text.includes('echo (new) → sha256:'),
    `the pin of fx says: ${pinned.text}`,
  );
  log(`pin: ${pinned.text}`);
  await checkpoint('pinned');

  step = 'edit fx with the form';
  await clickRow('fx', 'edit');
  await visible('#server-form');
  const command = await page.$eval('#f-command', (e) => e.value);
  expect(command === FIXTURE, `the form shows command ${command}`);
  const allowed = await page.$eval('#f-allowed_tools', (e) => e.value);
  expect(allowed === 'echo\nadd', `the form shows allowed tools ${JSON.stringify(allowed)}`);
  await type('#f-allowed_tools', 'echo\nadd\nsleep');
  await page.click('#form-save');
  await page.waitForFunction(
    () => document.getElementById('notice').textContent.includes('Saved fx'),
    { timeout: STEP_MS },
  );
  await noErrorShown();
  await checkpoint('edited');

  step = 'edit a record the form cannot show exactly';
  await clickRow('spaced', 'edit');
  await visible('#server-form');
  await expectLocked('args', 'stdio.args');
  await expectLocked('env', 'stdio.env');
  expect(!(await page.$eval('#f-allowed_tools', (e) => e.readOnly)), 'allowed_tools is read-only');
  await checkpoint('spaced-open');
  await type('#f-display_name', 'Renamed');
  await page.click('#form-save');
  await visible('#error');
  const conflict = await textOf('#error');
  expect(
    conflict.includes('412') && conflict.includes('changed since this editor was opened'),
    `a save after another write shows: ${conflict}`,
  );
  await page.click('#form-cancel');
  await clickRow('spaced', 'edit');
  await visible('#server-form');
  const reread = await page.$eval('#f-display_name', (e) => e.value);
  expect(reread === 'Elsewhere', `the reopened form shows display_name ${reread}`);
  await expectLocked('args', 'stdio.args');
  await type('#f-display_name', 'Renamed');
  await type('#f-tool_timeout_ms', '45000');
  await page.click('#form-save');
  await page.waitForFunction(
    () => document.getElementById('notice').textContent.includes('Saved spaced'),
    { timeout: STEP_MS },
  );
  await noErrorShown();
  log('spaced kept its arguments and environment');
  await checkpoint('spaced-saved');

  step = 'a refused record shows its error';
  await clickRow('fx', 'edit');
  await visible('#server-form');
  // The last record's read-only fields are not carried over to this one.
  const locks = await page.$$eval('#server-form .locked, #server-form .locked-note', (e) => e.length);
  const argsLocked = await page.$eval('#f-args', (e) => e.readOnly);
  expect(locks === 0 && !argsLocked, `fx's form has ${locks} locked parts (args: ${argsLocked})`);
  await type('#f-max_concurrency', '0');
  await page.click('#form-save');
  await visible('#error');
  const refused = await textOf('#error');
  expect(refused.includes('422') && refused.includes('max_concurrency'), `the error shows: ${refused}`);
  await page.click('#form-cancel');
  log(`refused: ${refused.trim()}`);

  step = 'delete fx';
  dialogs = [];
  await clickRow('fx', 'delete');
  await gone(row('fx'));
  expect(dialogs.length === 1 && dialogs[0].includes('fx'), `confirmations: ${JSON.stringify(dialogs)}`);
  await noErrorShown();
  log('fx is gone');
  await checkpoint('deleted');

  step = 'the hostile record renders as text';
  await clickRow(HOSTILE_ID, 'tools');
  await visible('#tools-body tr');
  const descriptions = await page.$$eval('#tools-body .description', (cells) => cells.map((c) => c.textContent));
  expect(descriptions.includes(HOSTILE_MARKUP), `descriptions shown: ${JSON.stringify(descriptions.slice(0, 3))}`);
  await nothingInjected();
  await clickRow(HOSTILE_ID, 'edit');
  await visible('#server-form');
  const shownName = await page.$eval('#f-display_name', (e) => e.value);
  expect(shownName === HOSTILE_MARKUP, `the form shows display_name ${shownName}`);
  await page.click('#show-raw');
  await visible('#raw-body');
  const raw = await page.$eval('#raw-body', (e) => e.value);
  // A JSON document escapes the markup's quotes; its tag is there as written.
  expect(raw.includes('<img src=x onerror='), `the raw editor shows ${raw}`);
  await page.click('#raw-cancel');
  await clickRow(HOSTILE_ID, 'test');
  const hostileTest = await result();
  expect(hostileTest.outcome === 'ok', `the hostile server's test says: ${hostileTest.text}`);
  await nothingInjected();
  log('markup stayed text');

  step = 'import a file';
  const input = await page.$('#import-file');
  await input.uploadFile(IMPORT_FILE);
  await visible('#import');
  const changes = await page.$$eval('#import-changes li', (items) => items.map((i) => i.textContent));
  expect(
    changes.length === 1 && changes[0] === 'add server imported',
    `the dry run shows ${JSON.stringify(changes)}`,
  );
  await checkpoint('import-preview');
  await page.click('#import-apply');
  await visible(row('imported'));
  await gone('#import');
  await noErrorShown();
  log('imported');
  await checkpoint('imported');

  step = 'add a profile';
  await page.click('#tab-profiles');
  await visible('#profiles-view');
  await page.click('#new-profile');
  await visible('#profile-body');
  await page.$eval('#profile-body', (e) => {
    e.value = '';
  });
  await page.type('#profile-body', `name = "web"\nserver_ids = ["${HOSTILE_ID}"]\n`);
  await page.click('#profile-save');
  await visible('#profiles-body tr[data-profile-name="web"]');
  await noErrorShown();
  log('profile web is listed');
  await checkpoint('profile');

  step = 'delete the profile';
  dialogs = [];
  await page.click('#profiles-body tr[data-profile-name="web"] button.delete');
  await gone('#profiles-body tr[data-profile-name="web"]');
  expect(dialogs.length === 1 && dialogs[0].includes('web'), `confirmations: ${JSON.stringify(dialogs)}`);
  await noErrorShown();
  await checkpoint('profile-deleted');
  await page.click('#tab-servers');
  await visible(row(HOSTILE_ID));

  step = 'no page errors';
  expect(pageErrors.length === 0, pageErrors.join('; '));
  await browser.close();
  browser = null;
  process.stdout.write('done\n');
  process.exit(0);
}

main().catch((e) => fail(e && e.message ? e.message : String(e)));
