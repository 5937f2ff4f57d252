//! [`EngineBuilder`]: the one place an engine is chosen and configured (backend,
//! adapter, prefill chunk), used by [`crate::session::Session`], every CLI
//! command and the tools, so every setting reaches the engine that runs.

use crate::cpu::{CpuBatch, CpuEngine};
use crate::engine::precision::Precision;
use crate::engine::{BatchEngine, Engine};
use crate::error::{Error, Result};
use crate::gpu::{list_adapters, GpuBatch, GpuEngine, GpuOptions};
use crate::model::weights::Model;
use std::sync::Arc;

/// Which engine to build.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The CPU reference engine.
    Cpu,
    /// The GPU engine on the chosen adapter (a software one too); fails without one.
    Gpu(GpuOptions),
    /// A hardware GPU when wgpu finds one (or the adapter named in the options or
    /// `CQLM_ADAPTER`); else the CPU engine, with a notice saying why
    /// ([`BuiltEngine::notice`]). Software adapters (wgpu's `DeviceType::Cpu`:
    /// llvmpipe/lavapipe, WARP, SwiftShader) run far slower than the CPU engine,
    /// so auto never picks them; `Gpu` does.
    Auto(GpuOptions),
}

/// A built engine of a concrete type (profiling and parity need it).
#[derive(Debug)]
pub enum AnyEngine {
    /// The CPU engine.
    Cpu(Box<CpuEngine>),
    /// The GPU engine.
    Gpu(Box<GpuEngine>),
}

impl AnyEngine {
    /// The engine behind the trait.
    pub fn as_dyn(&mut self) -> &mut dyn Engine {
        match self {
            AnyEngine::Cpu(e) => e.as_mut(),
            AnyEngine::Gpu(e) => e.as_mut(),
        }
    }

    /// The engine as a trait object.
    pub fn into_dyn(self) -> Box<dyn Engine> {
        match self {
            AnyEngine::Cpu(e) => e,
            AnyEngine::Gpu(e) => e,
        }
    }
}

/// What [`EngineBuilder::build_any`] built, and why, when auto chose the CPU.
#[derive(Debug)]
pub struct BuiltEngine {
    /// The engine.
    pub engine: AnyEngine,
    /// Why [`Backend::Auto`] runs on the CPU (one line, for stderr), if it does.
    pub notice: Option<String>,
}

/// Builds a batch engine (the first of a server, or one after a failure).
pub type BatchFactory = Arc<dyn Fn() -> Result<Box<dyn BatchEngine>> + Send + Sync>;

/// What [`EngineBuilder::build_batch`] built: a batch engine, a factory of more
/// like it (on the same device), and why auto chose the CPU, if it did.
pub struct BuiltBatch {
    /// The batch engine.
    pub batch: Box<dyn BatchEngine>,
    /// Builds another batch engine of the same backend, slots and precision
    /// (on the GPU: on the same device).
    pub factory: BatchFactory,
    /// Why [`Backend::Auto`] runs on the CPU (one line, for stderr), if it does.
    pub notice: Option<String>,
}

impl std::fmt::Debug for BuiltBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltBatch")
            .field("batch", &self.batch.describe())
            .field("notice", &self.notice)
            .finish_non_exhaustive()
    }
}

/// Builds an engine for a model: backend and its options, then [`EngineBuilder::build`].
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    model: Arc<Model>,
    backend: Backend,
    prefill_chunk: Option<usize>,
    /// The precision asked for, and the one a CPU engine gets when none is.
    precision: Option<Precision>,
    default_precision: Precision,
}

impl EngineBuilder {
    /// A builder for `model` on [`Backend::Auto`] with default options.
    pub fn new(model: Arc<Model>) -> EngineBuilder {
        EngineBuilder {
            model,
            backend: Backend::Auto(GpuOptions::default()),
            prefill_chunk: None,
            precision: None,
            default_precision: Precision::Exact,
        }
    }

    /// The model the engine will run.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Run on `backend`.
    pub fn backend(mut self, backend: Backend) -> EngineBuilder {
        self.backend = backend;
        self
    }

    /// Prompt tokens per prefill chunk (`None`: each engine's default; 1: one
    /// step per token; the GPU clamps to its token slots). The logits are the
    /// same for every value, bit for bit.
    pub fn prefill_chunk(mut self, n: Option<usize>) -> EngineBuilder {
        self.prefill_chunk = n;
        self
    }

    /// Run the CQ matvecs in `precision` (SPEC §6.1). The GPU engine is exact:
    /// asking it for [`Precision::Fast`] builds it exact with a notice saying so.
    pub fn precision(mut self, precision: Precision) -> EngineBuilder {
        self.precision = Some(precision);
        self
    }

    /// The precision of a CPU engine when [`EngineBuilder::precision`] was not
    /// called (default exact; the CLI's `generate` and `bench` use fast). A GPU
    /// engine stays exact without a notice.
    pub fn default_precision(mut self, precision: Precision) -> EngineBuilder {
        self.default_precision = precision;
        self
    }

    /// Build the engine behind the [`Engine`] trait, with the auto notice.
    ///
    /// # Errors
    /// As [`EngineBuilder::build_any`].
    pub fn build(self) -> Result<(Box<dyn Engine>, Option<String>)> {
        let b = self.build_any()?;
        Ok((b.engine.into_dyn(), b.notice))
    }

    /// Build the engine, keeping its concrete type.
    ///
    /// # Errors
    /// [`Error::Gpu`] for [`Backend::Gpu`] without a usable adapter (and for
    /// [`Backend::Auto`] with a named adapter that fails); allocation errors.
    pub fn build_any(self) -> Result<BuiltEngine> {
        let chunk = self.prefill_chunk;
        let precision = self.precision.unwrap_or(self.default_precision);
        let fast_asked = self.precision == Some(Precision::Fast);
        let cpu = |model: Arc<Model>, notice: Option<String>| -> Result<BuiltEngine> {
            let mut e = CpuEngine::new(model)?;
            if let Some(n) = chunk {
                e.set_prefill_chunk(n);
            }
            e.set_precision(precision);
            Ok(BuiltEngine {
                engine: AnyEngine::Cpu(Box::new(e)),
                notice,
            })
        };
        let gpu = |model: Arc<Model>, opts: &GpuOptions| -> Result<BuiltEngine> {
            let mut e = GpuEngine::new(model, opts)?;
            if let Some(n) = chunk {
                e.set_prefill_chunk(n);
            }
            let notice = fast_asked.then(|| FAST_ON_GPU.to_string());
            Ok(BuiltEngine {
                engine: AnyEngine::Gpu(Box::new(e)),
                notice,
            })
        };
        self.choose(cpu, gpu)
    }
}

impl EngineBuilder {
    /// Build a batch engine of `slots` sequences ([`BatchEngine`]: what the
    /// server steps) on the backend [`EngineBuilder::build`] would choose, with
    /// the same notice, and a factory of more like it. The prefill chunk does not
    /// apply: a batch feeds its items' ids in passes of its own.
    ///
    /// # Errors
    /// As [`EngineBuilder::build_any`]; [`Error::Gpu`] when the device cannot
    /// hold `slots` sequences.
    pub fn build_batch(self, slots: usize) -> Result<BuiltBatch> {
        let precision = self.precision.unwrap_or(self.default_precision);
        let fast_asked = self.precision == Some(Precision::Fast);
        let cpu = |model: Arc<Model>, notice: Option<String>| -> Result<BuiltBatch> {
            let factory: BatchFactory = Arc::new(move || {
                let b = CpuBatch::new(Arc::clone(&model), slots, precision)?;
                Ok(Box::new(b) as Box<dyn BatchEngine>)
            });
            Ok(BuiltBatch {
                batch: factory()?,
                factory,
                notice,
            })
        };
        let gpu = |model: Arc<Model>, opts: &GpuOptions| -> Result<BuiltBatch> {
            let ctx = GpuEngine::context_for(&model, opts)?;
            let factory: BatchFactory = Arc::new(move || {
                let b = GpuBatch::new(Arc::clone(&model), Arc::clone(&ctx), slots, None)?;
                Ok(Box::new(b) as Box<dyn BatchEngine>)
            });
            Ok(BuiltBatch {
                batch: factory()?,
                factory,
                notice: fast_asked.then(|| FAST_ON_GPU.to_string()),
            })
        };
        self.choose(cpu, gpu)
    }
}

impl EngineBuilder {
    /// Run `cpu` (with auto's notice, if any) or `gpu` as the backend says:
    /// auto takes a hardware GPU, else the CPU, and falls back to the CPU when
    /// the GPU fails unless an adapter was named.
    fn choose<T>(
        self,
        cpu: impl FnOnce(Arc<Model>, Option<String>) -> Result<T>,
        gpu: impl FnOnce(Arc<Model>, &GpuOptions) -> Result<T>,
    ) -> Result<T> {
        match &self.backend {
            Backend::Cpu => cpu(self.model, None),
            Backend::Gpu(opts) => gpu(self.model, opts),
            Backend::Auto(opts) => {
                if let Some(why) = auto_prefers_cpu(opts) {
                    return cpu(self.model, Some(why));
                }
                match gpu(Arc::clone(&self.model), opts) {
                    Err(Error::Gpu(why)) if !names_adapter(opts) => cpu(
                        self.model,
                        Some(format!("using the cpu backend: the GPU failed ({why})")),
                    ),
                    other => other,
                }
            }
        }
    }
}

/// The notice of a GPU engine asked for fast precision.
const FAST_ON_GPU: &str =
    "the gpu engine computes exact arithmetic: fast precision (SPEC §6.1) is the cpu engine's";

/// Whether the options (or `CQLM_ADAPTER`) name an adapter: auto then runs on it.
fn names_adapter(opts: &GpuOptions) -> bool {
    opts.adapter.is_some() || std::env::var("CQLM_ADAPTER").is_ok_and(|s| !s.is_empty())
}

/// Why auto should run on the CPU without trying a GPU: no adapter, or only
/// software ones (unless one is named).
fn auto_prefers_cpu(opts: &GpuOptions) -> Option<String> {
    if names_adapter(opts) {
        return None;
    }
    let adapters = list_adapters();
    if adapters.is_empty() {
        return Some("using the cpu backend: wgpu finds no GPU adapter".into());
    }
    if adapters
        .iter()
        .all(|a| a.device_type == wgpu::DeviceType::Cpu)
    {
        // "llvmpipe (LLVM 15.0.6, 256 bits)" -> "llvmpipe".
        let mut names: Vec<&str> = adapters
            .iter()
            .map(|a| a.name.split(" (").next().unwrap_or(&a.name))
            .collect();
        names.dedup();
        return Some(format!(
            "using the cpu backend: the only GPU adapter ({}) is a software renderer; \
             --backend gpu forces it",
            names.join(", ")
        ));
    }
    None
}
