//! Fuzz targets' bodies: each checks the real code against an independent reference model.
//!
//! Compiled for `cargo fuzz` (`cfg(fuzzing)`) and for unit tests, which run each body on a
//! few thousand pseudo-random inputs so ordinary CI keeps them compiling and honest.
//! Any divergence from the model panics, which the fuzzer reports as a finding.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Waker};
use core::time::Duration;
use std::collections::VecDeque;

use crate::clock::ManualClock;
use crate::reference_model::{Model, Outcome};
use crate::{Denied, Limiter, Quota, QuotaError, Reservation};

/// Reads fixed-size integers off the input, yielding zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A value that is small most of the time and absurd some of the time.
    fn skewed_u64(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => u64::from(self.u8()),
            1 => u64::from(self.u32() % 1_000_000),
            2 => u64::from(self.u32()),
            _ => self.u64(),
        }
    }

    fn skewed_u32(&mut self) -> u32 {
        match self.u8() % 3 {
            0 => u32::from(self.u8() % 8),
            1 => u32::from(self.u8()),
            _ => self.u32(),
        }
    }
}

fn quota_from(bytes: &mut Bytes<'_>) -> Option<Quota> {
    let count = bytes.skewed_u32();
    let period = Duration::from_nanos(bytes.skewed_u64());
    let burst = bytes.skewed_u32();
    Quota::try_new(count, period)
        .ok()?
        .try_with_burst(burst)
        .ok()
}

/// Random op sequences on a limiter against the `u128` reference model.
pub fn limiter_matches_model(data: &[u8]) {
    let mut bytes = Bytes(data);
    let Some(quota) = quota_from(&mut bytes) else {
        return;
    };
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota, clock.clone());
    let mut model = Model::new(quota);
    let mut now = 0u128;
    while !bytes.is_empty() {
        match bytes.u8() % 4 {
            0 => {
                let d = bytes.skewed_u64();
                clock.advance(Duration::from_nanos(d));
                now = (now + u128::from(d)).min(u128::from(u64::MAX));
            }
            1 => {
                let real = Outcome::of(limiter.check().map_err(Denied::from));
                assert_eq!(real, model.check_n(now, 1), "check at {now}");
            }
            2 => {
                let n = bytes.skewed_u32();
                let real = Outcome::of(limiter.check_n(n));
                assert_eq!(real, model.check_n(now, n), "check_n({n}) at {now}");
            }
            _ => {}
        }
        assert_eq!(u128::from(limiter.remaining()), model.remaining(now));
    }
}

/// Random book / cancel / advance sequences on the waiter queue against a `VecDeque` model
/// of booked instants. Bookings are waiting futures or reservations; after every step
/// each reservation's `ready_in` (a read of a node anywhere in the queue) must be the
/// model's.
pub fn waiters_match_model(data: &[u8]) {
    let mut bytes = Bytes(data);
    let t = 1 + u64::from(bytes.u8() % 16);
    let burst = 1 + u32::from(bytes.u8() % 4);
    let quota = match Quota::try_new(1, Duration::from_nanos(t)) {
        Ok(q) => q.with_burst(burst),
        Err(_) => return,
    };
    let (t, tau) = (u128::from(t), u128::from(t) * u128::from(burst));
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota, clock.clone());
    let mut cx = Context::from_waker(Waker::noop());
    // Real bookings, and the model's queue of (id, instant, cost).
    let mut held: Vec<(u32, Held<'_>)> = Vec::new();
    let mut queue: VecDeque<(u32, u128, u128)> = VecDeque::new();
    let mut tat = 0u128;
    let mut now = 0u128;
    // Whether a plain admission (a booking admitted at once) came after the last linked
    // booking: a cancel then keeps its cells (`wait::queue`'s refund rule).
    let mut admitted_since_booking = false;
    for id in 0..200u32 {
        if bytes.is_empty() {
            break;
        }
        match bytes.u8() % 5 {
            op @ (0 | 1) => {
                let n = 1 + u32::from(bytes.u8()) % burst;
                let (ready, booking) = if op == 0 {
                    let mut f: Waiting<'_> =
                        Box::pin(limiter.until_n_ready_within(n, Duration::MAX));
                    (f.as_mut().poll(&mut cx).is_ready(), Held::Future(f))
                } else {
                    let turn = limiter.reserve_within(n, Duration::MAX).unwrap();
                    (turn.is_ready(), Held::Turn(turn))
                };
                let cost = u128::from(n) * t;
                tat = tat.max(now) + cost;
                let instant = tat.saturating_sub(tau);
                assert_eq!(ready, instant <= now, "booking {id}");
                admitted_since_booking = ready;
                if !ready {
                    held.push((id, booking));
                    queue.push_back((id, instant, cost));
                }
            }
            2 if !held.is_empty() => {
                let i = usize::from(bytes.u8()) % held.len();
                let (id, booking) = held.remove(i);
                drop(booking);
                let pos = queue.iter().position(|w| w.0 == id);
                if let Some(pos) = pos {
                    let (_, instant, cost) = queue[pos];
                    queue.remove(pos);
                    // On a manual clock every linked waiter is still ahead (`advance`
                    // fires the due ones), so this is the refund rule in full.
                    if !admitted_since_booking {
                        assert!(instant > now);
                        tat -= cost;
                        for w in queue.iter_mut().skip(pos) {
                            w.1 = w.1.saturating_sub(cost);
                        }
                    }
                }
                // Moving up can make the new front due at once.
                pop_due(&mut queue, now);
            }
            4 => {
                // A hold (an upstream's Retry-After): the waiting turns move together so
                // the first is at the hold's end, and the word at least to where one cell
                // fits there.
                let d = u128::from(bytes.u8()) * t / 2;
                limiter.hold_for(Duration::from_nanos(d as u64));
                let until = now + d;
                if d > 0 {
                    let shift = queue.front().map_or(0, |w| until.saturating_sub(w.1));
                    for w in queue.iter_mut() {
                        w.1 += shift;
                    }
                    tat = (tat + shift).max(until + tau - t);
                }
            }
            _ => {
                let d = u128::from(bytes.u8()) * t / 4;
                clock.advance(Duration::from_nanos(d as u64));
                now += d;
                pop_due(&mut queue, now);
            }
        }
        // Fired bookings are exactly those the model popped; a reservation still linked
        // says the model's instant; the queue's next deadline and the cell's room agree.
        held.retain_mut(|(id, booking)| {
            let linked = queue.iter().find(|w| w.0 == *id);
            let ready = match booking {
                Held::Future(f) => f.as_mut().poll(&mut cx).is_ready(),
                Held::Turn(turn) => {
                    let ready_in = turn.ready_in().as_nanos();
                    let expected = linked.map_or(0, |w| w.1 - now);
                    assert_eq!(ready_in, expected, "reservation {id}");
                    ready_in == 0
                }
            };
            assert_eq!(ready, linked.is_none(), "waiter {id}");
            !ready
        });
        assert_eq!(
            limiter.next_waiter_due_in().map(|d| d.as_nanos()),
            queue.front().map(|w| w.1 - now)
        );
        let model_room = (tau.saturating_sub(tat.max(now) - now)) / t;
        assert_eq!(u128::from(limiter.remaining()), model_room);
    }
}

type Waiting<'a> = Pin<Box<dyn Future<Output = Result<(), Denied>> + 'a>>;

/// A booking the waiters model holds: a waiting future or a reservation.
enum Held<'a> {
    Future(Waiting<'a>),
    Turn(Reservation<'a, ManualClock>),
}

fn pop_due(queue: &mut VecDeque<(u32, u128, u128)>, now: u128) {
    while queue.front().is_some_and(|w| w.1 <= now) {
        queue.pop_front();
    }
}

/// Quota construction from arbitrary inputs never panics through the fallible API, and
/// errs exactly when the inputs are out of range.
pub fn quota_construction(data: &[u8]) {
    let mut bytes = Bytes(data);
    let count = bytes.skewed_u32();
    let secs = bytes.skewed_u64();
    let nanos = bytes.u32() % 1_000_000_000;
    let burst = bytes.skewed_u32();
    let period = Duration::new(secs, nanos);
    let result = Quota::try_new(count, period);
    let p = period.as_nanos();
    let expected = if count == 0 {
        Err(QuotaError::ZeroCount)
    } else if p == 0 {
        Err(QuotaError::ZeroPeriod)
    } else if p / u128::from(count) == 0 {
        Err(QuotaError::IntervalTooShort)
    } else if p / u128::from(count) > u128::from(u64::MAX) {
        Err(QuotaError::IntervalTooLong)
    } else {
        Ok(())
    };
    assert_eq!(result.map(drop), expected);
    if let Ok(q) = result {
        assert_eq!(q.emission_interval().as_nanos(), p / u128::from(count));
        assert_eq!(q.burst(), count);
        // Every burst but 0 is accepted (a window past 584 years saturates).
        match q.try_with_burst(burst) {
            Ok(w) => {
                assert!(burst > 0);
                assert_eq!(
                    (w.burst(), w.emission_interval()),
                    (burst, q.emission_interval())
                );
                assert_eq!(w, q.with_burst(burst));
            }
            Err(QuotaError::ZeroBurst) => assert_eq!(burst, 0),
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    if count > 0 {
        for q in [
            Quota::per_second(count),
            Quota::per_minute(count),
            Quota::per_hour(count),
        ] {
            assert!(q.emission_interval() >= Duration::from_nanos(1));
            assert_eq!(q.burst(), count);
        }
    }
}

/// Shared files with arbitrary contents: opening one gives an error or a limiter, and a
/// limiter on a hostile file answers every call (wrong decisions allowed) without a
/// panic, an out-of-bounds access or a hang. The first byte picks a direct, a keyed or a
/// budget file and whether the rest overwrites a valid file (so most inputs get past the
/// magic) or is the whole file. Files are opened adopting whatever they hold,
/// so a changed quota slot reaches the decisions; and the same bytes are written again
/// into the file while it is open (a hostile writer after the checks at opening).
#[cfg(all(feature = "shared", unix, not(loom)))]
pub fn shared_file(data: &[u8]) {
    use crate::shared::{SharedKeyedLimiter, SharedLimiter};
    use std::sync::OnceLock;

    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("paceline-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let quota = Quota::per_second(100).with_burst(10);
    // A valid file of each kind, made once: direct, keyed, and a budget with turns in
    // flight, a waiter and a settled turn in its state.
    static VALID: OnceLock<[Vec<u8>; 3]> = OnceLock::new();
    let valid = VALID.get_or_init(|| {
        let image = |kind: u8| {
            let path = dir.join(format!("valid-{kind}"));
            let _ = std::fs::remove_file(&path);
            match kind {
                0 => drop(SharedLimiter::open(&path, quota).unwrap()),
                1 => drop(SharedKeyedLimiter::open(&path, quota, 64).unwrap()),
                _ => {
                    let budget = budget_builder().open(&path).unwrap();
                    let a = budget.try_acquire(&[("tokens", 40)]).unwrap();
                    let b = budget.try_acquire(&[("tokens", 30)]).unwrap();
                    a.settle(&[("tokens", 10)]).unwrap();
                    let waiter = poll_once(budget.acquire(&[("tokens", 100)]));
                    let bytes = std::fs::read(&path).unwrap();
                    drop((b, waiter));
                    return bytes;
                }
            }
            std::fs::read(&path).unwrap()
        };
        [image(0), image(1), image(2)]
    });
    let kind = pick % 3;
    let content = if pick & 0x80 != 0 {
        // Over a valid file: the rest says where to write and what (three bytes of
        // offset: a budget's state lies past the first 64 KiB).
        let mut content = valid[usize::from(kind)].clone();
        for chunk in rest.chunks(4) {
            if let [a, b, c, value] = *chunk {
                let at = u32::from_le_bytes([a, b, c, 0]) as usize % content.len();
                content[at] = value;
            }
        }
        content
    } else {
        rest.to_vec()
    };
    let path = dir.join("file");
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, &content).unwrap();
    // Written again over the open file, in place (its length stays: no page goes away).
    let rewrite = || {
        use std::os::unix::fs::FileExt;
        if let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) {
            let _ = file.write_at(&content, 0);
        }
    };
    let briefly = Duration::from_millis(1);
    let adopt = crate::shared::OnMismatch::Adopt;
    if kind == 2 {
        match budget_builder().options(adopt).open(&path) {
            Ok(budget) => {
                rewrite();
                let turn = budget.try_acquire(&[("tokens", 5)]);
                let _ = poll_once(budget.acquire_within(&[("tokens", 7)], briefly));
                let _ = budget.remaining("tokens");
                let _ = budget.in_flight();
                let _ = budget.waiting();
                let _ = budget.wait_time(&[("requests", 2)]);
                let _ = budget.hold_for(briefly);
                if let Ok(turn) = turn {
                    let _ = turn.settle(&[("tokens", 3)]);
                }
                let _ = budget.try_acquire(&[("tokens", 1)]).map(drop);
            }
            Err(e) => drop(e.to_string()),
        }
        return;
    }
    let keyed = kind == 1;
    if keyed {
        match SharedKeyedLimiter::open_with(&path, quota, 64, adopt) {
            Ok(limiter) => {
                rewrite();
                for key in ["a", "b", "c"] {
                    let _ = limiter.check_key(key);
                    let _ = limiter.check_key_n(key, 3);
                    let _ = limiter.remaining_key(key);
                    let _ = limiter.peek_key_n(key, 2);
                    let _ = poll_once(limiter.until_key_n_ready_within(key, 1, briefly));
                }
                let _ = limiter.len();
                let _ = limiter.has_room_for("d");
                let _ = limiter.check_key_n_if_stored("a", 2);
                let _ = limiter.set_quota(Quota::per_second(5));
                let _ = limiter.check_key_n("a", 4);
                limiter.retain_recent();
                limiter.reset_key("a");
            }
            Err(e) => drop(e.to_string()),
        }
    } else {
        match SharedLimiter::open_with(&path, quota, adopt) {
            Ok(limiter) => {
                rewrite();
                let _ = limiter.check();
                let _ = limiter.check_n(3);
                let _ = limiter.remaining();
                let _ = limiter.snapshot();
                let _ = limiter.peek_n(2);
                let _ = limiter.reserve_within(1, briefly);
                let _ = limiter.set_quota(Quota::per_second(5));
                let _ = limiter.quota();
                let _ = limiter.check_n(4);
                limiter.hold_for(Duration::MAX);
                limiter.reset();
            }
            Err(e) => drop(e.to_string()),
        }
    }
}

/// The budget of the shared-file fuzz body: two rates and a cap.
#[cfg(all(feature = "shared", unix, not(loom)))]
fn budget_builder() -> crate::shared::SharedBudgetBuilder {
    crate::shared::SharedBudget::builder()
        .rate("requests", Quota::per_second(100).with_burst(10))
        .rate("tokens", Quota::per_second(1_000).with_burst(100))
        .in_flight(3)
}

/// Polls `future` once: every wait the fuzz bodies start refuses or finishes at once.
#[cfg(all(feature = "shared", unix, not(loom)))]
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = core::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        core::task::Poll::Ready(output) => Some(output),
        core::task::Poll::Pending => None,
    }
}

/// The client key behind trusted proxies, from arbitrary forwarding headers: it never
/// panics, an untrusted peer is its own key whatever it writes, and once the chain names
/// an untrusted hop, nothing a client writes to its left (in the same line or in an
/// earlier one) changes the key.
#[cfg(feature = "tower")]
pub fn forwarding_headers(data: &[u8]) {
    use crate::http::{ClientKey, Head, KeySource, Network};
    use core::net::{IpAddr, SocketAddr};

    const NETS: [&str; 6] = [
        "10.0.0.0/8",
        "192.168.0.0/16",
        "127.0.0.1/32",
        "::1/128",
        "fd00::/8",
        "0.0.0.0/0",
    ];
    const PEERS: [&str; 6] = [
        "10.1.2.3",
        "192.168.1.1",
        "127.0.0.1",
        "::1",
        "fd00::5",
        "203.0.113.9",
    ];
    let mut bytes = Bytes(data);
    let pick = bytes.u8();
    let nets: Vec<Network> = NETS
        .iter()
        .enumerate()
        .filter(|(i, _)| pick >> i & 1 == 1)
        .map(|(_, net)| net.parse().expect("a valid network"))
        .collect();
    let peer: IpAddr = PEERS[usize::from(bytes.u8()) % PEERS.len()]
        .parse()
        .expect("a valid address");
    let forwarded = bytes.u8() & 1 == 1;
    // The rest: what the client wrote, a zero byte, then the chain as it arrives.
    let rest = bytes.0;
    let (spoof, chain) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&rest[..0], rest),
    };
    let mut source = KeySource::behind_proxies(nets.clone()).ipv6_prefix(128);
    if forwarded {
        source = source.forwarded_header();
    }
    let name = if forwarded {
        "forwarded"
    } else {
        "x-forwarded-for"
    };
    let key_of = |lines: &[&[u8]]| {
        let mut request = http::Request::new(());
        request
            .extensions_mut()
            .insert(SocketAddr::new(peer, 4_000));
        for line in lines {
            if let Ok(value) = http::HeaderValue::from_bytes(line) {
                request.headers_mut().append(name, value);
            }
        }
        source.key(&Head::of(&request)).ok()
    };
    let trusted = |ip: IpAddr| nets.iter().any(|net| net.contains(ip));
    let plain = key_of(&[chain]);
    if !trusted(peer) {
        assert_eq!(
            plain,
            Some(ClientKey::Ip(peer)),
            "an untrusted peer is its own key"
        );
        return;
    }
    let Some(ClientKey::Ip(client)) = plain else {
        return;
    };
    // Every hop trusted (the left-most counts) or a line HTTP would not carry: no claim.
    if trusted(client)
        || http::HeaderValue::from_bytes(spoof).is_err()
        || http::HeaderValue::from_bytes(chain).is_err()
    {
        return;
    }
    let joined = [spoof, b",", chain].concat();
    assert_eq!(
        key_of(&[&joined]),
        plain,
        "entries written to the left changed the key"
    );
    assert_eq!(
        key_of(&[spoof, chain]),
        plain,
        "an earlier line changed the key"
    );
}

// The upstream's rate-limit fields read for a budget: a file of its own.
#[cfg(not(loom))]
#[path = "fuzz_signal.rs"]
mod signal;
#[cfg(not(loom))]
pub use signal::dimension_signal;

#[cfg(feature = "redis-scripts")]
#[path = "fuzz_fleet.rs"]
mod fleet;
#[cfg(feature = "redis-scripts")]
pub use fleet::fleet_value;

#[cfg(test)]
mod tests {
    /// xorshift: reproducible inputs without a dependency.
    fn inputs(seed: u64, count: usize, len: usize) -> impl Iterator<Item = Vec<u8>> {
        let mut x = seed;
        (0..count).map(move |_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
    }

    #[test]
    fn fuzz_bodies_run_clean_on_pseudo_random_inputs() {
        for data in inputs(0x9e37_79b9_7f4a_7c15, 3_000, 256) {
            super::limiter_matches_model(&data);
            super::waiters_match_model(&data);
            super::quota_construction(&data);
            #[cfg(feature = "tower")]
            super::forwarding_headers(&data);
            super::dimension_signal(&data);
        }
        // Files are slower to fuzz: fewer inputs, of every shape.
        #[cfg(all(feature = "shared", unix))]
        for data in inputs(0x2545_f491_4f6c_dd1d, 300, 96) {
            super::shared_file(&data);
        }
        #[cfg(feature = "redis-scripts")]
        for data in inputs(0x6a09_e667_f3bc_c908, 2_000, 200) {
            super::fleet_value(&data);
        }
    }
}
