//! Capture points of the step: where `GpuEngine::step_captured` copies a named
//! intermediate out (the CPU probe's names), between the same dispatches as a
//! plain step. A plain step records none of them, so capture is free when off.

/// One tensor copied out of a captured step.
#[derive(Debug, Clone, PartialEq)]
pub struct Captured {
    /// Name, as the CPU engine's [`crate::cpu::Probe`] names it.
    pub name: String,
    /// Layer, or `None` outside the layer loop.
    pub layer: Option<usize>,
    /// Values.
    pub data: Vec<f32>,
}

/// Which buffer a capture point copies from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The activations (slot 0).
    Act,
    /// The lanes (slot 0).
    Lanes,
    /// The logits.
    Logits,
}

/// A copy of `len` elements at `offset` of `source`, made after dispatch `after`
/// of its segment (head, a layer, or the tail).
#[derive(Debug, Clone)]
pub(crate) struct CapturePoint {
    pub after: usize,
    pub name: String,
    pub layer: Option<usize>,
    pub source: Source,
    pub offset: usize,
    pub len: usize,
}
