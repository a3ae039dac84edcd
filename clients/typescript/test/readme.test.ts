/**
 * The README's TypeScript examples compile against the built package, and the driver's
 * default permissions say what policy/driver.toml's profile grants.
 */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import ts from "typescript";

import { DRIVER_TOML_PERMISSIONS } from "../dist/index.js";
import { PACKAGE, driverPolicy } from "./daemon.js";

describe("the README and the example policy", () => {
  it("has TypeScript examples that compile against dist/", () => {
    const readme = readFileSync(join(PACKAGE, "README.md"), "utf8");
    const blocks = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)]
      .map((m) => m[1] as string)
      .filter((code) => code.includes('from "@airlock/client"'));
    assert.ok(blocks.length >= 2, "the gateway and the driver examples");
    const dir = mkdtempSync(join(tmpdir(), "airlock-ts-readme-"));
    try {
      const files = blocks.map((code, i) => {
        const file = join(dir, `example${i}.mts`);
        writeFileSync(file, code);
        return file;
      });
      const program = ts.createProgram(files, {
        noEmit: true,
        strict: true,
        target: ts.ScriptTarget.ES2022,
        module: ts.ModuleKind.Node16,
        moduleResolution: ts.ModuleResolutionKind.Node16,
        types: ["node"],
        typeRoots: [join(PACKAGE, "node_modules", "@types")],
        paths: { "@airlock/client": [join(PACKAGE, "dist", "index.d.ts")] },
      });
      const diagnostics = ts.getPreEmitDiagnostics(program);
      const host = ts.createCompilerHost({});
      assert.equal(diagnostics.length, 0, ts.formatDiagnostics(diagnostics, host));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("reports driver.toml's profile as the driver's default permissions", () => {
    const policy = driverPolicy();
    const profile = /\[profiles\.node\]([\s\S]*?)\n\[/.exec(policy)?.[1] ?? "";
    const list = (key: string) => {
      const line = new RegExp(`^${key} = \\[(.*)\\]$`, "m").exec(profile)?.[1] ?? "";
      return [...line.matchAll(/"([^"]+)"/g)].map((m) => m[1]);
    };
    const fs = DRIVER_TOML_PERMISSIONS.fs;
    assert.ok(fs);
    assert.deepEqual(fs.read, [...list("read"), ...list("read_optional")]);
    assert.deepEqual(fs.write, list("write"));
    assert.match(profile, /^network = "none"$/m);
    assert.equal(DRIVER_TOML_PERMISSIONS.network, false);
    assert.match(policy, /^permissions = \["fs:read", "subprocess"\]/m);
    assert.equal(DRIVER_TOML_PERMISSIONS.subprocess, true);
  });
});
