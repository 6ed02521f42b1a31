// client.assistants: the assistants are the server's registered graphs (one system
// assistant per graph, addressed by graph id or by its UUID); the calls that would
// create or change one are refused with a 405 that says so.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { OTHER_KEY, client, refused } from "./helpers.mjs";

const sdk = client();
const GRAPHS = ["agent", "chat", "nested", "ticker"]; // tests/serving/test_js_sdk.py registers these
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

describe("assistants", () => {
  test("get by graph id and by assistant id", async () => {
    const chat = await sdk.assistants.get("chat");
    assert.equal(chat.graph_id, "chat");
    assert.match(chat.assistant_id, UUID);
    assert.equal(typeof chat.version, "number");
    const again = await sdk.assistants.get(chat.assistant_id);
    assert.deepEqual(again, chat);
    const detail = await refused(sdk.assistants.get("no-such-graph"), 404);
    assert.match(detail, /no-such-graph/);
  });

  test("search and count: every graph the tenant may use, with filters and paging", async () => {
    const all = await sdk.assistants.search({ limit: 100 });
    assert.deepEqual(all.map((a) => a.graph_id).sort(), GRAPHS);
    assert.equal(await sdk.assistants.count(), GRAPHS.length);

    const [chat] = await sdk.assistants.search({ graphId: "chat" });
    assert.equal(chat.graph_id, "chat");
    assert.equal(await sdk.assistants.count({ graphId: "chat" }), 1);
    assert.equal(await sdk.assistants.count({ graphId: "no-such-graph" }), 0);
    assert.deepEqual(await sdk.assistants.search({ graphId: "no-such-graph" }), []);

    const page1 = await sdk.assistants.search({ limit: 2, offset: 0 });
    const page2 = await sdk.assistants.search({ limit: 2, offset: 2 });
    assert.equal(page1.length, 2);
    assert.equal(page2.length, 2);
    assert.deepEqual(
      [...page1, ...page2].map((a) => a.assistant_id).sort(),
      all.map((a) => a.assistant_id).sort(),
    );
    const byMetadata = await sdk.assistants.search({ metadata: chat.metadata, graphId: "chat" });
    assert.deepEqual(byMetadata.map((a) => a.graph_id), ["chat"]);
  });

  test("another tenant sees only its own graphs", async () => {
    const other = client(OTHER_KEY);
    const theirs = await other.assistants.search({ limit: 100 });
    assert.deepEqual(theirs.map((a) => a.graph_id).sort(), ["chat", "ticker"]);
    assert.equal(await other.assistants.count(), 2);
    assert.equal(await other.assistants.count({ graphId: "agent" }), 0);
    const detail = await refused(other.assistants.get("agent"), 403);
    assert.match(detail, /agent/);
  });

  test("getGraph: the graph's nodes and edges, with xray for subgraphs", async () => {
    const graph = await sdk.assistants.getGraph("chat");
    const ids = graph.nodes.map((n) => n.id);
    assert.ok(ids.includes("__start__") && ids.includes("call_model") && ids.includes("__end__"), JSON.stringify(ids));
    const edges = graph.edges.map((e) => `${e.source}->${e.target}`).sort();
    assert.deepEqual(edges, ["__start__->call_model", "call_model->__end__"]);

    const flat = await sdk.assistants.getGraph("nested");
    assert.ok(flat.nodes.some((n) => n.id === "inner"), JSON.stringify(flat.nodes));
    const xray = await sdk.assistants.getGraph("nested", { xray: true });
    const xrayIds = xray.nodes.map((n) => n.id);
    assert.ok(xrayIds.some((id) => id.endsWith("draft")), `xray shows the subgraph's nodes: ${xrayIds}`);
    assert.ok(xrayIds.some((id) => id.endsWith("review")), `xray shows the subgraph's nodes: ${xrayIds}`);
    await refused(sdk.assistants.getGraph("no-such-graph"), 404);
  });

  test("getSchemas: input, output, state and config schemas", async () => {
    const schemas = await sdk.assistants.getSchemas("chat");
    assert.equal(schemas.graph_id, "chat");
    for (const name of ["input_schema", "output_schema", "state_schema", "config_schema"]) {
      assert.ok(name in schemas, `${name} in ${Object.keys(schemas)}`);
    }
    assert.ok("messages" in schemas.state_schema.properties, JSON.stringify(schemas.state_schema));
    assert.ok("messages" in schemas.input_schema.properties, JSON.stringify(schemas.input_schema));
    const ticker = await sdk.assistants.getSchemas("ticker");
    assert.ok("ticks" in ticker.state_schema.properties, JSON.stringify(ticker.state_schema));
    await refused(sdk.assistants.getSchemas("no-such-graph"), 404);
  });

  test("getSubgraphs: the nested graph's subgraph by namespace", async () => {
    const subgraphs = await sdk.assistants.getSubgraphs("nested");
    assert.deepEqual(Object.keys(subgraphs), ["inner"]);
    assert.ok("messages" in subgraphs.inner.state_schema.properties, JSON.stringify(subgraphs.inner));
    const one = await sdk.assistants.getSubgraphs("nested", { namespace: "inner" });
    assert.deepEqual(Object.keys(one), ["inner"]);
    const recursed = await sdk.assistants.getSubgraphs("nested", { recurse: true });
    assert.ok("inner" in recursed);
    assert.deepEqual(await sdk.assistants.getSubgraphs("chat"), {});
  });

  describe("writes are refused: assistants are the registered graphs", () => {
    const says = (detail) =>
      assert.match(detail, /regist/i, `the 405 says assistants are the registered graphs: ${detail}`);
    test("create", async () => says(await refused(sdk.assistants.create({ graphId: "chat", name: "mine" }), 405)));
    test("update", async () => says(await refused(sdk.assistants.update("chat", { name: "renamed" }), 405)));
    test("delete", async () => says(await refused(sdk.assistants.delete("chat"), 405)));
    test("nothing changed", async () => {
      assert.equal((await sdk.assistants.get("chat")).name, "chat");
      assert.equal(await sdk.assistants.count(), GRAPHS.length);
    });
  });

  // Reads of the versions work: each assistant has one version, 1, the latest.
  test("getVersions: the one version", async () => {
    const chat = await sdk.assistants.get("chat");
    const versions = await sdk.assistants.getVersions("chat");
    assert.deepEqual(versions.map((v) => [v.assistant_id, v.version]), [[chat.assistant_id, 1]]);
    assert.deepEqual(await sdk.assistants.getVersions("chat", { metadata: { created_by: "nobody" } }), []);
    await refused(sdk.assistants.getVersions("no-such-graph"), 404);
  });

  test("setLatest: version 1 is the latest already; there is no other", async () => {
    const chat = await sdk.assistants.get("chat");
    assert.deepEqual(await sdk.assistants.setLatest("chat", 1), chat);
    const detail = await refused(sdk.assistants.setLatest("chat", 2), 404);
    assert.match(detail, /version 2/);
    assert.equal((await sdk.assistants.get("chat")).version, 1);
  });
});
