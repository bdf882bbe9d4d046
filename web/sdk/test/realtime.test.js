// Realtime's connection handling without a server: a fake socket and mocked
// timers show what the client sends and when it gives up.
import { test, mock, afterEach } from "node:test";
import assert from "node:assert/strict";
import { ApiError, CLIENT_CODES, CloseError, FrameError } from "../errors.js";
import { Rest, Tokens } from "../rest.js";
import { WebSocket, WebSocketServer } from "ws";
import { CONNECT_TIMEOUT_MS, FrameBudget, MAX_FRAME_BYTES, Realtime, REFRESH_AHEAD_MS, SERVER_MAX_FRAME_BYTES, SUBPROTOCOL, SUBSCRIBE_BURST, SUBSCRIBE_PER_SEC } from "../realtime.js";

// The server's inbound budget (docs/realtime-protocol.md, "Limits").
const SERVER_BURST = 60;
const SERVER_PER_SEC = 20;

class FakeSocket {
  /** @type {FakeSocket[]} */
  static all = [];
  readyState = 1;
  /** @type {{at: number, raw: string, frame: any}[]} */
  sent = [];
  /** @type {string} */
  url;
  /** @type {{headers?: Record<string, string>}} */
  opts;
  /** @type {{code?: number, reason?: string} | null} */
  closed = null;
  /** @type {((ev: {data: any}) => void) | null} */
  onmessage = null;
  /** @type {((ev: {code: number, reason: string}) => void) | null} */
  onclose = null;
  /** @type {((ev: any) => void) | null} */
  onerror = null;

  /**
   * @param {string} url
   * @param {string} _protocol
   * @param {{headers?: Record<string, string>}} [opts]
   */
  constructor(url, _protocol, opts = {}) {
    this.url = url;
    this.opts = opts;
    FakeSocket.all.push(this);
  }

  /** @param {string} data */
  send(data) {
    this.sent.push({ at: Date.now(), raw: data, frame: JSON.parse(data) });
  }

  /** @param {object} f a frame from the server */
  recv(f) {
    this.onmessage?.({ data: JSON.stringify(f) });
  }

  /**
   * @param {number} [code]
   * @param {string} [reason]
   */
  close(code, reason) {
    this.closed = { code, reason };
    this.readyState = 3;
  }

  /** @param {number} [expiresIn] ms until the connection's credential expires */
  hello(expiresIn = 3600e3) {
    this.recv({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 25000, expiresAt: Date.now() + expiresIn });
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
 * @param {{auth?: "ticket" | "bearer", ticket?: (opts?: {signal?: AbortSignal}) => Promise<any>,
 *   tokens?: Tokens, historyPages?: (id: string, opts: {afterSeq: number}) => AsyncGenerator<any[]>}} [opts]
 */
function realtime(opts = {}) {
  const tokens = opts.tokens || new Tokens(() => "token");
  const rest = /** @type {any} */ ({
    ticket: opts.ticket || (async () => ({ ticket: "t", expiresAt: 0 })),
    historyPages: opts.historyPages || (async function* () { yield []; }),
  });
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

// ---- a hostile or broken server ----------------------------------------------------------

/** real time passes (the timers that are not mocked) */
const wait = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

test("a Retry-After beyond what a timer can hold delays the next ticket request, never to 1 ms", async () => {
  let asked = 0;
  const { rt } = realtime({ auth: "ticket", ticket: async () => { asked++; throw new ApiError("rate_limited", 429, 3e9); } });
  rt.start();
  await wait(150);
  const left = (rt.state.retryAt ?? 0) - Date.now();
  rt.stop();
  assert.equal(asked, 1, "one ticket request in 150 ms");
  assert.ok(left > 0 && left <= 5 * 60000 + 1000, `next attempt in ${left} ms`);
});

test("a server that closes with retryMs right after every hello is retried with growing backoff, first after its advice", async () => {
  for (const code of [1001, 1013]) {
    mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
    mock.method(Math, "random", () => 0.5);
    const { rt } = realtime();
    rt.start();
    await settle();
    /** @type {number[]} */
    const delays = [];
    for (let i = 0; i < 10; i++) {
      const ws = FakeSocket.all.at(-1);
      assert.ok(ws && !ws.closed, `attempt ${i + 1} opened a socket`);
      ws.hello();
      ws.onclose?.({ code, reason: '{"retryMs":200}' });
      assert.equal(rt.state.phase, "reconnecting");
      const delay = (rt.state.retryAt ?? 0) - Date.now();
      delays.push(delay);
      mock.timers.tick(delay);
      await settle();
    }
    rt.stop();
    mock.restoreAll();
    mock.timers.reset();
    FakeSocket.all = [];
    assert.equal(delays[0], 200 + 500, `${code}: the first wait is the advice plus jitter`);
    assert.ok(delays.every((d) => d >= 700), `${code}: never sooner than the advice: ${delays}`);
    assert.ok(delays[9] >= 15000, `${code}: the tenth wait has backed off: ${delays}`);
  }
});

test("a heartbeatMs a timer cannot hold, or of 1 ms, does not make the client ping in a loop", async () => {
  for (const heartbeatMs of [1e12, 1]) {
    const { rt } = realtime();
    rt.start();
    await settle();
    const ws = FakeSocket.all.at(-1);
    assert.ok(ws);
    ws.onmessage?.({ data: JSON.stringify({ type: "hello", connectionId: "c", instance: "i", heartbeatMs, expiresAt: Date.now() + 3600e3 }) });
    await wait(100);
    const pings = ws.frames("ping").length;
    rt.stop();
    FakeSocket.all = [];
    assert.equal(pings, 0, `heartbeatMs ${heartbeatMs}: ${pings} pings in 100 ms`);
  }
});

test("a second hello on the same socket starts no second ping timer and resubscribes nothing", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  rt.subscribe("d1", { sinceSeq: 0 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  ws.hello();
  mock.timers.tick(25000);
  assert.equal(ws.frames("ping").length, 1, "one ping per heartbeat");
  assert.equal(ws.frames("subscribe").length, 1, "one subscribe");
  rt.stop();
});

test("a seq gap REST cannot fill is read again with backoff, not every 500 ms; once REST has the messages they arrive", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  let reads = 0;
  /** @type {any[]} */
  let stored = [];
  const rest = /** @type {any} */ ({
    ticket: async () => ({ ticket: "t", expiresAt: 0 }),
    async *historyPages(/** @type {string} */ _id, /** @type {{afterSeq: number}} */ { afterSeq }) {
      reads++;
      yield stored.filter((m) => m.seq > afterSeq);
    },
  });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, new Tokens(() => "token"));
  /** @type {number[]} */
  const got = [];
  rt.on("message", ({ message }) => got.push(message.seq));
  rt.subscribe("d", { sinceSeq: 0 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  ws.onmessage?.({ data: JSON.stringify({ type: "subscribed", dialogId: "d", lastSeq: 0, recovered: true }) });
  const msg = (/** @type {number} */ seq) => ({ id: `m${seq}`, dialogId: "d", seq, senderId: "u", body: `b${seq}`, createdAt: 0, attachments: [] });
  ws.onmessage?.({ data: JSON.stringify({ type: "event", channel: "c", id: "e5", event: "message.created", entityId: "m5", dialogId: "d", seq: 5, data: msg(5) }) });
  for (let t = 0; t < 60000; t += 100) {
    mock.timers.tick(100);
    await settle();
  }
  assert.ok(reads >= 2 && reads <= 10, `${reads} REST reads in a minute`);
  assert.deepEqual(got, []);
  stored = [1, 2, 3, 4, 5].map(msg);
  for (let t = 0; t < 60000 && got.length < 5; t += 100) {
    mock.timers.tick(100);
    await settle();
  }
  assert.deepEqual(got, [1, 2, 3, 4, 5], "the gap is filled");
  rt.stop();
});

test("a credential that keeps ending within a minute, or a refresh the server keeps refusing, is renewed at most every 10 s", async () => {
  for (const answer of ["refreshed", "error"]) {
    mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
    let asked = 0;
    const tokens = new Tokens(() => { asked++; return `token${asked}`; });
    tokens.set("token0");
    const rest = /** @type {any} */ ({ ticket: async () => ({ ticket: "t", expiresAt: 0 }) });
    const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, tokens);
    rt.on("error", () => {});
    rt.start();
    await settle();
    const ws = FakeSocket.all[0];
    // Credentials that last 30 s (a short-lived token, or a server that
    // says so), then every refresh answered with another 30 s, or refused.
    ws.onmessage?.({ data: JSON.stringify({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 25000, expiresAt: Date.now() + 30000 }) });
    let answered = 0;
    for (let t = 0; t < 20000; t += 100) {
      mock.timers.tick(100);
      await settle();
      for (; answered < ws.frames("refresh").length; answered++) {
        const f = answer === "refreshed" ? { type: "refreshed", expiresAt: Date.now() + 30000 } : { type: "error", error: "unauthorized" };
        ws.onmessage?.({ data: JSON.stringify(f) });
      }
      await settle();
    }
    const phase = rt.state.phase;
    rt.stop();
    mock.timers.reset();
    FakeSocket.all = [];
    assert.ok(asked >= 2 && asked <= 3, `${answer}: getToken was asked ${asked} times in 20 s`);
    assert.equal(phase, "live", answer);
  }
});

test("a refresh answered rate_limited is sent again with the same token after the advised wait, without asking for another token", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  let asked = 0;
  const tokens = new Tokens(() => { asked++; return `token${asked}`; });
  tokens.set("token0");
  const rest = /** @type {any} */ ({ ticket: async () => ({ ticket: "t", expiresAt: 0 }) });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, tokens);
  /** @type {string[]} */
  const errors = [];
  rt.on("error", (e) => errors.push(e instanceof FrameError ? e.code : String(e)));
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello(90e3); // the refresh is due in 30 s
  mock.timers.tick(30000);
  await settle();
  assert.deepEqual(ws.frames("refresh").map((s) => s.frame.token), ["token1"]);
  ws.recv({ type: "error", error: "rate_limited", retryMs: 20000 });
  await settle();
  mock.timers.tick(19900);
  await settle();
  const early = ws.frames("refresh").length;
  mock.timers.tick(1200); // the advice plus at most 1 s of jitter
  await settle();
  const refreshes = ws.frames("refresh").map((s) => s.frame.token);
  ws.recv({ type: "refreshed", expiresAt: Date.now() + 3600e3 });
  await settle();
  const phase = rt.state.phase;
  const closed = ws.closed;
  rt.stop();
  mock.timers.reset();
  FakeSocket.all = [];
  assert.equal(early, 1, "sent again before the advised wait");
  assert.deepEqual(refreshes, ["token1", "token1"]);
  assert.equal(asked, 1, "getToken asked again");
  assert.deepEqual(errors, ["rate_limited"]);
  assert.equal(phase, "live");
  assert.equal(closed, null, "the socket was closed");
});

test("stop and start while a ticket request is under way leave one socket, and frames of a socket given up change nothing", async () => {
  /** @type {((v: any) => void)[]} */
  const pending = [];
  const { rt } = realtime({ auth: "ticket", ticket: () => new Promise((r) => pending.push(r)) });
  rt.start();
  await settle();
  rt.stop();
  rt.start();
  await settle();
  for (const r of pending) r({ ticket: "t", expiresAt: 0 });
  await settle();
  const open = FakeSocket.all.filter((s) => !s.closed);
  assert.equal(open.length, 1, `${open.length} sockets open`);
  rt.stop();
  FakeSocket.all = [];

  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const late = realtime();
  late.rt.start();
  // The socket (and its connect timer, armed with it) comes after the
  // token's promise chain: wait for it rather than for a fixed number of turns.
  for (let i = 0; i < 50 && FakeSocket.all.length === 0; i++) await settle();
  const first = FakeSocket.all[0];
  assert.ok(first, "no socket was opened");
  mock.timers.tick(CONNECT_TIMEOUT_MS); // given up: no hello in time
  assert.equal(late.rt.state.phase, "reconnecting");
  first.hello(); // arrives after all
  assert.equal(late.rt.state.phase, "reconnecting", "a hello on the abandoned socket does not make the client live");
  late.rt.stop();
});

test("a frame over MAX_FRAME_BYTES from the server ends the socket and the client reconnects", async () => {
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0, handleProtocols: () => SUBPROTOCOL });
  await new Promise((r) => wss.once("listening", r));
  let connections = 0;
  wss.on("connection", (sock) => {
    connections++;
    sock.send(JSON.stringify({ type: "hello", connectionId: `c${connections}`, instance: "i", heartbeatMs: 25000, expiresAt: Date.now() + 3600e3 }));
    if (connections === 1) sock.send(JSON.stringify({ type: "pong", pad: "x".repeat(MAX_FRAME_BYTES) }));
  });
  const { port } = /** @type {import("node:net").AddressInfo} */ (wss.address());
  const rt = new Realtime({ url: `ws://127.0.0.1:${port}/v1/realtime`, auth: "bearer", WebSocket: /** @type {any} */ (WebSocket) },
    /** @type {any} */ ({}), new Tokens(() => "token"));
  /** @type {number[]} */
  const closes = [];
  rt.on("error", (e) => { if (e instanceof CloseError) closes.push(e.code); });
  const second = new Promise((resolve) => rt.on("state", (s) => { if (s.phase === "live" && connections === 2) resolve(null); }));
  rt.start();
  try {
    await Promise.race([second, new Promise((_, reject) => setTimeout(() => reject(new Error(`no second connection; closes ${closes}`)), 10000))]);
    // ws answers the frame with 1009 and drops the connection, so the local
    // close reads 1006 (abnormal).
    assert.equal(closes.length, 1, `one socket ended: ${closes}`);
    assert.ok([1006, 1009].includes(closes[0]), `the oversized frame ended the first socket: ${closes}`);
  } finally {
    rt.stop();
    wss.close();
  }
});

test("after token_expired and a getToken that gives up, the client is stopped for good and start() connects again", async () => {
  let answer = /** @type {string | null} */ (null);
  const reasons = /** @type {string[]} */ ([]);
  const tokens = new Tokens(({ reason }) => {
    reasons.push(reason);
    return reason === "initial" ? "t1" : answer;
  });
  const rest = /** @type {any} */ ({ ticket: async () => ({ ticket: "t", expiresAt: 0 }) });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, tokens);
  rt.start();
  for (let i = 0; i < 50 && FakeSocket.all.length === 0; i++) await settle();
  const first = FakeSocket.all[0];
  first.hello();
  first.readyState = 3;
  first.onclose?.({ code: 4001, reason: "token_expired" });
  for (let i = 0; i < 20 && rt.state.phase !== "stopped"; i++) await settle();
  assert.equal(rt.state.phase, "stopped");
  assert.equal(rt.state.reason, "token_expired");
  assert.equal(FakeSocket.all.length, 1, "no reconnect with the expired token");

  answer = "t2";
  rt.start();
  for (let i = 0; i < 50 && FakeSocket.all.length === 1; i++) await settle();
  assert.equal(FakeSocket.all.length, 2, "start() after the client gave up opens a new connection");
  rt.stop();
});

test("a resync of every dialog reads at most 4 dialogs over REST at once, and reads each of them", async () => {
  let inFlight = 0;
  let most = 0;
  const read = new Set();
  const rest = /** @type {any} */ ({
    ticket: async () => ({ ticket: "t", expiresAt: 0 }),
    async *historyPages(/** @type {string} */ id) {
      inFlight++;
      most = Math.max(most, inFlight);
      await new Promise((r) => setTimeout(r, 5));
      inFlight--;
      read.add(id);
      yield [];
    },
  });
  const rt = new Realtime({ url: "ws://gateway/v1/realtime", auth: "bearer", WebSocket: /** @type {any} */ (FakeSocket) }, rest, new Tokens(() => "token"));
  for (const id of ids(200)) rt.subscribe(id, { sinceSeq: 0 });
  rt.start();
  for (let i = 0; i < 50 && FakeSocket.all.length === 0; i++) await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  ws.onmessage?.({ data: JSON.stringify({ type: "resync", reason: "pubsub_reconnect" }) });
  for (let i = 0; i < 2000 && read.size < 200; i++) await new Promise((r) => setTimeout(r, 1));
  assert.equal(read.size, 200, "every dialog is reconciled");
  assert.ok(most <= 4, `${most} REST reads at once`);
  rt.stop();
});

// ---- subscribe answers, connection steps, tokens ---------------------------------------------

/**
 * pass lets ms of mocked time go by in steps, letting promises settle, and
 * answers the client's pings, so a connection stays up however long.
 * @param {number} ms
 * @param {FakeSocket | undefined} [ws]
 * @param {(ws: FakeSocket) => void} [each] called after every step
 */
async function pass(ms, ws, each) {
  for (let t = 0; t < ms; t += 100) {
    mock.timers.tick(100);
    await settle();
    if (ws) {
      for (const p of ws.frames("ping")) if (!p.frame.answered) { p.frame.answered = true; ws.recv({ type: "pong" }); }
      each?.(ws);
    }
  }
}

/**
 * socketAfter lets mocked time go by until the client has opened its n-th
 * socket (at most maxMs), and returns it.
 * @param {number} n
 * @param {number} maxMs
 * @param {FakeSocket} [ws] a connection to keep up meanwhile
 */
async function socketAfter(n, maxMs, ws) {
  for (let t = 0; t < maxMs && FakeSocket.all.length < n; t += 100) await pass(100, ws);
  const s = FakeSocket.all[n - 1];
  assert.ok(s, `no socket ${n} within ${maxMs} ms`);
  return s;
}

test("a subscribe refused as unavailable is sent again with a growing, bounded backoff until subscribed; one refused as not a member is no longer followed", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt, errors } = realtime();
  rt.subscribe("d0", { sinceSeq: 5 });
  rt.subscribe("d1");
  rt.subscribe("d2", { sinceSeq: 0 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  assert.deepEqual(ws.frames("subscribe").map((s) => s.frame.dialogId), ["d0", "d1", "d2"]);
  // One answer per subscribe, in their order; error frames name no dialog.
  // The error of another frame (a typing before its subscribe was answered)
  // comes between them.
  ws.recv({ type: "error", error: "unavailable" });
  ws.recv({ type: "error", error: "not_subscribed" });
  ws.recv({ type: "subscribed", dialogId: "d1", lastSeq: 3 });
  ws.recv({ type: "error", error: "dialog_not_found" });
  const refusals = () => errors.filter((e) => e instanceof FrameError && e.dialogId).map((e) => `${/** @type {FrameError} */ (e).code} ${/** @type {FrameError} */ (e).dialogId}`);
  assert.deepEqual(refusals(), ["unavailable d0", "dialog_not_found d2"], "each refusal names its dialog");
  assert.ok(errors.some((e) => e instanceof FrameError && e.code === "not_subscribed" && e.dialogId === undefined));
  assert.equal(rt.known("d2"), null, "d2 is no longer followed");

  // d0 is asked for again while the server keeps answering unavailable.
  /** @type {number[]} */
  const d0At = [ws.frames("subscribe")[0].at]; // refused at once
  const answer = (/** @type {FakeSocket} */ s, /** @type {object} */ f) => {
    for (const sub of s.frames("subscribe")) {
      if (sub.frame.answered) continue;
      sub.frame.answered = true;
      if (sub.frame.dialogId === "d0") d0At.push(sub.at);
      s.recv(f);
    }
  };
  ws.frames("subscribe").forEach((x) => { x.frame.answered = true; });
  await pass(5 * 60000, ws, (s) => answer(s, { type: "error", error: "unavailable" }));
  assert.equal(rt.state.phase, "live");
  assert.ok(d0At.length >= 8, `d0 was subscribed again ${d0At.length} times in 5 min`);
  const gaps = d0At.slice(1).map((t, i) => t - d0At[i]);
  assert.ok(gaps.every((g) => g >= 400 && g <= 30000), `the waits stay within 0.5–30 s: ${gaps}`);
  assert.ok(gaps[0] >= 500 && gaps[0] <= 1000, `the first wait is 0.5–1 s: ${gaps}`);
  assert.ok((gaps.at(-1) ?? 0) >= 15000, `the waits grew: ${gaps}`);
  assert.ok(ws.frames("subscribe").every((s) => s.frame.dialogId === "d0" ? s.frame.sinceSeq === 5 : true), "with its sinceSeq");
  assert.ok(!ws.frames("subscribe").slice(3).some((s) => s.frame.dialogId !== "d0"), "only d0 is sent again");

  // Subscribed at last: nothing more is sent.
  await pass(30000, ws, (s) => answer(s, { type: "subscribed", dialogId: "d0", lastSeq: 5, recovered: true }));
  const sent = ws.frames("subscribe").length;
  await pass(60000, ws);
  assert.equal(ws.frames("subscribe").length, sent, "no subscribe after subscribed");

  // A new connection subscribes the followed dialogs (not d2), and the
  // backoff starts over.
  ws.readyState = 3;
  ws.onclose?.({ code: 1006, reason: "" });
  const ws2 = await socketAfter(2, 30000);
  ws2.hello();
  assert.deepEqual(ws2.frames("subscribe").map((s) => s.frame.dialogId), ["d0", "d1"]);
  ws2.recv({ type: "error", error: "unavailable" });
  ws2.recv({ type: "subscribed", dialogId: "d1", lastSeq: 3, recovered: true });
  ws2.frames("subscribe").forEach((x) => { x.frame.answered = true; });
  await pass(1000, ws2);
  assert.equal(ws2.frames("subscribe").length, 3, "d0 again within a second of its first refusal since it was subscribed");
  rt.stop();
});

test("a ticket request or getToken that never answers is given up after the connect timeout, and the client connects again", async () => {
  for (const auth of /** @type {const} */ (["ticket", "bearer"])) {
    mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
    /** @type {(AbortSignal | undefined)[]} */
    const signals = [];
    /** @type {(t: string) => void} */
    let giveToken = () => {};
    const { rt } = realtime({
      auth,
      // The first ticket request never answers (a connection black-holed
      // after a network switch); the ones after it do.
      ticket: (opts) => { signals.push(opts?.signal); return signals.length === 1 ? new Promise(() => {}) : Promise.resolve({ ticket: "t", expiresAt: 0 }); },
      // getToken answers only much later.
      tokens: new Tokens(() => new Promise((r) => { giveToken = r; })),
    });
    rt.start();
    await settle();
    await pass(CONNECT_TIMEOUT_MS - 100);
    assert.equal(rt.state.phase, "connecting", auth);
    await pass(100);
    assert.equal(rt.state.phase, "reconnecting", `${auth}: given up after CONNECT_TIMEOUT_MS`);
    assert.equal(rt.state.reason, "connect_timeout");
    if (auth === "ticket") assert.equal(signals[0]?.aborted, true, "the hung ticket request is aborted");
    else giveToken("late");
    const ws = await socketAfter(1, 60000);
    if (auth === "bearer") assert.equal(ws.opts.headers?.Authorization, "Bearer late");
    ws.hello();
    assert.equal(rt.state.phase, "live", auth);
    rt.stop();
    mock.timers.reset();
    FakeSocket.all = [];
  }
});

test("reconnectNow starts an attempt still connecting anew, and leaves a live connection alone", async () => {
  /** @type {AbortSignal[]} */
  const signals = [];
  const { rt } = realtime({ auth: "ticket", ticket: (opts) => { signals.push(/** @type {AbortSignal} */ (opts?.signal)); return signals.length === 1 ? new Promise(() => {}) : Promise.resolve({ ticket: "t", expiresAt: 0 }); } });
  rt.start();
  await settle();
  assert.equal(rt.state.phase, "connecting");
  rt.reconnectNow(); // e.g. the browser's online event
  await settle();
  assert.equal(signals.length, 2, "a second ticket request");
  assert.equal(signals[0].aborted, true, "the first one is given up");
  assert.equal(FakeSocket.all.length, 1);
  rt.reconnectNow(); // a socket waiting for its hello
  await settle();
  assert.equal(FakeSocket.all.length, 2);
  assert.deepEqual(FakeSocket.all[0].closed, { code: 4000, reason: "retry" });
  FakeSocket.all[1].hello();
  rt.reconnectNow();
  await settle();
  assert.equal(FakeSocket.all.length, 2, "a live connection is kept");
  assert.equal(rt.state.phase, "live");
  rt.stop();
});

test("a new token too large for a refresh frame is not sent in band: the client reconnects with it", async () => {
  for (const auth of /** @type {const} */ (["bearer", "ticket"])) {
    mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
    // A JWT of about 5 KiB (many claims): the upgrade and REST take tokens
    // up to 8 KiB, a client frame is at most 4 KiB.
    const big = `eyJ.${"a".repeat(5000)}.sig`;
    let tickets = 0;
    const tokens = new Tokens(({ reason }) => (reason === "initial" ? "small" : big));
    const { rt } = realtime({ auth, tokens, ticket: async () => { tickets++; return { ticket: `t${tickets}`, expiresAt: 0 }; } });
    rt.subscribe("d", { sinceSeq: 7 });
    rt.start();
    for (let i = 0; i < 50 && FakeSocket.all.length === 0; i++) await settle();
    const ws = FakeSocket.all[0];
    ws.hello(90e3); // the refresh is due in 30 s
    ws.recv({ type: "subscribed", dialogId: "d", lastSeq: 7, recovered: true });
    const ws2 = await socketAfter(2, 40000, ws);
    const tooBig = ws.sent.filter((s) => Buffer.byteLength(s.raw) > SERVER_MAX_FRAME_BYTES);
    assert.deepEqual(tooBig.map((s) => s.frame.type), [], `${auth}: no frame over the server's limit`);
    assert.deepEqual(ws.closed, { code: 1000, reason: "new token" }, auth);
    if (auth === "bearer") assert.equal(ws2.opts.headers?.Authorization, `Bearer ${big}`);
    else assert.equal(tickets, 2, "a new ticket, asked for with the new token");
    ws2.hello(3600e3);
    assert.equal(rt.state.phase, "live", auth);
    assert.deepEqual(ws2.frames("subscribe").map((s) => s.frame), [{ type: "subscribe", dialogId: "d", sinceSeq: 7 }]);
    rt.stop();
    mock.timers.reset();
    FakeSocket.all = [];
  }
});

test("a subscribed whose lastSeq is below sinceSeq (a seq the dialog never had) is where the dialog's messages go on", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  let reads = 0;
  const { rt } = realtime({ historyPages: async function* () { reads++; yield []; } });
  /** @type {number[]} */
  const got = [];
  rt.on("message", ({ message }) => got.push(message.seq));
  rt.subscribe("d", { sinceSeq: 50 }); // a stale cache
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  ws.recv({ type: "resync", reason: "recovery_unavailable", dialogId: "d" });
  ws.recv({ type: "subscribed", dialogId: "d", lastSeq: 3, recovered: false });
  assert.equal(rt.known("d"), 3);
  const msg = (/** @type {number} */ seq) => ({ id: `m${seq}`, dialogId: "d", seq, senderId: "u", body: "hi", createdAt: 0, attachments: [] });
  ws.recv({ type: "event", channel: "dialog:d", id: "e4", event: "message.created", entityId: "m4", dialogId: "d", seq: 4, data: msg(4) });
  await pass(5000, ws);
  assert.deepEqual(got, [4], "the next message is delivered");
  assert.equal(reads, 0, "nothing to read over REST");
  rt.stop();
});

test("a dialog subscribed by its id in capitals is the dialog the server answers and sends in lowercase", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime({ historyPages: async function* () { yield []; } });
  const upper = "0192D1A4-7C3B-7E10-8A2B-3C4D5E6F7A8B";
  const lower = upper.toLowerCase();
  /** @type {number[]} */
  const got = [];
  rt.on("message", ({ message }) => got.push(message.seq));
  rt.subscribe(upper, { sinceSeq: 1 });
  rt.subscribe(lower); // the same dialog: nothing more is sent
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  await pass(1000, ws);
  assert.deepEqual(ws.frames("subscribe").map((s) => s.frame.dialogId), [lower], "one subscribe, in the server's form");
  ws.recv({ type: "subscribed", dialogId: lower, lastSeq: 1, recovered: true });
  const msg = { id: "m2", dialogId: lower, seq: 2, senderId: "u", body: "hi", createdAt: 0, attachments: [] };
  ws.recv({ type: "event", channel: `dialog:${lower}`, id: "e2", event: "message.created", entityId: "m2", dialogId: lower, seq: 2, data: msg });
  await pass(1000, ws);
  assert.deepEqual(got, [2], "the message is delivered");
  assert.equal(rt.known(upper), 2);
  rt.unsubscribe(upper);
  await pass(1000, ws);
  assert.deepEqual(ws.frames("unsubscribe").map((s) => s.frame.dialogId), [lower]);
  rt.stop();
});

// ---- a getToken that never answers ---------------------------------------------------------

/**
 * hangingHook: a getToken whose calls numbered in `hang` (from 1) never
 * answer until the test answers them (hung); each other call answers at
 * once with `t<call>`. It records every call's reason.
 * @param {number[]} hang
 */
function hangingHook(hang) {
  /** @type {string[]} */
  const reasons = [];
  /** @type {((t: string) => void)[]} */
  const hung = [];
  /** @type {AbortSignal[]} */
  const signals = [];
  /** @param {{reason: string, signal: AbortSignal}} info */
  const getToken = ({ reason, signal }) => {
    reasons.push(reason);
    signals.push(signal);
    if (!hang.includes(reasons.length)) return `t${reasons.length}`;
    return new Promise((/** @type {(t: string) => void} */ r) => hung.push(r));
  };
  return { getToken, reasons, hung, signals };
}

test("a getToken call that never answers fails REST calls retryably within the connect bound, the next call asks getToken again, and its late answer does not replace the newer token", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const hook = hangingHook([1]);
  const tokens = new Tokens(hook.getToken);
  /** @type {string[]} */
  const sentWith = [];
  const fetchImpl = /** @type {typeof fetch} */ (async (_url, init) => {
    sentWith.push(/** @type {Record<string, string>} */ (init?.headers).Authorization);
    return new Response(JSON.stringify({ id: "u" }), { status: 200, headers: { "Content-Type": "application/json" } });
  });
  const rest = new Rest("https://chat.example.com", tokens, fetchImpl);
  /** @type {unknown} */
  let outcome;
  rest.me().then((v) => { outcome = v; }, (e) => { outcome = e; });
  await pass(CONNECT_TIMEOUT_MS - 100);
  assert.equal(hook.signals[0].aborted, false, "the hook's signal stays open while its call is waited for");
  await pass(100);
  assert.ok(outcome instanceof ApiError, `the call waiting for getToken has ended: ${outcome}`);
  assert.equal(outcome.code, CLIENT_CODES.tokenTimeout);
  assert.equal(hook.signals[0].aborted, true, "the given-up call's signal is aborted, so the hook's own fetch can end");
  assert.equal(outcome.retryable, true, "retried like a lost answer (send keeps its Idempotency-Key)");
  assert.deepEqual(sentWith, [], "nothing was sent without a token");

  // getToken would answer a fresh call: the next REST call asks it again.
  assert.deepEqual(await rest.me(), { id: "u" });
  assert.deepEqual(hook.reasons, ["initial", "initial"]);
  // The abandoned call answers after all: the newer token stays.
  hook.hung[0]("stale");
  await settle();
  assert.equal(await tokens.current(), "t2");
  await rest.me();
  assert.deepEqual(sentWith, ["Bearer t2", "Bearer t2"]);
});

test("a getToken call that never answers costs one connection attempt: the next one, after the backoff, asks getToken again", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const hook = hangingHook([1]);
  const { rt, states } = realtime({ auth: "bearer", tokens: new Tokens(hook.getToken) });
  rt.start();
  const ws = await socketAfter(1, 2 * 60000);
  assert.equal(ws.opts.headers?.Authorization, "Bearer t2", "the token of the second call");
  assert.deepEqual(hook.reasons, ["initial", "initial"], "getToken was asked once more, not in a loop");
  const failed = states.find((s) => s.phase === "reconnecting");
  assert.equal(failed?.reason, "connect_timeout");
  assert.ok(failed && typeof failed.retryAt === "number", "the attempt after it waits for the backoff");
  ws.hello();
  assert.equal(rt.state.phase, "live");
  rt.stop();
});

test("a getToken that never answers after token_expired is asked again after the backoff, and the client reconnects with the new token", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const hook = hangingHook([2]);
  const expired = realtime({ auth: "bearer", tokens: new Tokens(hook.getToken) });
  expired.rt.start();
  const ws1 = await socketAfter(1, 1000);
  ws1.hello();
  ws1.readyState = 3;
  ws1.onclose?.({ code: 4001, reason: "token_expired" });
  const ws2 = await socketAfter(2, 2 * 60000);
  assert.equal(ws2.opts.headers?.Authorization, "Bearer t3");
  assert.deepEqual(hook.reasons, ["initial", "expired", "expired"]);
  assert.ok(expired.states.some((s) => s.phase === "reconnecting" && s.reason === "token_timeout" && typeof s.retryAt === "number"),
    "the new ask waits for the backoff");
  ws2.hello();
  assert.equal(expired.rt.state.phase, "live");
  expired.rt.stop();
});

test("a getToken that never answers for a refresh is asked again, and the live connection, kept meanwhile, is refreshed with the new token", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const hook = hangingHook([2]);
  const live = realtime({ auth: "bearer", tokens: new Tokens(hook.getToken) });
  live.rt.start();
  const ws = await socketAfter(1, 1000);
  ws.hello(5 * 60000); // the refresh is due in 4 min
  await pass(4 * 60000 + CONNECT_TIMEOUT_MS + 30000, ws);
  assert.deepEqual(hook.reasons, ["initial", "expiring", "expiring"]);
  assert.deepEqual(ws.frames("refresh").map((s) => s.frame.token), ["t3"]);
  assert.equal(live.rt.state.phase, "live");
  live.rt.stop();
});

test("a tab whose timers run once a minute (hidden, throttled) keeps its healthy connection; a ping left unanswered still ends it, and one unanswered across a sleep at once", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt } = realtime();
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello(); // heartbeatMs 25000
  // A hidden tab's timers are held back to one run a minute (Chrome's
  // intensive throttling): each run is late, the server answers every ping
  // at once, and no other frame comes (a quiet dialog).
  let pongs = 0;
  for (let minute = 1; minute <= 10; minute++) {
    mock.timers.setTime(1_000_000 + minute * 60_000);
    mock.timers.tick(0);
    while (pongs < ws.frames("ping").length) {
      pongs++;
      ws.recv({ type: "pong" });
    }
  }
  assert.ok(pongs >= 9, `the client kept pinging: ${pongs} pings in 10 min`);
  assert.equal(ws.closed, null, "a connection that answers every ping is kept");
  assert.equal(FakeSocket.all.length, 1, "no reconnect");
  assert.equal(rt.state.phase, "live");

  // The path goes dead: the next ping gets no answer, and the connection
  // ends at the following run of the timers.
  mock.timers.setTime(1_000_000 + 11 * 60_000);
  mock.timers.tick(0);
  assert.equal(ws.frames("ping").length, pongs + 1, "a ping went out");
  assert.equal(ws.closed, null, "judged once its answer is overdue, not before");
  mock.timers.setTime(1_000_000 + 12 * 60_000);
  mock.timers.tick(0);
  assert.deepEqual(ws.closed, { code: 4000, reason: "no heartbeat" });
  assert.equal(rt.state.phase, "reconnecting");

  // A laptop that sleeps right after a ping: on waking, that ping is
  // overdue, so the dead connection ends at once.
  mock.timers.tick(60_000);
  await settle();
  const ws2 = FakeSocket.all[1];
  assert.ok(ws2, "reconnected");
  ws2.hello();
  mock.timers.tick(25_000);
  assert.equal(ws2.frames("ping").length, 1);
  mock.timers.setTime(Date.now() + 3600e3);
  mock.timers.tick(0);
  assert.deepEqual(ws2.closed, { code: 4000, reason: "no heartbeat" });
  rt.stop();
});

test("a reconciliation REST keeps refusing is tried again ever later, up to every 5 min, not every 5 s; once REST answers the messages arrive", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  let refuse = true;
  /** @type {number[]} */
  const readsAt = [];
  const { rt, errors } = realtime({
    async *historyPages(_id, { afterSeq }) {
      readsAt.push(Date.now());
      if (refuse) throw new ApiError("invalid_cursor", 400);
      yield [{ id: "m6", dialogId: "d0", seq: afterSeq + 1, senderId: "u", body: "hi", createdAt: 0, attachments: [] }];
    },
  });
  /** @type {number[]} */
  const got = [];
  rt.on("message", ({ message }) => got.push(message.seq));
  rt.subscribe("d0", { sinceSeq: 5 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  ws.recv({ type: "subscribed", dialogId: "d0", lastSeq: 5, recovered: true });
  ws.recv({ type: "resync", reason: "slow_consumer" });
  await pass(30 * 60_000, ws);
  const gaps = readsAt.slice(1).map((t, i) => t - readsAt[i]);
  assert.ok(readsAt.length <= 20, `${readsAt.length} reads in 30 min (every 5 s would be 360), waits ${gaps}`);
  assert.ok(gaps.every((g, i) => i === 0 || g >= gaps[i - 1] || g >= 150_000), `the waits grow: ${gaps}`);
  assert.ok(gaps.every((g) => g <= 5 * 60_000), `never more than 5 min: ${gaps}`);
  assert.equal(errors.filter((e) => e instanceof ApiError).length, readsAt.length, "each failure is reported");
  refuse = false;
  await pass(5 * 60_000, ws);
  assert.deepEqual(got, [6], "the missed message arrives once REST answers");
  rt.stop();
});

test("a sinceSeq the server would refuse (below 0) is not sent, so the answers of later subscribes stay with their own dialogs", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  const { rt, errors } = realtime();
  rt.subscribe("d0", { sinceSeq: -1 });
  rt.subscribe("d1", { sinceSeq: 4 });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  ws.hello();
  const subs = ws.frames("subscribe").map((s) => s.frame);
  // The server refuses a subscribe whose sinceSeq is not an integer >= 0
  // with invalid_frame, an error that names no dialog and that other frames
  // get too: the client could not tell which subscribe it answered.
  assert.ok(subs.every((f) => f.sinceSeq === undefined || (Number.isSafeInteger(f.sinceSeq) && f.sinceSeq >= 0)),
    `every sinceSeq sent is one the server takes: ${JSON.stringify(subs)}`);
  for (const f of subs) {
    if (f.sinceSeq !== undefined && f.sinceSeq < 0) ws.recv({ type: "error", error: "invalid_frame" });
    else if (f.dialogId === "d0") ws.recv({ type: "subscribed", dialogId: "d0", lastSeq: 9 });
    else ws.recv({ type: "error", error: "dialog_not_found" });
  }
  const refused = errors.filter((e) => e instanceof FrameError && e.dialogId).map((e) => /** @type {FrameError} */ (e).dialogId);
  assert.deepEqual(refused, ["d1"], "the refusal is d1's");
  assert.equal(rt.known("d0"), 9, "d0 is followed from its lastSeq");
  rt.stop();
});

test("clients a ticket request told to come back after Retry-After come back spread over the second after it, not all at once", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_000_000 });
  /** @type {number[]} */
  const delays = [];
  for (let i = 0; i < 20; i++) {
    const { rt } = realtime({ auth: "ticket", ticket: async () => { throw new ApiError("redis_unavailable", 503, 5000); } });
    rt.start();
    await settle();
    assert.equal(rt.state.phase, "reconnecting");
    delays.push((rt.state.retryAt ?? 0) - Date.now());
    rt.stop();
  }
  assert.ok(delays.every((d) => d >= 5000 && d <= 6000), `never before the advice, at most a second after: ${delays}`);
  const spread = Math.max(...delays) - Math.min(...delays);
  assert.ok(spread >= 300, `20 clients come back within ${spread} ms of each other: ${delays}`);
});

/** The server's leeway past a credential's exp before it closes with 4001 token_expired. */
const SERVER_LEEWAY_MS = 30000;

/**
 * skewedServer plays, for forMs of the client's time, a gateway whose clock
 * is skewMs ahead of the client's (behind when negative): its credentials
 * last lifetimeMs on its clock, hello and refreshed carry its serverTime,
 * every refresh is answered with refreshed, and a connection whose exp plus
 * the leeway has passed on its clock is closed with 4001 token_expired.
 * @param {number} skewMs
 * @param {number} lifetimeMs
 * @param {number} forMs
 */
async function skewedServer(skewMs, lifetimeMs, forMs) {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_800_000_000_000 });
  const serverNow = () => Date.now() + skewMs;
  let asked = 0;
  const { rt } = realtime({ tokens: new Tokens(() => `token${++asked}`) });
  rt.start();
  await settle();
  /** @type {{at: number, expiresAt: number}[]} server time of each refresh frame, and the exp it came before */
  const refreshes = [];
  let closes = 0;
  let ws = FakeSocket.all[0];
  let expiresAt = 0;
  let read = 0;
  const open = () => {
    ws = /** @type {FakeSocket} */ (FakeSocket.all.at(-1));
    expiresAt = serverNow() + lifetimeMs;
    read = 0;
    ws.recv({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 25000, expiresAt, serverTime: serverNow() });
  };
  open();
  for (let t = 0; t < forMs; t += 1000) {
    mock.timers.tick(1000);
    await settle();
    if (FakeSocket.all.at(-1) !== ws) open(); // the client connected again
    for (; read < ws.sent.length; read++) {
      const f = ws.sent[read].frame;
      if (f.type === "ping") ws.recv({ type: "pong" });
      if (f.type !== "refresh") continue;
      refreshes.push({ at: serverNow(), expiresAt });
      expiresAt = serverNow() + lifetimeMs;
      ws.recv({ type: "refreshed", expiresAt, serverTime: serverNow() });
    }
    if (ws.readyState === 1 && serverNow() > expiresAt + SERVER_LEEWAY_MS) {
      closes++;
      ws.readyState = 3;
      ws.onclose?.({ code: 4001, reason: "token_expired" });
    }
  }
  rt.stop();
  return { refreshes, closes };
}

test("a client whose clock is 10 min behind or ahead of the server's refreshes once, before the credential expires on the server's clock", async () => {
  const lifetime = 5 * 60000;
  const got = [];
  for (const skew of [10 * 60000, -10 * 60000]) {
    const { refreshes, closes } = await skewedServer(skew, lifetime, lifetime + SERVER_LEEWAY_MS + 60000);
    mock.timers.reset();
    FakeSocket.all = [];
    // How long before the server's expiry each refresh came.
    got.push({ skewMin: skew / 60000, closes, aheadMs: refreshes.map((r) => r.expiresAt - r.at) });
  }
  const ok = got.every((g) => g.closes === 0 && g.aheadMs.length === 1 && g.aheadMs[0] > 0 && g.aheadMs[0] <= REFRESH_AHEAD_MS + 1000);
  assert.ok(ok, `want one refresh about ${REFRESH_AHEAD_MS} ms before expiry and no 4001 close, got ${JSON.stringify(got)}`);
});

test("a serverTime that is no time (negative, beyond a Date, not a number, a year or more from the client's clock) is ignored: the refresh follows the client's clock", async () => {
  // 0, seconds and microseconds for ms: within a Date's range, but a year
  // and more from the client's clock.
  for (const serverTime of [-1, 1e300, "1800000000000", null, true, 0, 1_800_000_000, 1_800_000_000_000_000]) {
    mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_800_000_000_000 });
    const { rt } = realtime();
    rt.start();
    await settle();
    const ws = FakeSocket.all[0];
    ws.recv({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 25000, expiresAt: Date.now() + 5 * 60000, serverTime });
    mock.timers.tick(5 * 60000 - REFRESH_AHEAD_MS - 1);
    await settle();
    const early = ws.frames("refresh").length;
    mock.timers.tick(1);
    await settle();
    const due = ws.frames("refresh").length;
    rt.stop();
    mock.timers.reset();
    FakeSocket.all = [];
    assert.deepEqual([early, due], [0, 1], `serverTime ${JSON.stringify(serverTime)}: refreshes before and at 60 s ahead of expiresAt`);
  }
});

test("20 clients a busy server told to come back after Retry-After: 1 come back spread over the second after it, not at the same instant", async () => {
  mock.timers.enable({ apis: ["setTimeout", "Date"], now: 1_000_000 });
  const JITTER_MS = 1000; // RETRY_AFTER_JITTER_MS
  try {
    const start = Date.now();
    /** @type {number[]} */
    const again = []; // when each client tried the second time
    const sends = [];
    for (let i = 0; i < 20; i++) {
      let tries = 0;
      /** @type {typeof fetch} */
      const fetchImpl = async () => {
        tries++;
        if (tries === 1) {
          return new Response('{"error":"dialog_busy"}', { status: 503, headers: { "Content-Type": "application/json", "Retry-After": "1" } });
        }
        again.push(Date.now() - start);
        return new Response(JSON.stringify({ id: "m1", dialogId: "d", seq: 1, senderId: "u", body: "hi", createdAt: 0, attachments: [] }), { status: 201, headers: { "Content-Type": "application/json" } });
      };
      const rest = new Rest("http://api.invalid", new Tokens(() => "token"), fetchImpl);
      sends.push(rest.send("d", "hi"));
    }
    for (let t = 0; t < 1000 + JITTER_MS + 100 && again.length < 20; t += 10) {
      await new Promise((r) => setImmediate(r));
      mock.timers.tick(10);
      for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
    }
    await Promise.all(sends);
    assert.equal(again.length, 20, "every client tried again");
    assert.ok(again.every((d) => d >= 1000 && d <= 1000 + JITTER_MS + 10), `never before the advice, at most a second after: ${again}`);
    const spread = Math.max(...again) - Math.min(...again);
    assert.ok(spread >= 300, `20 clients came back within ${spread} ms of each other: ${again}`);
  } finally {
    mock.timers.reset();
  }
});

/**
 * refreshAfterSlowRoundTrip plays a server 10 min ahead of the client that
 * reads its clock for refreshed halfway through an 8 s round trip, with
 * refresh frames held for the client's reading. It returns how far before
 * the new credential's exp (server's clock) the next refresh came.
 */
async function refreshAfterSlowRoundTrip() {
  const skew = 10 * 60000;
  const rtt = 8000;
  const serverNow = () => Date.now() + skew;
  const { rt } = realtime({ tokens: new Tokens(() => "token") });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  // Due at once: the first refresh goes out now.
  ws.recv({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 600000, expiresAt: serverNow() + 30000, serverTime: serverNow() });
  mock.timers.tick(0);
  await settle();
  assert.equal(ws.frames("refresh").length, 1, "the refresh of a credential due at once");
  mock.timers.tick(rtt / 2);
  const serverTime = serverNow();
  const expiresAt = serverTime + 5 * 60000;
  mock.timers.tick(rtt / 2);
  ws.recv({ type: "refreshed", expiresAt, serverTime });
  for (let t = 0; t < 5 * 60000 && ws.frames("refresh").length < 2; t += 500) {
    mock.timers.tick(500);
    await settle();
  }
  rt.stop();
  return { refreshes: ws.frames("refresh").length, aheadMs: expiresAt - serverNow() };
}

test("the clock offset from refreshed is corrected by half the refresh's round trip: the next refresh comes 60 s before exp on the server's clock", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_800_000_000_000 });
  const { refreshes, aheadMs } = await refreshAfterSlowRoundTrip();
  // Without the correction the server's clock is taken for 4 s behind
  // what it is, and the refresh comes 56 s ahead.
  assert.equal(refreshes, 2);
  assert.ok(aheadMs >= REFRESH_AHEAD_MS - 500 && aheadMs <= REFRESH_AHEAD_MS + 500,
    `the next refresh came ${aheadMs} ms before exp on the server's clock, want ${REFRESH_AHEAD_MS} ± 500`);
});

test("a client clock set back an hour after a refresh asks again REFRESH_MIN_GAP_MS after it, not an hour later", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval", "Date"], now: 1_800_000_000_000 });
  const { rt } = realtime({ tokens: new Tokens(() => "token") });
  rt.start();
  await settle();
  const ws = FakeSocket.all[0];
  const server0 = Date.now();
  ws.recv({ type: "hello", connectionId: "c", instance: "i", heartbeatMs: 600000, expiresAt: server0 + 30000, serverTime: server0 });
  mock.timers.tick(0);
  await settle();
  assert.equal(ws.frames("refresh").length, 1, "the refresh of a credential due at once");
  // The device's clock is set back an hour; the server's answer comes at
  // once and gives a credential that is due at once again (40 s left on
  // the server's clock).
  mock.timers.setTime(Date.now() - 3600e3);
  ws.recv({ type: "refreshed", expiresAt: server0 + 40000, serverTime: server0 });
  for (let t = 0; t < 20000 && ws.frames("refresh").length < 2; t += 500) {
    mock.timers.tick(500);
    await settle();
  }
  const n = ws.frames("refresh").length;
  rt.stop();
  assert.equal(n, 2, "a second refresh within 20 s (the credential ends 40 s + the leeway after the first)");
});
