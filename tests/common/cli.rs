//! Running the built `cqlm` binary from integration tests.

use std::path::Path;
use std::process::{Command, Output};

/// Run `cqlm args…` in `dir` (without `RUST_LOG`, so stderr holds only cqlm's own lines).
pub fn cqlm(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .expect("run cqlm")
}

/// Bytes of an output stream as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Assert a run exited 0 without a panic, showing its output otherwise.
pub fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(!text(&out.stderr).contains("panicked"), "{what}");
}

/// A minimal .npy reader: checks a little-endian float32 C-order array and returns (shape, values).
pub fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY", "magic");
    let major = b[6];
    let (hlen, start) = match major {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 => (
            u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize,
            12,
        ),
        v => panic!("unknown .npy version {v}"),
    };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert_eq!(
        (start + hlen) % 16,
        0,
        "data is not 16-byte aligned: {header}"
    );
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let s = header.find("'shape': (").expect("shape") + "'shape': (".len();
    let e = s + header[s..].find(')').unwrap();
    let shape: Vec<usize> = header[s..e]
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().unwrap())
        .collect();
    let data = &b[start + hlen..];
    let n: usize = shape.iter().product();
    assert_eq!(data.len(), n * 4, "data length for shape {shape:?}");
    let values = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (shape, values)
}
