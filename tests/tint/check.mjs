// Tint, the WGSL compiler of Chrome's WebGPU (Dawn), on cqlm's shader modules:
//
//     node tests/tint/check.mjs LIST.json [--expect-failure]
//
// LIST.json is an array of {name, entry, constants, source, pipeline}. Each
// source (with `enable subgroups;` put first when it calls a subgroup builtin:
// naga does not take the directive, Tint requires it) is compiled by Dawn on
// its Null backend (no GPU needed) on a device at WebGPU's default limits;
// when `pipeline` is true its entry point is also made into a compute pipeline
// with its override constants, so a kernel over the default limits (16,384
// bytes of workgroup memory, 256 invocations) fails. Prints one line per
// module and exits 1 when any fails (with --expect-failure: when any passes,
// for fixtures that must be rejected). NODE_PATH must find the npm `webgpu`
// package (dawn.node).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const require = createRequire(import.meta.url);
const { create, globals } = require("webgpu");
Object.assign(globalThis, globals);

const [list, flag] = process.argv.slice(2);
const expectFailure = flag === "--expect-failure";
const modules = JSON.parse(readFileSync(list, "utf8"));

const gpu = create(["backend=null"]);
const adapter = await gpu.requestAdapter();
if (!adapter) {
  console.error("error: Dawn's Null adapter is not available");
  process.exit(2);
}
const features = adapter.features.has("subgroups") ? ["subgroups"] : [];
const device = await adapter.requestDevice({ requiredFeatures: features });

const SUBGROUP = /\bsubgroup[A-Z]\w*\s*\(|@builtin\(\s*subgroup_/;
let failed = 0;
let passed = 0;
for (const m of modules) {
  const code = SUBGROUP.test(m.source) ? `enable subgroups;\n${m.source}` : m.source;
  const what = `${m.name} (${m.entry}${m.pipeline ? ", pipeline" : ""})`;
  device.pushErrorScope("validation");
  const module = device.createShaderModule({ code });
  const info = await module.getCompilationInfo();
  const errors = info.messages.filter((x) => x.type === "error");
  let why = errors.map((e) => `${e.lineNum}:${e.linePos} ${e.message}`).join("; ");
  if (!why && m.pipeline) {
    const constants = Object.fromEntries(m.constants);
    device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: m.entry, constants } });
  }
  const err = await device.popErrorScope();
  if (!why && err) why = err.message.split("\n").filter((l) => l.trim()).slice(0, 3).join(" ");
  if (why) {
    failed += 1;
    console.log(`rejected ${what}: ${why}`);
  } else {
    passed += 1;
    console.log(`ok ${what}`);
  }
}
console.log(`${passed} accepted, ${failed} rejected`);
device.destroy();
const bad = expectFailure ? passed > 0 : failed > 0;
process.exit(bad ? 1 : 0);
