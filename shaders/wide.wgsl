// wide.wgsl: the workgroup width of the standard kernels that run one wide
// workgroup a slot (mhc.wgsl's premix and route, engram.wgsl's conv), put in
// front of those files when they are compiled on their own (layer.wgsl's module
// takes mlp.wgsl's WG and scratch instead).
//
// Invocations per workgroup: a pipeline override, 256 or 128 (the host's
// Capabilities::wide_workgroup: 128 where the device allows fewer than 256, as
// GLES 3.1 and WebGPU's compatibility mode may).
override WG: u32 = 256u;
// wg_sum's scratch (and the route's 20 gates), at the widest WG (1 KiB).
const SCRATCH_LEN: u32 = 256u;
