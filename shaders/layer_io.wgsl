// layer_io.wgsl: the buffers every per-layer kernel works on, one binding each,
// declared once so that the standard kernels (mlp, premix, route, conv) and the
// lean program's layer_step call the same WGSL functions on the same variables.
// Concatenated by the host in front of mlp.wgsl, mhc.wgsl, engram.wgsl and
// layer.wgsl (after common.wgsl); never compiled on its own. An entry point's
// bind group holds only the bindings it uses.
//
//   binding 1  act         (read_write) every activation, by element offsets
//   binding 2  vecs        (read)       every F32 model tensor, by element offsets
//   binding 3  lanes       (read_write) the 4 mHC lanes, lane i at i · hidden
//   binding 7  rings       (read_write) every engram site's value ring
//   binding 8  step_words  (read)       the per-step u32 words (word 1: position t)
// Bindings 0, 4..6 and 9.. belong to the kernels' own params and arenas.

@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> vecs: array<f32>;
@group(0) @binding(3) var<storage, read_write> lanes: array<f32>;
@group(0) @binding(7) var<storage, read_write> rings: array<f32>;
@group(0) @binding(8) var<storage, read> step_words: array<u32>;

// The RMS norms' epsilon (SPEC §4.1 zcrms).
const EPS: f32 = 1e-6;
