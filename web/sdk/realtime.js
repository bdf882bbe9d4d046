// The realtime connection (docs/realtime-protocol.md, docs/asyncapi.yaml):
// subprotocol han.v1, ticket or bearer authentication, in-band token
// refresh, subscriptions kept across reconnects with recovery (sinceSeq),
// gap detection and REST reconciliation, jittered reconnect honouring the
// server's retryMs, subscribes paced under the server's frame rate and sent
// again while the server cannot answer them.
import { ApiError, CLIENT_CODES, CloseError, FrameError } from "./errors.js";
import { DialogState, GAP_GRACE_MS } from "./dialog.js";
import { Emitter } from "./emitter.js";

/** @typedef {import("./rest.js").Rest} Rest */
/** @typedef {import("./rest.js").Tokens} Tokens */
/** @typedef {import("./rest.js").Message} Message */

export const SUBPROTOCOL = "han.v1";
const BACKOFF_BASE_MS = 500;
const BACKOFF_CAP_MS = 30000;
const STABLE_AFTER_MS = 60000; // a connection up this long resets the backoff
const MAX_SUBSCRIPTIONS = 200;
const MAX_ADVISED_MS = 5 * 60000;
const MAX_TIMER_MS = 2 ** 31 - 1;
/** The hello's heartbeatMs is used within these bounds: neither a ping loop nor a timer out of range. */
const HEARTBEAT_MIN_MS = 1000;
const HEARTBEAT_MAX_MS = 5 * 60000;
const HEARTBEAT_DEFAULT_MS = 25000;
/**
 * A ping is answered when any frame arrives after it. One unanswered for
 * the heartbeat plus PONG_SLACK_MS ends the connection; one sent on a run
 * of the heartbeat timer that came late (by more than PONG_SLACK_MS: the
 * tab was asleep, so the server has likely dropped the socket) has
 * PONG_SLACK_MS only. Silence alone proves nothing: a hidden tab's timers
 * run as rarely as once a minute, so its pings are that far apart, and a
 * quiet dialog sends nothing between them.
 */
const PONG_SLACK_MS = 5000;
const SEEN_IDS = 2048; // recent event ids kept for dedupe
// A reconciliation that failed despite its retries is tried again after
// reconcileRetryDelay: 2.5–5 s, doubling with each failure in a row up to
// 2.5–5 min. A REST that keeps refusing (or is down while the socket is up)
// is not read every 5 s for as long as it lasts, by every client at once.
const RECONCILE_RETRY_MS = 5000;
const RECONCILE_RETRY_CAP_MS = 5 * 60000;
// At most this many dialogs are reconciled over REST at once: a resync of
// every dialog (200 of them) must not become 200 concurrent reads against
// the user's read rate limit; the others wait their turn.
const MAX_RECONCILES = 4;
// A reconciliation that has not ended within this long is given up (and
// tried again RECONCILE_RETRY_MS later): a read hung on a dead path must
// not hold one of the MAX_RECONCILES slots, and every other dialog, for
// minutes.
const RECONCILE_TIMEOUT_MS = 60000;
/**
 * The largest frame taken from the server (ws's maxPayload; a browser's
 * WebSocket ignores the option). The server's frames are far smaller (its
 * whole queue per connection is 1 MiB); without a bound ws takes frames of
 * up to 100 MiB, so a hostile or broken endpoint could make a Node client
 * hold that much per frame. A larger frame closes the socket with 1009 and
 * the client reconnects with backoff.
 */
export const MAX_FRAME_BYTES = 1 << 20;
/**
 * How long each step of a connection attempt may take: getting its ticket
 * (or, with bearer, the first token from getToken), and from opening the
 * socket to its hello: more than the server's longest handshake (up to 6 s
 * in its admission queue, then at most 5 s of Redis and PostgreSQL work and
 * the user channel's subscription). A step not done in time ends the
 * attempt, and the client reconnects with backoff.
 */
export const CONNECT_TIMEOUT_MS = 15000;
/** The rejection of a connection step (ticket, token) that did not end within CONNECT_TIMEOUT_MS. */
const CONNECT_STEP_TIMEOUT = new ApiError(CLIENT_CODES.network, 0);
/**
 * The largest frame the server reads from a client (docs/realtime-protocol.md,
 * "Limits"; a larger one is closed with 1008 "frame too big"). A refresh
 * whose token would not fit is not sent in band: the client reconnects with
 * the new token instead (the ticket request and the upgrade take tokens of
 * up to 8 KiB).
 */
export const SERVER_MAX_FRAME_BYTES = 4096;
/**
 * A subscribe the server refused with `unavailable` (Redis or PostgreSQL
 * did not answer in time) is sent again after subscribeRetryDelay: from
 * 0.5–1 s, doubling, up to 15–30 s; the first subscribed resets it.
 */
const SUBSCRIBE_RETRY_BASE_MS = 1000;
const SUBSCRIBE_RETRY_CAP_MS = 30000;
/** Error codes the server gives only in answer to a subscribe. */
const SUBSCRIBE_ERRORS = new Set(["unavailable", "dialog_not_found", "too_many_subscriptions"]);
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * dialogKey is the form of a dialog id the client keys its dialogs by: the
 * server answers and sends events with the lowercase form of a UUID, so an
 * id given in capitals is the same dialog. Anything else is kept as given
 * (the server refuses it as invalid_uuid).
 * @param {string} dialogId
 */
function dialogKey(dialogId) {
  return UUID.test(dialogId) ? dialogId.toLowerCase() : dialogId;
}
/**
 * seqOrNull: v when it is a seq the server takes as sinceSeq (an integer
 * >= 0), else null. The seq a dialog is known up to is always one, so no
 * resubscribe is refused for it.
 * @param {unknown} v
 * @returns {number | null}
 */
function seqOrNull(v) {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0 ? v : null;
}
/**
 * The server closes a socket with 1008 "frame rate" beyond a burst of 60
 * frames and 20 frames/s after it (pings and pongs included). Subscribes
 * and unsubscribes are paced under a smaller budget, which leaves room for
 * pings, pongs, typing and refresh: a burst of SUBSCRIBE_BURST frames per
 * connection, then SUBSCRIBE_PER_SEC a second.
 */
export const SUBSCRIBE_BURST = 40;
export const SUBSCRIBE_PER_SEC = 15;
/** Ask for a new token this long before the connection's credential expires (at once when less is left). */
export const REFRESH_AHEAD_MS = 60000;
/**
 * A new token for the live connection is asked for at most this often: a
 * credential that keeps ending within REFRESH_AHEAD_MS (short-lived
 * tokens, or a server that says so) or a refresh the server keeps refusing
 * must not turn into a loop of getToken calls and refresh frames.
 */
export const REFRESH_MIN_GAP_MS = 10000;

/**
 * @typedef {{type: "hello", connectionId: string, instance: string, heartbeatMs: number, expiresAt: number,
 *   serverTime?: number}} Hello serverTime: the server's clock (epoch ms) when it sent the frame
 * @typedef {{type: "event", channel: string, id: string, event: string, entityId: string,
 *   dialogId?: string, seq?: number, data: any}} EventFrame
 * @typedef {"connecting" | "live" | "reconnecting" | "stopped"} Phase
 * @typedef {{phase: Phase, retryAt?: number, reason?: string, code?: number}} State
 * @typedef {"live" | "recovered" | "rest"} MessageSource how a message reached the client
 */

/**
 * @typedef {object} RealtimeEvents
 * @property {State} state the connection's phase changed
 * @property {Hello} open a connection is up (after every reconnect)
 * @property {{dialogId: string, message: Message, source: MessageSource}} message
 *   the next message of a subscribed dialog: per dialog exactly once, in seq order, without gaps
 * @property {{dialogId: string, lastSeq: number, recovered: boolean}} subscribed
 * @property {{reason: string, dialogId?: string}} resync the server may have dropped events
 * @property {{dialogId: string, userId: string}} typing
 * @property {{userId: string, online: boolean, lastSeenAt: number | null, changedAt: number}} presence
 *   a user's presence changed; transitions published by different instances may arrive out of
 *   order, and one older (by changedAt) than the last one reported for the user is not reported
 * @property {EventFrame} event every event frame, unknown events included
 * @property {{expiresAt: number}} refreshed the connection now ends at this credential expiry
 * @property {Error} error a refused frame (FrameError; with dialogId when it refused a subscribe), a failed
 *   reconciliation (ApiError), a close (CloseError)
 */

/**
 * backoffDelay: full jitter, rnd() * min(cap, base * 2^attempt).
 * @param {number} attempt
 * @param {() => number} [rnd]
 */
export function backoffDelay(attempt, rnd = Math.random) {
  return Math.round(rnd() * Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** attempt));
}

/**
 * subscribeRetryDelay: the wait before a subscribe refused as unavailable
 * `fails` times in a row is sent again; half of it jittered.
 * @param {number} fails 0 after the first refusal
 * @param {() => number} [rnd]
 */
export function subscribeRetryDelay(fails, rnd = Math.random) {
  const base = Math.min(SUBSCRIBE_RETRY_CAP_MS, SUBSCRIBE_RETRY_BASE_MS * 2 ** fails);
  return Math.round(base / 2 + (rnd() * base) / 2);
}

/**
 * reconcileRetryDelay: the wait before a reconciliation that failed `fails`
 * times in a row (despite its own retries) is tried again; half of it
 * jittered.
 * @param {number} fails 0 after the first failure
 * @param {() => number} [rnd]
 */
export function reconcileRetryDelay(fails, rnd = Math.random) {
  const base = Math.min(RECONCILE_RETRY_CAP_MS, RECONCILE_RETRY_MS * 2 ** fails);
  return Math.round(base / 2 + (rnd() * base) / 2);
}

/**
 * advisedDelay reads {"retryMs":n} from a close reason; null if absent.
 * @param {string} reason
 * @returns {number | null}
 */
export function advisedDelay(reason) {
  try {
    const v = JSON.parse(reason);
    if (v && Number.isFinite(v.retryMs) && v.retryMs >= 0) return Math.min(v.retryMs, MAX_ADVISED_MS);
  } catch { /* not JSON */ }
  return null;
}

/**
 * refreshDelay: how long to wait before asking for a new token for a
 * credential expiring at expiresAt (epoch ms, on the server's clock), with
 * the server's clock at `now`.
 * @param {number} expiresAt
 * @param {number} [now] the server's clock: the client's plus serverClockOffset
 */
export function refreshDelay(expiresAt, now = Date.now()) {
  return Math.min(MAX_TIMER_MS, Math.max(0, expiresAt - REFRESH_AHEAD_MS - now));
}

/**
 * A serverTime this far from the client's clock (or farther) is no clock
 * reading: a unit mistake (seconds or microseconds for ms), a zero, a
 * garbled number. It is ignored rather than trusted with the token's
 * schedule. A device clock minutes, hours or days off is well within it.
 */
export const MAX_CLOCK_OFFSET_MS = 366 * 24 * 3600 * 1000;
/**
 * A round trip longer than this gives serverClockOffset no correction: it
 * measured a suspended device or the client's clock being set in between,
 * not the network.
 */
const MAX_RTT_MS = 30000;

/**
 * serverClockOffset: how far the server's clock is ahead of the client's (ms;
 * negative when behind), from a frame's serverTime and the client's clock
 * when the frame arrived; null when serverTime is absent or no time at all
 * (not a number, not finite, negative, MAX_CLOCK_OFFSET_MS or more from the
 * client's clock), and the client then goes by the offset it had, or by its
 * own clock.
 * rttMs is the round trip the frame answered, when one is known (refresh
 * sent to refreshed received): the server read its clock about halfway
 * through it, so half of it is added. Without one, the frame's transit
 * time counts as the server's clock being behind by as much: the refresh
 * comes that much later, far less than REFRESH_AHEAD_MS.
 * @param {unknown} serverTime
 * @param {number} [now]
 * @param {number} [rttMs]
 * @returns {number | null}
 */
export function serverClockOffset(serverTime, now = Date.now(), rttMs = 0) {
  if (typeof serverTime !== "number" || !Number.isFinite(serverTime) || serverTime < 0) return null;
  const offset = serverTime - now;
  if (!(Math.abs(offset) < MAX_CLOCK_OFFSET_MS)) return null;
  return rttMs > 0 && rttMs <= MAX_RTT_MS ? offset + rttMs / 2 : offset;
}

/**
 * @typedef {object} WebSocketLike the part of the WebSocket API the client uses
 * @property {number} readyState
 * @property {(data: string) => void} send
 * @property {(code?: number, reason?: string) => void} close
 * @property {((ev: {data: any}) => void) | null} onmessage
 * @property {((ev: {code: number, reason: string}) => void) | null} onclose
 * @property {((ev: any) => void) | null} onerror
 */

/**
 * @typedef {new (url: string, protocols: string, options?: {headers?: Record<string, string>, maxPayload?: number}) => WebSocketLike} WebSocketCtor
 * a browser WebSocket, or `ws` in Node; bearer authentication needs one that
 * takes headers (ws).
 */

/**
 * @typedef {object} RealtimeOptions
 * @property {string} url the WebSocket URL, e.g. "wss://chat.example.com/v1/realtime"
 * @property {"ticket" | "bearer"} [auth] ticket (default; browsers) or bearer on the upgrade request
 * @property {WebSocketCtor} [WebSocket] default: globalThis.WebSocket
 * @property {number} [gapGraceMs] default GAP_GRACE_MS
 * @property {Record<string, string>} [headers] extra upgrade headers (Node with ws only), e.g. Origin
 */

/**
 * PresenceOrder keeps, per user, the time of the last presence transition
 * reported, so one arriving late is not reported: each instance publishes
 * the transitions it sees, and an offline announced by one instance can
 * reach a socket after the online announced by another that followed it.
 * Transitions carry the time Redis recorded them (one clock per user). At
 * most `max` users are remembered (the longest unseen is forgotten first).
 */
export class PresenceOrder {
  /** @type {Map<string, number>} */
  #at = new Map();
  #max;

  constructor(max = 10000) {
    this.#max = max;
  }

  /**
   * @param {string} userId
   * @param {number} changedAt
   * @returns {boolean} whether the transition is the user's latest so far
   */
  accept(userId, changedAt) {
    const last = this.#at.get(userId);
    if (last !== undefined && changedAt < last) return false;
    this.#at.delete(userId);
    this.#at.set(userId, changedAt);
    if (this.#at.size > this.#max) {
      const oldest = this.#at.keys().next().value;
      if (oldest !== undefined) this.#at.delete(oldest);
    }
    return true;
  }
}

/**
 * FrameBudget is a token bucket: `burst` frames at once, then `perSec` a
 * second.
 */
export class FrameBudget {
  #burst;
  #perSec;
  #tokens;
  #at;

  /**
   * @param {number} burst
   * @param {number} perSec
   * @param {number} [now]
   */
  constructor(burst, perSec, now = Date.now()) {
    this.#burst = burst;
    this.#perSec = perSec;
    this.#tokens = burst;
    this.#at = now;
  }

  /**
   * take spends one frame when the budget has one.
   * @param {number} [now]
   * @returns {number} 0 when the frame may go now, else the ms until it may
   */
  take(now = Date.now()) {
    this.#tokens = Math.min(this.#burst, this.#tokens + (Math.max(0, now - this.#at) * this.#perSec) / 1000);
    this.#at = now;
    if (this.#tokens >= 1) {
      this.#tokens -= 1;
      return 0;
    }
    return Math.ceil(((1 - this.#tokens) * 1000) / this.#perSec);
  }
}

/** @extends {Emitter<RealtimeEvents>} */
export class Realtime extends Emitter {
  #url;
  #auth;
  #WS;
  #rest;
  #tokens;
  #gapGraceMs;
  #headers;
  /** @type {WebSocketLike | null} */
  #ws = null;
  /** @type {Map<string, DialogState>} */
  #dialogs = new Map();
  /** @type {Set<string>} */
  #seen = new Set();
  #presenceAt = new PresenceOrder();
  #attempt = 0;
  /** the latest connection attempt; stop() and a newer attempt end an older one still waiting for its token or ticket */
  #attemptId = 0;
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #timer;
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #refreshTimer;
  /** @type {ReturnType<typeof setInterval> | undefined} */
  #pingTimer;
  /** @type {ReturnType<typeof setTimeout> | undefined} ends an attempt whose hello does not come */
  #connectTimer;
  /** @type {AbortController | null} ends the ticket request of the attempt under way */
  #connectAbort = null;
  /** @type {string[]} dialogs of the subscribes sent on this socket and not answered yet, in order */
  #answers = [];
  /** @type {{type: "subscribe" | "unsubscribe", dialogId: string}[]} frames waiting for the budget, in order */
  #outbox = [];
  #budget = new FrameBudget(SUBSCRIBE_BURST, SUBSCRIBE_PER_SEC);
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #outboxTimer;
  #connectedAt = 0;
  /** when the ping not answered yet went out (no frame has come since); 0 when none is */
  #pingAt = 0;
  /** when the heartbeat timer last ran (or was started) */
  #tickAt = 0;
  /** @type {ReturnType<typeof setTimeout> | undefined} ends the connection when the ping under way stays unanswered */
  #pongTimer;
  #heartbeatMs = HEARTBEAT_DEFAULT_MS;
  #stopped = true;
  /** ends the REST reads of running reconciliations (and their retry waits) on stop */
  #abort = new AbortController();
  #refreshSent = false;
  /** the latest refresh frame sent, sent again after a rate_limited answer */
  #refreshFrame = "";
  /**
   * the server's clock minus the client's (ms), from the serverTime of the
   * connection's hello or latest refreshed; 0 (the client's own clock) on a
   * connection whose frames carry none. expiresAt is on the server's clock.
   */
  #clockOffset = 0;
  /** when (client's clock) the refresh frame not answered yet was sent */
  #refreshSentAt = 0;
  #renewAskedAt = -Infinity; // when the live connection last asked for a new token
  #expired = false; // closed with token_expired: no reconnect before a new token
  #reconciles = 0; // reconciliations running (at most MAX_RECONCILES)
  /** @type {(() => void)[]} */
  #reconcileQueue = []; // reconciliations waiting for a slot, in order
  /** @type {Map<string, number>} */
  #typingSent = new Map();
  /** @type {Set<string>} dialogs whose subscribe with sinceSeq awaits its subscribed frame */
  #pendingRecovery = new Set();
  /** @type {State} */
  state = { phase: "stopped" };

  /**
   * @param {RealtimeOptions} opts
   * @param {Rest} rest
   * @param {Tokens} tokens
   */
  constructor(opts, rest, tokens) {
    super();
    this.#url = opts.url;
    this.#auth = opts.auth || "ticket";
    const WS = opts.WebSocket || /** @type {any} */ (globalThis).WebSocket;
    if (!WS) throw new TypeError("no WebSocket implementation: pass one (in Node 20: the ws package)");
    this.#WS = /** @type {WebSocketCtor} */ (WS);
    this.#rest = rest;
    this.#tokens = tokens;
    this.#gapGraceMs = opts.gapGraceMs ?? GAP_GRACE_MS;
    this.#headers = opts.headers;
  }

  get live() {
    return this.state.phase === "live";
  }

  /**
   * clockOffset: the server's clock minus the client's (ms) as last
   * measured (hello, refreshed); 0 before the first hello, and on a
   * connection whose frames carry no serverTime. A time on the server's
   * clock (a token's exp, expiresAt) minus clockOffset is the same moment
   * on the client's clock.
   */
  get clockOffset() {
    return this.#clockOffset;
  }

  /** serverNow is the server's clock as the client estimates it (epoch ms): token times are judged against it. */
  serverNow() {
    return Date.now() + this.#clockOffset;
  }

  /** start connects (and keeps reconnecting) until stop. */
  start() {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#expired = false;
    if (this.#abort.signal.aborted) this.#abort = new AbortController();
    this.#attempt = 0;
    void this.#connect();
  }

  /**
   * stop closes the connection, cancels every timer and ends running
   * reconciliations (their REST reads and retry waits) and a connection
   * attempt still waiting for its token or ticket.
   */
  stop() {
    this.#stopped = true;
    this.#attemptId++;
    this.#connectAbort?.abort();
    this.#abort.abort();
    clearTimeout(this.#timer);
    clearTimeout(this.#refreshTimer);
    for (const d of this.#dialogs.values()) d.clearGapTimer();
    const ws = this.#ws;
    this.#dropSocket();
    try { ws?.close(1000, "bye"); } catch { /* already closing */ }
    this.#setState({ phase: "stopped" });
  }

  /**
   * reconnectNow skips the wait of a pending reconnect, and starts a
   * connection attempt under way (waiting for its ticket, token or hello)
   * anew: after the network came back, the old one may be stuck on a path
   * that is gone. A live connection is kept.
   */
  reconnectNow() {
    if (this.#stopped) return;
    clearTimeout(this.#timer);
    if (this.#expired) {
      void this.#newToken("expired");
      return;
    }
    if (this.live) return;
    const ws = this.#ws;
    if (ws) {
      this.#dropSocket();
      try { ws.close(4000, "retry"); } catch { /* closing */ }
    }
    void this.#connect();
  }

  /**
   * subscribe follows a dialog until unsubscribe, across reconnects. With
   * sinceSeq the client delivers every message after it ("message" events),
   * recovered by the server or read over REST; without it, delivery starts
   * after the lastSeq of the first subscribed frame. A sinceSeq that is not
   * an integer >= 0 counts as none: the server would refuse the subscribe as
   * invalid_frame, an error that names no dialog and that other frames get
   * too, so it could not be told apart as this subscribe's answer.
   * @param {string} dialogId
   * @param {{sinceSeq?: number}} [opts]
   */
  subscribe(dialogId, opts = {}) {
    dialogId = dialogKey(dialogId);
    if (this.#dialogs.has(dialogId)) return;
    if (this.#dialogs.size >= MAX_SUBSCRIPTIONS) throw new RangeError("too_many_subscriptions");
    this.#dialogs.set(dialogId, new DialogState(seqOrNull(opts.sinceSeq)));
    if (this.live) this.#enqueue({ type: "subscribe", dialogId });
  }

  /** @param {string} dialogId */
  unsubscribe(dialogId) {
    dialogId = dialogKey(dialogId);
    if (!this.#forget(dialogId)) return;
    // A subscribe still waiting for the budget is dropped: the server never
    // heard of it.
    const i = this.#outbox.findIndex((f) => f.type === "subscribe" && f.dialogId === dialogId);
    if (i >= 0) this.#outbox.splice(i, 1);
    else if (this.live) this.#enqueue({ type: "unsubscribe", dialogId });
  }

  /**
   * forget stops following a dialog: its timers end and it is no longer
   * resubscribed; false if it was not followed.
   * @param {string} dialogId
   */
  #forget(dialogId) {
    const d = this.#dialogs.get(dialogId);
    if (!d) return false;
    d.clearGapTimer();
    d.clearSubscribeTimer();
    this.#dialogs.delete(dialogId);
    return true;
  }

  /**
   * known: the highest seq delivered for a dialog with no gap below it.
   * @param {string} dialogId
   * @returns {number | null}
   */
  known(dialogId) {
    dialogId = dialogKey(dialogId);
    return this.#dialogs.get(dialogId)?.known ?? null;
  }

  /**
   * typing tells the dialog's members the user is typing; at most one frame
   * per dialog every 2 s (the server drops more than one per second).
   * @param {string} dialogId
   */
  typing(dialogId) {
    dialogId = dialogKey(dialogId);
    if (!this.live || !this.#dialogs.has(dialogId)) return;
    const now = Date.now();
    if (now - (this.#typingSent.get(dialogId) || 0) < 2000) return;
    this.#typingSent.set(dialogId, now);
    this.#send({ type: "typing", dialogId });
  }

  /** @param {State} s */
  #setState(s) {
    this.state = s;
    this.emit("state", s);
  }

  async #connect() {
    if (this.#stopped) return;
    const id = ++this.#attemptId;
    this.#setState({ phase: "connecting" });
    let ws;
    try {
      if (this.#auth === "bearer") {
        const token = await this.#connectStep(() => this.#tokens.current());
        if (this.#stopped || id !== this.#attemptId) return;
        ws = new this.#WS(this.#url, SUBPROTOCOL,
          { headers: { ...this.#headers, Authorization: `Bearer ${token}` }, maxPayload: MAX_FRAME_BYTES });
      } else {
        const { ticket } = await this.#connectStep((signal) => this.#rest.ticket({ signal }));
        if (this.#stopped || id !== this.#attemptId) return;
        const url = `${this.#url}${this.#url.includes("?") ? "&" : "?"}ticket=${encodeURIComponent(ticket)}`;
        ws = new this.#WS(url, SUBPROTOCOL, { headers: this.#headers, maxPayload: MAX_FRAME_BYTES });
      }
    } catch (e) {
      if (this.#stopped || id !== this.#attemptId) return;
      if (e === CONNECT_STEP_TIMEOUT || (e instanceof ApiError && e.code === CLIENT_CODES.tokenTimeout)) {
        // No ticket or token in time (a request black-holed after a network
        // switch, a stalled proxy, a getToken that does not settle: Tokens
        // gives such a call up within TOKEN_TIMEOUT_MS, so the next attempt
        // asks the hook again).
        this.#retry(null, "connect_timeout");
        return;
      }
      const err = /** @type {any} */ (e);
      const status = err && err.status;
      if (status >= 400 && status < 500 && status !== 408 && status !== 429) {
        // The ticket (or token) was refused as such: a 401 after getToken
        // failed to give a usable token, a 403 for a token that is not a
        // user session. Every attempt would be refused alike.
        this.emit("error", err);
        this.#stopped = true;
        this.#setState({ phase: "stopped", reason: err.code || "unauthorized" });
        return;
      }
      // A Retry-After is the least wait, like a close's retryMs, plus our
      // own 0–1 s: the clients a refusing server told the same thing at the
      // same moment do not all come back at once.
      const after = err && err.retryAfterMs;
      this.#retry(Number.isFinite(after) && after > 0 ? Math.min(after, MAX_ADVISED_MS) + Math.random() * 1000 : null,
        (err && err.code) || "network_error");
      return;
    }
    this.#ws = ws;
    let helloSeen = false;
    // A path that swallows the handshake or the hello (a hung instance or
    // proxy) ends the attempt instead of leaving the client connecting.
    clearTimeout(this.#connectTimer);
    this.#connectTimer = setTimeout(() => {
      if (this.#ws === ws && !helloSeen) this.#abandon(ws, "no hello", false);
    }, CONNECT_TIMEOUT_MS);
    ws.onerror = () => { /* onclose follows */ };
    ws.onmessage = (m) => {
      if (this.#ws !== ws) return; // a socket given up (no hello in time, no heartbeat, stop)
      this.#pingAt = 0; // any frame answers the ping
      let f;
      try { f = JSON.parse(String(m.data)); } catch { return; }
      if (!f || typeof f !== "object" || typeof f.type !== "string") return;
      if (f.type === "hello") {
        // The first frame of a connection, once: a repeated one would
        // resubscribe everything and start another ping timer.
        if (helloSeen) return;
        helloSeen = true;
        this.#onHello(f);
        return;
      }
      this.#onFrame(f);
    };
    ws.onclose = (ev) => {
      if (this.#ws !== ws) return;
      this.#dropSocket();
      if (this.#stopped) return;
      this.#onClose(ev.code || 1006, ev.reason || "", helloSeen);
    };
  }

  /**
   * connectStep runs one step of a connection attempt before its socket
   * (the ticket request, or getToken for bearer) within CONNECT_TIMEOUT_MS;
   * past it, it aborts the request and rejects with CONNECT_STEP_TIMEOUT. A
   * newer attempt and stop() end it the same way. A getToken still running is left
   * to Tokens, which shares it with the next attempt until it is
   * TOKEN_TIMEOUT_MS old (no longer than this step's bound), then asks the
   * hook anew.
   * @template T
   * @param {(signal: AbortSignal) => Promise<T>} fn
   * @returns {Promise<T>}
   */
  async #connectStep(fn) {
    this.#connectAbort?.abort();
    const ac = new AbortController();
    this.#connectAbort = ac;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
    const deadline = new Promise((_, reject) => {
      timer = setTimeout(() => ac.abort(CONNECT_STEP_TIMEOUT), CONNECT_TIMEOUT_MS);
      // Given up (in time, by a newer attempt or stop): the step ends now,
      // whether or not the request (or getToken) heeds the signal.
      ac.signal.addEventListener("abort", () => reject(ac.signal.reason), { once: true });
    });
    const work = fn(ac.signal);
    work.catch(() => { /* a step given up may fail later */ });
    try {
      return /** @type {T} */ (await Promise.race([work, deadline]));
    } finally {
      clearTimeout(timer);
      if (this.#connectAbort === ac) this.#connectAbort = null;
    }
  }

  #dropSocket() {
    this.#ws = null;
    this.#answers = [];
    for (const d of this.#dialogs.values()) d.clearSubscribeTimer();
    this.#pendingRecovery.clear();
    this.#outbox = [];
    clearTimeout(this.#outboxTimer);
    clearTimeout(this.#connectTimer);
    clearInterval(this.#pingTimer);
    clearTimeout(this.#pongTimer);
  }

  /**
   * abandon gives a socket up without waiting for its closing handshake
   * (which a dead path never completes) and reconnects.
   * @param {WebSocketLike} ws
   * @param {string} reason
   * @param {boolean} helloSeen
   */
  #abandon(ws, reason, helloSeen) {
    this.#dropSocket();
    try { ws.close(4000, reason); } catch { /* closing */ }
    if (!this.#stopped) this.#onClose(4000, reason, helloSeen);
  }

  /** @param {Hello} f */
  #onHello(f) {
    this.#connectedAt = Date.now();
    this.#refreshSent = false;
    // Per connection: another instance may keep another clock.
    this.#clockOffset = serverClockOffset(f.serverTime) ?? 0;
    this.#setExpiry(f.expiresAt);
    this.#heartbeatMs = Number.isFinite(f.heartbeatMs) && f.heartbeatMs > 0
      ? Math.min(HEARTBEAT_MAX_MS, Math.max(HEARTBEAT_MIN_MS, f.heartbeatMs)) : HEARTBEAT_DEFAULT_MS;
    this.#typingSent.clear();
    clearTimeout(this.#connectTimer);
    // Every followed dialog is subscribed again, paced by a fresh budget
    // (the server's bucket is full on a new connection).
    this.#budget = new FrameBudget(SUBSCRIBE_BURST, SUBSCRIBE_PER_SEC);
    this.#outbox = Array.from(this.#dialogs.keys(), (dialogId) => ({ type: /** @type {const} */ ("subscribe"), dialogId }));
    this.#setState({ phase: "live" });
    this.#flush();
    // An application-level ping every heartbeat; one left unanswered
    // means the connection is dead.
    clearInterval(this.#pingTimer);
    clearTimeout(this.#pongTimer);
    this.#pingAt = 0;
    this.#tickAt = Date.now();
    this.#pingTimer = setInterval(() => this.#heartbeat(), this.#heartbeatMs);
    this.emit("open", f);
  }

  /**
   * heartbeat sends a ping unless one is still unanswered, and gives the
   * socket up when that ping's answer does not come in time (see
   * PONG_SLACK_MS). Only a ping's answer is awaited, never silence as such:
   * timers held back in a hidden tab (once a minute) must not end a healthy
   * connection whose server has nothing to say.
   */
  #heartbeat() {
    const ws = this.#ws;
    if (!ws) return;
    const now = Date.now();
    const late = now - this.#tickAt > this.#heartbeatMs + PONG_SLACK_MS;
    this.#tickAt = now;
    if (this.#pingAt !== 0 || !this.#send({ type: "ping" })) return;
    const sentAt = now;
    this.#pingAt = sentAt;
    clearTimeout(this.#pongTimer);
    this.#pongTimer = setTimeout(() => {
      if (this.#ws === ws && this.#pingAt === sentAt) this.#abandon(ws, "no heartbeat", true);
    }, late ? PONG_SLACK_MS : this.#heartbeatMs + PONG_SLACK_MS);
  }

  /** @param {{type: "subscribe" | "unsubscribe", dialogId: string}} f */
  #enqueue(f) {
    this.#outbox.push(f);
    if (this.#outbox.length === 1) this.#flush();
  }

  /** flush sends the waiting subscribes and unsubscribes the budget allows now, and comes back for the rest. */
  #flush() {
    clearTimeout(this.#outboxTimer);
    while (this.#outbox.length > 0 && this.live && this.#ws) {
      const wait = this.#budget.take();
      if (wait > 0) {
        this.#outboxTimer = setTimeout(() => this.#flush(), wait);
        return;
      }
      const f = /** @type {{type: "subscribe" | "unsubscribe", dialogId: string}} */ (this.#outbox.shift());
      if (f.type === "subscribe") this.#subscribeFrame(f.dialogId);
      else this.#send(f);
    }
  }

  /** @param {string} dialogId */
  #subscribeFrame(dialogId) {
    const d = this.#dialogs.get(dialogId);
    if (!d) return;
    /** @type {{type: string, dialogId: string, sinceSeq?: number}} */
    const f = { type: "subscribe", dialogId };
    if (d.known !== null) {
      f.sinceSeq = d.known;
      this.#pendingRecovery.add(dialogId);
    }
    if (this.#send(f)) this.#answers.push(dialogId);
  }

  /** @param {any} f */
  #onFrame(f) {
    switch (f.type) {
      case "subscribed": {
        // Answers come in the order of the subscribes, one each (both
        // carry the lowercase form: dialogKey).
        const i = this.#answers.indexOf(f.dialogId);
        if (i >= 0) this.#answers.splice(0, i + 1);
        this.#onSubscribed(f.dialogId, seqOrNull(Number(f.lastSeq)) ?? 0, f.recovered === true);
        break;
      }
      case "event":
        this.#onEvent(f);
        break;
      case "resync":
        this.emit("resync", f.dialogId ? { reason: String(f.reason), dialogId: f.dialogId } : { reason: String(f.reason) });
        // With a dialogId (recovery_unavailable) the subscribed frame that
        // follows says recovered:false and starts the reconciliation.
        if (!f.dialogId) for (const id of this.#dialogs.keys()) this.#reconcile(id);
        break;
      case "refreshed":
        // The round trip is known when this answers our refresh.
        this.#clockOffset = serverClockOffset(f.serverTime, Date.now(),
          this.#refreshSent ? Date.now() - this.#refreshSentAt : 0) ?? this.#clockOffset;
        this.#refreshSent = false;
        this.#setExpiry(f.expiresAt);
        this.emit("refreshed", { expiresAt: this.#tokens.expiresAt });
        break;
      case "error": {
        const code = String(f.error);
        const dialogId = this.#refusedSubscribe(code);
        if (dialogId !== null) {
          this.#onSubscribeRefused(dialogId, code);
          break;
        }
        if (code === "unauthorized" && this.#refreshSent) {
          // The new token was refused; the connection keeps its old expiry.
          this.#refreshSent = false;
          this.#renewSoon("refused", 0);
        }
        if (code === "rate_limited" && this.#refreshSent) {
          // The token was not looked at: the client's address was refused
          // too many credentials lately. The same refresh goes again after
          // the advised wait; the connection keeps its old expiry meanwhile.
          this.#refreshSent = false;
          const advised = Number.isFinite(f.retryMs) && f.retryMs >= 0 ? Math.min(f.retryMs, MAX_ADVISED_MS) : REFRESH_MIN_GAP_MS;
          this.#resendRefresh(advised + Math.random() * 1000);
        }
        this.emit("error", new FrameError(code));
        break;
      }
      default: // pong, and frames of later versions
    }
  }

  /**
   * refusedSubscribe tells whether an error frame answers a subscribe, and
   * whose: the frame names no dialog, but each subscribe is answered by one
   * subscribed or one error, in the order they were sent, so it is the
   * oldest unanswered one. Errors of other frames (typing, refresh) come
   * between them, so only codes no other frame gets count, and
   * invalid_uuid when the oldest unanswered subscribe's dialogId is not a
   * UUID (such a subscribe is always answered with it).
   * @param {string} code
   * @returns {string | null} the dialogId, or null when the error answers another frame
   */
  #refusedSubscribe(code) {
    const oldest = this.#answers[0];
    if (oldest === undefined) return null;
    if (SUBSCRIBE_ERRORS.has(code) || (code === "invalid_uuid" && !UUID.test(oldest))) {
      this.#answers.shift();
      return oldest;
    }
    return null;
  }

  /**
   * onSubscribeRefused: a subscribe the server could not answer now
   * (unavailable) is sent again after a backoff; any other refusal (not a
   * member, too many subscriptions, not a UUID) ends following the dialog,
   * so no reconnect sends it again. Either way the error names the dialog.
   * @param {string} dialogId
   * @param {string} code
   */
  #onSubscribeRefused(dialogId, code) {
    const d = this.#dialogs.get(dialogId);
    if (d) {
      this.#pendingRecovery.delete(dialogId);
      if (code === "unavailable") {
        d.clearSubscribeTimer();
        d.subscribeTimer = setTimeout(() => {
          d.subscribeTimer = null;
          if (this.live && this.#dialogs.get(dialogId) === d) this.#enqueue({ type: "subscribe", dialogId });
        }, subscribeRetryDelay(d.subscribeFails++));
      } else {
        this.#forget(dialogId);
      }
    }
    this.emit("error", new FrameError(code, dialogId));
  }

  /**
   * @param {string} dialogId
   * @param {number} lastSeq
   * @param {boolean} recovered
   */
  #onSubscribed(dialogId, lastSeq, recovered) {
    const d = this.#dialogs.get(dialogId);
    if (!d) return;
    this.#pendingRecovery.delete(dialogId);
    d.subscribeFails = 0;
    this.emit("subscribed", { dialogId, lastSeq, recovered });
    if (d.known === null) {
      d.known = lastSeq; // first subscribe without sinceSeq: live from here
      this.#deliver(dialogId, d.drain(), "live");
    } else if (!recovered && d.known > lastSeq) {
      // sinceSeq was beyond the dialog's last seq (a seq it never had: a
      // stale cache, another dialog's): the dialog ends at lastSeq, and
      // what the client held beyond it is not the dialog's. Kept, every
      // later message would be dropped as a duplicate.
      d.forget(lastSeq);
      this.#watchGap(dialogId, d);
    }
    // A server that did not recover (or does not know sinceSeq) answers
    // without recovered:true: what was missed comes over REST.
    if (d.known < lastSeq || (!recovered && d.hasGap)) this.#reconcile(dialogId);
  }

  /** @param {EventFrame} f */
  #onEvent(f) {
    if (typeof f.id === "string") {
      if (this.#seen.has(f.id)) return;
      this.#seen.add(f.id);
      if (this.#seen.size > SEEN_IDS) this.#seen.delete(/** @type {string} */ (this.#seen.values().next().value));
    }
    this.emit("event", f);
    const data = f.data || {};
    switch (f.event) {
      case "message.created": {
        const dialogId = f.dialogId || data.dialogId;
        const d = this.#dialogs.get(dialogId);
        if (!d) return;
        const msg = /** @type {Message} */ ({ ...data, seq: Number.isSafeInteger(f.seq) ? f.seq : data.seq });
        // Before subscribed answers, events are recovered ones (the server
        // sends no live event of a dialog before its subscribed frame).
        this.#deliver(dialogId, d.offer(msg), this.#pendingRecovery.has(dialogId) ? "recovered" : "live");
        this.#watchGap(dialogId, d);
        break;
      }
      case "typing":
        if (f.dialogId) this.emit("typing", { dialogId: f.dialogId, userId: String(data.userId) });
        break;
      case "presence.changed": {
        const userId = String(data.userId);
        const changedAt = Number.isSafeInteger(data.changedAt) ? data.changedAt : 0;
        if (!this.#presenceAt.accept(userId, changedAt)) break; // an older transition arriving late
        this.emit("presence", { userId, online: data.online === true, lastSeenAt: data.lastSeenAt ?? null, changedAt });
        break;
      }
      default: // unknown events are only reported as "event"
    }
  }

  /**
   * @param {string} dialogId
   * @param {DialogState} d
   */
  #watchGap(dialogId, d) {
    if (!d.hasGap) {
      d.clearGapTimer();
      d.gapReads = 0;
      return;
    }
    if (d.gapTimer) return;
    // The first read after the grace period; a gap those reads did not
    // close (REST does not have the messages yet, or never will) is read
    // again ever later, up to every 30 s, not in a loop.
    const delay = Math.min(BACKOFF_CAP_MS, this.#gapGraceMs * 2 ** d.gapReads);
    d.gapTimer = setTimeout(() => {
      d.gapTimer = null;
      if (!d.hasGap || this.#dialogs.get(dialogId) !== d) return;
      d.gapReads++;
      this.#reconcile(dialogId);
    }, delay);
  }

  /**
   * @param {string} dialogId
   * @param {Message[]} msgs
   * @param {MessageSource} source
   */
  #deliver(dialogId, msgs, source) {
    for (const message of msgs) this.emit("message", { dialogId, message, source });
  }

  /** reconcileSlot waits for one of the MAX_RECONCILES slots. */
  async #reconcileSlot() {
    if (this.#reconciles < MAX_RECONCILES) {
      this.#reconciles++;
      return;
    }
    await new Promise((resolve) => this.#reconcileQueue.push(() => resolve(undefined)));
  }

  /** releaseReconcileSlot hands the slot to the next waiting reconcile. */
  #releaseReconcileSlot() {
    const next = this.#reconcileQueue.shift();
    if (next) next();
    else this.#reconciles--;
  }

  /**
   * reconcile reads afterSeq=known over REST to the end and delivers what
   * was missing; one run per dialog at a time (a request during a run
   * repeats it once).
   * @param {string} dialogId
   */
  async #reconcile(dialogId) {
    const d = this.#dialogs.get(dialogId);
    if (!d || d.known === null) return;
    if (d.reconciling) {
      d.again = true;
      return;
    }
    d.reconciling = true;
    await this.#reconcileSlot();
    try {
      if (this.#stopped || this.#dialogs.get(dialogId) !== d) return;
      do {
        d.again = false;
        // Ended by stop() or after RECONCILE_TIMEOUT_MS (AbortSignal.any is
        // missing on some runtimes the SDK supports).
        const ac = new AbortController();
        const stopped = () => ac.abort(this.#abort.signal.reason);
        if (this.#abort.signal.aborted) stopped();
        else this.#abort.signal.addEventListener("abort", stopped, { once: true });
        const timer = setTimeout(() => ac.abort(new DOMException("reconciliation timed out", "TimeoutError")), RECONCILE_TIMEOUT_MS);
        try {
          for await (const items of this.#rest.historyPages(dialogId, { afterSeq: d.known, attempts: 8, signal: ac.signal })) {
            if (this.#dialogs.get(dialogId) !== d) return;
            for (const m of items) this.#deliver(dialogId, d.offer(m), "rest");
          }
        } finally {
          clearTimeout(timer);
          this.#abort.signal.removeEventListener("abort", stopped);
        }
      } while (d.again && this.#dialogs.get(dialogId) === d);
      d.reconcileFails = 0;
      this.#watchGap(dialogId, d);
    } catch (e) {
      if (this.#stopped) return; // stop ended it
      this.emit("error", /** @type {Error} */ (e));
      // REST failed after its own retries: try again later, ever later
      // while it keeps failing, as long as the dialog is followed.
      if (!this.#stopped && !d.retryTimer) {
        d.retryTimer = setTimeout(() => {
          d.retryTimer = null;
          if (!this.#stopped && this.#dialogs.get(dialogId) === d) void this.#reconcile(dialogId);
        }, reconcileRetryDelay(d.reconcileFails++));
      }
    } finally {
      d.reconciling = false;
      this.#releaseReconcileSlot();
    }
  }

  /**
   * @param {number} code
   * @param {string} reason
   * @param {boolean} helloSeen
   */
  #onClose(code, reason, helloSeen) {
    this.#refreshSent = false;
    const err = new CloseError(code, reason);
    this.emit("error", err);
    if (err.tokenExpired) {
      // Reconnecting with the same token would only be refused.
      this.#expired = true;
      clearTimeout(this.#refreshTimer);
      this.#setState({ phase: "reconnecting", reason: "token_expired", code });
      void this.#newToken("expired");
      return;
    }
    if (err.fatal) {
      this.#stopped = true;
      this.#setState({ phase: "stopped", reason: reason || "policy", code });
      return;
    }
    if (helloSeen && Date.now() - this.#connectedAt >= STABLE_AFTER_MS) this.#attempt = 0;
    if (code === 1001) {
      // Draining: the server says when to come back; our own jitter keeps a
      // whole instance's clients from returning at once.
      const advised = advisedDelay(reason);
      this.#retry(advised === null ? null : advised + Math.random() * 1000, "going_away", code);
      return;
    }
    if (code === 1013) {
      // A full handshake queue advises a delay the same way; an outage
      // (no advice) backs off below.
      const advised = advisedDelay(reason);
      if (advised !== null) {
        this.#retry(advised + Math.random() * 1000, "try_again_later", code);
        return;
      }
    }
    if (code === 4001) {
      // Unknown/used ticket or a refused token: a ticket is fetched anew per
      // attempt; a bearer connection needs a new token first.
      if (this.#auth === "bearer") {
        this.#expired = true;
        void this.#newToken("expired");
        return;
      }
    }
    this.#retry(null, code === 1013 ? "try_again_later" : "connection_lost", code);
  }

  /** @param {number} ms */
  #setExpiry(ms) {
    clearTimeout(this.#refreshTimer);
    if (!Number.isFinite(ms) || ms <= 0) return;
    this.#tokens.expiresAt = ms;
    // On the server's clock: a client clock minutes off neither refreshes
    // after the server has closed the connection nor asks again and again.
    this.#renewSoon("expiring", refreshDelay(ms, Date.now() + this.#clockOffset));
  }

  /**
   * renewSoon asks for a new token for the live connection after dueMs, but
   * not sooner than REFRESH_MIN_GAP_MS after the last ask.
   * @param {"expiring" | "refused"} reason
   * @param {number} dueMs
   */
  #renewSoon(reason, dueMs) {
    clearTimeout(this.#refreshTimer);
    // The gap is at most REFRESH_MIN_GAP_MS even when the client's clock
    // was set back since the last ask (the difference would be the jump).
    const wait = Math.max(dueMs, Math.min(REFRESH_MIN_GAP_MS, this.#renewAskedAt + REFRESH_MIN_GAP_MS - Date.now()));
    this.#refreshTimer = setTimeout(() => {
      this.#renewAskedAt = Date.now();
      void this.#newToken(reason);
    }, Math.min(MAX_TIMER_MS, Math.max(0, wait)));
  }

  /**
   * newToken asks getToken for a new token and uses it: in band on a live
   * connection, or for a new connection after token_expired.
   * @param {import("./rest.js").TokenReason} reason
   */
  async #newToken(reason) {
    if (this.#stopped) return;
    let tok;
    try {
      tok = await this.#tokens.renew(reason);
    } catch {
      // getToken did not answer within TOKEN_TIMEOUT_MS: asked again later.
      this.#tokenTimedOut(reason);
      return;
    }
    if (!tok || this.#stopped) {
      if (this.#expired && !this.#stopped) {
        // Given up: stopped for good (timers, reconciliations with the dead
        // token), so a later start() connects again with a new token.
        this.stop();
        this.#setState({ phase: "stopped", reason: "token_expired", code: 4001 });
      }
      return;
    }
    if (this.#expired) {
      // Through the backoff: a token the server keeps refusing must not
      // turn into a reconnect loop (the backoff resets once a connection
      // stays up).
      this.#expired = false;
      if (!this.#ws) this.#retry(null, "token_renewed");
      return;
    }
    if (this.live) {
      const frame = JSON.stringify({ type: "refresh", token: tok });
      if (new TextEncoder().encode(frame).length > SERVER_MAX_FRAME_BYTES) {
        // The server would close the socket with 1008 "frame too big": a
        // new connection carries the new token instead (its ticket request,
        // or its upgrade, takes it). Its subscribes recover what passes
        // between the two.
        const ws = this.#ws;
        this.#dropSocket();
        try { ws?.close(1000, "new token"); } catch { /* closing */ }
        void this.#connect();
        return;
      }
      this.#refreshFrame = frame;
      this.#sendRefresh(frame);
    }
  }

  /**
   * sendRefresh sends a refresh frame and notes when, so that its
   * refreshed answer measures the round trip (serverClockOffset).
   * @param {string} frame
   */
  #sendRefresh(frame) {
    this.#refreshSent = true;
    this.#refreshSentAt = Date.now();
    this.#sendText(frame);
  }

  /**
   * resendRefresh sends the latest refresh frame again after delayMs, on
   * the connection it was answered on: a new connection (its hello) or a
   * new token replaces the timer.
   * @param {number} delayMs
   */
  #resendRefresh(delayMs) {
    clearTimeout(this.#refreshTimer);
    const frame = this.#refreshFrame;
    this.#refreshTimer = setTimeout(() => {
      if (!this.live || this.#stopped) return;
      this.#sendRefresh(frame);
    }, Math.min(MAX_TIMER_MS, Math.max(0, delayMs)));
  }

  /**
   * tokenTimedOut: a getToken call that did not answer in time is asked
   * again, like any other failure: after token_expired through the
   * reconnect backoff (state `reconnecting`, reason `token_timeout`), for
   * the live connection (which keeps its credential meanwhile) after
   * REFRESH_MIN_GAP_MS.
   * @param {import("./rest.js").TokenReason} reason
   */
  #tokenTimedOut(reason) {
    if (this.#stopped) return;
    if (this.#expired) {
      const delay = backoffDelay(this.#attempt++);
      this.#setState({ phase: "reconnecting", retryAt: Date.now() + delay, reason: "token_timeout" });
      clearTimeout(this.#timer);
      this.#timer = setTimeout(() => void this.#newToken("expired"), delay);
      return;
    }
    if (this.live && (reason === "expiring" || reason === "refused")) this.#renewSoon(reason, REFRESH_MIN_GAP_MS);
  }

  /**
   * @param {number | null} advisedMs
   * @param {string} reason
   * @param {number} [code]
   */
  #retry(advisedMs, reason, code) {
    if (this.#stopped) return;
    // The server's advice is the least wait, not the whole of it: a server
    // that keeps closing at once with the same advice (or a ticket request
    // that keeps answering Retry-After) is retried ever later, like any
    // other failure, until a connection stays up.
    const backoff = backoffDelay(this.#attempt);
    const delay = Math.min(MAX_TIMER_MS, advisedMs !== null ? Math.max(advisedMs, backoff) : backoff);
    this.#attempt++;
    /** @type {State} */
    const s = { phase: "reconnecting", retryAt: Date.now() + delay, reason };
    if (code !== undefined) s.code = code;
    this.#setState(s);
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => void this.#connect(), delay);
  }

  /**
   * @param {object} obj
   * @returns {boolean} whether it went out
   */
  #send(obj) {
    return this.#sendText(JSON.stringify(obj));
  }

  /**
   * @param {string} text
   * @returns {boolean} whether it went out
   */
  #sendText(text) {
    const ws = this.#ws;
    if (!ws || ws.readyState !== 1) return false;
    ws.send(text);
    return true;
  }
}
