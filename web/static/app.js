// Minimal HAN chat client: REST only (sign in with a token, list dialogs,
// read history with afterSeq, send). Realtime arrives with the gateway.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const state = { token: sessionStorage.getItem("han.token") || "", me: null, dialog: null, lastSeq: 0 };

  async function api(method, path, body, extra) {
    const headers = Object.assign({ Authorization: "Bearer " + state.token }, extra || {});
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const data = res.status === 204 ? null : await res.json();
    if (!res.ok) throw new Error((data && data.error) || "http_" + res.status);
    return data;
  }

  function newKey() {
    if (crypto.randomUUID) return crypto.randomUUID();
    return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function status(msg) { $("status").textContent = msg || ""; }

  async function signIn() {
    try {
      state.me = await api("GET", "/v1/me");
      sessionStorage.setItem("han.token", state.token);
      $("me").textContent = "signed in as " + state.me.id;
      status("");
      await loadDialogs();
    } catch (e) { status("sign-in failed: " + e.message); }
  }

  async function loadDialogs() {
    const list = await api("GET", "/v1/dialogs?limit=100");
    const ul = $("dialogs");
    ul.replaceChildren();
    for (const d of list.items) {
      const li = document.createElement("li");
      li.textContent = (d.title || "(untitled)") + " · " + d.memberIds.length + " members";
      li.dataset.id = d.id;
      if (state.dialog && state.dialog.id === d.id) li.className = "active";
      li.onclick = () => openDialog(d);
      ul.appendChild(li);
    }
  }

  async function openDialog(d) {
    state.dialog = d;
    state.lastSeq = 0;
    $("dialog-title").textContent = d.title || d.id;
    $("messages").replaceChildren();
    $("body").disabled = false;
    $("send").querySelector("button").disabled = false;
    for (const li of $("dialogs").children) li.className = li.dataset.id === d.id ? "active" : "";
    await reconcile();
  }

  // Reconciliation: fetch everything after the last seq we hold, page by page.
  async function reconcile() {
    if (!state.dialog) return;
    for (;;) {
      const page = await api("GET", "/v1/dialogs/" + state.dialog.id + "/messages?limit=100&afterSeq=" + state.lastSeq);
      for (const m of page.items) show(m);
      if (!page.nextCursor) break;
    }
  }

  function show(m) {
    if (m.seq <= state.lastSeq) return;
    state.lastSeq = m.seq;
    const li = document.createElement("li");
    const seq = document.createElement("span");
    seq.className = "seq";
    seq.textContent = "#" + m.seq + " " + new Date(m.createdAt).toLocaleTimeString();
    li.append(seq, (m.senderId === (state.me && state.me.id) ? "me" : m.senderId.slice(0, 8)) + ": " + m.body);
    $("messages").appendChild(li);
    li.scrollIntoView({ block: "end" });
  }

  $("login").onsubmit = (e) => { e.preventDefault(); state.token = $("token").value.trim(); signIn(); };
  $("send").onsubmit = async (e) => {
    e.preventDefault();
    const body = $("body").value;
    if (!body.trim() || !state.dialog) return;
    try {
      // One Idempotency-Key per message: a retry of this send must reuse it.
      await api("POST", "/v1/dialogs/" + state.dialog.id + "/messages", { body }, { "Idempotency-Key": newKey() });
      $("body").value = "";
      await reconcile();
    } catch (err) { status("send failed: " + err.message); }
  };
  $("new-dialog").onsubmit = async (e) => {
    e.preventDefault();
    try {
      const d = await api("POST", "/v1/dialogs", { memberIds: [$("member").value.trim()] });
      $("member").value = "";
      await loadDialogs();
      await openDialog(d);
    } catch (err) { status("could not create dialog: " + err.message); }
  };
  setInterval(() => { if (state.dialog) reconcile().catch(() => {}); }, 3000);
  if (state.token) { $("token").value = state.token; signIn(); }
})();
