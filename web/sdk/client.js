// HanClient: one object for an application — REST calls and the realtime
// connection sharing one token source.
import { Rest, Tokens } from "./rest.js";
import { Realtime } from "./realtime.js";

/**
 * @typedef {object} ClientOptions
 * @property {string} baseUrl the API origin, e.g. "https://chat.example.com"
 * @property {import("./rest.js").GetToken} getToken gives a user JWT: the first one, and a new
 *   one whenever the current one expires or was refused; null gives up
 * @property {string} [realtimeUrl] default: baseUrl with ws(s): and /v1/realtime
 * @property {"ticket" | "bearer"} [auth] how the socket authenticates: a one-use ticket fetched
 *   with the token (default; browsers), or the token on the upgrade request (Node with ws)
 * @property {import("./realtime.js").WebSocketCtor} [WebSocket] default: globalThis.WebSocket
 * @property {typeof fetch} [fetch] default: globalThis.fetch
 * @property {number} [gapGraceMs] how long a seq gap may stay open before REST fills it (500 ms)
 * @property {Record<string, string>} [headers] extra WebSocket upgrade headers (Node with ws only):
 *   a ticket connection needs an allowed Origin, which browsers send themselves
 */

export class HanClient {
  /**
   * @param {ClientOptions} opts
   */
  constructor(opts) {
    this.tokens = new Tokens(opts.getToken);
    this.rest = new Rest(opts.baseUrl, this.tokens, opts.fetch);
    const url = opts.realtimeUrl || `${opts.baseUrl.replace(/\/+$/, "").replace(/^http/, "ws")}/v1/realtime`;
    /** @type {import("./realtime.js").RealtimeOptions} */
    const rtOpts = { url };
    if (opts.headers) rtOpts.headers = opts.headers;
    if (opts.auth) rtOpts.auth = opts.auth;
    if (opts.WebSocket) rtOpts.WebSocket = opts.WebSocket;
    if (opts.gapGraceMs !== undefined) rtOpts.gapGraceMs = opts.gapGraceMs;
    this.realtime = new Realtime(rtOpts, this.rest, this.tokens);
  }

  /** connect opens the realtime connection and keeps it up until close. */
  connect() {
    this.realtime.start();
  }

  close() {
    this.realtime.stop();
  }

  /**
   * on: shorthand for realtime.on.
   * @template {keyof import("./realtime.js").RealtimeEvents} K
   * @param {K} type
   * @param {(value: import("./realtime.js").RealtimeEvents[K]) => void} fn
   */
  on(type, fn) {
    return this.realtime.on(type, fn);
  }

  /**
   * @param {string} dialogId
   * @param {{sinceSeq?: number}} [opts]
   */
  subscribe(dialogId, opts) {
    this.realtime.subscribe(dialogId, opts);
  }

  /** @param {string} dialogId */
  unsubscribe(dialogId) {
    this.realtime.unsubscribe(dialogId);
  }

  /** @param {string} dialogId */
  typing(dialogId) {
    this.realtime.typing(dialogId);
  }

  /**
   * @param {string} dialogId
   * @param {string} body
   * @param {Parameters<Rest["send"]>[2]} [opts]
   */
  send(dialogId, body, opts) {
    return this.rest.send(dialogId, body, opts);
  }

  /**
   * @param {string} dialogId
   * @param {Parameters<Rest["history"]>[1]} [q]
   */
  history(dialogId, q) {
    return this.rest.history(dialogId, q);
  }

  /**
   * @param {string} dialogId
   * @param {Parameters<Rest["historyPages"]>[1]} [opts]
   */
  historyPages(dialogId, opts) {
    return this.rest.historyPages(dialogId, opts);
  }

  /** @param {string} userId */
  presence(userId) {
    return this.rest.presence(userId);
  }
}
