// Drives the web admin page's approvals view in a real headless Chromium as an approver
// would, for tests/admin_web.rs (which starts the node, submits the task whose call waits,
// and checks the API and the audit log at each checkpoint).
//
// Input (environment): QUIVER_URL (the node), APPROVER_TOKEN (a client holding only
// `approve`), CHROMIUM, NPM_DIR (fixtures/npm), SCREENSHOT, REASON (the denial's reason,
// full of markup).
//
// Protocol as admin_page.mjs: `checkpoint NAME JSON` on stdout, then `continue` on stdin;
// `done` and exit 0 at the end, or `FAIL step: message` on stderr and exit 1.
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
const TOKEN = env('APPROVER_TOKEN');
const CHROMIUM = env('CHROMIUM');
const SCREENSHOT = env('SCREENSHOT');
const REASON = env('REASON');
const require = createRequire(path.join(env('NPM_DIR'), 'package.json'));
const puppeteer = require('puppeteer-core');

const STEP_MS = 30_000;
const RUN_MS = 180_000;

let step = 'start';
let browser = null;
let page = null;
const pageErrors = [];

function log(message) {
  console.error(`[approvals_page] ${message}`);
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
const isHidden = (selector) => page.$eval(selector, (e) => e.hidden || e.offsetParent === null);

async function main() {
  step = 'launch chromium';
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu', '--no-first-run'],
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
  let reloads = 0;
  page.on('framenavigated', (frame) => {
    if (frame === page.mainFrame()) reloads += 1;
  });

  step = 'sign in as the approver';
  await page.goto(`${BASE}/admin/`, { waitUntil: 'load', timeout: STEP_MS });
  await visible('#login');
  await page.type('#token', TOKEN);
  await page.click('#login-submit');
  await visible('#approvals-view');
  const shown = {
    whoami: await page.$eval('#whoami', (e) => e.textContent),
    servers_tab_hidden: await isHidden('#tab-servers'),
    profiles_tab_hidden: await isHidden('#tab-profiles'),
    servers_view_hidden: await isHidden('#servers-view'),
    empty_shown: !(await isHidden('#approvals-empty')),
  };
  log(`signed in: ${JSON.stringify(shown)}`);
  await checkpoint('signed-in', shown);

  step = 'a call appears without a reload';
  const navigationsBefore = reloads;
  const row = '#approvals-body tr[data-approval-id]';
  await visible(row);
  const listed = await page.$eval(row, (tr) => {
    const cell = (name) => tr.querySelector(`.${name}`).textContent;
    return {
      id: tr.getAttribute('data-approval-id'),
      task: cell('task'),
      principal: cell('principal'),
      server: cell('server'),
      tool: cell('tool'),
      arguments: cell('arguments'),
      time_left: cell('time-left'),
    };
  });
  expect(reloads === navigationsBefore, 'the page reloaded to show the call');
  log(`listed: ${JSON.stringify(listed)}`);
  await checkpoint('listed', listed);

  step = 'deny it with a reason';
  await page.type(`${row} input.reason`, REASON);
  await page.click(`${row} button.deny`);
  await gone(`#approvals-body tr[data-approval-id="${listed.id}"]`);
  await visible('#notice');
  const notice = await page.$eval('#notice', (e) => e.textContent);
  expect(notice.includes('Denied'), `the notice says: ${notice}`);
  const error = await page.$eval('#error', (e) => (e.hidden ? null : e.textContent));
  expect(error === null, `the page shows an error: ${error}`);
  await checkpoint('denied', { notice });

  step = 'no page errors';
  expect(
    (await page.evaluate(() => document.querySelectorAll('img').length)) === 0,
    'markup in the reason became an element',
  );
  expect(pageErrors.length === 0, pageErrors.join('; '));
  await browser.close();
  browser = null;
  process.stdout.write('done\n');
  process.exit(0);
}

main().catch((e) => fail(e && e.message ? e.message : String(e)));
