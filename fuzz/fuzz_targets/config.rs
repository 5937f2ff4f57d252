//! Any text through the config parser: an error or a valid config, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(c) = cqlm::Config::from_json(text) {
            // Whatever parses must validate and round-trip.
            assert!(c.validate().is_ok());
            assert_eq!(cqlm::Config::from_json(&c.to_json()).ok(), Some(c));
        }
    }
});
