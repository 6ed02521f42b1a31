// An approval as Agent Chat UI and Agent Inbox do it: the agent's call to a tool
// that needs approval ("probe", on the FAKE scripted backend) interrupts the run
// with a HumanInterrupt; the answer is a list of HumanResponse in command.resume.
// The probe tool writes a line each time it really runs (tests/fakes/graphs.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { HELLO, client, collect, probeRuns, refused, text } from "./helpers.mjs";

const sdk = client();
const ASK = { messages: [{ role: "user", content: "SCRIPT:probe" }] }; // the fake calls probe {"note": "hello"}

/** The one HumanInterrupt of an interrupted run (a list of one, or one, as Agent Chat UI accepts). */
function humanInterrupt(interrupts) {
  assert.equal(interrupts.length, 1, JSON.stringify(interrupts));
  const { value } = interrupts[0];
  const request = Array.isArray(value) ? value[0] : value;
  assert.ok(!Array.isArray(value) || value.length === 1, JSON.stringify(value));
  return request;
}

/** A thread whose agent run waits for the approval of probe({"note": "hello"}). */
async function paused() {
  const threadId = (await sdk.threads.create()).thread_id;
  const parts = await collect(sdk.runs.stream(threadId, "agent", { input: ASK, streamMode: ["values", "updates"] }));
  assert.ok(!parts.some((p) => p.event === "error"), JSON.stringify(parts.filter((p) => p.event === "error")));
  const update = parts.find((p) => p.event === "updates" && "__interrupt__" in p.data);
  assert.ok(update, `the run interrupted: ${parts.map((p) => p.event)}`);
  return { threadId, request: humanInterrupt(update.data.__interrupt__) };
}

describe("approval through HumanInterrupt / HumanResponse", () => {
  test("the interrupt has the HumanInterrupt shape; accept runs the tool once", async () => {
    const before = probeRuns("probe hello");
    const { threadId, request } = await paused();
    assert.equal(request.action_request.action, "probe");
    assert.deepEqual(request.action_request.args, { note: "hello" });
    const { config } = request;
    for (const flag of ["allow_accept", "allow_edit", "allow_respond", "allow_ignore"]) {
      assert.equal(typeof config[flag], "boolean", `config.${flag}: ${JSON.stringify(config)}`);
    }
    assert.equal(config.allow_accept, true);
    assert.equal(typeof request.description, "string");
    assert.match(request.description, /probe/);

    // What the UI reads before it shows the buttons.
    const thread = await sdk.threads.get(threadId);
    assert.equal(thread.status, "interrupted");
    const [pending] = Object.values(thread.interrupts);
    assert.deepEqual(humanInterrupt(pending), request);
    const state = await sdk.threads.getState(threadId);
    assert.deepEqual(humanInterrupt(state.tasks.flatMap((t) => t.interrupts)), request);
    assert.equal(probeRuns("probe hello"), before, "nothing runs before the answer");

    const resumed = await collect(sdk.runs.stream(threadId, "agent", {
      command: { resume: [{ type: "accept", args: null }] },
      streamMode: ["values"],
    }));
    assert.ok(!resumed.some((p) => p.event === "error"), JSON.stringify(resumed.filter((p) => p.event === "error")));
    const values = resumed.filter((p) => p.event === "values").at(-1).data;
    assert.equal(probeRuns("probe hello"), before + 1, "the tool ran once");
    const toolMessage = values.messages.filter((m) => m.type === "tool").at(-1);
    assert.match(text(toolMessage), /probe saw 'hello'/);
    assert.equal(text(values.messages.at(-1)), HELLO);
    assert.equal((await sdk.threads.get(threadId)).status, "idle");

    // The interrupt was answered: a second answer is refused and runs nothing.
    await refused(sdk.runs.wait(threadId, "agent", { command: { resume: [{ type: "accept", args: null }] } }), [400, 409]);
    assert.equal(probeRuns("probe hello"), before + 1);
  });

  test("edit: the tool runs once with the edited arguments", async () => {
    const before = probeRuns("probe edited");
    const { threadId, request } = await paused();
    assert.equal(request.config.allow_edit, true);
    const values = await sdk.runs.wait(threadId, "agent", {
      command: { resume: [{ type: "edit", args: { action: "probe", args: { note: "edited" } } }] },
    });
    assert.equal(probeRuns("probe edited"), before + 1);
    assert.match(text(values.messages.filter((m) => m.type === "tool").at(-1)), /probe saw 'edited'/);
  });

  test("response and ignore: the tool does not run", async () => {
    const before = probeRuns("probe hello");
    for (const answer of [{ type: "response", args: "Not now, thanks." }, { type: "ignore", args: null }]) {
      const { threadId } = await paused();
      await sdk.runs.wait(threadId, "agent", { command: { resume: [answer] } });
      assert.equal(probeRuns("probe hello"), before, `${answer.type}: the tool did not run`);
      assert.notEqual((await sdk.threads.get(threadId)).status, "interrupted");
    }
  });
});
