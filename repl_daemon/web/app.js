// The daemon's page: sessions with head and lag, one session's firings live (with their
// tags, and who sent each), a box to send.
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
  if (stream) stream.abort();
  await list(); // the table, and the session's head, as they are now
  if (current !== id) return; // another session was picked while this one was looked up
  const entry = known.get(id);
  if (!entry) {
    status(`No session ${id}.`);
    return;
  }
  follow(id, Math.max(0, entry.row.head - SHOWN));
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
        if (broke) list(); // back after a break: what happened meanwhile
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
              add(firingItem(JSON.parse(event.data)));
              told(id, last);
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
