//! Running `cqlm serve` from integration tests: a server on loopback, raw
//! HTTP/1.1 requests, and the Python with the official `openai` client.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running server, killed on drop.
pub struct Server {
    /// The server process.
    pub child: Child,
    /// `host:port`.
    pub addr: String,
    /// What the server has written to stderr since it printed its address.
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cqlm serve --backend cpu` on a free port with `extra` arguments, once it
/// prints its address.
pub fn start(extra: &[&str]) -> Server {
    start_with_env(extra, &[])
}

/// [`start`] with environment variables set for the server.
pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
    start_on("cpu", extra, env)
}

/// [`start_with_env`] on `backend`.
#[allow(clippy::zombie_processes)] // Server's drop kills and waits
pub fn start_on(backend: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args(["serve", "--backend", backend, "--port", "0"])
        .args(extra)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "the server exited");
        if let Some(rest) = line.split("http://").nth(1) {
            let addr = rest.split('/').next().unwrap().to_string();
            // Keep draining stderr so the server never blocks on it.
            let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let sink = std::sync::Arc::clone(&log);
            std::thread::spawn(move || {
                let mut line = String::new();
                while err.read_line(&mut line).is_ok_and(|n| n > 0) {
                    sink.lock().unwrap().push_str(&line);
                    line.clear();
                }
            });
            return Server { child, addr, log };
        }
    }
}

/// One request: (status, headers, body).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), dechunk(body, head))
}

/// The body of a chunked transfer, joined.
fn dechunk(body: &str, head: &str) -> String {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

pub fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, b) = http(addr, "POST", path, &[], body.to_string().as_bytes());
    (status, serde_json::from_str(&b).unwrap_or(Value::Null))
}

/// `CQLM_OPENAI_PYTHON` (a Python with openai, jinja2 and tokenizers: `.ci/run`'s
/// venv), or None to skip, which `CQLM_REQUIRE_OPENAI` forbids.
pub fn openai_python() -> Option<String> {
    let Ok(python) = std::env::var("CQLM_OPENAI_PYTHON") else {
        assert!(
            std::env::var("CQLM_REQUIRE_OPENAI").is_err(),
            "CQLM_REQUIRE_OPENAI is set but CQLM_OPENAI_PYTHON is not"
        );
        eprintln!("skipped: CQLM_OPENAI_PYTHON (a python with openai==3.51.0) is not set; .ci/run sets it");
        return None;
    };
    Some(python)
}
