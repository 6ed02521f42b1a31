// Switchyard playground: a small client of this server's LangGraph-compatible API.
//
// Plain script, no build step, no third-party code. Every string that comes from the
// server (answers, titles, tool arguments, thread metadata, error messages) reaches the
// DOM through textContent or setAttribute, never parsed as HTML; the page's CSP
// forbids inline script and foreign origins as a second line of defence.
"use strict";

(() => {
  const STORE = {
    key: "switchyard.playground.key",
    graph: "switchyard.playground.graph",
    thread: "switchyard.playground.thread",
    meta: "switchyard.playground.meta",
  };
  const STREAM_MODE = ["values", "messages-tuple", "updates"];
  const META_KEEP = 300; // answers whose request/run/backend are remembered across reloads
  const REJOIN_TRIES = 5;  // reconnections in a row without a new event before giving up
  const REJOIN_WAIT_MS = [500, 1000, 2000, 4000, 8000]; // the pause before each of them
  const THREADS_LISTED = 50;
  const DASH = "—";

  const $ = (id) => document.getElementById(id);
  const el = {
    auth: $("auth"), keyForm: $("key-form"), apiKey: $("api-key"), saveKey: $("save-key"), forgetKey: $("forget-key"),
    rememberKey: $("remember-key"),
    graphSelect: $("graph-select"), threadSelect: $("thread-select"), newThread: $("new-thread"),
    mermaid: $("graph-mermaid"), diagram: $("graph-diagram"),
    status: $("status"), error: $("error"), messages: $("messages"),
    approval: $("approval"), composer: $("composer"), input: $("message-input"), send: $("send"), stop: $("stop"),
  };
  const approvalPart = (selector) => el.approval.querySelector(selector);

  // ---------------------------------------------------------------- storage

  function stored(name, area) {
    try { return (area || localStorage).getItem(name); } catch { return null; }
  }
  function store(name, value, area) {
    try {
      const where = area || localStorage;
      if (value === null || value === undefined || value === "") where.removeItem(name);
      else where.setItem(name, value);
    } catch { /* storage off (private mode): the page works without it */ }
  }

  // The API key lives in sessionStorage (this tab, until it closes) unless the person
  // ticks "remember on this browser": localStorage is readable by every page of the
  // origin (Swagger UI's CDN script under /docs, in dev or with public_api_docs), and
  // stays after the browser closes.
  function sessionArea() {
    try { return sessionStorage; } catch { return null; }
  }
  function storedKey() {
    const area = sessionArea();
    return (area && stored(STORE.key, area)) || stored(STORE.key) || "";
  }
  function keyRemembered() {
    return !!stored(STORE.key);
  }
  function storeKey(key, remember) {
    const area = sessionArea();
    if (area) store(STORE.key, remember ? null : key, area);
    store(STORE.key, remember || !area ? key : null);
  }
  function forgetStoredKey() {
    const area = sessionArea();
    if (area) store(STORE.key, null, area);
    store(STORE.key, null);
  }

  /** request id, run id and backend of answers seen here, by message id: read from
   * localStorage once, then kept here and written through. */
  let metaCache = null;
  function loadMeta() {
    if (metaCache) return metaCache;
    try { metaCache = JSON.parse(stored(STORE.meta) || "{}") || {}; } catch { metaCache = {}; }
    if (typeof metaCache !== "object" || Array.isArray(metaCache)) metaCache = {};
    return metaCache;
  }
  function rememberMeta(messageId, meta) {
    const all = loadMeta();
    delete all[messageId];
    all[messageId] = meta;
    const ids = Object.keys(all);
    for (const old of ids.slice(0, Math.max(0, ids.length - META_KEEP))) delete all[old];
    store(STORE.meta, JSON.stringify(all));
  }

  // ---------------------------------------------------------------- state

  const state = {
    key: storedKey(),
    authOn: false,
    assistants: [],
    assistantId: null,
    threadId: null,
    messages: [],          // the thread's messages (its state's values.messages)
    live: new Map(),       // id -> message being streamed, not in `messages` yet
    partial: [],           // answers cut short by a stop or an error (not kept by the thread)
    values: null,          // the latest values of the thread
    citationsFor: null,    // id of the answer the values' sources belong to
    interrupt: null,       // the pending interrupt's value, if the thread waits for a person
    run: null,             // the run streaming now
    locked: false,         // a run or a thread's read-back is under way: no new run yet
    toolCalls: new Map(),  // call id -> .tool-call element
  };

  // ---------------------------------------------------------------- errors

  class ApiFailure extends Error {
    /**
     * @param {string} kind backend_down | rate_limited | deadline | auth | server_down | error
     * @param {string} message what the person reads
     */
    constructor(kind, message, status) {
      super(message);
      this.kind = kind;
      this.status = status || 0;
    }
  }

  // The server's own wording (gateway/errors.py, reported by serving/errors.py): a model
  // backend down is "model backend 'ID' is unavailable: …" (503), one that failed is
  // "model backend 'ID' answered N: …" (502). An embedder's failure (knowledge's
  // EmbeddingError, 503, stream type EmbedderUnavailable) is worded by the embedders
  // (knowledge/embeddings/) and may quote the model backend under it, so it is matched
  // first. Other 503s (the thread, vector or graph store, the run board) name no
  // backend: "ConnectionRefusedError" in a thread store's message is not one.
  const MODEL_BACKEND = /\bmodel backend '([^']+)'/;
  const EMBEDDER = /^(?:embedding backend failed\b|unknown local embedding model\b|the local embedding model\b|set embedding_dimensions\b|backend returned \d+ dimensions\b)|\(backend '[^']+'\) does not declare the embeddings capability/;

  /** Classify an HTTP error answered before any stream. */
  function httpFailure(status, detail, retryAfter, backend) {
    const text = detail || `HTTP ${status}`;
    if (status === 401 || status === 403) {
      const what = status === 401 ? "The API key is missing or not valid" : "The API key may not do this";
      return new ApiFailure("auth", `${what}: ${text}`, status);
    }
    if (status === 429) {
      const wait = retryAfter ? ` Try again in ${retryAfter} s.` : "";
      return new ApiFailure("rate_limited", `Rate limited: ${text}.${wait}`.replace("..", "."), status);
    }
    if (status === 504) return new ApiFailure("deadline", `The run's deadline passed: ${text}`, status);
    if (status === 503 && EMBEDDER.test(text)) {
      return new ApiFailure("backend_down", `${embedderSentence(text)}: ${text}`, status);
    }
    if ((status === 502 || status === 503) && MODEL_BACKEND.test(text)) {
      return new ApiFailure("backend_down", `${backendSentence(backend, text)}: ${text}`, status);
    }
    if (status === 502) {
      // Not Switchyard's wording: a proxy in front of it answered (Switchyard down?).
      return new ApiFailure("server_down", `A proxy in front of Switchyard answered 502 (Bad Gateway): the server may be down. ${text}`, status);
    }
    if (status === 503) {
      const wait = retryAfter ? ` Try again in ${retryAfter} s.` : "";
      return new ApiFailure("error", `Unavailable for now (503): ${text}.${wait}`.replace("..", "."), status);
    }
    return new ApiFailure("error", `${status >= 500 ? "Server error" : "Request refused"} (${status}): ${text}`, status);
  }

  function backendSentence(backend, message) {
    const named = (MODEL_BACKEND.exec(message || "") || [])[1] || backend;
    return `The model backend is unreachable${named ? ` (${named})` : ""}`;
  }

  /** A down embedder is a backend down too (kind backend_down), named as the embedder. */
  function embedderSentence(message) {
    const named = (/backend '([^']+)'/.exec(message || "") || [])[1];
    return `The embedder is unavailable${named ? ` (backend ${named})` : ""}`;
  }

  const STORES = {
    ThreadStoreUnavailable: "The thread store is unavailable",
    VectorStoreUnavailable: "The vector store is unavailable",
    GraphStoreUnavailable: "The graph store is unavailable",
  };

  /** Classify a stream's `error` event ({"error": Type, "message": ...}). */
  function streamFailure(data, backend) {
    const type = (data && typeof data === "object" && String(data.error || "")) || "Error";
    const message = (data && typeof data === "object" && String(data.message || "")) || String(data || "the run failed");
    switch (type) {
      case "BackendUnavailable":
      case "BackendError":
        return new ApiFailure("backend_down", `${backendSentence(backend, message)}: ${message}`);
      case "EmbedderUnavailable":
        return new ApiFailure("backend_down", `${embedderSentence(message)}: ${message}`);
      case "ThreadStoreUnavailable":
      case "VectorStoreUnavailable":
      case "GraphStoreUnavailable":
        return new ApiFailure("error", `${STORES[type]}: ${message}`);
      case "Unavailable":
        return MODEL_BACKEND.test(message)
          ? new ApiFailure("backend_down", `${backendSentence(backend, message)}: ${message}`)
          : new ApiFailure("error", `Unavailable: ${message}`);
      case "RateLimited":
        return new ApiFailure("rate_limited", `Rate limited: ${message}`);
      case "DeadlineExceeded":
        return new ApiFailure("deadline", `The run's deadline passed: ${message}`);
      case "PermissionDenied":
      case "Unauthorized":
        return new ApiFailure("auth", `Not allowed: ${message}`);
      default:
        if (/deadline/i.test(type)) return new ApiFailure("deadline", `The run's deadline passed: ${message}`);
        return new ApiFailure("error", `${type}: ${message}`);
    }
  }

  function showError(failure) {
    if (failure.kind === "auth" && state.authOn) el.auth.hidden = false;
    el.error.dataset.kind = failure.kind || "error";
    el.error.textContent = failure.message;
    el.error.hidden = false;
  }
  function clearError() {
    el.error.hidden = true;
    el.error.textContent = "";
    delete el.error.dataset.kind;
  }
  function setStatus(text) { el.status.textContent = text; }

  // ---------------------------------------------------------------- HTTP

  function headers(extra) {
    const out = { "content-type": "application/json", ...extra };
    if (state.key) out["x-api-key"] = state.key;
    return out;
  }

  async function errorDetail(response) {
    const text = await response.text().catch(() => "");
    try {
      const body = JSON.parse(text);
      if (body && typeof body.detail === "string") return body.detail;
      if (body && body.detail !== undefined) return JSON.stringify(body.detail);
      if (body && body.error && typeof body.error.message === "string") return body.error.message;
      if (body && typeof body.message === "string") return body.message;
    } catch { /* not JSON */ }
    return text.slice(0, 300);
  }

  /** fetch, with failures turned into ApiFailure; returns the Response when ok. */
  async function request(method, path, body, { signal, noKey, extraHeaders } = {}) {
    const init = { method, headers: headers(extraHeaders), signal, cache: "no-store" };
    if (noKey) delete init.headers["x-api-key"];
    if (body !== undefined) init.body = JSON.stringify(body);
    let response;
    try {
      response = await fetch(path, init);
    } catch (exc) {
      if (exc && exc.name === "AbortError") throw exc;
      throw new ApiFailure("server_down", `The Switchyard server cannot be reached (${exc && exc.message ? exc.message : "network error"}).`);
    }
    if (!response.ok) {
      const detail = await errorDetail(response);
      throw httpFailure(response.status, detail, response.headers.get("retry-after"), response.headers.get("x-switchyard-backend"));
    }
    return response;
  }

  async function api(method, path, body, options) {
    const response = await request(method, path, body, options);
    if (response.status === 204) return null;
    return response.json();
  }

  const enc = encodeURIComponent;

  // ---------------------------------------------------------------- SSE

  /**
   * Read a text/event-stream body: events are separated by a blank line, `data:` lines
   * are joined with "\n", `event:` names the event, `id:` is kept, comment lines
   * (":") are skipped. CR, LF and CRLF all end lines, and a chunk may end anywhere
   * (even between a CR and its LF, or inside a UTF-8 sequence).
   */
  async function readEvents(body, onEvent) {
    const reader = body.getReader();
    const decoder = new TextDecoder("utf-8");
    let buffer = "";
    let first = true;
    let event = { name: "", data: [], id: null };
    let lastId = null;

    const dispatchLine = (line) => {
      if (line === "") {
        if (event.data.length) onEvent(event.name || "message", event.data.join("\n"), lastId);
        event = { name: "", data: [], id: null };
        return;
      }
      if (line[0] === ":") return;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value[0] === " ") value = value.slice(1);
      if (field === "event") event.name = value;
      else if (field === "data") event.data.push(value);
      else if (field === "id" && !value.includes("\0")) lastId = value;
    };

    const drain = (final) => {
      let start = 0;
      for (let i = 0; i < buffer.length; i++) {
        const ch = buffer[i];
        if (ch !== "\n" && ch !== "\r") continue;
        if (ch === "\r" && i + 1 === buffer.length && !final) break; // its LF may come next
        dispatchLine(buffer.slice(start, i));
        if (ch === "\r" && buffer[i + 1] === "\n") i++;
        start = i + 1;
      }
      buffer = buffer.slice(start);
    };

    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      if (first && buffer.length) {
        if (buffer[0] === "\ufeff") buffer = buffer.slice(1);
        first = false;
      }
      drain(false);
    }
    buffer += decoder.decode();
    drain(true);
    if (buffer) dispatchLine(buffer);
    // An event not ended by a blank line when the stream closes is dropped (the
    // EventSource rule): it may be cut short.
    return lastId;
  }

  // ---------------------------------------------------------------- messages

  function textOf(content) {
    if (typeof content === "string") return content;
    if (Array.isArray(content)) {
      return content.map((part) => (typeof part === "string" ? part : part && part.type === "text" ? String(part.text || "") : "")).join("");
    }
    return content == null ? "" : JSON.stringify(content);
  }

  function roleOf(message) {
    const type = String(message.type || message.role || "");
    if (type === "human" || type === "user" || type === "HumanMessageChunk") return "human";
    if (type === "tool" || type === "ToolMessageChunk") return "tool";
    if (type === "system" || type === "SystemMessageChunk") return "system";
    return "ai";
  }

  function node(tag, className, text) {
    const made = document.createElement(tag);
    if (className) made.className = className;
    if (text !== undefined) made.textContent = text;
    return made;
  }

  function pretty(value) {
    if (typeof value === "string") {
      try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
    }
    try { return JSON.stringify(value, null, 2); } catch { return String(value); }
  }

  function decisionOf(toolMessage) {
    const artifact = toolMessage.artifact;
    if (artifact && typeof artifact === "object" && typeof artifact.decision === "string") {
      return { decision: artifact.decision, reason: String(artifact.reason || "") };
    }
    // Messages from before the executor recorded its decision: read the text's prefix.
    const text = textOf(toolMessage.content);
    if (text.startsWith("Refused:")) return { decision: "refused", reason: text.slice(8).trim() };
    if (text.startsWith("Timed out:")) return { decision: "timed_out", reason: text.slice(10).trim() };
    if (text.startsWith("Error:") || toolMessage.status === "error") return { decision: "failed", reason: text };
    return { decision: "executed", reason: "" };
  }

  const messageEls = new Map(); // message id -> .message element

  function messageElement(id, role) {
    let item = messageEls.get(id);
    if (item && item.dataset.role === role) return item;
    if (item) item.remove();
    item = node("div", "message");
    item.dataset.role = role;
    item.dataset.messageId = id;
    item.appendChild(node("div", "role", role === "human" ? "you" : role === "ai" ? "assistant" : role));
    if (role === "tool") {
      const details = node("details", "tool-output");
      details.appendChild(node("summary", "tool-summary"));
      details.appendChild(node("div", "text"));
      item.appendChild(details);
    } else {
      item.appendChild(node("div", "text"));
    }
    if (role === "ai") {
      item.appendChild(node("div", "tool-calls"));
      item.dataset.streaming = "false";
    }
    messageEls.set(id, item);
    return item;
  }

  function renderToolCalls(item, calls, final) {
    const box = item.querySelector(".tool-calls");
    const rendered = new Set();
    for (const call of calls) {
      const callId = String(call.id || `${item.dataset.messageId}:${call.index ?? 0}`);
      let block = state.toolCalls.get(callId);
      if (!block || block.parentNode !== box) {
        if (block) block.remove();
        block = node("div", "tool-call");
        block.dataset.callId = callId;
        block.dataset.decision = "pending";
        const head = node("div", "tool-head");
        head.appendChild(node("span", "tool-name"));
        head.appendChild(node("span", "decision", "pending"));
        block.appendChild(head);
        block.appendChild(node("pre", "tool-args"));
        block.appendChild(node("div", "tool-reason"));
        block.appendChild(node("pre", "tool-result"));
        box.appendChild(block);
        state.toolCalls.set(callId, block);
      }
      const name = String(call.name || "");
      if (name) block.dataset.tool = name;
      block.querySelector(".tool-name").textContent = name || "…";
      block.querySelector(".tool-args").textContent = pretty(call.args ?? "");
      rendered.add(block);
    }
    if (final) {
      // The message's own calls replace what streamed (a chunk's call may have had no id yet).
      for (const block of [...box.children]) {
        if (rendered.has(block)) continue;
        state.toolCalls.delete(block.dataset.callId);
        block.remove();
      }
    }
  }

  function applyToolResult(toolMessage) {
    const block = state.toolCalls.get(String(toolMessage.tool_call_id || ""));
    if (!block) return;
    const { decision, reason } = decisionOf(toolMessage);
    block.dataset.decision = decision;
    block.querySelector(".decision").textContent = decision.replace("_", " ");
    block.querySelector(".tool-reason").textContent = decision === "executed" ? "" : reason;
    block.querySelector(".tool-result").textContent = textOf(toolMessage.content);
  }

  function renderMeta(item, meta) {
    let box = item.querySelector(".meta");
    if (!box) {
      box = node("div", "meta");
      for (const [field, label] of [["request-id", "request"], ["run-id", "run"], ["backend", "backend"]]) {
        const pair = node("span", "pair");
        pair.appendChild(node("span", "label", `${label} `));
        const value = node("span", null, DASH);
        value.dataset.field = field;
        pair.appendChild(value);
        box.appendChild(pair);
      }
      item.appendChild(box);
    }
    const set = (field, value) => { box.querySelector(`[data-field="${field}"]`).textContent = value || DASH; };
    set("request-id", meta && meta.requestId);
    set("run-id", meta && meta.runId);
    set("backend", meta && meta.backend);
  }

  function updateMessage(message, streaming) {
    const role = roleOf(message);
    if (role === "system") return null;
    const id = String(message.id || "");
    const item = messageElement(id, role);
    const text = textOf(message.content);
    if (role === "tool") {
      const { decision } = decisionOf(message);
      item.querySelector(".tool-summary").textContent = `${message.name || "tool"} → ${decision.replace("_", " ")}`;
      item.dataset.decision = decision;
      item.querySelector(".text").textContent = text;
      applyToolResult(message);
      return item;
    }
    const textBox = item.querySelector(".text");
    const shown = role === "ai" ? text.replace(/^\s*\n/, "") : text; // a node's leading blank lines
    if (textBox.textContent !== shown) textBox.textContent = shown;
    if (role === "ai") {
      const final = Array.isArray(message.tool_calls) && message.tool_calls.length > 0;
      const calls = final ? message.tool_calls : Array.isArray(message._callChunks) ? message._callChunks : [];
      if (calls.length) renderToolCalls(item, calls, final);
      if (streaming) item.dataset.streaming = "true";
      const run = state.run;
      const meta = run && run.aiIds.has(id) ? runMeta(run) : loadMeta()[id];
      renderMeta(item, meta);
    }
    return item;
  }

  function runMeta(run) {
    return { requestId: run.requestId, runId: run.runId, backend: run.backend };
  }

  /** Put the thread's messages, then the ones still streaming, in the DOM in order. */
  function render() {
    const wanted = [];
    const known = new Set();
    for (const message of state.messages) {
      const id = String(message.id || "");
      known.add(id);
      const streaming = !!(state.run && state.run.aiIds.has(id) && !state.run.ended);
      const item = updateMessage(message, streaming);
      if (item) wanted.push(item);
    }
    for (const [id, message] of state.live) {
      if (known.has(id)) continue;
      known.add(id);
      const item = updateMessage(message, !!(state.run && !state.run.ended));
      if (item) wanted.push(item);
    }
    for (const message of state.partial) {
      const id = String(message.id || "");
      if (known.has(id)) continue;
      const item = updateMessage(message, false);
      if (!item) continue;
      if (!item.querySelector(".partial-note")) {
        item.insertBefore(node("div", "partial-note", "stopped before the end: not kept in the thread"), item.querySelector(".meta"));
      }
      wanted.push(item);
    }
    for (const message of state.messages) if (roleOf(message) === "tool") applyToolResult(message);
    renderCitations();
    // Reorder only what moved: a streaming answer keeps its element.
    let cursor = el.messages.firstChild;
    for (const item of wanted) {
      if (cursor === item) { cursor = cursor.nextSibling; continue; }
      el.messages.insertBefore(item, cursor);
    }
    while (cursor) {
      const next = cursor.nextSibling;
      if (cursor.dataset && cursor.dataset.messageId !== undefined) messageEls.delete(cursor.dataset.messageId);
      cursor.remove();
      cursor = next;
    }
  }

  function scrollDown() {
    const box = el.messages;
    if (box.scrollHeight - box.scrollTop - box.clientHeight < 160) box.scrollTop = box.scrollHeight;
  }

  // ---------------------------------------------------------------- citations and facts

  function renderCitations() {
    for (const old of el.messages.querySelectorAll(".citations, .facts")) {
      if (old.parentNode.dataset.messageId !== state.citationsFor) old.remove();
    }
    const values = state.values || {};
    const sources = Array.isArray(values.sources) ? values.sources : [];
    const facts = Array.isArray(values.facts) ? values.facts : [];
    const item = state.citationsFor ? messageEls.get(state.citationsFor) : null;
    if (!item || (!sources.length && !facts.length)) return;
    const signature = JSON.stringify([sources.map((s) => [s.index, s.chunk_id]), facts.length]);
    if (item.dataset.citations === signature && item.querySelector(".citations, .facts")) return;
    for (const old of item.querySelectorAll(".citations, .facts")) old.remove();
    item.dataset.citations = signature;
    const anchor = item.querySelector(".meta");
    if (sources.length) {
      const box = node("div", "citations");
      box.appendChild(node("h3", null, "Sources"));
      for (const source of sources) {
        const entry = node("details", "citation");
        entry.dataset.index = String(source.index ?? "");
        entry.dataset.docId = String(source.doc_id ?? "");
        const name = source.title || source.source || source.doc_id || "";
        const heading = source.heading ? ` — ${source.heading}` : "";
        entry.appendChild(node("summary", null, `[${source.index}] ${name}${heading}`));
        if (source.source && source.title) entry.appendChild(node("div", "where", String(source.source)));
        entry.appendChild(node("div", "chunk", String(source.text ?? "")));
        box.appendChild(entry);
      }
      item.insertBefore(box, anchor);
    }
    if (facts.length) {
      const box = node("div", "facts");
      box.appendChild(node("h3", null, "Graph facts"));
      for (const fact of facts) {
        const line = node("div", "fact");
        line.dataset.docId = String(fact.doc_id ?? "");
        line.appendChild(node("span", "subject", String(fact.subject ?? "")));
        line.appendChild(node("span", "relation", ` —${fact.relation ?? ""}→ `));
        line.appendChild(node("span", "object", String(fact.object ?? "")));
        const cited = Array.isArray(fact.cited_as) ? fact.cited_as.map((n) => `[${n}]`).join("") : "";
        const docs = Array.isArray(fact.sources)
          ? [...new Set(fact.sources.map((s) => s.title || s.source || s.doc_id).filter(Boolean))].join(", ")
          : "";
        const where = [cited, docs].filter(Boolean).join(" ");
        if (where) line.appendChild(node("span", "sources", ` ${where}`));
        box.appendChild(line);
      }
      item.insertBefore(box, anchor);
    }
  }

  function lastAnswerId(messages) {
    for (let i = messages.length - 1; i >= 0; i--) {
      if (roleOf(messages[i]) === "ai" && textOf(messages[i].content)) return String(messages[i].id || "");
      if (roleOf(messages[i]) === "human") break;
    }
    return null;
  }

  // ---------------------------------------------------------------- approval

  function interruptsOf(source) {
    if (!source || typeof source !== "object") return [];
    const direct = source.__interrupt__ || source.interrupts;
    if (Array.isArray(direct) && direct.length) return direct;
    if (Array.isArray(source.tasks)) {
      for (const task of source.tasks) if (Array.isArray(task.interrupts) && task.interrupts.length) return task.interrupts;
    }
    return [];
  }

  function showApproval(interrupt) {
    state.interrupt = interrupt;
    if (!interrupt) { el.approval.hidden = true; return; }
    const value = interrupt.value && typeof interrupt.value === "object" ? interrupt.value : {};
    const request = value.action_request || (Array.isArray(value.action_requests) && value.action_requests[0]) || {};
    const tool = String(request.action || request.name || "");
    approvalPart(".approval-tool").textContent = tool || "(a tool)";
    // Another graph's interrupt (not a tool approval): its value is shown as it is.
    const description = value.description || (tool ? "" : pretty(interrupt.value));
    approvalPart(".approval-description").textContent = String(description);
    approvalPart(".approval-args").value = pretty(request.args ?? {});
    approvalPart(".approval-reason").value = "";
    approvalPart(".approval-error").hidden = true;
    el.approval.dataset.tool = tool;
    el.approval.hidden = false;
    setStatus("interrupted: approval needed");
  }

  async function answerApproval(action) {
    if (!state.interrupt || state.run || state.locked) return;
    const tool = el.approval.dataset.tool || "";
    let resume;
    if (action === "approve") {
      resume = [{ type: "accept", args: null }];
    } else if (action === "edit") {
      let edited;
      try {
        edited = JSON.parse(approvalPart(".approval-args").value);
      } catch (exc) {
        return approvalProblem(`The arguments are not valid JSON (${exc.message}); nothing was sent.`);
      }
      if (!edited || typeof edited !== "object" || Array.isArray(edited)) {
        return approvalProblem("The arguments must be a JSON object; nothing was sent.");
      }
      resume = [{ type: "edit", args: { action: tool, args: edited } }];
    } else {
      resume = [{ type: "response", args: approvalPart(".approval-reason").value }];
    }
    showApproval(null);
    await stream({ command: { resume } });
  }

  function approvalProblem(message) {
    const box = approvalPart(".approval-error");
    box.textContent = message;
    box.hidden = false;
    showError(new ApiFailure("error", message));
  }

  // ---------------------------------------------------------------- runs

  /** No new run, approval or thread switch while one runs or a thread is being read
   * back (its state may show it busy or waiting for an approval). */
  function lock(on) {
    state.locked = on;
    el.send.disabled = on;
    for (const button of el.approval.querySelectorAll("button")) button.disabled = on;
    el.graphSelect.disabled = on;
    el.threadSelect.disabled = on;
    el.newThread.disabled = on;
  }

  function setStreaming(on) {
    lock(on);
    el.stop.disabled = !on;
  }

  /** Wait ``ms`` between two connections; Stop ends the wait at once (also when it
   * was pressed just before, while the page was asking the run's status). */
  function pause(run, ms) {
    if (run.cancelled) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(() => { run.wake = null; resolve(); }, ms);
      run.wake = () => { clearTimeout(timer); run.wake = null; resolve(); };
    });
  }

  function runIdFrom(location) {
    const match = /\/runs\/([^/?#]+)/.exec(location || "");
    return match ? decodeURIComponent(match[1]) : null;
  }

  function newRun() {
    return {
      runId: null, requestId: null, backend: null, ended: false, cancelled: false, failed: false,
      threadId: null, cancelSent: false,
      lastEventId: null,   // the last event id seen: a rejoin resumes after it
      cut: false,          // the server said to reconnect (a board outage, a drain)
      wake: null,          // ends a pause between reconnections early (Stop)
      before: new Set(state.messages.map((m) => String(m.id || ""))),
      aiIds: new Set(), controller: new AbortController(),
    };
  }

  function onChunk(run, chunk) {
    if (!chunk || typeof chunk !== "object") return;
    const id = String(chunk.id || "");
    if (!id) return;
    const role = roleOf(chunk);
    if (role === "human" || role === "system") return;
    const existing = state.live.get(id);
    if (role === "tool" || !String(chunk.type || "").endsWith("Chunk")) {
      state.live.set(id, chunk); // a whole message (a tool result, or a node's own answer)
    } else {
      const merged = existing || { id, type: "ai", content: "", _callChunks: [] };
      merged.content = textOf(merged.content) + textOf(chunk.content);
      for (const part of chunk.tool_call_chunks || []) {
        const index = part.index ?? merged._callChunks.length;
        let call = merged._callChunks.find((c) => c.index === index);
        if (!call) { call = { index, id: null, name: "", args: "" }; merged._callChunks.push(call); }
        if (part.id) call.id = part.id;
        if (part.name) call.name += part.name;
        if (part.args) call.args += part.args;
      }
      state.live.set(id, merged);
    }
    if (role === "ai" && !run.before.has(id)) run.aiIds.add(id);
  }

  function onValues(run, values) {
    if (!values || typeof values !== "object") return;
    state.values = values;
    if (Array.isArray(values.messages)) {
      state.messages = values.messages;
      for (const message of values.messages) {
        const id = String(message.id || "");
        if (roleOf(message) === "ai" && !run.before.has(id)) run.aiIds.add(id);
      }
    }
    const interrupts = interruptsOf(values);
    if (interrupts.length) run.interrupt = interrupts[0];
  }

  function handleEvent(run, name, raw) {
    let data;
    try { data = JSON.parse(raw); } catch { data = raw; }
    const base = name.split("|")[0];
    // A subgraph's own values and updates (`name|namespace`) are not the thread's.
    if (base !== name && base !== "messages" && base !== "error") return;
    if (base === "metadata") {
      if (data && data.run_id) run.runId = String(data.run_id);
      if (run.cancelled && run.runId) sendCancel(run);
      if (!run.backend && data && data.switchyard_backend) run.backend = String(data.switchyard_backend);
    } else if (base === "messages") {
      if (Array.isArray(data)) onChunk(run, data[0]);
    } else if (base === "values") {
      onValues(run, data);
    } else if (base === "updates") {
      const interrupts = interruptsOf(data);
      if (interrupts.length) run.interrupt = interrupts[0];
    } else if (base === "error") {
      const type = data && typeof data === "object" ? data.error : "";
      if (type === "RunCancelled") run.cancelled = true;
      else if (type === "BoardUnavailable" || type === "ServerShutdown") run.cut = true; // the run's status says what next
      else { run.failed = true; showError(streamFailure(data, run.backend)); }
    }
    render();
    scrollDown();
  }

  async function ensureThread() {
    if (state.threadId) return state.threadId;
    const assistant = currentAssistant();
    const thread = await api("POST", "/threads", {
      metadata: { graph_id: assistant ? assistant.graph_id : state.assistantId, assistant_id: state.assistantId },
    });
    selectThread(thread.thread_id);
    return thread.thread_id;
  }

  /**
   * One run over runs/stream (a new message, or a resume), or a join of a running one.
   *
   * Runs are started with `on_disconnect: "continue"` and `stream_resumable`, so a
   * stream that is cut (the network dropped, the server said to reconnect) or that
   * closes before its run has ended (a run's stream has no `end` event: the run's
   * status tells) leaves the run going: `follow` looks the run up and, while it is
   * pending or running, joins it after the last event seen. Stop still cancels it.
   */
  async function stream(payload, { joinRunId } = {}) {
    clearError();
    const run = newRun();
    state.run = run;
    state.partial = [];
    setStreaming(true);
    setStatus(joinRunId ? "busy: joining the running run…" : "streaming…");
    try {
      const threadId = await ensureThread();
      run.threadId = threadId;
      let response;
      if (joinRunId) {
        run.runId = joinRunId;
        response = await joinStream(run, threadId);
      } else {
        if (payload.input && payload.input.messages) {
          // Shown at once, under the id the thread will keep.
          state.messages = [...state.messages, ...payload.input.messages];
          render();
          scrollDown();
        }
        const body = {
          assistant_id: state.assistantId,
          stream_mode: STREAM_MODE,
          stream_resumable: true,
          on_disconnect: "continue",
          ...payload,
        };
        response = await request("POST", `/threads/${enc(threadId)}/runs/stream`, body, { signal: run.controller.signal });
      }
      takeHeaders(run, response);
      render();
      await follow(run, threadId, response);
    } catch (exc) {
      if (exc && exc.name === "AbortError") run.cancelled = true;
      else if (exc instanceof ApiFailure) { run.failed = true; showError(exc); }
      else { run.failed = true; showError(new ApiFailure("error", `The page failed: ${exc && exc.message ? exc.message : exc}`)); }
    } finally {
      run.ended = true;
      run.wake = null;
      if (run.runId && !run.backend && !run.failed && !run.looked) await runBackend(run);
      for (const id of run.aiIds) rememberMeta(id, runMeta(run));
      // The thread's state is the truth once the run is over: messages the run kept
      // (an inner model call's tokens are not among them), sources, a pending interrupt.
      if (run.cancelled || run.failed) {
        const kept = new Set(state.messages.map((m) => String(m.id || "")));
        state.partial = [...state.live.values()].filter((m) => roleOf(m) === "ai" && textOf(m.content) && !kept.has(String(m.id || "")));
      }
      state.live.clear();
      state.citationsFor = lastAnswerId(state.messages);
      render();
      for (const item of el.messages.querySelectorAll('.message[data-streaming="true"]')) item.dataset.streaming = "false";
      state.run = null;
      el.stop.disabled = true;
      // Send, the approval buttons and the pickers come back once the thread's state
      // is read: until then the thread may still look busy, and a Send would be a 409.
      try {
        await refreshThread({ after: run });
      } finally {
        lock(false);
      }
    }
  }

  function takeHeaders(run, response) {
    run.requestId = run.requestId || response.headers.get("x-request-id"); // a rejoin keeps the first
    run.backend = response.headers.get("x-switchyard-backend") || run.backend;
    run.runId = runIdFrom(response.headers.get("content-location")) || run.runId;
    if (run.cancelled && run.runId) sendCancel(run); // Stop was pressed before the id was known
  }

  /** The run's stream after the last event seen (all of it for a first join). */
  function joinStream(run, threadId) {
    const extraHeaders = run.lastEventId !== null ? { "last-event-id": run.lastEventId } : undefined;
    return request("GET", `/threads/${enc(threadId)}/runs/${enc(run.runId)}/stream`, undefined, {
      signal: run.controller.signal,
      extraHeaders,
    });
  }

  const ACTIVE = new Set(["pending", "running"]);

  /**
   * Read `response`'s events; when it ends without the run's end (no error, no cancel),
   * ask the run's status and rejoin while it is pending or running: up to REJOIN_TRIES
   * times in a row without a new event, pausing longer each time. A stream cut short
   * of a run that has ended is joined once more, for the events it missed (the final
   * values, an error), which the run keeps.
   */
  async function follow(run, threadId, response) {
    let tries = 0;
    let caughtUp = false;
    let lost = null; // why the last connection ended early (server_down), if it did
    for (;;) {
      const seen = run.lastEventId;
      if (response) {
        lost = null;
        try {
          await readEvents(response.body, (name, raw, id) => {
            if (id !== null) run.lastEventId = id;
            handleEvent(run, name, raw);
          });
        } catch (exc) {
          if (exc && exc.name === "AbortError") throw exc;
          lost = new ApiFailure("server_down", `The connection to the Switchyard server was lost during the answer (${exc && exc.message ? exc.message : "network error"}).`);
        }
      }
      if (run.lastEventId !== seen) tries = 0;
      if (run.failed || run.cancelled) return;
      if (!run.runId) {
        if (lost) throw lost;
        return; // no run to look up (no run id was sent): nothing more to follow
      }
      const cutShort = !!lost || run.cut;
      run.cut = false;
      let status = null;
      try {
        status = await runStatus(run, threadId);
      } catch (exc) {
        if (!(exc instanceof ApiFailure) || exc.kind !== "server_down") throw exc; // e.g. 404: the run is gone
        lost = exc;
      }
      if (status && !ACTIVE.has(status)) {
        if (!cutShort || caughtUp) return;
        caughtUp = true;
      } else {
        if (tries >= REJOIN_TRIES) {
          if (lost) throw new ApiFailure(lost.kind, `${lost.message} The run may still be going on: reload the page to follow it.`, lost.status);
          throw new ApiFailure("error", `The run ${run.runId} goes on, but its stream keeps closing; reopen the thread to follow it.`);
        }
        setStatus(`reconnecting to the run… (${tries + 1} of ${REJOIN_TRIES})`);
        await pause(run, REJOIN_WAIT_MS[Math.min(tries, REJOIN_WAIT_MS.length - 1)]);
        tries++;
        if (run.cancelled) return;
        if (status === null) { response = null; continue; } // the server did not answer: ask again
      }
      response = null;
      try {
        response = await joinStream(run, threadId);
        takeHeaders(run, response);
        setStatus("streaming…");
      } catch (exc) {
        if (exc && exc.name === "AbortError") throw exc;
        if (!(exc instanceof ApiFailure) || exc.kind !== "server_down") throw exc;
        lost = exc;
      }
    }
  }

  /** The run's status (GET .../runs/{id}); its backend too, when the stream named none. */
  async function runStatus(run, threadId) {
    const record = await api("GET", `/threads/${enc(threadId)}/runs/${enc(run.runId)}`);
    run.looked = true;
    const backend = record && record.metadata && record.metadata.switchyard_backend;
    if (backend && !run.backend) run.backend = String(backend);
    return record && typeof record.status === "string" ? record.status : null;
  }

  /** A resumed or joined run's backend, from the run's metadata (no header then). */
  async function runBackend(run) {
    try {
      const record = await api("GET", `/threads/${enc(state.threadId)}/runs/${enc(run.runId)}`);
      const backend = record && record.metadata && record.metadata.switchyard_backend;
      if (backend) run.backend = String(backend);
    } catch { /* shown as "—" */ }
  }

  /**
   * Stop: cancel the run on the server. Its stream goes on until the run ends (with a
   * RunCancelled error event). Pressed before the run's id is known (the response
   * starts once the answering backend is known, or after the keep-alive interval), the
   * cancel is sent when the id arrives: aborting the request alone would leave the run
   * going, since runs are started with on_disconnect "continue".
   */
  async function cancelRun() {
    const run = state.run;
    if (!run || run.ended || run.cancelled) return;
    run.cancelled = true;
    setStatus("cancelling…");
    if (run.wake) run.wake(); // between two connections: stop reconnecting
    if (run.runId) await sendCancel(run);
  }

  async function sendCancel(run) {
    if (run.cancelSent || run.ended) return;
    run.cancelSent = true;
    const threadId = run.threadId || state.threadId;
    if (threadId) {
      try {
        await api("POST", `/threads/${enc(threadId)}/runs/${enc(run.runId)}/cancel`, {});
        return; // the stream ends with the run
      } catch (exc) {
        if (exc instanceof ApiFailure && exc.status !== 404 && exc.status !== 409) showError(exc);
      }
    }
    run.controller.abort();
  }

  // ---------------------------------------------------------------- threads

  function setUrl() {
    const params = new URLSearchParams(location.search);
    const assistant = currentAssistant();
    const graph = assistant ? assistant.graph_id : state.assistantId;
    if (graph) params.set("graph", graph); else params.delete("graph");
    if (state.threadId) params.set("thread", state.threadId); else params.delete("thread");
    const query = params.toString();
    history.replaceState(null, "", `${location.pathname}${query ? `?${query}` : ""}`);
    store(STORE.graph, graph);
    store(STORE.thread, state.threadId);
  }

  function selectThread(threadId) {
    state.threadId = threadId;
    setUrl();
    if (threadId && ![...el.threadSelect.options].some((o) => o.value === threadId)) {
      const option = new Option(`${threadId.slice(0, 8)} (new)`, threadId);
      el.threadSelect.insertBefore(option, el.threadSelect.options[1] || null);
    }
    el.threadSelect.value = threadId || "";
  }

  function resetConversation() {
    state.messages = [];
    state.live.clear();
    state.partial = [];
    state.values = null;
    state.citationsFor = null;
    state.toolCalls.clear();
    showApproval(null);
    render();
  }

  function threadLabel(thread) {
    const values = thread.values && typeof thread.values === "object" ? thread.values : {};
    const messages = Array.isArray(values.messages) ? values.messages : [];
    const first = messages.find((m) => roleOf(m) === "human");
    let words = first ? textOf(first.content).trim().split(/\s+/).slice(0, 8).join(" ") : "";
    if (words.length > 48) words = `${words.slice(0, 47)}…`;
    const when = thread.updated_at ? new Date(thread.updated_at) : null;
    const time = when && !Number.isNaN(when.getTime())
      ? when.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" })
      : "";
    const busy = thread.status && thread.status !== "idle" ? ` [${thread.status}]` : "";
    return `${words || thread.thread_id}${time ? ` · ${time}` : ""}${busy}`;
  }

  async function loadThreads() {
    const assistant = currentAssistant();
    const query = {
      limit: THREADS_LISTED,
      sort_by: "updated_at",
      sort_order: "desc",
      select: ["thread_id", "updated_at", "status", "metadata", "values"],
    };
    if (assistant) query.metadata = { graph_id: assistant.graph_id };
    const threads = await api("POST", "/threads/search", query);
    el.threadSelect.replaceChildren(new Option("(new thread)", ""));
    for (const thread of threads) el.threadSelect.appendChild(new Option(threadLabel(thread), thread.thread_id));
    if (state.threadId && ![...el.threadSelect.options].some((o) => o.value === state.threadId)) {
      el.threadSelect.appendChild(new Option(state.threadId, state.threadId));
    }
    el.threadSelect.value = state.threadId || "";
  }

  /**
   * Show a thread from its state. Returns the id of the run to join when the thread is
   * busy with one (asked only when not `after` a run of this page), else null.
   */
  async function refreshThread({ after } = {}) {
    const threadId = state.threadId;
    if (!threadId) return null;
    let threadState;
    try {
      threadState = await api("GET", `/threads/${enc(threadId)}/state`);
    } catch (exc) {
      if (exc instanceof ApiFailure) showError(exc);
      setStatus("error");
      return null;
    }
    if (threadId !== state.threadId) return null;
    const values = threadState && threadState.values && typeof threadState.values === "object" ? threadState.values : {};
    state.values = values;
    state.messages = Array.isArray(values.messages) ? values.messages : [];
    state.citationsFor = lastAnswerId(state.messages);
    render();
    const interrupts = interruptsOf(threadState);
    const interrupt = interrupts.length ? interrupts[0] : after && after.interrupt && Array.isArray(threadState.next) && threadState.next.length ? after.interrupt : null;
    showApproval(interrupt);
    if (interrupt) return null;
    if (after) {
      setStatus(after.cancelled ? "cancelled" : after.failed ? "error" : "ready");
      loadThreads().catch(() => {});
      return null;
    }
    const { busy, runId } = await busyRun(threadId);
    if (threadId !== state.threadId) return null;
    setStatus(runId ? "busy: joining the running run…" : busy ? "busy" : "ready");
    return runId;
  }

  /** Is the thread busy, and with which run (one this page may join)? */
  async function busyRun(threadId) {
    try {
      const thread = await api("GET", `/threads/${enc(threadId)}`);
      if (!thread || thread.status !== "busy") return { busy: false, runId: null };
      const runs = await api("GET", `/threads/${enc(threadId)}/runs?limit=10`);
      // The run going on, rather than one queued behind it (newest first).
      const listed = runs || [];
      const running = listed.find((r) => r.status === "running") || listed.find((r) => ACTIVE.has(r.status));
      return { busy: true, runId: running ? running.run_id : null };
    } catch {
      return { busy: false, runId: null };
    }
  }

  /** Read a thread back with the controls locked, then join its run if it has one going. */
  async function openThread() {
    let runId = null;
    lock(true);
    try {
      runId = await refreshThread();
    } finally {
      lock(false);
    }
    if (runId) await stream({}, { joinRunId: runId });
  }

  // ---------------------------------------------------------------- graphs

  function currentAssistant() {
    return state.assistants.find((a) => a.assistant_id === state.assistantId) || null;
  }

  async function loadAssistants() {
    state.assistants = await api("POST", "/assistants/search", { limit: 100 });
    el.graphSelect.replaceChildren();
    for (const assistant of state.assistants) {
      el.graphSelect.appendChild(new Option(String(assistant.name || assistant.graph_id), assistant.assistant_id));
    }
    const wanted = new URLSearchParams(location.search).get("graph") || stored(STORE.graph);
    const match = state.assistants.find((a) => a.assistant_id === wanted || a.graph_id === wanted) || state.assistants[0];
    state.assistantId = match ? match.assistant_id : null;
    el.graphSelect.value = state.assistantId || "";
  }

  async function loadDiagram() {
    el.mermaid.textContent = "";
    el.diagram.replaceChildren();
    if (!state.assistantId) return;
    try {
      const graph = await api("GET", `/assistants/${enc(state.assistantId)}/graph`);
      el.mermaid.textContent = mermaid(graph);
      drawGraph(el.diagram, graph);
    } catch (exc) {
      el.mermaid.textContent = `(no diagram: ${exc.message})`;
    }
  }

  function graphParts(graph) {
    const nodes = (Array.isArray(graph.nodes) ? graph.nodes : []).map((n) => ({
      id: String(n.id),
      label: String((n.data && typeof n.data === "object" && n.data.name) || n.id),
    }));
    const ids = new Set(nodes.map((n) => n.id));
    const edges = (Array.isArray(graph.edges) ? graph.edges : [])
      .filter((e) => ids.has(String(e.source)) && ids.has(String(e.target)))
      .map((e) => ({
        source: String(e.source),
        target: String(e.target),
        conditional: !!e.conditional,
        label: e.data == null ? "" : String(e.data),
      }));
    return { nodes, edges };
  }

  /** The graph as Mermaid flowchart text (conditional edges dotted). */
  function mermaid(graph) {
    const { nodes, edges } = graphParts(graph);
    const key = new Map(nodes.map((n, i) => [n.id, `n${i}`]));
    const quote = (s) => `"${s.replace(/"/g, "#quot;")}"`;
    const lines = ["flowchart TD"];
    for (const n of nodes) {
      const terminal = n.id === "__start__" || n.id === "__end__";
      lines.push(`  ${key.get(n.id)}${terminal ? `([${quote(n.label)}])` : `[${quote(n.label)}]`}`);
    }
    for (const e of edges) {
      const arrow = e.conditional ? "-.->" : "-->";
      const label = e.label ? `|${quote(e.label)}|` : "";
      lines.push(`  ${key.get(e.source)} ${arrow}${label} ${key.get(e.target)}`);
    }
    return lines.join("\n");
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, text) {
    const made = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) made.setAttribute(name, String(value));
    if (text !== undefined) made.textContent = text;
    return made;
  }

  /** A layered drawing: each node one row below its deepest forward predecessor. */
  function drawGraph(target, graph) {
    const { nodes, edges } = graphParts(graph);
    if (!nodes.length) return;
    const out = new Map(nodes.map((n) => [n.id, []]));
    for (const e of edges) out.get(e.source).push(e);
    // Back edges (found by a depth-first search from __start__) do not push layers down.
    const back = new Set();
    const seen = new Set();
    const onPath = new Set();
    const visit = (id) => {
      seen.add(id); onPath.add(id);
      for (const e of out.get(id)) {
        if (onPath.has(e.target)) back.add(e);
        else if (!seen.has(e.target)) visit(e.target);
      }
      onPath.delete(id);
    };
    const start = nodes.find((n) => n.id === "__start__") || nodes[0];
    visit(start.id);
    for (const n of nodes) if (!seen.has(n.id)) visit(n.id);
    const layer = new Map(nodes.map((n) => [n.id, 0]));
    for (let round = 0; round < nodes.length; round++) {
      let moved = false;
      for (const e of edges) {
        if (back.has(e)) continue;
        if (layer.get(e.target) < layer.get(e.source) + 1) { layer.set(e.target, layer.get(e.source) + 1); moved = true; }
      }
      if (!moved) break;
    }
    const end = nodes.find((n) => n.id === "__end__");
    if (end) layer.set("__end__", Math.max(...layer.values()) + (nodes.length > 1 && [...layer.values()].filter((v) => v === layer.get("__end__")).length > 1 ? 1 : 0));
    const rows = [];
    for (const n of nodes) (rows[layer.get(n.id)] ||= []).push(n);
    const W = 96, H = 24, GAPX = 16, GAPY = 30, PAD = 10;
    const widest = Math.max(...rows.filter(Boolean).map((r) => r.length));
    const SIDE = 36; // room for edges drawn around the rows, left and right
    const width = Math.max(1, widest) * (W + GAPX) - GAPX + 2 * SIDE;
    const pos = new Map();
    rows.forEach((row, r) => {
      if (!row) return;
      const rowWidth = row.length * (W + GAPX) - GAPX;
      row.forEach((n, i) => {
        pos.set(n.id, { x: (width - rowWidth) / 2 + i * (W + GAPX), y: PAD + r * (H + GAPY) });
      });
    });
    const height = PAD * 2 + rows.length * (H + GAPY) - GAPY;
    target.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const defs = svg("defs");
    const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
    marker.appendChild(svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
    defs.appendChild(marker);
    target.appendChild(defs);
    for (const e of edges) {
      const a = pos.get(e.source), b = pos.get(e.target);
      let d;
      if (back.has(e) || layer.get(e.target) <= layer.get(e.source)) {
        // Upwards: around the right side.
        const x = Math.max(a.x, b.x) + W;
        d = `M${a.x + W},${a.y + H / 2} C${x + 30},${a.y + H / 2} ${x + 30},${b.y + H / 2} ${b.x + W},${b.y + H / 2}`;
      } else if (layer.get(e.target) - layer.get(e.source) > 1) {
        // Past the rows between: around the side the source is on, not through their nodes.
        if (a.x + W / 2 > width / 2 + 1) {
          const x = Math.max(a.x, b.x) + W;
          d = `M${a.x + W},${a.y + H / 2} C${x + 30},${a.y + H / 2} ${x + 30},${b.y + H / 2} ${b.x + W},${b.y + H / 2}`;
        } else {
          const x = Math.min(a.x, b.x);
          d = `M${a.x},${a.y + H / 2} C${x - 30},${a.y + H / 2} ${x - 30},${b.y + H / 2} ${b.x},${b.y + H / 2}`;
        }
      } else {
        const x1 = a.x + W / 2, y1 = a.y + H, x2 = b.x + W / 2, y2 = b.y;
        d = `M${x1},${y1} C${x1},${y1 + GAPY / 2} ${x2},${y2 - GAPY / 2} ${x2},${y2}`;
      }
      const path = svg("path", { d, class: `edge${e.conditional ? " conditional" : ""}`, "marker-end": "url(#arrow)" });
      path.appendChild(svg("title", {}, `${e.source} → ${e.target}${e.label ? ` (${e.label})` : ""}`));
      target.appendChild(path);
    }
    for (const n of nodes) {
      const p = pos.get(n.id);
      const terminal = n.id === "__start__" || n.id === "__end__";
      const group = svg("g", { class: `node${terminal ? " terminal" : ""}`, "data-node": n.id });
      group.appendChild(svg("rect", { x: p.x, y: p.y, width: W, height: H, rx: terminal ? 12 : 4 }));
      const shown = n.label.length > 14 ? `${n.label.slice(0, 13)}…` : n.label;
      group.appendChild(svg("text", { x: p.x + W / 2, y: p.y + H / 2 + 4, "text-anchor": "middle" }, shown));
      group.appendChild(svg("title", {}, n.label));
      target.appendChild(group);
    }
  }

  // ---------------------------------------------------------------- start-up

  /** Is a key needed? Asked without one: a 401/403 means auth is on. */
  async function probeAuth() {
    if (state.authProbed) return;
    try {
      await request("POST", "/assistants/search", { limit: 1 }, { noKey: true });
      state.authOn = false;
    } catch (exc) {
      if (exc instanceof ApiFailure && exc.kind === "auth") state.authOn = true;
      else throw exc;
    }
    state.authProbed = true;
    el.auth.hidden = !state.authOn;
  }

  async function boot() {
    el.apiKey.placeholder = state.key ? "a key is saved" : "sk-…";
    el.rememberKey.checked = keyRemembered();
    document.body.dataset.ready = "false";
    setStatus("loading…");
    clearError();
    let joinRunId = null;
    lock(true); // until the thread's state (busy? waiting for an approval?) is known
    try {
      await probeAuth();
      if (state.authOn && !state.key) {
        setStatus("API key needed");
        el.apiKey.focus();
        return;
      }
      await loadAssistants();
      const params = new URLSearchParams(location.search);
      state.threadId = params.get("thread") || (params.get("graph") ? null : stored(STORE.thread)) || null;
      const assistant = currentAssistant();
      if (!params.get("thread") && params.get("graph") && stored(STORE.thread) && assistant && stored(STORE.graph) === assistant.graph_id) {
        state.threadId = stored(STORE.thread);
      }
      await adoptThreadGraph();
      setUrl();
      await Promise.all([loadDiagram(), loadThreads().catch((exc) => showError(exc))]);
      resetConversation();
      if (state.threadId) joinRunId = await refreshThread();
      else setStatus("ready");
      document.body.dataset.ready = "true";
    } catch (exc) {
      showError(exc instanceof ApiFailure ? exc : new ApiFailure("error", String(exc && exc.message ? exc.message : exc)));
      setStatus("error");
    } finally {
      lock(false);
    }
    if (joinRunId) await stream({}, { joinRunId });
  }

  /** A thread opened by its id belongs to a graph: select that graph. */
  async function adoptThreadGraph() {
    if (!state.threadId) return;
    try {
      const thread = await api("GET", `/threads/${enc(state.threadId)}`);
      const graphId = thread && thread.metadata && (thread.metadata.assistant_id || thread.metadata.graph_id);
      const match = graphId && state.assistants.find((a) => a.assistant_id === graphId || a.graph_id === graphId);
      if (match && match.assistant_id !== state.assistantId) {
        state.assistantId = match.assistant_id;
        el.graphSelect.value = state.assistantId;
      }
    } catch (exc) {
      if (exc instanceof ApiFailure && exc.status === 404) {
        state.threadId = null; // gone (deleted, or another server's): start a new one
        return;
      }
      throw exc;
    }
  }

  // ---------------------------------------------------------------- events

  el.keyForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = el.apiKey.value.trim();
    if (!key) return;
    state.key = key;
    storeKey(key, el.rememberKey.checked);
    el.apiKey.value = "";
    el.apiKey.placeholder = "a key is saved";
    boot();
  });

  el.forgetKey.addEventListener("click", () => {
    state.key = "";
    forgetStoredKey();
    el.rememberKey.checked = false;
    el.apiKey.value = "";
    el.apiKey.placeholder = "sk-…";
    boot();
  });

  // Ticked or unticked with a key saved: the key moves to the chosen storage.
  el.rememberKey.addEventListener("change", () => {
    if (state.key) storeKey(state.key, el.rememberKey.checked);
  });

  el.graphSelect.addEventListener("change", async () => {
    if (state.run || state.locked) return;
    state.assistantId = el.graphSelect.value || null;
    state.threadId = null;
    setUrl();
    resetConversation();
    clearError();
    await Promise.all([loadDiagram(), loadThreads().catch((exc) => showError(exc))]);
    setStatus("ready");
  });

  el.threadSelect.addEventListener("change", async () => {
    if (state.run || state.locked) { el.threadSelect.value = state.threadId || ""; return; }
    state.threadId = el.threadSelect.value || null;
    setUrl();
    resetConversation();
    clearError();
    if (state.threadId) await openThread(); else setStatus("ready");
  });

  el.newThread.addEventListener("click", () => {
    if (state.run || state.locked) return;
    state.threadId = null;
    setUrl();
    el.threadSelect.value = "";
    resetConversation();
    clearError();
    setStatus("ready");
    el.input.focus();
  });

  el.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });

  el.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });

  el.stop.addEventListener("click", () => { cancelRun(); });

  for (const button of el.approval.querySelectorAll("button[data-action]")) {
    button.addEventListener("click", () => { answerApproval(button.dataset.action); });
  }

  function newId() {
    if (crypto && typeof crypto.randomUUID === "function") return crypto.randomUUID();
    return `msg-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
  }

  async function send() {
    const text = el.input.value.trim();
    if (!text || state.run || state.locked || !state.assistantId) return;
    if (state.interrupt) {
      showError(new ApiFailure("error", "The run waits for an approval: approve, edit or reject the tool call first."));
      return;
    }
    el.input.value = "";
    await stream({ input: { messages: [{ type: "human", content: text, id: newId() }] } });
  }

  boot();
})();
