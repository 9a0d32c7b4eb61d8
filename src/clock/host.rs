//! The clock the processes of one host read alike, for limiters whose word lives in a
//! file they all map (`crate::shared`).
//!
//! # Implementation notes
//!
//! [`DefaultClock`] scales the time-stamp counter by a factor each process calibrates for
//! itself: two processes differ by their calibration error times the machine's uptime
//! (0.001 % of a day is almost a second), so two of them comparing instants in one word
//! would disagree by far more than a cell. A `HostClock` takes its scale from the shared
//! file instead, measured once by the process that created it, so every process maps the
//! same counter reading to the same nanosecond:
//!
//! * **[`HostTime::Counter`]** (x86-64 Linux, where the kernel itself keeps time with the
//!   TSC, so it is invariant and synchronised across cores): the counter times the file's
//!   scale. Readings differ between processes only by the counter's skew between cores,
//!   which Linux checks at boot and bounds below a microsecond before it trusts the TSC.
//!   A read costs what a [`DefaultClock`] read costs (an `rdtsc`, a multiply and a shift).
//! * **[`HostTime::Monotonic`]** (everywhere else): `CLOCK_MONOTONIC`, the kernel's own
//!   clock, the same number in every process. A read is a system call through the vDSO:
//!   about 40 ns on the 2-core CI machine, against 12-15 ns for the counter, so it is the
//!   fallback, not the default.
//!
//! The scale's own error (from a 10 ms calibration against `CLOCK_MONOTONIC`, about a
//! part in 10^5) changes every process's rate alike and by that much; it never makes two
//! processes disagree.

use core::task::Waker;
use core::time::Duration;

use super::{timer, Clock, DefaultClock};

/// How a host's limiter time is read (stored in the shared file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostTime {
    /// The time-stamp counter times `scale` (nanoseconds per 2^32 ticks).
    Counter { scale: u64 },
    /// `CLOCK_MONOTONIC` in nanoseconds.
    Monotonic,
}

/// A clock that reads [`HostTime`]; wake-ups go to the default clock's timer thread.
#[derive(Clone, Debug)]
pub(crate) struct HostClock {
    time: HostTime,
    /// For converting an instant into the timer's time.
    default: DefaultClock,
}

impl HostClock {
    pub(crate) fn new(time: HostTime) -> HostClock {
        HostClock {
            time,
            default: DefaultClock::default(),
        }
    }

    /// The time source a new shared file should record on this machine: the counter
    /// where the kernel trusts it, with a scale measured now (10 ms), else the monotonic
    /// clock.
    pub(crate) fn choose() -> HostTime {
        if counter_is_trusted() {
            if let Some(scale) = calibrate() {
                return HostTime::Counter { scale };
            }
        }
        HostTime::Monotonic
    }

    /// Whether this process can read `time` as every other process on the host does.
    pub(crate) fn can_read(time: HostTime) -> bool {
        match time {
            HostTime::Counter { scale } => scale != 0 && cfg!(target_arch = "x86_64"),
            HostTime::Monotonic => true,
        }
    }
}

impl Clock for HostClock {
    #[inline]
    fn now(&self) -> u64 {
        match self.time {
            HostTime::Counter { scale } => {
                // 128-bit product: exact, and the shift brings it back under u64 for any
                // uptime below 584 years at the scale's rate.
                ((u128::from(ticks()) * u128::from(scale)) >> 32) as u64
            }
            HostTime::Monotonic => monotonic(),
        }
    }

    fn wake_at(&self, at: u64, waker: Waker) {
        // The timer keeps the default clock's time: move the instant over by the distance
        // from now. Both clocks run at the machine's rate to a part in 10^5, so the wake is
        // early or late by that part of the wait, and an early one only re-arms.
        let delay = at.saturating_sub(self.now());
        if delay == 0 {
            waker.wake();
            return;
        }
        timer::wake_at(self.default.now().saturating_add(delay), waker);
    }

    fn forget_waker(&self, waker: &Waker) {
        timer::forget(waker);
    }
}

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86-64 (a counter a process may always
    // read); `can_read` keeps `Counter` files to this architecture.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

/// No counter read elsewhere: `can_read` refuses `Counter` files there.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn ticks() -> u64 {
    0
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub(crate) fn monotonic() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec`; CLOCK_MONOTONIC exists on every
    // platform this module builds for, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Whether the kernel keeps its own time with the TSC (and so has checked that it is
/// invariant and synchronised across cores).
fn counter_is_trusted() -> bool {
    cfg!(all(target_arch = "x86_64", target_os = "linux"))
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|source| source.trim() == "tsc")
}

/// Nanoseconds per 2^32 counter ticks, measured against `CLOCK_MONOTONIC` over 10 ms.
fn calibrate() -> Option<u64> {
    // Each reading of the pair takes the one with the shortest gap between its two
    // monotonic reads, so a preemption between them does not skew the scale.
    let pair = || {
        (0..5)
            .map(|_| {
                let before = monotonic();
                let t = ticks();
                let after = monotonic();
                (after - before, before / 2 + after / 2, t)
            })
            .min_by_key(|&(gap, _, _)| gap)
            .map(|(_, ns, t)| (ns, t))
    };
    let (ns0, t0) = pair()?;
    std::thread::sleep(Duration::from_millis(10));
    let (ns1, t1) = pair()?;
    let (dns, dt) = (ns1.checked_sub(ns0)?, t1.checked_sub(t0)?);
    if dt == 0 || dns == 0 {
        return None;
    }
    u64::try_from((u128::from(dns) << 32) / u128::from(dt)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_and_the_monotonic_clock_agree_on_elapsed_time() {
        let time = HostClock::choose();
        let clock = HostClock::new(time);
        let (a, m0) = (clock.now(), monotonic());
        std::thread::sleep(Duration::from_millis(50));
        let (b, m1) = (clock.now(), monotonic());
        let (elapsed, reference) = (b - a, m1 - m0);
        // Within 1 % plus the reads' own spread: a scale off by a factor would fail.
        assert!(
            elapsed.abs_diff(reference) < reference / 100 + 200_000,
            "{time:?}: {elapsed} vs {reference}"
        );
    }

    #[test]
    fn two_clocks_of_one_file_read_alike() {
        let time = HostClock::choose();
        let (a, b) = (HostClock::new(time), HostClock::new(time));
        let (x, y, z) = (a.now(), b.now(), a.now());
        assert!(x <= y && y <= z, "{x} {y} {z}");
    }
}
