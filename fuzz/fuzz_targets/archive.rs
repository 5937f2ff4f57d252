//! Any bytes through the archive reader and model assembly: an error or a model, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = cqlm::Model::from_bytes(data, "fuzz") {
        // A model that loads must also step (tiny ones only, to keep runs fast).
        if model.config.vocab <= 4096 && model.config.hidden <= 512 && model.config.layers <= 8 {
            if let Ok(mut e) = cqlm::CpuEngine::new(std::sync::Arc::new(model)) {
                use cqlm::Engine;
                let _ = e.step(0, true);
            }
        }
    }
});
