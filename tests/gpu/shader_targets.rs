//! Every pipeline the engine compiles runs wherever WebGPU runs:
//!
//! - each one (module, entry point and the override constants the engine
//!   passed; collected from [`GpuContext::pipelines`] of engines built for
//!   both programs, both matvec layouts, with and without subgroups) is
//!   translated by naga to SPIR-V 1.3 (Vulkan), MSL 2.1 (Metal), HLSL SM 6.0
//!   (DX12 with DXC) and GLSL ES 3.10 (GL), and `spirv-val` and
//!   `glslangValidator` check the SPIR-V and GLSL (when installed; required
//!   with `CQLM_REQUIRE_SHADER_TOOLS`, which `.ci/run` sets); a module broken
//!   on purpose fails the same path;
//! - Tint, the WGSL compiler of Chrome's WebGPU (npm `webgpu`, Dawn on its
//!   Null backend, `tests/tint/check.mjs`), compiles every module, and makes a
//!   pipeline at WebGPU's default limits of each one an engine built within
//!   those limits compiles; the fixtures it must reject (an out-of-range
//!   literal, a barrier in non-uniform control flow) are rejected. Runs when
//!   `CQLM_TINT_NODE_PATH` names a `node_modules` holding `webgpu`; required
//!   with `CQLM_REQUIRE_TINT` (`.ci/run`).

use crate::common::gpu::gpu;
use cqlm::cq::BitsPlan;
use cqlm::gpu::{DeviceLimits, GpuBatch, GpuContext, GpuOptions, PipelineSource, ProgramKind};
use cqlm::make::synth::synth_model;
use cqlm::{Config, Model};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn models() -> Vec<Arc<Model>> {
    let engram = Config::preset_tiny();
    let plain = Config {
        engram: None,
        ..Config::preset_tiny()
    };
    // Every bit width appears in the mixed plan.
    vec![
        Arc::new(synth_model(&engram, &BitsPlan::mixed(), 5).unwrap()),
        Arc::new(synth_model(&plain, &BitsPlan::mixed(), 6).unwrap()),
    ]
}

/// The pipelines of engines of both programs built on a context opened with
/// `opts` (None without an adapter).
fn pipelines_on(opts: &GpuOptions) -> Option<(Arc<GpuContext>, Vec<PipelineSource>)> {
    gpu()?;
    let ctx = GpuContext::new(opts, 1 << 20).unwrap();
    for model in models() {
        for program in [ProgramKind::Standard, ProgramKind::Lean] {
            GpuBatch::new(Arc::clone(&model), Arc::clone(&ctx), 2, Some(program)).unwrap();
        }
    }
    let all = ctx.pipelines();
    Some((ctx, all))
}

/// Every pipeline of every engine variant this adapter can build, the
/// 128-invocation variants of WebGPU's compatibility limits included.
fn engine_pipelines() -> Option<Vec<PipelineSource>> {
    let mut all: Vec<PipelineSource> = Vec::new();
    let mut variants = Vec::new();
    for no_subgroups in [false, true] {
        for row_matvec in [false, true] {
            variants.push(GpuOptions {
                no_subgroups,
                row_matvec: Some(row_matvec),
                ..GpuOptions::default()
            });
        }
    }
    variants.push(compat());
    for opts in variants {
        for p in pipelines_on(&opts)?.1 {
            if !all.contains(&p) {
                all.push(p);
            }
        }
    }
    Some(all)
}

/// WebGPU's compatibility limits (128 invocations a workgroup).
fn compat() -> GpuOptions {
    GpuOptions {
        limits: DeviceLimits::Compat,
        ..GpuOptions::default()
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn out_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(name);
    let dir = std::env::var_os("CARGO_TARGET_DIR").map_or(dir, |t| PathBuf::from(t).join(name));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Shader code in each target language.
struct Translated {
    spirv: Vec<u32>,
    msl: String,
    hlsl: String,
    glsl: String,
}

/// `p` translated as wgpu's backends translate it: validated, its overrides
/// applied for its entry point alone, then written for each target.
fn translate(p: &PipelineSource) -> Result<Translated, String> {
    use naga::back::{glsl, hlsl, msl, spv};
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let module =
        naga::front::wgsl::parse_str(&p.source).map_err(|e| e.emit_to_string(&p.source))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::all())
        .validate(&module)
        .map_err(|e| format!("validate: {e:?}"))?;
    let constants: naga::back::PipelineConstants = p.constants.iter().cloned().collect();
    let stage = naga::ShaderStage::Compute;
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((stage, &p.entry)),
        &constants,
    )
    .map_err(|e| format!("overrides: {e:?}"))?;
    let spirv = spv::write_vec(
        &module,
        &info,
        &spv::Options {
            lang_version: (1, 3),
            ..spv::Options::default()
        },
        Some(&spv::PipelineOptions {
            shader_stage: stage,
            entry_point: p.entry.clone(),
        }),
    )
    .map_err(|e| format!("SPIR-V: {e:?}"))?;
    let (msl, _) = msl::write_string(
        &module,
        &info,
        &msl::Options {
            lang_version: (2, 1),
            fake_missing_bindings: true,
            ..msl::Options::default()
        },
        &msl::PipelineOptions {
            entry_point: Some((stage, p.entry.clone())),
            ..msl::PipelineOptions::default()
        },
    )
    .map_err(|e| format!("MSL: {e:?}"))?;
    let mut hlsl_text = String::new();
    let hlsl_opts = hlsl::Options {
        shader_model: hlsl::ShaderModel::V6_0,
        fake_missing_bindings: true,
        ..hlsl::Options::default()
    };
    let hlsl_pipe = hlsl::PipelineOptions {
        entry_point: Some((stage, p.entry.clone())),
    };
    hlsl::Writer::new(&mut hlsl_text, &hlsl_opts, &hlsl_pipe)
        .write(&module, &info, None)
        .map_err(|e| format!("HLSL: {e:?}"))?;
    // Bindings numbered per kind, as wgpu's GL backend numbers them.
    let mut binding_map = glsl::BindingMap::default();
    let (mut buffers, mut uniforms) = (0u8, 0u8);
    for (_, g) in module.global_variables.iter() {
        if let Some(rb) = g.binding {
            let n = match g.space {
                naga::AddressSpace::Uniform => &mut uniforms,
                _ => &mut buffers,
            };
            binding_map.insert(rb, *n);
            *n += 1;
        }
    }
    let mut glsl_text = String::new();
    let glsl_opts = glsl::Options {
        version: glsl::Version::Embedded {
            version: 310,
            is_webgl: false,
        },
        binding_map,
        ..glsl::Options::default()
    };
    let glsl_pipe = glsl::PipelineOptions {
        shader_stage: stage,
        entry_point: p.entry.clone(),
        multiview: None,
    };
    glsl::Writer::new(
        &mut glsl_text,
        &module,
        &info,
        &glsl_opts,
        &glsl_pipe,
        naga::proc::BoundsCheckPolicies::default(),
    )
    .and_then(|mut w| w.write())
    .map_err(|e| format!("GLSL: {e:?}"))?;
    Ok(Translated {
        spirv,
        msl,
        hlsl: hlsl_text,
        glsl: glsl_text,
    })
}

/// Run `tool args…`; None when it is not installed (an error then if
/// `CQLM_REQUIRE_SHADER_TOOLS` is set), else its failure output.
fn external(tool: &str, args: &[&str]) -> Option<Result<(), String>> {
    match Command::new(tool).args(args).output() {
        Ok(o) if o.status.success() => Some(Ok(())),
        Ok(o) => Some(Err(format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))),
        Err(_) => {
            assert!(
                !env_flag("CQLM_REQUIRE_SHADER_TOOLS"),
                "CQLM_REQUIRE_SHADER_TOOLS is set but `{tool}` does not run"
            );
            None
        }
    }
}

#[test]
fn every_pipeline_translates_to_every_shading_language() {
    let Some(all) = engine_pipelines() else {
        return;
    };
    assert!(all.len() >= 20, "only {} pipelines recorded", all.len());
    assert!(
        all.iter().any(|p| p.name.starts_with("matvec")),
        "no matvec recorded"
    );
    let dir = out_dir("shader-translations");
    let mut failures = Vec::new();
    for (i, p) in all.iter().enumerate() {
        let t = match translate(p) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{} ({}): {e}", p.name, p.entry));
                continue;
            }
        };
        assert!(
            t.msl.contains(&p.entry) && t.hlsl.contains(&p.entry),
            "{}",
            p.name
        );
        let stem = dir.join(format!("{i:02}-{}-{}", p.name, p.entry));
        let spv = stem.with_extension("spv");
        std::fs::write(&spv, bytemuck::cast_slice::<u32, u8>(&t.spirv)).unwrap();
        let comp = stem.with_extension("comp");
        std::fs::write(&comp, &t.glsl).unwrap();
        std::fs::write(stem.with_extension("metal"), &t.msl).unwrap();
        std::fs::write(stem.with_extension("hlsl"), &t.hlsl).unwrap();
        let spv = spv.to_str().unwrap();
        if let Some(Err(e)) = external("spirv-val", &["--target-env", "vulkan1.1", spv]) {
            failures.push(format!("{} ({}): spirv-val: {e}", p.name, p.entry));
        }
        if let Some(Err(e)) = external("glslangValidator", &["-S", "comp", comp.to_str().unwrap()])
        {
            failures.push(format!("{} ({}): glslangValidator: {e}", p.name, p.entry));
        }
    }
    eprintln!("{} pipelines translated into {}", all.len(), dir.display());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_broken_module_fails_the_translation() {
    let good = PipelineSource {
        name: "fixture",
        source: Arc::from(
            "@group(0) @binding(0) var<storage, read_write> o: array<f32>;\n\
             @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) i: vec3<u32>) \
             { o[i.x] = o[i.x] * 2.0; }",
        ),
        entry: "main".into(),
        constants: vec![],
    };
    assert!(translate(&good).is_ok());
    // An f32 stored into a u32 array: naga refuses it.
    let broken = PipelineSource {
        source: Arc::from(good.source.replace("array<f32>", "array<u32>")),
        ..good.clone()
    };
    let err = translate(&broken)
        .err()
        .expect("a broken module translated");
    assert!(err.contains("u32"), "{err}");
    // An override the module does not declare.
    let unknown = PipelineSource {
        constants: vec![("NOPE".into(), 1.0)],
        ..good
    };
    assert!(translate(&unknown).is_err());
}

/// Where npm's `webgpu` package is, or None (an error with `CQLM_REQUIRE_TINT`).
fn tint_node_path() -> Option<String> {
    let path = std::env::var("CQLM_TINT_NODE_PATH")
        .ok()
        .filter(|p| !p.is_empty());
    assert!(
        path.is_some() || !env_flag("CQLM_REQUIRE_TINT"),
        "CQLM_REQUIRE_TINT is set but CQLM_TINT_NODE_PATH names no node_modules with `webgpu`"
    );
    path
}

/// Run tests/tint/check.mjs on `modules`; (exit success, output).
fn tint(
    node_path: &str,
    modules: &serde_json::Value,
    name: &str,
    expect_failure: bool,
) -> (bool, String) {
    let list = out_dir("tint").join(format!("{name}.json"));
    std::fs::write(&list, modules.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tint/check.mjs");
    let mut cmd = Command::new("node");
    cmd.arg(script).arg(&list).env("NODE_PATH", node_path);
    if expect_failure {
        cmd.arg("--expect-failure");
    }
    let out = cmd
        .output()
        .expect("node runs (CQLM_TINT_NODE_PATH is set)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn as_json(p: &PipelineSource, pipeline: bool) -> serde_json::Value {
    serde_json::json!({
        "name": p.name, "entry": p.entry, "constants": p.constants,
        "source": &*p.source, "pipeline": pipeline,
    })
}

#[test]
fn tint_accepts_every_module_and_the_pipelines_of_webgpu_default_limits() {
    let Some(node_path) = tint_node_path() else {
        return;
    };
    let Some(all) = engine_pipelines() else {
        return;
    };
    // Engines built within WebGPU's default compute limits and within its
    // compatibility limits: their pipelines must be created at those limits too.
    let webgpu = GpuOptions {
        limits: DeviceLimits::WebGpu,
        ..GpuOptions::default()
    };
    let (_, mut small) = pipelines_on(&webgpu).unwrap();
    assert!(
        small.iter().any(|p| p.name.starts_with("matvec")),
        "no matvec at 16 KiB"
    );
    let (_, narrow) = pipelines_on(&compat()).unwrap();
    let wg128 = |p: &PipelineSource| p.constants.iter().any(|(k, v)| k == "WG" && *v == 128.0);
    assert!(
        narrow.iter().filter(|p| wg128(p)).count() >= 8,
        "the compatibility limits built too few 128-invocation kernels: {:?}",
        narrow
            .iter()
            .map(|p| (p.name, &p.constants))
            .collect::<Vec<_>>()
    );
    small.extend(narrow.into_iter().filter(|p| wg128(p)));
    let mut list: Vec<serde_json::Value> = small.iter().map(|p| as_json(p, true)).collect();
    list.extend(
        all.iter()
            .filter(|p| !small.contains(p))
            .map(|p| as_json(p, false)),
    );
    let (ok, out) = tint(&node_path, &serde_json::Value::Array(list), "engine", false);
    eprintln!("{out}");
    assert!(ok, "Tint rejected modules:\n{out}");
}

#[test]
fn tint_rejects_what_naga_lets_through() {
    let Some(node_path) = tint_node_path() else {
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tint/fixtures");
    let mut list = Vec::new();
    for name in ["out_of_range_literal", "nonuniform_barrier"] {
        let source = std::fs::read_to_string(dir.join(format!("{name}.wgsl"))).unwrap();
        // naga accepts it: only Tint stands between it and a browser.
        cqlm::gpu::shader_check::validate_wgsl(&source).unwrap();
        list.push(serde_json::json!({
            "name": name, "entry": "main", "constants": [], "source": source, "pipeline": true,
        }));
    }
    let (ok, out) = tint(
        &node_path,
        &serde_json::Value::Array(list),
        "fixtures",
        true,
    );
    assert!(ok, "Tint accepted a fixture it must reject:\n{out}");
    assert!(out.contains("cannot be represented as 'f32'"), "{out}");
    assert!(out.contains("uniform control flow"), "{out}");
}
