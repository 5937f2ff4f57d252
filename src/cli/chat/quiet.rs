//! Keep what GPU drivers write on stderr while wgpu probes its adapters
//! (e.g. libwayland's `error: XDG_RUNTIME_DIR is invalid or not set`) off the
//! chat's stderr, which holds only cqlm's own lines.

/// Run `f` with file descriptor 2 pointed at `/dev/null` (Unix; elsewhere
/// `f` runs as is). Errors come back through `f`'s value, not stderr.
pub fn without_stderr<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(unix)]
    {
        let _guard = Redirect::to_null();
        f()
    }
    #[cfg(not(unix))]
    {
        f()
    }
}

/// Standard error sent to `/dev/null` until dropped (then restored).
#[cfg(unix)]
struct Redirect {
    saved: libc::c_int,
}

#[cfg(unix)]
impl Redirect {
    /// `None` when the descriptors cannot be set up (stderr then stays as is).
    fn to_null() -> Option<Redirect> {
        use std::io::Write;
        let _ = std::io::stderr().flush();
        // SAFETY: plain descriptor calls on descriptors this function owns or
        // on 2; every failure leaves stderr as it was.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if null < 0 {
                return None;
            }
            let saved = libc::dup(2);
            if saved < 0 {
                libc::close(null);
                return None;
            }
            let ok = libc::dup2(null, 2) >= 0;
            libc::close(null);
            if !ok {
                libc::close(saved);
                return None;
            }
            Some(Redirect { saved })
        }
    }
}

#[cfg(unix)]
impl Drop for Redirect {
    fn drop(&mut self) {
        // SAFETY: `saved` is the descriptor `to_null` duplicated from 2.
        unsafe {
            libc::dup2(self.saved, 2);
            libc::close(self.saved);
        }
    }
}
