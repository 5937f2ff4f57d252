//! GPU CQ kernels (shaders/cq.wgsl) against the CPU reference on fresh random
//! inputs, outputs poisoned with NaN before each run.

use crate::common::gpu::{gpu, poisoned, rel_l2};
use crate::common::random_vec;
use cqlm::cq::CqMatrix;
use cqlm::gpu::arena::ArenaBuilder;
use cqlm::gpu::kernels::cq::{CqKernels, MatvecInput, PrepareMode, Reduction, SlotStrides};
use cqlm::gpu::{run_dispatches, GpuContext};
use cqlm::kernels::prepare::pre_op;
use cqlm::make::synth::random_cq;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The CPU twin ([`cqlm::kernels::prepare::pre_op`]) of the pre-op of `mode`:
/// lane 1 of `lanes` (4 lanes of `n`), or the mean of all 4 for
/// [`PrepareMode::MeanLanesZcrms`], with gains `w`.
fn cpu_pre_op(mode: PrepareMode, lanes: &[f32], w: &[f32], n: usize) -> Vec<f32> {
    let src = match mode {
        PrepareMode::MeanLanesZcrms => lanes,
        _ => &lanes[n..],
    };
    let mut pre = vec![f32::NAN; n];
    pre_op(mode, src, n, n, w, &mut pre);
    pre
}

#[test]
fn matvec_matches_cpu_for_every_bits_and_group_with_fused_parts() {
    let Some(ctx) = gpu() else { return };
    for red in Reduction::ALL {
        let k = CqKernels::with_reduction(&ctx, red);
        if ctx.caps.subgroups {
            assert_eq!(k.reduction, red);
        }
        matvec_case(&ctx, &k);
    }
}

fn matvec_case(ctx: &cqlm::gpu::GpuContext, k: &CqKernels) {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for bits in [1u32, 2, 4, 8] {
        for group in [32usize, 64, 128, 256] {
            let cols = group * 2 + 9;
            // Three matrices of one geometry (fused into one dispatch) and one of another group.
            let ms: Vec<CqMatrix> = [13usize, 7, 21]
                .iter()
                .map(|&rows| random_cq(&mut rng, rows, cols, bits, group, 0.3))
                .collect();
            let other = random_cq(
                &mut rng,
                5,
                cols,
                bits,
                if group == 32 { 64 } else { 32 },
                0.3,
            );
            let mut ab = ArenaBuilder::new(64 << 20);
            let gms: Vec<_> = ms.iter().map(|m| ab.push_cq(m).unwrap()).collect();
            let gother = ab.push_cq(&other).unwrap();
            let arenas = ab.upload(ctx, "arena").unwrap();
            let x = random_vec(&mut rng, cols, 1.0);
            let mut prep = vec![0.0f32; ms[0].padded()];
            ms[0].prepare_into(&x, &mut prep);
            let mut prep_o = vec![0.0f32; other.padded()];
            other.prepare_into(&x, &mut prep_o);
            let xb = ctx.storage_init("x", bytemuck::cast_slice(&[prep.clone(), prep_o].concat()));
            // Rows: all of m0, rows 2..6 of m1, all of m2; out offsets leave gaps.
            let items = [
                (&gms[0], 0, 13, 0),
                (&gms[1], 2, 4, 20),
                (&gms[2], 0, 21, 30),
            ];
            let out = poisoned(ctx, 64);
            let mut ds = k.matvec(
                ctx,
                &arenas,
                &items,
                MatvecInput::Prepared(&xb, 0),
                &out,
                SlotStrides::single(),
            );
            assert_eq!(ds.len(), 1, "parts of one geometry fuse into one dispatch");
            ds.extend(k.matvec(
                ctx,
                &arenas,
                &[(&gother, 0, 5, 56)],
                MatvecInput::Prepared(&xb, prep.len()),
                &out,
                SlotStrides::single(),
            ));
            run_dispatches(ctx, &ds).unwrap();
            let got = ctx.read_f32(&out, 0, 64).unwrap();
            let check = |m: &CqMatrix, p: &[f32], first: usize, n: usize, at: usize, what: &str| {
                let mut want = vec![0.0f32; n];
                m.matvec_rows_prepared(p, first, &mut want);
                let e = rel_l2(&got[at..at + n], &want);
                assert!(
                    e <= 1e-5,
                    "matvec {:?} bits {bits} group {group} {what}: {e}",
                    k.reduction
                );
            };
            check(&ms[0], &prep, 0, 13, 0, "m0");
            check(&ms[1], &prep, 2, 4, 20, "m1 rows 2..6");
            check(&ms[2], &prep, 0, 21, 30, "m2");
            check(&other, &x_prep(&other, &x), 0, 5, 56, "other group");
            assert!(got[13..20].iter().all(|v| v.is_nan()), "gap written");
        }
    }
}

fn x_prep(m: &CqMatrix, x: &[f32]) -> Vec<f32> {
    let mut p = vec![0.0f32; m.padded()];
    m.prepare_into(x, &mut p);
    p
}

#[test]
fn matvec_splits_a_matrix_over_several_arenas() {
    let Some(ctx) = gpu() else { return };
    let k = CqKernels::with_reduction(&ctx, Reduction::Portable);
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let m = random_cq(&mut rng, 300, 200, 4, 64, 0.2);
    // Arenas of 8 KiB: about 60 rows each.
    let mut ab = ArenaBuilder::new(8 << 10);
    let g = ab.push_cq(&m).unwrap();
    assert!(
        g.parts.len() > 3,
        "expected a split, got {} parts",
        g.parts.len()
    );
    let arenas = ab.upload(&ctx, "arena").unwrap();
    let x = random_vec(&mut rng, 200, 1.0);
    let prep = x_prep(&m, &x);
    let xb = ctx.storage_init("x", bytemuck::cast_slice(&prep));
    let out = poisoned(&ctx, 300);
    let ds = k.matvec(
        &ctx,
        &arenas,
        &[(&g, 0, 300, 0)],
        MatvecInput::Prepared(&xb, 0),
        &out,
        SlotStrides::single(),
    );
    run_dispatches(&ctx, &ds).unwrap();
    let got = ctx.read_f32(&out, 0, 300).unwrap();
    let mut want = vec![0.0f32; 300];
    m.matvec_rows_prepared(&prep, 0, &mut want);
    assert!(rel_l2(&got, &want) <= 1e-5);
}

#[test]
fn arena_upload_checks_the_device_limit() {
    // A builder made for a larger device than the one uploading: an arena over the
    // device's storage binding limit is an error, never a buffer that can't bind.
    let small = GpuContext::new(
        &cqlm::gpu::GpuOptions {
            max_storage_binding: Some(64 << 10),
            ..Default::default()
        },
        1 << 10,
    );
    let Ok(small) = small else {
        assert!(
            gpu().is_none(),
            "a GPU exists but a 64 KiB binding limit was refused"
        );
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let m = random_cq(&mut rng, 512, 512, 4, 128, 0.2);
    let mut ab = ArenaBuilder::new(1 << 20);
    ab.push_cq(&m).unwrap();
    let bytes = ab.arenas[0].len() * 4;
    assert!(bytes > 64 << 10, "the arena holds only {bytes} bytes");
    let e = ab.upload(&small, "big").unwrap_err().to_string();
    assert!(e.contains("big 0") && e.contains("65536"), "{e}");
    // The same matrix in arenas sized for that device uploads, one buffer each.
    let mut ab = ArenaBuilder::new(small.caps.max_storage_binding);
    let g = ab.push_cq(&m).unwrap();
    let bufs = ab.upload(&small, "fits").unwrap();
    assert_eq!(bufs.len(), ab.arenas.len());
    assert_eq!(bufs.len(), g.parts.last().unwrap().arena + 1);
    for (b, a) in bufs.iter().zip(&ab.arenas) {
        assert_eq!(b.size(), (a.len() as u64 * 4).max(4));
    }
}

#[test]
fn gather_matches_dequantize_row_for_every_bits() {
    let Some(ctx) = gpu() else { return };
    let k = CqKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for bits in [1u32, 2, 4, 8] {
        for (group, cols) in [(32usize, 24usize), (64, 150), (128, 128), (256, 300)] {
            let m = random_cq(&mut rng, 37, cols, bits, group, 0.5);
            let mut ab = ArenaBuilder::new(64 << 20);
            let g = ab.push_cq(&m).unwrap();
            let arenas = ab.upload(&ctx, "arena").unwrap();
            let row = rng.random_range(0..37u32);
            let idx = ctx.storage_init("idx", bytemuck::cast_slice(&[7u32, row]));
            let stride = cols + 3;
            let out = poisoned(&ctx, 4 * stride);
            let d = k
                .gather(&ctx, &arenas, &g, (&idx, 1), 2.5, (&out, 0), 4, stride)
                .unwrap();
            run_dispatches(&ctx, &d).unwrap();
            let got = ctx.read_f32(&out, 0, 4 * stride).unwrap();
            let mut want = vec![0.0f32; cols];
            m.dequantize_row_into(row as usize, &mut want);
            want.iter_mut().for_each(|v| *v *= 2.5);
            for copy in 0..4 {
                let e = rel_l2(&got[copy * stride..copy * stride + cols], &want);
                assert!(
                    e <= 1e-5,
                    "gather bits {bits} group {group} copy {copy}: {e}"
                );
                assert!(got[copy * stride + cols..(copy + 1) * stride]
                    .iter()
                    .all(|v| v.is_nan()));
            }
        }
    }
}

#[test]
fn gather_reads_the_right_part_of_a_split_matrix() {
    let Some(ctx) = gpu() else { return };
    let k = CqKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let m = random_cq(&mut rng, 200, 96, 4, 32, 0.5);
    let mut ab = ArenaBuilder::new(4 << 10);
    let g = ab.push_cq(&m).unwrap();
    assert!(
        g.parts.len() >= 3,
        "expected a split, got {} parts",
        g.parts.len()
    );
    let arenas = ab.upload(&ctx, "arena").unwrap();
    for row in [0u32, 57, 120, 199] {
        let idx = ctx.storage_init("idx", bytemuck::cast_slice(&[row]));
        let out = poisoned(&ctx, 96);
        let d = k
            .gather(&ctx, &arenas, &g, (&idx, 0), 1.0, (&out, 0), 1, 0)
            .unwrap();
        assert_eq!(d.len(), g.parts.len());
        run_dispatches(&ctx, &d).unwrap();
        let got = ctx.read_f32(&out, 0, 96).unwrap();
        let mut want = vec![0.0f32; 96];
        m.dequantize_row_into(row as usize, &mut want);
        assert!(rel_l2(&got, &want) <= 1e-5, "row {row}");
    }
}

#[test]
fn matvec_of_a_raw_input_prepares_it_in_every_mode() {
    // The matvec prepares its input itself (no prepare dispatch): every pre-op,
    // groups 32..256 with inputs shorter than, not a multiple of, and a multiple of
    // the group, a row count that is not a multiple of the workgroup's, and an
    // input longer than one staged chunk of 4096 columns, with both matvec variants.
    use cqlm::gpu::kernels::cq::MatvecInput;
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let mut shapes = vec![(5000usize, 2u32, 256usize), (777, 8, 64)];
    for (i, group) in [32usize, 64, 128, 256].into_iter().enumerate() {
        for n in [group * 2 + 5, group - 3, 3 * group] {
            shapes.push((n, [1u32, 2, 4, 8][i], group));
        }
    }
    for red in [
        Reduction::Subgroup,
        Reduction::RowPerInvocation,
        Reduction::RowPerInvocationSubgroup,
    ] {
        let k = CqKernels::with_reduction(&ctx, red);
        for &(n, bits, group) in &shapes {
            let rows = 37;
            let m = random_cq(&mut rng, rows, n, bits, group, 0.05);
            let lanes = random_vec(&mut rng, 4 * n, 1.0);
            let w = random_vec(&mut rng, n, 1.0);
            let mut ab = ArenaBuilder::new(ctx.caps.max_storage_binding);
            let g = ab.push_cq(&m).expect("fits");
            let arenas = ab.upload(&ctx, "arena").unwrap();
            let src = ctx.storage_init("lanes", bytemuck::cast_slice(&lanes));
            let wb = ctx.storage_init("w", bytemuck::cast_slice(&w));
            for mode in [
                PrepareMode::Copy,
                PrepareMode::RmsUnit,
                PrepareMode::Zcrms,
                PrepareMode::MeanLanesZcrms,
            ] {
                let want = cqlm::cq::cq_matvec(&m, &cpu_pre_op(mode, &lanes, &w, n)).unwrap();
                let out = poisoned(&ctx, rows + 3);
                let input = MatvecInput::Raw {
                    mode,
                    n,
                    src: (
                        &src,
                        if mode == PrepareMode::MeanLanesZcrms {
                            0
                        } else {
                            n
                        },
                    ),
                    lane_stride: n,
                    gains: (&wb, 0),
                };
                let ds = k.matvec(
                    &ctx,
                    &arenas,
                    &[(&g, 0, rows, 3)],
                    input,
                    &out,
                    SlotStrides::single(),
                );
                run_dispatches(&ctx, &ds).unwrap();
                let got = ctx.read_f32(&out, 3, rows).unwrap();
                let e = rel_l2(&got, &want);
                assert!(
                    e <= 1e-5,
                    "{red:?} {mode:?} n {n} bits {bits} group {group}: {e}"
                );
            }
        }
    }
}

#[test]
fn tall_matrices_spread_rows_over_each_team_in_turn() {
    // Over 512 rows the 16-lane matvec gives each team several rows in turn
    // (team_rows = ceil(rows / 512)); a row count that is not a multiple of a
    // workgroup's, with every matvec variant.
    use cqlm::gpu::kernels::cq::MatvecInput;
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(35);
    let (rows, n) = (2101usize, 300usize);
    let m = random_cq(&mut rng, rows, n, 4, 128, 0.05);
    let lanes = random_vec(&mut rng, 4 * n, 1.0);
    let w = random_vec(&mut rng, n, 1.0);
    let mut ab = ArenaBuilder::new(ctx.caps.max_storage_binding);
    let g = ab.push_cq(&m).expect("fits");
    let arenas = ab.upload(&ctx, "arena").unwrap();
    let src = ctx.storage_init("lanes", bytemuck::cast_slice(&lanes));
    let wb = ctx.storage_init("w", bytemuck::cast_slice(&w));
    let want = cqlm::cq::cq_matvec(&m, &cpu_pre_op(PrepareMode::RmsUnit, &lanes, &w, n)).unwrap();
    for red in Reduction::ALL {
        let k = CqKernels::with_reduction(&ctx, red);
        let out = poisoned(&ctx, rows);
        let input = MatvecInput::Raw {
            mode: PrepareMode::RmsUnit,
            n,
            src: (&src, n),
            lane_stride: n,
            gains: (&wb, 0),
        };
        let ds = k.matvec(
            &ctx,
            &arenas,
            &[(&g, 0, rows, 0)],
            input,
            &out,
            SlotStrides::single(),
        );
        run_dispatches(&ctx, &ds).unwrap();
        let got = ctx.read_f32(&out, 0, rows).unwrap();
        let e = rel_l2(&got, &want);
        assert!(e <= 1e-5, "{red:?}: {e}");
    }
}

#[test]
fn batched_matvec_equals_one_dispatch_per_input_bit_for_bit() {
    // A prefill matvec takes `tokens` inputs `x_stride` apart and writes outputs
    // `y_stride` apart. Each output must be exactly what the one-input dispatch
    // gives for that input (and so within SPEC §6 of the CPU), for every variant,
    // every bit width, raw and prepared inputs (the batched kernel takes the
    // prepared ones), more inputs than one block (8), inputs longer than the
    // staging array's half, and more rows than one workgroup (not a multiple of
    // 4); the gaps between outputs stay poisoned.
    // Bit for bit holds on lavapipe (IEEE arithmetic, one compiler for both
    // pipelines), not necessarily on a real GPU, where matvec_rows_sgb and
    // matvec_rows_sg may fuse multiply-adds differently: CPU adapters only; the twin
    // batched_matvec_equals_one_dispatch_per_input_within_rounding runs everywhere.
    let Some(ctx) = gpu() else { return };
    if ctx.info.device_type != wgpu::DeviceType::Cpu {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    // (cols, bits, group): four-word groups at 4 and 2 bits (the batched kernel),
    // groups of fewer words, 1 and 8 bits, and 2500 columns (over half the
    // staging array, which the batched kernel no longer uses).
    let shapes = [
        (300usize, 4u32, 128usize),
        (1000, 4, 256),
        (300, 2, 64),
        (200, 2, 32),
        (150, 4, 16),
        (130, 1, 64),
        (77, 8, 32),
        (2500, 4, 128),
    ];
    let tokens = 11usize;
    for red in Reduction::ALL {
        let k = CqKernels::with_reduction(&ctx, red);
        for &(n, bits, group) in &shapes {
            let rows = 261;
            let m = random_cq(&mut rng, rows, n, bits, group, 0.05);
            let mut ab = ArenaBuilder::new(ctx.caps.max_storage_binding);
            let g = ab.push_cq(&m).expect("fits");
            let arenas = ab.upload(&ctx, "arena").unwrap();
            // A stride that is a multiple of 4: the batched kernel reads vec4s.
            let (xs, ys) = ((n.max(m.padded()) + 5).next_multiple_of(4), rows + 3);
            let xs_all = random_vec(&mut rng, tokens * xs, 1.0);
            let w = random_vec(&mut rng, n, 1.0);
            let src = ctx.storage_init("inputs", bytemuck::cast_slice(&xs_all));
            let wb = ctx.storage_init("w", bytemuck::cast_slice(&w));
            // Prepared inputs for mode 4, at the same stride.
            let mut prepared = vec![0.0f32; tokens * xs];
            for t in 0..tokens {
                m.prepare_into(
                    &xs_all[t * xs..t * xs + n],
                    &mut prepared[t * xs..t * xs + m.padded()],
                );
            }
            let pb = ctx.storage_init("prepared", bytemuck::cast_slice(&prepared));
            for mode in [None, Some(PrepareMode::Zcrms)] {
                let input_at = |at: usize| match mode {
                    None => MatvecInput::Prepared(&pb, at),
                    Some(mode) => MatvecInput::Raw {
                        mode,
                        n,
                        src: (&src, at),
                        lane_stride: 0,
                        gains: (&wb, 0),
                    },
                };
                let what = format!("{red:?} {mode:?} n {n} bits {bits} group {group}");
                let out = poisoned(&ctx, tokens * ys);
                let strides = SlotStrides {
                    tokens,
                    x_stride: xs,
                    y_stride: ys,
                };
                let ds = k.matvec(
                    &ctx,
                    &arenas,
                    &[(&g, 0, rows, 1)],
                    input_at(0),
                    &out,
                    strides,
                );
                let batched_kernel = red == Reduction::RowPerInvocationSubgroup
                    && ctx.caps.subgroup_min >= 8
                    && mode.is_none()
                    && (bits == 2 || bits == 4)
                    && (m.group() * bits as usize).is_multiple_of(128);
                assert_eq!(
                    ds[0].name.ends_with("_batch"),
                    batched_kernel,
                    "{what}: kernel {}",
                    ds[0].name
                );
                run_dispatches(&ctx, &ds).unwrap();
                let got = ctx.read_f32(&out, 0, tokens * ys).unwrap();
                for t in 0..tokens {
                    let one = poisoned(&ctx, ys);
                    let ds = k.matvec(
                        &ctx,
                        &arenas,
                        &[(&g, 0, rows, 1)],
                        input_at(t * xs),
                        &one,
                        SlotStrides::single(),
                    );
                    run_dispatches(&ctx, &ds).unwrap();
                    let single = ctx.read_f32(&one, 0, ys).unwrap();
                    let row = &got[t * ys..(t + 1) * ys];
                    assert!(
                        row[0].is_nan() && row[rows + 1..].iter().all(|v| v.is_nan()),
                        "{what}: gap of input {t} written"
                    );
                    for (r, (a, b)) in row[1..=rows].iter().zip(&single[1..=rows]).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{what}: input {t} row {r}: {a} vs {b}"
                        );
                    }
                    let x = &xs_all[t * xs..t * xs + n];
                    let pre = match mode {
                        None => x.to_vec(),
                        Some(_) => {
                            let mut p = vec![f32::NAN; n];
                            pre_op(PrepareMode::Zcrms, x, n, n, &w, &mut p);
                            p
                        }
                    };
                    let want = cqlm::cq::cq_matvec(&m, &pre).unwrap();
                    let e = rel_l2(&row[1..=rows], &want);
                    assert!(e <= 1e-5, "{what}: input {t} against the CPU: {e}");
                }
            }
        }
    }
}

#[test]
fn prepare_inputs_match_the_cpu_prepare_in_every_mode() {
    // CqKernels::prepare: each of 3 raw inputs (x_stride apart) prepared once, as
    // every matvec workgroup stages one, into slots of a destination (its own
    // stride); inputs that fit the staging array side by side (two to a
    // workgroup on a device of 2 or 3 threads at once, as lavapipe on a 2-core
    // machine) and the one over it alone, in chunks; for every pre-op, groups 32..256, inputs shorter than, not a
    // multiple of and a multiple of the group, and one longer than a staged
    // chunk of 4096 columns; with the input and gains in their own buffers and
    // in the destination's (read through its binding). The CPU twin: pre_op,
    // then prepare_into. The gaps between slots stay poisoned.
    use cqlm::gpu::kernels::cq::PrepScratch;
    let Some(ctx) = gpu() else { return };
    let k = CqKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(47);
    let tokens = 3usize;
    for (n, group) in [
        (5000usize, 256usize),
        (77, 32),
        (130, 64),
        (300, 128),
        (256, 128),
    ] {
        let padded = n.div_ceil(group) * group;
        // Each input: 4 lanes of n (MeanLanesZcrms reads all 4), then a gap.
        let xs = 4 * n + 7;
        let data = random_vec(&mut rng, tokens * xs, 1.0);
        let w = random_vec(&mut rng, n, 1.0);
        let stride = padded + 9;
        for mode in [
            PrepareMode::Copy,
            PrepareMode::RmsUnit,
            PrepareMode::Zcrms,
            PrepareMode::MeanLanesZcrms,
        ] {
            for in_dst in [false, true] {
                // The destination: (the inputs and the gains when `in_dst`), then
                // the prepared slots from `base` on, all else NaN.
                let base = if in_dst { tokens * xs + n + 3 } else { 5 };
                let mut init = vec![f32::NAN; base + tokens * stride];
                if in_dst {
                    init[..tokens * xs].copy_from_slice(&data);
                    init[tokens * xs..tokens * xs + n].copy_from_slice(&w);
                }
                let dst = ctx.storage_init("dst", bytemuck::cast_slice(&init));
                let src = ctx.storage_init("inputs", bytemuck::cast_slice(&data));
                let wb = ctx.storage_init("gains", bytemuck::cast_slice(&w));
                let (x, gains) = if in_dst {
                    ((&dst, 0), (&dst, tokens * xs))
                } else {
                    ((&src, 0), (&wb, 0))
                };
                let input = MatvecInput::Raw {
                    mode,
                    n,
                    src: x,
                    lane_stride: n,
                    gains,
                };
                let scratch = PrepScratch {
                    buffer: &dst,
                    offset: base,
                    stride,
                };
                let strides = SlotStrides {
                    tokens,
                    x_stride: xs,
                    y_stride: 0,
                };
                let d = k
                    .prepare(&ctx, input, group, padded, scratch, strides)
                    .expect("a raw input needs a dispatch");
                run_dispatches(&ctx, &[d]).unwrap();
                let got = ctx.read_f32(&dst, 0, init.len()).unwrap();
                let what =
                    format!("{mode:?} n {n} group {group} input in the destination {in_dst}");
                assert!(
                    got[..base]
                        .iter()
                        .zip(&init)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: before the slots"
                );
                for t in 0..tokens {
                    let lanes = &data[t * xs..t * xs + 4 * n];
                    let mut pre = vec![f32::NAN; n];
                    pre_op(mode, lanes, n, n, &w, &mut pre);
                    let mut want = vec![f32::NAN; padded];
                    cqlm::cq::prepare_into(&pre, group, &mut want);
                    let at = base + t * stride;
                    let e = rel_l2(&got[at..at + padded], &want);
                    assert!(e <= 1e-5, "{what}: input {t}: {e}");
                    assert!(
                        got[at + padded..at + stride].iter().all(|v| v.is_nan()),
                        "{what}: gap after input {t}"
                    );
                }
            }
        }
    }
}

#[test]
fn matvec_prepared_once_equals_one_raw_dispatch_per_input_bit_for_bit() {
    // A batch's raw inputs prepared once (a prepare_inputs dispatch) and the
    // matvec on them, against the one-input dispatch that prepares its own
    // input, for every variant: bit for bit on CPU adapters (as the batched test
    // above), for matrices of one and of several row workgroups, with the
    // batched kernel (4 and 2 bits, prepared in a buffer of their own) and
    // without it (8 bits; the scratch in the output buffer). When a dispatch
    // prepares the inputs first, it is because several workgroups would have
    // staged each input or the batched kernel reads them; one input (a decode
    // step) is never prepared apart.
    use cqlm::gpu::kernels::cq::PrepScratch;
    let Some(ctx) = gpu() else { return };
    if ctx.info.device_type != wgpu::DeviceType::Cpu {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(48);
    let tokens = 5usize;
    for red in Reduction::ALL {
        let k = CqKernels::with_reduction(&ctx, red);
        for &(rows, n, bits, group, own_scratch) in &[
            (600usize, 300usize, 4u32, 128usize, true),
            (40, 1000, 4, 256, true),
            (300, 200, 2, 64, true),
            (270, 77, 8, 32, false),
        ] {
            let m = random_cq(&mut rng, rows, n, bits, group, 0.05);
            let mut ab = ArenaBuilder::new(ctx.caps.max_storage_binding);
            let g = ab.push_cq(&m).expect("fits");
            let arenas = ab.upload(&ctx, "arena").unwrap();
            let (xs, ys) = (n + 3, rows + 2);
            let xs_all = random_vec(&mut rng, tokens * xs, 1.0);
            let w = random_vec(&mut rng, n, 1.0);
            let src = ctx.storage_init("inputs", bytemuck::cast_slice(&xs_all));
            let wb = ctx.storage_init("w", bytemuck::cast_slice(&w));
            let input_at = |at: usize| MatvecInput::Raw {
                mode: PrepareMode::Zcrms,
                n,
                src: (&src, at),
                lane_stride: 0,
                gains: (&wb, 0),
            };
            let what = format!("{red:?} rows {rows} n {n} bits {bits} group {group}");
            // Outputs, then (without a scratch buffer of its own) the prepared slots.
            let stride = m.padded().next_multiple_of(4);
            let out = poisoned(&ctx, tokens * ys + tokens * stride);
            let scratch_buf = poisoned(&ctx, tokens * stride);
            let scratch = if own_scratch {
                PrepScratch {
                    buffer: &scratch_buf,
                    offset: 0,
                    stride,
                }
            } else {
                PrepScratch {
                    buffer: &out,
                    offset: tokens * ys,
                    stride,
                }
            };
            let strides = SlotStrides {
                tokens,
                x_stride: xs,
                y_stride: ys,
            };
            let item = [(&g, 0, rows, 1)];
            let ds =
                k.matvec_prepared_once(&ctx, &arenas, &item, input_at(0), &out, strides, scratch);
            let single = k.matvec_prepared_once(
                &ctx,
                &arenas,
                &item,
                input_at(0),
                &out,
                SlotStrides::single(),
                scratch,
            );
            assert!(
                single.iter().all(|d| d.name != "prepare_inputs"),
                "{what}: one input"
            );
            let prepared = ds[0].name == "prepare_inputs";
            let batched = ds.iter().any(|d| d.name.ends_with("_batch"));
            let several = k.stagings(&ctx, &item, strides) > 1;
            assert_eq!(
                prepared,
                several || batched,
                "{what}: {:?}",
                ds.iter().map(|d| d.name).collect::<Vec<_>>()
            );
            let batched_kernel = red == Reduction::RowPerInvocationSubgroup
                && ctx.caps.subgroup_min >= 8
                && own_scratch;
            assert_eq!(batched, batched_kernel, "{what}");
            run_dispatches(&ctx, &ds).unwrap();
            let got = ctx.read_f32(&out, 0, tokens * ys).unwrap();
            for t in 0..tokens {
                let one = poisoned(&ctx, ys);
                let ds = k.matvec(
                    &ctx,
                    &arenas,
                    &item,
                    input_at(t * xs),
                    &one,
                    SlotStrides::single(),
                );
                run_dispatches(&ctx, &ds).unwrap();
                let single = ctx.read_f32(&one, 0, ys).unwrap();
                let row = &got[t * ys..(t + 1) * ys];
                assert!(
                    row[0].is_nan() && row[rows + 1].is_nan(),
                    "{what}: gap of input {t} written"
                );
                for r in 1..=rows {
                    assert_eq!(
                        row[r].to_bits(),
                        single[r].to_bits(),
                        "{what}: input {t} row {r}: {} vs {}",
                        row[r],
                        single[r]
                    );
                }
            }
        }
    }
}

#[test]
fn batched_matvec_equals_one_dispatch_per_input_within_rounding() {
    // The tolerance twin of batched_matvec_equals_one_dispatch_per_input_bit_for_bit
    // for any adapter: each of `tokens` batched outputs within float rounding of the
    // one-input dispatch (the bit-exact test also checks the CPU), the gaps between
    // outputs still poisoned.
    use cqlm::gpu::kernels::cq::{MatvecInput, SlotStrides};
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let tokens = 9usize;
    for red in [Reduction::RowPerInvocationSubgroup, Reduction::Subgroup] {
        let k = CqKernels::with_reduction(&ctx, red);
        for (n, bits, group) in [(300usize, 4u32, 128usize), (200, 2, 64)] {
            let rows = 70;
            let m = random_cq(&mut rng, rows, n, bits, group, 0.05);
            let mut ab = ArenaBuilder::new(ctx.caps.max_storage_binding);
            let g = ab.push_cq(&m).expect("fits");
            let arenas = ab.upload(&ctx, "arena").unwrap();
            let (xs, ys) = (m.padded() + 3, rows + 2);
            let mut prepared = vec![0.0f32; tokens * xs];
            for t in 0..tokens {
                let x = random_vec(&mut rng, n, 1.0);
                m.prepare_into(&x, &mut prepared[t * xs..t * xs + m.padded()]);
            }
            let pb = ctx.storage_init("prepared", bytemuck::cast_slice(&prepared));
            let out = poisoned(&ctx, tokens * ys);
            let strides = SlotStrides {
                tokens,
                x_stride: xs,
                y_stride: ys,
            };
            let item = [(&g, 0, rows, 1)];
            let ds = k.matvec(
                &ctx,
                &arenas,
                &item,
                MatvecInput::Prepared(&pb, 0),
                &out,
                strides,
            );
            run_dispatches(&ctx, &ds).unwrap();
            let got = ctx.read_f32(&out, 0, tokens * ys).unwrap();
            for t in 0..tokens {
                let one = poisoned(&ctx, ys);
                let ds = k.matvec(
                    &ctx,
                    &arenas,
                    &item,
                    MatvecInput::Prepared(&pb, t * xs),
                    &one,
                    SlotStrides::single(),
                );
                run_dispatches(&ctx, &ds).unwrap();
                let single = ctx.read_f32(&one, 0, ys).unwrap();
                let row = &got[t * ys..(t + 1) * ys];
                assert!(row[0].is_nan() && row[rows + 1..].iter().all(|v| v.is_nan()));
                let e = rel_l2(&row[1..=rows], &single[1..=rows]);
                assert!(e <= 1e-6, "{red:?} bits {bits}: input {t}: {e}");
            }
        }
    }
}

#[test]
fn gather_many_gathers_every_slot_at_its_strides() {
    // The head's gathers of a pass in one dispatch: two matrices (one written
    // 4 times into output 0, one once into output 1), 3 token slots with their
    // own row indices at the index stride and their outputs at each output's
    // slot stride, against dequantize_row per slot; every other element stays
    // NaN (nothing written between or past the slots).
    let Some(ctx) = gpu() else { return };
    let k = CqKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let a = random_cq(&mut rng, 41, 96, 4, 32, 0.5);
    let b = random_cq(&mut rng, 23, 64, 2, 64, 0.5);
    let mut ab = ArenaBuilder::new(64 << 20);
    let (ga, gb) = (ab.push_cq(&a).unwrap(), ab.push_cq(&b).unwrap());
    let arenas = ab.upload(&ctx, "arena").unwrap();
    let slots = 3usize;
    let (idx_stride, stride_a, stride_b) = (5usize, 4 * 100 + 7, 70usize);
    let mut idx = vec![0u32; slots * idx_stride];
    let rows: Vec<[u32; 2]> = (0..slots)
        .map(|_| [rng.random_range(0..41u32), rng.random_range(0..23u32)])
        .collect();
    for (y, r) in rows.iter().enumerate() {
        idx[y * idx_stride + 1] = r[0];
        idx[y * idx_stride + 3] = r[1];
    }
    let idx = ctx.storage_init("idx", bytemuck::cast_slice(&idx));
    let (out_a, out_b) = (
        poisoned(&ctx, slots * stride_a),
        poisoned(&ctx, slots * stride_b),
    );
    let items = [(&ga, 1, 1.5f32, 0, 2, 4, 100), (&gb, 3, 1.0, 1, 5, 1, 0)];
    let d = k
        .gather_many(
            &ctx,
            &arenas,
            &items,
            &idx,
            [&out_a, &out_b],
            (idx_stride, [stride_a, stride_b]),
        )
        .expect("fits one dispatch")
        .over_slots(slots);
    run_dispatches(&ctx, std::slice::from_ref(&d)).unwrap();
    let got_a = ctx.read_f32(&out_a, 0, slots * stride_a).unwrap();
    let got_b = ctx.read_f32(&out_b, 0, slots * stride_b).unwrap();
    let mut want_a = vec![f32::NAN; slots * stride_a];
    let mut want_b = vec![f32::NAN; slots * stride_b];
    for (y, r) in rows.iter().enumerate() {
        let mut row = vec![0.0f32; 96];
        a.dequantize_row_into(r[0] as usize, &mut row);
        for copy in 0..4 {
            let at = y * stride_a + 2 + copy * 100;
            for (w, v) in want_a[at..at + 96].iter_mut().zip(&row) {
                *w = v * 1.5;
            }
        }
        let mut row = vec![0.0f32; 64];
        b.dequantize_row_into(r[1] as usize, &mut row);
        want_b[y * stride_b + 5..y * stride_b + 69].copy_from_slice(&row);
    }
    for (got, want, what) in [(&got_a, &want_a, "a"), (&got_b, &want_b, "b")] {
        for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            if w.is_nan() {
                assert!(g.is_nan(), "output {what}[{i}] written: {g}");
            } else {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "output {what}[{i}]: {g} vs {w}"
                );
            }
        }
    }
}
