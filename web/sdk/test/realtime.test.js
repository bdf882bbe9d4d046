// Realtime's connection handling without a server: a fake socket and mocked
// timers show what the client sends and when it gives up.
import { test, mock, afterEach } from "node:test";
import assert from "node:assert/strict";
import { ApiError, CloseError } from "../errors.js";
import { Tokens } from "../rest.js";
import { CONNECT_TIMEOUT_MS, FrameBudget, Realtime, SUBSCRIBE_BURST, SUBSCRIBE_PER_SEC } from "../realtime.js";

// The server's inbound budget (docs/realtime-protocol.md, "Limits").
const SERVER_BURST = 60;
const SERVER_PER_SEC = 20;

class FakeSocket {
  /** @type {FakeSocket[]} */
  static all = [];
  readyState = 1;
  /** @type {{at: number, frame: any}[]} */
  sent = [];
  /** @type {{code?: number, reason?: string} | null} */
  closed = null;
  /** @type {((ev: {data: any}) => void) | null} */
  onmessage = null;
  /** @type {((ev: {code: number, reason: string}) => void) | null} */
  onclose = null;
  /** @type {((ev: any) => void) | null} */
  onerror = null;

  constructor() {
    FakeSocket.all.push(this);
  }

  /** @param {string} data */
  send(data) {
    this.sent.push({ at: Date.now(), frame: JSON.parse(data) });
  }

  /**
   * @param {number} [code]
   * @param {string} [reason]
   */
  close(code, reason) {
    this.closed = { code, reason };
    this.readyState = 3;
  }

  hello() {
    this.onmessage?.({ data: JSON.stringify({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 25000, expiresAt: Date.now() + 3600e3 }) });
  }

  /** @param {string} type */
  frames(type) {
    return this.sent.filter((s) => s.frame.type === type);
  }
}

/** lets the client's pending promises (token, ticket) settle; setImmediate is not mocked */
const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
};

/**
 * @param {{auth?: "ticket" | "bearer", ticket?: () => Promise<any>}} [opts]
 */
function realtime(opts = {}) {
  const tokens = new Tokens(() => "token");
  const rest = /** @type {any} */ ({ ticket: opts.ticket || (async () => ({ ticket: "t", expiresAt: 0 })) });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: opts.auth || "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, tokens);
  /** @type {any[]} */
  const states = [];
  /** @type {Error[]} */
  const errors = [];
  rt.on("state", (s) => states.push(s));
  rt.on("error", (e) => errors.push(e));
  return { rt, states, errors };
}

/** @param {number} n */
const ids = (n) => Array.from({ length: n }, (_, i) => `d${i}`);

/**
 * serverRoom: the fewest frames the server's bucket held in reserve while
 * these frames arrived (below 0: the server closed with 1008 frame rate).
 * @param {{at: number}[]} sent
 */
function serverRoom(sent) {
  let tokens = SERVER_BURST;
  let at = sent.length ? sent[0].at : 0;
  let least = tokens;
  for (const s of sent) {
    tokens = Math.min(SERVER_BURST, tokens + ((s.at - at) * SERVER_PER_SEC) / 1000) - 1;
    at = s.at;
    least = Math.min(least, tokens);
  }
  return least;
}

afterEach(() => {
  mock.timers.reset();
  FakeSocket.all = [];
});

test("a user in 200 dialogs is resubscribed after hello within the server's frame budget, with room to spare", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  for (const id of ids(200)) rt.subscribe(id, { sinceSeq: 0 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  assert.equal(ws.frames("subscribe").length, SUBSCRIBE_BURST, "the first burst");
  const fullAfter = Math.ceil(((200 - SUBSCRIBE_BURST) / SUBSCRIBE_PER_SEC) * 1000);
  for (let t = 0; t < fullAfter + 1000; t += 100) mock.timers.tick(100);
  const subs = ws.frames("subscribe").map((s) => s.frame.dialogId);
  assert.deepEqual(subs, ids(200), "every dialog once, in order");
  assert.ok(ws.frames("subscribe").every((s) => s.frame.sinceSeq === 0));
  const room = serverRoom(ws.sent);
  assert.ok(room >= SERVER_BURST - SUBSCRIBE_BURST, `the server's bucket went down to ${room} frames`);
  assert.equal(rt.state.phase, "live");
  rt.stop();
});

test("subscribe and unsubscribe while live share the pace; a subscribe still waiting is dropped by its unsubscribe", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  for (const id of ids(100)) rt.subscribe(id);
  assert.equal(ws.frames("subscribe").length, SUBSCRIBE_BURST);
  rt.unsubscribe("d0"); // already sent: an unsubscribe frame, after the waiting ones
  rt.unsubscribe("d99"); // still waiting: never sent
  for (let t = 0; t < 10000; t += 100) mock.timers.tick(100);
  const sent = ws.sent.map((s) => `${s.frame.type} ${s.frame.dialogId}`);
  assert.deepEqual(sent, [...ids(99).map((id) => `subscribe ${id}`), "unsubscribe d0"]);
  assert.ok(serverRoom(ws.sent) >= SERVER_BURST - SUBSCRIBE_BURST);
  rt.stop();
});

test("the frame budget allows a burst, then its rate", () => {
  const b = new FrameBudget(3, 10, 0);
  assert.deepEqual([b.take(0), b.take(0), b.take(0)], [0, 0, 0]);
  assert.equal(b.take(0), 100, "the next frame in 100 ms");
  assert.equal(b.take(50), 50);
  assert.equal(b.take(100), 0);
  assert.equal(b.take(10_000), 0, "idle time refills up to the burst only");
  assert.equal(b.take(10_000), 0);
  assert.equal(b.take(10_000), 0);
  assert.ok(b.take(10_000) > 0);
});

test("a connection whose hello does not come within the connect timeout is closed with 4000 and retried", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt, states, errors } = realtime();
  rt.start();
  await settle();
  const first = FakeSocket.all[0];
  mock.timers.tick(CONNECT_TIMEOUT_MS - 1);
  assert.equal(first.closed, null);
  assert.equal(rt.state.phase, "connecting");
  mock.timers.tick(1);
  assert.deepEqual(first.closed, { code: 4000, reason: "no hello" });
  assert.equal(rt.state.phase, "reconnecting");
  assert.ok(errors.some((e) => e instanceof CloseError && e.code === 4000), "the close is reported");
  mock.timers.tick(30_000); // the backoff
  await settle();
  assert.equal(FakeSocket.all.length, 2, "a second attempt");
  // The late close event of the abandoned socket changes nothing.
  first.onclose?.({ code: 1006, reason: "" });
  FakeSocket.all[1].hello();
  mock.timers.tick(CONNECT_TIMEOUT_MS * 2);
  assert.equal(FakeSocket.all[1].closed, null, "a connection that said hello is kept");
  assert.equal(rt.state.phase, "live");
  assert.equal(states.filter((s) => s.phase === "reconnecting").length, 1);
  rt.stop();
});

test("a ticket refused with a 4xx stops the client; 408 and 429 are retried", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  for (const [status, code, phase] of /** @type {const} */ ([
    [403, "user_session_required", "stopped"], [404, "not_found", "stopped"],
    [408, "http_408", "reconnecting"], [429, "rate_limited", "reconnecting"], [503, "redis_unavailable", "reconnecting"],
  ])) {
    let asked = 0;
    const { rt, errors } = realtime({ auth: "ticket", ticket: async () => { asked++; throw new ApiError(code, status); } });
    rt.start();
    await settle();
    assert.equal(rt.state.phase, phase, `${status}`);
    if (phase === "stopped") {
      assert.equal(rt.state.reason, code);
      assert.ok(errors.some((e) => e instanceof ApiError && e.status === status), "the refusal is reported");
      mock.timers.tick(60_000);
      await settle();
      assert.equal(asked, 1, `${status}: no second ticket request`);
    }
    rt.stop();
  }
});

test("1008 frame rate reconnects with backoff; the other 1008 closes stop the client", async () => {
  assert.equal(new CloseError(1008, "frame rate").fatal, false);
  assert.equal(new CloseError(1008, "frame too big").fatal, true);
  assert.equal(new CloseError(1008, "too_many_connections").fatal, true);
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  rt.start();
  await settle();
  FakeSocket.all[0].hello();
  FakeSocket.all[0].onclose?.({ code: 1008, reason: "frame rate" });
  assert.equal(rt.state.phase, "reconnecting");
  assert.equal(rt.state.code, 1008);
  mock.timers.tick(30_000);
  await settle();
  FakeSocket.all[1].hello();
  FakeSocket.all[1].onclose?.({ code: 1008, reason: "frame too big" });
  assert.equal(rt.state.phase, "stopped");
  rt.stop();
});
