// client.store: items by namespace and key, search, namespaces; each tenant has a
// store of its own (the same namespace and key under two keys are two items).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { OTHER_KEY, client, refused, tag } from "./helpers.mjs";

const sdk = client();
const other = client(OTHER_KEY);
const ISO = /^\d{4}-\d{2}-\d{2}T/;

describe("store", () => {
  test("putItem, getItem, overwrite, deleteItem", async () => {
    const ns = ["users", tag(), "prefs"];
    assert.equal(await sdk.store.putItem(ns, "theme", { color: "dark", size: 2 }), undefined);
    const item = await sdk.store.getItem(ns, "theme");
    assert.deepEqual(item.namespace, ns);
    assert.equal(item.key, "theme");
    assert.deepEqual(item.value, { color: "dark", size: 2 });
    assert.match(item.createdAt, ISO);
    assert.match(item.updatedAt, ISO);

    await sdk.store.putItem(ns, "theme", { color: "light" });
    const changed = await sdk.store.getItem(ns, "theme");
    assert.deepEqual(changed.value, { color: "light" });
    assert.equal(changed.createdAt, item.createdAt);
    assert.ok(changed.updatedAt >= item.updatedAt);

    assert.equal(await sdk.store.deleteItem(ns, "theme"), undefined);
    assert.equal(await sdk.store.getItem(ns, "theme"), null);
    assert.equal(await sdk.store.getItem(ns, "never-written"), null);
    await sdk.store.deleteItem(ns, "theme"); // deleting what is not there is not an error
  });

  test("searchItems: by namespace prefix, filter, limit and offset", async () => {
    const root = tag();
    for (let n = 0; n < 5; n += 1) {
      await sdk.store.putItem([root, "notes"], `note-${n}`, { n, even: n % 2 === 0 });
    }
    await sdk.store.putItem([root, "other"], "x", { n: 99, even: false });

    const { items } = await sdk.store.searchItems([root, "notes"], { limit: 100 });
    assert.deepEqual(items.map((i) => i.key).sort(), ["note-0", "note-1", "note-2", "note-3", "note-4"]);
    assert.ok(items.every((i) => i.namespace.join("/") === `${root}/notes` && ISO.test(i.createdAt)));

    const all = await sdk.store.searchItems([root], { limit: 100 });
    assert.equal(all.items.length, 6);
    const even = await sdk.store.searchItems([root], { filter: { even: true }, limit: 100 });
    assert.deepEqual(even.items.map((i) => i.value.n).sort(), [0, 2, 4]);
    const first = await sdk.store.searchItems([root, "notes"], { limit: 2, offset: 0 });
    const rest = await sdk.store.searchItems([root, "notes"], { limit: 10, offset: 2 });
    assert.equal(first.items.length, 2);
    assert.equal(rest.items.length, 3);
    assert.deepEqual(
      [...first.items, ...rest.items].map((i) => i.key).sort(),
      items.map((i) => i.key).sort(),
    );
    assert.deepEqual((await sdk.store.searchItems([tag()])).items, []);
  });

  test("listNamespaces: prefix, suffix, maxDepth", async () => {
    const root = tag();
    await sdk.store.putItem([root, "a", "x"], "k", { v: 1 });
    await sdk.store.putItem([root, "a", "y"], "k", { v: 2 });
    await sdk.store.putItem([root, "b"], "k", { v: 3 });

    const { namespaces } = await sdk.store.listNamespaces({ prefix: [root] });
    assert.deepEqual(namespaces.map((n) => n.join("/")).sort(), [`${root}/a/x`, `${root}/a/y`, `${root}/b`]);
    const shallow = await sdk.store.listNamespaces({ prefix: [root], maxDepth: 2 });
    assert.deepEqual(shallow.namespaces.map((n) => n.join("/")).sort(), [`${root}/a`, `${root}/b`]);
    const endingY = await sdk.store.listNamespaces({ prefix: [root], suffix: ["y"] });
    assert.deepEqual(endingY.namespaces, [[root, "a", "y"]]);
    const one = await sdk.store.listNamespaces({ prefix: [root], limit: 1 });
    assert.equal(one.namespaces.length, 1);
  });

  test("tenants: the same namespace and key under two keys are two items", async () => {
    const ns = ["shared", tag()];
    await sdk.store.putItem(ns, "k", { owner: "acme" });
    assert.equal(await other.store.getItem(ns, "k"), null);
    assert.deepEqual((await other.store.searchItems(ns)).items, []);
    assert.deepEqual((await other.store.listNamespaces({ prefix: ns })).namespaces, []);

    await other.store.putItem(ns, "k", { owner: "globex" });
    assert.deepEqual((await sdk.store.getItem(ns, "k")).value, { owner: "acme" });
    assert.deepEqual((await other.store.getItem(ns, "k")).value, { owner: "globex" });
    await other.store.deleteItem(ns, "k");
    assert.deepEqual((await sdk.store.getItem(ns, "k")).value, { owner: "acme" }, "the other tenant's delete is its own");
    assert.equal(await other.store.getItem(ns, "k"), null);
  });

  test("bad input is a 4xx naming the field", async () => {
    const detail = await refused(sdk.store.putItem([], "k", { v: 1 }), [400, 422]);
    assert.match(detail, /namespace/);
    const notObject = await refused(
      sdk.store.putItem(["ok"], "k", "a string, not an object"),
      [400, 422],
    );
    assert.match(notObject, /value/);
  });
});
