/*
  app.js: everything the page at `/` of `cqlm serve` does (src/serve/web/).

  - Chat through POST /v1/chat/completions, streamed (server-sent events read
    with fetch + ReadableStream), stoppable (AbortController), with per-answer
    figures: time to first token, tokens per second, cached prompt tokens.
  - Markdown rendered with DOM APIs only (createElement / textContent): model
    text is never parsed as HTML; links only for http(s), rel=noopener.
  - Tool calls as cards; the demo tools run on the server
    (POST /v1/cqlm/demo-tools/call) or take a result typed by the user, and the
    conversation goes on until a plain answer.
  - Settings, conversations and the theme kept in localStorage.
  - The Kernels view: GET /v1/cqlm/profile as a horizontal bar chart.
*/
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = { settings: "cqlm.settings", convs: "cqlm.convs", current: "cqlm.current", theme: "cqlm.theme" };
const DEFAULTS = { system: "", temperature: 0.7, top_p: 1, max_tokens: 256, seed: "", api_key: "", tools: false, tools_server: true };
const MAX_TOOL_ROUNDS = 4;

/* ---------- storage ---------- */

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch (_) {
    return fallback;
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (_) {
    /* storage full or disabled: the page still works for this visit */
  }
}

const state = {
  settings: Object.assign({}, DEFAULTS, load(KEY.settings, {})),
  convs: load(KEY.convs, []),
  current: load(KEY.current, null),
  busy: null, // the AbortController of the running request
  demoTools: null,
};

function currentConv() {
  return state.convs.find((c) => c.id === state.current) || null;
}

function saveConvs() {
  save(KEY.convs, state.convs);
  save(KEY.current, state.current);
}

function newConv() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [], updated: Date.now() };
  state.convs.unshift(c);
  state.current = c.id;
  saveConvs();
  return c;
}

/* ---------- safe markdown ---------- */

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function safeHref(url) {
  try {
    const u = new URL(url);
    return u.protocol === "http:" || u.protocol === "https:" ? u.href : null;
  } catch (_) {
    return null;
  }
}

const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([\s\S]+?)\*\*|__([\s\S]+?)__|\*([^*\s](?:[^*]*[^*\s])?)\*|\b_([^_\s](?:[^_]*[^_\s])?)_\b|\[([^\]\n]+)\]\(([^)\s]+)\)/;

/** Append the inline markdown of `text` to `parent` (code, bold, italic, links). */
function inline(parent, text) {
  let rest = text;
  while (rest.length) {
    const m = INLINE.exec(rest);
    if (!m) {
      parent.appendChild(document.createTextNode(rest));
      return;
    }
    if (m.index) parent.appendChild(document.createTextNode(rest.slice(0, m.index)));
    if (m[1] !== undefined) {
      parent.appendChild(el("code", null, m[2]));
    } else if (m[3] !== undefined || m[4] !== undefined) {
      inline(parent.appendChild(el("strong")), m[3] !== undefined ? m[3] : m[4]);
    } else if (m[5] !== undefined || m[6] !== undefined) {
      inline(parent.appendChild(el("em")), m[5] !== undefined ? m[5] : m[6]);
    } else {
      const href = safeHref(m[8]);
      if (href) {
        const a = el("a");
        a.href = href;
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        inline(a, m[7]);
        parent.appendChild(a);
      } else {
        parent.appendChild(document.createTextNode(m[0]));
      }
    }
    rest = rest.slice(m.index + m[0].length);
  }
}

/** Append lines of a paragraph, joined by line breaks. */
function paragraph(parent, lines) {
  const p = el("p");
  lines.forEach((line, i) => {
    if (i) p.appendChild(el("br"));
    inline(p, line);
  });
  parent.appendChild(p);
}

/** Render markdown `text` into a fresh fragment (blocks: paragraphs,
 * headings, fenced code, lists) with createElement and text nodes only. */
function markdown(text) {
  const frag = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let para = [];
  let list = null; // {el, ordered}
  const flush = () => {
    if (para.length) paragraph(frag, para);
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = /^\s*(```|~~~)\s*([\w+-]*)\s*$/.exec(line);
    if (fence) {
      flush();
      list = null;
      const body = [];
      i++;
      while (i < lines.length && !new RegExp("^\\s*" + fence[1] + "\\s*$").test(lines[i])) body.push(lines[i++]);
      const pre = el("pre");
      const code = el("code", null, body.join("\n"));
      if (fence[2]) code.dataset.lang = fence[2];
      pre.appendChild(code);
      frag.appendChild(pre);
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      flush();
      list = null;
      inline(frag.appendChild(el("h" + heading[1].length)), heading[2]);
      continue;
    }
    const item = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(line);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      if (!list || list.ordered !== ordered) {
        list = { el: frag.appendChild(el(ordered ? "ol" : "ul")), ordered };
      }
      inline(list.el.appendChild(el("li")), item[2]);
      continue;
    }
    if (!line.trim()) {
      flush();
      list = null;
      continue;
    }
    list = null;
    para.push(line);
  }
  flush();
  return frag;
}

/* ---------- rendering the conversation ---------- */

function fmt(n, digits) {
  return Number.isFinite(n) ? n.toFixed(digits) : "–";
}

function statsText(s) {
  const parts = [];
  if (s.ttft_ms !== undefined) parts.push("first token " + fmt(s.ttft_ms, 0) + " ms");
  if (s.tok_s !== undefined) parts.push(fmt(s.tok_s, 1) + " tok/s");
  if (s.tokens !== undefined) parts.push(s.tokens + " tokens");
  if (s.cached !== undefined) parts.push(s.cached + " cached");
  return parts.join(" · ");
}

function messageNode(role, cls) {
  const m = el("div", "msg " + (cls || role));
  m.appendChild(el("div", "role", role));
  const content = m.appendChild(el("div", "content"));
  return { root: m, content };
}

/** The result of tool call `id` in `conv`, if the tool message is there. */
function toolResult(conv, id) {
  const t = conv.messages.find((m) => m.role === "tool" && m.tool_call_id === id);
  return t ? t.content : null;
}

function toolCard(conv, call) {
  const card = el("div", "tool-card");
  card.dataset.callId = call.id;
  const head = card.appendChild(el("div", "tool-head", "tool call "));
  head.appendChild(el("span", "tool-name", call.function.name));
  card.appendChild(el("pre", "tool-args", call.function.arguments));
  const result = toolResult(conv, call.id);
  if (result !== null) {
    card.appendChild(el("div", "tool-head", "result"));
    card.appendChild(el("pre", "tool-result", result));
  } else if (!state.busy) {
    const box = card.appendChild(el("div", "tool-input"));
    const ta = box.appendChild(el("textarea"));
    ta.rows = 1;
    ta.placeholder = 'Result JSON, e.g. {"result": 920}';
    const b = box.appendChild(el("button", "tool-submit", "Send result"));
    b.type = "button";
    b.addEventListener("click", () => submitToolResult(conv, call, ta.value));
  }
  return card;
}

function assistantNode(conv, msg) {
  const n = messageNode("assistant");
  if (msg.content) n.content.appendChild(markdown(msg.content));
  (msg.tool_calls || []).forEach((c) => n.content.appendChild(toolCard(conv, c)));
  if (msg._stats) {
    const s = n.root.appendChild(el("div", "stats" + (msg._stats.stopped ? " stopped" : ""), statsText(msg._stats)));
    s.title = "time to first token, tokens per second, prompt tokens from the cache";
  }
  return n.root;
}

/** Rebuild the whole message list (on load, switch, after a turn). */
function renderConversation() {
  const box = $("messages");
  box.replaceChildren();
  const conv = currentConv();
  if (!conv) return;
  for (const m of conv.messages) {
    if (m.role === "user") {
      const n = messageNode("user");
      n.content.textContent = m.content;
      box.appendChild(n.root);
    } else if (m.role === "assistant") {
      box.appendChild(assistantNode(conv, m));
    } else if (m.role === "error") {
      const n = messageNode("error");
      n.content.textContent = m.content;
      box.appendChild(n.root);
    }
  }
  box.scrollTop = box.scrollHeight;
}

function renderSidebar() {
  const ul = $("conv-list");
  ul.replaceChildren();
  for (const c of state.convs) {
    const li = el("li", c.id === state.current ? "current" : "");
    li.dataset.id = c.id;
    const open = li.appendChild(el("button", "conv-open", c.title));
    open.type = "button";
    open.addEventListener("click", () => switchTo(c.id));
    const del = li.appendChild(el("button", "conv-delete", "×"));
    del.type = "button";
    del.title = "Delete";
    del.addEventListener("click", () => deleteConv(c.id));
    ul.appendChild(li);
  }
}

function switchTo(id) {
  if (state.busy) state.busy.abort();
  state.current = id;
  saveConvs();
  renderSidebar();
  renderConversation();
  $("app").classList.remove("sidebar-open");
  showView("chat");
}

function deleteConv(id) {
  if (state.busy && id === state.current) state.busy.abort();
  state.convs = state.convs.filter((c) => c.id !== id);
  if (state.current === id) state.current = state.convs.length ? state.convs[0].id : null;
  saveConvs();
  renderSidebar();
  renderConversation();
}

/* ---------- the chat request ---------- */

/** Request headers: JSON, and the API key when the settings hold one. */
function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.settings.api_key) h.Authorization = "Bearer " + state.settings.api_key;
  return h;
}

function requestMessages(conv) {
  const out = [];
  if (state.settings.system.trim()) out.push({ role: "system", content: state.settings.system });
  for (const m of conv.messages) {
    if (m.role === "user") out.push({ role: "user", content: m.content });
    else if (m.role === "assistant") {
      const a = { role: "assistant", content: m.content || "" };
      if (m.tool_calls && m.tool_calls.length) a.tool_calls = m.tool_calls;
      out.push(a);
    } else if (m.role === "tool") out.push({ role: "tool", tool_call_id: m.tool_call_id, content: m.content });
  }
  return out;
}

async function demoTools() {
  if (!state.demoTools) {
    const r = await fetch("/v1/cqlm/demo-tools", { headers: headers() });
    if (!r.ok) throw new Error("GET /v1/cqlm/demo-tools: " + r.status);
    state.demoTools = await r.json();
  }
  return state.demoTools;
}

function errorText(body, status) {
  try {
    return JSON.parse(body).error.message;
  } catch (_) {
    return "HTTP " + status;
  }
}

/** Read the server-sent events of `resp`, calling `onEvent` with each JSON chunk. */
async function readEvents(resp, onEvent) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data || data === "[DONE]") continue;
      onEvent(JSON.parse(data));
    }
  }
}

/** One model turn: stream the answer into a new assistant message; returns it. */
async function modelTurn(conv) {
  const s = state.settings;
  const body = {
    messages: requestMessages(conv),
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number(s.temperature),
    top_p: Number(s.top_p),
    max_tokens: Number(s.max_tokens),
  };
  if (s.seed !== "" && s.seed !== null && Number.isFinite(Number(s.seed))) body.seed = Number(s.seed);
  if (s.tools) body.tools = await demoTools();

  const msg = { role: "assistant", content: "", tool_calls: [], _stats: {} };
  const box = $("messages");
  const node = messageNode("assistant");
  node.root.classList.add("streaming");
  box.appendChild(node.root);
  box.scrollTop = box.scrollHeight;

  // Re-render only this answer, at most once a frame.
  let frame = 0;
  const paint = () => {
    frame = 0;
    node.content.replaceChildren(markdown(msg.content));
    const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    if (nearBottom) box.scrollTop = box.scrollHeight;
  };
  const schedule = () => {
    if (!frame) frame = requestAnimationFrame(paint);
  };

  const ctl = new AbortController();
  state.busy = ctl;
  setBusy(true);
  const t0 = performance.now();
  let tFirst = null;
  let usage = null;
  let pieces = 0; // content or tool-call deltas received
  const calls = [];
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: ctl.signal,
    });
    if (!resp.ok) throw new Error(errorText(await resp.text(), resp.status));
    await readEvents(resp, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice || !choice.delta) return;
      const d = choice.delta;
      if (d.content || d.tool_calls) pieces++;
      if (d.content) {
        if (tFirst === null) tFirst = performance.now();
        msg.content += d.content;
        schedule();
      }
      for (const tc of d.tool_calls || []) {
        if (tFirst === null) tFirst = performance.now();
        const i = tc.index || 0;
        if (!calls[i]) calls[i] = { id: tc.id || "call_" + i, type: "function", function: { name: "", arguments: "" } };
        if (tc.id) calls[i].id = tc.id;
        if (tc.function && tc.function.name) calls[i].function.name += tc.function.name;
        if (tc.function && tc.function.arguments) calls[i].function.arguments += tc.function.arguments;
      }
    });
  } catch (e) {
    if (e.name === "AbortError") msg._stats.stopped = true;
    else msg._error = String(e.message || e);
  } finally {
    if (frame) cancelAnimationFrame(frame);
    state.busy = null;
    setBusy(false);
  }
  const t1 = performance.now();
  msg.tool_calls = calls.filter(Boolean);
  if (tFirst !== null) msg._stats.ttft_ms = tFirst - t0;
  if (usage) {
    msg._stats.tokens = usage.completion_tokens;
    const cached = usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens;
    msg._stats.cached = cached || 0;
    // Streamed text: the rate after the first token. Output held back to the
    // end (tool calls, text under tools) comes in one piece: the whole request.
    if (pieces > 1 && usage.completion_tokens > 1 && t1 > tFirst) {
      msg._stats.tok_s = (usage.completion_tokens - 1) / ((t1 - tFirst) / 1000);
    } else if (usage.completion_tokens > 0 && t1 > t0) {
      msg._stats.tok_s = usage.completion_tokens / ((t1 - t0) / 1000);
    }
  }
  node.root.remove();
  return msg;
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

/** Run model turns (and server-side demo tools) until a plain answer, a stop,
 * an error, or calls that wait for results typed by the user. */
async function converse(conv) {
  for (let round = 0; round <= MAX_TOOL_ROUNDS; round++) {
    const msg = await modelTurn(conv);
    const err = msg._error;
    delete msg._error;
    if (msg.content || msg.tool_calls.length || msg._stats.stopped) conv.messages.push(msg);
    if (err) conv.messages.push({ role: "error", content: err });
    conv.updated = Date.now();
    saveConvs();
    renderConversation();
    if (err || msg._stats.stopped || !msg.tool_calls.length) return;
    if (!state.settings.tools_server) return; // the cards wait for typed results
    for (const call of msg.tool_calls) {
      let content;
      try {
        const r = await fetch("/v1/cqlm/demo-tools/call", {
          method: "POST",
          headers: headers(),
          body: JSON.stringify({ name: call.function.name, arguments: call.function.arguments }),
        });
        const text = await r.text();
        content = r.ok ? JSON.parse(text).content : JSON.stringify({ error: errorText(text, r.status) });
      } catch (e) {
        content = JSON.stringify({ error: String(e.message || e) });
      }
      conv.messages.push({ role: "tool", tool_call_id: call.id, name: call.function.name, content });
    }
    saveConvs();
    renderConversation();
  }
}

function submitToolResult(conv, call, text) {
  if (state.busy) return;
  conv.messages.push({ role: "tool", tool_call_id: call.id, name: call.function.name, content: text.trim() || "{}" });
  saveConvs();
  renderConversation();
  // Go on once every call of the last assistant message has its result.
  const last = [...conv.messages].reverse().find((m) => m.role === "assistant");
  if (last && (last.tool_calls || []).every((c) => toolResult(conv, c.id) !== null)) converse(conv);
}

async function send(text) {
  if (state.busy || !text.trim()) return;
  const conv = currentConv() || newConv();
  conv.messages.push({ role: "user", content: text });
  if (conv.title === "New chat") conv.title = text.trim().slice(0, 40);
  conv.updated = Date.now();
  // Most recent conversation first.
  state.convs = [conv, ...state.convs.filter((c) => c !== conv)];
  saveConvs();
  renderSidebar();
  renderConversation();
  await converse(conv);
}

/* ---------- settings ---------- */

const FIELDS = [
  ["system", "system", "value"],
  ["temperature", "temperature", "value"],
  ["top-p", "top_p", "value"],
  ["max-tokens", "max_tokens", "value"],
  ["seed", "seed", "value"],
  ["api-key", "api_key", "value"],
  ["tools-on", "tools", "checked"],
  ["tools-server", "tools_server", "checked"],
];

function initSettings() {
  for (const [id, key, prop] of FIELDS) {
    const input = $(id);
    input[prop] = state.settings[key];
    input.addEventListener("change", () => {
      state.settings[key] = input[prop];
      save(KEY.settings, state.settings);
    });
  }
  $("settings-toggle").addEventListener("click", () => {
    $("settings").hidden = !$("settings").hidden;
  });
}

/* ---------- theme ---------- */

function effectiveTheme() {
  const t = document.documentElement.dataset.theme;
  if (t) return t;
  return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

function initTheme() {
  const t = load(KEY.theme, null);
  if (t === "light" || t === "dark") document.documentElement.dataset.theme = t;
  $("theme-toggle").addEventListener("click", () => {
    const next = effectiveTheme() === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    save(KEY.theme, next);
  });
}

/* ---------- views ---------- */

function showView(name) {
  $("chat-view").hidden = name !== "chat";
  $("kernels-view").hidden = name !== "kernels";
  $("view-chat").classList.toggle("active", name === "chat");
  $("view-kernels").classList.toggle("active", name === "kernels");
}

/* ---------- kernels ---------- */

async function refreshKernels() {
  const button = $("kernels-refresh");
  const summary = $("kernels-summary");
  button.disabled = true;
  summary.textContent = "Profiling…";
  try {
    const r = await fetch("/v1/cqlm/profile", { headers: headers() });
    const text = await r.text();
    if (!r.ok) throw new Error(errorText(text, r.status));
    drawKernels(JSON.parse(text));
  } catch (e) {
    summary.textContent = "No profile: " + (e.message || e);
  } finally {
    button.disabled = false;
  }
}

function drawKernels(p) {
  $("kernels-summary").textContent =
    p.backend + " · " + p.method + " · " + fmt(p.step_us, 1) + " µs per pass, " +
    fmt(p.kernel_sum_us, 1) + " µs in kernels (" + p.tokens + " passes averaged)";
  const chart = $("kernel-chart");
  chart.replaceChildren();
  const max = Math.max(1e-9, ...p.rows.map((r) => r.us_per_pass));
  for (const r of p.rows) {
    const row = el("div", "bar-row");
    row.dataset.kernel = r.kernel;
    row.title = r.calls_per_pass + " calls, " + (r.bytes_per_pass / 1e3).toFixed(1) + " kB, " + fmt(r.gb_per_s, 2) + " GB/s";
    row.appendChild(el("span", "bar-label", r.kernel));
    const track = row.appendChild(el("div", "bar-track"));
    const bar = track.appendChild(el("div", "bar"));
    const pct = (70 * r.us_per_pass) / max;
    bar.style.width = pct + "%";
    const value = track.appendChild(el("span", "bar-value", fmt(r.us_per_pass, 1) + " µs · " + fmt(100 * r.share, 1) + "% · ×" + r.calls_per_pass));
    value.style.left = pct + "%";
    chart.appendChild(row);
  }
}

/* ---------- start ---------- */

function init() {
  initTheme();
  initSettings();
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("input");
    const text = input.value;
    input.value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => {
    if (state.busy) state.busy.abort();
  });
  $("new-chat").addEventListener("click", () => {
    if (state.busy) state.busy.abort();
    newConv();
    renderSidebar();
    renderConversation();
    $("app").classList.remove("sidebar-open");
    showView("chat");
    $("input").focus();
  });
  $("menu").addEventListener("click", () => $("app").classList.toggle("sidebar-open"));
  $("scrim").addEventListener("click", () => $("app").classList.remove("sidebar-open"));
  $("view-chat").addEventListener("click", () => showView("chat"));
  $("view-kernels").addEventListener("click", () => showView("kernels"));
  $("kernels-refresh").addEventListener("click", refreshKernels);
  if (!currentConv()) state.current = state.convs.length ? state.convs[0].id : null;
  renderSidebar();
  renderConversation();
}

init();
