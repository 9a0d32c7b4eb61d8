//! Tests that start copies of their own binary as child processes (the ignored test
//! `child`, told its role by `PACELINE_CHILD`), read a clock every process shares, and log
//! what they did for the parent to read.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// The role this process plays (`PACELINE_CHILD`) and the file it opens
/// (`PACELINE_FILE`), or `None` where it is no child (the test `child` run by itself).
pub(crate) fn role_and_file() -> Option<(String, std::path::PathBuf)> {
    let role = std::env::var("PACELINE_CHILD").ok()?;
    Some((role, var("PACELINE_FILE").into()))
}

/// Environment variable `name`, which the parent set for this child.
pub(crate) fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// Waits for `child` up to `limit`, and returns what it printed; kills it and fails if it
/// is still running then, or if it failed.
pub(crate) fn finish(mut child: Child, limit: Duration) -> String {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            if let Some(stdout) = child.stdout.as_mut() {
                stdout.read_to_string(&mut out).unwrap();
            }
            assert!(status.success(), "child failed: {status}; said {out}");
            return out;
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("a child hung: killed after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for every one of `children`, a minute each at most ([`finish`]).
pub(crate) fn finish_all(children: Vec<Child>) {
    for child in children {
        finish(child, Duration::from_secs(60));
    }
}

/// An append-only log of records of `N` words: one `write` each, so a child killed at any
/// point leaves every record it finished.
pub(crate) struct Log(File);

impl Log {
    pub(crate) fn create(path: &Path) -> Log {
        Log(fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .unwrap())
    }

    pub(crate) fn record<const N: usize>(&self, words: [u64; N]) {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        (&self.0).write_all(&bytes).unwrap();
    }
}

/// The records of `N` words of every log file (`*.log`) in `dir`.
pub(crate) fn logged<const N: usize>(dir: &Path) -> Vec<[u64; N]> {
    let mut all = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            let bytes = fs::read(&path).unwrap();
            all.extend(bytes.chunks_exact(8 * N).map(|record| {
                core::array::from_fn(|i| {
                    u64::from_ne_bytes(record[8 * i..8 * i + 8].try_into().unwrap())
                })
            }));
        }
    }
    all
}

/// The variables of child `i`, which opens `file` and logs to `<i>.log` in `logs` for
/// `secs` seconds (`PACELINE_INDEX`, `PACELINE_FILE`, `PACELINE_LOG`, `PACELINE_SECS`),
/// and `more`.
pub(crate) fn logging_vars(
    logs: &Path,
    file: &Path,
    i: usize,
    secs: f64,
    more: (&'static str, u64),
) -> Vec<(&'static str, String)> {
    let log = logs.join(format!("{i}.log"));
    vec![
        ("PACELINE_INDEX", i.to_string()),
        ("PACELINE_FILE", file.display().to_string()),
        ("PACELINE_LOG", log.display().to_string()),
        ("PACELINE_SECS", secs.to_string()),
        (more.0, more.1.to_string()),
    ]
}

/// The most admissions provably inside one window of `w` ns: of `brackets` (each
/// admission's `(earliest, latest)`, sorted by their start), those wholly inside it.
pub(crate) fn most_in_window(brackets: &[(u64, u64)], w: u64) -> usize {
    let mut best = 0;
    for (i, &(start, _)) in brackets.iter().enumerate() {
        // Brackets sorted by their start: every later one starts inside the window; count
        // those that also end in it.
        let inside = brackets[i..]
            .iter()
            .take_while(|&&(s, _)| s <= start + w)
            .filter(|&&(_, e)| e <= start + w)
            .count();
        best = best.max(inside);
    }
    best
}

/// Asserts that no window of each length in `windows` (ns) provably holds more than
/// `burst + w / t_ns + 1` of the admissions `brackets` ([`most_in_window`]).
pub(crate) fn assert_bounded(brackets: &[(u64, u64)], windows: &[u64], burst: u64, t_ns: u64) {
    for &w in windows {
        let most = most_in_window(brackets, w);
        let bound = (burst + w / t_ns + 1) as usize;
        assert!(
            most <= bound,
            "{most} admissions in a {w} ns window; the bound is {bound}"
        );
    }
}

/// Until `until`, kills one of `running` at random (SIGKILL, at whatever instruction it
/// is on) every `pause_ms` (a random span in that range, seeded by `seed`) and starts
/// `replace()` in its place; then waits for the children still running. How many it
/// killed.
pub(crate) fn kill_at_random_points(
    mut running: Vec<Child>,
    until: Instant,
    pause_ms: std::ops::Range<u64>,
    seed: u64,
    mut replace: impl FnMut() -> Child,
) -> usize {
    let mut x = seed;
    let mut killed = 0;
    while Instant::now() < until {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let pause = pause_ms.start + x % (pause_ms.end - pause_ms.start);
        std::thread::sleep(Duration::from_millis(pause));
        let mut victim = running.swap_remove((x % running.len() as u64) as usize);
        victim.kill().unwrap();
        victim.wait().unwrap();
        killed += 1;
        running.push(replace());
    }
    finish_all(running);
    killed
}
