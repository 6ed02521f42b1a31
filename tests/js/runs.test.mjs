// client.runs: stream in every stream mode, background runs on a thread and
// stateless, batches, wait, list, get, cancel, join, joinStream and delete.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { HELLO, HI, OTHER_KEY, client, collect, events, raw, refused, tag, text } from "./helpers.mjs";

const sdk = client();
const other = client(OTHER_KEY);

/** A fresh thread's id. */
async function thread() {
  return (await sdk.threads.create()).thread_id;
}

/** Streams a run on a fresh thread; returns its parts and the run id the server named. */
async function streamed(assistantId, payload) {
  const threadId = await thread();
  let created;
  const parts = await collect(
    sdk.runs.stream(threadId, assistantId, { ...payload, onRunCreated: (meta) => { created = meta; } }),
  );
  assert.equal(parts[0].event, "metadata", `the first event is metadata: ${events(parts)}`);
  assert.ok(created?.run_id, "onRunCreated got the run id from Content-Location");
  assert.equal(parts[0].data.run_id, created.run_id);
  assert.equal(created.thread_id, threadId);
  assert.deepEqual(parts.map((p) => p.id), parts.map((_, i) => String(i)), "event ids 0, 1, 2, ...");
  assert.ok(!events(parts).includes("error"), `no error event: ${JSON.stringify(parts.filter((p) => p.event === "error"))}`);
  return { threadId, runId: created.run_id, parts, of: (name) => parts.filter((p) => p.event === name).map((p) => p.data) };
}

const TICKER = { messages: [{ role: "user", content: "Hi" }], ticks: 3 };

describe("runs.stream: every stream mode", () => {
  test("values", async () => {
    const { of } = await streamed("chat", { input: HI, streamMode: "values" });
    const values = of("values");
    assert.deepEqual(values.at(0).messages.map((m) => m.type), ["human"]);
    assert.deepEqual(values.at(-1).messages.map((m) => m.type), ["human", "ai"]);
    assert.equal(text(values.at(-1).messages[1]), HELLO);
  });

  test("updates", async () => {
    const { of } = await streamed("chat", { input: HI, streamMode: "updates" });
    const [update] = of("updates");
    assert.deepEqual(Object.keys(update), ["call_model"]);
    assert.equal(text(update.call_model.messages[0]), HELLO);
  });

  test("messages-tuple", async () => {
    const { of, parts } = await streamed("chat", { input: HI, streamMode: "messages-tuple" });
    const tuples = of("messages");
    assert.ok(tuples.length >= 4, `token by token: ${events(parts)}`);
    for (const [chunk, metadata] of tuples) {
      assert.equal(chunk.type, "AIMessageChunk");
      assert.equal(metadata.langgraph_node, "call_model");
    }
    assert.equal(tuples.map(([chunk]) => text(chunk)).join(""), HELLO);
  });

  test("messages (messages/metadata, messages/partial, messages/complete)", async () => {
    const { parts, of } = await streamed("chat", { input: HI, streamMode: "messages" });
    const names = new Set(events(parts));
    for (const name of ["messages/metadata", "messages/partial", "messages/complete"]) {
      assert.ok(names.has(name), `${name} in ${[...names]}`);
    }
    const partials = of("messages/partial").map((data) => text(data.at(-1)));
    assert.ok(partials.length >= 2, "the answer grows token by token");
    partials.forEach((partial) => assert.ok(HELLO.startsWith(partial), `${partial} is a prefix of the answer`));
    assert.equal(partials.at(-1), HELLO);
    const complete = of("messages/complete").flat();
    assert.ok(complete.some((m) => m.type === "ai" && text(m) === HELLO), JSON.stringify(complete));
    const metadata = of("messages/metadata");
    const [id] = Object.keys(metadata[0]);
    assert.equal(of("messages/partial").at(-1).at(-1).id, id, "partials carry the id messages/metadata named");
  });

  test("events (LangChain callback events)", async () => {
    const { of } = await streamed("chat", { input: HI, streamMode: "events" });
    const fired = of("events");
    const kinds = new Set(fired.map((e) => e.event));
    for (const kind of ["on_chain_start", "on_chat_model_start", "on_chat_model_stream", "on_chat_model_end", "on_chain_end"]) {
      assert.ok(kinds.has(kind), `${kind} in ${[...kinds]}`);
    }
    for (const e of fired) {
      assert.equal(typeof e.run_id, "string");
      assert.equal(typeof e.name, "string");
    }
    const tokens = fired.filter((e) => e.event === "on_chat_model_stream").map((e) => text(e.data.chunk));
    assert.equal(tokens.join(""), HELLO);
  });

  test("custom", async () => {
    const { of } = await streamed("ticker", { input: TICKER, streamMode: "custom" });
    assert.deepEqual(of("custom"), [{ tick: 0 }, { tick: 1 }, { tick: 2 }]);
  });

  test("debug", async () => {
    const { of } = await streamed("chat", { input: HI, streamMode: "debug" });
    const types = of("debug").map((d) => d.type);
    for (const type of ["checkpoint", "task", "task_result"]) assert.ok(types.includes(type), `${type} in ${types}`);
    const result = of("debug").find((d) => d.type === "task_result");
    assert.equal(result.payload.name, "call_model");
  });

  test("tasks", async () => {
    const { of } = await streamed("chat", { input: HI, streamMode: "tasks" });
    const tasks = of("tasks");
    const start = tasks.find((t) => "input" in t);
    const end = tasks.find((t) => "result" in t);
    assert.equal(start.name, "call_model");
    assert.equal(end.id, start.id);
    assert.equal(end.name, "call_model");
    // [[channel, value], ...] in the SDK's types; an object from newer LangGraph.
    const written = Array.isArray(end.result) ? Object.fromEntries(end.result) : end.result;
    assert.equal(text(written.messages[0]), HELLO);
  });

  test("checkpoints", async () => {
    const { of, threadId } = await streamed("chat", { input: HI, streamMode: "checkpoints" });
    const checkpoints = of("checkpoints");
    const last = checkpoints.at(-1);
    assert.deepEqual(last.next, []);
    assert.equal(text(last.values.messages.at(-1)), HELLO);
    const state = await sdk.threads.getState(threadId);
    assert.equal(last.config.configurable.checkpoint_id, state.checkpoint.checkpoint_id);
    assert.ok(checkpoints.every((c) => "metadata" in c && Array.isArray(c.tasks)));
  });

  test("several modes at once", async () => {
    const { parts } = await streamed("ticker", { input: TICKER, streamMode: ["values", "updates", "custom", "messages-tuple"] });
    const names = new Set(events(parts));
    for (const name of ["values", "updates", "custom", "messages"]) assert.ok(names.has(name), `${name} in ${[...names]}`);
  });

  test("streamSubgraphs: the subgraph's events name its namespace", async () => {
    const { parts, threadId } = await streamed("nested", { input: HI, streamMode: ["updates"], streamSubgraphs: true });
    const inner = parts.filter((p) => p.event.startsWith("updates|inner:"));
    assert.ok(inner.length > 0, `subgraph events: ${events(parts)}`);
    assert.ok(inner.some((p) => "draft" in p.data), JSON.stringify(inner.map((p) => p.data)));
    const outer = parts.filter((p) => p.event === "updates");
    assert.ok(outer.some((p) => "__interrupt__" in p.data), "the parent sees the interrupt");
    // Without streamSubgraphs: only the parent's events.
    const flat = await collect(sdk.runs.stream(threadId, "nested", { command: { resume: "yes" }, streamMode: ["updates"] }));
    assert.ok(flat.every((p) => !p.event.includes("|")), events(flat).join(" "));
    assert.equal(text((await sdk.threads.getState(threadId)).values.messages.at(-1)), HELLO);
  });

  test("stateless (thread null)", async () => {
    const parts = await collect(sdk.runs.stream(null, "chat", { input: HI, streamMode: "values" }));
    assert.equal(parts[0].event, "metadata");
    assert.equal(text(parts.at(-1).data.messages.at(-1)), HELLO);
  });

  test("interruptBefore and interruptAfter pause at the node; a run with no input goes on", async () => {
    for (const [option, next, messages] of [["interruptBefore", ["call_model"], 1], ["interruptAfter", [], 2]]) {
      const { threadId, of } = await streamed("chat", { input: HI, streamMode: "values", [option]: ["call_model"] });
      assert.equal(of("values").at(-1).messages.length, messages, option);
      const paused = await sdk.threads.getState(threadId);
      assert.equal(paused.values.messages.length, messages, option);
      if (option === "interruptBefore") {
        assert.deepEqual(paused.next, next);
        const resumed = await sdk.runs.wait(threadId, "chat", { input: null });
        assert.equal(text(resumed.messages.at(-1)), HELLO);
      }
    }
    const detail = await refused(collect(sdk.runs.stream(await thread(), "chat", { input: HI, interruptBefore: ["no_such_node"] })), 422);
    assert.match(detail, /no_such_node/);
  });

  test("bad requests: unknown assistant, unknown stream mode, another tenant's thread", async () => {
    const threadId = await thread();
    await refused(collect(sdk.runs.stream(threadId, "no-such-graph", { input: HI })), 404);
    const detail = await refused(collect(sdk.runs.stream(threadId, "chat", { input: HI, streamMode: "bogus" })), 422);
    assert.match(detail, /stream_mode/);
    await refused(collect(other.runs.stream(threadId, "chat", { input: HI })), 404);
  });
});

describe("runs: background runs", () => {
  test("create on a thread, join, get, list", async () => {
    const threadId = await thread();
    const mark = tag();
    const run = await sdk.runs.create(threadId, "chat", { input: HI, metadata: { mark } });
    assert.equal(run.thread_id, threadId);
    assert.ok(["pending", "running", "success"].includes(run.status), run.status);
    assert.equal(run.metadata.mark, mark);
    const values = await sdk.runs.join(threadId, run.run_id);
    assert.equal(text(values.messages.at(-1)), HELLO);
    const got = await sdk.runs.get(threadId, run.run_id);
    assert.equal(got.status, "success");
    assert.equal(got.run_id, run.run_id);

    const second = await sdk.runs.create(threadId, "chat", { input: HI });
    await sdk.runs.join(threadId, second.run_id);
    const listed = await sdk.runs.list(threadId);
    assert.deepEqual(listed.map((r) => r.run_id), [second.run_id, run.run_id], "newest first");
    assert.deepEqual((await sdk.runs.list(threadId, { limit: 1 })).map((r) => r.run_id), [second.run_id]);
    assert.deepEqual((await sdk.runs.list(threadId, { limit: 1, offset: 1 })).map((r) => r.run_id), [run.run_id]);
    assert.equal((await sdk.runs.list(threadId, { status: "success" })).length, 2);
    assert.equal((await sdk.runs.list(threadId, { status: "error" })).length, 0);
    await refused(sdk.runs.get(threadId, "00000000-0000-0000-0000-000000000000"), 404);
    await refused(other.runs.get(threadId, run.run_id), 404);
    await refused(other.runs.list(threadId), 404);
  });

  test("create stateless (thread null)", async () => {
    const run = await sdk.runs.create(null, "chat", { input: HI, onCompletion: "keep" });
    assert.ok(run.run_id);
    assert.ok(["pending", "running", "success"].includes(run.status), run.status);
    // onCompletion "keep": the temporary thread stays, so the run names it and can be joined there.
    assert.ok(run.thread_id, `a run whose thread is kept names the thread: ${JSON.stringify(run)}`);
    const values = await sdk.runs.join(run.thread_id, run.run_id);
    assert.equal(text(values.messages.at(-1)), HELLO);
    assert.equal((await sdk.runs.get(run.thread_id, run.run_id)).status, "success");

    // Without keep the run has no thread to name: its stream is read by run id alone.
    const gone = await sdk.runs.create(null, "chat", { input: HI, streamMode: ["values"] });
    assert.equal(gone.thread_id, null);
    const parts = await collect(sdk.runs.joinStream(null, gone.run_id));
    assert.equal(parts[0].event, "metadata");
    assert.equal(text(parts.filter((p) => p.event === "values").at(-1).data.messages.at(-1)), HELLO);
    await refused(collect(other.runs.joinStream(null, gone.run_id)), 404);
  });

  test("createBatch: several stateless runs in one request", async () => {
    const mark = tag();
    // The SDK sends each item's keys as given, camelCase (the server reads both).
    const runs = await sdk.runs.createBatch([
      { assistantId: "chat", input: HI, metadata: { mark, n: 0 }, onCompletion: "keep" },
      { assistantId: "ticker", input: TICKER, metadata: { mark, n: 1 }, onCompletion: "keep" },
    ]);
    assert.equal(runs.length, 2);
    assert.deepEqual(runs.map((r) => r.metadata.n), [0, 1]);
    assert.notEqual(runs[0].run_id, runs[1].run_id);
    for (const run of runs) {
      assert.ok(run.thread_id, `a run whose thread is kept names the thread: ${JSON.stringify(run)}`);
      const values = await sdk.runs.join(run.thread_id, run.run_id);
      assert.equal(text(values.messages.at(-1)), HELLO);
    }
    const detail = await refused(sdk.runs.createBatch([{ assistantId: "chat", input: HI }, { assistantId: "no-such-graph" }]), [404, 422]);
    assert.match(detail, /no-such-graph/);
  });

  test("wait: on a thread and stateless", async () => {
    const threadId = await thread();
    const values = await sdk.runs.wait(threadId, "chat", { input: HI });
    assert.deepEqual(values.messages.map((m) => m.type), ["human", "ai"]);
    const again = await sdk.runs.wait(threadId, "chat", { input: HI });
    assert.equal(again.messages.length, 4);
    const stateless = await sdk.runs.wait(null, "chat", { input: HI });
    assert.equal(text(stateless.messages.at(-1)), HELLO);
  });

  test("cancel: a running run stops, interrupted; the thread is idle", async () => {
    const threadId = await thread();
    const run = await sdk.runs.create(threadId, "ticker", { input: { ...TICKER, ticks: 2000 } });
    await sdk.runs.cancel(threadId, run.run_id, true);
    const got = await sdk.runs.get(threadId, run.run_id);
    assert.equal(got.status, "interrupted");
    assert.equal((await sdk.threads.get(threadId)).status, "idle");
    // Without waiting: accepted (202), then the run ends interrupted.
    const next = await sdk.runs.create(threadId, "ticker", { input: { ...TICKER, ticks: 2000 } });
    const response = await raw("POST", `/threads/${threadId}/runs/${next.run_id}/cancel`);
    assert.equal(response.status, 202);
    await sdk.runs.join(threadId, next.run_id);
    assert.equal((await sdk.runs.get(threadId, next.run_id)).status, "interrupted");
    await sdk.runs.cancel(threadId, next.run_id); // an ended run: nothing to do
    await refused(other.runs.cancel(threadId, run.run_id), 404);
  });

  test("joinStream: all events, a streamMode filter, and lastEventId", async () => {
    const threadId = await thread();
    const run = await sdk.runs.create(threadId, "ticker", { input: { ...TICKER, ticks: 5 }, streamMode: ["values", "updates", "custom"] });
    const all = await collect(sdk.runs.joinStream(threadId, run.run_id));
    assert.equal(all[0].event, "metadata");
    assert.deepEqual(all.map((p) => p.id), all.map((_, i) => String(i)));
    assert.deepEqual(all.filter((p) => p.event === "custom").map((p) => p.data.tick), [0, 1, 2, 3, 4]);
    assert.equal((await sdk.runs.get(threadId, run.run_id)).status, "success");

    const control = new Set(["metadata", "error", "end"]);
    const kept = (modes, after = -1) => all.filter((p) => (modes.includes(p.event) || control.has(p.event)) && Number(p.id) > after);
    const customOnly = await collect(sdk.runs.joinStream(threadId, run.run_id, { streamMode: "custom" }));
    assert.deepEqual(customOnly.map((p) => [p.event, p.id]), kept(["custom"]).map((p) => [p.event, p.id]));
    const two = await collect(sdk.runs.joinStream(threadId, run.run_id, { streamMode: ["values", "updates"] }));
    assert.deepEqual(two.map((p) => [p.event, p.id]), kept(["values", "updates"]).map((p) => [p.event, p.id]));

    const middle = all.find((p) => p.event === "custom" && p.data.tick === 2).id;
    const resumed = await collect(sdk.runs.joinStream(threadId, run.run_id, { lastEventId: middle }));
    assert.deepEqual(resumed.map((p) => p.id), all.filter((p) => Number(p.id) > Number(middle)).map((p) => p.id));
    const resumedCustom = await collect(sdk.runs.joinStream(threadId, run.run_id, { lastEventId: middle, streamMode: "custom" }));
    assert.deepEqual(resumedCustom.map((p) => p.data?.tick).filter((t) => t !== undefined), [3, 4]);
    await refused(collect(other.runs.joinStream(threadId, run.run_id)), 404);
  });

  test("delete: a finished run is gone; a running one is not deleted", async () => {
    const threadId = await thread();
    const run = await sdk.runs.create(threadId, "chat", { input: HI });
    await sdk.runs.join(threadId, run.run_id);
    await refused(other.runs.delete(threadId, run.run_id), 404);
    assert.equal(await sdk.runs.delete(threadId, run.run_id), undefined);
    await refused(sdk.runs.get(threadId, run.run_id), 404);
    assert.deepEqual(await sdk.runs.list(threadId), []);
    await refused(sdk.runs.delete(threadId, run.run_id), 404);
    // The thread's state stays: deleting a run is not undoing it.
    assert.equal(text((await sdk.threads.getState(threadId)).values.messages.at(-1)), HELLO);

    const running = await sdk.runs.create(threadId, "ticker", { input: { ...TICKER, ticks: 2000 } });
    await refused(sdk.runs.delete(threadId, running.run_id), 409);
    await sdk.runs.cancel(threadId, running.run_id, true);
    await sdk.runs.delete(threadId, running.run_id);
    await refused(sdk.runs.get(threadId, running.run_id), 404);
  });
  test("cancelMany: by run ids (404 naming unknown ones, nothing cancelled), by status; never another tenant's", async () => {
    const long = { input: { ...TICKER, ticks: 2000 } };
    const [a, b] = [await thread(), await thread()];
    const ra = await sdk.runs.create(a, "ticker", long);
    const rb = await sdk.runs.create(b, "ticker", long);
    const theirsThread = (await other.threads.create()).thread_id;
    const theirs = await other.runs.create(theirsThread, "ticker", long);
    const running = async (c, t, r) => ["pending", "running"].includes((await c.runs.get(t, r)).status);

    assert.match(await refused(other.runs.cancelMany({ runIds: [ra.run_id] }), 404), new RegExp(ra.run_id));
    assert.match(await refused(sdk.runs.cancelMany({ threadId: a, runIds: [rb.run_id] }), 404), new RegExp(rb.run_id));
    await refused(sdk.runs.cancelMany({ runIds: [ra.run_id], action: "rollback" }), 400);
    assert.ok(await running(sdk, a, ra.run_id));

    assert.equal(await sdk.runs.cancelMany({ threadId: a, runIds: [ra.run_id] }), undefined); // 204
    await sdk.runs.join(a, ra.run_id);
    assert.equal((await sdk.runs.get(a, ra.run_id)).status, "interrupted");
    assert.ok(await running(sdk, b, rb.run_id));

    await sdk.runs.cancelMany({ status: "all" });
    await sdk.runs.join(b, rb.run_id);
    assert.equal((await sdk.runs.get(b, rb.run_id)).status, "interrupted");
    assert.ok(await running(other, theirsThread, theirs.run_id), "another tenant's run goes on");
    await other.runs.cancel(theirsThread, theirs.run_id, true);
  });

  test("cancel with a reason: the run's error event says it", async () => {
    const threadId = await thread();
    const run = await sdk.runs.create(threadId, "ticker", { input: { ...TICKER, ticks: 2000 } });
    await sdk.runs.cancel(threadId, run.run_id, true, "interrupt", { reason: "user pressed stop" });
    const parts = await collect(sdk.runs.joinStream(threadId, run.run_id));
    const error = parts.find((p) => p.event === "error");
    assert.equal(error?.data.error, "RunCancelled");
    assert.match(error.data.message, /: user pressed stop$/);
  });

  test("join with cancelOnDisconnect: a joiner that leaves cancels the run", async () => {
    const threadId = await thread();
    const run = await sdk.runs.create(threadId, "ticker", { input: { ...TICKER, ticks: 2000 }, streamMode: ["custom", "values"] });
    const leaving = new AbortController();
    const joined = sdk.runs.join(threadId, run.run_id, { cancelOnDisconnect: true, signal: leaving.signal });
    // Leaves once the request is out: the ticks show the run is going, and the join has been sent.
    for await (const part of sdk.runs.joinStream(threadId, run.run_id, { streamMode: "custom" })) {
      if (part.event === "custom") break;
    }
    leaving.abort();
    await assert.rejects(joined);
    let status = "running";
    for (let i = 0; i < 500 && ["pending", "running"].includes(status); i += 1) {
      // a bound, not a timing assertion: without the cancel the run goes on for a minute
      status = (await sdk.runs.get(threadId, run.run_id)).status;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal(status, "interrupted");
    const parts = await collect(sdk.runs.joinStream(threadId, run.run_id));
    assert.match(parts.find((p) => p.event === "error").data.message, /cancel_on_disconnect/);
  });
});
