// Entry point: sign-in, routing (#/chat[/<dialog>], #/console[/<project>]),
// the connection banner and the SDK client (web/sdk, served under /sdk/)
// shared by the views: its realtime connection, REST calls and token hook.
import { HanClient } from "../sdk/index.js";
import { get, getToken, onAuthLost, realtimeURL, setToken } from "./api.js";
import { ChatView } from "./chat.js";
import { ConsoleView } from "./console.js";
import { $, copyText, formatDateTime, h, hue, initials, relative, shortId, toast } from "./dom.js";
import { errorView, sentence } from "./errors.js";

const TOKEN_KEY = "han.token";
// session is the signed-in session's own object: what an old session's
// client asks after sign-out is not answered for the new one.
const app = { me: null, session: null, client: null, rt: null, chat: null, console: null, syncing: 0, realtimeUrl: null };
let renewal = null; // the open request for a new token: {resolve, card, text, errBox}

// A dev sign-in link carries the token in the fragment (/#token=…&project=…),
// which browsers never send to the server. The client rewrites the tab's
// own history entry at once: the address bar shows the link's view
// (#/chat or #/console/<project>) without the token. The browser's history
// database has recorded the visit by then, token included; no page script
// can take it out of there (docs/web-client.md).
function takeFragmentToken() {
  const frag = location.hash.slice(1);
  if (!/(^|&)token=/.test(frag)) return null;
  const p = new URLSearchParams(frag);
  const project = p.get("project");
  history.replaceState(null, "", `${location.pathname}${location.search}${project ? `#/console/${encodeURIComponent(project)}` : "#/chat"}`);
  return p.get("token");
}

// Token times (a token's exp, the connection's expiresAt) are on the
// server's clock, which a device's clock can be minutes off. They are
// judged against serverNow, the SDK's estimate of the server's clock
// (from the serverTime of hello and refreshed; the device's own clock
// before the first hello), and shown as onDeviceClock, the same moment on
// the device's clock, which is what "in 2 minutes" and a time of day mean
// to the user.
const clockOffset = () => (app.rt ? app.rt.clockOffset : 0);
const serverNow = () => (app.rt ? app.rt.serverNow() : Date.now());
const onDeviceClock = (ms) => ms - clockOffset();

function tokenExpiry(tok) {
  try {
    const part = tok.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(part));
    return Number.isFinite(claims.exp) ? claims.exp * 1000 : null;
  } catch {
    return null;
  }
}

// ---- sign-in ----------------------------------------------------------------------

function showSignIn(err) {
  $("#nav").hidden = true;
  $("#me").hidden = true;
  $("#conn").hidden = true;
  const input = h("textarea", { id: "token", class: "mono", rows: "4", autocomplete: "off", spellcheck: "false", required: true,
    placeholder: "eyJhbGciOi…", "aria-describedby": "token-hint" });
  const errBox = h("div", { id: "signin-error" }, err ? errorView(err) : null);
  const form = h("form", { id: "signin-form", class: "card signin-card" },
    h("h1", { text: "Sign in" }),
    h("p", { class: "muted", id: "token-hint", text: "Paste a user token (JWT). It stays in this tab only and is sent to this server alone." }),
    h("div", { class: "field" }, h("label", { for: "token", text: "Token" }), input),
    errBox,
    h("button", { type: "submit", class: "btn btn-primary btn-block", id: "signin-btn" }, "Sign in"),
    h("details", { class: "dev-help" }, h("summary", { text: "Local development" }),
      h("p", null, "Run ", h("code", { text: "scripts/dev.sh" }),
        ": it prints short-lived dev tokens for the demo users alice and bob, and sign-in links (", h("code", { text: "/#token=…" }),
        ") that sign this tab in once you confirm the user they name. Mint more with ", h("code", { text: "hanctl token --sub <uuid>" }), ".")));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    errBox.replaceChildren();
    const tok = input.value.trim().replace(/^Bearer\s+/i, "");
    if (!tok) return;
    const ok = await signIn(tok, errBox);
    if (ok) route();
  });
  $("#main").replaceChildren(h("div", { class: "signin" }, form));
  input.focus();
}

async function signIn(tok, errBox) {
  setToken(tok);
  let me;
  try {
    me = await get("/v1/me");
  } catch (e) {
    setToken("");
    if (errBox) errBox.replaceChildren(errorView(e, "signin-error-alert"));
    return false;
  }
  sessionStorage.setItem(TOKEN_KEY, tok);
  app.me = me.id;
  await startSession(tok);
  return true;
}

// realtimeUrl: the deployment's WebSocket URL (public config) when it is
// one the page can use (api.js realtimeURL), else this origin's
// /v1/realtime. A config that could not be read is asked again by the
// next session.
async function realtimeUrl() {
  if (!app.realtimeUrl) {
    try {
      app.realtimeUrl = realtimeURL((await get("/v1/public/config", { auth: false })).realtimeUrl);
    } catch {
      return realtimeURL(null);
    }
  }
  return app.realtimeUrl;
}

async function startSession(tok) {
  const me = app.me;
  const av = $("#me-avatar");
  av.textContent = initials(null, me);
  av.style.setProperty("--hue", String(hue(me)));
  $("#me-id").textContent = shortId(me);
  $("#me-id").title = me;
  showTokenExpiry(tok);
  $("#me").hidden = false;
  $("#nav").hidden = false;
  $("#conn").hidden = false;

  const url = await realtimeUrl();
  const session = {};
  app.session = session;
  app.client = new HanClient({ baseUrl: location.origin, realtimeUrl: url,
    getToken: (info) => (app.session === session ? tokenHook(info) : null) });
  app.client.tokens.set(tok);
  app.rt = app.client.realtime;
  app.rt.on("state", renderConn);
  // The tooltip's "in 40 minutes" is measured anew with the server's clock.
  app.rt.on("open", () => { if (app.session === session) showTokenExpiry(getToken()); });
  app.chat = new ChatView({ me, client: app.client, onSync: (n) => { app.syncing = n; renderConn(); } });
  app.console = new ConsoleView({ me });
  app.chat.refreshDialogs();
  app.client.connect();
}

function showTokenExpiry(tok) {
  const exp = tokenExpiry(tok);
  $("#me").title = exp ? `token expires ${formatDateTime(onDeviceClock(exp))} (${relative(onDeviceClock(exp))})` : "";
}

// ---- token renewal ------------------------------------------------------------------

// tokenHook is the SDK's getToken: a 401 (REST or the ticket request) signs
// out, as any other request's 401 does; otherwise the user is asked for a
// new token of the same user. Only the current session's client reaches it
// (startSession): a client left over from a signed-out session gets null.
function tokenHook({ reason, expiresAt }) {
  if (reason === "unauthorized" || reason === "initial") {
    if (app.me) signOut({ code: "unauthorized", status: 401 });
    return null;
  }
  // A token given since (a sign-in link of this user opened in the tab)
  // that outlives the connection's credential answers at once. Not after a
  // refusal: the server has just refused the token it was sent.
  const tok = getToken();
  const exp = tokenExpiry(tok);
  if (reason !== "refused" && exp && exp > expiresAt && exp > serverNow()) return tok;
  return askForToken({ reason, expiresAt });
}

// askForToken asks for a new token on the SDK's behalf. A connection ends
// when its token expires, so before that (and after it, when the server
// closed with token_expired) a card asks for a new token of the same user:
// pasted, or from a sign-in link opened in this tab (the dev flow). The
// token is checked with GET /v1/me, then every request, ticket and the live
// connection (in band) use it.
function askForToken({ reason, expiresAt }) {
  if (renewal) {
    renewal.say(reason, expiresAt);
    return renewal.promise;
  }
  const input = h("textarea", { id: "renew-token", class: "mono", rows: "3", autocomplete: "off", spellcheck: "false",
    placeholder: "eyJhbGciOi…", "aria-label": "New token" });
  const text = h("p", { id: "renew-text" });
  const errBox = h("div", { id: "renew-error" });
  const card = h("form", { id: "renew", class: "card renew", role: "dialog", "aria-labelledby": "renew-title" },
    h("h2", { id: "renew-title", text: "New token needed" }), text, input, errBox,
    h("div", { class: "renew-actions" },
      h("button", { type: "submit", class: "btn btn-primary btn-sm", id: "renew-btn" }, "Use token")));
  let resolve;
  const promise = new Promise((r) => { resolve = r; });
  renewal = {
    promise, input, errBox, card,
    resolve: (tok) => { renewal = null; card.remove(); resolve(tok); },
    say: (why, exp) => {
      card.dataset.reason = why;
      text.textContent = why === "expired" ? "Your session has ended. Paste a new token (or open a new sign-in link in this tab) to reconnect."
        : why === "refused" ? "The server refused that token. Paste another one to stay connected."
          : exp > serverNow() ? `Your token expires ${relative(onDeviceClock(exp))} (${formatDateTime(onDeviceClock(exp))}). Paste a new one (or open a new sign-in link in this tab) to stay connected.`
            : "Your token has expired and the connection ends soon. Paste a new one (or open a new sign-in link in this tab) to stay connected.";
    },
  };
  renewal.say(reason, expiresAt);
  card.addEventListener("submit", (e) => {
    e.preventDefault();
    useNewToken(input.value);
  });
  document.body.append(card);
  return promise;
}

async function useNewToken(raw) {
  const r = renewal;
  const tok = (raw || "").trim().replace(/^Bearer\s+/i, "");
  if (!r || !tok) return;
  r.errBox.replaceChildren();
  let me;
  try {
    // Not through the session's token, and a 401 here must not sign out.
    me = await get("/v1/me", { auth: false, headers: { Authorization: `Bearer ${tok}` } });
  } catch (e) {
    r.errBox.replaceChildren(errorView(e, "renew-error-alert"));
    return;
  }
  if (me.id !== app.me) {
    r.errBox.replaceChildren(errorView({ code: "token_user_mismatch" }, "renew-error-alert"));
    return;
  }
  setToken(tok);
  sessionStorage.setItem(TOKEN_KEY, tok);
  showTokenExpiry(tok);
  r.resolve(tok);
}

function signOut(err) {
  renewal?.resolve(null);
  closeSwitch();
  sessionStorage.removeItem(TOKEN_KEY);
  setToken("");
  if (app.client) {
    app.client.close();
    // Anything the old client still sends goes without the signed-out
    // token: it asks its hook, which answers null now.
    app.client.tokens.set("");
  }
  app.chat?.dispose();
  app.console?.dispose();
  Object.assign(app, { me: null, session: null, client: null, rt: null, chat: null, console: null, syncing: 0 });
  showSignIn(err);
}

// ---- connection banner ----------------------------------------------------------------

let connTimer = null;
let connectingSince = 0; // when the banner began to say Connecting…
// An attempt still connecting after this long offers Retry (most take far
// less; the SDK gives a step up after 10 s by itself).
const RETRY_OFFER_MS = 3000;

function renderConn() {
  const el = $("#conn");
  const rt = app.rt;
  if (!rt) return;
  clearTimeout(connTimer);
  const s = rt.state;
  let phase = s.phase;
  // After token_expired the SDK waits for a new token, not for a timer:
  // the connection is over until one is given.
  if (phase === "reconnecting" && s.reason === "token_expired") phase = "stopped";
  let text;
  let action = null;
  if (phase === "live" && app.syncing > 0) phase = "resyncing";
  if (renewal && s.reason === "token_expired") renewal.say("expired");
  if (phase !== "connecting") connectingSince = 0;
  switch (phase) {
    case "connecting": {
      text = "Connecting…";
      connectingSince ||= Date.now();
      const left = connectingSince + RETRY_OFFER_MS - Date.now();
      if (left > 0) connTimer = setTimeout(renderConn, left);
      else action = h("button", { type: "button", class: "btn btn-sm btn-ghost", id: "conn-retry", onclick: () => rt.reconnectNow() }, "Retry now");
      break;
    }
    case "live":
      text = "Live";
      break;
    case "resyncing":
      text = "Resyncing…";
      break;
    case "reconnecting": {
      const secs = Math.max(0, Math.ceil((s.retryAt - Date.now()) / 1000));
      text = `Reconnecting in ${secs} s`;
      action = h("button", { type: "button", class: "btn btn-sm btn-ghost", id: "conn-retry", onclick: () => rt.reconnectNow() }, "Retry now");
      connTimer = setTimeout(renderConn, 250);
      break;
    }
    default:
      text = s.reason ? `Offline (${s.reason})` : "Offline";
      // A stopped client (a fatal close) starts anew; one waiting for a
      // token asks for it again.
      action = h("button", { type: "button", class: "btn btn-sm btn-ghost", id: "conn-retry",
        onclick: () => (s.phase === "stopped" ? rt.start() : rt.reconnectNow()) }, "Retry");
  }
  el.dataset.phase = phase;
  el.replaceChildren(...[h("span", { class: "conn-dot", "aria-hidden": "true" }), h("span", { class: "conn-text", text }), action].filter(Boolean));
}

// ---- routing ------------------------------------------------------------------------------

function route() {
  if (!app.me) return;
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
  const section = parts[0] === "console" ? "console" : "chat";
  $("#nav-chat").setAttribute("aria-current", section === "chat" ? "page" : "false");
  $("#nav-console").setAttribute("aria-current", section === "console" ? "page" : "false");
  const main = $("#main");
  const view = section === "chat" ? app.chat : app.console;
  if (main.firstElementChild !== view.root) main.replaceChildren(view.root);
  document.body.dataset.section = section;
  if (section === "chat") app.chat.open(parts[1] || null);
  else app.console.open(parts[1] || null);
  document.title = section === "chat" ? "HAN · Chat" : "HAN · Project console";
}

// ---- sign-in links -----------------------------------------------------------------

// Sign-in links are taken one after another: a link opened while one is
// under way waits for it, and a link queued behind a newer one is passed
// over (only the newest counts).
let linkQueue = Promise.resolve();
let newestLink = 0;
let switching = null; // the open "Switch to user …?" card: {card}

function queue(fn) {
  linkQueue = linkQueue.then(fn, fn);
  return linkQueue;
}

// linkArrived takes the token of a sign-in link opened in this tab. at:
// the address the tab showed before the link (back) and the link's own
// view (to); a link that does not end the session leaves the tab at back.
function linkArrived(tok, at) {
  const mine = ++newestLink;
  return queue(() => (mine === newestLink ? takeLink(tok, at) : undefined));
}

// takeLink: the link's token is checked first (GET /v1/me; a 401 there
// does not sign out) and used only with the user's say. In a tab without a
// session the user confirms signing in as the user it names. In a tab with
// one, the session stays as it is until there is reason to end it: a
// refused token is reported and changes nothing; a token of the signed-in
// user becomes the session's token; a token of another user is used only
// once the user confirms the switch. Anyone who can send the user a link,
// or navigate this tab (a page it opened, or that opened it), can open one
// in it.
async function takeLink(tok, at) {
  if (!app.me) return confirmSignIn(tok, at.to);
  const session = app.session;
  history.replaceState(null, "", at.back);
  let me;
  try {
    me = await checkToken(tok);
  } catch (e) {
    if (app.session === session) linkRefused(e);
    return;
  }
  if (app.session !== session) return; // signed out (or in anew) meanwhile
  if (me.id === app.me) useToken(tok);
  else askToSwitch(tok, me.id, at.to);
}

// checkToken asks the server whose token tok is, without it becoming the
// session's token; a 401 does not sign the tab out.
function checkToken(tok) {
  return get("/v1/me", { auth: false, headers: { Authorization: `Bearer ${tok}` } });
}

// useToken makes a checked token of the signed-in user the session's:
// every request and ticket use it, and the live connection is given it
// when it next asks for one (tokenHook).
function useToken(tok) {
  setToken(tok);
  app.client.tokens.set(tok);
  sessionStorage.setItem(TOKEN_KEY, tok);
  showTokenExpiry(tok);
}

function linkRefused(err) {
  const code = (err && err.code) || "internal";
  toast(h("span", { class: "link-refused", dataset: { code } }, "The sign-in link was not used: ",
    h("code", { class: "code", text: code }), " ", sentence(code, err && err.status)), "error");
}

function closeSwitch() {
  switching?.card.remove();
  switching = null;
}

// askToSwitch asks before a sign-in link of another user ends the session.
// The session runs on meanwhile; Stay (the focused choice, so an Enter
// meant for the composer keeps it) drops the link's token.
function askToSwitch(tok, user, view) {
  closeSwitch();
  const stay = h("button", { type: "button", class: "btn btn-sm", id: "switch-stay" }, `Stay signed in as ${shortId(app.me)}`);
  const go = h("button", { type: "button", class: "btn btn-primary btn-sm", id: "switch-go" }, "Switch user");
  const card = h("div", { id: "switch-user", class: "card renew", role: "alertdialog", "aria-labelledby": "switch-title",
    "aria-describedby": "switch-text", dataset: { user } },
    h("h2", { id: "switch-title", text: `Switch to user ${shortId(user)}?` }),
    h("p", { id: "switch-text" }, "A sign-in link for user ", h("code", { text: user }), " was opened in this tab, which is signed in as ",
      h("code", { text: app.me }), ". Switching ends this session. If you did not open that link yourself, stay signed in."),
    h("div", { class: "renew-actions" }, stay, go));
  const session = app.session;
  stay.addEventListener("click", closeSwitch);
  go.addEventListener("click", () => {
    closeSwitch();
    if (app.session === session) void queue(() => switchTo(tok, view));
  });
  switching = { card };
  document.body.append(card);
  stay.focus();
}

// confirmSignIn asks before a sign-in link signs in a tab without a
// session. A link whose token is someone else's (sent to the user, or
// opened in the tab by another page) would otherwise sign the tab in as
// them without a word: whatever the user then writes or uploads would go
// out as that account, to its owner. The card names the link's user;
// nothing is kept or used until Sign in, and Don't sign in (focused)
// drops the token and shows the sign-in form. view: the link's own view.
async function confirmSignIn(tok, view) {
  $("#main").replaceChildren(h("p", { class: "muted loading", text: "Checking the sign-in link…" }));
  let me;
  try {
    me = await checkToken(tok);
  } catch (e) {
    if (!app.me) showSignIn(e);
    return;
  }
  if (app.me) return; // signed in meanwhile
  const user = me.id;
  const no = h("button", { type: "button", class: "btn", id: "link-signin-no" }, "Don't sign in");
  const go = h("button", { type: "button", class: "btn btn-primary", id: "link-signin-go" }, `Sign in as ${shortId(user)}`);
  const card = h("section", { id: "link-signin", class: "card signin-card", "aria-labelledby": "link-signin-title",
    "aria-describedby": "link-signin-text", dataset: { user } },
    h("h1", { id: "link-signin-title", text: `Sign in as user ${shortId(user)}?` }),
    h("p", { id: "link-signin-text" }, "A sign-in link for user ", h("code", { text: user }),
      " was opened in this tab. Once signed in, everything you do here (the messages you write, the files you attach, changes in the project console) is done as that user. If someone sent you this link, or you did not open it yourself, don't sign in."),
    h("div", { class: "renew-actions" }, no, go));
  no.addEventListener("click", () => { if (card.isConnected && !app.me) showSignIn(); });
  go.addEventListener("click", () => {
    if (!card.isConnected || app.me) return;
    history.replaceState(null, "", view);
    void queue(() => (app.me ? undefined : signInWith(tok)));
  });
  $("#main").replaceChildren(h("div", { class: "signin" }, card));
  no.focus();
}

// signInWith ends the session open in the tab, if any, and signs in with
// tok. quiet: a refused token leaves the page as it is (a sign-in link
// follows that decides).
async function signInWith(tok, { quiet = false } = {}) {
  if (app.me) signOut();
  $("#main").replaceChildren(h("p", { class: "muted loading", text: "Signing in…" }));
  const errBox = h("div");
  if (await signIn(tok, errBox)) route();
  else if (!quiet) showSignIn(errBox.firstChild ? { code: errBox.firstChild.dataset.code } : null);
}

// switchTo ends the session for a confirmed link's user, once its token is
// still good, and opens the link's view.
async function switchTo(tok, view) {
  try {
    await checkToken(tok);
  } catch (e) {
    linkRefused(e);
    return;
  }
  history.replaceState(null, "", view);
  await signInWith(tok);
}

// ---- start ----------------------------------------------------------------------------------

async function boot() {
  $("#sign-out").addEventListener("click", () => signOut());
  $("#copy-me").addEventListener("click", async () => {
    toast((await copyText(app.me || "")) ? "Your user id was copied." : `Your user id: ${app.me}`, "success");
  });
  window.addEventListener("hashchange", (e) => {
    // A sign-in link opened in this tab: its token leaves the address bar
    // at once. While a new token is asked for it answers the ask;
    // otherwise it is taken as a link (takeLink: a session open in the tab
    // is not ended without the user's say).
    const tok = takeFragmentToken();
    if (!tok) {
      route();
      return;
    }
    const at = { back: `${location.pathname}${location.search}${new URL(e.oldURL).hash}`, to: location.href };
    if (renewal) {
      history.replaceState(null, "", at.back);
      useNewToken(tok);
      return;
    }
    void linkArrived(tok, at);
  });
  onAuthLost(() => { if (app.me) signOut({ code: "unauthorized", status: 401 }); });
  // Back online: skip the wait of a pending reconnect, and start an
  // attempt still connecting anew (it may be stuck on the path that went).
  window.addEventListener("online", () => {
    const phase = app.rt?.state.phase;
    if (phase === "reconnecting" || phase === "connecting") app.rt.reconnectNow();
  });
  // The tab's own session (a reload) comes back first: a sign-in link the
  // tab was sent to then meets a running session, as one opened later does.
  const link = takeFragmentToken();
  const stored = sessionStorage.getItem(TOKEN_KEY);
  if (stored) await queue(() => signInWith(stored, { quiet: !!link }));
  if (link) await linkArrived(link, { back: location.href, to: location.href });
  else if (!stored) showSignIn();
}

boot();
