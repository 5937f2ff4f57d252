//! The matvec never binds one buffer twice with one binding writable (WebGPU
//! forbids it; Dawn rejects the dispatch): an input or gains in the output buffer
//! are read through the output binding, bit for bit as from their own buffer,
//! and no engine builds a matvec that aliases (the check runs as each dispatch
//! is built and turns a violation into a device error).

use crate::common::gpu::{gpu, poisoned};
use cqlm::cq::BitsPlan;
use cqlm::gpu::arena::ArenaBuilder;
use cqlm::gpu::kernels::cq::{CqKernels, MatvecInput, PrepareMode, Reduction, SlotStrides};
use cqlm::gpu::{run_dispatches, GpuContext, GpuOptions};
use cqlm::make::synth::{random_cq, synth_model};
use cqlm::{Config, Engine, GpuEngine};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

#[test]
fn an_input_or_gains_in_the_output_buffer_give_the_same_bits() {
    // Token slots of one buffer `act` of S elements: 4 lanes of n, n gains, then
    // the rows' outputs. Reading the lanes and/or the gains from `act` itself
    // (through the output binding) must give exactly the outputs of reading them
    // from a copy, for every pre-op, a prepared input, 1 and 3 inputs (the
    // batched kernel on CPU adapters), and every matvec variant.
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(44);
    let (n, rows) = (200usize, 37usize);
    let s = 5 * n + rows + 3;
    let data: Vec<f32> = (0..3 * s).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let copy = ctx.storage_init("copy", bytemuck::cast_slice(&data));
    for red in Reduction::ALL {
        let k = CqKernels::with_reduction(&ctx, red);
        for (bits, group) in [(2u32, 64usize), (4, 64), (8, 128)] {
            let m = random_cq(&mut rng, rows, n, bits, group, 0.1);
            let mut ab = ArenaBuilder::new(ctx.caps.max_storage_binding);
            let g = ab.push_cq(&m).unwrap();
            let arenas = ab.upload(&ctx, "arena").unwrap();
            let modes = [
                Some(PrepareMode::Copy),
                Some(PrepareMode::RmsUnit),
                Some(PrepareMode::Zcrms),
                Some(PrepareMode::MeanLanesZcrms),
                None,
            ];
            for mode in modes {
                for tokens in [1usize, 3] {
                    let strides = SlotStrides {
                        tokens,
                        x_stride: s,
                        y_stride: s,
                    };
                    let run = |x_in_out: bool, g_in_out: bool| -> Vec<u32> {
                        let act = ctx.storage_init("act", bytemuck::cast_slice(&data));
                        let xb = if x_in_out { &act } else { &copy };
                        let gb = if g_in_out { &act } else { &copy };
                        let input = match mode {
                            Some(mode) => MatvecInput::Raw {
                                mode,
                                n,
                                src: (xb, 0),
                                lane_stride: n,
                                gains: (gb, 4 * n),
                            },
                            None => MatvecInput::Prepared(xb, 0),
                        };
                        let item = [(&g, 0, rows, 5 * n)];
                        let ds = k.matvec(&ctx, &arenas, &item, input, &act, strides);
                        run_dispatches(&ctx, &ds).unwrap();
                        let all = ctx.read_f32(&act, 0, 3 * s).unwrap();
                        (0..tokens)
                            .flat_map(|t| &all[t * s + 5 * n..t * s + 5 * n + rows])
                            .map(|v| v.to_bits())
                            .collect()
                    };
                    let want = run(false, false);
                    assert!(want.iter().all(|b| f32::from_bits(*b).is_finite()));
                    for (x, gi) in [(true, false), (false, true), (true, true)] {
                        assert_eq!(
                            run(x, gi),
                            want,
                            "{red:?} bits {bits} {mode:?} tokens {tokens}: input in out {x}, gains in out {gi}"
                        );
                    }
                }
            }
        }
    }
    ctx.check_errors().unwrap();
}

#[test]
fn an_arena_as_the_output_is_a_device_error_not_a_panic() {
    // The one aliasing the matvec can't route around: the check reports it.
    let Some(_) = gpu() else { return };
    let ctx = GpuContext::new(&GpuOptions::default(), 1 << 20).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(45);
    let m = random_cq(&mut rng, 8, 64, 4, 64, 0.1);
    let mut ab = ArenaBuilder::new(1 << 20);
    let g = ab.push_cq(&m).unwrap();
    let arenas = ab.upload(&ctx, "arena").unwrap();
    let x = poisoned(&ctx, 64);
    let k = CqKernels::new(&ctx);
    let input = MatvecInput::Prepared(&x, 0);
    let _ = k.matvec(
        &ctx,
        &arenas,
        &[(&g, 0, 8, 0)],
        input,
        &arenas[0],
        SlotStrides::single(),
    );
    let e = ctx.check_errors().unwrap_err().to_string();
    assert!(e.contains("binds one buffer at bindings 5 and 7"), "{e}");
}

#[test]
fn engine_matvecs_never_bind_a_writable_buffer_twice() {
    // Every matvec an engine builds, for the decode step and for prefill chunks
    // (the batched forms, token slots of `act` interleaving inputs and outputs),
    // with and without engram, with every matvec variant: an aliasing binding
    // would be recorded as the dispatch is built and fail the build or the chunk.
    let Some(_) = gpu() else { return };
    for (row_matvec, no_subgroups) in [(true, false), (true, true), (false, false), (false, true)] {
        let opts = GpuOptions {
            row_matvec: Some(row_matvec),
            no_subgroups,
            ..Default::default()
        };
        let ctx = GpuContext::new(&opts, 1 << 20).unwrap();
        for engram in [true, false] {
            let mut c = Config::preset_tiny();
            if !engram {
                c.engram = None;
            }
            let model = Arc::new(synth_model(&c, &BitsPlan::mixed(), 9).unwrap());
            let what = format!("rows {row_matvec}, no subgroups {no_subgroups}, engram {engram}");
            let mut eng = GpuEngine::with_context(model, Arc::clone(&ctx))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let ids: Vec<u32> = (0..7).map(|i| (i * 37 + 5) % c.vocab as u32).collect();
            // A chunk of 5, then one of 2.
            eng.set_prefill_chunk(5);
            let logits = eng.prefill(&ids).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(logits.iter().all(|v| v.is_finite()), "{what}");
            ctx.check_errors().unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
}
