/**
 * The types of src/protocol.ts against the daemon's JSON Schema
 * (supervisor/src/daemon/protocol.schema.json), so neither can change without the other.
 *
 * The TypeScript compiler reads protocol.ts; for every interface, `SCHEMA_OF` names the schema
 * object it mirrors, and the test checks, both ways: the same property names; a property is
 * optional in TypeScript exactly when the schema does not require it; each property's JSON
 * types (string, number, boolean, null, array, object, any) and literal members (enums,
 * consts) are the same; and a property whose type is another interface of the file points
 * at that interface's schema object. Every exported interface must be in `SCHEMA_OF`.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import ts from "typescript";

import { SCHEMA_OF } from "../dist/index.js";
import { PACKAGE, REPO } from "./daemon.js";

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Node = { [key: string]: Json };

const SCHEMA_PATH = join(REPO, "supervisor", "src", "daemon", "protocol.schema.json");
const PROTOCOL_TS = join(PACKAGE, "src", "protocol.ts");

function loadSchema(): Node {
  return JSON.parse(readFileSync(SCHEMA_PATH, "utf8")) as Node;
}

/** The node at a JSON pointer. */
function at(schema: Node, pointer: string): Node {
  let node: Json = schema;
  for (const raw of pointer.split("/").slice(1)) {
    const key = raw.replace(/~1/g, "/").replace(/~0/g, "~");
    if (node === null || typeof node !== "object") {
      throw new Error(`${pointer}: nothing at ${key}`);
    }
    node = Array.isArray(node) ? (node[Number(key)] as Json) : (node[key] as Json);
    if (node === undefined) {
      throw new Error(`${pointer}: no ${key}`);
    }
  }
  return node as Node;
}

/** Follows `$ref`s (local ones) to the node they name; returns the node and its pointer. */
function deref(schema: Node, node: Node, pointer: string): { node: Node; pointer: string } {
  let seen = 0;
  while (typeof node["$ref"] === "string" && Object.keys(node).every((k) => k === "$ref" || k === "description")) {
    pointer = (node["$ref"] as string).replace(/^#/, "");
    node = at(schema, pointer);
    if (++seen > 32) throw new Error(`$ref loop at ${pointer}`);
  }
  return { node, pointer };
}

interface ObjectShape {
  properties: Map<string, { node: Node; pointer: string }>;
  required: Set<string>;
}

/** An object schema's properties and required names, with those of a `$ref` beside them merged in. */
function objectShape(schema: Node, node: Node, pointer: string): ObjectShape {
  const shape: ObjectShape = { properties: new Map(), required: new Set() };
  if (typeof node["$ref"] === "string") {
    const target = (node["$ref"] as string).replace(/^#/, "");
    const inner = objectShape(schema, at(schema, target), target);
    inner.properties.forEach((v, k) => shape.properties.set(k, v));
    inner.required.forEach((r) => shape.required.add(r));
  }
  const properties = (node["properties"] ?? {}) as Node;
  for (const [name, value] of Object.entries(properties)) {
    shape.properties.set(name, { node: value as Node, pointer: `${pointer}/properties/${name}` });
  }
  for (const name of (node["required"] ?? []) as string[]) {
    shape.required.add(name);
  }
  return shape;
}

/**
 * A schema's JSON types and literals: "string", "number", "boolean", "null", "array",
 * "object", "any", or a literal as JSON text. Also the pointers of object subschemas, for
 * linking properties to interfaces.
 */
function schemaKinds(schema: Node, start: Node, startPointer: string): { kinds: Set<string>; objects: string[] } {
  const kinds = new Set<string>();
  const objects: string[] = [];
  const visit = (raw: Node, rawPointer: string) => {
    const { node, pointer } = deref(schema, raw, rawPointer);
    if ("const" in node) {
      kinds.add(JSON.stringify(node["const"]));
      return;
    }
    if (Array.isArray(node["enum"])) {
      for (const v of node["enum"]) kinds.add(v === null ? "null" : JSON.stringify(v));
      return;
    }
    if (Array.isArray(node["oneOf"]) && !("type" in node)) {
      node["oneOf"].forEach((branch, i) => visit(branch as Node, `${pointer}/oneOf/${i}`));
      return;
    }
    if (typeof node["$ref"] === "string" && !("type" in node)) {
      const target = (node["$ref"] as string).replace(/^#/, "");
      visit(at(schema, target), target);
      return;
    }
    const type = node["type"];
    if (type === undefined) {
      kinds.add("any");
      return;
    }
    for (const t of Array.isArray(type) ? type : [type]) {
      kinds.add(t === "integer" ? "number" : String(t));
      if (t === "object") objects.push(pointer);
      if (t === "array" && node["items"] && typeof node["items"] === "object") {
        const items = deref(schema, node["items"] as Node, `${pointer}/items`);
        if (items.node["type"] === "object" || items.node["properties"]) objects.push(items.pointer);
      }
    }
  };
  visit(start, startPointer);
  return { kinds, objects };
}

/** The same for a TypeScript type; `interfaces` gets the names of interfaces met. */
function tsKinds(checker: ts.TypeChecker, type: ts.Type, interfaces: string[]): Set<string> {
  const kinds = new Set<string>();
  const visit = (t: ts.Type) => {
    if (t.flags & (ts.TypeFlags.Any | ts.TypeFlags.Unknown)) {
      kinds.add("any");
    } else if (t.isUnion()) {
      t.types.forEach(visit);
    } else if (t.isStringLiteral()) {
      kinds.add(JSON.stringify(t.value));
    } else if (t.isNumberLiteral()) {
      kinds.add(JSON.stringify(t.value));
    } else if (t.flags & ts.TypeFlags.BooleanLiteral) {
      kinds.add(checker.typeToString(t));
    } else if (t.flags & ts.TypeFlags.String) {
      kinds.add("string");
    } else if (t.flags & ts.TypeFlags.Number) {
      kinds.add("number");
    } else if (t.flags & ts.TypeFlags.Null) {
      kinds.add("null");
    } else if (t.flags & ts.TypeFlags.Undefined) {
      // an optional property's `| undefined`: optionality is checked on its own
    } else if (checker.isArrayType(t) || checker.isTupleType(t)) {
      kinds.add("array");
      const element = checker.getTypeArguments(t as ts.TypeReference)[0];
      const name = element?.getSymbol()?.getName();
      if (element && element.getSymbol()?.flags && element.getSymbol()!.flags & ts.SymbolFlags.Interface && name) {
        interfaces.push(name);
      }
    } else if (t.flags & ts.TypeFlags.Object) {
      kinds.add("object");
      const symbol = t.getSymbol();
      if (symbol && symbol.flags & ts.SymbolFlags.Interface) interfaces.push(symbol.getName());
    } else {
      kinds.add(`unsupported:${checker.typeToString(t)}`);
    }
  };
  visit(type);
  if (kinds.has("true") && kinds.has("false")) {
    kinds.delete("true");
    kinds.delete("false");
    kinds.add("boolean");
  }
  return kinds;
}

const show = (s: Set<string>) => [...s].sort().join(" | ");

/** Every difference between protocol.ts and `schema`. */
function compare(schema: Node): string[] {
  const program = ts.createProgram([PROTOCOL_TS], {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.Node16,
    moduleResolution: ts.ModuleResolutionKind.Node16,
    types: [],
  });
  const checker = program.getTypeChecker();
  const source = program.getSourceFile(PROTOCOL_TS);
  assert.ok(source, "protocol.ts is readable");
  const diagnostics = ts.getPreEmitDiagnostics(program, source);
  assert.equal(diagnostics.length, 0, ts.formatDiagnostics(diagnostics, ts.createCompilerHost({})));
  const moduleSymbol = checker.getSymbolAtLocation(source);
  assert.ok(moduleSymbol);
  const exported = new Map(checker.getExportsOfModule(moduleSymbol).map((s) => [s.getName(), s]));
  const table = SCHEMA_OF as Record<string, string>;
  const problems: string[] = [];

  for (const symbol of exported.values()) {
    if (symbol.flags & ts.SymbolFlags.Interface && !(symbol.getName() in table)) {
      problems.push(`interface ${symbol.getName()} has no entry in SCHEMA_OF`);
    }
  }

  for (const [name, pointer] of Object.entries(table)) {
    const symbol = exported.get(name);
    if (!symbol) {
      problems.push(`SCHEMA_OF names ${name}, which protocol.ts does not export`);
      continue;
    }
    let node: Node;
    try {
      node = at(schema, pointer);
    } catch (error) {
      problems.push(`${name}: ${(error as Error).message}`);
      continue;
    }
    const type = checker.getDeclaredTypeOfSymbol(symbol);
    if (!(symbol.flags & ts.SymbolFlags.Interface)) {
      // A type alias: a union of literals or JSON types.
      const want = schemaKinds(schema, node, pointer).kinds;
      const have = tsKinds(checker, type, []);
      if (show(want) !== show(have)) {
        problems.push(`${name}: TypeScript has ${show(have)}, the schema ${show(want)}`);
      }
      continue;
    }
    const shape = objectShape(schema, node, pointer);
    const declared = new Map(checker.getPropertiesOfType(type).map((p) => [p.getName(), p]));
    for (const property of shape.properties.keys()) {
      if (!declared.has(property)) problems.push(`${name}.${property} is in the schema but not declared`);
    }
    for (const [property, propertySymbol] of declared) {
      const entry = shape.properties.get(property);
      if (!entry) {
        problems.push(`${name}.${property} is declared but not in the schema (${pointer})`);
        continue;
      }
      const optional = (propertySymbol.flags & ts.SymbolFlags.Optional) !== 0;
      if (optional === shape.required.has(property)) {
        problems.push(
          `${name}.${property} is ${optional ? "optional" : "required"} in TypeScript but ` +
            `${shape.required.has(property) ? "required" : "not required"} in the schema`,
        );
      }
      const interfaces: string[] = [];
      const declaration = propertySymbol.valueDeclaration ?? propertySymbol.declarations?.[0];
      assert.ok(declaration);
      const have = tsKinds(checker, checker.getTypeOfSymbolAtLocation(propertySymbol, declaration), interfaces);
      const { kinds: want, objects } = schemaKinds(schema, entry.node, entry.pointer);
      if (show(want) !== show(have)) {
        problems.push(`${name}.${property}: TypeScript has ${show(have)}, the schema ${show(want)}`);
      }
      for (const inner of interfaces) {
        const innerPointer = table[inner];
        if (innerPointer === undefined) {
          problems.push(`${name}.${property} uses interface ${inner}, which has no entry in SCHEMA_OF`);
        } else if (!objects.includes(innerPointer)) {
          problems.push(
            `${name}.${property} is ${inner} (${innerPointer}) but the schema describes it at ${objects.join(", ") || entry.pointer}`,
          );
        }
      }
    }
  }
  return problems;
}

describe("protocol.ts against protocol.schema.json", () => {
  it("declares exactly the schema's objects, fields, optionality, types and enums", () => {
    assert.deepEqual(compare(loadSchema()), []);
  });

  it("covers every error kind, the tool result and every op's answer", () => {
    const table = SCHEMA_OF as Record<string, string>;
    const schema = loadSchema();
    const answers = Object.keys(at(schema, "/$defs/answers/properties"));
    // Each op's answer is modelled (call, propose and execute answer tool results).
    for (const op of answers) {
      const covered =
        ["call", "propose", "execute"].includes(op) ||
        Object.values(table).includes(`/$defs/answers/properties/${op}/properties/result`);
      assert.ok(covered, `the answer of ${op} has no interface`);
    }
    assert.equal(table["ErrorKind"], "/$defs/error_kind");
    assert.equal(table["ToolResult"], "/$defs/tool_result");
  });

  it("notices drift: a field the daemon adds, drops, or makes optional", () => {
    const added = loadSchema();
    (at(added, "/$defs/tool_result/properties") as Node)["new_field"] = { type: "string" };
    assert.ok(compare(added).some((p) => p.includes("ToolResult.new_field is in the schema but not declared")));

    const dropped = loadSchema();
    delete (at(dropped, "/$defs/tool_result/properties") as Node)["duration_ms"];
    assert.ok(compare(dropped).some((p) => p.includes("ToolResult.duration_ms is declared but not in the schema")));

    const optional = loadSchema();
    const required = at(optional, "/$defs/approval")["required"] as string[];
    required.splice(required.indexOf("session"), 1);
    assert.ok(compare(optional).some((p) => p.includes("Approval.session is required in TypeScript")));

    const kinds = loadSchema();
    (at(kinds, "/$defs/error_kind")["enum"] as string[]).push("brand_new_kind");
    assert.ok(compare(kinds).some((p) => p.startsWith("ErrorKind:")));

    const retyped = loadSchema();
    (at(retyped, "/$defs/tool_result/properties/exit_code") as Node)["type"] = "string";
    assert.ok(compare(retyped).some((p) => p.startsWith("ToolResult.exit_code:")));
  });
});
