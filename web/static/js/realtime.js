// The realtime WebSocket client (docs/realtime-protocol.md): one-time
// ticket per attempt, subprotocol han.v1, subscriptions kept across
// reconnects, exponential backoff with full jitter that honours the
// server's advised delay (close 1001 {"retryMs":n}), and a liveness check.
//
// It only reports what happens; the chat view reconciles over REST after
// every "open" and "resync". It subscribes without sinceSeq, so the server
// replays nothing to it.
//
// A connection ends with its token (close 4001 token_expired at the token's
// exp plus the server's leeway). Before that, the client asks the getToken
// hook for a new token and sends it in band ({"type":"refresh"}); after a
// token_expired close it does not reconnect with the old token but waits
// for getToken to give it a new one.

import { ApiError } from "./api.js";

export const SUBPROTOCOL = "han.v1";
const BACKOFF_BASE_MS = 500;
const BACKOFF_CAP_MS = 30000;
const STABLE_AFTER_MS = 60000; // a connection up this long resets the backoff
const MAX_SUBSCRIPTIONS = 200;
// REFRESH_AHEAD_MS: ask for a new token this long before the connection's
// credential expires (at once when less is left).
export const REFRESH_AHEAD_MS = 60000;
const MAX_TIMER_MS = 2 ** 31 - 1; // setTimeout's longest delay

// backoffDelay: full jitter, rnd() * min(cap, base * 2^attempt).
export function backoffDelay(attempt, rnd = Math.random) {
  return Math.round(rnd() * Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** attempt));
}

// advisedDelay reads {"retryMs":n} from a 1001 close reason; null if absent.
export function advisedDelay(reason) {
  try {
    const v = JSON.parse(reason);
    if (v && Number.isFinite(v.retryMs) && v.retryMs >= 0) return Math.min(v.retryMs, 5 * 60000);
  } catch { /* not JSON */ }
  return null;
}

// Codes after which reconnecting in a loop cannot help (client bug or
// configuration problem).
const FATAL = new Map([
  [1003, "unsupported_data"],
  [1008, "policy_violation"],
  [4003, "user_session_required"],
]);

// refreshDelay is how long to wait before asking for a new token for a
// credential that expires at expiresAt (epoch ms).
export function refreshDelay(expiresAt, now = Date.now()) {
  return Math.min(MAX_TIMER_MS, Math.max(0, expiresAt - REFRESH_AHEAD_MS - now));
}

// Realtime emits:
//   state     {phase, retryAt?, reason?}  phase: connecting | live | reconnecting | stopped
//   open      the hello frame (after every (re)connect)
//   subscribed {dialogId, lastSeq}
//   event     an event frame
//   resync    {reason}
//   frameerror {error}
//   unauthorized  the ticket request answered 401
//   refreshed {expiresAt}  the server moved the connection's expiry
//
// getToken({reason, expiresAt}) resolves with a new token of the same user
// (and makes REST and later tickets use it), or null to give up. reason is
// "expiring" (before expiry), "refused" (the server refused the last one)
// or "expired" (the connection was closed with 4001 token_expired).
export class Realtime extends EventTarget {
  #ticket; // async () => ticket string
  #url; // async () => ws URL
  #getToken; // async ({reason, expiresAt}) => token string | null
  #expiresAt = 0; // the credential's exp (epoch ms), from hello or refreshed
  #refreshTimer = null;
  #asking = false; // a getToken call is outstanding
  #refreshSent = false; // a refresh frame awaits its answer
  #expired = false; // closed with token_expired: no reconnect before a new token
  #ws = null;
  #subs = new Set();
  #attempt = 0;
  #timer = null;
  #pingTimer = null;
  #liveTimer = null;
  #connectedAt = 0;
  #lastFrameAt = 0;
  #heartbeatMs = 25000;
  #stopped = true;
  #typingSent = new Map();
  state = { phase: "stopped" };

  constructor({ ticket, url, getToken }) {
    super();
    this.#ticket = ticket;
    this.#url = url;
    this.#getToken = getToken;
    this.onOnline = () => { if (this.state.phase === "reconnecting") this.reconnectNow(); };
    window.addEventListener("online", this.onOnline);
  }

  start() {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#attempt = 0;
    this.#connect();
  }

  stop() {
    this.#stopped = true;
    clearTimeout(this.#timer);
    clearTimeout(this.#refreshTimer);
    this.#closeSocket(1000, "bye");
    this.#setState({ phase: "stopped" });
    window.removeEventListener("online", this.onOnline);
  }

  // reconnectNow skips the wait (the banner's "Retry now", the browser
  // coming back online, a manual retry after a fatal close).
  reconnectNow() {
    if (this.#stopped) return;
    if (this.#expired) {
      this.#askToken("expired"); // the old token is dead: only a new one helps
      return;
    }
    clearTimeout(this.#timer);
    if (!this.#ws) this.#connect();
  }

  get expiresAt() { return this.#expiresAt; }

  get live() { return this.state.phase === "live"; }

  subscribe(dialogId) {
    if (this.#subs.has(dialogId) || this.#subs.size >= MAX_SUBSCRIPTIONS) return;
    this.#subs.add(dialogId);
    if (this.live) this.#send({ type: "subscribe", dialogId });
  }

  unsubscribe(dialogId) {
    if (!this.#subs.delete(dialogId)) return;
    if (this.live) this.#send({ type: "unsubscribe", dialogId });
  }

  // typing sends at most one typing frame per dialog every 2 s (the server
  // drops more than one per second anyway).
  typing(dialogId) {
    if (!this.live || !this.#subs.has(dialogId)) return;
    const now = Date.now();
    if (now - (this.#typingSent.get(dialogId) || 0) < 2000) return;
    this.#typingSent.set(dialogId, now);
    this.#send({ type: "typing", dialogId });
  }

  #emit(type, detail) { this.dispatchEvent(new CustomEvent(type, { detail })); }

  #setState(s) {
    this.state = s;
    this.#emit("state", s);
  }

  async #connect() {
    if (this.#stopped) return;
    this.#setState({ phase: "connecting" });
    let ticket;
    let url;
    try {
      [ticket, url] = await Promise.all([this.#ticket(), this.#url()]);
    } catch (e) {
      if (this.#stopped) return;
      if (e instanceof ApiError && e.status === 401) {
        this.#emit("unauthorized", e);
        this.stop();
        return;
      }
      const advised = e instanceof ApiError && e.retryAfter > 0 ? e.retryAfter * 1000 : null;
      this.#retry(advised, e instanceof ApiError ? e.code : "network_error");
      return;
    }
    if (this.#stopped) return;
    let ws;
    try {
      ws = new WebSocket(`${url}${url.includes("?") ? "&" : "?"}ticket=${encodeURIComponent(ticket)}`, SUBPROTOCOL);
    } catch {
      this.#retry(null, "network_error");
      return;
    }
    this.#ws = ws;
    let helloSeen = false;
    ws.onmessage = (m) => {
      this.#lastFrameAt = Date.now();
      let f;
      try { f = JSON.parse(m.data); } catch { return; }
      if (!f || typeof f.type !== "string") return;
      if (f.type === "hello") {
        helloSeen = true;
        this.#onHello(f);
        return;
      }
      this.#onFrame(f);
    };
    ws.onclose = (ev) => {
      if (this.#ws !== ws) return;
      this.#ws = null;
      clearInterval(this.#pingTimer);
      clearInterval(this.#liveTimer);
      if (this.#stopped) return;
      this.#onClose(ev.code, ev.reason, helloSeen);
    };
  }

  #onHello(f) {
    this.#connectedAt = Date.now();
    this.#refreshSent = false;
    this.#setExpiry(f.expiresAt);
    if (Number.isFinite(f.heartbeatMs) && f.heartbeatMs > 0) this.#heartbeatMs = f.heartbeatMs;
    this.#setState({ phase: "live", instance: f.instance });
    for (const id of this.#subs) this.#send({ type: "subscribe", dialogId: id });
    this.#typingSent.clear();
    // An application-level ping every heartbeat; no frame at all for two
    // heartbeats (plus slack) means the connection is dead.
    this.#pingTimer = setInterval(() => this.#send({ type: "ping" }), this.#heartbeatMs);
    this.#liveTimer = setInterval(() => {
      if (Date.now() - this.#lastFrameAt > 2 * this.#heartbeatMs + 5000) this.#closeSocket(4000, "no heartbeat");
    }, 5000);
    this.#emit("open", f);
  }

  #onFrame(f) {
    switch (f.type) {
      case "subscribed":
        this.#emit("subscribed", { dialogId: f.dialogId, lastSeq: Number(f.lastSeq) || 0 });
        break;
      case "event":
        this.#emit("event", f);
        break;
      case "resync":
        this.#emit("resync", { reason: f.reason });
        break;
      case "refreshed":
        this.#refreshSent = false;
        this.#setExpiry(f.expiresAt);
        this.#emit("refreshed", { expiresAt: this.#expiresAt });
        break;
      case "error":
        if (f.error === "unauthorized" && this.#refreshSent) {
          // The new token was refused; the connection keeps its old expiry.
          this.#refreshSent = false;
          this.#askToken("refused");
        }
        this.#emit("frameerror", { error: f.error });
        break;
      default: // pong and frames of later versions
    }
  }

  #onClose(code, reason, helloSeen) {
    this.#refreshSent = false;
    if (code === 4001 && reason === "token_expired") {
      // Reconnecting with the same token would only be refused: wait for a
      // new one.
      this.#expired = true;
      clearTimeout(this.#refreshTimer);
      this.#setState({ phase: "stopped", reason: "token_expired", code });
      this.#askToken("expired");
      return;
    }
    const fatal = FATAL.get(code);
    if (fatal) {
      this.#setState({ phase: "stopped", reason: fatal, code });
      return;
    }
    if (helloSeen && Date.now() - this.#connectedAt >= STABLE_AFTER_MS) this.#attempt = 0;
    if (code === 1001) {
      // Draining: the server says when to come back; add our own jitter so
      // a whole instance's clients do not return at once.
      const advised = advisedDelay(reason);
      this.#retry(advised === null ? null : advised + Math.random() * 1000, "going_away");
      return;
    }
    this.#retry(null, code === 4001 ? "unauthorized" : code === 1013 ? "try_again_later" : "connection_lost");
  }

  // #setExpiry records the credential's exp and schedules the request for
  // a new token REFRESH_AHEAD_MS before it.
  #setExpiry(ms) {
    clearTimeout(this.#refreshTimer);
    if (!Number.isFinite(ms) || ms <= 0) return;
    this.#expiresAt = ms;
    this.#refreshTimer = setTimeout(() => this.#askToken("expiring"), refreshDelay(ms));
  }

  // #askToken asks the getToken hook for a new token (one request at a
  // time) and uses it: in band on a live connection, or for a new
  // connection after token_expired. Otherwise the next connection attempt
  // fetches its ticket with it.
  async #askToken(reason) {
    if (!this.#getToken || this.#asking || this.#stopped) return;
    this.#asking = true;
    let tok = null;
    try {
      tok = await this.#getToken({ reason, expiresAt: this.#expiresAt });
    } catch {
      tok = null;
    } finally {
      this.#asking = false;
    }
    if (!tok || this.#stopped) return;
    if (this.#expired) {
      this.#expired = false;
      this.#attempt = 0;
      clearTimeout(this.#timer);
      if (!this.#ws) this.#connect();
      return;
    }
    if (this.live) {
      this.#refreshSent = true;
      this.#send({ type: "refresh", token: tok });
    }
  }

  #retry(advisedMs, reason) {
    if (this.#stopped) return;
    const delay = advisedMs !== null ? advisedMs : backoffDelay(this.#attempt);
    this.#attempt++;
    this.#setState({ phase: "reconnecting", retryAt: Date.now() + delay, reason });
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#connect(), delay);
  }

  #send(obj) {
    if (this.#ws && this.#ws.readyState === WebSocket.OPEN) this.#ws.send(JSON.stringify(obj));
  }

  #closeSocket(code, reason) {
    const ws = this.#ws;
    if (!ws) return;
    if (code === 1000) {
      this.#ws = null;
      clearInterval(this.#pingTimer);
      clearInterval(this.#liveTimer);
    }
    try { ws.close(code, reason); } catch { /* already closing */ }
  }
}
