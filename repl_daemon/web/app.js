// The daemon's page: sessions with head and lag, one session's firings live, a box to send.
// Plain JavaScript, no build step, nothing loaded from elsewhere. The token is asked for
// once and kept for this tab (sessionStorage); it goes in an Authorization header, never
// in a URL. The live view is the session's event stream (GET /sessions/ID/events), read
// with fetch because EventSource cannot send a header.
"use strict";

const KEY = "repl-token";
const SHOWN = 200; // firings kept on the page
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem(KEY);
let current = null; // the session shown
let stream = null; // its stream's AbortController
let listing = null; // the timer that refreshes the list

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
  if (stream) stream.abort();
  clearInterval(listing);
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
  refresh();
  clearInterval(listing);
  listing = setInterval(refresh, 5000);
  const wanted = decodeURIComponent(location.hash.slice(1));
  if (wanted) show(wanted);
}

async function refresh() {
  let rows;
  try {
    rows = await (await api("/sessions")).json();
  } catch (error) {
    if (error.message !== "unauthorized") status("The daemon does not answer.");
    return;
  }
  const body = $("sessions").tBodies[0];
  body.replaceChildren(
    ...rows.map((row) => {
      const tr = document.createElement("tr");
      tr.dataset.id = row.id;
      tr.setAttribute("aria-selected", String(row.id === current));
      tr.tabIndex = 0;
      for (const [value, cls] of [[row.id, "id"], [row.head, "n"], [row.lag, "n"], [row.waiters, "n"]]) {
        const td = document.createElement("td");
        td.className = cls;
        td.textContent = value;
        tr.append(td);
      }
      tr.addEventListener("click", () => show(row.id));
      tr.addEventListener("keydown", (e) => e.key === "Enter" && show(row.id));
      return tr;
    }),
  );
  $("no-sessions").hidden = rows.length > 0;
  if (!stream || current === null) status(`${rows.length} session${rows.length === 1 ? "" : "s"}`);
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
  for (const [cls, text] of parts) {
    const span = document.createElement("span");
    span.className = cls;
    span.textContent = text;
    li.append(span);
  }
  li.title = firing.ts;
  return li;
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
  history.replaceState(null, "", `#${encodeURIComponent(id)}`);
  for (const tr of $("sessions").tBodies[0].rows) tr.setAttribute("aria-selected", String(tr.dataset.id === id));
  $("session-panel").hidden = false;
  $("session-title").textContent = id;
  $("firings").replaceChildren();
  $("send-error").textContent = "";
  if (stream) stream.abort();
  let head = 0;
  try {
    const rows = await (await api("/sessions")).json();
    const row = rows.find((r) => r.id === id);
    if (!row) {
      status(`No session ${id}.`);
      return;
    }
    head = row.head;
  } catch {
    return;
  }
  if (current !== id) return; // another session was picked while this one was looked up
  follow(id, Math.max(0, head - SHOWN));
}

async function follow(id, after) {
  if (current !== id) return;
  if (stream) stream.abort(); // one stream at a time: the shown session's
  const control = new AbortController();
  stream = control;
  let last = after;
  for (let delay = 500; current === id && !control.signal.aborted; delay = Math.min(delay * 2, 5000)) {
    try {
      const response = await api(`/sessions/${encodeURIComponent(id)}/events`, {
        headers: { "Last-Event-ID": String(last) },
        signal: control.signal,
      });
      if (!response.ok) {
        const error = await response.json().catch(() => ({}));
        status(error.message || `The stream answered ${response.status}.`);
        if (response.status === 404) return;
      } else {
        status(`Following ${id}`);
        delay = 500;
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
            } else if (event.event === "lost") {
              add(lostItem(JSON.parse(event.data).lost));
            } else if (event.event === "ended") {
              status(JSON.parse(event.data).message);
              if (JSON.parse(event.data).code === "session_stopped") return;
            }
          }
        }
      }
    } catch (error) {
      if (control.signal.aborted || error.message === "unauthorized") return;
      status("The stream broke; reconnecting…");
    }
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
      $("send-error").textContent = (await response.json()).message;
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
window.addEventListener("hashchange", () => {
  const wanted = decodeURIComponent(location.hash.slice(1));
  if (token && wanted && wanted !== current) show(wanted);
});

if (token) start();
else logout();
