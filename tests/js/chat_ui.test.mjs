// A thread used the way Agent Chat UI (the SDK's useStream) uses it: create the
// thread, stream a run with values + messages-tuple and streamResumable (so the
// run continues if the tab goes away, onDisconnect "continue"), read the history;
// on a reload it rejoins the run with lastEventId "-1" (every event).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { HELLO, client, collect, text } from "./helpers.mjs";

const sdk = client();

describe("Agent Chat UI's calls", () => {
  test("create, stream messages-tuple resumable, getHistory, rejoin from the start", async () => {
    const thread = await sdk.threads.create({ metadata: { graph_id: "chat" } });
    assert.deepEqual(await sdk.threads.getHistory(thread.thread_id, { limit: 10 }), []);

    let created;
    const parts = await collect(sdk.runs.stream(thread.thread_id, "chat", {
      input: { messages: [{ type: "human", content: "Hi" }] },
      streamMode: ["values", "messages-tuple", "custom"],
      streamResumable: true,
      onDisconnect: "continue",
      onRunCreated: (meta) => { created = meta; },
    }));
    assert.equal(created.thread_id, thread.thread_id);
    const tokens = parts.filter((p) => p.event === "messages").map((p) => text(p.data[0]));
    assert.equal(tokens.join(""), HELLO);
    const values = parts.filter((p) => p.event === "values").at(-1).data;
    assert.deepEqual(values.messages.map((m) => m.type), ["human", "ai"]);
    // The streamed chunks and the stored message are one message (the UI merges them by id).
    const chunkIds = new Set(parts.filter((p) => p.event === "messages").map((p) => p.data[0].id));
    assert.deepEqual([...chunkIds], [values.messages[1].id]);

    const history = await sdk.threads.getHistory(thread.thread_id, { limit: 10 });
    assert.ok(history.length >= 2);
    assert.deepEqual(history[0].values, values);
    assert.deepEqual(history[0].next, []);
    assert.ok(history[0].checkpoint.checkpoint_id);
    const state = await sdk.threads.getState(thread.thread_id);
    assert.equal(state.checkpoint.checkpoint_id, history[0].checkpoint.checkpoint_id);
    const listed = await sdk.threads.search({ metadata: { graph_id: "chat" }, limit: 100 });
    assert.ok(listed.some((t) => t.thread_id === thread.thread_id));
    assert.equal((await sdk.threads.get(thread.thread_id)).status, "idle");

    // useStream's joinStream sends Last-Event-ID "-1" (from the start) on a reload.
    const rejoined = await collect(sdk.runs.joinStream(thread.thread_id, created.run_id, { lastEventId: "-1" }));
    assert.deepEqual(rejoined.map((p) => [p.id, p.event]), parts.map((p) => [p.id, p.event]));
  });

  test("regenerate: a run from the checkpoint before the answer forks the thread", async () => {
    const thread = await sdk.threads.create();
    const input = { messages: [{ type: "human", content: "Hi" }] };
    await collect(sdk.runs.stream(thread.thread_id, "chat", { input, streamMode: ["values", "messages-tuple"] }));
    const history = await sdk.threads.getHistory(thread.thread_id, { limit: 10 });
    const answered = history[0];
    const beforeAnswer = history.find((s) => s.values.messages?.length === 1);
    assert.ok(beforeAnswer, "a checkpoint with the question only");

    // What useStream sends to regenerate the answer: no input, the parent checkpoint.
    const { thread_id: _ignored, ...checkpoint } = beforeAnswer.checkpoint;
    const parts = await collect(sdk.runs.stream(thread.thread_id, "chat", {
      input: undefined,
      checkpoint,
      streamMode: ["values", "messages-tuple"],
    }));
    const values = parts.filter((p) => p.event === "values").at(-1).data;
    assert.deepEqual(values.messages.map((m) => m.type), ["human", "ai"], "the answer replaced, not appended");
    const after = await sdk.threads.getHistory(thread.thread_id, { limit: 100 });
    assert.equal(after[0].values.messages.length, 2);
    assert.notEqual(after[0].checkpoint.checkpoint_id, answered.checkpoint.checkpoint_id);
    // The new answer descends from the question's checkpoint, not from the old answer.
    const parent = new Map(after.map((s) => [s.checkpoint.checkpoint_id, s.parent_checkpoint?.checkpoint_id]));
    const lineage = [];
    for (let id = after[0].checkpoint.checkpoint_id; id; id = parent.get(id)) lineage.push(id);
    assert.ok(lineage.includes(beforeAnswer.checkpoint.checkpoint_id), "a fork of the question");
    assert.ok(!lineage.includes(answered.checkpoint.checkpoint_id), "not a continuation of the old answer");
  });
});
