// streamResumable: a client reads part of a run's stream, goes away, and comes back
// with joinStream(threadId, runId, {lastEventId}): the events continue where it left,
// none lost and none repeated, and the run went on without it.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { HELLO, OTHER_KEY, client, collect, refused, text } from "./helpers.mjs";

const sdk = client();
const TICKS = 60;
const INPUT = { messages: [{ role: "user", content: "Hi" }], ticks: TICKS };

/** Reads `count` parts of a resumable run's stream, then aborts it (the client leaves). */
async function readSomeThenLeave(threadId, count, streamMode) {
  const controller = new AbortController();
  let run;
  const seen = [];
  const stream = sdk.runs.stream(threadId, "ticker", {
    input: INPUT,
    streamMode,
    streamResumable: true,
    signal: controller.signal,
    onRunCreated: (meta) => { run = meta; },
  });
  for await (const part of stream) {
    seen.push(part);
    if (seen.length === count) {
      controller.abort();
      break;
    }
  }
  assert.equal(seen.length, count, `${count} events before leaving`);
  return { runId: run.run_id, seen };
}

describe("streamResumable", () => {
  test("reconnect with lastEventId: the rest of the events, no loss, no duplicates", async () => {
    const threadId = (await sdk.threads.create()).thread_id;
    const { runId, seen } = await readSomeThenLeave(threadId, 6, ["custom", "values"]);
    assert.equal(seen[0].event, "metadata");
    assert.deepEqual(seen.map((p) => p.id), ["0", "1", "2", "3", "4", "5"]);
    const lastEventId = seen.at(-1).id;

    const rest = await collect(sdk.runs.joinStream(threadId, runId, { lastEventId }));
    assert.ok(rest.length > 0, "the events after the last one seen");
    assert.deepEqual(
      rest.map((p) => Number(p.id)),
      rest.map((_, i) => Number(lastEventId) + 1 + i),
      "ids continue from lastEventId + 1 without a gap",
    );
    const both = [...seen, ...rest];
    const ticks = both.filter((p) => p.event === "custom").map((p) => p.data.tick);
    assert.deepEqual(ticks, Array.from({ length: TICKS }, (_, i) => i), "every tick exactly once, in order");
    assert.ok(!both.some((p) => p.event === "error"), JSON.stringify(both.filter((p) => p.event === "error")));
    const last = both.filter((p) => p.event === "values").at(-1);
    assert.equal(text(last.data.messages.at(-1)), HELLO);
    assert.equal((await sdk.runs.get(threadId, runId)).status, "success", "the run went on without the client");

    // The whole stream again, for a client that joins without an id: the same events.
    const replay = await collect(sdk.runs.joinStream(threadId, runId));
    assert.deepEqual(replay.map((p) => [p.id, p.event]), both.map((p) => [p.id, p.event]));
    assert.deepEqual(replay.map((p) => p.data), both.map((p) => p.data));
  });

  test("reconnect with lastEventId and a streamMode filter", async () => {
    const threadId = (await sdk.threads.create()).thread_id;
    const { runId, seen } = await readSomeThenLeave(threadId, 4, ["custom", "values"]);
    const lastEventId = seen.at(-1).id;
    const rest = await collect(sdk.runs.joinStream(threadId, runId, { lastEventId, streamMode: "custom" }));
    assert.ok(rest.every((p) => ["custom", "metadata", "error", "end"].includes(p.event)), rest.map((p) => p.event).join(" "));
    assert.ok(rest.every((p) => Number(p.id) > Number(lastEventId)));
    const ticks = [...seen, ...rest].filter((p) => p.event === "custom").map((p) => p.data.tick);
    assert.deepEqual(ticks, Array.from({ length: TICKS }, (_, i) => i));
  });

  test("another tenant cannot join the run", async () => {
    const threadId = (await sdk.threads.create()).thread_id;
    const { runId, seen } = await readSomeThenLeave(threadId, 2, ["custom"]);
    await refused(collect(client(OTHER_KEY).runs.joinStream(threadId, runId, { lastEventId: seen.at(-1).id })), 404);
    await sdk.runs.join(threadId, runId);
  });
});
