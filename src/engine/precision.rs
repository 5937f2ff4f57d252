//! [`Precision`]: which arithmetic an engine's CQ matvecs use (SPEC §6 and §6.1).

/// The arithmetic of an engine's CQ matvecs, chosen when it is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Precision {
    /// SPEC §6: f32 throughout, the reference (and what conformance runs).
    #[default]
    Exact,
    /// SPEC §6.1: inside the CQ matvecs of 1, 2 and 4 bits, the prepared input
    /// as int8 blocks of 32 and the codebook as int8 levels, exact int32 dot
    /// products; everything else as exact. The CPU engine's; the GPU engine
    /// stays exact.
    Fast,
}

impl Precision {
    /// `exact` or `fast`, as the CLI spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
