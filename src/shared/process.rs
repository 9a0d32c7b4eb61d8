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

/// This process as an owner of something in a file: its id in the high half and the low
/// 32 bits of its start time (clock ticks since boot, where the system tells it) in the low
/// half, so that another process given the same id later is not taken for this one.
pub(crate) fn identity() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    // The identity worked out for the process whose id is in `OF` (a fork's child has
    // another id, and works its own out). Relaxed: each is a pure function of the id, so
    // a stale pair only makes the work be done again.
    static OF: AtomicU64 = AtomicU64::new(0);
    static IDENTITY: AtomicU64 = AtomicU64::new(0);
    let pid = me();
    if OF.load(Ordering::Relaxed) == pid {
        let identity = IDENTITY.load(Ordering::Relaxed);
        if identity >> 32 == pid {
            return identity;
        }
    }
    let identity = pid << 32 | start_time(pid).unwrap_or(0) & 0xffff_ffff;
    IDENTITY.store(identity, Ordering::Relaxed);
    OF.store(pid, Ordering::Relaxed);
    identity
}

/// Whether the process `identity` names may still exist: its id exists and, where the
/// system tells, the process with that id started when the identity says and has not
/// exited (a zombie, not yet reaped by its parent, has).
pub(crate) fn still(identity: u64) -> bool {
    let pid = identity >> 32;
    if !alive(pid) {
        return false;
    }
    match stat(pid) {
        Some(Stat { start, state }) => {
            start & 0xffff_ffff == identity & 0xffff_ffff && !matches!(state, 'Z' | 'X' | 'x')
        }
        // Not told (another system, or a `/proc` that hides other users): the id decides.
        None => true,
    }
}

/// What `/proc/<pid>/stat` says of a process.
struct Stat {
    /// Its start time in clock ticks since boot (field 22).
    start: u64,
    /// Its state (field 3): `Z` for a zombie.
    state: char,
}

/// When process `pid` started, in clock ticks since boot.
fn start_time(pid: u64) -> Option<u64> {
    stat(pid).map(|s| s.start)
}

fn stat(pid: u64) -> Option<Stat> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything: count fields
    // from the last `)`, which is field 2's end; field 3 is the first after it.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some(Stat { start, state })
}

/// This process's PID namespace, as the inode of `/proc/self/ns/pid` (0 where the system
/// does not tell): process ids mean something only within one.
pub(crate) fn namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
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

    #[test]
    fn an_identity_names_this_process_and_not_an_exited_one_or_a_reused_id() {
        let me = identity();
        assert_eq!(me >> 32, super::me());
        assert!(still(me));
        if cfg!(target_os = "linux") {
            assert_ne!(me & 0xffff_ffff, 0, "a start time is read");
            // The same id with another start time: a process that had this id before.
            assert!(!still(me ^ 1));
        }
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = u64::from(child.id());
        child.wait().unwrap();
        assert!(!still(id << 32));
    }

    #[test]
    fn a_zombie_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = u64::from(child.id());
        // Exited, not yet reaped: its id still exists.
        while stat(id).is_some_and(|s| s.state != 'Z') {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(alive(id));
        let identity = id << 32 | start_time(id).unwrap_or(0) & 0xffff_ffff;
        assert_eq!(still(identity), !cfg!(target_os = "linux"));
        child.wait().unwrap();
    }
}
