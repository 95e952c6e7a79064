// The daemon's page: sessions with head and lag, one session's firings live (with their
// tags, and who sent each), a box to send, and the session's approvals: an agent's
// permission prompts (SPEC §19) with Allow and Deny, and who answered what.
// Plain JavaScript, no build step, nothing loaded from elsewhere. The token is asked for
// once and kept for this tab (sessionStorage); it goes in an Authorization header, never
// in a URL. The live view is the session's event stream (GET /sessions/ID/events), read
// with fetch because EventSource cannot send a header.
"use strict";

const KEY = "repl-token";
const SHOWN = 200; // firings kept on the page
// The sessions' table. The shown session's stream moves its row's head at once (and its
// lag and retained as the daemon will count them); everything else in the table (sessions
// started or stopped elsewhere, other sessions' heads, cursors that moved) is told by no
// stream the daemon has, and one event stream a session would take one connection each (a
// browser opens 6 a host): so the listing is read again after what the page sees happen,
// and otherwise every LIST_EVERY_MS while the tab is visible, never while it is hidden.
const LIST_EVERY_MS = 5000;
// after a firing in the shown session, its lag and waiters a listing later (a consumer's
// ack), at most one listing this often however fast firings come
const LIST_AFTER_FIRING_MS = 1000;
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem(KEY);
let current = null; // the session shown
let stream = null; // its stream's AbortController
let seen = 0; // the newest seq its stream told: its head is at least that
const known = new Map(); // each listed session's id -> { row: its figures, tr: its table row }
let listing = null; // the listing in flight (a promise): one at a time
let again = false; // another is wanted once it is answered
let listTimer = null; // the next slow listing
let firingTimer = null; // the listing due after a firing
// Approvals: the shown session's prompts (GET /sessions/ID/approvals?all=true), read again
// when its stream brings a firing tagged approval (a prompt or a verdict): no polling.
// A pending prompt's age is painted again every AGE_EVERY_MS by the page alone; one that
// waited STALE_MS says it may have been answered at the terminal (Claude Code's own dialog
// stays open, and tells nobody when it is answered there).
const AGE_EVERY_MS = 10_000;
const STALE_MS = 10 * 60 * 1000;
let approvalsLoading = null; // the read in flight (a promise): one at a time
let approvalsAgain = false; // another is wanted once it is answered
const pendingItems = new Map(); // request id -> its <li> (kept: a reason typed stays)

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${token}`, ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    logout("The token was refused: give it again.");
    throw new Error("unauthorized");
  }
  return response;
}

function status(text) {
  $("status").textContent = text;
}

function logout(why = "") {
  sessionStorage.removeItem(KEY);
  token = null;
  current = null;
  if (stream) stream.abort();
  clearTimeout(listTimer);
  clearTimeout(firingTimer);
  firingTimer = null;
  known.clear();
  clearApprovals();
  $("sessions").tBodies[0].replaceChildren();
  $("app").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = why;
  $("token").focus();
}

async function login(given) {
  token = given.trim();
  const response = await fetch("/sessions", { headers: { Authorization: `Bearer ${token}` } });
  if (!response.ok) {
    token = null;
    $("login-error").textContent =
      response.status === 401
        ? "That token was refused: give the root token, or one made by repl token add."
        : `The daemon answered ${response.status}.`;
    return;
  }
  sessionStorage.setItem(KEY, token);
  start();
}

function start() {
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
  const wanted = decodeURIComponent(location.hash.slice(1));
  if (wanted) show(wanted);
  else list();
}

// The sessions listed again (GET /sessions), the table made to match. A call while one is
// in flight is answered once another has been read after it, so what it sees is not older
// than the call.
function list() {
  if (listing) {
    again = true;
    return listing;
  }
  listing = (async () => {
    try {
      do {
        again = false;
        await listOnce();
      } while (again && token);
    } finally {
      listing = null;
      clearTimeout(listTimer);
      if (token && !document.hidden) listTimer = setTimeout(list, LIST_EVERY_MS);
    }
  })();
  return listing;
}

async function listOnce() {
  const asked = token;
  let rows;
  try {
    const response = await api("/sessions");
    const answer = await response.json();
    if (!response.ok) {
      status(answer.message || `The daemon answered ${response.status}.`);
      return;
    }
    rows = answer;
  } catch (error) {
    if (error.message !== "unauthorized") status("The daemon does not answer.");
    return;
  }
  if (token !== asked) return; // the token was forgotten or changed meanwhile
  const trs = rows.map((row) => {
    let entry = known.get(row.id);
    if (!entry) {
      entry = { tr: rowOf(row.id) };
      known.set(row.id, entry);
    }
    entry.row = row;
    if (row.id === current) advance(row, seen); // a listing read before the stream's news
    paint(entry);
    return entry.tr;
  });
  const listed = new Set(rows.map((row) => row.id));
  for (const [id, { tr }] of known) {
    if (!listed.has(id)) {
      known.delete(id);
      tr.remove();
    }
  }
  // new rows put in the listing's order; rows that stay are not moved (a row taken out,
  // even to be put back at once, loses the focus), unless the order itself changed
  const body = $("sessions").tBodies[0];
  let at = body.firstElementChild;
  for (const tr of trs) {
    if (tr === at) at = at.nextElementSibling;
    else body.insertBefore(tr, at);
  }
  $("no-sessions").hidden = rows.length > 0;
  if (!stream || current === null) status(`${rows.length} session${rows.length === 1 ? "" : "s"}`);
}

function rowOf(id) {
  const tr = document.createElement("tr");
  tr.dataset.id = id;
  tr.tabIndex = 0;
  for (const cls of ["id", "n head", "n lag", "n waiters"]) {
    const td = document.createElement("td");
    td.className = cls;
    tr.append(td);
  }
  tr.cells[0].textContent = id;
  tr.addEventListener("click", () => show(id));
  tr.addEventListener("keydown", (e) => e.key === "Enter" && show(id));
  return tr;
}

function paint({ row, tr }) {
  tr.setAttribute("aria-selected", String(row.id === current));
  tr.cells[1].textContent = row.head;
  tr.cells[2].textContent = row.lag;
  tr.cells[3].textContent = row.waiters;
}

// A row's figures once ``head`` is recorded, as the daemon will list them: the ring holds
// the new firings (up to its limit) and every cursor is that much further behind (the lag
// is 0 with no cursor), until a listing says a cursor moved.
function advance(row, head) {
  const more = head - row.head;
  if (more <= 0) return false;
  row.head = head;
  row.retained = Math.min(row.retained + more, row.limit);
  if (row.cursors > 0) row.lag += more;
  return true;
}

// The shown session's stream told ``seq``: its row follows at once, the rest a listing later.
function told(id, seq) {
  if (id !== current || seq <= seen) return;
  seen = seq;
  const entry = known.get(id);
  if (entry) {
    if (!advance(entry.row, seq)) return; // the listing had it already (a stream's start)
    paint(entry);
  }
  if (firingTimer === null) {
    firingTimer = setTimeout(() => {
      firingTimer = null;
      if (token) list();
    }, LIST_AFTER_FIRING_MS);
  }
}

function firingItem(firing) {
  const li = document.createElement("li");
  li.dataset.seq = firing.seq;
  if (firing.result === null) li.className = "unhandled";
  const parts = [
    ["seq", `#${firing.seq}`],
    ["handler", firing.handler],
    ["text", firing.result ?? firing.event],
    ["time", new Date(firing.ts).toLocaleTimeString()],
  ];
  for (const [cls, text] of parts) li.append(spanOf(cls, text));
  // who sent it and its tags: both come from clients, so text nodes only, as the rest
  const tags = Object.entries(firing.tags || {});
  if (typeof firing.by === "string" || tags.length > 0) {
    const meta = spanOf("meta");
    if (typeof firing.by === "string") {
      const by = spanOf("by", `by ${firing.by}`); // null, for a firing older than by: nothing
      by.title = `sent by ${firing.by}`;
      meta.append(by);
    }
    for (const [key, value] of tags) {
      const tag = spanOf("tag");
      tag.append(spanOf("key", key), "=", spanOf("value", value));
      tag.title = `${key}=${value}`; // the whole of a value cut short on the page
      meta.append(tag);
    }
    li.append(meta);
  }
  li.title = firing.ts;
  return li;
}

function spanOf(cls, text = "") {
  const span = document.createElement("span");
  span.className = cls;
  span.textContent = text;
  return span;
}

function lostItem(count) {
  const li = document.createElement("li");
  li.className = "lost";
  li.textContent = `${count} earlier firing${count === 1 ? "" : "s"} dropped`;
  return li;
}

function add(li) {
  const list = $("firings");
  list.prepend(li); // newest first
  while (list.children.length > SHOWN) list.lastElementChild.remove();
}

async function show(id) {
  current = id;
  seen = 0;
  history.replaceState(null, "", `#${encodeURIComponent(id)}`);
  for (const { row, tr } of known.values()) tr.setAttribute("aria-selected", String(row.id === id));
  $("session-panel").hidden = false;
  $("session-title").textContent = id;
  $("firings").replaceChildren();
  $("send-error").textContent = "";
  clearApprovals();
  if (stream) stream.abort();
  await list(); // the table, and the session's head, as they are now
  if (current !== id) return; // another session was picked while this one was looked up
  const entry = known.get(id);
  if (!entry) {
    status(`No session ${id}.`);
    return;
  }
  follow(id, Math.max(0, entry.row.head - SHOWN));
  loadApprovals();
}

async function follow(id, after) {
  if (current !== id) return;
  if (stream) stream.abort(); // one stream at a time: the shown session's
  const control = new AbortController();
  stream = control;
  let last = after;
  let broke = false;
  for (let delay = 500; current === id && !control.signal.aborted; delay = Math.min(delay * 2, 5000)) {
    try {
      const response = await api(`/sessions/${encodeURIComponent(id)}/events`, {
        headers: { "Last-Event-ID": String(last) },
        signal: control.signal,
      });
      if (!response.ok) {
        const error = await response.json().catch(() => ({}));
        status(error.message || `The stream answered ${response.status}.`);
        if (response.status === 404) {
          list(); // stopped before its stream began: its row goes
          return;
        }
      } else {
        status(`Following ${id}`);
        delay = 500;
        if (broke) {
          list(); // back after a break: what happened meanwhile
          loadApprovals();
        }
        broke = false;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replaceAll("\r\n", "\n");
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const event = parse(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
            if (event.id !== undefined && /^[0-9]+$/.test(event.id)) last = Number(event.id);
            if (event.event === "firing") {
              const firing = JSON.parse(event.data);
              add(firingItem(firing));
              told(id, last);
              if (firing.tags && "approval" in firing.tags) loadApprovals(); // prompt, verdict
            } else if (event.event === "lost") {
              add(lostItem(JSON.parse(event.data).lost));
              told(id, last); // its id is the last seq it stands for
            } else if (event.event === "ended") {
              const ended = JSON.parse(event.data);
              status(ended.message);
              if (ended.code === "session_stopped") {
                seen = 0;
                list(); // its row goes now, not at the next slow listing
                return;
              }
            }
          }
        }
      }
    } catch (error) {
      if (control.signal.aborted || error.message === "unauthorized") return;
      status("The stream broke; reconnecting…");
    }
    broke = true;
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
}

function parse(block) {
  const event = {};
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    event[name] = event[name] === undefined ? value : `${event[name]}\n${value}`;
  }
  return event;
}

async function send(text) {
  $("send-error").textContent = "";
  try {
    const response = await api(`/sessions/${encodeURIComponent(current)}/firings`, {
      method: "POST",
      body: text,
      headers: { "Content-Type": "text/plain; charset=utf-8" },
    });
    if (!response.ok) {
      const error = await response.json();
      $("send-error").textContent = error.message;
      if (error.code === "no_such_session") list(); // stopped elsewhere: its row goes
      return false;
    }
    return true;
  } catch (error) {
    if (error.message !== "unauthorized") $("send-error").textContent = "The daemon does not answer.";
    return false;
  }
}

// -- approvals ------------------------------------------------------------------------

function clearApprovals() {
  pendingItems.clear();
  $("pending").replaceChildren();
  $("audit").replaceChildren();
  $("approvals").hidden = true;
  document.title = "repl";
}

// The shown session's prompts read again; a call while one is in flight is answered once
// another has been read after it (as ``list``), of the session shown then.
function loadApprovals() {
  if (approvalsLoading) {
    approvalsAgain = true;
    return approvalsLoading;
  }
  approvalsLoading = (async () => {
    try {
      do {
        approvalsAgain = false;
        if (current !== null) await loadApprovalsOnce(current);
      } while (approvalsAgain && token);
    } finally {
      approvalsLoading = null;
    }
  })();
  return approvalsLoading;
}

async function loadApprovalsOnce(id) {
  let entries;
  try {
    const response = await api(`/sessions/${encodeURIComponent(id)}/approvals?all=true`);
    if (!response.ok) {
      // a token that may not read the session's prompts, a session gone: no pane
      if (current === id) clearApprovals();
      return;
    }
    entries = await response.json();
  } catch (error) {
    return; // the daemon away: the stream says so, and reads them again when it is back
  }
  if (current !== id) return; // another session was picked meanwhile
  paintApprovals(id, entries);
}

function paintApprovals(id, entries) {
  $("approvals").hidden = entries.length === 0;
  const pending = entries.filter((e) => e.verdict === null);
  const answered = entries.filter((e) => e.verdict !== null).reverse(); // newest first
  const list = $("pending");
  const waiting = new Set(pending.map((e) => e.prompt.request_id));
  for (const [rid, li] of pendingItems) {
    if (!waiting.has(rid)) {
      pendingItems.delete(rid);
      li.remove();
    }
  }
  let at = list.firstElementChild; // oldest first, as `repl approvals` lists them
  for (const entry of pending) {
    const rid = entry.prompt.request_id;
    let li = pendingItems.get(rid);
    if (!li || li.dataset.seq !== String(entry.prompt.seq)) {
      if (li) li.remove(); // the id asked again: the new prompt's
      li = pendingItem(id, entry);
      pendingItems.set(rid, li);
    }
    if (li === at) at = at.nextElementSibling;
    else list.insertBefore(li, at);
  }
  $("audit").replaceChildren(...answered.map(auditItem));
  $("audit-count").textContent = answered.length;
  $("pending-count").textContent = pending.length ? `${pending.length} waiting` : "";
  $("no-pending").hidden = pending.length > 0;
  document.title = pending.length ? `(${pending.length}) repl` : "repl";
  paintAges();
}

function pendingItem(id, { prompt }) {
  const li = document.createElement("li");
  li.className = "prompt";
  li.dataset.request = prompt.request_id;
  li.dataset.seq = prompt.seq;
  // everything a prompt holds came from a client (the agent's tool input): text only
  const head = spanOf("head");
  head.append(spanOf("request", prompt.request_id), spanOf("tool", prompt.tool));
  const age = spanOf("age");
  age.dataset.ts = prompt.ts;
  age.title = prompt.ts;
  head.append(age);
  if (typeof prompt.by === "string") head.append(spanOf("by", `asked by ${prompt.by}`));
  li.append(head);
  if (prompt.description) li.append(paragraph("description", prompt.description));
  if (prompt.preview) {
    const pre = document.createElement("pre");
    pre.className = "preview";
    pre.textContent = prompt.preview;
    li.append(pre);
  }
  const stale = paragraph("stale hint", "No verdict yet: it may have been answered at the terminal.");
  stale.hidden = true;
  li.append(stale);
  const form = document.createElement("form");
  form.className = "decide";
  const reason = document.createElement("input");
  reason.className = "reason";
  reason.placeholder = "Reason (optional)";
  reason.autocomplete = "off";
  reason.setAttribute("aria-label", `Reason for ${prompt.request_id}`);
  const allow = buttonOf("allow", "Allow");
  const deny = buttonOf("deny", "Deny");
  allow.setAttribute("aria-label", `Allow ${prompt.request_id}`);
  deny.setAttribute("aria-label", `Deny ${prompt.request_id}`);
  form.append(reason, allow, deny);
  form.addEventListener("submit", (e) => e.preventDefault()); // Enter in the reason: nothing
  allow.addEventListener("click", () => decide(id, li, prompt.request_id, "allow"));
  deny.addEventListener("click", () => decide(id, li, prompt.request_id, "deny"));
  li.append(form, paragraph("error", ""));
  li.lastElementChild.setAttribute("role", "alert");
  li.title = `approvers: ${prompt.approvers.join(", ")}`;
  return li;
}

function auditItem({ prompt, verdict, verdicts }) {
  const li = document.createElement("li");
  li.className = `answered ${verdict.behavior}`;
  li.dataset.request = prompt.request_id;
  const head = spanOf("head");
  head.append(
    spanOf("request", prompt.request_id),
    spanOf("tool", prompt.tool),
    spanOf("behavior", verdict.behavior),
    spanOf("by", `by ${verdict.by}`),
    spanOf("time", new Date(verdict.ts).toLocaleString()),
  );
  head.lastElementChild.title = verdict.ts;
  li.append(head);
  if (prompt.description) li.append(paragraph("description", prompt.description));
  if (verdict.reason) li.append(paragraph("reason", verdict.reason));
  const others = verdicts.filter((v) => v.seq !== verdict.seq);
  if (others.length) {
    const said = others.map((v) => `${v.behavior} by ${v.by}`).join(", ");
    li.append(paragraph("others hint", `Did not count: ${said}.`));
  }
  li.title = `asked ${prompt.ts} by ${prompt.by}`;
  return li;
}

// A pending prompt's age, as `repl approvals` says it (12 s, 3m 20s, 2h 5m, 4d 1h), and
// whether it has waited long enough to say it may have been answered at the terminal.
function paintAges() {
  const now = Date.now();
  for (const li of pendingItems.values()) {
    const age = li.querySelector(".age");
    const waited = Math.max(0, now - Date.parse(age.dataset.ts));
    age.textContent = ageOf(waited);
    li.querySelector(".stale").hidden = waited < STALE_MS;
  }
}

function ageOf(ms) {
  const s = Math.floor(ms / 1000);
  const [m, h, d] = [Math.floor(s / 60), Math.floor(s / 3600), Math.floor(s / 86400)];
  if (s < 60) return `${s} s`;
  if (h < 1) return `${m}m ${s % 60}s`;
  if (d < 1) return `${h}h ${m % 60}m`;
  return `${d}d ${h % 24}h`;
}

// The verdict, recorded as this page's token: a refusal (answered already, by whom; not an
// approver) is said on the prompt and in the status line, and the pane read again.
async function decide(id, li, requestId, behavior) {
  const buttons = li.querySelectorAll("button");
  const error = li.querySelector(".error");
  for (const button of buttons) button.disabled = true;
  error.textContent = "";
  try {
    const response = await api(
      `/sessions/${encodeURIComponent(id)}/approvals/${encodeURIComponent(requestId)}`,
      {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ behavior, reason: li.querySelector(".reason").value }),
      },
    );
    const answer = await response.json();
    if (response.ok) status(`${requestId}: ${answer.behavior} by ${answer.by}`);
    else {
      error.textContent = answer.message;
      status(answer.message);
    }
  } catch (failed) {
    if (failed.message !== "unauthorized") error.textContent = "The daemon does not answer.";
  } finally {
    for (const button of buttons) button.disabled = false;
  }
  loadApprovals();
}

function paragraph(cls, text) {
  const p = document.createElement("p");
  p.className = cls;
  p.textContent = text;
  return p;
}

function buttonOf(cls, text) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = cls;
  button.textContent = text;
  return button;
}

setInterval(() => {
  if (!document.hidden && pendingItems.size) paintAges();
}, AGE_EVERY_MS);

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  login($("token").value);
});
$("send").addEventListener("submit", async (e) => {
  e.preventDefault();
  const input = $("text");
  if (await send(input.value)) input.value = "";
  input.focus();
});
$("logout").addEventListener("click", () => logout());
document.addEventListener("visibilitychange", () => {
  // a hidden tab lists nothing (see LIST_EVERY_MS); shown again, it lists at once
  if (!token) return;
  if (document.hidden) clearTimeout(listTimer);
  else list();
});
window.addEventListener("hashchange", () => {
  const wanted = decodeURIComponent(location.hash.slice(1));
  if (token && wanted && wanted !== current) show(wanted);
});

if (token) start();
else logout();
