//! Instance, adapter and device setup (`pollster` blocks on wgpu's futures).

use super::device_errors::DeviceErrors;
use super::selftest::subgroup_layout_self_test;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Options for choosing a GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Pick the first adapter whose name contains this (case-insensitive);
    /// `None` falls back to the `CQLM_ADAPTER` environment variable, then to
    /// wgpu's high-performance choice.
    pub adapter: Option<String>,
    /// Don't enable subgroups even where the adapter has them (as `CQLM_NO_SUBGROUPS=1`).
    pub no_subgroups: bool,
    /// Treat the storage binding limit as at most this many bytes, as on a smaller
    /// adapter (tests use it to force weight splitting).
    pub max_storage_binding: Option<u64>,
    /// Which matvec kernel to use; `None` picks by adapter (one row per invocation
    /// on CPU adapters such as lavapipe, else 16 lanes per row), after the
    /// `CQLM_MATVEC` environment variable (`rows` or `lanes`).
    pub row_matvec: Option<bool>,
    /// Treat the adapter's workgroup memory limit
    /// (`max_compute_workgroup_storage_size`) as at most this many bytes, as on a
    /// smaller adapter; `None` falls back to the `CQLM_MAX_WORKGROUP_STORAGE`
    /// environment variable (bytes), then to the adapter's limit. A kernel that
    /// needs more makes engine construction fail with [`Error::Gpu`] naming it.
    pub max_workgroup_storage: Option<u32>,
    /// The limits the device is opened with: the adapter's own, or those of
    /// WebGPU or its compatibility mode, as a browser would give
    /// ([`DeviceLimits`]); [`DeviceLimits::Adapter`] falls back to
    /// `CQLM_GPU_LIMITS` (`adapter`, `webgpu` or `compat`). The kernels then
    /// take the variants that fit.
    pub limits: DeviceLimits,
    /// Make the subgroup layout self-test fail, to test the fallback to the
    /// portable kernels. Never use otherwise.
    #[doc(hidden)]
    pub fail_subgroup_self_test: bool,
}

/// Which limits a device is opened with ([`GpuOptions::limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceLimits {
    /// The adapter's own, so that no limit the kernels never use (a graphics
    /// one, say) refuses an adapter.
    #[default]
    Adapter,
    /// WebGPU's defaults (`wgpu::Limits::default()`): 16,384 bytes of
    /// workgroup memory, 256 invocations a workgroup, 8 storage buffers a
    /// stage, 128 MiB a storage binding (`CQLM_GPU_LIMITS=webgpu`).
    WebGpu,
    /// WebGPU's compatibility mode, which is also OpenGL ES 3.1's floor for
    /// compute: the WebGPU defaults with 128 invocations a workgroup and 128
    /// in x and y (`CQLM_GPU_LIMITS=compat`); the wide kernels then run their
    /// 128-invocation variants.
    Compat,
}

impl DeviceLimits {
    /// `opts` unless it is [`DeviceLimits::Adapter`], then `CQLM_GPU_LIMITS`.
    fn resolve(opts: DeviceLimits) -> Result<DeviceLimits> {
        if opts != DeviceLimits::Adapter {
            return Ok(opts);
        }
        match std::env::var("CQLM_GPU_LIMITS") {
            Err(_) => Ok(DeviceLimits::Adapter),
            Ok(v) => match v.to_ascii_lowercase().as_str() {
                "" | "adapter" => Ok(DeviceLimits::Adapter),
                "webgpu" => Ok(DeviceLimits::WebGpu),
                "compat" => Ok(DeviceLimits::Compat),
                _ => Err(Error::Gpu(format!(
                    "CQLM_GPU_LIMITS must be `adapter`, `webgpu` or `compat`, not `{v}`"
                ))),
            },
        }
    }

    /// The limits to open the device with, given the adapter's.
    fn limits(self, adapter: &wgpu::Limits) -> wgpu::Limits {
        match self {
            DeviceLimits::Adapter => adapter.clone(),
            DeviceLimits::WebGpu => wgpu::Limits::default(),
            DeviceLimits::Compat => wgpu::Limits {
                max_compute_invocations_per_workgroup: 128,
                max_compute_workgroup_size_x: 128,
                max_compute_workgroup_size_y: 128,
                ..wgpu::Limits::default()
            },
        }
    }
}

/// The compute limits cqlm's kernels need at least (the storage buffers of
/// `qk_attend`, the two uniforms of `layer_step`, one bind group, the 128
/// invocations of the narrow variants of the wide kernels); an adapter below
/// any of them is refused, naming it.
fn check_needed(name: &str, have: &wgpu::Limits) -> Result<()> {
    let needed: [(&str, u32, u32); 5] = [
        (
            "max_storage_buffers_per_shader_stage",
            have.max_storage_buffers_per_shader_stage,
            8,
        ),
        (
            "max_uniform_buffers_per_shader_stage",
            have.max_uniform_buffers_per_shader_stage,
            2,
        ),
        ("max_bind_groups", have.max_bind_groups, 1),
        (
            "max_compute_invocations_per_workgroup",
            have.max_compute_invocations_per_workgroup,
            128,
        ),
        (
            "max_compute_workgroup_size_x",
            have.max_compute_workgroup_size_x,
            128,
        ),
    ];
    for (limit, value, need) in needed {
        if value < need {
            return Err(Error::Gpu(format!(
                "adapter `{name}`: {limit} is {value}, cqlm needs {need}"
            )));
        }
    }
    Ok(())
}

/// What the device can do, as far as cqlm's kernels care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Subgroup operations are enabled (and not switched off by `CQLM_NO_SUBGROUPS=1`).
    pub subgroups: bool,
    /// The smallest subgroup size the adapter may run (0 without subgroups).
    pub subgroup_min: u32,
    /// The largest subgroup size the adapter may run (0 without subgroups).
    pub subgroup_max: u32,
    /// Timestamp queries inside compute passes are enabled.
    pub timestamps: bool,
    /// Largest storage binding in bytes.
    pub max_storage_binding: u64,
    /// Largest buffer in bytes.
    pub max_buffer: u64,
    /// Bytes of workgroup memory per workgroup (the adapter's
    /// `max_compute_workgroup_storage_size`, or less if [`GpuOptions::max_workgroup_storage`]
    /// / `CQLM_MAX_WORKGROUP_STORAGE` says so). Every pipeline is checked against it
    /// when it is built ([`crate::gpu::Kernel::new`]).
    pub max_workgroup_storage: u32,
    /// Largest workgroup count per dispatch dimension.
    pub max_workgroups_per_dim: u32,
    /// Alignment of uniform-buffer binding offsets.
    pub uniform_align: u32,
    /// Matvecs run one row per invocation (chosen for CPU adapters such as
    /// lavapipe, or forced by [`GpuOptions::row_matvec`] / `CQLM_MATVEC`).
    pub row_matvec: bool,
    /// Invocations of the MLP's one workgroup a token (shaders/mlp.wgsl's
    /// override `WG`): 64 on CPU adapters, where each barrier is a loop over the
    /// workgroup's subgroups (lavapipe: 1.6× faster than 256), 256 on GPUs;
    /// `CQLM_MLP_WORKGROUP` (64, 128 or 256) forces it; never above
    /// [`Capabilities::wide_workgroup`].
    pub mlp_workgroup: MlpWorkgroup,
    /// Invocations of the kernels that run one wide workgroup (`gather`,
    /// `gather_many`, `premix`, `route`, `engram_conv`, `argmax`, `topk`,
    /// `layer_step`; their WGSL override `WG`): 256, or 128 where the device
    /// allows fewer than 256 invocations or 256 in x (OpenGL ES 3.1's floor,
    /// WebGPU's compatibility mode). Both widths compute the same values but
    /// for the order of workgroup sums (the pre-mix's norms, the top-k's
    /// softmax denominator), which the CPU twins' tolerances cover.
    pub wide_workgroup: u32,
}

/// The widths the GPU MLP kernel is built at ([`Capabilities::mlp_workgroup`]):
/// powers of two within WebGPU's default 256 invocations a workgroup. Every
/// width computes the same arithmetic but for the order of the RMS sums' partials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpWorkgroup {
    /// 64 invocations (chosen on CPU adapters).
    W64,
    /// 128 invocations.
    W128,
    /// 256 invocations (chosen on GPUs).
    W256,
}

impl MlpWorkgroup {
    /// Every width, narrowest first.
    pub const ALL: [MlpWorkgroup; 3] = [MlpWorkgroup::W64, MlpWorkgroup::W128, MlpWorkgroup::W256];

    /// Invocations per workgroup.
    pub fn invocations(self) -> u32 {
        match self {
            MlpWorkgroup::W64 => 64,
            MlpWorkgroup::W128 => 128,
            MlpWorkgroup::W256 => 256,
        }
    }
}

/// A device and its queue, shared by the engines on it.
#[derive(Debug)]
pub struct GpuContext {
    /// The wgpu device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// The adapter's description.
    pub info: wgpu::AdapterInfo,
    /// Enabled capabilities.
    pub caps: Capabilities,
    /// Why subgroups are off although the adapter has them and nothing switched
    /// them off: the subgroup layout self-test at device open failed (see
    /// [`GpuContext::new`]); `None` otherwise.
    pub subgroup_fallback: Option<String>,
    /// The first wgpu error not caught by an error scope (validation, out of memory,
    /// device loss), kept here instead of wgpu's default panic.
    pub(crate) errors: Arc<DeviceErrors>,
    /// [`GpuContext::lose_device_after_next_submit_for_test`].
    pub(crate) lose_after_submit: std::sync::atomic::AtomicBool,
    /// Bytes mapped back to the host so far ([`GpuContext::bytes_read_back`]).
    pub(crate) read_back: std::sync::atomic::AtomicU64,
    /// Every pipeline compiled on this device ([`GpuContext::pipelines`]).
    pub(crate) pipelines: std::sync::Mutex<Vec<PipelineSource>>,
}

/// What one compute pipeline was compiled from: the WGSL module as the engine
/// assembled it, its entry point and its pipeline-overridable constants
/// (portability checks translate and compile exactly these).
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineSource {
    /// The kernel's name (labels and profiles).
    pub name: &'static str,
    /// The whole WGSL module.
    pub source: Arc<str>,
    /// The entry point.
    pub entry: String,
    /// Override constants, by name.
    pub constants: Vec<(String, f64)>,
}

/// Whether an environment switch like `CQLM_NO_SUBGROUPS` is set to a true value.
pub fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// Every adapter wgpu can see, in enumeration order.
pub fn list_adapters() -> Vec<wgpu::AdapterInfo> {
    let inst = instance();
    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()))
        .iter()
        .map(|a| a.get_info())
        .collect()
}

/// The adapter's type in words.
pub fn device_type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Cpu => "CPU (software)",
        wgpu::DeviceType::Other => "other",
    }
}

impl GpuContext {
    /// Open a device on the chosen adapter with the limits cqlm needs
    /// (`needed_storage_binding` bytes for the largest storage binding).
    ///
    /// # Errors
    /// [`Error::Gpu`] when no adapter exists, none matches the filter, or the
    /// adapter can't meet a needed limit (named in the message).
    pub fn new(opts: &GpuOptions, needed_storage_binding: u64) -> Result<Arc<GpuContext>> {
        let inst = instance();
        let filter = opts
            .adapter
            .clone()
            .or_else(|| std::env::var("CQLM_ADAPTER").ok().filter(|s| !s.is_empty()));
        let adapter = match &filter {
            Some(name) => {
                let all = pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()));
                let want = name.to_lowercase();
                let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
                all.into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&want))
                    .ok_or_else(|| {
                        Error::Gpu(format!(
                            "no GPU adapter matches `{name}` (available: {})",
                            if names.is_empty() {
                                "none".to_string()
                            } else {
                                names.join(", ")
                            }
                        ))
                    })?
            }
            None => pollster::block_on(inst.request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                ..Default::default()
            }))
            .map_err(|e| Error::Gpu(format!("no GPU adapter found: {e}")))?,
        };
        let info = adapter.get_info();
        let have = adapter.limits();
        let feats = adapter.features();
        if opts
            .max_storage_binding
            .unwrap_or(u64::MAX)
            .min(have.max_storage_buffer_binding_size)
            < needed_storage_binding.min(128 << 20)
        {
            return Err(Error::Gpu(format!(
                "adapter `{}`: max_storage_buffer_binding_size is {} bytes, cqlm needs {}",
                info.name,
                have.max_storage_buffer_binding_size,
                needed_storage_binding.min(128 << 20)
            )));
        }
        let base = DeviceLimits::resolve(opts.limits)?.limits(&have);
        check_needed(&info.name, &base)?;
        let wide_workgroup = if base
            .max_compute_invocations_per_workgroup
            .min(base.max_compute_workgroup_size_x)
            >= 256
        {
            256
        } else {
            128
        };
        let mut required_features = wgpu::Features::empty();
        let subgroups = feats.contains(wgpu::Features::SUBGROUP)
            && !opts.no_subgroups
            && !env_flag("CQLM_NO_SUBGROUPS");
        if subgroups {
            required_features |= wgpu::Features::SUBGROUP;
        }
        let ts = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let timestamps = feats.contains(ts) && !env_flag("CQLM_NO_TIMESTAMPS");
        if timestamps {
            required_features |= ts;
        }
        let workgroup_storage = match opts.max_workgroup_storage {
            Some(m) => Some(m),
            None => match std::env::var("CQLM_MAX_WORKGROUP_STORAGE") {
                Ok(v) if !v.is_empty() => Some(v.trim().parse::<u32>().map_err(|_| {
                    Error::Gpu(format!(
                        "CQLM_MAX_WORKGROUP_STORAGE must be a byte count, not `{v}`"
                    ))
                })?),
                _ => None,
            },
        }
        .map_or(base.max_compute_workgroup_storage_size, |m| {
            m.min(base.max_compute_workgroup_storage_size)
        });
        let required_limits = wgpu::Limits {
            max_compute_workgroup_storage_size: workgroup_storage,
            ..base
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("cqlm"),
            required_features,
            required_limits: required_limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| {
            Error::Gpu(format!(
                "adapter `{}`: cannot open a device: {e}",
                info.name
            ))
        })?;
        let mut caps = Capabilities {
            subgroups,
            subgroup_min: if subgroups { info.subgroup_min_size } else { 0 },
            subgroup_max: if subgroups { info.subgroup_max_size } else { 0 },
            timestamps,
            max_storage_binding: opts
                .max_storage_binding
                .map_or(required_limits.max_storage_buffer_binding_size, |m| {
                    m.min(required_limits.max_storage_buffer_binding_size)
                }),
            max_buffer: required_limits.max_buffer_size,
            max_workgroup_storage: required_limits.max_compute_workgroup_storage_size,
            max_workgroups_per_dim: required_limits.max_compute_workgroups_per_dimension,
            uniform_align: required_limits.min_uniform_buffer_offset_alignment,
            row_matvec: opts.row_matvec.unwrap_or_else(|| {
                match std::env::var("CQLM_MATVEC").as_deref() {
                    Ok("rows") => true,
                    Ok("lanes") => false,
                    _ => info.device_type == wgpu::DeviceType::Cpu,
                }
            }),
            mlp_workgroup: match std::env::var("CQLM_MLP_WORKGROUP").as_deref() {
                Ok("64") => MlpWorkgroup::W64,
                Ok("128") => MlpWorkgroup::W128,
                Ok("256") if wide_workgroup >= 256 => MlpWorkgroup::W256,
                _ if info.device_type == wgpu::DeviceType::Cpu => MlpWorkgroup::W64,
                _ if wide_workgroup >= 256 => MlpWorkgroup::W256,
                _ => MlpWorkgroup::W128,
            },
            wide_workgroup,
        };
        // Subgroup kernels assume subgroups are aligned runs of
        // local_invocation_index; no API guarantees it, so check before using them.
        let mut subgroup_fallback = None;
        if subgroups {
            let checked = if opts.fail_subgroup_self_test {
                Err("forced to fail (GpuOptions::fail_subgroup_self_test)".to_string())
            } else {
                subgroup_layout_self_test(&device, &queue, &caps)
            };
            if let Err(why) = checked {
                let msg = format!(
                    "adapter `{}`: subgroup layout self-test failed ({why}); running the \
                     portable kernels, as with CQLM_NO_SUBGROUPS=1",
                    info.name
                );
                log::warn!("{msg}");
                caps.subgroups = false;
                caps.subgroup_min = 0;
                caps.subgroup_max = 0;
                subgroup_fallback = Some(msg);
            }
        }
        log::info!("GPU: {} ({:?}), {:?}", info.name, info.backend, caps);
        let errors = Arc::new(DeviceErrors::default());
        let sink = Arc::clone(&errors);
        // Both are kept for check_errors, whose caller reports them once; the
        // log has them at debug level only (no second copy on a CLI's stderr).
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::debug!("wgpu: {e}");
            sink.record(&e.to_string());
        }));
        let lost = Arc::clone(&errors);
        device.set_device_lost_callback(move |reason, msg| {
            log::debug!("wgpu: device lost ({reason:?}): {msg}");
            lost.lost(reason, &msg);
        });
        Ok(Arc::new(GpuContext {
            device,
            queue,
            info,
            caps,
            subgroup_fallback,
            errors,
            lose_after_submit: std::sync::atomic::AtomicBool::new(false),
            read_back: std::sync::atomic::AtomicU64::new(0),
            pipelines: std::sync::Mutex::new(Vec::new()),
        }))
    }

    /// The first uncaptured wgpu error (validation, out of memory, internal) or
    /// device loss so far, if any, as an [`Error::Gpu`]. Errors are sticky: once
    /// one happened, the device's buffers may hold garbage, so every later call
    /// reports it again.
    ///
    /// # Errors
    /// [`Error::Gpu`] with wgpu's message once any error has happened on this device.
    pub fn check_errors(&self) -> Result<()> {
        match self.errors.first() {
            Some(msg) => Err(Error::Gpu(msg)),
            None => Ok(()),
        }
    }

    /// Every distinct pipeline compiled on this device so far (by source,
    /// entry point and constants), in compile order; a kernel over the
    /// device's workgroup memory limit is not compiled and not listed.
    pub fn pipelines(&self) -> Vec<PipelineSource> {
        self.pipelines.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Note that `entry` of `source` was compiled with `constants` ([`GpuContext::pipelines`]).
    pub(crate) fn record_pipeline(
        &self,
        name: &'static str,
        source: &str,
        entry: &str,
        constants: &[(&str, f64)],
    ) {
        let Ok(mut all) = self.pipelines.lock() else {
            return;
        };
        let constants: Vec<(String, f64)> =
            constants.iter().map(|&(k, v)| (k.to_string(), v)).collect();
        if all
            .iter()
            .any(|p| p.entry == entry && p.constants == constants && &*p.source == source)
        {
            return;
        }
        // Modules are shared by their entry points: keep one copy of each text.
        let text = all
            .iter()
            .find(|p| &*p.source == source)
            .map_or_else(|| Arc::from(source), |p| Arc::clone(&p.source));
        all.push(PipelineSource {
            name,
            source: text,
            entry: entry.to_string(),
            constants,
        });
    }

    /// Record an error found outside wgpu's error callbacks (the first one wins).
    /// It is logged at debug level only: [`GpuContext::check_errors`] hands it
    /// to the caller, which reports it once (the CLI's one `error:` line).
    pub(crate) fn record_error(&self, msg: String) {
        log::debug!("{msg}");
        self.errors.record(&msg);
    }

    /// Destroy the device, as a driver reset or an unplugged GPU would: every later
    /// step on this context returns [`Error::Gpu`]. For testing that device loss
    /// surfaces as an error, never use otherwise.
    #[doc(hidden)]
    pub fn lose_device_for_test(&self) {
        self.device.destroy();
    }

    /// Destroy the device right after the next submit is handed to the queue,
    /// as a driver reset during a step would. For testing only.
    #[doc(hidden)]
    pub fn lose_device_after_next_submit_for_test(&self) {
        self.lose_after_submit
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// `name (backend, type)` of the adapter.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {})",
            self.info.name,
            self.info.backend,
            device_type_name(self.info.device_type)
        )
    }
}
