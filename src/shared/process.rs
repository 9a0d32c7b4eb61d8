//! Processes as a shared file records them: this one's id, and whether another's still
//! exists (for taking over what a killed process left held).

/// This process's id as a file records it (never 0, which means "nobody").
pub(crate) fn me() -> u64 {
    u64::from(std::process::id()).max(1)
}

/// Whether process `id` may still exist: only the system's "no such process" says it does
/// not. An id no process can have (a damaged word) does not exist.
pub(crate) fn alive(id: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(id) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: `kill` with signal 0 sends nothing; it only checks that the process exists.
    let sent = unsafe { libc::kill(pid, 0) };
    sent == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Whole seconds on `CLOCK_MONOTONIC` (the same for every process of the host), wrapping
/// at 2^32 (136 years): for how old a claim in a file is.
pub(crate) fn seconds() -> u32 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable `timespec`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_exited_is_gone_and_this_one_lives() {
        assert!(alive(me()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = u64::from(child.id());
        child.wait().unwrap();
        assert!(!alive(id));
        assert!(!alive(0));
        assert!(!alive(u64::MAX));
    }
}
