//! GPU block kernels (shaders/mhc.wgsl, mlp.wgsl, engram.wgsl) against their CPU
//! twins (`cqlm::kernels::{mhc::premix, mhc::route, mlp::block, engram::conv}`,
//! what the CPU engine runs), on fresh random inputs with the outputs poisoned
//! with NaN before each run.

use crate::common::gpu::{gpu, rel_l2};
use crate::common::random_vec;
use cqlm::gpu::kernels::engram::{EngramConvParams, EngramKernels};
use cqlm::gpu::kernels::mhc::{MhcKernels, PremixParams, RouteParams};
use cqlm::gpu::kernels::mlp::{MlpKernels, MlpParams};
use cqlm::gpu::step_input::StepLayout;
use cqlm::gpu::{run_dispatches, MlpWorkgroup};
use cqlm::kernels::engram::conv as engram_conv;
use cqlm::kernels::mhc::{premix, route, EngramGate};
use cqlm::kernels::mlp;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Append `v` to `buf` and return its element offset.
fn push(buf: &mut Vec<f32>, v: &[f32]) -> u32 {
    let at = buf.len() as u32;
    buf.extend_from_slice(v);
    at
}

/// Append `n` NaNs (an output region) and return its element offset.
fn push_nan(buf: &mut Vec<f32>, n: usize) -> u32 {
    let at = buf.len() as u32;
    buf.resize(buf.len() + n, f32::NAN);
    at
}

#[test]
fn premix_matches_cpu_with_and_without_engram_site() {
    let Some(ctx) = gpu() else { return };
    let k = MhcKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for hidden in [40usize, 300] {
        for layer in 0..4usize {
            for site in [false, true] {
                let lanes = random_vec(&mut rng, 4 * hidden, 2.0);
                let p_pre = random_vec(&mut rng, 4, 1.5);
                let key = random_vec(&mut rng, hidden, 1.0);
                let value = random_vec(&mut rng, hidden, 1.0);
                let a_pre = random_vec(&mut rng, 4, 1.0);
                let b_pre = random_vec(&mut rng, 16, 1.0);
                let norm_u = random_vec(&mut rng, hidden, 0.3);
                let norm_k = random_vec(&mut rng, hidden, 0.3);

                // CPU twin (SPEC §4.3 steps 3 and 4).
                let gate = EngramGate {
                    key: &key,
                    value: &value,
                    norm_u: &norm_u,
                    norm_k: &norm_k,
                };
                let (mut u, mut b) = (vec![f32::NAN; hidden], vec![f32::NAN; hidden]);
                premix(
                    layer,
                    a_pre[layer],
                    &b_pre[4 * layer..4 * layer + 4],
                    &p_pre,
                    &lanes,
                    site.then_some(gate),
                    &mut u,
                    &mut b,
                );

                let mut act = vec![0.5f32; 3];
                let mut vecs = vec![7.0f32; 5];
                let p = PremixParams {
                    hidden: hidden as u32,
                    layer: layer as u32,
                    site: site as u32,
                    p_pre: push(&mut act, &p_pre),
                    key: push(&mut act, &key),
                    value: push(&mut act, &value),
                    u: push_nan(&mut act, hidden),
                    b: push_nan(&mut act, hidden),
                    a_pre: push(&mut vecs, &a_pre) + layer as u32,
                    b_pre: push(&mut vecs, &b_pre) + 4 * layer as u32,
                    norm_u: push(&mut vecs, &norm_u),
                    norm_k: push(&mut vecs, &norm_k),
                    lanes_stride: 0,
                    act_stride: 0,
                    _pad: [0; 2],
                };
                push_nan(&mut act, 5);
                let lb = ctx.storage_init("lanes", bytemuck::cast_slice(&lanes));
                let ab = ctx.storage_init("act", bytemuck::cast_slice(&act));
                let vb = ctx.storage_init("vectors", bytemuck::cast_slice(&vecs));
                run_dispatches(&ctx, &[k.premix(&ctx, &p, &lb, &ab, &vb)]).unwrap();
                let got = ctx.read_f32(&ab, 0, act.len()).unwrap();
                let what = format!("hidden {hidden} layer {layer} site {site}");
                let eu = rel_l2(&got[p.u as usize..][..hidden], &u);
                let eb = rel_l2(&got[p.b as usize..][..hidden], &b);
                assert!(eu <= 1e-5, "premix u {what}: {eu}");
                assert!(eb <= 1e-5, "premix b {what}: {eb}");
                if site {
                    assert!(
                        rel_l2(&b, &u) > 1e-3,
                        "the engram term should matter ({what})"
                    );
                }
                let tail = p.b as usize + hidden;
                assert!(
                    got[tail..].iter().all(|v| v.is_nan()),
                    "premix wrote past b ({what})"
                );
                assert_eq!(
                    &got[..p.u as usize],
                    &act[..p.u as usize],
                    "premix changed its inputs ({what})"
                );
                assert_eq!(
                    ctx.read_f32(&lb, 0, lanes.len()).unwrap(),
                    lanes,
                    "premix changed the lanes"
                );
            }
        }
    }
}

#[test]
fn route_matches_cpu_in_place_on_the_lanes() {
    let Some(ctx) = gpu() else { return };
    let k = MhcKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    let iters = 20usize;
    for hidden in [40usize, 300, 513] {
        for layer in 0..4usize {
            let lanes = random_vec(&mut rng, 4 * hidden, 2.0);
            let update = random_vec(&mut rng, hidden, 1.0);
            let p_post = random_vec(&mut rng, 4, 1.5);
            let p_res = random_vec(&mut rng, 16, 1.5);
            let a_post = random_vec(&mut rng, 4, 1.0);
            let b_post = random_vec(&mut rng, 16, 1.0);
            let a_res = random_vec(&mut rng, 4, 1.0);
            let b_res = random_vec(&mut rng, 64, 2.0);

            // CPU twin (SPEC §4.3 steps 8 and 9), in place on a copy of the lanes.
            let mut want = lanes.clone();
            let route = route(
                layer,
                a_post[layer],
                &b_post[4 * layer..4 * layer + 4],
                a_res[layer],
                &b_res[16 * layer..16 * layer + 16],
                iters,
                &p_post,
                &p_res,
                &update,
                &mut want,
            );

            let mut act = vec![0.25f32; 2];
            let mut vecs = vec![3.0f32; 3];
            let p = RouteParams {
                hidden: hidden as u32,
                layer: layer as u32,
                iters: iters as u32,
                p_post: push(&mut act, &p_post),
                p_res: push(&mut act, &p_res),
                update: push(&mut act, &update),
                a_post: push(&mut vecs, &a_post) + layer as u32,
                b_post: push(&mut vecs, &b_post) + 4 * layer as u32,
                a_res: push(&mut vecs, &a_res) + layer as u32,
                b_res: push(&mut vecs, &b_res) + 16 * layer as u32,
                route_out: push_nan(&mut act, 16),
                lanes_stride: 0,
                act_stride: 0,
                _pad: [0; 3],
            };
            let lb = ctx.storage_init("lanes", bytemuck::cast_slice(&lanes));
            let ab = ctx.storage_init("act", bytemuck::cast_slice(&act));
            let vb = ctx.storage_init("vectors", bytemuck::cast_slice(&vecs));
            run_dispatches(&ctx, &[k.route(&ctx, &p, &lb, &ab, &vb)]).unwrap();
            let got = ctx.read_f32(&lb, 0, 4 * hidden).unwrap();
            let e = rel_l2(&got, &want);
            assert!(e <= 1e-5, "route hidden {hidden} layer {layer}: {e}");
            let got_act = ctx.read_f32(&ab, 0, act.len()).unwrap();
            let r = p.route_out as usize;
            let flat: Vec<f32> = route.iter().flatten().copied().collect();
            let e = rel_l2(&got_act[r..r + 16], &flat);
            assert!(e <= 1e-5, "route weights written: {e}");
            assert_eq!(
                &got_act[..r],
                &act[..r],
                "route changed act outside its weights"
            );
        }
    }
}

/// premix and route over several token slots in one dispatch: each slot's
/// inputs are its own random values at the slot strides, and each slot's outputs
/// must equal the CPU twin run on that slot alone; the gaps between slots
/// (NaN) stay untouched.
#[test]
fn premix_and_route_run_every_slot_as_if_alone() {
    let Some(ctx) = gpu() else { return };
    let k = MhcKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    let (hidden, layer, iters, slots) = (300usize, 1usize, 20usize, 5usize);
    // Per slot in act: p (24 values: p_pre, p_post, p_res), key, value, update,
    // then u, b and the 16 route weights (outputs); a NaN gap after each slot.
    let (p_at, key_at, value_at, update_at) = (0, 24, 24 + hidden, 24 + 2 * hidden);
    let (u_at, b_at, route_at) = (24 + 3 * hidden, 24 + 4 * hidden, 24 + 5 * hidden);
    let act_stride = route_at + 16 + 7;
    let lanes_stride = 4 * hidden + 9;
    let vecs_a = random_vec(&mut rng, 4, 1.0);
    let vecs_b = random_vec(&mut rng, 16, 1.0);
    let a_res = random_vec(&mut rng, 4, 1.0);
    let b_res = random_vec(&mut rng, 64, 2.0);
    let norm_u = random_vec(&mut rng, hidden, 0.3);
    let norm_k = random_vec(&mut rng, hidden, 0.3);
    let mut vecs = vec![7.0f32; 2];
    let a_off = push(&mut vecs, &vecs_a);
    let b_off = push(&mut vecs, &vecs_b);
    let ar_off = push(&mut vecs, &a_res);
    let br_off = push(&mut vecs, &b_res);
    let nu_off = push(&mut vecs, &norm_u);
    let nk_off = push(&mut vecs, &norm_k);

    let mut act = vec![f32::NAN; slots * act_stride];
    let mut lanes = vec![f32::NAN; slots * lanes_stride];
    let mut want_u = Vec::new();
    let mut want_b = Vec::new();
    let mut want_lanes = Vec::new();
    let mut want_route = Vec::new();
    for j in 0..slots {
        let l = random_vec(&mut rng, 4 * hidden, 2.0);
        let p = random_vec(&mut rng, 24, 1.5);
        let key = random_vec(&mut rng, hidden, 1.0);
        let value = random_vec(&mut rng, hidden, 1.0);
        let update = random_vec(&mut rng, hidden, 1.0);
        let a = j * act_stride;
        act[a + p_at..a + p_at + 24].copy_from_slice(&p);
        act[a + key_at..a + key_at + hidden].copy_from_slice(&key);
        act[a + value_at..a + value_at + hidden].copy_from_slice(&value);
        act[a + update_at..a + update_at + hidden].copy_from_slice(&update);
        lanes[j * lanes_stride..j * lanes_stride + 4 * hidden].copy_from_slice(&l);
        // CPU twins, this slot alone: premix reads the lanes, route then updates them.
        let (mut u, mut b) = (vec![f32::NAN; hidden], vec![f32::NAN; hidden]);
        let gate = EngramGate {
            key: &key,
            value: &value,
            norm_u: &norm_u,
            norm_k: &norm_k,
        };
        premix(
            layer,
            vecs_a[layer],
            &vecs_b[4 * layer..4 * layer + 4],
            &p[..4],
            &l,
            Some(gate),
            &mut u,
            &mut b,
        );
        let mut after = l.clone();
        let r = route(
            layer,
            vecs_a[layer],
            &vecs_b[4 * layer..4 * layer + 4],
            a_res[layer],
            &b_res[16 * layer..16 * layer + 16],
            iters,
            &p[4..8],
            &p[8..24],
            &update,
            &mut after,
        );
        want_u.push(u);
        want_b.push(b);
        want_lanes.push(after);
        want_route.push(r.iter().flatten().copied().collect::<Vec<f32>>());
    }
    let pm = PremixParams {
        hidden: hidden as u32,
        layer: layer as u32,
        site: 1,
        p_pre: p_at as u32,
        u: u_at as u32,
        b: b_at as u32,
        key: key_at as u32,
        value: value_at as u32,
        a_pre: a_off + layer as u32,
        b_pre: b_off + 4 * layer as u32,
        norm_u: nu_off,
        norm_k: nk_off,
        lanes_stride: lanes_stride as u32,
        act_stride: act_stride as u32,
        _pad: [0; 2],
    };
    let rp = RouteParams {
        hidden: hidden as u32,
        layer: layer as u32,
        iters: iters as u32,
        p_post: (p_at + 4) as u32,
        p_res: (p_at + 8) as u32,
        update: update_at as u32,
        a_post: a_off + layer as u32,
        b_post: b_off + 4 * layer as u32,
        a_res: ar_off + layer as u32,
        b_res: br_off + 16 * layer as u32,
        route_out: route_at as u32,
        lanes_stride: lanes_stride as u32,
        act_stride: act_stride as u32,
        _pad: [0; 3],
    };
    let lb = ctx.storage_init("lanes", bytemuck::cast_slice(&lanes));
    let ab = ctx.storage_init("act", bytemuck::cast_slice(&act));
    let vb = ctx.storage_init("vectors", bytemuck::cast_slice(&vecs));
    let ds = [
        k.premix(&ctx, &pm, &lb, &ab, &vb).over_slots(slots),
        k.route(&ctx, &rp, &lb, &ab, &vb).over_slots(slots),
    ];
    run_dispatches(&ctx, &ds).unwrap();
    let got_act = ctx.read_f32(&ab, 0, act.len()).unwrap();
    let got_lanes = ctx.read_f32(&lb, 0, lanes.len()).unwrap();
    for j in 0..slots {
        let a = j * act_stride;
        let eu = rel_l2(&got_act[a + u_at..][..hidden], &want_u[j]);
        let eb = rel_l2(&got_act[a + b_at..][..hidden], &want_b[j]);
        let er = rel_l2(&got_act[a + route_at..][..16], &want_route[j]);
        let el = rel_l2(&got_lanes[j * lanes_stride..][..4 * hidden], &want_lanes[j]);
        assert!(eu <= 1e-5 && eb <= 1e-5, "slot {j}: premix u {eu}, b {eb}");
        assert!(
            er <= 1e-5 && el <= 1e-5,
            "slot {j}: route weights {er}, lanes {el}"
        );
        assert!(
            got_act[a + route_at + 16..a + act_stride]
                .iter()
                .all(|v| v.is_nan()),
            "slot {j}: act written past its route weights"
        );
        assert!(
            got_lanes[j * lanes_stride + 4 * hidden..(j + 1) * lanes_stride]
                .iter()
                .all(|v| v.is_nan()),
            "slot {j}: lanes written past the slot"
        );
    }
}

#[test]
fn mlp_matches_cpu_in_shared_and_global_transforms() {
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    // Every workgroup width a device may get (Capabilities::mlp_workgroup: 64 on
    // CPU adapters, 256 on GPUs) and one between; the shared transform's first
    // pass runs 2 (hd 128), 4 (256, 2048) and 8 (512) values a run; hd 8192
    // exceeds the workgroup-memory transform and takes the global path.
    // Widths above the device's (a run at WebGPU's compatibility limits: 128)
    // cannot be built there.
    let fits = |w: &MlpWorkgroup| w.invocations() <= ctx.caps.wide_workgroup;
    let cases = MlpWorkgroup::ALL.into_iter().filter(fits).flat_map(|w| {
        [
            (80usize, 128usize),
            (200, 256),
            (120, 512),
            (512, 2048),
            (300, 8192),
        ]
        .map(|c| (w, c))
    });
    for (width, (hidden, hd)) in cases {
        let k = MlpKernels::with_workgroup(&ctx, width);
        let wg = width.invocations();
        let b = random_vec(&mut rng, hidden, 2.0);
        let u = random_vec(&mut rng, hidden, 2.0);
        let attn = random_vec(&mut rng, hidden, 3.0);
        let post_norm = random_vec(&mut rng, hidden, 0.3);
        let mlp_norm = random_vec(&mut rng, hidden, 0.3);
        let d1 = random_vec(&mut rng, hd, 1.5);
        let d2 = random_vec(&mut rng, hd, 1.5);
        let d3 = random_vec(&mut rng, hd, 1.5);
        let scale = 0.7f32;

        // CPU twin (SPEC §4.3 end of step 5, steps 6 and 7).
        let mut z = vec![f32::NAN; hd];
        let mut after = vec![f32::NAN; hidden];
        let mut out = vec![f32::NAN; hidden];
        let mut update = vec![f32::NAN; hidden];
        mlp::block(
            &b,
            &u,
            &attn,
            scale,
            &post_norm,
            &mlp_norm,
            [&d1, &d2, &d3],
            &mut z,
            &mut after,
            &mut out,
            &mut update,
        );

        let mut act = vec![0.125f32; 7];
        let mut vecs = vec![5.0f32; 2];
        let p = MlpParams {
            hidden: hidden as u32,
            hd: hd as u32,
            b: push(&mut act, &b),
            u: push(&mut act, &u),
            attn: push(&mut act, &attn),
            after: push_nan(&mut act, hidden),
            update: push_nan(&mut act, hidden),
            out: push_nan(&mut act, hidden),
            z: push_nan(&mut act, hd),
            out_scale: push(&mut vecs, &[scale]),
            post_norm: push(&mut vecs, &post_norm),
            mlp_norm: push(&mut vecs, &mlp_norm),
            d1: push(&mut vecs, &d1),
            d2: push(&mut vecs, &d2),
            d3: push(&mut vecs, &d3),
            tstride: 0,
        };
        push_nan(&mut act, 3);
        let ab = ctx.storage_init("act", bytemuck::cast_slice(&act));
        let vb = ctx.storage_init("vectors", bytemuck::cast_slice(&vecs));
        run_dispatches(&ctx, &[k.mlp(&ctx, &p, &ab, &vb)]).unwrap();
        let got = ctx.read_f32(&ab, 0, act.len()).unwrap();
        let ea = rel_l2(&got[p.after as usize..][..hidden], &after);
        let eu = rel_l2(&got[p.update as usize..][..hidden], &update);
        assert!(ea <= 1e-5, "mlp {wg} after hidden {hidden} hd {hd}: {ea}");
        assert!(eu <= 1e-5, "mlp {wg} update hidden {hidden} hd {hd}: {eu}");
        let eo = rel_l2(&got[p.out as usize..][..hidden], &out);
        assert!(eo <= 1e-5, "mlp {wg} out hidden {hidden} hd {hd}: {eo}");
        let end = p.z as usize + hd;
        assert!(
            got[end..].iter().all(|v| v.is_nan()),
            "mlp {wg} wrote past z (hd {hd})"
        );
        assert_eq!(
            &got[..p.after as usize],
            &act[..p.after as usize],
            "mlp changed its inputs (hd {hd})"
        );
    }
}

#[test]
fn engram_conv_runs_slots_of_distinct_sequences_on_their_own_rings() {
    // A batch pass's decode tokens: one dispatch over 3 token slots, slot y
    // reading its position and sequence from its step words (y · step_stride
    // on) and its v / writing its value at y · act_stride, on the ring of its
    // sequence (4 sequences' rings, ring_seq_stride apart, 2 sites each; the
    // slot-to-sequence map permuted, positions across the ring's wrap).
    // Against the CPU twin per slot; every other ring row and the unused
    // sequence's rings unchanged, nothing written outside the values.
    let Some(ctx) = gpu() else { return };
    let k = EngramKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(36);
    let (hidden, taps, dilation) = (70usize, 4usize, 3usize);
    let ring = (taps - 1) * dilation + 1;
    let (seqs, slots) = (4usize, 3usize);
    let seq_stride = 2 * ring * hidden + 13; // two sites and a gap
    let (act_stride, step_stride, seq_at) = (2 * hidden + 5, 9usize, 7usize);
    let rings = random_vec(&mut rng, seqs * seq_stride, 1.0);
    let conv = random_vec(&mut rng, taps * hidden, 1.0);
    let mut vecs = vec![2.0f32; 3];
    let conv_at = push(&mut vecs, &conv);
    let slot_seq = [2usize, 0, 3];
    let slot_t = [40u64, 2, 11];
    let mut act = vec![f32::NAN; slots * act_stride];
    let mut step = vec![0u32; slots * step_stride];
    let mut want_rings = rings.clone();
    let mut want_act = act.clone();
    for y in 0..slots {
        let v = random_vec(&mut rng, hidden, 1.0);
        act[y * act_stride + 3..][..hidden].copy_from_slice(&v);
        want_act[y * act_stride + 3..][..hidden].copy_from_slice(&v);
        step[y * step_stride + StepLayout::POS] = slot_t[y] as u32;
        step[y * step_stride + seq_at] = slot_seq[y] as u32;
        // The second site's ring of the slot's sequence.
        let at = slot_seq[y] * seq_stride + ring * hidden;
        let mut value = vec![f32::NAN; hidden];
        let r = &mut want_rings[at..at + ring * hidden];
        engram_conv(slot_t[y], taps, dilation, &v, &conv, r, &mut value);
        want_act[y * act_stride + 3 + hidden..][..hidden].copy_from_slice(&value);
    }
    let p = EngramConvParams {
        hidden: hidden as u32,
        taps: taps as u32,
        dilation: dilation as u32,
        ring: ring as u32,
        v: 3,
        value: (3 + hidden) as u32,
        ring_off: (ring * hidden) as u32,
        conv: conv_at,
        step_stride: step_stride as u32,
        act_stride: act_stride as u32,
        seq_at: seq_at as u32,
        ring_seq_stride: seq_stride as u32,
    };
    let ab = ctx.storage_init("act", bytemuck::cast_slice(&act));
    let vb = ctx.storage_init("vectors", bytemuck::cast_slice(&vecs));
    let sb = ctx.storage_init("step", bytemuck::cast_slice(&step));
    let rb = ctx.storage_init("rings", bytemuck::cast_slice(&rings));
    let d = k.conv(&ctx, &p, &ab, &vb, &sb, &rb).over_slots(slots);
    run_dispatches(&ctx, &[d]).unwrap();
    let got = ctx.read_f32(&ab, 0, act.len()).unwrap();
    for (i, (g, w)) in got.iter().zip(&want_act).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "act[{i}] written: {g}");
        } else {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "act[{i}] (slot {}): {g} vs {w}",
                i / act_stride
            );
        }
    }
    let got_rings = ctx.read_f32(&rb, 0, rings.len()).unwrap();
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    assert_eq!(bits(&got_rings), bits(&want_rings), "rings");
}

#[test]
fn engram_conv_matches_cpu_and_writes_the_ring_row() {
    let Some(ctx) = gpu() else { return };
    let k = EngramKernels::new(&ctx);
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    let hidden = 300usize;
    for (taps, dilation) in [(3usize, 2usize), (4, 3)] {
        let ring = (taps - 1) * dilation + 1;
        for t in [0u64, 1, 5, 40] {
            let v = random_vec(&mut rng, hidden, 1.0);
            let conv = random_vec(&mut rng, taps * hidden, 1.0);
            // Two sites' rings; this test runs the second. Rows of positions < 0 are NaN:
            // they must never be read.
            let other = random_vec(&mut rng, ring * hidden, 1.0);
            let mut mine = random_vec(&mut rng, ring * hidden, 1.0);
            for r in 0..ring {
                if t < ring as u64 && r as u64 > t {
                    mine[r * hidden..(r + 1) * hidden].fill(f32::NAN);
                }
            }

            // CPU twin (SPEC §4.2): ring write and value.
            let mut want_ring = mine.clone();
            let mut want = vec![f32::NAN; hidden];
            engram_conv(t, taps, dilation, &v, &conv, &mut want_ring, &mut want);

            let mut act = vec![0.5f32; 9];
            let mut vecs = vec![2.0f32; 4];
            let p = EngramConvParams {
                hidden: hidden as u32,
                taps: taps as u32,
                dilation: dilation as u32,
                ring: ring as u32,
                v: push(&mut act, &v),
                value: push_nan(&mut act, hidden),
                ring_off: (ring * hidden) as u32,
                conv: push(&mut vecs, &conv),
                step_stride: 0,
                act_stride: 0,
                seq_at: 5,
                ring_seq_stride: 0,
            };
            push_nan(&mut act, 2);
            let mut step = vec![0u32; 8];
            step[StepLayout::TOKEN] = 17;
            step[StepLayout::POS] = t as u32;
            step[StepLayout::SLOT] = 12345;
            let rings: Vec<f32> = [other.clone(), mine].concat();
            let ab = ctx.storage_init("act", bytemuck::cast_slice(&act));
            let vb = ctx.storage_init("vectors", bytemuck::cast_slice(&vecs));
            let sb = ctx.storage_init("step", bytemuck::cast_slice(&step));
            let rb = ctx.storage_init("rings", bytemuck::cast_slice(&rings));
            run_dispatches(&ctx, &[k.conv(&ctx, &p, &ab, &vb, &sb, &rb)]).unwrap();
            let got = ctx.read_f32(&ab, 0, act.len()).unwrap();
            let what = format!("taps {taps} dilation {dilation} t {t}");
            let e = rel_l2(&got[p.value as usize..][..hidden], &want);
            assert!(e <= 1e-5, "engram value {what}: {e}");
            assert!(
                got[p.value as usize + hidden..].iter().all(|v| v.is_nan()),
                "wrote past value ({what})"
            );
            let got_rings = ctx.read_f32(&rb, 0, rings.len()).unwrap();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
            assert_eq!(
                bits(&got_rings[..ring * hidden]),
                bits(&other),
                "other site's ring changed ({what})"
            );
            assert_eq!(
                bits(&got_rings[ring * hidden..]),
                bits(&want_ring),
                "ring rows ({what})"
            );
        }
    }
}
