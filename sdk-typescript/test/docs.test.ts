// docs/sdk.md's table names TypeScript methods that exist (the Python test
// sdk-python/tests/test_sdk_docs.py checks the rows and the Python ones).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import * as sdk from "@sandgate/sdk";

import { REPO_ROOT } from "./helpers.js";

describe("docs/sdk.md", () => {
  it("names only TypeScript methods that exist", () => {
    const doc = readFileSync(join(REPO_ROOT, "docs", "sdk.md"), "utf8");
    const section = doc.split("## Every operation of the REST API")[1]?.split("\n## ")[0] ?? "";
    const rows = section.split("\n").filter((l) => l.startsWith("| `"));
    assert.ok(rows.length > 40);
    const owners: Record<string, object> = {
      c: sdk.SandboxClient.prototype,
      session: sdk.Session.prototype,
    };
    let seen = 0;
    for (const row of rows) {
      const cells = row.trim().replace(/^\||\|$/g, "").split(" | ").map((c) => c.trim());
      assert.equal(cells.length, 4, row);
      const ts = cells[3] ?? "";
      assert.ok(ts, `an empty TypeScript cell: ${row}`);
      for (const m of ts.matchAll(/`(?:await |for await \(const \w+ of )?(c|session)\.(\w+)\(/g)) {
        const [, owner, name] = m;
        assert.equal(typeof (owners[owner!] as Record<string, unknown>)[name!], "function", `docs/sdk.md names ${owner}.${name} (${cells[0]})`);
        seen++;
      }
      for (const m of ts.matchAll(/`(\w+)\(\{/g)) {
        assert.equal(typeof (sdk as Record<string, unknown>)[m[1]!], "function", `docs/sdk.md names ${m[1]} (${cells[0]})`);
      }
    }
    assert.ok(seen > 40, `only ${seen} methods found`);
  });
});
