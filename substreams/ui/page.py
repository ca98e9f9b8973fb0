"""The dashboard page: one self-contained HTML document (no CDN, works offline).

It opens ``/events`` with ``EventSource`` and re-renders from each snapshot; text is always
set with ``textContent`` (source names and times come from the topics, not from us).
"""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>substreams dashboard</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; background: #f4f5f7; color: #1d2330; }
  header { background: #1d2330; color: #fff; padding: 10px 20px; display: flex; gap: 24px;
           align-items: baseline; }
  header h1 { font-size: 18px; margin: 0; }
  main { padding: 16px 20px; display: grid; gap: 16px;
         grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); }
  section { background: #fff; border-radius: 6px; padding: 12px 16px;
            box-shadow: 0 1px 2px rgba(0,0,0,.12); }
  h2 { font-size: 16px; margin: 0 0 6px; }
  h3 { font-size: 13px; margin: 10px 0 4px; color: #555; text-transform: uppercase; }
  table { border-collapse: collapse; width: 100%; font-size: 13px; }
  th, td { text-align: left; padding: 2px 8px 2px 0; border-bottom: 1px solid #eee; }
  td.mono, span.mono { font-family: ui-monospace, monospace; }
  .frontier { font-family: ui-monospace, monospace; background: #eef2ff; padding: 1px 6px;
              border-radius: 4px; }
  .badge { padding: 1px 6px; border-radius: 8px; font-size: 12px; color: #fff; }
  .live { background: #2e7d32; } .silent { background: #ef6c00; }
  .evicted { background: #c62828; } .left { background: #757575; }
  .down { background: #c62828; } .muted { color: #888; }
  #error { color: #c62828; }
</style>
</head>
<body>
<header>
  <h1>substreams</h1>
  <span id="acker">connecting&hellip;</span>
  <span id="updated" class="muted"></span>
  <span id="error"></span>
</header>
<main>
  <div id="substreams" style="display: contents"></div>
  <section id="sources-card"><h2>Sources</h2><div id="sources"></div>
    <div id="blockers"></div></section>
</main>
<script>
"use strict";
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
function ago(ms) {
  if (!ms) return "-";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 1 ? (s * 1000).toFixed(0) + " ms ago" : s.toFixed(1) + " s ago";
}
function heldFor(ms) {  // a duration since ms: how long a source has held a time back
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(1) + " s";
}
function table(headers, rows) {
  const t = el("table", {}, el("tr", {}, ...headers.map(h => el("th", {}, h))));
  for (const r of rows) t.append(r);
  return t;
}
function substreamCard(s) {
  const card = el("section", {"class": "substream", "data-substream": s.name},
    el("h2", {}, s.name, " ", el("span", {"class": "muted"}, s.mechanism + " on " + s.stream)),
    el("div", {}, "lower ", el("span", {"class": "frontier lower"}, s.lower),
       "  upper ", el("span", {"class": "frontier upper"}, s.upper)));
  card.append(el("h3", {}, "Open times"));
  if (s.open === null) {
    card.append(el("div", {"class": "muted"},
      s.mechanism === "acker" ? "no acker checkpoint yet" : "kept by the aligner"));
  } else if (s.open.length === 0) {
    card.append(el("div", {"class": "muted"}, "none: complete up to the frontier"));
  } else {
    card.append(table(["time", "xor", "records", "not sealed by", "first seen"],
      s.open.slice(0, 8).map(o => el("tr", {"class": "open-time", "data-time": o.time},
        el("td", {"class": "mono"}, o.time),
        el("td", {"class": "mono"}, o.xor === "0000000000000000" ? "0 (balanced)" : o.xor),
        el("td", {}, o.records),
        el("td", {}, o.unsealed.length ? o.unsealed.join(", ") : "all sealed"),
        el("td", {}, ago(o.first_seen_ms))))));
  }
  card.append(el("h3", {}, "Latest notifications"));
  if (s.notifications.length === 0) {
    card.append(el("div", {"class": "muted"}, "none since the dashboard started"));
  } else {
    card.append(table(["time", "records", "seal \\u2192 notification", "written"],
      s.notifications.slice(0, 8).map(n => el("tr",
          {"class": "notification", "data-time": n.time},
        el("td", {"class": "mono"}, n.time), el("td", {}, n.records),
        el("td", {}, n.latency_ms === null ? "-" : n.latency_ms + " ms"),
        el("td", {}, ago(n.written_at_ms))))));
  }
  for (const ev of s.evictions) {
    card.append(el("div", {"class": "muted"},
      "evicted " + ev.source + " (" + ev.reason + ") " + ago(ev.written_at_ms)));
  }
  return card;
}
function render(snap) {
  const a = snap.acker;
  const acker = document.getElementById("acker");
  const badge = (alive) =>
    el("span", {"class": "badge " + (alive ? "live" : "down")}, alive ? "alive" : "not heard");
  if (a.shards.length > 1) {
    acker.replaceChildren("acker '" + a.name + "', " + a.shards.length + " shards: ",
      ...a.shards.flatMap(s => [el("span", {"class": "shard", "data-shard": s.name},
        s.name + " ", badge(s.alive),
        s.checkpoint_ms ? " checkpoint " + ago(s.checkpoint_ms) : ""), "  "]));
  } else {
    acker.replaceChildren("acker '" + a.name + "' ", badge(a.alive),
      a.checkpoint_ms ? "  checkpoint " + ago(a.checkpoint_ms) : "");
  }
  document.getElementById("updated").textContent =
    "updated " + new Date(snap.generated_ms).toLocaleTimeString();
  document.getElementById("error").textContent = snap.error || "";
  document.getElementById("substreams").replaceChildren(...snap.substreams.map(substreamCard));
  const sharded = snap.acker.shards.length > 1;
  const rows = snap.sources.map(s => el("tr", {"class": "source", "data-source": s.source},
    ...(sharded ? [el("td", {}, s.shard)] : []),
    el("td", {}, s.source), el("td", {"class": "mono"}, s.incarnation),
    el("td", {}, s.roles.join(",")), el("td", {}, s.substreams.join(", ") || "-"),
    el("td", {}, ago(s.last_seen_ms)),
    el("td", {}, el("span", {"class": "badge " + s.status}, s.status)),
    // the oldest time it has not sealed, and for how long it has held it back
    el("td", {"class": "holds"}, !s.holds ? "-" : s.substreams.length > 1
      ? s.holds.time + " (" + s.holds.substream + ")" : s.holds.time),
    el("td", {"class": "held-for"}, s.holds ? heldFor(s.holds.since_ms) : "-")));
  document.getElementById("sources").replaceChildren(rows.length
    ? table([...(sharded ? ["shard"] : []), "source", "incarnation", "role", "substreams",
             "last heard", "state", "holds", "for"], rows)
    : el("div", {"class": "muted"}, "no registered source"));
  // Open transactions holding an acks partition's last stable offset (a dead publisher's):
  // the sources behind one are not judged silent until it ends.
  const held = (snap.blockers || []).map(b => el("tr", {"class": "blocker"},
    el("td", {}, "acks[" + b.partition + "]@" + b.offset), el("td", {}, b.holder),
    el("td", {}, ago(b.since_ms)), el("td", {}, b.verdict)));
  document.getElementById("blockers").replaceChildren(held.length
    ? table(["held partition", "open transaction of", "since", "verdict"], held) : "");
}
const events = new EventSource("events");
events.onmessage = (m) => render(JSON.parse(m.data));
events.onerror = () => {
  document.getElementById("error").textContent = "disconnected, retrying\\u2026";
};
</script>
</body>
</html>
"""
