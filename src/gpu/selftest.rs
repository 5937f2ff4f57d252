//! The subgroup layout self-test run at device open: one tiny dispatch checks that
//! subgroups are aligned runs of `local_invocation_index` and that the shuffles
//! and broadcasts the kernels use behave as that layout implies; on failure the
//! context falls back to the portable kernels.

use super::Capabilities;

/// Workgroup size of the subgroup layout self-test: that of every subgroup kernel.
const PROBE_WG: u32 = 64;
/// Workgroups the self-test dispatches.
const PROBE_GROUPS: u32 = 2;
/// Words each probe invocation writes.
const PROBE_WORDS: u32 = 4;
/// Every check bit of a probe invocation's 4th word.
const PROBE_ALL_OK: u32 = 0xfff;

/// Bits 0..4 of word 3: `subgroupShuffleXor(li, off) == li ^ off` for off = 1, 2,
/// 4, 8 below min(sg, 16) (matvec_sg's reduction); bits 4..12:
/// `subgroupBroadcast(sid, k) == k` for k = 0..8 below sg (matvec_rows_sg's
/// broadcasts from lanes 0..7). Offsets and lanes at or past the size count as
/// passed.
const PROBE_SOURCE: &str = "
@group(0) @binding(0) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(64)
fn probe(@builtin(workgroup_id) wid: vec3<u32>,
         @builtin(local_invocation_index) li: u32,
         @builtin(subgroup_invocation_id) sid: u32,
         @builtin(subgroup_size) sg: u32) {
    var ok = 0u;
    for (var j = 0u; j < 4u; j++) {
        let off = 1u << j;
        if (off < min(sg, 16u)) {
            ok |= select(0u, 1u << j, subgroupShuffleXor(li, off) == (li ^ off));
        } else {
            ok |= 1u << j;
        }
    }
    var b = array<u32, 8>(8u, 8u, 8u, 8u, 8u, 8u, 8u, 8u);
    if (sg > 0u) { b[0] = subgroupBroadcast(sid, 0u); }
    if (sg > 1u) { b[1] = subgroupBroadcast(sid, 1u); }
    if (sg > 2u) { b[2] = subgroupBroadcast(sid, 2u); }
    if (sg > 3u) { b[3] = subgroupBroadcast(sid, 3u); }
    if (sg > 4u) { b[4] = subgroupBroadcast(sid, 4u); }
    if (sg > 5u) { b[5] = subgroupBroadcast(sid, 5u); }
    if (sg > 6u) { b[6] = subgroupBroadcast(sid, 6u); }
    if (sg > 7u) { b[7] = subgroupBroadcast(sid, 7u); }
    for (var k = 0u; k < 8u; k++) {
        ok |= select(0u, 1u << (4u + k), b[k] == k || (k >= sg && b[k] == 8u));
    }
    let at = 4u * (wid.x * 64u + li);
    o[at] = li;
    o[at + 1u] = sid;
    o[at + 2u] = sg;
    o[at + 3u] = ok;
}
";

/// Check the `(local_invocation_index, subgroup_invocation_id, subgroup_size,
/// check bits)` words of a self-test dispatch (see [`subgroup_layout_self_test`]):
/// every invocation reported; one power-of-two size within `min..=max` per
/// workgroup; subgroups are aligned runs of `local_invocation_index`, as far as
/// the kernels use them: `sid ≡ li (mod min(sg, 16))` (matvec_sg pairs 16 lanes
/// of a row by index; lavapipe at LP_NATIVE_VECTOR_WIDTH=1024 reports 32 but
/// numbers runs of 16, which the kernels run correctly); and the shuffles and
/// broadcasts the kernels use returned what that layout implies.
///
/// # Errors
/// What is wrong, in words.
fn check_subgroup_layout(words: &[u32], min: u32, max: u32) -> std::result::Result<(), String> {
    let per = PROBE_WORDS as usize;
    let per_group = per * PROBE_WG as usize;
    if !words.len().is_multiple_of(per_group) || words.is_empty() {
        return Err(format!("{} words, not whole workgroups", words.len()));
    }
    for (g, group) in words.chunks(per_group).enumerate() {
        let sg = group[2];
        if !sg.is_power_of_two() || sg < min || sg > max {
            return Err(format!(
                "workgroup {g}: subgroup size {sg}, the adapter reports {min}..={max}"
            ));
        }
        let run = sg.min(16);
        for (i, t) in group.chunks(per).enumerate() {
            let (li, sid, size, ok) = (t[0], t[1], t[2], t[3]);
            if li != i as u32 {
                return Err(format!("workgroup {g}: invocation {i} reported index {li}"));
            }
            if size != sg {
                return Err(format!(
                    "workgroup {g}: subgroup sizes {sg} and {size} in one workgroup"
                ));
            }
            if sid % run != li % run {
                return Err(format!(
                    "workgroup {g}: invocation {li} has subgroup_invocation_id {sid}, \
                     not ≡ {li} (mod {run})"
                ));
            }
            if ok != PROBE_ALL_OK {
                return Err(format!(
                    "workgroup {g}: invocation {li}: shuffle/broadcast checks {ok:#05x}, \
                     not {PROBE_ALL_OK:#05x}"
                ));
            }
        }
    }
    Ok(())
}

/// One tiny dispatch (2 workgroups of 64, the subgroup kernels' size) in which every
/// invocation writes `(local_invocation_index, subgroup_invocation_id,
/// subgroup_size, check bits)`, checked by [`check_subgroup_layout`] against `caps`'s
/// subgroup size range. Runs in an error scope, so a failure here never becomes
/// the context's sticky error.
pub(crate) fn subgroup_layout_self_test(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    caps: &Capabilities,
) -> std::result::Result<(), String> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let words = (PROBE_WORDS * PROBE_WG * PROBE_GROUPS) as u64;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("cqlm subgroup probe"),
        source: wgpu::ShaderSource::Wgsl(PROBE_SOURCE.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("cqlm subgroup probe"),
        layout: None,
        module: &module,
        entry_point: Some("probe"),
        compilation_options: Default::default(),
        cache: None,
    });
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("cqlm subgroup probe"),
        size: words * 4,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("cqlm subgroup probe readback"),
        size: words * 4,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("cqlm subgroup probe"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: out.as_entire_binding(),
        }],
    });
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(PROBE_GROUPS, 1, 1);
    }
    enc.copy_buffer_to_buffer(&out, 0, &staging, 0, words * 4);
    queue.submit([enc.finish()]);
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(format!("the probe failed to run: {e}"));
    }
    let (tx, rx) = futures_intrusive::channel::shared::oneshot_channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| format!("waiting for the probe failed: {e}"))?;
    match pollster::block_on(rx.receive()) {
        Some(Ok(())) => {}
        _ => return Err("cannot map the probe's output".into()),
    }
    let got: Vec<u32> = {
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| format!("cannot read the probe's output: {e:?}"))?;
        bytemuck::pod_collect_to_vec(&view[..])
    };
    staging.unmap();
    check_subgroup_layout(&got, caps.subgroup_min, caps.subgroup_max)
}

#[cfg(test)]
mod tests {
    use super::check_subgroup_layout;

    /// Probe words of `groups` workgroups of 64 with subgroups of `sg`, laid out by
    /// `sid(li)`, every check bit set.
    fn layout(groups: usize, sg: u32, sid: impl Fn(u32) -> u32) -> Vec<u32> {
        (0..groups)
            .flat_map(|_| {
                (0..64u32)
                    .flat_map(|li| [li, sid(li), sg, 0xfff])
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn subgroup_layout_check_accepts_aligned_runs_and_names_what_is_wrong() {
        for sg in [1u32, 4, 8, 32, 64] {
            assert_eq!(
                check_subgroup_layout(&layout(2, sg, |li| li % sg), 1, 64),
                Ok(())
            );
        }
        // lavapipe at 1024 bits: size 32 reported, runs of 16 numbered.
        assert_eq!(
            check_subgroup_layout(&layout(2, 32, |li| li % 16), 32, 32),
            Ok(())
        );
        // Size outside the adapter's range, or not a power of two.
        let e = check_subgroup_layout(&layout(2, 8, |li| li % 8), 16, 32).unwrap_err();
        assert!(
            e.contains("subgroup size 8") && e.contains("16..=32"),
            "{e}"
        );
        assert!(check_subgroup_layout(&layout(1, 6, |li| li % 6), 1, 64).is_err());
        // Interleaved subgroups (sid = li / 8 for 8 subgroups of 8): not aligned runs.
        let e = check_subgroup_layout(&layout(2, 8, |li| li / 8), 8, 8).unwrap_err();
        assert!(e.contains("subgroup_invocation_id"), "{e}");
        // Subgroups that start mid-run (offset by 1), also at size 32.
        assert!(check_subgroup_layout(&layout(1, 8, |li| (li + 1) % 8), 8, 8).is_err());
        assert!(check_subgroup_layout(&layout(1, 32, |li| (li + 1) % 32), 32, 32).is_err());
        // Two sizes in one workgroup.
        let mut w = layout(1, 8, |li| li % 8);
        w[4 * 40 + 2] = 16;
        assert!(check_subgroup_layout(&w, 8, 16)
            .unwrap_err()
            .contains("sizes"));
        // A failed shuffle or broadcast check.
        let mut w = layout(1, 8, |li| li % 8);
        w[4 * 7 + 3] = 0xff7;
        assert!(check_subgroup_layout(&w, 8, 8)
            .unwrap_err()
            .contains("shuffle"));
        // A missing invocation (index not written) and a truncated readback.
        let mut w = layout(1, 8, |li| li % 8);
        w[4 * 9] = 0;
        assert!(check_subgroup_layout(&w, 8, 8).is_err());
        assert!(check_subgroup_layout(&w[..30], 8, 8).is_err());
    }
}
