// client.threads: every method, on threads of the tenant behind the key; another
// tenant's thread is a 404 for every one of them.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { HELLO, HI, OTHER_KEY, client, collect, refused, tag, text } from "./helpers.mjs";

const sdk = client();
const other = client(OTHER_KEY);

/** A thread with one finished chat run on it (human "Hi", ai HELLO). */
async function chatted(metadata = {}) {
  const thread = await sdk.threads.create({ metadata });
  await sdk.runs.wait(thread.thread_id, "chat", { input: HI });
  return thread;
}

describe("threads", () => {
  test("create, get, and create with a chosen id (ifExists)", async () => {
    const mark = tag();
    const thread = await sdk.threads.create({ metadata: { mark }, graphId: "chat" });
    assert.equal(thread.status, "idle");
    assert.equal(thread.metadata.mark, mark);
    assert.equal(thread.metadata.graph_id, "chat");
    const got = await sdk.threads.get(thread.thread_id);
    assert.equal(got.thread_id, thread.thread_id);
    assert.equal(got.metadata.mark, mark);

    const chosen = tag();
    const mine = await sdk.threads.create({ threadId: chosen, metadata: { n: 1 } });
    assert.equal(mine.thread_id, chosen);
    const same = await sdk.threads.create({ threadId: chosen, ifExists: "do_nothing", metadata: { n: 2 } });
    assert.equal(same.thread_id, chosen);
    assert.equal(same.metadata.n, 1);
    await refused(sdk.threads.create({ threadId: chosen, ifExists: "raise" }), 409);
    await refused(sdk.threads.get(tag()), 404);
  });

  test("update: metadata is merged (PATCH)", async () => {
    const thread = await sdk.threads.create({ metadata: { keep: "me", change: 1 } });
    const updated = await sdk.threads.update(thread.thread_id, { metadata: { change: 2, added: true } });
    assert.equal(updated.thread_id, thread.thread_id);
    assert.deepEqual(
      { keep: updated.metadata.keep, change: updated.metadata.change, added: updated.metadata.added },
      { keep: "me", change: 2, added: true },
    );
    assert.equal((await sdk.threads.get(thread.thread_id)).metadata.change, 2);
    await refused(sdk.threads.update(tag(), { metadata: { a: 1 } }), 404);
  });

  test("delete: gone afterwards, its state too", async () => {
    const thread = await chatted();
    assert.equal(await sdk.threads.delete(thread.thread_id), undefined);
    await refused(sdk.threads.get(thread.thread_id), 404);
    await refused(sdk.threads.getState(thread.thread_id), 404);
    await refused(sdk.threads.delete(thread.thread_id), 404);
    // The id can be used again, from scratch.
    const again = await sdk.threads.create({ threadId: thread.thread_id });
    assert.equal(again.thread_id, thread.thread_id);
    assert.deepEqual((await sdk.threads.getState(thread.thread_id)).values, {});
  });

  test("copy: a new thread with the same state and history", async () => {
    const mark = tag();
    const thread = await chatted({ mark });
    const copy = await sdk.threads.copy(thread.thread_id);
    assert.notEqual(copy.thread_id, thread.thread_id);
    const [original, copied] = await Promise.all([
      sdk.threads.getState(thread.thread_id),
      sdk.threads.getState(copy.thread_id),
    ]);
    assert.deepEqual(copied.values, original.values);
    assert.equal(text(copied.values.messages.at(-1)), HELLO);
    const history = await sdk.threads.getHistory(copy.thread_id, { limit: 100 });
    assert.equal(history.length, (await sdk.threads.getHistory(thread.thread_id, { limit: 100 })).length);
    // The copy goes on by itself: a run on it leaves the original as it was.
    await sdk.runs.wait(copy.thread_id, "chat", { input: HI });
    assert.equal((await sdk.threads.getState(copy.thread_id)).values.messages.length, 4);
    assert.equal((await sdk.threads.getState(thread.thread_id)).values.messages.length, 2);
    await refused(sdk.threads.copy(tag()), 404);
  });

  test("search and count: metadata, status, ids, paging", async () => {
    const mark = tag();
    const made = [];
    for (let n = 0; n < 3; n += 1) made.push(await sdk.threads.create({ metadata: { mark, n } }));
    await chatted({ mark, n: 9 });
    await other.threads.create({ metadata: { mark } }); // the same mark, another tenant

    const found = await sdk.threads.search({ metadata: { mark }, limit: 100 });
    assert.equal(found.length, 4);
    assert.equal(await sdk.threads.count({ metadata: { mark } }), 4);
    assert.equal(await sdk.threads.count({ metadata: { mark, n: 1 } }), 1);
    assert.equal(await sdk.threads.count({ metadata: { mark }, status: "idle" }), 4);
    assert.equal(await sdk.threads.count({ metadata: { mark }, status: "busy" }), 0);
    assert.equal(await other.threads.count({ metadata: { mark } }), 1);

    const [one] = await sdk.threads.search({ metadata: { mark, n: 2 } });
    assert.equal(one.thread_id, made[2].thread_id);
    const page1 = await sdk.threads.search({ metadata: { mark }, limit: 2, offset: 0 });
    const page2 = await sdk.threads.search({ metadata: { mark }, limit: 2, offset: 2 });
    assert.deepEqual(
      [...page1, ...page2].map((t) => t.thread_id).sort(),
      found.map((t) => t.thread_id).sort(),
    );
    const sorted = await sdk.threads.search({ metadata: { mark }, sortBy: "created_at", sortOrder: "asc" });
    assert.deepEqual(sorted.slice(0, 3).map((t) => t.thread_id), made.map((t) => t.thread_id));
    const byIds = await sdk.threads.search({ ids: [made[0].thread_id, made[1].thread_id], limit: 10 });
    assert.deepEqual(byIds.map((t) => t.thread_id).sort(), [made[0].thread_id, made[1].thread_id].sort());
  });

  test("getState: latest, by checkpoint id, by checkpoint object", async () => {
    const thread = await chatted();
    const latest = await sdk.threads.getState(thread.thread_id);
    assert.deepEqual(latest.values.messages.map((m) => m.type), ["human", "ai"]);
    assert.deepEqual(latest.next, []);
    const checkpointId = latest.checkpoint.checkpoint_id;
    assert.ok(checkpointId);

    const history = await sdk.threads.getHistory(thread.thread_id, { limit: 100 });
    const earlier = history.find((s) => s.values.messages?.length === 1);
    assert.ok(earlier, "a checkpoint before the answer");
    const byId = await sdk.threads.getState(thread.thread_id, earlier.checkpoint.checkpoint_id);
    assert.deepEqual(byId.values, earlier.values);
    assert.equal(byId.checkpoint.checkpoint_id, earlier.checkpoint.checkpoint_id);

    const byObject = await sdk.threads.getState(thread.thread_id, { checkpoint_id: earlier.checkpoint.checkpoint_id });
    assert.deepEqual(byObject.values, earlier.values);
    assert.deepEqual(byObject.next, earlier.next);
    const latestByObject = await sdk.threads.getState(thread.thread_id, { checkpoint_id: checkpointId });
    assert.deepEqual(latestByObject.values, latest.values);

    await refused(sdk.threads.getState(thread.thread_id, "1f000000-0000-6000-8000-000000000000"), 404);
    await refused(other.threads.getState(thread.thread_id), 404);
  });

  test("getState with subgraphs: the interrupted subgraph's own state", async () => {
    const thread = await sdk.threads.create();
    const paused = await sdk.runs.wait(thread.thread_id, "nested", { input: HI });
    assert.equal(paused.__interrupt__[0].value.question, "Keep this draft?");
    const plain = await sdk.threads.getState(thread.thread_id);
    assert.deepEqual(plain.next, ["inner"]);
    const [task] = plain.tasks;
    assert.equal(task.name, "inner");
    assert.equal(task.interrupts[0].value.question, "Keep this draft?");

    const deep = await sdk.threads.getState(thread.thread_id, undefined, { subgraphs: true });
    const [deepTask] = deep.tasks;
    assert.ok(deepTask.state && typeof deepTask.state === "object", `the subgraph's state: ${JSON.stringify(deepTask)}`);
    assert.deepEqual(deepTask.state.next, ["review"]);
    assert.equal(text(deepTask.state.values.messages.at(-1)), HELLO);

    const done = await sdk.runs.wait(thread.thread_id, "nested", { command: { resume: "yes" } });
    assert.equal(text(done.messages.at(-1)), HELLO);
    assert.deepEqual((await sdk.threads.getState(thread.thread_id, undefined, { subgraphs: true })).tasks, []);
  });

  test("updateState: values as a node, then the next run sees them", async () => {
    const thread = await chatted();
    const before = await sdk.threads.getState(thread.thread_id);
    const written = await sdk.threads.updateState(thread.thread_id, {
      values: { messages: [{ type: "ai", content: "Written by hand." }] },
      asNode: "call_model",
    });
    assert.ok(written.checkpoint?.checkpoint_id, JSON.stringify(written));
    const after = await sdk.threads.getState(thread.thread_id);
    assert.equal(after.checkpoint.checkpoint_id, written.checkpoint.checkpoint_id);
    assert.equal(text(after.values.messages.at(-1)), "Written by hand.");
    assert.equal(after.values.messages.length, 3);
    assert.equal(after.parent_checkpoint.checkpoint_id, before.checkpoint.checkpoint_id);

    // From an earlier checkpoint: a fork, the latest state is the fork's.
    const forked = await sdk.threads.updateState(thread.thread_id, {
      values: { messages: [{ type: "ai", content: "A fork." }] },
      checkpointId: before.checkpoint.checkpoint_id,
      asNode: "call_model",
    });
    const fork = await sdk.threads.getState(thread.thread_id);
    assert.equal(fork.checkpoint.checkpoint_id, forked.checkpoint.checkpoint_id);
    assert.deepEqual(fork.values.messages.map(text), ["Hi", HELLO, "A fork."]);

    const detail = await refused(
      sdk.threads.updateState(thread.thread_id, { values: { messages: [] }, asNode: "no_such_node" }),
      [400, 422],
    );
    assert.match(detail, /no_such_node/);
    await refused(other.threads.updateState(thread.thread_id, { values: { messages: [] } }), 404);
  });

  test("patchState: the latest checkpoint's metadata", async () => {
    const thread = await chatted();
    const before = await sdk.threads.getState(thread.thread_id);
    assert.equal(await sdk.threads.patchState(thread.thread_id, { reviewed: "yes" }), undefined);
    const after = await sdk.threads.getState(thread.thread_id);
    assert.equal(after.metadata.reviewed, "yes");
    assert.deepEqual(after.values, before.values);
    // The config form names the thread in configurable.thread_id.
    await sdk.threads.patchState({ configurable: { thread_id: thread.thread_id } }, { score: 3 });
    const again = await sdk.threads.getState(thread.thread_id);
    assert.equal(again.metadata.score, 3);
    assert.equal(again.metadata.reviewed, "yes");
    await refused(other.threads.patchState(thread.thread_id, { reviewed: "no" }), 404);
  });

  test("getHistory: newest first, limit, before, metadata", async () => {
    const thread = await chatted();
    await sdk.runs.wait(thread.thread_id, "chat", { input: HI });
    const history = await sdk.threads.getHistory(thread.thread_id, { limit: 100 });
    const lengths = history.map((s) => s.values.messages?.length ?? 0);
    assert.deepEqual(lengths, [...lengths].sort((a, b) => b - a), "newest first");
    assert.equal(lengths[0], 4);
    const two = await sdk.threads.getHistory(thread.thread_id, { limit: 2 });
    assert.deepEqual(two.map((s) => s.checkpoint.checkpoint_id), history.slice(0, 2).map((s) => s.checkpoint.checkpoint_id));
    const older = await sdk.threads.getHistory(thread.thread_id, { limit: 100, before: two[1].checkpoint });
    assert.deepEqual(older.map((s) => s.checkpoint.checkpoint_id), history.slice(2).map((s) => s.checkpoint.checkpoint_id));
    const inputs = await sdk.threads.getHistory(thread.thread_id, { limit: 100, metadata: { source: "input" } });
    assert.ok(inputs.length >= 2 && inputs.every((s) => s.metadata.source === "input"), JSON.stringify(inputs.map((s) => s.metadata)));
    await refused(other.threads.getHistory(thread.thread_id), 404);
  });

  test("joinStream: the thread's runs as they happen; lastEventId replays; streamMode filters", async () => {
    const threadId = (await sdk.threads.create()).thread_id;
    // A runs until it is cancelled, so it is certainly going on when the stream is joined.
    const a = await sdk.runs.create(threadId, "ticker", { input: { ...HI, ticks: 100_000 }, streamMode: ["custom", "values"] });
    const controller = new AbortController();
    const live = [];
    let b;
    for await (const part of sdk.threads.joinStream(threadId, { signal: controller.signal })) {
      live.push(part);
      if (part.event === "custom" && live.filter((p) => p.event === "custom").length === 1) {
        await sdk.runs.cancel(threadId, a.run_id);
      }
      if (part.event === "end" && part.data.run_id === a.run_id) {
        b = await sdk.runs.create(threadId, "chat", { input: HI }); // started after the join: all its events
      }
      if (part.event === "end" && part.data.run_id === b?.run_id) {
        controller.abort();
        break;
      }
    }
    const ofRun = (run) => live.filter((p) => p.id.startsWith(`${run.run_id}:`));
    assert.equal(ofRun(a).length + ofRun(b).length, live.length, "every event's id names its run");
    const aEvents = ofRun(a).map((p) => p.event);
    assert.ok(aEvents.includes("custom"), aEvents.join(" "));
    assert.deepEqual(aEvents.slice(-2), ["error", "end"]);
    assert.equal(ofRun(a).at(-2).data.error, "RunCancelled");
    assert.deepEqual(ofRun(b).map((p) => p.event), ["metadata", "values", "values", "end"]);
    assert.equal(text(ofRun(b).at(-2).data.messages.at(-1)), HELLO);

    /** The thread's stream after `lastEventId` until run b's end. */
    async function replay(options) {
      const stop = new AbortController();
      const parts = [];
      for await (const part of sdk.threads.joinStream(threadId, { ...options, signal: stop.signal })) {
        parts.push(part);
        if (part.event === "end" && part.data.run_id === b.run_id) {
          stop.abort();
          break;
        }
      }
      return parts;
    }
    const firstTick = live.find((p) => p.event === "custom");
    const after = live.slice(live.indexOf(firstTick) + 1);
    const resumed = await replay({ lastEventId: firstTick.id });
    assert.deepEqual(resumed.map((p) => [p.id, p.event]), after.map((p) => [p.id, p.event]), "no loss, no duplicates");
    assert.deepEqual(resumed.map((p) => p.data), after.map((p) => p.data));

    const control = ["metadata", "error", "end"];
    const valuesOnly = await replay({ lastEventId: firstTick.id, streamMode: "values" });
    assert.deepEqual(
      valuesOnly.map((p) => [p.id, p.event]),
      after.filter((p) => p.event === "values" || control.includes(p.event)).map((p) => [p.id, p.event]),
    );
    const runModes = await replay({ lastEventId: firstTick.id, streamMode: "run_modes" });
    assert.deepEqual(runModes.map((p) => p.id), after.map((p) => p.id), "run_modes: every run event");
  });

  test("another tenant's thread is a 404 for every call", async () => {
    const thread = await chatted();
    const id = thread.thread_id;
    await refused(other.threads.get(id), 404);
    await refused(other.threads.update(id, { metadata: { x: 1 } }), 404);
    await refused(other.threads.copy(id), 404);
    await refused(other.threads.delete(id), 404);
    await refused(other.threads.getState(id), 404);
    await refused(other.threads.getHistory(id), 404);
    await refused(collect(other.threads.joinStream(id)), 404);
    assert.ok(!(await other.threads.search({ ids: [id], limit: 1000 })).some((t) => t.thread_id === id));
    assert.equal((await sdk.threads.get(id)).thread_id, id); // still there
  });
  test("prune delete: the tenant's threads go (a run in progress is cancelled); others are skipped", async () => {
    const idle = (await chatted()).thread_id;
    const busy = (await sdk.threads.create()).thread_id;
    const run = await sdk.runs.create(busy, "ticker", { input: { ...HI, ticks: 2000 } });
    const theirs = (await other.threads.create()).thread_id;
    assert.deepEqual(await other.threads.prune([idle, busy]), { pruned_count: 0 });
    assert.equal((await sdk.threads.get(idle)).thread_id, idle);
    assert.ok(["pending", "running"].includes((await sdk.runs.get(busy, run.run_id)).status));

    assert.deepEqual(await sdk.threads.prune([idle, busy, theirs, tag()]), { pruned_count: 2 });
    await refused(sdk.threads.get(idle), 404);
    await refused(sdk.threads.get(busy), 404);
    assert.equal((await other.threads.get(theirs)).thread_id, theirs);
    const tooMany = Array.from({ length: 1001 }, () => tag());
    assert.match(await refused(sdk.threads.prune(tooMany), 422), /thread_ids/);
  });

  test("prune keep_latest: the thread and its latest state stay, older checkpoints go", async () => {
    const id = (await chatted()).thread_id;
    await sdk.runs.wait(id, "chat", { input: HI });
    const state = await sdk.threads.getState(id);
    assert.ok((await sdk.threads.getHistory(id, { limit: 100 })).length > 1);
    assert.deepEqual(await other.threads.prune([id], { strategy: "keep_latest" }), { pruned_count: 0 });

    assert.deepEqual(await sdk.threads.prune([id], { strategy: "keep_latest" }), { pruned_count: 1 });
    const history = await sdk.threads.getHistory(id, { limit: 100 });
    assert.equal(history.length, 1);
    assert.equal(history[0].checkpoint.checkpoint_id, state.checkpoint.checkpoint_id);
    assert.deepEqual((await sdk.threads.getState(id)).values, state.values);
    const next = await sdk.runs.wait(id, "chat", { input: HI });
    assert.equal(next.messages.length, state.values.messages.length + 2);

    // A thread with a run in progress: 409 naming it, nothing pruned.
    const run = await sdk.runs.create(id, "ticker", { input: { ...HI, ticks: 2000 } });
    const detail = await refused(sdk.threads.prune([id], { strategy: "keep_latest" }), 409);
    assert.ok(detail.includes(id), detail);
    await sdk.runs.cancel(id, run.run_id, true);
  });
});
