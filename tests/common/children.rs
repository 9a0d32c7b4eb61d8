//! Tests that start copies of their own binary as child processes (the ignored test
//! `child`, told its role by `PACELINE_CHILD`), and read a clock every process shares.

use std::process::{Child, Command, Stdio};

/// The arguments that run only the ignored test `child`, its output not captured.
pub(crate) const CHILD_ARGS: [&str; 6] = [
    "child",
    "--exact",
    "--ignored",
    "--nocapture",
    "--test-threads",
    "1",
];

/// `CLOCK_MONOTONIC` in nanoseconds: the same for every process of the host.
pub(crate) fn monotonic() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Starts a child running `role` with `vars` (as environment variables), its stdout piped.
pub(crate) fn spawn(role: &str, vars: &[(&str, String)]) -> Child {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(CHILD_ARGS)
        .env("PACELINE_CHILD", role)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (name, value) in vars {
        command.env(name, value);
    }
    // Its own process group, so nothing of ours is signalled along with it.
    command.process_group(0);
    command.spawn().unwrap()
}
