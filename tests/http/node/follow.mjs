// A stream followed by the npm `eventsource` package (4.x, as npm installs it on Node 20),
// as a program in JavaScript follows one: it sends the token with its own fetch, and
// prints one JSON line for each thing it is told, so the test reads what it saw.
import { EventSource } from "eventsource";

const [url, token] = process.argv.slice(2);
const say = (what) => process.stdout.write(`${JSON.stringify(what)}\n`);
const source = new EventSource(url, {
  fetch: (input, init) =>
    fetch(input, { ...init, headers: { ...init.headers, Authorization: `Bearer ${token}` } }),
});
source.onopen = () => say({ event: "open" });
source.onerror = () => say({ event: "connection-error" });
for (const name of ["position", "firing", "lost", "ended"]) {
  source.addEventListener(name, (e) => say({ event: name, id: e.lastEventId, data: JSON.parse(e.data) }));
}
