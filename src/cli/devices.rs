//! `cqlm devices`: the GPU adapters wgpu can see.

use anyhow::Result;
use cqlm::gpu::{device_type_name, list_adapters};

pub fn run() -> Result<()> {
    let all = list_adapters();
    if all.is_empty() {
        println!("no GPU adapters found (on Linux without a GPU, install Mesa's lavapipe: mesa-vulkan-drivers)");
        return Ok(());
    }
    for (i, a) in all.iter().enumerate() {
        println!(
            "{i}: {} ({:?}, {}, driver {} {})",
            a.name,
            a.backend,
            device_type_name(a.device_type),
            a.driver,
            a.driver_info
        );
    }
    Ok(())
}
