// docs/sdk.md shows the example file itself: the two stay the same.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";

test("docs/sdk.md's example is examples/chat.js (without its header comment)", async () => {
  const doc = await readFile(new URL("../../../docs/sdk.md", import.meta.url), "utf8");
  const block = doc.match(/```js\n([\s\S]*?)```/);
  assert.ok(block, "docs/sdk.md has a js code block");
  const file = await readFile(new URL("../examples/chat.js", import.meta.url), "utf8");
  const code = file.split("\n").filter((l, i) => !(i < 2 && l.startsWith("//"))).join("\n");
  assert.equal(block[1], code);
});
