//! The core of every GPU kernel family: the compute-kernel wrapper ([`Kernel`])
//! and the prebuilt [`Dispatch`] it makes, with buffer creation and readback.

use super::context::GpuContext;
use crate::error::{Error, Result};

/// Usage of storage buffers: read/write in shaders, copy in and out.
pub const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::COPY_SRC);

impl GpuContext {
    /// A storage buffer holding `data` (at least 4 bytes, so empty inputs still bind).
    /// On a lost device the buffer is invalid and the failure is recorded, so the
    /// next [`GpuContext::check_errors`] reports it (no panic).
    pub fn storage_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        self.buffer_init(label, data, STORAGE)
    }

    /// A buffer of `usage` holding `data`, padded to whole 4-byte words (at least one).
    fn buffer_init(&self, label: &str, data: &[u8], usage: wgpu::BufferUsages) -> wgpu::Buffer {
        let size = (data.len() as u64).max(4).div_ceil(4) * 4;
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: true,
        });
        match buf.get_mapped_range_mut(..) {
            // A buffer mapped at creation starts zeroed, so the padding is 0.
            Ok(mut view) => view.slice(..data.len()).copy_from_slice(data),
            Err(e) => self.record_error(format!("cannot fill buffer `{label}`: {e:?}")),
        }
        buf.unmap();
        buf
    }
    /// A zero-filled storage buffer of `bytes` bytes (rounded up to 4, at least 4).
    ///
    /// # Errors
    /// [`Error::Gpu`] if it exceeds the device's buffer size limit.
    pub fn storage_zeroed(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        let size = bytes.max(4).div_ceil(4) * 4;
        let limit = self.caps.max_buffer.min(self.caps.max_storage_binding);
        if size > limit {
            return Err(Error::Gpu(format!(
                "buffer `{label}` needs {size} bytes, over the device's storage binding limit of {limit} bytes"
            )));
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: STORAGE,
            mapped_at_creation: false,
        }))
    }

    /// A uniform buffer holding `data` (failures as for [`GpuContext::storage_init`]).
    pub fn uniform_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        self.buffer_init(
            label,
            data,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        )
    }

    /// Block until the queue is idle, turning a lost device into an error.
    ///
    /// # Errors
    /// [`Error::Gpu`] if polling fails (device lost, timeout): the device's own
    /// error when it reported one (a loss names what it was running).
    pub fn wait_idle(&self) -> Result<()> {
        if let Err(e) = self.device.poll(wgpu::PollType::wait_indefinitely()) {
            self.check_errors()?;
            return Err(Error::Gpu(format!("waiting for the GPU failed: {e}")));
        }
        self.errors.set_in_flight(None);
        self.check_errors()
    }

    /// Copy `bytes` bytes of `buf` from `offset` back to the host (one staging buffer, `map_async`).
    ///
    /// # Errors
    /// [`Error::Gpu`] if mapping fails or the device is lost.
    pub fn read_bytes(&self, buf: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("cqlm readback"),
            size: bytes.max(4).div_ceil(4) * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, bytes.div_ceil(4) * 4);
        self.queue.submit([enc.finish()]);
        self.map_read(&staging, bytes)
    }

    /// Map a `MAP_READ` buffer, copy out its first `bytes` bytes and unmap it.
    ///
    /// # Errors
    /// [`Error::Gpu`] if mapping fails or the device is lost.
    pub fn map_read(&self, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let mut out = vec![0u8; bytes as usize];
        self.map_read_into(staging, &mut out)?;
        Ok(out)
    }

    /// Map a `MAP_READ` buffer and copy its first `out.len()` bytes into `out`
    /// (no allocation), then unmap it.
    ///
    /// # Errors
    /// [`Error::Gpu`] if mapping fails or the device is lost.
    pub fn map_read_into(&self, staging: &wgpu::Buffer, out: &mut [u8]) -> Result<()> {
        let (tx, rx) = futures_intrusive::channel::shared::oneshot_channel();
        let len = (out.len() as u64).max(4).div_ceil(4) * 4;
        staging.map_async(wgpu::MapMode::Read, ..len, move |r| {
            let _ = tx.send(r);
        });
        self.wait_idle()?;
        match pollster::block_on(rx.receive()) {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(Error::Gpu(format!("cannot map the readback buffer: {e}"))),
            None => return Err(Error::Gpu("the readback was dropped (device lost?)".into())),
        }
        {
            let view = staging
                .get_mapped_range(..len)
                .map_err(|e| Error::Gpu(format!("cannot read the readback buffer: {e:?}")))?;
            out.copy_from_slice(&view[..out.len()]);
        }
        staging.unmap();
        self.read_back
            .fetch_add(out.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Bytes copied back from the device to the host so far, by every engine
    /// and batch on this context (each mapped readback counts its bytes).
    pub fn bytes_read_back(&self) -> u64 {
        self.read_back.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Read `n` f32 values of `buf` starting at element `first`.
    ///
    /// # Errors
    /// As [`GpuContext::read_bytes`].
    pub fn read_f32(&self, buf: &wgpu::Buffer, first: u64, n: usize) -> Result<Vec<f32>> {
        let b = self.read_bytes(buf, first * 4, n as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }
}

/// What [`Kernel::new`] compiles in place of an entry point over the device's
/// workgroup memory limit (an error is recorded instead; it never runs usefully).
const PLACEHOLDER: &str = "@compute @workgroup_size(1) fn placeholder() {}";

impl GpuContext {
    /// Whether `entry` of `source` fits this device's workgroup memory limit, for
    /// choosing a smaller variant before [`Kernel::new`] would fail. A source that
    /// does not validate counts as fitting (its compile error is reported then).
    pub fn fits_workgroup_storage(&self, source: &str, entry: &str) -> bool {
        Kernel::workgroup_bytes(source, entry)
            .map_or(true, |b| b <= self.caps.max_workgroup_storage)
    }
}

/// One compute entry point with its auto-derived bind group layout (group 0).
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The pipeline.
    pub pipeline: wgpu::ComputePipeline,
    /// Its bind group layout (group 0).
    pub layout: wgpu::BindGroupLayout,
    /// Entry point name, for labels and profiles.
    pub name: &'static str,
    /// First binding number of the entry point (entry points of one file use disjoint ranges).
    pub base: u32,
}

impl Kernel {
    /// Compile `entry` of the WGSL `source` (bindings from `base` on) with
    /// pipeline-overridable `constants`.
    ///
    /// The entry point's static workgroup memory ([`Kernel::workgroup_bytes`]) is
    /// checked against the device's `max_compute_workgroup_storage_size`
    /// ([`crate::gpu::Capabilities::max_workgroup_storage`]) first. Over it, no
    /// driver ever sees the shader: the error (naming the kernel, its bytes and
    /// the limit) is recorded on `ctx`, so the next [`GpuContext::check_errors`]
    /// (engine construction ends with one) returns it as [`Error::Gpu`], and the
    /// kernel returned is a placeholder whose dispatches never run. Family code
    /// that has a smaller variant asks [`GpuContext::fits_workgroup_storage`] first.
    pub fn new(
        ctx: &GpuContext,
        source: &str,
        name: &'static str,
        entry: &str,
        base: u32,
        constants: &[(&str, f64)],
    ) -> Kernel {
        let limit = ctx.caps.max_workgroup_storage;
        let (source, entry, constants): (&str, &str, &[(&str, f64)]) =
            match Self::workgroup_bytes(source, entry) {
                Ok(bytes) if bytes > limit => {
                    ctx.record_error(format!(
                        "kernel `{name}` (entry point `{entry}`) needs {bytes} bytes of workgroup \
                         memory, over the adapter's limit of {limit} bytes \
                         (max_compute_workgroup_storage_size) on `{}`",
                        ctx.info.name
                    ));
                    (PLACEHOLDER, "placeholder", &[])
                }
                // A source naga rejects is reported by wgpu below, as every shader error is.
                _ => {
                    ctx.record_pipeline(name, source, entry, constants);
                    (source, entry, constants)
                }
            };
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        let layout = pipeline.get_bind_group_layout(0);
        Kernel {
            pipeline,
            layout,
            name,
            base,
        }
    }

    /// Static workgroup memory of `entry` in `source`, in bytes, as WebGPU counts
    /// it ([`crate::gpu::shader_check::workgroup_bytes`]); cached per source and
    /// entry point, so each is parsed once per process.
    ///
    /// # Errors
    /// [`Error::Gpu`] with naga's message if the source does not validate or has
    /// no such entry point.
    pub fn workgroup_bytes(source: &str, entry: &str) -> Result<u32> {
        use std::collections::HashMap;
        use std::hash::{Hash, Hasher};
        use std::sync::{Mutex, OnceLock};
        static CACHE: OnceLock<Mutex<HashMap<(u64, String), u32>>> = OnceLock::new();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        source.hash(&mut h);
        let key = (h.finish(), entry.to_string());
        let cache = CACHE.get_or_init(Default::default);
        if let Some(&b) = cache.lock().ok().as_ref().and_then(|c| c.get(&key)) {
            return Ok(b);
        }
        let bytes = super::shader_check::workgroup_bytes(source, entry)
            .map_err(|e| Error::Gpu(format!("entry point `{entry}`: {e}")))?;
        if let Ok(mut c) = cache.lock() {
            c.insert(key, bytes);
        }
        Ok(bytes)
    }

    /// A bind group of whole buffers, bound at bindings `base..base + buffers.len()` in order.
    pub fn bind(&self, ctx: &GpuContext, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let at: Vec<(u32, &wgpu::Buffer)> = (0u32..).zip(buffers.iter().copied()).collect();
        self.bind_at(ctx, &at)
    }

    /// A bind group of whole buffers at explicit bindings `base + i` (for entry
    /// points that use only some of their family's bindings).
    pub fn bind_at(&self, ctx: &GpuContext, buffers: &[(u32, &wgpu::Buffer)]) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .map(|&(i, b)| wgpu::BindGroupEntry {
                binding: self.base + i,
                resource: b.as_entire_binding(),
            })
            .collect();
        ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(self.name),
            layout: &self.layout,
            entries: &entries,
        })
    }
}

/// A recorded dispatch: kernel, bind group and workgroup counts, replayed every step.
#[derive(Debug, Clone)]
pub struct Dispatch {
    /// Which kernel (for profiling labels).
    pub name: &'static str,
    /// The pipeline.
    pub pipeline: wgpu::ComputePipeline,
    /// Its bindings.
    pub bind_group: wgpu::BindGroup,
    /// Workgroups in x, y, z.
    pub groups: [u32; 3],
    /// Estimated bytes this dispatch reads and writes (weights, activations, cache), for profiles.
    pub bytes: u64,
    /// The bind group's layout and `(binding, buffer)` entries, to rebind (see
    /// [`Dispatch::rebound`]).
    layout: wgpu::BindGroupLayout,
    entries: Vec<(u32, wgpu::Buffer)>,
}

/// A window of a buffer that replaces the whole buffer in [`Dispatch::rebound`].
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// The buffer a dispatch binds whole.
    pub buffer: &'a wgpu::Buffer,
    /// First byte of the window (a multiple of the device's
    /// `min_storage_buffer_offset_alignment`).
    pub offset: u64,
    /// Bytes in the window.
    pub size: u64,
}

impl Dispatch {
    /// Build a dispatch from a kernel and its buffers.
    pub fn new(
        ctx: &GpuContext,
        k: &Kernel,
        buffers: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> Dispatch {
        let at: Vec<(u32, &wgpu::Buffer)> = (0u32..).zip(buffers.iter().copied()).collect();
        Self::new_at(ctx, k, &at, groups)
    }

    /// [`Dispatch::new`] with explicit bindings (see [`Kernel::bind_at`]).
    pub fn new_at(
        ctx: &GpuContext,
        k: &Kernel,
        buffers: &[(u32, &wgpu::Buffer)],
        groups: [u32; 3],
    ) -> Dispatch {
        Dispatch {
            name: k.name,
            pipeline: k.pipeline.clone(),
            bind_group: k.bind_at(ctx, buffers),
            groups,
            bytes: 0,
            layout: k.layout.clone(),
            entries: buffers
                .iter()
                .map(|&(i, b)| (k.base + i, b.clone()))
                .collect(),
        }
    }

    /// The same dispatch with every binding of a buffer named in `windows` bound
    /// to that window instead of the whole buffer: the kernel's offsets then count
    /// from the window's start. This is how one token step's dispatches are
    /// replayed for each token slot of a prefill chunk.
    pub fn rebound(&self, ctx: &GpuContext, windows: &[Window<'_>]) -> Dispatch {
        let entries: Vec<wgpu::BindGroupEntry> = self
            .entries
            .iter()
            .map(|(binding, b)| {
                let resource = match windows.iter().find(|w| w.buffer == b) {
                    Some(w) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: b,
                        offset: w.offset,
                        size: wgpu::BufferSize::new(w.size),
                    }),
                    None => b.as_entire_binding(),
                };
                wgpu::BindGroupEntry {
                    binding: *binding,
                    resource,
                }
            })
            .collect();
        let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(self.name),
            layout: &self.layout,
            entries: &entries,
        });
        Dispatch {
            bind_group,
            ..self.clone()
        }
    }

    /// The same dispatch with a byte estimate for profiles.
    pub fn with_bytes(mut self, bytes: u64) -> Dispatch {
        self.bytes = bytes;
        self
    }

    /// This dispatch of token slot 0 (slot = workgroup y, at the strides its
    /// params carry) over slots `0..n`: `n` workgroup rows, `n` times the bytes.
    /// The kernels whose docs say so run each slot as if alone.
    pub fn over_slots(mut self, n: usize) -> Dispatch {
        self.groups[1] = n.max(1) as u32;
        self.bytes *= n.max(1) as u64;
        self
    }

    /// Record into a compute pass.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.groups[0], self.groups[1], self.groups[2]);
    }
}

/// Run dispatches in one encoder and one submit, then wait (used by tests and one-off work).
///
/// # Errors
/// [`Error::Gpu`] if the device is lost.
pub fn run_dispatches(ctx: &GpuContext, dispatches: &[Dispatch]) -> Result<()> {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("cqlm"),
            timestamp_writes: None,
        });
        for d in dispatches {
            d.record(&mut pass);
        }
    }
    ctx.queue.submit([enc.finish()]);
    ctx.wait_idle()
}

/// Split `n` workgroups into an `[x, y, 1]` grid with `x <= max_per_dim`.
pub fn grid(n: u32, max_per_dim: u32) -> [u32; 3] {
    if n <= max_per_dim {
        [n.max(1), 1, 1]
    } else {
        [max_per_dim, n.div_ceil(max_per_dim), 1]
    }
}
