// Drives a user authorization through `quiver serve` in a real headless Chromium, as a
// person would, for tests/admin_web.rs (which starts the node, the authorization server
// and the protected MCP server, and checks the API at each checkpoint).
//
// Input (environment): QUIVER_URL (the node, http://127.0.0.1:PORT, also its public_url),
// PORTAL_TOKEN (a client holding registry, authorize and submit), SERVER_ID (the record
// with user authorization), PRINCIPAL (whom to authorize for, the user who logs in),
// INTRUDER (another user, who logs in from a second browser context with the
// authorization server's URL but without the node's cookie), AS_URL (the authorization
// server's issuer), CHROMIUM, NPM_DIR (fixtures/npm), SCREENSHOT.
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
const TOKEN = env('PORTAL_TOKEN');
const SERVER_ID = env('SERVER_ID');
const PRINCIPAL = env('PRINCIPAL');
const INTRUDER = env('INTRUDER');
const AS_URL = env('AS_URL');
const CHROMIUM = env('CHROMIUM');
const SCREENSHOT = env('SCREENSHOT');
const require = createRequire(path.join(env('NPM_DIR'), 'package.json'));
const puppeteer = require('puppeteer-core');

const STEP_MS = 30_000;
const RUN_MS = 180_000;
const COOKIE = '__Host-quiver-authorization-';

let step = 'start';
let browser = null;
let page = null;
const pageErrors = [];

function log(message) {
  console.error(`[authorize_page] ${message}`);
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

/** The node's authorization cookies this browser context holds. */
async function nodeCookies(context) {
  const all = await context.cookies();
  return all
    .filter((c) => c.name.startsWith(COOKIE))
    .map((c) => ({ name: c.name, secure: c.secure, http_only: c.httpOnly, same_site: c.sameSite, path: c.path }));
}

/** Logs in at the authorization server's page in `tab` as `user` and approves; the answer the browser lands on. */
async function approveAs(tab, user) {
  await tab.waitForSelector('#user', { visible: true, timeout: STEP_MS });
  await tab.type('#user', user);
  const [response] = await Promise.all([
    tab.waitForNavigation({ waitUntil: 'load', timeout: STEP_MS }),
    tab.click('#approve'),
  ]);
  expect(response, 'no page after the approval');
  return {
    url_is_callback: response.url().startsWith(`${BASE}/oauth/callback?`),
    status: response.status(),
    text: await tab.$eval('body', (b) => b.innerText),
  };
}

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
  const context = browser.defaultBrowserContext();
  page = await browser.newPage();
  page.setDefaultTimeout(STEP_MS);
  page.on('pageerror', (e) => pageErrors.push(`page error: ${e.message}`));
  // The page asks whom to authorize for (and whose grant to show).
  page.on('dialog', (dialog) => dialog.accept(PRINCIPAL));

  step = 'sign in';
  await page.goto(`${BASE}/admin/`, { waitUntil: 'load', timeout: STEP_MS });
  await page.waitForSelector('#login', { visible: true });
  await page.type('#token', TOKEN);
  await page.click('#login-submit');
  const row = `#servers-body tr[data-server-id="${SERVER_ID}"]`;
  await page.waitForSelector(`${row} button.authorize`, { visible: true });

  step = 'press Authorize';
  const opened = browser.waitForTarget((t) => t.url().startsWith(`${BASE}/oauth/authorize/`), { timeout: STEP_MS });
  await page.click(`${row} button.authorize`);
  const consent = await (await opened).page();
  expect(consent, 'the node page opened in no tab');
  consent.setDefaultTimeout(STEP_MS);
  await consent.waitForSelector('form button[type=submit]');
  const nodePage = await consent.$eval('body', (b) => b.innerText);
  expect(nodePage.includes(`Continue only if you are ${PRINCIPAL}`), `the node's page says: ${nodePage}`);
  expect((await nodeCookies(context)).length === 0, 'a cookie before the button');

  step = "continue from the node's page";
  const [sent] = await Promise.all([
    consent.waitForNavigation({ waitUntil: 'load', timeout: STEP_MS }),
    consent.click('form button[type=submit]'),
  ]);
  const authorizationUrl = consent.url();
  if (!authorizationUrl.startsWith(`${AS_URL}/authorize?`)) {
    page = consent;
    const shown = await consent.$eval('body', (b) => b.innerText);
    throw new Error(`the browser went to ${authorizationUrl} (${sent && sent.status()}): ${shown}`);
  }
  const cookies = await nodeCookies(context);
  log(`at the authorization server with ${JSON.stringify(cookies)}`);
  await checkpoint('at-authorization-server', {
    cookies,
    prompt: new URL(authorizationUrl).searchParams.get('prompt'),
  });

  step = 'another browser with the same URL';
  const other = await browser.createBrowserContext();
  const intruder = await other.newPage();
  intruder.setDefaultTimeout(STEP_MS);
  await intruder.goto(authorizationUrl, { waitUntil: 'load', timeout: STEP_MS });
  const refused = await approveAs(intruder, INTRUDER);
  log(`the other browser got ${refused.status}`);
  await checkpoint('other-browser', refused);
  await other.close();

  step = 'log in and consent';
  const finished = await approveAs(consent, PRINCIPAL);
  finished.cookies_left = await nodeCookies(context);
  log(`the callback answered ${finished.status}`);
  await checkpoint('authorized', finished);

  step = 'press Grant';
  await page.bringToFront();
  await page.click(`${row} button.grant`);
  await page.waitForSelector('#result', { visible: true });
  await page.waitForFunction(
    () => document.querySelector('#result-title').textContent.startsWith('Grant of'),
    { timeout: STEP_MS },
  );
  const summary = await page.$eval('#result-summary', (e) => e.textContent);
  await checkpoint('grant-shown', { summary });

  step = 'no page errors';
  expect(pageErrors.length === 0, pageErrors.join('; '));
  await browser.close();
  browser = null;
  process.stdout.write('done\n');
  process.exit(0);
}

main().catch((e) => fail(e && e.message ? e.message : String(e)));
