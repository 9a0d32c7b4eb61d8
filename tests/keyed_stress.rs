//! The keyed limiter at its key bound, on the real clock, with every thread racing: owners
//! spending their own keys, floods of new keys filling the table, and `retain_recent`
//! forgetting what it may. Each owner checks its keys' decisions against GCRA bounds:
//!
//! * a *wrong refusal*: a key that was provably still stored (its TAT ahead of the time
//!   of the call, so no sweep could forget it) and provably had room was refused;
//! * an *over-admission*: a key that provably had no room was admitted (a live key
//!   forgotten and stored anew with a fresh burst would do this).
//!
//! "Provably" brackets the limiter's own clock reading: a stamp from the same clock taken
//! before the call and one taken after it, so a thread preempted between a stamp and the
//! call widens the bracket instead of making a rightly forgotten key look wrongly refused.
//! Runs for `PACELINE_STRESS_SECS` seconds (default 15).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use paceline::clock::{Clock, DefaultClock};
use paceline::{KeyedLimiter, Quota};

/// One cell per millisecond, bursts of 50: a key spent at once stays stored 50 ms.
const T: u64 = 1_000_000;
const BURST: u32 = 50;
const TAU: u64 = T * BURST as u64;
/// The key bound: floods keep the table at it.
const MAX_KEYS: usize = 512;
const OWNERS: usize = 2;
const KEYS_PER_OWNER: usize = 8;

/// What one owner thread saw.
#[derive(Debug, Default)]
struct Tally {
    admitted: u64,
    refused: u64,
    /// Refusals of keys provably stored and with room.
    wrongly_refused: Vec<String>,
    /// Admissions of keys provably without room.
    over_admitted: Vec<String>,
    /// Calls whose outcome the bounds decided (either way): the test's reach.
    decided: u64,
}

/// Bounds on one key's TAT, from the stamps around each call.
#[derive(Clone, Copy, Default)]
struct Bounds {
    lo: u64,
    hi: u64,
}

/// xorshift, so the run needs no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn owner(keyed: &KeyedLimiter<String>, me: usize, stop: &AtomicBool) -> Tally {
    let clock = DefaultClock::default();
    let keys: Vec<String> = (0..KEYS_PER_OWNER)
        .map(|i| format!("owner-{me}-{i}"))
        .collect();
    let mut bounds = vec![Bounds::default(); keys.len()];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (me as u64 + 1));
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let k = (rng.next() % keys.len() as u64) as usize;
        // Mostly one cell; sometimes a handful; sometimes the whole burst.
        let n = match rng.next() % 10 {
            0 => BURST,
            1 | 2 => 1 + (rng.next() % u64::from(BURST)) as u32,
            _ => 1,
        };
        let cost = u64::from(n) * T;
        let before = clock.now();
        let admitted = keyed.check_key_n(&keys[k], n).is_ok();
        let after = clock.now();
        let b = bounds[k];
        // Room at the call: max(TAT - now, 0) + cost <= TAU, with now in [before, after].
        let surely_room = b.hi.saturating_sub(before) + cost <= TAU;
        let surely_full = b.lo.saturating_sub(after) + cost > TAU;
        // Stored through the call: its TAT was ahead of every moment up to its end.
        let surely_stored = b.lo > after;
        let what = || {
            format!(
                "{}: n = {n}, TAT in [{}, {}], call in [{before}, {after}]",
                keys[k], b.lo, b.hi
            )
        };
        if admitted {
            tally.admitted += 1;
            if surely_full {
                tally.over_admitted.push(what());
            }
            bounds[k] = Bounds {
                lo: b.lo.max(before) + cost,
                hi: b.hi.max(after) + cost,
            };
        } else {
            tally.refused += 1;
            if surely_room && surely_stored {
                tally.wrongly_refused.push(what());
            }
        }
        if surely_full || (surely_room && surely_stored) {
            tally.decided += 1;
        }
        if rng.next().is_multiple_of(4) {
            thread::sleep(Duration::from_micros(rng.next() % 400));
        }
    }
    tally
}

#[test]
fn stored_keys_are_never_refused_and_spent_keys_never_over_admitted_at_the_bound() {
    let seconds: u64 = std::env::var("PACELINE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let quota = Quota::try_new(1, Duration::from_nanos(T))
        .unwrap()
        .with_burst(BURST);
    let keyed = Arc::new(KeyedLimiter::<String>::new(quota).with_max_keys(MAX_KEYS));
    let stop = Arc::new(AtomicBool::new(false));

    let owners: Vec<_> = (0..OWNERS)
        .map(|me| {
            let (keyed, stop) = (Arc::clone(&keyed), Arc::clone(&stop));
            thread::spawn(move || owner(&keyed, me, &stop))
        })
        .collect();
    // Two floods of keys never seen before, each admitted once (stored for one interval)
    // or refused at the bound.
    let at_bound = Arc::new(AtomicU64::new(0));
    let floods: Vec<_> = (0..2)
        .map(|me| {
            let (keyed, stop) = (Arc::clone(&keyed), Arc::clone(&stop));
            let at_bound = Arc::clone(&at_bound);
            thread::spawn(move || {
                let (mut i, mut refused) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    if keyed.check_key(&format!("flood-{me}-{i}")).is_err() {
                        refused += 1;
                        at_bound.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
                (i, refused)
            })
        })
        .collect();
    let retainer = {
        let (keyed, stop) = (Arc::clone(&keyed), Arc::clone(&stop));
        thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                keyed.retain_recent();
                rounds += 1;
                thread::sleep(Duration::from_micros(rounds * 7919 % 2_000));
            }
            rounds
        })
    };

    let started = Instant::now();
    let mut most_keys = 0;
    // The run lasts `seconds`, longer on a machine so loaded that the floods have not yet
    // filled the table (up to four times as long): the bound is what it tests.
    while started.elapsed() < Duration::from_secs(seconds)
        || most_keys < MAX_KEYS
            && at_bound.load(Ordering::Relaxed) == 0
            && started.elapsed() < Duration::from_secs(4 * seconds)
    {
        most_keys = most_keys.max(keyed.len());
        thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let tallies: Vec<Tally> = owners.into_iter().map(|t| t.join().unwrap()).collect();
    let flooded: Vec<(u64, u64)> = floods.into_iter().map(|t| t.join().unwrap()).collect();
    let sweeps = retainer.join().unwrap();

    let wrong: Vec<&String> = tallies.iter().flat_map(|t| &t.wrongly_refused).collect();
    let over: Vec<&String> = tallies.iter().flat_map(|t| &t.over_admitted).collect();
    let decided: u64 = tallies.iter().map(|t| t.decided).sum();
    let admitted: u64 = tallies.iter().map(|t| t.admitted).sum();
    let refused: u64 = tallies.iter().map(|t| t.refused).sum();
    let flood_refused: u64 = flooded.iter().map(|f| f.1).sum();
    println!(
        "{seconds} s: owners {admitted} admitted, {refused} refused, {decided} decided by the \
         bounds; floods {flooded:?} (new keys, refused at the bound); {sweeps} retain_recent; \
         at most {most_keys} keys stored"
    );
    assert!(wrong.is_empty(), "stored keys wrongly refused: {wrong:#?}");
    assert!(over.is_empty(), "spent keys over-admitted: {over:#?}");
    // The run reached what it tests: the table was at its bound (full, or refusing the
    // floods there; a flood key refills in a millisecond, so a fast machine's table
    // makes room for every one), and many decisions were forced either way.
    assert!(
        flood_refused > 0 || most_keys >= MAX_KEYS,
        "the floods never filled the table"
    );
    assert!(
        admitted > 1_000 && refused > 1_000,
        "{admitted} / {refused}"
    );
    assert!(
        decided > 1_000,
        "only {decided} calls were decided by the bounds"
    );
    assert!(most_keys <= MAX_KEYS + 512, "{most_keys} keys stored");
}
