// The chat view: dialog list, messages in seq order (timeline.js), the
// composer (a fresh Idempotency-Key per message, retried with the same key),
// attachments, typing indicator and presence dots. The SDK client (web/sdk)
// follows every listed dialog from the seq the listing reported, so its
// "message" events bring each later message once, in seq order, recovered
// or reconciled over REST after a reconnect, a resync or a gap; it also
// sends messages and pages history.
import { ApiError, FrameError } from "../sdk/index.js";
import { blobURL, get, request, retrying } from "./api.js";
import { $, avatar, dayKey, dayLabel, formatBytes, formatDateTime, formatTime, h, icon, isoTime, limitChars, listTime, relative, shortId, toast, uuid, UUID_RE } from "./dom.js";
import { errorView, sentence } from "./errors.js";
import { Timeline } from "./timeline.js";

const TYPING_SHOWN_MS = 4000;
// The server's limits, in characters (Unicode code points).
const MAX_BODY_CHARS = 4000;
const MAX_TITLE_CHARS = 200;
const PRESENCE_USERS_MAX = 50;
const POLL_MS = 5000;
const PREVIEW_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
// An open dialog read at its end shows at most this many messages; older
// ones go behind "Load earlier messages", so a dialog that keeps receiving
// for hours costs the same to show as a fresh one.
const MESSAGES_SHOWN_MAX = 1000;

// attachmentsOf: a message's attachments that are objects (a broken answer
// may carry anything there), each with its name and type as text.
function attachmentsOf(m) {
  if (!Array.isArray(m.attachments)) return [];
  return m.attachments.filter((a) => a && typeof a === "object")
    .map((a) => ({ ...a, id: String(a.id ?? ""), filename: String(a.filename ?? ""), contentType: String(a.contentType ?? "") }));
}

// canRetry: whether a failed send may succeed when tried again with the
// same key. A request the server refused as such (4xx: invalid_body,
// idempotency_key_reused, dialog_not_found, …) fails again; no answer, a
// server failure, 408, 429 and 409 idempotency_in_progress may pass.
export function canRetry(err) {
  if (!err) return true;
  const s = err.status;
  if (s === 0 || s === 408 || s === 429 || err.code === "idempotency_in_progress") return true;
  return !(s >= 400 && s < 500);
}

// mayHaveWritten: a send's try that ended this way may have written the
// message (no answer came, the server failed without saying, the commit's
// answer was lost, or another try of the same key was still running);
// every other failure says it wrote nothing.
export function mayHaveWritten(err) {
  if (!err) return false;
  const s = err.status;
  return s === 0 || s === 500 || s === 502 || s === 504 ||
    err.code === "database_unavailable" || err.code === "idempotency_in_progress";
}

// Image previews download at most this many blobs at once (#preview).
const PREVIEW_FETCHES = 4;
const PREVIEW_TIMEOUT_MS = 30000;
let previewsRunning = 0;
const previewWaiters = [];

async function previewSlot() {
  if (previewsRunning < PREVIEW_FETCHES) {
    previewsRunning++;
    return;
  }
  await new Promise((resolve) => previewWaiters.push(resolve));
}

function previewDone() {
  const next = previewWaiters.shift();
  if (next) next();
  else previewsRunning--;
}

export class ChatView {
  constructor({ me, client, onSync }) {
    this.me = me;
    this.client = client;
    this.rt = client.realtime;
    this.onSync = onSync || (() => {});
    this.dialogs = new Map(); // id → dialog DTO (+ activity)
    this.timelines = new Map(); // id → Timeline (dialogs opened this session)
    this.followed = new Set(); // ids of the dialogs the socket follows (#follow)
    this.presence = new Map(); // user id → {online, lastSeenAt}
    this.typing = new Map(); // dialog id → Map(user id → shown until)
    this.pending = new Map(); // dialog id → [outgoing message]
    this.inFlight = 0; // sends not settled yet (#deliver)
    this.uploads = []; // attachments of the message being written
    this.current = null;
    this.syncing = 0;
    this.disposed = false; // after sign-out: async work that comes back changes nothing
    this.listing = null; // the running refreshDialogs
    this.listAgain = false; // a refresh asked for while one runs
    this.creating = null; // {what, key}: the dialog the new-dialog form creates, and its Idempotency-Key
    this.msgEls = new Map(); // message id → <li>
    this.previews = new Map(); // attachment id → Promise<object URL>
    this.readKey = `han.read.${me}`;
    this.read = loadJSON(this.readKey);
    this.root = this.#build();
    this.#wire();
    this.tick = setInterval(() => this.#onTick(), 1000);
    this.poll = setInterval(() => this.#poll(), POLL_MS);
    // A list read at its end stays at its end when the view changes size
    // (a rotated phone, an on-screen keyboard, a narrower window).
    this.atEnd = true;
    this.scroller.addEventListener("scroll", () => {
      const sc = this.scroller;
      this.atEnd = sc.scrollHeight - sc.scrollTop - sc.clientHeight < 80;
    }, { passive: true });
    this.resizeObs = new ResizeObserver(() => { if (this.atEnd) this.scroller.scrollTop = this.scroller.scrollHeight; });
    this.resizeObs.observe(this.scroller);
  }

  // ---- DOM -----------------------------------------------------------------

  #build() {
    this.listEl = h("ul", { id: "dialog-list", class: "dialog-list" });
    const titleInput = h("input", { id: "new-title", dir: "auto", autocomplete: "off" });
    limitChars(titleInput, MAX_TITLE_CHARS);
    this.newForm = h("form", { id: "new-dialog", class: "stack" },
      fieldRow("Member user ids", h("textarea", { id: "new-members", rows: "2", required: true, spellcheck: "false",
        placeholder: "one or more UUIDs, separated by spaces or commas" })),
      fieldRow("Title (optional)", titleInput),
      h("div", { id: "new-dialog-error" }),
      h("button", { type: "submit", class: "btn btn-primary" }, "Create dialog"));
    const sidebar = h("aside", { class: "sidebar", "aria-label": "Dialogs" },
      h("div", { class: "sidebar-head" },
        h("h2", { text: "Dialogs" }),
        h("button", { type: "button", class: "btn btn-ghost btn-sm", id: "refresh-dialogs", onclick: () => this.refreshDialogs() }, "Refresh")),
      this.listEl,
      h("details", { class: "new-dialog", id: "new-dialog-box" }, h("summary", { text: "New dialog" }), this.newForm));

    // Members' text (titles, bodies, what is typed) takes the direction of
    // its first strong character (dir="auto"): Hebrew or Arabic reads right
    // to left, whatever the page's direction.
    this.titleEl = h("h2", { id: "dialog-title", dir: "auto", text: "" });
    this.statusEl = h("small", { id: "dialog-status", class: "muted" });
    this.membersEl = h("ul", { class: "members", id: "members", "aria-label": "Members" });
    // The log region wraps the list: a role on the <ol> itself would take
    // its list semantics (and its items') away.
    this.msgList = h("ol", { id: "messages", class: "messages" });
    this.olderBtn = h("button", { type: "button", class: "btn btn-ghost btn-sm load-older", id: "load-older", hidden: true,
      onclick: () => this.#loadOlder() }, "Load earlier messages");
    this.scroller = h("div", { class: "messages-scroll", id: "messages-scroll" }, this.olderBtn,
      h("div", { class: "messages-log", id: "messages-log", role: "log", "aria-live": "polite", "aria-label": "Messages" }, this.msgList));
    this.typingEl = h("div", { id: "typing", class: "typing", "aria-live": "polite" });
    this.fileInput = h("input", { type: "file", id: "attach-input", class: "visually-hidden", multiple: true });
    this.uploadsEl = h("ul", { id: "uploads", class: "uploads", "aria-label": "Attachments to send" });
    this.input = h("textarea", { id: "composer-input", dir: "auto", rows: "1", placeholder: "Write a message…",
      "aria-label": "Message", autocomplete: "off" });
    limitChars(this.input, MAX_BODY_CHARS);
    this.sendBtn = h("button", { type: "submit", class: "btn btn-primary", id: "send" }, "Send");
    this.composer = h("form", { id: "composer", class: "composer", "data-sending": "0" },
      this.uploadsEl,
      h("div", { class: "composer-row" },
        h("label", { for: "attach-input", class: "btn btn-ghost btn-icon", title: "Attach files" },
          icon("clip"), h("span", { class: "visually-hidden", text: "Attach files" })),
        this.fileInput, this.input, this.sendBtn),
      h("small", { class: "hint composer-hint", text: "Enter sends · Shift+Enter for a new line" }));
    this.conv = h("section", { class: "conversation", "aria-labelledby": "dialog-title", hidden: true },
      h("header", { class: "conv-head" },
        h("a", { href: "#/chat", class: "btn btn-ghost btn-sm back-link" }, icon("back"), "Dialogs"),
        h("div", { class: "conv-title" }, this.titleEl, this.statusEl), this.membersEl),
      this.scroller, this.typingEl, this.composer);
    this.empty = h("section", { class: "conversation empty-state", id: "no-dialog" },
      h("div", { class: "empty-card" },
        h("h2", { text: "Pick a dialog" }),
        h("p", { text: "Choose a conversation on the left, or start a new one with someone's user id." })));
    return h("div", { class: "chat" }, h("h1", { class: "visually-hidden", text: "Chat" }), sidebar, this.empty, this.conv);
  }

  #wire() {
    this.newForm.addEventListener("submit", (e) => { e.preventDefault(); this.#createDialog(); });
    this.composer.addEventListener("submit", (e) => { e.preventDefault(); this.#send(); });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.#send(); }
    });
    this.input.addEventListener("input", () => {
      this.input.style.height = "auto";
      this.input.style.height = `${Math.min(this.input.scrollHeight, 160)}px`;
      if (this.current && this.input.value.trim()) this.rt.typing(this.current);
    });
    this.fileInput.addEventListener("change", () => {
      for (const f of this.fileInput.files) this.#upload(f);
      this.fileInput.value = "";
    });
    const rt = this.rt;
    this.offs = [
      rt.on("open", () => {
        this.refreshDialogs();
        this.refreshPresence();
      }),
      rt.on("subscribed", (s) => this.#onSubscribed(s)),
      rt.on("message", ({ dialogId, message }) => this.#onMessage(dialogId, message)),
      rt.on("event", (f) => this.#onEvent(f)),
      rt.on("typing", (t) => this.#onTyping(t)),
      rt.on("presence", (p) => {
        this.presence.set(p.userId, { online: p.online, lastSeenAt: p.lastSeenAt });
        this.#renderPresence();
      }),
      // The SDK reconciles the followed dialogs itself; a dialog created
      // with us meanwhile shows up in a fresh listing. A resync of one
      // dialog (recovery_unavailable, one per dialog after a reconnect)
      // says nothing about the list: the reconnect's own refresh covers it.
      rt.on("resync", (r) => { if (!r.dialogId) this.refreshDialogs(); }),
      rt.on("error", (e) => this.#onError(e)),
      rt.on("state", () => this.#renderPresence()),
    ];
    // No event announces a dialog someone else created with us: the list is
    // refreshed on every (re)connect and whenever the page becomes visible.
    this.onVisible = () => {
      if (document.hidden) return;
      this.#markRead();
      this.refreshDialogs();
    };
    document.addEventListener("visibilitychange", this.onVisible);
  }

  // ---- dialogs ---------------------------------------------------------------

  // refreshDialogs reads the listing again. Refreshes asked for while one
  // runs become one more after it: at most one in flight and one queued,
  // however many reconnects, events and tab switches ask.
  refreshDialogs() {
    if (this.disposed) return Promise.resolve();
    if (this.listing) {
      this.listAgain = true;
      return this.listing;
    }
    this.listing = (async () => {
      try {
        do {
          this.listAgain = false;
          await this.#listDialogs();
        } while (this.listAgain && !this.disposed);
      } finally {
        this.listing = null;
      }
    })();
    return this.listing;
  }

  async #listDialogs() {
    let items = [];
    try {
      let cursor = null;
      for (let i = 0; i < 5; i++) {
        const page = await this.client.rest.dialogs(cursor ? { limit: 100, cursor } : { limit: 100 });
        items = items.concat(page.items || []);
        cursor = page.nextCursor;
        if (!cursor) break;
      }
    } catch (e) {
      if (this.disposed) return;
      if (!(e instanceof ApiError) || e.status !== 0) toast(`${e.code}: ${sentence(e.code, e.status)}`, "error");
      return;
    }
    if (this.disposed) return;
    for (const d of items) {
      const old = this.dialogs.get(d.id);
      d.lastSeq = Math.max(d.lastSeq || 0, old ? old.lastSeq : 0);
      d.activity = Math.max(d.createdAt || 0, old ? old.activity : 0);
      if (old && old.last) d.last = old.last;
      // The listing carries each dialog's newest message (null without one);
      // it becomes the preview unless this tab already shows a later one.
      if (d.lastMessage) this.#noteLast(d, d.lastMessage);
      delete d.lastMessage;
      this.dialogs.set(d.id, d);
      if (!(d.id in this.read)) this.read[d.id] = d.lastSeq; // history before this browser counts as read
      if (!this.followed.has(d.id)) this.#follow(d.id, this.#followFrom(d.id));
    }
    saveJSON(this.readKey, this.read);
    this.#renderList();
    if (this.current && this.dialogs.has(this.current) && !this.timelines.has(this.current)) this.open(this.current);
    else if (this.current && this.dialogs.has(this.current)) this.#renderHeader();
    else if (this.current) this.#notFound();
  }

  #title(d) {
    if (d.title) return d.title;
    const others = (d.memberIds || []).filter((m) => m !== this.me);
    if (others.length === 0) return "Notes to self";
    return `Chat with ${others.map(shortId).join(", ")}`;
  }

  #renderList() {
    const ds = Array.from(this.dialogs.values()).sort((a, b) => (b.activity || 0) - (a.activity || 0));
    const items = ds.map((d) => {
      const unread = d.id === this.current ? 0 : Math.max(0, (d.lastSeq || 0) - (this.read[d.id] || 0));
      const others = (d.memberIds || []).filter((m) => m !== this.me);
      const dot = others.length === 1 ? this.#dot(others[0]) : null;
      const last = d.last;
      let preview;
      if (last) {
        const who = last.senderId === this.me ? "You" : shortId(last.senderId);
        // The body in its own direction, isolated from the sender before it.
        preview = last.body ? [`${who}: `, h("bdi", { text: last.body })]
          : `${who}: ${last.atts ? plural(last.atts, "attachment") : ""}`;
      } else {
        preview = d.lastSeq ? plural(d.lastSeq, "message") : `No messages yet · ${plural((d.memberIds || []).length, "member")}`;
      }
      const when = last ? last.createdAt : d.lastSeq ? null : d.createdAt;
      const a = h("a", { href: `#/chat/${d.id}`, class: "dialog-item", dataset: { dialog: d.id },
        "aria-current": d.id === this.current ? "page" : null },
        h("span", { class: "avatar-wrap" }, avatar(others[0] || d.id, d.title || null), dot),
        h("span", { class: "dialog-text" },
          h("span", { class: "dialog-top" },
            h("span", { class: "dialog-name", dir: "auto", text: this.#title(d) }),
            when ? h("time", { class: "dialog-time", datetime: isoTime(when), title: formatDateTime(when), text: listTime(when) }) : null),
          h("span", { class: "dialog-sub", dataset: { seq: last ? String(last.seq) : "" } }, preview)),
        unread ? h("span", { class: "badge", "aria-label": `${unread} unread`, text: unread > 99 ? "99+" : String(unread) }) : null);
      return h("li", null, a);
    });
    if (!items.length) {
      items.push(h("li", { class: "muted list-empty", text: "No dialogs yet. Start one below." }));
    }
    this.listEl.replaceChildren(...items);
  }

  // #noteLast keeps a dialog's latest message for the list's preview.
  #noteLast(d, m) {
    if (!d || (d.last && d.last.seq >= m.seq)) return;
    d.last = { seq: m.seq, body: m.body || "", senderId: m.senderId, createdAt: m.createdAt, atts: attachmentsOf(m).length };
    d.activity = Math.max(d.activity || 0, m.createdAt || 0);
  }

  async #createDialog() {
    const errBox = $("#new-dialog-error", this.newForm);
    errBox.replaceChildren();
    const ids = $("#new-members", this.newForm).value.split(/[\s,;]+/).map((s) => s.trim()).filter(Boolean);
    const bad = ids.find((s) => !UUID_RE.test(s));
    if (!ids.length || bad) {
      errBox.append(errorView({ code: "invalid_members" }));
      return;
    }
    const title = $("#new-title", this.newForm).value.trim();
    // One key per dialog to create: the form submitted again unchanged
    // (after a failure whose try may have written it, or a second click
    // while the first runs) is the same dialog, answered once; a changed
    // form is another one. The server keeps successes only, so a refusal
    // fixed meanwhile (a member who has signed in since) passes with it.
    const what = JSON.stringify([ids, title]);
    if (!this.creating || this.creating.what !== what) this.creating = { what, key: uuid() };
    const idempotencyKey = this.creating.key;
    try {
      const data = await this.client.rest.createDialog(ids, title ? { title, idempotencyKey } : { idempotencyKey });
      if (this.creating?.key === idempotencyKey) this.creating = null;
      data.activity = Date.now();
      this.dialogs.set(data.id, data);
      this.read[data.id] = data.lastSeq || 0;
      saveJSON(this.readKey, this.read);
      this.#follow(data.id, data.lastSeq || 0);
      this.newForm.reset();
      $("#new-dialog-box", this.root).open = false;
      this.#renderList();
      location.hash = `#/chat/${data.id}`;
      this.refreshPresence();
    } catch (e) {
      errBox.append(errorView(e));
    }
  }

  // ---- one dialog --------------------------------------------------------------

  // open shows a dialog (the router calls it; null shows the empty state).
  open(id) {
    if (this.current && this.current !== id) this.#clearUploads();
    this.current = id || null;
    this.empty.hidden = !!this.current;
    this.conv.hidden = !this.current;
    this.#renderList();
    if (!this.current) return;
    const d = this.dialogs.get(id);
    if (!d) {
      this.titleEl.textContent = "Loading…";
      this.titleEl.title = "";
      this.membersEl.replaceChildren();
      this.msgList.replaceChildren();
      return; // refreshDialogs opens it once the list is known
    }
    this.composer.hidden = false;
    this.#renderHeader();
    this.msgList.replaceChildren();
    this.msgEls.clear();
    let tl = this.timelines.get(id);
    if (!this.followed.has(id)) this.#follow(id, this.#followFrom(id));
    if (!tl) {
      const rest = this.client.rest;
      tl = new Timeline({
        pages: (afterSeq, attempts) => rest.historyPages(id, attempts ? { afterSeq, limit: 100, attempts } : { afterSeq, limit: 100 }),
        page: (afterSeq, limit) => rest.history(id, { afterSeq, limit }),
        onAdd: (ms) => this.#onAdded(id, ms),
      });
      this.timelines.set(id, tl);
      this.#track(tl.start(d.lastSeq || 0).then(() => { if (!this.disposed) this.#renderMessages(true); }, (e) => {
        if (this.disposed) return;
        // The SDK already retried. A failure that may pass is tried again
        // by the 5 s poll (or the next open); any other is shown.
        if (e instanceof ApiError && e.retryable) {
          if (this.timelines.get(id) === tl) this.timelines.delete(id);
        } else {
          tl.loaded = true;
          if (id === this.current) this.#renderMessages(false);
        }
        this.#restFailed(e);
      }));
    }
    this.#renderMessages(true);
    this.#renderTyping();
    this.input.focus({ preventScroll: true });
  }

  // #notFound: the address names a dialog this user cannot see.
  #notFound() {
    this.composer.hidden = true;
    this.titleEl.textContent = "Dialog not found";
    this.titleEl.title = "";
    this.statusEl.textContent = "";
    this.membersEl.replaceChildren();
    this.msgList.replaceChildren(h("li", { class: "msgs-empty" }, errorView({ code: "dialog_not_found", status: 404 })));
  }

  // #followFrom is the seq a dialog is followed from: what its timeline
  // holds without a gap, when it has one (a dialog opened earlier, which
  // made room for another and is followed again: the messages sent since
  // then are read), else the listing's lastSeq.
  #followFrom(id) {
    const tl = this.timelines.get(id);
    return tl ? tl.heldThrough : this.dialogs.get(id)?.lastSeq || 0;
  }

  // #follow subscribes to a dialog from the seq the listing reported: the
  // SDK then delivers every later message. It follows at most 200 dialogs:
  // past that, the followed dialog least recently active (never the open
  // one) makes room for a more recent one, and always for the open one, so
  // the dialog on screen is live whatever its place in the listing.
  #follow(id, sinceSeq) {
    if (this.followed.has(id)) return;
    try {
      this.rt.subscribe(id, { sinceSeq: sinceSeq || 0 });
      this.followed.add(id);
      return;
    } catch { /* too_many_subscriptions */ }
    const activity = (x) => (x === this.current ? Infinity : (this.dialogs.get(x)?.activity || 0));
    let victim = null;
    for (const other of this.followed) {
      if (other !== this.current && (victim === null || activity(other) < activity(victim))) victim = other;
    }
    if (victim === null || activity(victim) >= activity(id)) return;
    this.rt.unsubscribe(victim);
    this.followed.delete(victim);
    try {
      this.rt.subscribe(id, { sinceSeq: sinceSeq || 0 });
      this.followed.add(id);
    } catch { /* not expected: a place was just made */ }
  }

  // #poll runs every 5 s. An open dialog whose window failed to load tries
  // again. REST stays the truth while the socket is down: the open dialog
  // reads what came after what it holds without a gap, delivered by the
  // SDK or read by an earlier poll (the SDK's known seq does not move while
  // it is offline), so each poll reads only what is new.
  async #poll() {
    const id = this.current;
    if (id && this.dialogs.has(id) && !this.timelines.has(id)) {
      this.open(id);
      return;
    }
    const tl = id && this.timelines.get(id);
    if ((this.rt.live && this.followed.has(id)) || !tl || !tl.loaded || this.polling || this.rt.state.reason === "token_expired") return;
    this.polling = true;
    try {
      await tl.catchUp(Math.max(this.rt.known(id) ?? 0, tl.heldThrough), 1);
    } catch (e) {
      if (!this.disposed && !(e instanceof ApiError && e.retryable)) this.#restFailed(e);
    } finally {
      this.polling = false;
    }
  }

  #restFailed(e) {
    if (e instanceof ApiError && e.status === 0) return; // offline: the banner says so
    toast(`${e.code || "internal"}: ${sentence(e.code, e.status)}`, "error");
  }

  #renderHeader() {
    const d = this.dialogs.get(this.current);
    if (!d) return;
    this.titleEl.textContent = this.#title(d);
    this.titleEl.title = this.titleEl.textContent; // whole, where the line cuts it
    this.membersEl.replaceChildren(...(d.memberIds || []).map((m) =>
      h("li", { class: "member", dataset: { user: m } }, this.#dot(m),
        h("span", { text: m === this.me ? "You" : shortId(m), title: m }))));
    this.#renderStatus();
  }

  // #renderStatus: the other member's presence in a one-to-one dialog, else
  // how many members are online.
  #renderStatus() {
    const d = this.dialogs.get(this.current);
    if (!d) return;
    const others = (d.memberIds || []).filter((m) => m !== this.me);
    let text = "";
    if (others.length === 1) {
      const p = this.presence.get(others[0]);
      if (p && p.online) text = "online";
      else if (p && p.lastSeenAt) text = `last seen ${relative(p.lastSeenAt)}`;
      else if (p) text = "offline";
    } else {
      const online = others.filter((m) => this.presence.get(m)?.online).length;
      text = `${plural(d.memberIds.length, "member")}, ${online} online`;
    }
    this.statusEl.textContent = text;
  }

  #onAdded(dialogId, ms) {
    const d = this.dialogs.get(dialogId);
    if (d) {
      for (const m of ms) {
        d.lastSeq = Math.max(d.lastSeq || 0, m.seq);
        d.activity = Math.max(d.activity || 0, m.createdAt || 0);
        this.#noteLast(d, m);
        this.typing.get(dialogId)?.delete(m.senderId);
        if (m.senderId === this.me) this.#matchPending(dialogId, m);
      }
    }
    if (dialogId === this.current) {
      this.#renderMessages(false);
      this.#renderTyping();
      this.#markRead();
    }
    this.#renderList();
  }

  #renderMessages(forceBottom) {
    const tl = this.timelines.get(this.current);
    if (!tl) return;
    const sc = this.scroller;
    const atBottom = forceBottom || sc.scrollHeight - sc.scrollTop - sc.clientHeight < 80;
    // Read at its end, the list keeps the latest messages only (older
    // ones load again with "Load earlier messages"); scrolled up, nothing
    // moves under the reader.
    if (atBottom) this.#trim(tl);
    const msgs = tl.messages();
    const els = [];
    let prev = null;
    let day = null;
    const now = Date.now();
    // A separator starts every local calendar day: "Today", "Yesterday",
    // else the full date.
    const separate = (ms) => {
      const k = dayKey(ms);
      if (k === day) return false;
      day = k;
      els.push(h("li", { class: "day-sep", dataset: { day: k } },
        h("time", { datetime: k, text: dayLabel(ms, now) })));
      return true;
    };
    for (const m of msgs) {
      let el = this.msgEls.get(m.id);
      if (!el) {
        el = this.#messageEl(m);
        this.msgEls.set(m.id, el);
      }
      const newDay = separate(m.createdAt);
      const cont = !newDay && prev && prev.senderId === m.senderId && m.createdAt - prev.createdAt < 5 * 60e3;
      el.classList.toggle("cont", !!cont);
      els.push(el);
      prev = m;
    }
    const pend = (this.pending.get(this.current) || []).filter((p) => !p.matched);
    if (pend.length) separate(now);
    for (const p of pend) els.push(this.#pendingEl(p));
    if (!msgs.length && !(this.pending.get(this.current) || []).length && tl.loaded) {
      els.push(h("li", { class: "msgs-empty muted", text: "No messages yet — say hello." }));
    }
    this.msgList.replaceChildren(...els);
    this.olderBtn.hidden = !(tl.floor > 0);
    if (atBottom) sc.scrollTop = sc.scrollHeight;
  }

  // #trim lets a timeline's oldest messages go beyond MESSAGES_SHOWN_MAX,
  // with their elements and previews.
  #trim(tl) {
    for (const m of tl.trim(MESSAGES_SHOWN_MAX)) {
      this.msgEls.delete(m.id);
      for (const a of attachmentsOf(m)) {
        this.previews.get(a.id)?.then((u) => u && URL.revokeObjectURL(u));
        this.previews.delete(a.id);
      }
    }
  }

  #messageEl(m) {
    const mine = m.senderId === this.me;
    const atts = attachmentsOf(m).map((a) => this.#attachmentEl(a));
    // The seq number is for support and debugging: in the tooltip, and
    // shown beside the time on hover or keyboard focus only.
    return h("li", { class: `msg${mine ? " mine" : ""}`, dataset: { seq: String(m.seq), id: m.id, sender: m.senderId },
      title: `#${m.seq} · ${formatDateTime(m.createdAt)}` },
      mine ? null : avatar(m.senderId),
      h("div", { class: "msg-col" },
        h("div", { class: "msg-meta" },
          h("span", { class: "sender", text: mine ? "You" : shortId(m.senderId), title: m.senderId }),
          h("time", { datetime: isoTime(m.createdAt), title: formatDateTime(m.createdAt), text: formatTime(m.createdAt) }),
          h("span", { class: "seq", text: `#${m.seq}` })),
        h("div", { class: "bubble" },
          m.body ? h("p", { class: "body", dir: "auto", text: m.body }) : null,
          atts.length ? h("ul", { class: "atts" }, atts) : null)));
  }

  #attachmentEl(a) {
    const li = h("li", { class: "att", dataset: { attachment: a.id } });
    const ext = (a.filename.includes(".") ? a.filename.split(".").pop() : a.contentType.split("/").pop()).slice(0, 4).toUpperCase();
    li.append(h("div", { class: "att-row" },
      h("span", { class: "att-badge", "aria-hidden": "true", text: ext || "FILE" }),
      h("span", { class: "att-text" },
        h("span", { class: "att-name", dir: "auto", text: a.filename, title: a.filename }),
        h("span", { class: "att-size", text: `${formatBytes(a.sizeBytes)} · ${a.contentType}` })),
      h("button", { type: "button", class: "btn btn-sm btn-ghost att-dl", "aria-label": `Download ${a.filename}`, title: "Download",
        onclick: () => this.#download(a) }, icon("download"))));
    if (PREVIEW_TYPES.has(a.contentType) && a.sizeBytes <= 8 << 20) {
      const img = h("img", { class: "att-preview", alt: a.filename, hidden: true });
      li.prepend(img);
      this.#preview(a).then((src) => { if (src) { img.src = src; img.hidden = false; } });
    }
    return li;
  }

  // #preview downloads an image attachment for its thumbnail, at most
  // PREVIEW_FETCHES at once: the server keeps each client address to a
  // share of its open blobs, and a dialog full of images must neither take
  // all of it nor be refused. A download refused as busy (503) is tried
  // again a second later, up to three times; one that hangs is given up
  // after PREVIEW_TIMEOUT_MS, so it holds no slot.
  #preview(a) {
    if (!this.previews.has(a.id)) {
      this.previews.set(a.id, (async () => {
        // Busy (503): tried again after a second, a few times.
        for (let attempt = 1; ; attempt++) {
          await previewSlot();
          let res;
          try {
            if (this.disposed) return null;
            const { url } = await get(`/v1/attachments/${encodeURIComponent(a.id)}/download-url`);
            const href = blobURL(url, a.id);
            if (!href) return null;
            res = await fetch(href, { cache: "no-store", credentials: "omit", signal: AbortSignal.timeout(PREVIEW_TIMEOUT_MS) });
            if (res.ok) return URL.createObjectURL(await res.blob());
          } catch {
            this.previews.delete(a.id);
            return null;
          } finally {
            previewDone();
          }
          if (res.status !== 503 || attempt >= 3) return null;
          await new Promise((resolve) => setTimeout(resolve, 1000));
        }
      })());
    }
    return this.previews.get(a.id);
  }

  async #download(a) {
    try {
      const { url } = await get(`/v1/attachments/${encodeURIComponent(a.id)}/download-url`);
      const href = blobURL(url, a.id);
      if (!href) throw new ApiError("invalid_response", 200);
      const link = h("a", { href, download: a.filename, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
    } catch (e) {
      toast(`${e.code}: ${sentence(e.code, e.status)}`, "error");
    }
  }

  async #loadOlder() {
    const tl = this.timelines.get(this.current);
    if (!tl) return;
    const sc = this.scroller;
    const fromBottom = sc.scrollHeight - sc.scrollTop;
    try {
      await tl.loadOlder(50);
    } catch (e) {
      toast(`${e.code}: ${sentence(e.code, e.status)}`, "error");
    }
    this.#renderMessages(false);
    sc.scrollTop = sc.scrollHeight - fromBottom;
  }

  #markRead() {
    if (document.hidden || !this.current) return;
    const tl = this.timelines.get(this.current);
    const d = this.dialogs.get(this.current);
    const seq = Math.max(tl ? tl.lastSeq : 0, d ? d.lastSeq || 0 : 0);
    if ((this.read[this.current] || 0) < seq) {
      this.read[this.current] = seq;
      saveJSON(this.readKey, this.read);
    }
  }

  // ---- sending -------------------------------------------------------------------

  #send() {
    const dialogId = this.current;
    const body = this.input.value;
    if (!dialogId || !body.trim()) return;
    if (this.uploads.some((u) => u.state === "uploading")) {
      toast("Wait until the attachments are uploaded.", "info");
      return;
    }
    const ready = this.uploads.filter((u) => u.state === "ready");
    // One key per message: every retry of this message reuses it, so the
    // server creates it at most once whatever the network does.
    const p = { localId: uuid(), key: uuid(), dialogId, body, attachments: ready.map((u) => u.att),
      state: "sending", error: null, retryAt: 0, matched: false, maybeWritten: false };
    if (!this.pending.has(dialogId)) this.pending.set(dialogId, []);
    this.pending.get(dialogId).push(p);
    this.input.value = "";
    this.input.style.height = "auto";
    this.#clearUploads(true);
    this.#renderMessages(true);
    this.#deliver(p);
  }

  // #deliver runs one send to its end: confirmed, hidden (its message
  // arrived while a try that may have written it failed) or failed. The
  // composer's data-sending counts the sends still running (a styling
  // hook; 0 once every send has settled).
  async #deliver(p) {
    this.#sending(1);
    try {
      await this.#deliverOnce(p);
    } finally {
      this.#sending(-1);
    }
  }

  #sending(d) {
    this.inFlight += d;
    this.composer.dataset.sending = String(this.inFlight);
  }

  async #deliverOnce(p) {
    p.state = "sending";
    p.error = null;
    this.#refreshPending(p);
    const opts = { idempotencyKey: p.key, clientMessageId: p.localId, attempts: 6,
      onRetry: (e, delay) => {
        p.maybeWritten ||= mayHaveWritten(e);
        p.state = "retrying"; p.error = e; p.retryAt = Date.now() + delay; this.#refreshPending(p);
      } };
    if (p.attachments.length) opts.attachmentIds = p.attachments.map((a) => a.id);
    try {
      const { message } = await this.client.rest.send(p.dialogId, p.body, opts);
      this.#dropPending(p);
      const tl = this.timelines.get(p.dialogId);
      if (tl) tl.add([message]);
      else this.#onAdded(p.dialogId, [message]);
      if (p.dialogId === this.current) this.#renderMessages(true);
    } catch (e) {
      p.maybeWritten ||= mayHaveWritten(e);
      if (p.matched && p.maybeWritten) {
        // The message arrived (by event or reconciliation) while a try of
        // the send ended without saying whether it was written (no answer,
        // database_unavailable, …): that try wrote it. Showing a failed
        // copy beside it would show it twice.
        this.#dropPending(p);
        if (p.dialogId === this.current) this.#renderMessages(false);
        return;
      }
      p.state = "failed";
      p.error = e;
      p.matched = false;
      if (p.dialogId === this.current) this.#renderMessages(false);
    }
  }

  // A message of ours that arrived (by event or reconciliation) before the
  // send's answer hides its pending copy, so it is never shown twice. A
  // failed send one of whose tries ended without saying whether it was
  // written (mayHaveWritten) may have been written by it: the message
  // arriving is it, and its failed copy goes. A send every try of which the
  // server refused or put off (4xx, 429, database_busy) was not written; a
  // same-body message from elsewhere does not hide it.
  #matchPending(dialogId, m) {
    const list = this.pending.get(dialogId);
    if (!list) return;
    const ids = attachmentsOf(m).map((a) => a.id).join(",");
    const p = list.find((x) => !x.matched && (x.state !== "failed" || x.maybeWritten) && x.body === m.body && x.attachments.map((a) => a.id).join(",") === ids);
    if (!p) return;
    if (p.state === "failed") this.#dropPending(p);
    else p.matched = true;
  }

  #dropPending(p) {
    const list = this.pending.get(p.dialogId) || [];
    const i = list.indexOf(p);
    if (i >= 0) list.splice(i, 1);
  }

  #refreshPending(p) {
    if (p.dialogId !== this.current || p.matched) return;
    const old = this.msgList.querySelector(`[data-local="${p.localId}"]`);
    if (old) old.replaceWith(this.#pendingEl(p));
  }

  #pendingEl(p) {
    let status = null;
    let failure = null;
    if (p.state === "sending") status = h("span", { class: "send-state", text: "Sending…" });
    else if (p.state === "retrying") {
      status = h("span", { class: "send-state warn", dataset: { retryAt: String(p.retryAt) },
        text: `Not confirmed yet (${p.error ? p.error.code : "network_error"}) — retrying in ${Math.max(0, Math.ceil((p.retryAt - Date.now()) / 1000))} s` });
    } else {
      // The reason and the actions sit right under the bubble, where the
      // list's end is: a long body cannot push them out of view. Retry is
      // offered only when trying again can help (same key, so at most once).
      const code = p.error ? p.error.code : "internal";
      failure = h("div", { class: "send-failed", dataset: { code } },
        h("p", { class: "send-failed-reason" }, h("code", { class: "code", text: code }), " ",
          p.error ? sentence(p.error.code, p.error.status) : sentence("internal")),
        h("div", { class: "send-failed-actions" },
          canRetry(p.error) ? h("button", { type: "button", class: "btn btn-sm send-retry", onclick: () => this.#deliver(p) }, "Retry") : null,
          h("button", { type: "button", class: "btn btn-sm btn-ghost send-discard", onclick: () => { this.#dropPending(p); this.#renderMessages(false); } }, "Discard")));
    }
    return h("li", { class: `msg mine pending pending-${p.state}`, dataset: { local: p.localId, state: p.state } },
      h("div", { class: "msg-col" },
        h("div", { class: "msg-meta" }, h("span", { class: "sender", text: "You" }), status),
        h("div", { class: "bubble" }, h("p", { class: "body", dir: "auto", text: p.body }),
          p.attachments.length ? h("ul", { class: "atts" }, p.attachments.map((a) => h("li", { class: "att" },
            h("span", { class: "att-name", dir: "auto", text: a.filename })))) : null),
        failure));
  }

  // ---- attachments -----------------------------------------------------------------

  async #upload(file) {
    const dialogId = this.current;
    if (!dialogId) return;
    const u = { localId: uuid(), file, state: "uploading", att: null, error: null };
    this.uploads.push(u);
    this.#renderUploads();
    const contentType = file.type || "application/octet-stream";
    const key = uuid();
    try {
      const { data } = await retrying(() => request("POST", "/v1/attachments", {
        body: { dialogId, filename: file.name, contentType, sizeBytes: file.size }, headers: { "Idempotency-Key": key } }));
      const uploadUrl = blobURL(data.uploadUrl, data.id);
      if (!uploadUrl) throw new ApiError("invalid_response", 201);
      await retrying(async () => {
        let res;
        try {
          res = await fetch(uploadUrl, { method: "PUT", headers: { "Content-Type": contentType }, body: file, credentials: "omit" });
        } catch {
          throw new ApiError("network_error", 0);
        }
        if (res.ok) return;
        let code = `http_${res.status}`;
        try { code = (await res.json()).error || code; } catch { /* not JSON */ }
        // A retry after an upload whose answer was lost: it is there.
        if (code === "attachment_already_uploaded") return;
        throw new ApiError(code, res.status, (Number.parseInt(res.headers.get("Retry-After") || "0", 10) || 0) * 1000);
      }, { attempts: 4 });
      u.att = { id: data.id, filename: file.name, contentType, sizeBytes: file.size };
      u.state = "ready";
    } catch (e) {
      u.state = "failed";
      u.error = e;
    }
    if (this.uploads.includes(u)) this.#renderUploads();
  }

  #renderUploads() {
    this.uploadsEl.replaceChildren(...this.uploads.map((u) => h("li", { class: `upload upload-${u.state}`, dataset: { state: u.state } },
      h("span", { class: "att-name", dir: "auto", text: u.file.name }),
      h("span", { class: "muted", text: u.state === "uploading" ? "uploading…" : u.state === "ready" ? formatBytes(u.file.size) : "" }),
      u.error ? h("code", { class: "code", title: sentence(u.error.code, u.error.status), text: u.error.code }) : null,
      h("button", { type: "button", class: "btn btn-sm btn-ghost", "aria-label": `Remove ${u.file.name}`,
        onclick: () => { this.uploads = this.uploads.filter((x) => x !== u); this.#renderUploads(); } }, "✕"))));
  }

  #clearUploads(keepFailed) {
    this.uploads = keepFailed ? this.uploads.filter((u) => u.state === "failed") : [];
    this.#renderUploads();
  }

  // ---- realtime ---------------------------------------------------------------------

  #onSubscribed({ dialogId, lastSeq }) {
    const d = this.dialogs.get(dialogId);
    if (d && lastSeq > (d.lastSeq || 0)) {
      d.lastSeq = lastSeq;
      this.#renderList();
    }
  }

  // #onMessage: the SDK's next message of a followed dialog.
  #onMessage(dialogId, m) {
    const tl = this.timelines.get(dialogId);
    if (!tl) {
      if (this.dialogs.has(dialogId)) this.#onAdded(dialogId, [m]);
      return;
    }
    tl.add([m]);
    // A dialog opened earlier keeps its latest messages only (the open one
    // is trimmed as it is shown).
    if (dialogId !== this.current) this.#trim(tl);
  }

  #onEvent(f) {
    // A message of a dialog this view does not list yet: list it.
    const dialogId = f.dialogId || (f.data && f.data.dialogId);
    if (f.event === "message.created" && dialogId && !this.dialogs.has(dialogId)) this.refreshDialogs();
  }

  #onTyping({ dialogId, userId }) {
    if (!userId || userId === this.me) return;
    if (!this.typing.has(dialogId)) this.typing.set(dialogId, new Map());
    this.typing.get(dialogId).set(userId, Date.now() + TYPING_SHOWN_MS);
    if (dialogId === this.current) this.#renderTyping();
  }

  // #onError: refused frames and failed reconciliations are shown; closes
  // are the banner's. A refresh answered rate_limited is not: the SDK sends
  // it again after the advised wait, and the connection keeps its
  // credential meanwhile.
  #onError(e) {
    if (e instanceof FrameError) {
      if (e.dialogId) this.#subscribeRefused(e);
      else if (e.code !== "not_subscribed" && e.code !== "rate_limited") toast(`${e.code}: ${sentence(e.code)}`, "error");
    } else if (e instanceof ApiError && !e.retryable) this.#restFailed(e);
  }

  // #subscribeRefused: a subscribe the server could not answer now
  // (unavailable) is sent again by the SDK, unannounced. Any other refusal
  // ends the SDK's following of the dialog: it is no longer followed here
  // either, so the poll reads it while it is open and a later listing or
  // open follows it again. A dialog the user is not a member of (any more)
  // leaves the list.
  #subscribeRefused(e) {
    if (e.code === "unavailable") return;
    const id = e.dialogId;
    this.followed.delete(id);
    if (e.code === "dialog_not_found" && this.dialogs.has(id)) {
      this.dialogs.delete(id);
      this.timelines.delete(id);
      this.#renderList();
      if (id === this.current) this.#notFound();
    }
    toast(`${e.code}: ${sentence(e.code)}`, "error");
  }

  // refreshPresence reads presence over REST for the users shown (after
  // every (re)connect; events follow).
  async refreshPresence() {
    const users = new Set();
    for (const d of this.dialogs.values()) for (const m of d.memberIds || []) if (m !== this.me) users.add(m);
    const list = Array.from(users).slice(0, PRESENCE_USERS_MAX);
    await Promise.all(list.map(async (u) => {
      try {
        const p = await this.client.rest.presence(u);
        this.presence.set(u, { online: !!p.online, lastSeenAt: p.lastSeenAt ?? null });
      } catch { /* not visible or unavailable: stays unknown */ }
    }));
    if (!this.disposed) this.#renderPresence();
  }

  #dot(userId) {
    const el = h("span", { class: "dot", role: "img", dataset: { user: userId } });
    this.#paintDot(el, userId);
    return el;
  }

  #paintDot(el, userId) {
    const p = this.presence.get(userId);
    let state = "unknown";
    let label = "presence unknown";
    if (userId === this.me) {
      state = this.rt.live ? "true" : "false";
      label = this.rt.live ? "you are online" : "you are offline";
    } else if (p) {
      state = p.online ? "true" : "false";
      label = p.online ? "online" : p.lastSeenAt ? `offline, last seen ${relative(p.lastSeenAt)}` : "offline";
    }
    el.dataset.online = state;
    el.setAttribute("aria-label", label);
    el.title = label;
  }

  #renderPresence() {
    for (const el of this.root.querySelectorAll(".dot[data-user]")) this.#paintDot(el, el.dataset.user);
    if (this.current) this.#renderStatus();
  }

  #renderTyping() {
    const m = this.typing.get(this.current);
    const now = Date.now();
    const who = m ? Array.from(m.entries()).filter(([, until]) => until > now).map(([u]) => u) : [];
    this.typingEl.dataset.users = who.join(",");
    if (!who.length) {
      this.typingEl.replaceChildren();
      return;
    }
    const names = who.map(shortId).join(", ");
    this.typingEl.replaceChildren(h("span", { class: "typing-dots", "aria-hidden": "true" }, h("i"), h("i"), h("i")),
      ` ${names} ${who.length > 1 ? "are" : "is"} typing…`);
  }

  #onTick() {
    this.ticks = (this.ticks || 0) + 1;
    if (this.current && this.ticks % 15 === 0) this.#renderStatus(); // "last seen 3 min ago" moves on
    if (this.current && this.typing.get(this.current)?.size) {
      const m = this.typing.get(this.current);
      const now = Date.now();
      for (const [u, until] of m) if (until <= now) m.delete(u);
      this.#renderTyping();
    }
    for (const el of this.msgList.querySelectorAll("[data-retry-at]")) {
      const s = Math.max(0, Math.ceil((Number(el.dataset.retryAt) - Date.now()) / 1000));
      el.textContent = el.textContent.replace(/retrying in \d+ s/, `retrying in ${s} s`);
    }
  }

  // #track counts reconciliations started by a reconnect or resync (the
  // banner says "resyncing" meanwhile).
  #track(promise) {
    this.syncing++;
    this.onSync(this.syncing);
    Promise.resolve(promise).finally(() => {
      this.syncing--;
      this.onSync(this.syncing);
    });
    return promise;
  }

  // dispose ends the view for good (sign-out): listeners, timers and the
  // SDK's events; work still under way finds it disposed and stops.
  dispose() {
    this.disposed = true;
    document.removeEventListener("visibilitychange", this.onVisible);
    this.resizeObs.disconnect();
    clearInterval(this.tick);
    clearInterval(this.poll);
    for (const off of this.offs) off();
    for (const p of this.previews.values()) p.then((u) => u && URL.revokeObjectURL(u));
  }
}

function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

function fieldRow(label, control) {
  const id = control.id;
  return h("div", { class: "field" }, h("label", { for: id, text: label }), control);
}

function loadJSON(key) {
  try { return JSON.parse(localStorage.getItem(key) || "{}") || {}; } catch { return {}; }
}

function saveJSON(key, v) {
  try { localStorage.setItem(key, JSON.stringify(v)); } catch { /* storage full or disabled */ }
}
