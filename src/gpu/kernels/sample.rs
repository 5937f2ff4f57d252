//! Greedy sampling on the device (shaders/sample.wgsl): the GPU twin of
//! [`crate::sample::argmax`] plus a non-finite flag, so a greedy decode step reads
//! back 8 bytes instead of `vocab` floats.

use crate::gpu::{Dispatch, GpuContext, Kernel};
use bytemuck::{Pod, Zeroable};

/// The WGSL source of the family.
pub const SOURCE: &str = include_str!("../../../shaders/sample.wgsl");

/// Mirror of WGSL `ArgmaxParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq)]
pub struct ArgmaxParams {
    /// Logits to scan.
    pub n: u32,
    /// Element offset of the first logit.
    pub off: u32,
    /// Padding to 16 bytes.
    pub _pad: [u32; 2],
}

/// The compiled pipeline of the family.
#[derive(Debug, Clone)]
pub struct SampleKernels {
    argmax: Kernel,
}

impl SampleKernels {
    /// Compile the entry point.
    pub fn new(ctx: &GpuContext) -> SampleKernels {
        SampleKernels {
            argmax: Kernel::new(ctx, SOURCE, "sample", "argmax", 0, &[]),
        }
    }

    /// One workgroup: `out[0]` = argmax of `logits[off .. off + n]` (lowest index of
    /// the maximum), `out[1]` = 1 if any of them is NaN or infinite. `out` holds 2 u32.
    pub fn argmax(
        &self,
        ctx: &GpuContext,
        p: &ArgmaxParams,
        logits: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Dispatch {
        let ub = ctx.uniform_init("argmax params", bytemuck::bytes_of(p));
        Dispatch::new(ctx, &self.argmax, &[&ub, logits, out], [1, 1, 1])
            .with_bytes(p.n as u64 * 4 + 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn wgsl_validates_and_params_match() {
        let m = validate_wgsl(SOURCE).unwrap_or_else(|e| panic!("sample.wgsl: {e}"));
        assert_eq!(
            wgsl_struct_size(&m, "ArgmaxParams"),
            Some(std::mem::size_of::<ArgmaxParams>() as u32)
        );
    }
}
