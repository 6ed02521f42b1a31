// LangChain's Agent Chat UI (github.com/langchain-ai/agent-chat-ui, main as of December
// 2026) against Switchyard, call for call. The UI is a Next.js app built on the SDK's
// React hook `useStream` (@langchain/langgraph-sdk/react, `useStreamLGP` in 1.15.0),
// which keeps its state in the SDK's framework-agnostic `StreamManager`
// (@langchain/langgraph-sdk/ui). React is not installed here, so `ChatSession` below
// does what the hook does, step by step, with the SDK's own StreamManager,
// MessageTupleManager, branch and interrupt helpers, and the options Agent Chat UI
// passes (src/providers/Stream.tsx: apiUrl, apiKey, assistantId, threadId from the
// URL, fetchStateHistory: true, onCustomEvent, onThreadId; no reconnectOnMount). Every
// request the session's Client makes is recorded and checked.
//
// What the UI sends, in order (headers: `x-api-key` when a key is set; the SDK adds
// `content-type: application/json` to bodies):
//
// First load (src/providers/Stream.tsx, Thread.tsx):
//   1. GET /info with header X-Api-Key (and X-Auth-Scheme only for "Agent Builder"),
//      plain fetch; anything but 2xx shows "Failed to connect to LangGraph server".
//   2. POST /threads/search {metadata: {graph_id: ID}} when NEXT_PUBLIC_ASSISTANT_ID is
//      a graph id, {metadata: {assistant_id: ID}} when it is a UUID; limit 100,
//      offset 0; no sort (the server's order: newest first). The list shows each
//      thread's first message (values.messages[0].content) or its id.
//   There is no assistant lookup: the id goes straight into runs.stream.
// A message on a new thread (components/thread/index.tsx handleSubmit):
//   3. POST /threads {metadata: {}} (useStream creates it: no id, no metadata).
//   4. POST /threads/{id}/runs/stream {assistant_id, input: {messages: [<tool messages
//      answering unanswered tool calls, ids "do-not-render-…">, {id: <uuid>, type:
//      "human", content: [{type: "text", text}]}]}, stream_mode: ["values",
//      "messages-tuple", "custom"] (the UI asks for values; the hook adds
//      messages-tuple because the UI reads `messages`, custom for onCustomEvent),
//      stream_subgraphs: true, stream_resumable: true, on_disconnect: "continue"}.
//      The run id is read from the response's Content-Location.
//   5. GET /threads/{id}/runs/{run_id} (Accept: application/json): the SDK asks whether
//      the run is still going when a resumable stream (one with a Location header)
//      closes without an `end` event; "success" and it stops there.
//   6. POST /threads/{id}/history {limit: 10} when the run ends (fetchStateHistory).
//   7. About 4 s after the thread id is known: the thread list again (2.).
// Reload with ?threadId= in the URL:
//   8. POST /threads/{id}/history {limit: 10}; the messages are the head's values, an
//      interrupt comes from the head's tasks. No join: the UI does not set
//      reconnectOnMount. (An app that does stores the run id in sessionStorage and
//      joins: GET /threads/{id}/runs/{run_id}/stream?cancel_on_disconnect=0&
//      checkpoint_id=<head> with Last-Event-ID: -1, then history as in 6.)
// Regenerate (messages/ai.tsx) and edit (messages/human.tsx):
//   9. runs/stream as in 4. with `checkpoint` = the parent_checkpoint of the first
//      history state that holds the message (its thread_id removed): no input to
//      regenerate an answer, input {messages: [{type: "human", content: "<text>"}]} to
//      edit a question. The branch switcher is computed from the history's
//      checkpoint / parent_checkpoint links (limit 10).
// An interrupt (agent-inbox/*, lib/agent-inbox-interrupt.ts):
//  10. Shown when the interrupt value has action_requests [{name, args}] and
//      review_configs [{action_name, allowed_decisions}] (LangChain 1.0's HITLRequest;
//      the agent sends them, graphs/agent/approvals.py); any other value is shown as a
//      table. Answered with runs/stream {input: {}, command: {resume: {decisions:
//      [{type: "approve"} | {type: "edit", edited_action: {name, args}} | {type:
//      "reject", message}]}}, stream_mode: ["messages-tuple", "values", "custom"],
//      stream_resumable: false, on_disconnect: "cancel"} (no subgraphs), then history.
//      "Mark as Resolved" sends command {goto: "__end__"} the same way (Switchyard
//      drops the pending call; LangGraph alone would ignore the goto and ask again).
// Stop (the Cancel button, stream.stop()):
//  11. The fetch is aborted; with on_disconnect "continue" the run goes on server-side
//      (the hook only calls POST /threads/{id}/runs/{run_id}/cancel?wait=0&action=
//      interrupt when reconnectOnMount stored the run id); then history {limit: 10}.
// In production the UI goes through a Next.js proxy (src/app/api/[..._path]/route.ts,
// langgraph-nextjs-api-passthrough 0.1.4): it forwards only x-* and authorization
// headers, replaces x-api-key with the server-side LANGSMITH_API_KEY and forwards the
// body as text (labelled text/plain); the proxy of the last test does the same.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import { after, before, describe, test } from "node:test";

import { Client } from "@langchain/langgraph-sdk";
import {
  MessageTupleManager,
  StreamManager,
  findLast,
  getBranchContext,
  unique,
  userFacingInterruptsFromThreadTasks,
  userFacingInterruptsFromValuesArray,
} from "@langchain/langgraph-sdk/ui";

import { API_URL, HELLO, KEY, probeRuns, text } from "./helpers.mjs";

const HISTORY = { limit: 10 }; // fetchStateHistory: true is a history of 10 states

// ---- Agent Chat UI's own helpers (what its components compute) ------------------------

/** components/thread/utils.ts getContentString: the text of a message's content. */
function contentString(content) {
  if (typeof content === "string") return content;
  return content.filter((block) => block.type === "text").map((block) => block.text).join(" ");
}

/** The human message handleSubmit builds from the text box. */
function humanMessage(words) {
  return { id: randomUUID(), type: "human", content: [{ type: "text", text: words }] };
}

/** lib/ensure-tool-responses.ts: a tool message for each tool call no tool message answers. */
function toolResponses(messages) {
  const added = [];
  messages.forEach((message, index) => {
    if (message.type !== "ai" || !message.tool_calls?.length) return;
    if (messages[index + 1]?.type === "tool") return;
    for (const call of message.tool_calls) {
      added.push({ type: "tool", tool_call_id: call.id ?? "", id: `do-not-render-${randomUUID()}`, name: call.name, content: "Successfully handled tool call." });
    }
  });
  return added;
}

/** lib/agent-inbox-interrupt.ts: the interrupt the approval panel renders (else a table). */
function hitlRequest(interrupt) {
  const first = Array.isArray(interrupt) ? interrupt[0] : interrupt;
  const value = first?.value;
  if (!value || typeof value !== "object") return null;
  const { action_requests: requests, review_configs: configs } = value;
  if (!Array.isArray(requests) || requests.length === 0 || !Array.isArray(configs) || configs.length === 0) return null;
  const requestsOk = requests.every((r) => r && typeof r.name === "string" && r.args !== null && typeof r.args === "object");
  const configsOk = configs.every((c) => c && typeof c.action_name === "string" && Array.isArray(c.allowed_decisions));
  return requestsOk && configsOk ? value : null;
}

/** What handleSubmit passes to submit() (components/thread/index.tsx). */
const SEND = { streamMode: ["values"], streamSubgraphs: true, streamResumable: true };

/** The thread list (providers/Thread.tsx getThreads): its own Client, no retries here. */
function threadList(assistantId, { apiUrl = API_URL, apiKey = KEY } = {}) {
  const isUuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(assistantId);
  const sdk = new Client({ apiUrl, apiKey, callerOptions: { maxRetries: 0 } });
  return sdk.threads.search({ metadata: isUuid ? { assistant_id: assistantId } : { graph_id: assistantId }, limit: 100 });
}

// ---- useStream without React ------------------------------------------------------------

/**
 * One browser tab of Agent Chat UI: what `useStreamLGP` (react/stream.lgp.js of the
 * pinned SDK) does with the UI's options, on the SDK's StreamManager. Differences from
 * the hook, none on the wire: no retries (a 5xx must fail the test), a recording fetch,
 * and stream errors are thrown by `submit` instead of shown in a toast.
 */
class ChatSession {
  constructor({ assistantId, threadId = null, apiUrl = API_URL, apiKey = KEY, runStorage = null }) {
    this.assistantId = assistantId;
    this.threadId = threadId;
    this.calls = [];
    const recording = (url, init = {}) => {
      const { pathname, searchParams } = new URL(url);
      this.calls.push({
        method: init.method ?? "GET",
        path: pathname,
        query: Object.fromEntries(searchParams),
        headers: { ...init.headers },
        body: typeof init.body === "string" ? JSON.parse(init.body) : undefined,
      });
      return fetch(url, init);
    };
    this.client = new Client({ apiUrl, apiKey, callerOptions: { maxRetries: 0, fetch: recording } });
    this.messageManager = new MessageTupleManager();
    this.stream = new StreamManager(this.messageManager, { throttle: false });
    this.tracked = []; // the modes the UI's reads add (`messages`: messages-tuple and values)
    this.callbackModes = ["custom"]; // Agent Chat UI passes onCustomEvent
    this.custom = [];
    this.waiters = new Set();
    this.history = undefined;
    this.branch = "";
    this.runStorage = runStorage; // reconnectOnMount's sessionStorage (Agent Chat UI: none)
    this.created = [];
    this.cancels = [];
  }

  /** Mounting with ?threadId=: the history, and a join when a run id is stored. */
  async open() {
    if (this.threadId == null) return;
    this.history = await this.client.threads.getHistory(this.threadId, HISTORY);
    const runId = this.runStorage?.get(`lg:stream:${this.threadId}`);
    if (runId) await this.joinStream(runId, undefined, { checkpointId: this.branchContext.threadHead?.checkpoint?.checkpoint_id });
  }

  get branchContext() {
    return getBranchContext(this.branch, this.history ?? undefined);
  }

  get historyValues() {
    return this.branchContext.threadHead?.values ?? {};
  }

  get values() {
    return this.stream.values ?? this.historyValues;
  }

  /** `stream.messages`, which the UI reads on every render. */
  get messages() {
    this.track("messages-tuple", "values");
    return Array.isArray(this.values.messages) ? this.values.messages : [];
  }

  track(...modes) {
    for (const mode of modes) if (!this.tracked.includes(mode)) this.tracked.push(mode);
  }

  get interrupts() {
    const { values } = this;
    if (values != null && "__interrupt__" in values && Array.isArray(values.__interrupt__)) {
      return userFacingInterruptsFromValuesArray(values.__interrupt__);
    }
    if (this.stream.isLoading) return [];
    const head = this.branchContext.threadHead;
    const fromTasks = userFacingInterruptsFromThreadTasks((head?.tasks ?? []).flatMap((t) => t.interrupts ?? []));
    if (fromTasks != null) return fromTasks;
    if (!(head?.next ?? []).length || this.stream.error != null) return [];
    return [{ when: "breakpoint" }];
  }

  get interrupt() {
    const all = this.interrupts;
    return all.length === 0 ? undefined : all.length === 1 ? all[0] : all;
  }

  /** getMessagesMetadata: the oldest history state holding the message, and its branch. */
  metadataOf(message) {
    const firstSeenState = findLast(this.history ?? [], (state) =>
      state.values != null && (state.values.messages ?? []).map((m, i) => m.id ?? i).includes(message.id));
    const checkpointId = firstSeenState?.checkpoint?.checkpoint_id;
    let branch = checkpointId != null ? this.branchContext.branchByCheckpoint[checkpointId] : undefined;
    if (!branch?.branch?.length) branch = undefined;
    return { firstSeenState, branch: branch?.branch, branchOptions: branch?.branchOptions };
  }

  #managerOptions(onSuccess, extra = {}) {
    const key = "messages";
    return {
      getMessages: (value) => (Array.isArray(value[key]) ? value[key] : []),
      setMessages: (current, messages) => ({ ...current, [key]: messages }),
      initialValues: this.historyValues,
      callbacks: {
        onCustomEvent: (event) => {
          this.custom.push(event);
          for (const waiter of [...this.waiters]) waiter();
        },
      },
      onSuccess,
      onError: () => {},
      onFinish: () => {},
      ...extra,
    };
  }

  /** After a run: the history again (fetchStateHistory), which then replaces the streamed values. */
  async #finishRun(threadId) {
    this.history = await this.client.threads.getHistory(threadId, HISTORY);
    return this.history.at(0) ? null : undefined;
  }

  #raise() {
    if (this.stream.error != null) throw this.stream.error;
  }

  /** `stream.submit(values, options)`. */
  async submit(values, options = {}) {
    const historyValues = this.historyValues;
    let threadId = this.threadId;
    let rejoinKey;
    await this.stream.start(async (signal) => {
      this.stream.setStreamValues((current) => {
        const prev = { ...historyValues, ...current };
        const optimistic = typeof options.optimisticValues === "function" ? options.optimisticValues(prev) : options.optimisticValues;
        return { ...prev, ...optimistic };
      });
      if (!threadId) {
        threadId = (await this.client.threads.create({ threadId: options.threadId, metadata: options.metadata, signal })).thread_id;
        this.threadId = threadId;
      }
      const streamMode = unique([...(options.streamMode ?? []), ...this.tracked, ...this.callbackModes]);
      const head = this.branchContext.threadHead;
      const viewingLatest = head?.checkpoint?.checkpoint_id === this.history?.[0]?.checkpoint?.checkpoint_id;
      let checkpoint = options.checkpoint ?? (!viewingLatest ? head?.checkpoint : undefined) ?? undefined;
      if (options.checkpoint === null) checkpoint = undefined;
      if (checkpoint != null) {
        checkpoint = { ...checkpoint };
        delete checkpoint.thread_id;
      }
      const streamResumable = options.streamResumable ?? !!this.runStorage;
      return this.client.runs.stream(threadId, this.assistantId, {
        input: values,
        config: options.config,
        context: options.context,
        command: options.command,
        interruptBefore: options.interruptBefore,
        interruptAfter: options.interruptAfter,
        metadata: options.metadata,
        multitaskStrategy: options.multitaskStrategy,
        strictResume: options.strictResume,
        onCompletion: options.onCompletion,
        onDisconnect: options.onDisconnect ?? (streamResumable ? "continue" : "cancel"),
        signal,
        checkpoint,
        streamMode,
        streamSubgraphs: options.streamSubgraphs,
        streamResumable,
        durability: options.durability,
        onRunCreated: (params) => {
          const meta = { run_id: params.run_id, thread_id: params.thread_id ?? threadId };
          this.created.push(meta);
          if (this.runStorage) {
            rejoinKey = `lg:stream:${threadId}`;
            this.runStorage.set(rejoinKey, meta.run_id);
          }
        },
      });
    }, this.#managerOptions(async () => {
      if (rejoinKey) this.runStorage?.delete(rejoinKey);
      return this.#finishRun(threadId);
    }));
    this.#raise();
  }

  /** `stream.joinStream(runId, lastEventId, options)` (reconnectOnMount). */
  async joinStream(runId, lastEventId, joinOptions) {
    lastEventId ??= "-1";
    const threadId = this.threadId;
    await this.stream.start(
      async (signal) => this.client.runs.joinStream(threadId, runId, {
        signal, lastEventId, streamMode: joinOptions?.streamMode, checkpointId: joinOptions?.checkpointId,
      }),
      this.#managerOptions(async () => {
        this.runStorage?.delete(`lg:stream:${threadId}`);
        return this.#finishRun(threadId);
      }, { isReplaying: lastEventId === "-1" }),
    );
    this.#raise();
  }

  /** `stream.stop()`: abort; cancel only a run reconnectOnMount stored; read the history. */
  async stop() {
    const threadId = this.threadId;
    await this.stream.stop(this.historyValues, {
      onStop: () => {
        const runId = this.runStorage?.get(`lg:stream:${threadId}`);
        if (runId) this.cancels.push(this.client.runs.cancel(threadId, runId));
        this.runStorage?.delete(`lg:stream:${threadId}`);
      },
      read: async () => {
        this.history = await this.client.threads.getHistory(threadId, HISTORY);
        return this.history.at(0)?.values ?? null;
      },
    });
    await Promise.all(this.cancels);
  }

  /** The requests since `from`, as "METHOD /path" with the ids as {thread} and {run}. */
  route(from = 0) {
    const runs = new Set(this.created.map((c) => c.run_id));
    return this.calls.slice(from).map((c) => {
      const path = c.path.replace(this.threadId ?? "\0", "{thread}").split("/").map((part) => (runs.has(part) ? "{run}" : part));
      return `${c.method} ${path.join("/")}`;
    });
  }
}

/** The text of the last AI message each time the session's state changed. */
function watchAnswer(session) {
  const seen = [];
  session.stream.subscribe(() => {
    const ai = session.messages.filter((m) => m.type === "ai").at(-1);
    const shown = ai ? text(ai) : "";
    if (shown !== seen.at(-1)) seen.push(shown);
  });
  return seen;
}

/** Resolves when the session has seen `count` custom events. */
function customEvents(session, count) {
  return new Promise((resolve) => {
    const check = () => {
      if (session.custom.length >= count) {
        session.waiters.delete(check);
        resolve();
      }
    };
    session.waiters.add(check);
    check();
  });
}

async function runStatus(sdk, threadId, runId) {
  await sdk.runs.join(threadId, runId); // waits for the end
  return (await sdk.runs.get(threadId, runId)).status;
}

const sdk = new Client({ apiUrl: API_URL, apiKey: KEY, callerOptions: { maxRetries: 0 } });

// ---- the tests -------------------------------------------------------------------------

describe("Agent Chat UI: first load", () => {
  test("GET /info answers with the key and refuses without one", async () => {
    const ok = await fetch(`${API_URL}/info`, { headers: { "X-Api-Key": KEY } });
    assert.equal(ok.status, 200);
    assert.equal(typeof (await ok.json()).version, "string");
    const without = await fetch(`${API_URL}/info`);
    assert.equal(without.status, 401, "auth is on: the UI's toast asks for the key");
  });

  test("the thread list by graph id and by assistant UUID, newest first", async () => {
    const listed = await threadList("chat");
    assert.ok(Array.isArray(listed));
    const { assistant_id: uuid } = await sdk.assistants.get("chat");
    const byUuid = new ChatSession({ assistantId: uuid });
    await byUuid.submit({ messages: [humanMessage("by uuid")] }, SEND);
    const [newest] = await threadList(uuid);
    assert.equal(newest.thread_id, byUuid.threadId, "the thread just used comes first");
    assert.equal(contentString(newest.values.messages[0].content), "by uuid");
    assert.ok((await threadList("chat")).some((t) => t.thread_id === byUuid.threadId), "the same thread by graph id");
  });
});

describe("Agent Chat UI: a conversation", () => {
  test("a new thread: create, stream values + messages-tuple resumable, history; the list shows it", async () => {
    const session = new ChatSession({ assistantId: "chat" });
    assert.deepEqual(session.messages, []); // the first render reads `messages`
    const answers = watchAnswer(session);
    const question = humanMessage("Hello there");
    await session.submit({ messages: [...toolResponses(session.messages), question] }, {
      ...SEND,
      optimisticValues: (prev) => ({ ...prev, messages: [...(prev.messages ?? []), question] }),
    });

    // A resumable stream that ends without an `end` event: the SDK asks whether the
    // run is still going (GET the run) before it gives up reconnecting.
    assert.deepEqual(session.route(), [
      "POST /threads", "POST /threads/{thread}/runs/stream", "GET /threads/{thread}/runs/{run}", "POST /threads/{thread}/history",
    ]);
    const [create, run, status, history] = session.calls;
    assert.equal(status.headers.accept ?? status.headers.Accept, "application/json");
    assert.deepEqual(create.body, { metadata: {} });
    assert.equal(create.headers["x-api-key"], KEY);
    assert.deepEqual(run.body, {
      input: { messages: [question] },
      stream_mode: ["values", "messages-tuple", "custom"],
      stream_subgraphs: true,
      stream_resumable: true,
      assistant_id: "chat",
      on_disconnect: "continue",
    });
    assert.deepEqual(history.body, { limit: 10 });
    assert.equal(session.created.length, 1, "the run id came in Content-Location");
    assert.equal(session.created[0].thread_id, session.threadId);

    // The answer grew token by token in the UI's state, then came from the history.
    assert.equal(answers.at(-1), HELLO);
    assert.ok(answers.filter((a) => a && a !== HELLO).length >= 2, `intermediate states: ${JSON.stringify(answers)}`);
    const { messages } = session;
    assert.deepEqual(messages.map((m) => m.type), ["human", "ai"]);
    assert.equal(messages[0].id, question.id, "the UI's message id is kept");
    assert.equal(contentString(messages[0].content), "Hello there");
    assert.equal(session.stream.values, null, "after the run the values are the history's head");
    assert.equal(session.interrupt, undefined);
    const meta = session.metadataOf(messages[1]);
    assert.ok(meta.firstSeenState?.parent_checkpoint?.checkpoint_id, "regenerate has a parent checkpoint");

    // The run is kept for a reconnect (resumable) and ended well.
    assert.equal(await runStatus(sdk, session.threadId, session.created[0].run_id), "success");
    const [listed] = (await threadList("chat")).filter((t) => t.thread_id === session.threadId);
    assert.ok(listed, "the thread is listed under its graph id (the run set it)");
    assert.equal(listed.metadata.graph_id, "chat");
    assert.equal(contentString(listed.values.messages[0].content), "Hello there");
  });

  test("reload with ?threadId=: history only, then the next message continues the thread", async () => {
    const first = new ChatSession({ assistantId: "chat" });
    await first.submit({ messages: [humanMessage("One")] }, SEND);

    const reloaded = new ChatSession({ assistantId: "chat", threadId: first.threadId });
    await reloaded.open();
    assert.deepEqual(reloaded.route(), ["POST /threads/{thread}/history"]);
    assert.deepEqual(reloaded.calls[0].body, { limit: 10 });
    assert.deepEqual(reloaded.messages, first.messages);
    assert.equal(reloaded.interrupt, undefined);

    const mark = reloaded.calls.length;
    await reloaded.submit({ messages: [...toolResponses(reloaded.messages), humanMessage("Two")] }, SEND);
    assert.deepEqual(reloaded.route(mark), ["POST /threads/{thread}/runs/stream", "GET /threads/{thread}/runs/{run}", "POST /threads/{thread}/history"]);
    assert.equal(reloaded.calls[mark].body.checkpoint, undefined, "the latest state: no checkpoint sent");
    assert.deepEqual(reloaded.messages.map((m) => [m.type, text(m)]), [["human", "One"], ["ai", HELLO], ["human", "Two"], ["ai", HELLO]]);
    const state = await sdk.threads.getState(first.threadId);
    assert.equal(state.values.messages.length, 4);
  });

  test("regenerate and edit fork at the checkpoint the history names; the branch switcher sees both", async () => {
    const session = new ChatSession({ assistantId: "chat" });
    await session.submit({ messages: [humanMessage("Question")] }, SEND);
    const [question, answer] = session.messages;

    // Regenerate (messages/ai.tsx): no input, the answer's parent checkpoint.
    const parent = session.metadataOf(answer).firstSeenState.parent_checkpoint;
    let mark = session.calls.length;
    await session.submit(undefined, { checkpoint: parent, ...SEND });
    const regenerated = session.calls[mark];
    assert.equal("input" in regenerated.body, false);
    assert.deepEqual(regenerated.body.checkpoint, { checkpoint_ns: parent.checkpoint_ns, checkpoint_id: parent.checkpoint_id, checkpoint_map: parent.checkpoint_map });
    let shown = session.messages;
    assert.deepEqual(shown.map((m) => m.type), ["human", "ai"], "the answer replaced, not appended");
    assert.equal(shown[0].id, question.id);
    assert.notEqual(shown[1].id, answer.id, "a new answer");
    const answerBranch = session.metadataOf(shown[1]);
    assert.equal(answerBranch.branchOptions?.length, 2, "two answers to switch between");
    const other = answerBranch.branchOptions.find((b) => b !== answerBranch.branch);
    session.branch = other; // the branch switcher's "previous"
    assert.equal(session.messages[1].id, answer.id, "the first answer again");
    session.branch = answerBranch.branch;

    // Edit (messages/human.tsx): the new question from the question's parent checkpoint.
    const questionParent = session.metadataOf(session.messages[0]).firstSeenState.parent_checkpoint;
    assert.ok(questionParent?.checkpoint_id, "the question has a parent checkpoint");
    mark = session.calls.length;
    const edited = { type: "human", content: "Edited question" };
    await session.submit({ messages: [edited] }, { checkpoint: questionParent, ...SEND });
    assert.deepEqual(session.calls[mark].body.input, { messages: [edited] });
    assert.equal(session.calls[mark].body.checkpoint.checkpoint_id, questionParent.checkpoint_id);
    shown = session.messages;
    assert.deepEqual(shown.map((m) => [m.type, text(m)]), [["human", "Edited question"], ["ai", HELLO]]);
    assert.equal(session.metadataOf(shown[0]).branchOptions?.length, 2, "two questions to switch between");
    const state = await sdk.threads.getState(session.threadId);
    assert.deepEqual(state.values.messages.map((m) => text(m)), ["Edited question", HELLO], "the thread's head is the edit");
  });
});

describe("Agent Chat UI: approvals", () => {
  // The question as the UI types it (text blocks); the scripted backend reads the
  // script from its text, and the agent's call to "probe" needs approval
  // (tests/serving/test_js_sdk.py).
  const ASK = () => ({ id: randomUUID(), type: "human", content: [{ type: "text", text: "SCRIPT:probe" }] });

  /** A session whose agent run waits for the approval of probe({"note": "hello"}). */
  async function paused() {
    const session = new ChatSession({ assistantId: "agent" });
    assert.deepEqual(session.messages, []);
    const streamed = [];
    session.stream.subscribe(() => {
      if (session.stream.values?.__interrupt__) streamed.push(session.stream.values.__interrupt__);
    });
    await session.submit({ messages: [ASK()] }, SEND);
    assert.ok(streamed.length > 0, "the interrupt came in the streamed values");
    const request = hitlRequest(session.interrupt);
    assert.ok(request, `the approval panel is shown for ${JSON.stringify(session.interrupt)}`);
    return { session, request };
  }

  test("the interrupt is the HITL request the panel renders, also after a reload", async () => {
    const { session, request } = await paused();
    assert.equal(request.action_requests.length, 1);
    assert.equal(request.action_requests[0].name, "probe");
    assert.deepEqual(request.action_requests[0].args, { note: "hello" });
    assert.equal(typeof request.action_requests[0].description, "string");
    assert.deepEqual(request.review_configs.map((c) => [c.action_name, c.allowed_decisions]), [["probe", ["approve", "edit", "reject"]]]);
    const last = session.messages.at(-1);
    assert.equal(last.type, "ai", "the panel sits under the AI message with the call");
    assert.deepEqual(last.tool_calls.map((c) => [c.name, c.args]), [["probe", { note: "hello" }]]);

    const reloaded = new ChatSession({ assistantId: "agent", threadId: session.threadId });
    await reloaded.open();
    assert.deepEqual(hitlRequest(reloaded.interrupt), request, "the same request from the history's tasks");
    const [listed] = (await threadList("agent")).filter((t) => t.thread_id === session.threadId);
    assert.equal(listed.status, "interrupted");
  });

  for (const [name, decision, check] of [
    ["approve", () => ({ type: "approve" }), (ran, tool) => {
      assert.equal(ran("probe hello"), 1, "the call ran once");
      assert.match(text(tool), /probe saw 'hello'/);
    }],
    ["edit", () => ({ type: "edit", edited_action: { name: "probe", args: { note: "edited" } } }), (ran, tool) => {
      assert.equal(ran("probe edited"), 1, "the edited call ran once");
      assert.equal(ran("probe hello"), 0);
      assert.match(text(tool), /probe saw 'edited'/);
    }],
    ["reject", () => ({ type: "reject", message: "Not today." }), (ran, tool) => {
      assert.equal(ran("probe hello"), 0, "nothing ran");
      assert.match(text(tool), /Not today\./);
    }],
  ]) {
    test(`${name}: the decision resumes the run as the panel sends it`, async () => {
      const before = { "probe hello": probeRuns("probe hello"), "probe edited": probeRuns("probe edited") };
      const { session } = await paused();
      const mark = session.calls.length;
      await session.submit({}, { command: { resume: { decisions: [decision()] } } });
      assert.deepEqual(session.route(mark), ["POST /threads/{thread}/runs/stream", "POST /threads/{thread}/history"]);
      assert.deepEqual(session.calls[mark].body, {
        input: {},
        command: { resume: { decisions: [decision()] } },
        stream_mode: ["messages-tuple", "values", "custom"],
        stream_resumable: false,
        assistant_id: "agent",
        on_disconnect: "cancel",
      });
      check((line) => probeRuns(line) - before[line], session.messages.filter((m) => m.type === "tool").at(-1));
      assert.equal(session.interrupt, undefined, "the panel is gone");
      assert.equal(text(session.messages.at(-1)), HELLO, "the agent answered after the decision");
      assert.equal((await sdk.threads.get(session.threadId)).status, "idle");
    });
  }

  test("Mark as Resolved: goto __end__ ends the pending call, nothing runs", async () => {
    const before = probeRuns("probe hello");
    const { session } = await paused();
    const mark = session.calls.length;
    await session.submit({}, { command: { goto: "__end__" } }); // END of @langchain/langgraph/web
    assert.deepEqual(session.calls[mark].body.command, { goto: "__end__" });
    assert.equal(session.interrupt, undefined, "the panel is gone");
    assert.equal(probeRuns("probe hello"), before, "the call never ran");
    assert.equal((await sdk.threads.get(session.threadId)).status, "idle");
    const state = await sdk.threads.getState(session.threadId);
    assert.deepEqual(state.next, []);
    // The call is answered as refused (so no backend meets an unanswered tool call).
    const answered = state.values.messages.at(-1);
    assert.equal(answered.type, "tool");
    assert.equal(answered.artifact?.decision, "refused", JSON.stringify(answered));
    assert.deepEqual(toolResponses(session.messages), [], "no open call left for the UI to answer");
    // The next message goes on from there, and the agent answers.
    await session.submit({ messages: [...toolResponses(session.messages), humanMessage("Thanks")] }, SEND);
    assert.equal(text(session.messages.at(-1)), HELLO);
  });

  test("another graph's interrupt, from a subgraph: shown (as a table), not as an approval", async () => {
    const session = new ChatSession({ assistantId: "nested" });
    assert.deepEqual(session.messages, []);
    await session.submit({ messages: [humanMessage("Draft")] }, SEND);
    const { interrupt } = session;
    assert.deepEqual(interrupt?.value, { question: "Keep this draft?", draft: HELLO }, JSON.stringify(interrupt));
    assert.equal(hitlRequest(interrupt), null, "the generic view: no approval panel");
  });

  test("a new message instead of a decision: the UI answers the open call itself", async () => {
    const before = probeRuns("probe hello");
    const { session } = await paused();
    const answered = toolResponses(session.messages);
    assert.equal(answered.length, 1, "one synthetic tool message for the open call");
    await session.submit({ messages: [...answered, humanMessage("Never mind")] }, SEND);
    assert.equal(probeRuns("probe hello"), before, "the call never ran");
    assert.equal(text(session.messages.at(-1)), HELLO);
    assert.equal(session.interrupt, undefined);
  });
});

describe("Agent Chat UI: stop and reconnect", () => {
  const TICKS = 40;
  // The ticker graph answers first, then keeps the run going with TICKS custom events.
  const LONG = () => ({ messages: [humanMessage("Count")], ticks: TICKS, answer_first: true });

  test("Cancel aborts the stream; the resumable run goes on and the history is read", async () => {
    const session = new ChatSession({ assistantId: "ticker" });
    assert.deepEqual(session.messages, []);
    const submitted = session.submit(LONG(), SEND);
    await customEvents(session, 3);
    // The UI lists the threads again 4 s after it created one, often mid-run.
    const [listed] = (await threadList("ticker")).filter((t) => t.thread_id === session.threadId);
    assert.equal(listed?.status, "busy", "a new thread is listed under its graph while its first run goes on");
    const mark = session.calls.length;
    await session.stop();
    await submitted;
    assert.deepEqual(session.route(mark), ["POST /threads/{thread}/history"], "no cancel: the UI stores no run id");
    assert.equal(session.stream.isLoading, false);
    const [{ run_id: runId }] = session.created;
    assert.equal(await runStatus(sdk, session.threadId, runId), "success", "on_disconnect continue: the run finished");
  });

  test("with reconnectOnMount: a reload joins the stored run from the start; stop cancels it", async () => {
    const storage = new Map();
    const tab = new ChatSession({ assistantId: "ticker", runStorage: storage });
    assert.deepEqual(tab.messages, []);
    const submitted = tab.submit(LONG(), SEND);
    await customEvents(tab, 3);
    const runId = storage.get(`lg:stream:${tab.threadId}`);
    assert.equal(runId, tab.created[0].run_id, "the run id is stored while it streams");
    tab.stream.clear(); // the tab goes away mid-run
    await submitted;

    const reloaded = new ChatSession({ assistantId: "ticker", threadId: tab.threadId, runStorage: storage });
    assert.deepEqual(reloaded.messages, []);
    await reloaded.open();
    assert.deepEqual(reloaded.route(), ["POST /threads/{thread}/history", `GET /threads/{thread}/runs/${runId}/stream`, "POST /threads/{thread}/history"]);
    assert.equal(reloaded.created.length, 0);
    const join = reloaded.calls[1];
    assert.equal(join.headers["Last-Event-ID"] ?? join.headers["last-event-id"], "-1");
    assert.equal(join.query.cancel_on_disconnect, "0");
    assert.ok(join.query.checkpoint_id, "the head's checkpoint id is sent along");
    assert.deepEqual(reloaded.custom.map((e) => e.tick), Array.from({ length: TICKS }, (_, i) => i), "every event from the start");
    assert.equal(text(reloaded.messages.at(-1)), HELLO);
    assert.equal(storage.size, 0, "the run id is forgotten when the run ends");

    // stop() with a stored run id cancels the run on the server.
    const next = reloaded.submit({ messages: [humanMessage("Again")], ticks: 1000, answer_first: true }, SEND);
    await customEvents(reloaded, TICKS + 3);
    const second = reloaded.created.at(-1).run_id;
    await reloaded.stop();
    await next;
    const cancel = reloaded.calls.find((c) => c.path.endsWith("/cancel"));
    assert.ok(cancel, `a cancel request: ${reloaded.route()}`);
    assert.equal(cancel.path, `/threads/${reloaded.threadId}/runs/${second}/cancel`);
    assert.deepEqual(cancel.query, { wait: "0", action: "interrupt" });
    assert.notEqual(await runStatus(sdk, reloaded.threadId, second), "success", "the run was cancelled");
    assert.notEqual((await sdk.threads.get(reloaded.threadId)).status, "busy");
  });
});

describe("Agent Chat UI in production: through its Next.js proxy", () => {
  let proxy;
  let proxyUrl;

  // What langgraph-nextjs-api-passthrough 0.1.4 does for /api/*: the path after /api
  // to LANGGRAPH_API_URL, only x-* and authorization headers, x-api-key set to the
  // server-side key, the body as text (fetch labels it text/plain), the answer's
  // headers copied and CORS headers added.
  before(async () => {
    proxy = createServer(async (req, res) => {
      const chunks = [];
      for await (const chunk of req) chunks.push(chunk);
      const headers = {};
      for (const [name, value] of Object.entries(req.headers)) {
        if (name.startsWith("x-") || name === "authorization") headers[name] = value;
      }
      headers["x-api-key"] = KEY; // LANGSMITH_API_KEY on the Next.js server
      const init = { method: req.method, headers };
      if (["POST", "PUT", "PATCH"].includes(req.method)) init.body = Buffer.concat(chunks).toString("utf8");
      const answer = await fetch(API_URL + req.url.replace(/^\/api/, ""), init);
      const copied = {};
      answer.headers.forEach((value, name) => {
        if (!["content-encoding", "content-length", "transfer-encoding", "connection"].includes(name)) copied[name] = value;
      });
      res.writeHead(answer.status, { ...copied, "access-control-allow-origin": "*", "access-control-expose-headers": "content-location" });
      if (answer.body) for await (const chunk of answer.body) res.write(chunk);
      res.end();
    });
    await new Promise((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    proxyUrl = `http://127.0.0.1:${proxy.address().port}/api`;
  });
  after(() => new Promise((resolve) => proxy.close(resolve)));

  test("the proxy's text/plain bodies work: list, new thread, stream, history, reload", async () => {
    const browser = { apiUrl: proxyUrl, apiKey: undefined }; // the browser holds no key
    const session = new ChatSession({ assistantId: "chat", ...browser });
    await session.submit({ messages: [humanMessage("Through the proxy")] }, SEND);
    assert.deepEqual(session.messages.map((m) => [m.type, text(m)]), [["human", "Through the proxy"], ["ai", HELLO]]);
    assert.equal(session.created.length, 1, "Content-Location passes the proxy");
    const listed = await threadList("chat", browser);
    assert.ok(listed.some((t) => t.thread_id === session.threadId));
    const reloaded = new ChatSession({ assistantId: "chat", threadId: session.threadId, ...browser });
    await reloaded.open();
    assert.deepEqual(reloaded.messages, session.messages);
  });
});
