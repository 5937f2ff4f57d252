//! CPU feature detection: the SIMD level ([`CpuSimd`]) the CPU paths run at, and
//! the x86-64 vector helpers they share. The bottom floor: this module imports
//! nothing from the crate.

use std::sync::OnceLock;

/// A SIMD level of this CPU: which vector code the CPU matvec, FWHT, `exp` and
/// attention use (named `CpuSimd` before; `gpu::kernels` and the CPU math of
/// `kernels/` are other things).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuSimd {
    /// The portable loops (byte lookup tables for 2 and 4 bits): the reference.
    Scalar,
    /// 8-lane AVX2 + FMA permute kernels.
    Avx2,
    /// 16-lane AVX-512F permute kernels (8-lane AVX2 where a group is too narrow).
    Avx512,
}

impl CpuSimd {
    /// Every variant this CPU can run, the scalar one first (detected once per process).
    pub fn available() -> &'static [CpuSimd] {
        static AVAIL: OnceLock<Vec<CpuSimd>> = OnceLock::new();
        AVAIL.get_or_init(|| {
            let mut v = vec![CpuSimd::Scalar];
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma");
                if avx2 {
                    v.push(CpuSimd::Avx2);
                    // F for the 16-lane float kernels, BW and VL for the
                    // byte and 256-bit forms beside them (every AVX-512 CPU
                    // since Skylake-X has the three).
                    if std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512bw")
                        && std::arch::is_x86_feature_detected!("avx512vl")
                    {
                        v.push(CpuSimd::Avx512);
                    }
                }
            }
            v
        })
    }

    /// The variant the engines use: the best available, unless the environment
    /// variable `CQLM_CPU_KERNELS` names one (`scalar`, `avx2`, `avx512`; a variant
    /// this CPU lacks falls back to the best it has). Decided once per process.
    pub fn selected() -> CpuSimd {
        static SEL: OnceLock<CpuSimd> = OnceLock::new();
        *SEL.get_or_init(|| {
            let avail = CpuSimd::available();
            let best = *avail.last().unwrap_or(&CpuSimd::Scalar);
            let want = match std::env::var("CQLM_CPU_KERNELS").as_deref() {
                Ok("scalar") => Some(CpuSimd::Scalar),
                Ok("avx2") => Some(CpuSimd::Avx2),
                Ok("avx512") => Some(CpuSimd::Avx512),
                _ => None,
            };
            match want {
                Some(w) if avail.contains(&w) => w,
                _ => best,
            }
        })
    }

    /// Lowercase name (`scalar`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            CpuSimd::Scalar => "scalar",
            CpuSimd::Avx2 => "avx2",
            CpuSimd::Avx512 => "avx512",
        }
    }
}

/// Define a function whose body (plain loops over slices) is compiled three
/// times, for AVX-512, AVX2 + FMA and the baseline, and run at the
/// [`CpuSimd::selected`] level: the compiler vectorizes the loops to the
/// widest registers. Vectorizing does not reorder float operations (nor fuse a
/// multiply and an add), so every version gives the same bits; the body is
/// the reference.
///
/// ```ignore
/// simd_fn! {
///     /// Doc.
///     pub fn scale(x: &mut [f32], s: f32) { for v in x { *v *= s; } }
/// }
/// ```
macro_rules! simd_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn narrow($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                match $crate::host::simd::CpuSimd::selected() {
                    // SAFETY: the selected level implies the features.
                    $crate::host::simd::CpuSimd::Avx512 => return unsafe { wide($($arg),*) },
                    $crate::host::simd::CpuSimd::Avx2 => return unsafe { narrow($($arg),*) },
                    $crate::host::simd::CpuSimd::Scalar => {}
                }
            }
            body($($arg),*)
        }
    };
}

pub(crate) use simd_fn;

/// Vector helpers shared by the SIMD kernels of `cq` and `kernels`.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// Horizontal sum of 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn hsum8(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }
}
