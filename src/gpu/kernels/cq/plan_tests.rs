//! Tests of the matvec planner against independent counts (no GPU).

use super::{plan_matvec, Launch, MatvecItem, PlanCaps};
use crate::gpu::arena::{CqPart, GpuCq};
use crate::gpu::kernels::cq::{Reduction, SlotStrides, MAX_TB};
use std::collections::BTreeMap;

/// A small deterministic generator (SplitMix64), so the cases need no GPU or seed crate.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.range(0, v.len() - 1)]
    }
}

/// A matrix of `rows` rows split into parts at random points, each part in a
/// random arena at a packed offset no other part uses (`next_off`).
fn matrix(g: &mut Gen, next_off: &mut u32) -> GpuCq {
    let bits = g.pick(&[1u32, 2, 4, 8]);
    let group = g.pick(&[32usize, 64, 128, 256, 512, 1024]);
    let groups = g.range(1, 6);
    let rows = g.range(1, 3000);
    let n_parts = g.range(1, 5).min(rows);
    let mut cuts: Vec<usize> = (0..n_parts - 1).map(|_| g.range(1, rows - 1)).collect();
    cuts.extend([0, rows]);
    cuts.sort_unstable();
    cuts.dedup();
    let parts = cuts
        .windows(2)
        .map(|w| {
            *next_off += 1000;
            CqPart {
                arena: g.range(0, 2),
                packed_off: *next_off,
                norms_off: *next_off * 2 + 1,
                cb_off: *next_off + 7,
                first_row: w[0],
                rows: w[1] - w[0],
            }
        })
        .collect();
    GpuCq {
        rows,
        cols: groups * group - g.range(0, group - 1),
        bits,
        group,
        groups,
        parts,
    }
}

/// Which (matrix, part) of `ms` a launched part is, by its unique packed offset.
fn find(ms: &[GpuCq], arena: usize, packed_off: u32) -> (usize, CqPart) {
    for (i, m) in ms.iter().enumerate() {
        for p in &m.parts {
            if p.arena == arena && p.packed_off == packed_off {
                return (i, *p);
            }
        }
    }
    panic!("launch names no part: arena {arena} packed_off {packed_off}");
}

/// Check `launches` for `items` (matrix index, first, rows, out_off) against
/// counts made here from the items alone.
fn check(
    ms: &[GpuCq],
    items: &[(usize, usize, usize, usize)],
    strides: SlotStrides,
    red: Reduction,
    caps: PlanCaps,
    vec4_input: bool,
    launches: &[Launch],
) {
    // Every output row exactly once, holding the right matrix row.
    let mut want = BTreeMap::new();
    for &(m, first, rows, out_off) in items {
        for r in 0..rows {
            assert!(want.insert(out_off + r, (m, first + r)).is_none());
        }
    }
    let mut got = BTreeMap::new();
    // Parts per geometry, counted from the items' overlaps with the matrices' parts.
    let geom = |m: &GpuCq, p: &CqPart| (p.arena, m.bits, m.group, m.groups);
    let mut parts_of = BTreeMap::new();
    let mut first_seen = Vec::new();
    for &(m, first, rows, _) in items {
        for p in &ms[m].parts {
            if first < p.first_row + p.rows && p.first_row < first + rows {
                *parts_of.entry(geom(&ms[m], p)).or_insert(0usize) += 1;
                if !first_seen.contains(&geom(&ms[m], p)) {
                    first_seen.push(geom(&ms[m], p));
                }
            }
        }
    }
    let mut launches_of = BTreeMap::new();
    let mut last_seen = 0;
    let tokens = strides.tokens.max(1);
    for l in launches {
        let p = &l.params;
        assert!((1..=4).contains(&p.n_parts), "{p:?}");
        assert!(p.parts[p.n_parts as usize..].iter().all(|q| *q == [0; 8]));
        let mut total = 0;
        let mut key = None;
        for q in &p.parts[..p.n_parts as usize] {
            let (mi, part) = find(ms, l.arena, q[0]);
            let m = &ms[mi];
            assert_eq!((q[1], q[2]), (part.norms_off, part.cb_off));
            assert!(q[4] >= 1 && (q[3] + q[4]) as usize <= part.rows);
            // One geometry per launch, and the params describe it.
            let k = geom(m, &part);
            assert_eq!(*key.get_or_insert(k), k, "mixed geometries in {p:?}");
            assert_eq!(l.bits, m.bits);
            assert_eq!((l.padded, l.row_groups), (m.padded(), m.groups));
            assert_eq!(p.group as usize, m.group);
            assert_eq!(p.group_words as usize, m.group_words());
            assert_eq!(p.row_words as usize, m.row_words());
            for i in 0..q[4] as usize {
                let row = part.first_row + q[3] as usize + i;
                let dup = got.insert(q[5] as usize + i, (mi, row));
                assert!(dup.is_none(), "output {} written twice", q[5] as usize + i);
            }
            total += q[4];
        }
        assert_eq!(p.total_rows, total);
        // Geometries come in the order they first appear.
        let at = first_seen.iter().position(|k| Some(*k) == key).unwrap();
        assert!(at >= last_seen, "geometry order");
        last_seen = at;
        *launches_of.entry(key.unwrap()).or_insert(0usize) += 1;
        // The grid: within the limit, enough workgroups for every row, not a
        // whole grid row more.
        let rows_per_wg = match red {
            Reduction::RowPerInvocation | Reduction::RowPerInvocationSubgroup => 256,
            _ => 4 * p.team_rows,
        };
        assert!((1..=16).contains(&p.team_rows));
        assert!(p.team_rows == 16 || p.total_rows <= 512 * p.team_rows);
        assert!(p.team_rows == 1 || p.total_rows > 512 * (p.team_rows - 1));
        let [gx, gy, gz] = l.groups;
        assert_eq!(p.grid_x, gx);
        assert!(gx >= 1 && gx <= caps.max_workgroups_per_dim && gy >= 1);
        let need = p.total_rows.div_ceil(rows_per_wg) as u64;
        assert!(gx as u64 * gy as u64 >= need);
        assert!((gy as u64 - 1) * (gx as u64) < need);
        // The batch and the batched kernel.
        assert_eq!(
            (p.tokens as usize, p.x_tstride as usize),
            (tokens, strides.x_stride)
        );
        assert_eq!(p.y_tstride as usize, strides.y_stride);
        let eligible = red == Reduction::RowPerInvocationSubgroup
            && caps.subgroup_min >= 8
            && vec4_input
            && tokens > 1
            && (l.bits == 2 || l.bits == 4)
            && p.group_words % 4 == 0;
        assert_eq!(l.batched, eligible, "{l:?}");
        let tb = p.tb as usize;
        if l.batched {
            assert!((2..=MAX_TB).contains(&tb) && tb <= tokens);
            // The most inputs a block takes, halved (rounding up, not below 2)
            // while the row workgroups times the blocks leave the device idle.
            let full = tokens.min(MAX_TB);
            let busy = |tb: usize| gx as usize * gy as usize * tokens.div_ceil(tb);
            let mut want = full;
            while want > 2 && busy(want) < caps.parallel as usize {
                want = want.div_ceil(2);
            }
            assert_eq!(tb, want, "{l:?}");
            assert!(tb == full || busy(tb) <= 2 * caps.parallel as usize);
            // A workgroup per block where the grid allows, each block run once.
            let blocks = tokens.div_ceil(tb) as u32;
            assert_eq!(gz, blocks.min(caps.max_workgroups_per_dim));
        } else {
            assert_eq!((tb, gz), (1, 1));
        }
    }
    assert_eq!(got, want, "rows covered");
    // Fused four at a time: ceil(parts / 4) launches per geometry.
    let fused: BTreeMap<_, _> = parts_of.iter().map(|(k, n)| (*k, n.div_ceil(4))).collect();
    assert_eq!(launches_of, fused, "launches per geometry");
}

#[test]
fn plans_cover_every_row_once_within_the_grid_and_fuse_by_four() {
    let mut g = Gen(15);
    let reds = Reduction::ALL;
    for case in 0..400 {
        let mut off = 0;
        let ms: Vec<GpuCq> = (0..g.range(1, 4))
            .map(|_| matrix(&mut g, &mut off))
            .collect();
        // Items: random row ranges (several per matrix at times), outputs packed
        // one after another from a random start.
        let mut out_at = g.range(0, 50);
        let items: Vec<(usize, usize, usize, usize)> = (0..g.range(1, 6))
            .map(|_| {
                let m = g.range(0, ms.len() - 1);
                let first = g.range(0, ms[m].rows - 1);
                let rows = g.range(1, ms[m].rows - first);
                out_at += rows;
                (m, first, rows, out_at - rows)
            })
            .collect();
        let refs: Vec<MatvecItem<'_>> = items
            .iter()
            .map(|&(m, a, b, o)| (&ms[m], a, b, o))
            .collect();
        let strides = SlotStrides {
            tokens: g.pick(&[0usize, 1, 2, 3, 7, 8, 9, 32]),
            x_stride: g.range(0, 5000),
            y_stride: g.range(0, 5000),
        };
        let red = reds[case % 4];
        let caps = PlanCaps {
            max_workgroups_per_dim: g.pick(&[1u32, 2, 3, 7, 65535]),
            subgroup_min: g.pick(&[4u32, 8, 32]),
            parallel: g.pick(&[1u32, 2, 16]),
        };
        let vec4_input = case % 8 < 4;
        let launches = plan_matvec(&refs, strides, red, caps, vec4_input);
        check(&ms, &items, strides, red, caps, vec4_input, &launches);
    }
}

#[test]
fn a_split_matrix_fuses_its_parts_and_a_small_grid_wraps() {
    // 300 rows in 5 parts of one arena: rows 10..290 touch all 5, fused 4 + 1;
    // with 2 workgroups per dimension the 16-lane kernel's 58 workgroups for the
    // first launch (team_rows 1: 4 rows each) wrap into 2 × 29.
    let parts = (0..5)
        .map(|k| CqPart {
            arena: 0,
            packed_off: 100 * k as u32,
            norms_off: 0,
            cb_off: 0,
            first_row: 60 * k,
            rows: 60,
        })
        .collect();
    let m = GpuCq {
        rows: 300,
        cols: 256,
        bits: 4,
        group: 128,
        groups: 2,
        parts,
    };
    let caps = PlanCaps {
        max_workgroups_per_dim: 2,
        subgroup_min: 8,
        parallel: 1,
    };
    let l = plan_matvec(
        &[(&m, 10, 280, 5)],
        SlotStrides::single(),
        Reduction::Portable,
        caps,
        false,
    );
    assert_eq!(l.len(), 2);
    assert_eq!((l[0].params.n_parts, l[0].params.total_rows), (4, 230));
    assert_eq!((l[1].params.n_parts, l[1].params.total_rows), (1, 50));
    assert_eq!(l[0].params.parts[0], [0, 0, 0, 10, 50, 5, 0, 0]);
    assert_eq!(l[1].params.parts[0], [400, 0, 0, 0, 50, 235, 0, 0]);
    assert_eq!(l[0].groups, [2, 29, 1]);
    // Row kernels: 256 rows per workgroup; 8 prepared inputs a block.
    let b = SlotStrides {
        tokens: 20,
        x_stride: 300,
        y_stride: 400,
    };
    let l = plan_matvec(
        &[(&m, 0, 300, 0)],
        b,
        Reduction::RowPerInvocationSubgroup,
        caps,
        true,
    );
    assert_eq!(l.len(), 2);
    // 3 blocks of 8 inputs, over the 2 workgroups in z the grid allows.
    assert!(l
        .iter()
        .all(|l| l.batched && l.params.tb == 8 && l.groups == [1, 1, 2]));
    // Where the device runs 4 workgroups at once, blocks of 4 (5 of them; 2 in z).
    let wide = PlanCaps {
        parallel: 4,
        ..caps
    };
    let l = plan_matvec(
        &[(&m, 0, 300, 0)],
        b,
        Reduction::RowPerInvocationSubgroup,
        wide,
        true,
    );
    assert!(l.iter().all(|l| l.params.tb == 4 && l.groups == [1, 1, 2]));
    let l = plan_matvec(
        &[(&m, 0, 300, 0)],
        b,
        Reduction::RowPerInvocation,
        caps,
        true,
    );
    assert!(l.iter().all(|l| !l.batched && l.params.tb == 1));
    // A raw input (or one the batched kernel can't read as vec4s): one input at a time.
    let l = plan_matvec(
        &[(&m, 0, 300, 0)],
        b,
        Reduction::RowPerInvocationSubgroup,
        caps,
        false,
    );
    assert!(l
        .iter()
        .all(|l| !l.batched && l.params.tb == 1 && l.groups[2] == 1));
}
