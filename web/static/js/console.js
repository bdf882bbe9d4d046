// The project console: the project Redis API under /projects/{id}/redis
// (docs/project-redis-api.md): snapshot (permissions, budget, runtime policy),
// cache browser and editor, topics, subscriptions, publish, claim with a
// lease countdown, acknowledgements and receipts.
import { get, request, retrying } from "./api.js";
import { $, countdown, formatBytes, formatDateTime, h, isoTime, relative, shortId, toast, uuid, UUID_RE } from "./dom.js";
import { errorView } from "./errors.js";

// Names that writers of the project chose (topic names, cache keys) may
// hold bidi overrides. Where one sits inside a sentence it is isolated
// (<bdi>, or dir on its element): an override reorders the name alone,
// never the words after it. A name alone in its cell or heading needs
// nothing more, its element ends the override.

const RECENT_MAX = 8;
const CACHE_COLUMNS = ["Key", "Type", "Value", "Size", "Expires", "Updated", "Actions"];
const WRITE_NEEDED = "Needs the write role in this project";

// ttlToken turns the TTL field into the JSON token sent: empty → omitted
// (the server's default), a number as typed (so 1.5 or 1e3 reach the server
// and its stable code is shown), anything else as a string.
export function ttlToken(raw) {
  const t = String(raw).trim();
  if (t === "") return undefined;
  if (/^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$/.test(t)) return t;
  return JSON.stringify(t);
}

// cachePutBody is the raw JSON text of PUT /cache.
export function cachePutBody({ key, type, value, ttl, createOnly }) {
  const parts = [`"key":${JSON.stringify(key)}`, `"type":${JSON.stringify(type)}`, `"value":${JSON.stringify(value)}`];
  const tok = ttlToken(ttl);
  if (tok !== undefined) parts.push(`"ttlSeconds":${tok}`);
  if (createOnly) parts.push(`"createOnly":true`);
  return `{${parts.join(",")}}`;
}

export class ConsoleView {
  constructor({ me }) {
    this.me = me;
    this.pid = null;
    this.base = "";
    this.snap = null;
    this.cacheCursor = null;
    this.cacheQuery = { search: "", prefix: "" };
    this.selectedTopic = null;
    this.selectedSub = null;
    this.claims = []; // claimed items {message, receipt, token, leaseUntil, ack?}
    this.receiptCursor = null;
    this.messagesCursor = null;
    this.recentKey = `han.projects.${me}`;
    this.root = this.#build();
    this.tick = setInterval(() => this.#onTick(), 1000);
  }

  // ---- layout --------------------------------------------------------------------

  #build() {
    this.pidInput = h("input", { id: "project-id", class: "mono", placeholder: "project UUID", autocomplete: "off", spellcheck: "false", required: true });
    this.recentEl = h("div", { class: "recent", id: "recent-projects" });
    const bar = h("form", { id: "project-form", class: "project-bar card" },
      h("div", { class: "field grow" }, h("label", { for: "project-id", text: "Project" }), this.pidInput),
      h("button", { type: "submit", class: "btn btn-primary" }, "Open"),
      this.recentEl);
    bar.addEventListener("submit", (e) => {
      e.preventDefault();
      const id = this.pidInput.value.trim().toLowerCase();
      location.hash = `#/console/${id}`;
      if (id === this.pid) this.refresh();
    });
    this.errEl = h("div", { id: "project-error" });
    this.panels = { cache: this.#cacheCard(), topics: this.#topicsCard(), work: this.#workCard() };
    this.tabs = {};
    const labels = { cache: "Cache", topics: "Topics & subscriptions", work: "Claims & receipts" };
    for (const [name, panel] of Object.entries(this.panels)) {
      panel.id = `panel-${name}`;
      panel.setAttribute("role", "tabpanel");
      panel.setAttribute("aria-labelledby", `tab-${name}`);
      this.tabs[name] = h("button", { type: "button", role: "tab", id: `tab-${name}`, class: "seg-tab",
        "aria-controls": panel.id, onclick: () => this.#showTab(name) }, h("span", { text: labels[name] }), h("span", { class: "tab-count", id: `tab-${name}-count` }));
    }
    const tablist = h("div", { role: "tablist", class: "seg-tabs", "aria-label": "Project sections" }, Object.values(this.tabs));
    tablist.addEventListener("keydown", (e) => {
      const names = Object.keys(this.tabs);
      const i = names.indexOf(this.tab);
      let next = null;
      if (e.key === "ArrowRight") next = names[(i + 1) % names.length];
      else if (e.key === "ArrowLeft") next = names[(i + names.length - 1) % names.length];
      else if (e.key === "Home") next = names[0];
      else if (e.key === "End") next = names[names.length - 1];
      if (!next) return;
      e.preventDefault();
      this.#showTab(next);
      this.tabs[next].focus();
    });
    this.roNote = h("div", { class: "alert alert-info", id: "read-only-note", role: "note", hidden: true });
    this.body = h("div", { id: "project", class: "console-grid", hidden: true },
      this.#overviewCard(), h("div", { class: "console-main" }, this.roNote, tablist, Object.values(this.panels)));
    this.#showTab("cache");
    this.intro = h("div", { class: "empty-card console-intro" },
      h("h2", { text: "Project console" }),
      h("p", { text: "Open a project by its id to browse its cache, topics and subscriptions. Your role in the project decides what you can change." }));
    this.#renderRecent();
    return h("div", { class: "console" }, h("h1", { class: "visually-hidden", text: "Project console" }), bar, this.errEl, this.intro, this.body);
  }

  #overviewCard() {
    this.ovEl = h("div", { id: "overview-body", class: "overview" });
    return h("section", { class: "card overview-card", "aria-labelledby": "ov-h" },
      h("div", { class: "card-head" }, h("h2", { id: "ov-h", text: "Overview" }),
        h("button", { type: "button", class: "btn btn-ghost btn-sm", id: "snapshot-refresh", onclick: () => this.refresh() }, "Refresh")),
      this.ovEl);
  }

  #cacheCard() {
    this.cacheRows = h("tbody", { id: "cache-rows" });
    this.cacheMore = h("button", { type: "button", class: "btn btn-ghost", id: "cache-more", hidden: true, onclick: () => this.#loadCache(false) }, "Load more");
    this.cacheListErr = h("div", { id: "cache-list-error" });
    const filter = h("form", { id: "cache-filter", class: "toolbar", role: "search" },
      h("div", { class: "field" }, h("label", { for: "cache-search", text: "Search" }), h("input", { id: "cache-search", type: "search", placeholder: "part of a key", autocomplete: "off" })),
      h("div", { class: "field" }, h("label", { for: "cache-prefix", text: "Prefix" }), h("input", { id: "cache-prefix", placeholder: "e.g. user:", autocomplete: "off" })),
      h("button", { type: "submit", class: "btn" }, "Apply"));
    filter.addEventListener("submit", (e) => {
      e.preventDefault();
      this.cacheQuery = { search: $("#cache-search", filter).value, prefix: $("#cache-prefix", filter).value };
      this.#loadCache(true);
    });
    const ttl = h("input", { id: "cache-ttl", inputmode: "numeric", autocomplete: "off", placeholder: "86400 (1 day)", class: "mono" });
    const presets = h("div", { class: "presets", role: "group", "aria-label": "TTL presets" },
      [["1 min", 60], ["1 h", 3600], ["1 day", 86400], ["30 days", 2592000]].map(([l, v]) =>
        h("button", { type: "button", class: "chip", onclick: () => { ttl.value = String(v); } }, l)));
    this.putForm = h("form", { id: "cache-put", class: "put-form" },
      h("h3", { text: "Put an entry" }),
      h("div", { class: "row" },
        h("div", { class: "field grow" }, h("label", { for: "cache-key", text: "Key" }), h("input", { id: "cache-key", class: "mono", required: true, autocomplete: "off", spellcheck: "false" })),
        h("div", { class: "field" }, h("label", { for: "cache-type", text: "Type" }),
          h("select", { id: "cache-type" }, h("option", { value: "string", text: "string" }), h("option", { value: "json", text: "json" })))),
      h("div", { class: "field" }, h("label", { for: "cache-value", text: "Value" }), h("textarea", { id: "cache-value", class: "mono", rows: "3", spellcheck: "false" })),
      h("div", { class: "row" },
        h("div", { class: "field" }, h("label", { for: "cache-ttl", text: "TTL (seconds)" }), ttl,
          h("small", { class: "hint", id: "cache-ttl-hint", text: "1 – 2592000; empty means 1 day" })),
        presets),
      h("label", { class: "check" }, h("input", { type: "checkbox", id: "cache-create-only" }), " Create only (fail if the key exists)"),
      h("div", { class: "row" }, h("button", { type: "submit", class: "btn btn-primary", id: "cache-save" }, "Save entry")),
      h("div", { id: "cache-put-result", "aria-live": "polite" }));
    ttl.setAttribute("aria-describedby", "cache-ttl-hint");
    this.putForm.addEventListener("submit", (e) => { e.preventDefault(); this.#putCache(); });
    return h("section", { class: "card cache-card", "aria-labelledby": "cache-h" },
      h("div", { class: "card-head" }, h("h2", { id: "cache-h", text: "Cache" }),
        h("button", { type: "button", class: "btn btn-ghost btn-sm", id: "cache-refresh", onclick: () => this.#loadCache(true) }, "Refresh")),
      filter, this.cacheListErr,
      h("div", { class: "table-wrap" },
        h("table", { id: "cache-table", class: "table table-stack" },
          headRow(CACHE_COLUMNS),
          this.cacheRows)),
      this.cacheMore, this.putForm);
  }

  #topicsCard() {
    this.topicRows = h("tbody", { id: "topic-rows" });
    this.subRows = h("tbody", { id: "sub-rows" });
    this.topicsErr = h("div", { id: "topics-error" });
    const topicForm = this.topicForm = h("form", { id: "topic-create", class: "toolbar" },
      h("div", { class: "field" }, h("label", { for: "topic-name", text: "Topic name" }), h("input", { id: "topic-name", required: true, autocomplete: "off" })),
      h("div", { class: "field grow" }, h("label", { for: "topic-desc", text: "Description" }), h("input", { id: "topic-desc", autocomplete: "off" })),
      h("button", { type: "submit", class: "btn" }, "Create topic"));
    topicForm.addEventListener("submit", (e) => { e.preventDefault(); this.#createTopic(topicForm); });
    this.subTopicSel = h("select", { id: "sub-topic", required: true });
    const subForm = this.subForm = h("form", { id: "sub-create", class: "toolbar" },
      h("div", { class: "field" }, h("label", { for: "sub-topic", text: "Topic" }), this.subTopicSel),
      h("div", { class: "field grow" }, h("label", { for: "sub-name", text: "Subscription name" }), h("input", { id: "sub-name", required: true, autocomplete: "off" })),
      h("button", { type: "submit", class: "btn" }, "Create subscription"));
    subForm.addEventListener("submit", (e) => { e.preventDefault(); this.#createSub(subForm); });

    this.pubTopicSel = h("select", { id: "publish-topic", required: true, "aria-describedby": "publish-empty" });
    this.pubEmpty = h("small", { class: "hint", id: "publish-empty", hidden: true, text: "Create a topic above first: messages are published to a topic." });
    this.pubForm = h("form", { id: "publish-form", class: "put-form" },
      h("h3", { text: "Publish" }),
      h("div", { class: "row" },
        h("div", { class: "field" }, h("label", { for: "publish-topic", text: "Topic" }), this.pubTopicSel, this.pubEmpty),
        h("div", { class: "field" }, h("label", { for: "publish-producer", text: "Producer id" }), h("input", { id: "publish-producer", value: "console", class: "mono", autocomplete: "off" })),
        h("div", { class: "field grow" }, h("label", { for: "publish-event", text: "Client event id" }),
          h("input", { id: "publish-event", value: uuid(), class: "mono", autocomplete: "off", spellcheck: "false" }))),
      h("div", { class: "field" }, h("label", { for: "publish-payload", text: "Payload (JSON object)" }),
        h("textarea", { id: "publish-payload", class: "mono", rows: "3", spellcheck: "false", value: '{"hello":"world"}' })),
      h("div", { class: "row" }, h("button", { type: "submit", class: "btn btn-primary", id: "publish-send" }, "Publish")),
      h("div", { id: "publish-result", "aria-live": "polite" }));
    this.pubForm.addEventListener("submit", (e) => { e.preventDefault(); this.#publish(); });

    this.msgRows = h("tbody", { id: "topic-message-rows" });
    this.msgMore = h("button", { type: "button", class: "btn btn-ghost btn-sm", id: "topic-messages-more", hidden: true, onclick: () => this.#loadMessages(false) }, "Load more");
    this.msgTitle = h("h3", { id: "topic-messages-title", text: "Messages" });
    this.msgBox = h("div", { id: "topic-messages", hidden: true }, this.msgTitle,
      h("div", { class: "table-wrap" }, h("table", { class: "table" },
        h("thead", null, h("tr", null, ["Message", "Producer / event", "Payload", "Size", "Published"].map((t) => h("th", { scope: "col", text: t })))),
        this.msgRows)), this.msgMore);

    return h("section", { class: "card topics-card", "aria-labelledby": "topics-h" },
      h("div", { class: "card-head" }, h("h2", { id: "topics-h", text: "Topics and subscriptions" })),
      this.topicsErr,
      h("div", { class: "two-col" },
        h("div", null,
          h("h3", { text: "Topics" }),
          h("div", { class: "table-wrap" }, h("table", { class: "table", id: "topics-table" },
            headRow(["Name", "Created", "Actions"]), this.topicRows)),
          topicForm),
        h("div", null,
          h("h3", { text: "Subscriptions" }),
          h("div", { class: "table-wrap" }, h("table", { class: "table", id: "subs-table" },
            headRow(["Name", "Topic", "Status", "Actions"]), this.subRows)),
          subForm)),
      this.pubForm, this.msgBox);
  }

  #workCard() {
    this.workTitle = h("h2", { id: "work-h", text: "Claims and receipts" });
    this.claimList = h("ul", { id: "claims", class: "claims" });
    this.receiptRows = h("tbody", { id: "receipt-rows" });
    this.receiptMore = h("button", { type: "button", class: "btn btn-ghost btn-sm", id: "receipts-more", hidden: true, onclick: () => this.#loadReceipts(false) }, "Load more");
    this.workErr = h("div", { id: "work-error" });
    const claimForm = this.claimForm = h("form", { id: "claim-form", class: "toolbar" },
      h("div", { class: "field field-narrow" }, h("label", { for: "claim-count", text: "Count" }),
        h("input", { id: "claim-count", inputmode: "numeric", value: "1", class: "mono narrow" })),
      h("button", { type: "submit", class: "btn btn-primary", id: "claim-send" }, "Claim"),
      h("button", { type: "button", class: "btn btn-ghost", id: "receipts-refresh", onclick: () => this.#loadReceipts(true) }, "Refresh receipts"));
    claimForm.addEventListener("submit", (e) => { e.preventDefault(); this.#claim(); });
    this.workBody = h("div", { id: "work-body", hidden: true }, claimForm, this.workErr, this.claimList,
      h("h3", { text: "Receipts" }),
      h("div", { class: "table-wrap" }, h("table", { class: "table", id: "receipts-table" },
        h("thead", null, h("tr", null, ["Message", "Status", "Attempts", "Lease until", "Result", "Updated"].map((t) => h("th", { scope: "col", text: t })))),
        this.receiptRows)), this.receiptMore);
    this.workHint = h("p", { class: "muted", id: "work-hint", text: "Select a subscription to claim its messages and see its receipts." });
    return h("section", { class: "card work-card", "aria-labelledby": "work-h" },
      h("div", { class: "card-head" }, this.workTitle), this.workHint, this.workBody);
  }

  #showTab(name) {
    this.tab = name;
    for (const [n, tab] of Object.entries(this.tabs)) {
      const on = n === name;
      tab.setAttribute("aria-selected", String(on));
      tab.tabIndex = on ? 0 : -1;
      this.panels[n].hidden = !on;
    }
  }

  // ---- project -------------------------------------------------------------------

  // open loads a project (the router calls it; null shows the picker).
  open(pid) {
    pid = pid ? pid.toLowerCase() : null;
    if (pid === this.pid && this.snap) return;
    this.pid = pid;
    this.snap = null;
    this.selectedTopic = null;
    this.selectedSub = null;
    this.claims = [];
    this.errEl.replaceChildren();
    this.body.hidden = true;
    this.intro.hidden = !!pid;
    if (!pid) return;
    this.pidInput.value = pid;
    this.base = `/projects/${encodeURIComponent(pid)}/redis`;
    this.refresh().then((ok) => {
      if (!ok) return;
      this.#remember(pid);
      this.#loadCache(true);
    });
  }

  async refresh() {
    if (!this.pid) return false;
    try {
      this.snap = await get(`${this.base}/`);
    } catch (e) {
      this.errEl.replaceChildren(errorView(e, "project-load-error"));
      this.body.hidden = true;
      return false;
    }
    this.errEl.replaceChildren();
    this.body.hidden = false;
    this.intro.hidden = true;
    this.#renderOverview();
    this.#renderTopics();
    return true;
  }

  #remember(pid) {
    let list = [];
    try { list = JSON.parse(localStorage.getItem(this.recentKey) || "[]"); } catch { /* ignore */ }
    list = [pid, ...list.filter((x) => x !== pid)].slice(0, RECENT_MAX);
    try { localStorage.setItem(this.recentKey, JSON.stringify(list)); } catch { /* ignore */ }
    this.#renderRecent();
  }

  #renderRecent() {
    let list = [];
    try { list = JSON.parse(localStorage.getItem(this.recentKey) || "[]"); } catch { /* ignore */ }
    list = list.filter((x) => UUID_RE.test(x));
    this.recentEl.replaceChildren(...(list.length ? [h("span", { class: "muted", text: "Recent:" })] : []),
      ...list.map((id) => h("a", { class: "chip mono", href: `#/console/${id}`, title: id, text: shortId(id) })));
  }

  get #canWrite() { return !!(this.snap && this.snap.permissions && this.snap.permissions.write); }

  #renderOverview() {
    const s = this.snap;
    const perm = s.permissions || {};
    const rt = s.runtime || {};
    const cache = s.cache || {};
    const budget = s.budget || {};
    const stat = (label, value, extra, cls) => h("div", { class: `stat${cls ? ` ${cls}` : ""}` }, h("div", { class: "stat-label", text: label }), h("div", { class: "stat-value" }, value), extra || null);
    const bar = (used, limit, id) => {
      const pct = limit > 0 ? Math.min(100, (used / limit) * 100) : 0;
      return h("div", { class: `meter${pct > 85 ? " meter-hot" : ""}`, id, role: "meter", "aria-label": "Reliable budget used",
        "aria-valuemin": "0", "aria-valuemax": String(limit), "aria-valuenow": String(used), "aria-valuetext": `${formatBytes(used)} of ${formatBytes(limit)}` },
        h("span", { class: "meter-fill", dataset: { pct: pct.toFixed(1) } }));
    };
    const pausedBtn = h("button", { type: "button", class: "btn btn-sm", id: "delivery-toggle", disabled: !this.#canWrite,
      title: this.#canWrite ? null : WRITE_NEEDED,
      onclick: () => this.#setSetting({ deliveryPaused: !rt.deliveryPaused }) }, rt.deliveryPaused ? "Resume delivery" : "Pause delivery");
    const items = [
      stat("Your role", h("span", { class: `badge-role role-${perm.role}`, id: "project-role", text: perm.role || "?" })),
      stat("Eviction policy", h("span", { class: "mono", id: "eviction-policy", text: rt.evictionPolicy || "?" }),
        h("div", { class: rt.writesAllowed ? "ok" : "bad", text: rt.writesAllowed ? "writes allowed" : "writes refused (unsafe policy)" })),
      stat("Delivery", h("span", { id: "delivery-state", class: rt.deliveryPaused ? "warn" : "ok", text: rt.deliveryPaused ? "paused" : "running" }), pausedBtn),
      stat("Cache", h("span", { id: "cache-usage", text: `${cache.entries ?? 0} ${cache.entries === 1 ? "entry" : "entries"} · ${formatBytes(cache.usageBytes ?? 0)}` }),
        h("div", { class: "muted", text: `item quota ${formatBytes(cache.quotaBytes)}` })),
      stat("Reliable budget", h("span", { id: "budget", text: `${formatBytes(budget.usedBytes ?? 0)} of ${formatBytes(budget.limitBytes)}` }),
        h("div", null, bar(budget.usedBytes || 0, budget.limitBytes || 0, "budget-meter"),
          h("div", { class: "muted", text: `module budget ${formatBytes(budget.moduleLimitBytes)}` }))),
    ];
    if (cache.legacyEntries > 0) {
      items.push(stat("Legacy entries", h("span", { id: "legacy-summary", text: `${cache.legacyEntries} without expiry` }),
        h("div", { class: "muted", text: `${cache.legacyDeadlinePending ? "provisional deadline" : "deadline"} ${formatDateTime(cache.legacyExpiresAt)}` })));
    }
    if (perm.admin) {
      const q = h("input", { id: "quota-input", class: "mono", inputmode: "numeric", size: "10", value: String(cache.quotaBytes ?? ""),
        "aria-describedby": "quota-hint" });
      const hint = h("small", { class: "hint", id: "quota-hint", text: `= ${formatBytes(cache.quotaBytes)} per entry (key plus value)` });
      q.addEventListener("input", () => {
        const n = Number(q.value.trim());
        hint.textContent = Number.isInteger(n) && n > 0 ? `= ${formatBytes(n)} per entry (key plus value)` : "a whole number of bytes";
      });
      const f = h("form", { class: "quota-form", id: "quota-form" }, h("label", { for: "quota-input", class: "visually-hidden", text: "Cache item quota in bytes" }),
        h("div", { class: "inline-form" }, h("span", { class: "input-unit" }, q, h("span", { class: "unit", id: "quota-unit", "aria-hidden": "true", text: "bytes" })),
          h("button", { type: "submit", class: "btn btn-sm" }, "Set quota")), hint);
      f.addEventListener("submit", (e) => {
        e.preventDefault();
        const n = Number(q.value.trim());
        this.#setSetting({ cacheQuotaBytes: Number.isInteger(n) ? n : q.value.trim() });
      });
      items.push(stat("Cache item quota (admin)", f, null, "stat-wide"));
    }
    this.settingsErr = h("div", { id: "settings-error" });
    this.ovEl.replaceChildren(h("div", { class: "stats" }, items), this.settingsErr);
    const listed = (cache.entries || 0) + (cache.legacyEntries || 0);
    this.tabs.cache.querySelector(".tab-count").textContent = listed ? String(listed) : "";
    for (const el of this.ovEl.querySelectorAll(".meter-fill")) el.style.width = `${el.dataset.pct}%`;
    this.#syncControls();
  }

  // #syncControls disables what the caller's role or the project's state
  // rules out, and says why: a reader sees the note above the tabs (and a
  // tooltip on each disabled button); with no topic yet, publishing and
  // subscribing wait for one.
  #syncControls() {
    const w = this.#canWrite;
    const role = (this.snap && this.snap.permissions && this.snap.permissions.role) || "none";
    this.roNote.hidden = w;
    this.roNote.replaceChildren(h("strong", { text: "Read-only. " }),
      `Your role in this project is “${role}”: you can browse everything, but changing the cache, topics, subscriptions, claims and settings needs the write role.`);
    for (const form of [this.putForm, this.topicForm, this.subForm, this.pubForm, this.claimForm]) {
      for (const el of form.elements) {
        el.disabled = !w;
        if (el.tagName === "BUTTON") el.title = w ? "" : WRITE_NEEDED;
      }
    }
    for (const b of this.cacheRows.querySelectorAll(".cache-edit, .danger")) {
      b.disabled = !w;
      b.title = w ? "" : WRITE_NEEDED;
    }
    const noTopics = !(this.snap && (this.snap.topics || []).length);
    if (noTopics) {
      for (const b of [this.pubForm.querySelector("#publish-send"), this.subForm.querySelector("button[type=submit]")]) b.disabled = true;
    }
    this.pubEmpty.hidden = !noTopics;
  }

  async #setSetting(body) {
    this.settingsErr.replaceChildren();
    try {
      await request("PUT", `${this.base}/settings`, { body });
      await this.refresh();
    } catch (e) {
      this.settingsErr.replaceChildren(errorView(e, "settings-error-alert"));
    }
  }

  // ---- cache -------------------------------------------------------------------------

  async #loadCache(reset) {
    if (reset) {
      this.cacheCursor = null;
      this.cacheRows.replaceChildren();
    }
    this.cacheListErr.replaceChildren();
    const q = new URLSearchParams({ limit: "50" });
    if (this.cacheQuery.search) q.set("search", this.cacheQuery.search);
    if (this.cacheQuery.prefix) q.set("prefix", this.cacheQuery.prefix);
    if (this.cacheCursor) q.set("cursor", this.cacheCursor);
    let page;
    try {
      page = await get(`${this.base}/cache?${q}`);
    } catch (e) {
      this.cacheListErr.replaceChildren(errorView(e, "cache-list-error-alert"));
      return;
    }
    for (const it of page.items || []) {
      this.cacheRows.querySelector(`tr[data-key="${CSS.escape(it.key)}"]`)?.remove();
      this.cacheRows.append(this.#cacheRow(it));
    }
    if (!this.cacheRows.children.length) {
      this.cacheRows.append(h("tr", { class: "empty-row" }, h("td", { colspan: "7", class: "muted", text: "No entries match." })));
    }
    this.cacheCursor = page.nextCursor;
    this.cacheMore.hidden = page.nextCursor == null;
  }

  #cacheRow(it) {
    const preview = it.value.length > 80 ? `${it.value.slice(0, 80)}…` : it.value;
    const badges = [];
    if (it.legacyNoExpiry) badges.push(h("span", { class: "tag tag-warn", title: "saved as never-expiring before the upgrade", text: "legacy · no expiry" }));
    if (it.legacyDeadlinePending) badges.push(h("span", { class: "tag", title: "the deadline moves until the next write fixes it", text: "deadline pending" }));
    const del = h("button", { type: "button", class: "btn btn-sm btn-ghost danger", disabled: !this.#canWrite,
      title: this.#canWrite ? null : WRITE_NEEDED, "aria-label": `Delete ${it.key}` }, "Delete");
    del.addEventListener("click", () => this.#deleteCache(it.key, del));
    const edit = h("button", { type: "button", class: "btn btn-sm btn-ghost cache-edit", "aria-label": `Edit ${it.key}`, disabled: !this.#canWrite,
      title: this.#canWrite ? null : WRITE_NEEDED, onclick: () => {
      $("#cache-key", this.putForm).value = it.key;
      $("#cache-type", this.putForm).value = it.type;
      $("#cache-value", this.putForm).value = it.value;
      $("#cache-key", this.putForm).focus();
    } }, "Edit");
    // data-label names each cell where narrow screens stack a row's cells
    // (app.css), the column headers being out of sight there.
    return h("tr", { dataset: { key: it.key, expiresAt: String(it.expiresAt) } },
      h("th", { scope: "row", class: "mono key-cell", title: it.key, "data-label": "Key" }, h("span", { text: it.key })),
      h("td", { "data-label": "Type" }, h("span", { class: `tag tag-${it.type}`, text: it.type })),
      h("td", { class: "mono value-cell", title: it.value, "data-label": "Value" }, h("span", { text: preview })),
      h("td", { class: "num", "data-label": "Size" }, h("span", { text: formatBytes(it.sizeBytes) })),
      h("td", { class: "expires-cell", "data-label": "Expires" },
        h("time", { class: "expires", datetime: isoTime(it.expiresAt), text: formatDateTime(it.expiresAt) }),
        h("div", { class: "muted rel", dataset: { rel: String(it.expiresAt) }, text: relative(it.expiresAt) }), badges),
      h("td", { class: "muted nowrap", title: it.updatedAt ? formatDateTime(it.updatedAt) : "unknown (legacy entry)", "data-label": "Updated" },
        h("span", { dataset: it.updatedAt ? { rel: String(it.updatedAt) } : null, text: it.updatedAt ? relative(it.updatedAt) : "—" })),
      h("td", { class: "actions" }, edit, del));
  }

  async #putCache() {
    const out = $("#cache-put-result", this.putForm);
    out.replaceChildren();
    const f = this.putForm;
    const raw = cachePutBody({ key: $("#cache-key", f).value, type: $("#cache-type", f).value, value: $("#cache-value", f).value,
      ttl: $("#cache-ttl", f).value, createOnly: $("#cache-create-only", f).checked });
    try {
      const { status, data } = await request("PUT", `${this.base}/cache`, { rawBody: raw });
      out.replaceChildren(h("div", { class: "alert alert-ok", role: "status", id: "cache-put-ok" },
        `${status === 201 ? "Created" : "Replaced"} `, h("code", { dir: "auto", text: data.key }), ` — expires ${formatDateTime(data.expiresAt)} (${relative(data.expiresAt)}).`));
      await this.#loadCache(true);
      this.refresh();
    } catch (e) {
      out.replaceChildren(errorView(e, "cache-put-error"));
    }
    out.scrollIntoView({ block: "nearest" });
  }

  async #deleteCache(key, btn) {
    // Two-step: the first click arms the button for 4 s.
    if (btn.dataset.armed !== "1") {
      btn.dataset.armed = "1";
      btn.textContent = "Confirm delete";
      btn.classList.add("armed");
      setTimeout(() => { btn.dataset.armed = ""; btn.textContent = "Delete"; btn.classList.remove("armed"); }, 4000);
      return;
    }
    try {
      await request("DELETE", `${this.base}/cache?key=${encodeURIComponent(key)}`);
      btn.closest("tr")?.remove();
      toast(h("span", null, "Deleted ", h("bdi", { text: key })), "success");
      this.refresh();
    } catch (e) {
      this.cacheListErr.replaceChildren(errorView(e, "cache-list-error-alert"));
    }
  }

  // ---- topics and subscriptions -------------------------------------------------------------

  #topicName(id) {
    const t = (this.snap.topics || []).find((x) => x.id === id);
    return t ? t.name : shortId(id);
  }

  #renderTopics() {
    const topics = this.snap.topics || [];
    const subs = this.snap.subscriptions || [];
    this.topicRows.replaceChildren(...topics.map((t) => this.#topicRow(t)));
    if (!topics.length) this.topicRows.append(h("tr", null, h("td", { colspan: "3", class: "muted", text: "No topics yet." })));
    this.subRows.replaceChildren(...subs.map((s) => this.#subRow(s)));
    $("#tab-topics-count", this.root).textContent = topics.length ? String(topics.length) : "";
    if (!subs.length) this.subRows.append(h("tr", null, h("td", { colspan: "4", class: "muted", text: "No subscriptions yet." })));
    const opts = (sel) => {
      const cur = sel.value;
      if (!topics.length) {
        sel.replaceChildren(h("option", { value: "", text: "No topics yet — create one first" }));
        return;
      }
      sel.replaceChildren(...topics.map((t) => h("option", { value: t.id, text: t.name })));
      if (topics.some((t) => t.id === cur)) sel.value = cur;
      else if (this.selectedTopic) sel.value = this.selectedTopic;
    };
    opts(this.subTopicSel);
    opts(this.pubTopicSel);
    if (this.selectedSub && !subs.some((s) => s.id === this.selectedSub)) this.#selectSub(null);
    if (this.selectedTopic && !topics.some((t) => t.id === this.selectedTopic)) this.#selectTopic(null);
    this.#syncControls();
  }

  #topicRow(t) {
    const w = this.#canWrite;
    const name = h("th", { scope: "row" }, h("div", { text: t.name }),
      t.description ? h("div", { class: "muted small", text: t.description }) : null,
      h("div", { class: "muted mono small", title: t.id, text: shortId(t.id) }));
    const actions = h("td", { class: "actions" },
      h("button", { type: "button", class: "btn btn-sm btn-ghost", onclick: () => this.#selectTopic(t.id) }, "Messages"),
      h("button", { type: "button", class: "btn btn-sm btn-ghost", disabled: !w, title: w ? null : WRITE_NEEDED, onclick: () => this.#trim(t.id) }, "Trim"),
      this.#armed("Delete", !w, () => this.#mutate("DELETE", `/topics/${t.id}`, null, this.topicsErr)));
    return h("tr", { dataset: { topicId: t.id, name: t.name }, class: t.id === this.selectedTopic ? "selected" : null },
      name, h("td", { class: "muted nowrap", title: t.createdAt ? formatDateTime(t.createdAt) : "", dataset: { rel: String(t.createdAt) }, text: relative(t.createdAt) }), actions);
  }

  #subRow(s) {
    const w = this.#canWrite;
    const paused = s.status === "paused";
    const toggle = h("button", { type: "button", class: "btn btn-sm btn-ghost", disabled: !w, title: w ? null : WRITE_NEEDED,
      onclick: () => this.#mutate("PATCH", `/subscriptions/${s.id}`, { status: paused ? "online" : "paused" }, this.topicsErr) },
    paused ? "Resume" : "Pause");
    const actions = h("td", { class: "actions" },
      h("button", { type: "button", class: "btn btn-sm", onclick: () => { this.#selectSub(s.id); this.#showTab("work"); } }, "Work"), toggle,
      this.#armed("Delete", !w, () => this.#mutate("DELETE", `/subscriptions/${s.id}`, null, this.topicsErr)));
    return h("tr", { dataset: { subId: s.id, name: s.name, status: s.status }, class: s.id === this.selectedSub ? "selected" : null },
      h("th", { scope: "row" }, h("div", { text: s.name }), h("div", { class: "muted mono small", title: s.id, text: shortId(s.id) })),
      h("td", { text: this.#topicName(s.topicId) }),
      h("td", null, h("span", { class: `tag tag-${s.status}`, text: s.status })),
      actions);
  }

  #armed(label, disabled, fn) {
    const b = h("button", { type: "button", class: "btn btn-sm btn-ghost danger", disabled, title: disabled ? WRITE_NEEDED : null }, label);
    b.addEventListener("click", () => {
      if (b.dataset.armed !== "1") {
        b.dataset.armed = "1";
        b.textContent = "Confirm";
        b.classList.add("armed");
        setTimeout(() => { b.dataset.armed = ""; b.textContent = label; b.classList.remove("armed"); }, 4000);
        return;
      }
      fn();
    });
    return b;
  }

  async #mutate(method, path, body, errBox) {
    errBox.replaceChildren();
    try {
      const res = await request(method, `${this.base}${path}`, body === null ? {} : { body });
      await this.refresh();
      return res;
    } catch (e) {
      errBox.replaceChildren(errorView(e));
      return null;
    }
  }

  async #createTopic(form) {
    const res = await this.#mutate("POST", "/topics", { name: $("#topic-name", form).value.trim(), description: $("#topic-desc", form).value }, this.topicsErr);
    if (res) {
      form.reset();
      this.#selectTopic(res.data.id);
    }
  }

  async #createSub(form) {
    const res = await this.#mutate("POST", "/subscriptions", { topicId: this.subTopicSel.value, name: $("#sub-name", form).value.trim() }, this.topicsErr);
    if (res) {
      form.reset();
      this.#selectSub(res.data.id);
    }
  }

  async #trim(topicId) {
    const res = await this.#mutate("POST", `/topics/${topicId}/trim`, {}, this.topicsErr);
    if (res) {
      const d = res.data || {};
      toast(h("span", null, `Trimmed ${d.trimmed ?? 0} message(s) from `, h("bdi", { text: this.#topicName(topicId) }),
        `, released ${formatBytes(d.releasedBytes ?? 0)}.`), "success");
    }
    if (topicId === this.selectedTopic) this.#loadMessages(true);
  }

  #selectTopic(id) {
    this.selectedTopic = id;
    this.msgBox.hidden = !id;
    if (id) {
      this.pubTopicSel.value = id;
      this.msgTitle.textContent = `Messages of ${this.#topicName(id)}`;
      this.#loadMessages(true);
    }
    for (const tr of this.topicRows.querySelectorAll("tr[data-topic-id]")) tr.classList.toggle("selected", tr.dataset.topicId === id);
  }

  async #publish() {
    const out = $("#publish-result", this.pubForm);
    out.replaceChildren();
    const topicId = this.pubTopicSel.value;
    const evInput = $("#publish-event", this.pubForm);
    let payload;
    try {
      payload = JSON.parse($("#publish-payload", this.pubForm).value);
    } catch {
      out.replaceChildren(errorView({ code: "invalid_payload" }, "publish-error"));
      return;
    }
    const body = { producerId: $("#publish-producer", this.pubForm).value, clientEventId: evInput.value, payload };
    try {
      // Same identity and payload on every retry: the server returns the
      // same message instead of publishing twice (24 h dedupe window).
      const { status, data } = await retrying(() => request("POST", `${this.base}/topics/${topicId}/messages`, { body }), { attempts: 4 });
      out.replaceChildren(h("div", { class: "alert alert-ok", role: "status", id: "publish-ok", dataset: { messageId: data.id } },
        status === 201 ? "Published " : "Already published — same message ", h("code", { text: shortId(data.id) }),
        " to ", h("bdi", { text: this.#topicName(topicId) }), ` (${formatBytes(data.sizeBytes)}).`));
      evInput.value = uuid();
      this.refresh();
      if (topicId === this.selectedTopic) this.#loadMessages(true);
      if (this.selectedSub) this.#loadReceipts(true);
    } catch (e) {
      out.replaceChildren(errorView(e, "publish-error"));
    }
    out.scrollIntoView({ block: "nearest" });
  }

  async #loadMessages(reset) {
    const id = this.selectedTopic;
    if (!id) return;
    if (reset) {
      this.messagesCursor = null;
      this.msgRows.replaceChildren();
    }
    const q = new URLSearchParams({ limit: "50" });
    if (this.messagesCursor) q.set("cursor", this.messagesCursor);
    try {
      const page = await get(`${this.base}/topics/${id}/messages?${q}`);
      for (const m of page.items || []) {
        this.msgRows.append(h("tr", { dataset: { messageId: m.id } },
          h("th", { scope: "row", class: "mono", title: m.id, text: shortId(m.id) }),
          h("td", { class: "mono small" }, h("div", { text: m.producerId }), h("div", { class: "muted", text: m.clientEventId })),
          h("td", { class: "mono value-cell", text: JSON.stringify(m.payload) }),
          h("td", { class: "num", text: formatBytes(m.sizeBytes) }),
          h("td", { class: "muted", text: formatDateTime(m.publishedAt) })));
      }
      if (!this.msgRows.children.length) this.msgRows.append(h("tr", null, h("td", { colspan: "5", class: "muted", text: "No messages." })));
      this.messagesCursor = page.nextCursor;
      this.msgMore.hidden = page.nextCursor == null;
    } catch (e) {
      this.msgRows.replaceChildren(h("tr", null, h("td", { colspan: "5" }, errorView(e))));
    }
  }

  // ---- claims and receipts ---------------------------------------------------------------

  #selectSub(id) {
    this.selectedSub = id;
    this.claims = [];
    this.claimList.replaceChildren();
    this.workErr.replaceChildren();
    this.workBody.hidden = !id;
    this.workHint.hidden = !!id;
    const s = id && (this.snap.subscriptions || []).find((x) => x.id === id);
    this.workTitle.textContent = s ? `Claims and receipts — ${s.name}` : "Claims and receipts";
    for (const tr of this.subRows.querySelectorAll("tr[data-sub-id]")) tr.classList.toggle("selected", tr.dataset.subId === id);
    if (id) this.#loadReceipts(true);
  }

  async #claim() {
    this.workErr.replaceChildren();
    const raw = $("#claim-count", this.root).value.trim();
    const count = /^\d+$/.test(raw) ? Number(raw) : raw;
    try {
      const { data } = await request("POST", `${this.base}/subscriptions/${this.selectedSub}/claim`, { body: { count } });
      const items = Array.isArray(data) ? data : data.items || [];
      if (!items.length) {
        this.workErr.replaceChildren(h("div", { class: "alert", role: "status", id: "claim-empty", text: "Nothing to claim right now." }));
      }
      for (const it of items) {
        this.claims = this.claims.filter((c) => c.message.id !== it.message.id);
        this.claims.push({ ...it, ack: null, error: null });
      }
      this.#renderClaims();
      this.#loadReceipts(true);
    } catch (e) {
      this.workErr.replaceChildren(errorView(e, "claim-error"));
    }
  }

  #renderClaims() {
    this.claimList.replaceChildren(...this.claims.map((c) => {
      const result = h("input", { class: "mono", id: `result-${c.message.id}`, maxlength: "256", placeholder: "result (optional, ≤ 256 bytes)", autocomplete: "off" });
      const done = c.ack && ["processed", "failed", "exhausted"].includes(c.ack.status);
      const lease = h("div", { class: "lease", dataset: { leaseUntil: String(c.leaseUntil) } });
      paintLease(lease);
      return h("li", { class: `claim card-inner${done ? " done" : ""}`, dataset: { messageId: c.message.id } },
        h("div", { class: "claim-head" },
          h("span", { class: "mono", title: c.message.id, text: `message ${shortId(c.message.id)}` }),
          c.ack ? h("span", { class: `tag tag-${c.ack.status}`, dataset: { receiptStatus: c.ack.status }, text: c.ack.status }) : lease,
          h("span", { class: "muted", text: `attempt ${c.receipt ? c.receipt.attempts : "?"}` })),
        h("pre", { class: "payload mono", text: JSON.stringify(c.message.payload, null, 2) }),
        c.ack && c.ack.result ? h("div", { class: "small" }, "result ", h("code", { text: c.ack.result })) : null,
        done ? null : h("div", { class: "row" },
          h("label", { for: result.id, class: "visually-hidden", text: "Result" }), result,
          h("button", { type: "button", class: "btn btn-sm btn-primary ack-processed", onclick: () => this.#ack(c, "processed", result.value) }, "Ack processed"),
          h("button", { type: "button", class: "btn btn-sm ack-failed", onclick: () => this.#ack(c, "failed", result.value) }, "Ack failed")),
        c.error ? errorView(c.error) : null);
    }));
  }

  async #ack(c, status, result) {
    c.error = null;
    try {
      const { data } = await retrying(() => request("POST", `${this.base}/subscriptions/${this.selectedSub}/receipts`,
        { body: { messageId: c.message.id, token: c.token, status, result } }), { attempts: 3 });
      c.ack = data.receipt || data;
    } catch (e) {
      c.error = e;
    }
    this.#renderClaims();
    this.#loadReceipts(true);
    this.refresh();
  }

  async #loadReceipts(reset) {
    const id = this.selectedSub;
    if (!id) return;
    if (reset) this.receiptCursor = null;
    const q = new URLSearchParams({ limit: "50" });
    if (this.receiptCursor) q.set("cursor", this.receiptCursor);
    try {
      const page = await get(`${this.base}/subscriptions/${id}/receipts?${q}`);
      if (id !== this.selectedSub) return;
      const rows = (page.items || []).map((r) => h("tr", { dataset: { messageId: r.messageId, status: r.status } },
        h("th", { scope: "row", class: "mono", title: r.messageId, text: shortId(r.messageId) }),
        h("td", null, h("span", { class: `tag tag-${r.status}`, text: r.status })),
        h("td", { class: "num", text: String(r.attempts) }),
        h("td", { class: "muted", text: r.leaseUntil ? formatDateTime(r.leaseUntil) : "—" }),
        h("td", { class: "mono value-cell", text: r.result || "" }),
        h("td", { class: "muted", text: r.updatedAt ? formatDateTime(r.updatedAt) : "—" })));
      if (reset) this.receiptRows.replaceChildren(...rows);
      else this.receiptRows.append(...rows);
      if (!this.receiptRows.children.length) this.receiptRows.append(h("tr", null, h("td", { colspan: "6", class: "muted", text: "No receipts yet." })));
      this.receiptCursor = page.nextCursor;
      this.receiptMore.hidden = page.nextCursor == null;
    } catch (e) {
      if (reset) this.receiptRows.replaceChildren(h("tr", null, h("td", { colspan: "6" }, errorView(e))));
    }
  }

  #onTick() {
    for (const el of this.root.querySelectorAll(".lease[data-lease-until]")) paintLease(el);
    for (const el of this.root.querySelectorAll("[data-rel]")) el.textContent = relative(Number(el.dataset.rel));
  }

  dispose() { clearInterval(this.tick); }
}

// headRow is a table head; the actions column's header is for screen
// readers only (an empty header names nothing).
function headRow(cols) {
  return h("thead", null, h("tr", null, cols.map((t) => (t === "Actions"
    ? h("th", { scope: "col" }, h("span", { class: "visually-hidden", text: t }))
    : h("th", { scope: "col", text: t })))));
}

function paintLease(el) {
  const left = Number(el.dataset.leaseUntil) - Date.now();
  el.classList.toggle("lease-expired", left <= 0);
  el.classList.toggle("lease-low", left > 0 && left < 15000);
  el.textContent = left > 0 ? `lease ${countdown(left)} left` : "lease expired";
}

