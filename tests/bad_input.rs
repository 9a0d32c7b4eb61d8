//! Every case of the spec's "Bad input": a clear error, no panic, nothing changed.

use std::time::Duration;

use paceline::clock::{Clock, ManualClock};
use paceline::{Denied, KeyedLimiter, Limiter, Quota, QuotaError};

#[test]
fn fallible_constructors_name_the_problem() {
    let s = Duration::from_secs(1);
    assert_eq!(Quota::try_new(0, s), Err(QuotaError::ZeroCount));
    assert_eq!(
        Quota::try_new(1, Duration::ZERO),
        Err(QuotaError::ZeroPeriod)
    );
    assert_eq!(
        Quota::try_new(u32::MAX, Duration::from_nanos(10)),
        Err(QuotaError::IntervalTooShort)
    );
    assert_eq!(
        Quota::try_new(1, Duration::MAX),
        Err(QuotaError::IntervalTooLong)
    );
    // A burst window past 584 years saturates instead of failing.
    let saturated = Quota::try_new(u32::MAX, Duration::MAX).unwrap();
    assert_eq!(saturated.burst(), u32::MAX);
    assert_eq!(
        Quota::per_second(1).try_with_burst(0),
        Err(QuotaError::ZeroBurst)
    );
    let longest = Quota::try_new(1, Duration::from_nanos(u64::MAX)).unwrap();
    assert_eq!(longest.try_with_burst(1), Ok(longest));
    assert_eq!(longest.try_with_burst(2).unwrap().burst(), 2);
    let err: Box<dyn std::error::Error + Send + Sync> = Box::new(QuotaError::ZeroBurst);
    assert!(err.to_string().contains("burst"));
}

#[test]
fn a_burst_window_past_584_years_saturates_instead_of_panicking() {
    for quota in [
        Quota::per_hour(1).with_burst(u32::MAX),
        Quota::per_hour(1).try_with_burst(u32::MAX).unwrap(),
    ] {
        assert_eq!(quota.burst(), u32::MAX);
        assert_eq!(quota.emission_interval(), Duration::from_secs(3_600));
        let limiter = Limiter::with_clock(quota, ManualClock::new());
        // The window is 584 years, not 490 000: as many hourly cells as fit in it.
        let fit = (u64::MAX / 3_600_000_000_000) as u32;
        assert_eq!(limiter.remaining(), fit);
        assert!(limiter.check_n(1_000).is_ok());
        assert_eq!(limiter.remaining(), fit - 1_000);
        // More than fits in 584 years is never admitted (it waits for ever), not a panic.
        let never = limiter.check_n(u32::MAX).unwrap_err();
        assert!(
            matches!(never, Denied::NotUntil(e) if e.wait_time() == Duration::from_nanos(u64::MAX))
        );
    }
    let slowest = Quota::try_new(1, Duration::from_nanos(u64::MAX))
        .unwrap()
        .with_burst(7);
    let limiter = Limiter::with_clock(slowest, ManualClock::new());
    assert!(limiter.check().is_ok());
    assert!(limiter.check().is_err());
}

#[test]
fn zero_cells_are_granted_and_change_nothing() {
    let limiter = Limiter::with_clock(Quota::per_second(2), ManualClock::new());
    limiter.check_n(2).unwrap();
    assert!(limiter.check_n(0).is_ok());
    assert_eq!(limiter.remaining(), 0);
    let wait = limiter.check().unwrap_err().wait_time();
    assert!(limiter.check_n(0).is_ok());
    assert_eq!(limiter.check().unwrap_err().wait_time(), wait);
}

#[test]
fn more_than_the_burst_is_its_own_error_and_changes_nothing() {
    let limiter = Limiter::with_clock(Quota::per_second(3), ManualClock::new());
    for n in [4, 1_000, u32::MAX] {
        match limiter.check_n(n) {
            Err(Denied::InsufficientCapacity(e)) => {
                assert_eq!((e.requested(), e.burst()), (n, 3));
                assert!(e.to_string().contains("burst is 3"));
            }
            other => panic!("check_n({n}) gave {other:?}"),
        }
        assert!(limiter.wait_n(n).is_err());
        let err = futures::executor::block_on(limiter.until_n_ready(n)).unwrap_err();
        assert_eq!(err.requested(), n);
    }
    assert_eq!(limiter.remaining(), 3);
}

#[test]
fn u32_max_cells_with_a_u32_max_burst_fit_exactly() {
    let limiter = Limiter::with_clock(Quota::per_second(u32::MAX), ManualClock::new());
    assert!(limiter.check_n(u32::MAX).is_ok());
    assert!(matches!(limiter.check_n(1), Err(Denied::NotUntil(_))));
}

#[test]
fn extreme_durations_saturate_and_deny_past_the_end_of_time() {
    let clock = ManualClock::new();
    let quarter = u64::MAX / 4;
    let limiter = Limiter::with_clock(
        Quota::try_new(1, Duration::from_nanos(quarter)).unwrap(),
        clock.clone(),
    );
    limiter.check().unwrap();
    assert_eq!(
        limiter.check().unwrap_err().wait_time(),
        Duration::from_nanos(quarter)
    );
    clock.advance(Duration::from_nanos(quarter));
    assert!(limiter.check().is_ok());
    // Past the end of representable time (584 years), nothing more is admitted, and
    // nothing panics or wraps around.
    clock.advance(Duration::MAX);
    assert_eq!(clock.now(), u64::MAX);
    for _ in 0..3 {
        assert!(limiter.check().is_err());
        assert!(limiter.check_n(1).is_err());
    }
    assert_eq!(
        limiter.remaining(),
        0,
        "remaining() promises only cells a check admits"
    );
    let late = futures::executor::block_on(limiter.until_ready_within(Duration::MAX));
    assert!(late.is_err(), "a booking past the end of time is refused");
}

#[test]
fn a_limiter_near_the_end_of_time_denies_rather_than_wraps() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(Quota::per_second(10), clock.clone());
    clock.advance(Duration::from_nanos(u64::MAX - 550_000_000));
    // Only the cells whose TAT is still representable: 5 of the burst of 10.
    let admitted = (0..20).filter(|_| limiter.check().is_ok()).count();
    assert_eq!(admitted, 5);
    clock.advance(Duration::MAX);
    assert!(limiter.check().is_err());
}

/// A clock that steps backwards on every other read, like TSCs of two cores that disagree.
#[derive(Clone, Default)]
struct Jittery(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Clock for Jittery {
    fn now(&self) -> u64 {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // 0, 1000, 2, 3000, ...: back and forth by up to a microsecond, moving on slowly.
        if n.is_multiple_of(2) {
            n
        } else {
            n * 1000
        }
    }

    fn wake_at(&self, _at: u64, waker: std::task::Waker) {
        waker.wake();
    }
}

#[test]
fn a_clock_stepping_backwards_never_panics_nor_admits_more_than_the_quota() {
    // One cell per 10 us, burst 1: over the clock's largest reading, the admitted count is
    // bounded by the quota over that span.
    let clock = Jittery::default();
    let limiter = Limiter::with_clock(
        Quota::try_new(1, Duration::from_micros(10)).unwrap(),
        clock.clone(),
    );
    let mut admitted = 0u64;
    for _ in 0..100_000 {
        if limiter.check().is_ok() {
            admitted += 1;
        }
        let _ = limiter.remaining();
    }
    let max_now = clock.now();
    assert!(
        admitted <= 1 + max_now / 10_000,
        "{admitted} cells in {max_now} ns"
    );
    assert!(admitted > 0);
}

#[test]
fn keyed_bad_input_is_handled_the_same_way() {
    let keyed = KeyedLimiter::with_clock(Quota::per_second(2), ManualClock::new());
    assert!(keyed.check_key_n(&1, 0).is_ok());
    assert!(keyed.is_empty(), "asking for nothing stores nothing");
    assert!(matches!(
        keyed.check_key_n(&1, u32::MAX),
        Err(Denied::InsufficientCapacity(_))
    ));
    assert!(keyed.is_empty());
    let keyed = KeyedLimiter::with_clock(Quota::per_second(2), ManualClock::new()).with_max_keys(0);
    assert!(
        keyed.check_key(&1).is_ok(),
        "a bound of 0 still keeps one key per shard"
    );
}

#[test]
fn errors_are_send_sync_static_and_displayable() {
    fn assert_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> String {
        e.to_string()
    }
    let limiter = Limiter::with_clock(Quota::per_second(1), ManualClock::new());
    limiter.check().unwrap();
    assert!(assert_error(limiter.check().unwrap_err()).contains("try again"));
    assert!(!assert_error(limiter.check_n(5).unwrap_err()).is_empty());
    assert!(!assert_error(QuotaError::ZeroCount).is_empty());
}

#[test]
fn an_error_chain_reports_a_denial_once() {
    // What anyhow and eyre print: the error, then each `source()` in turn.
    fn chain(e: &dyn std::error::Error) -> Vec<String> {
        let mut out = vec![e.to_string()];
        let mut next = e.source();
        while let Some(e) = next {
            out.push(e.to_string());
            next = e.source();
        }
        out
    }
    let limiter = Limiter::with_clock(Quota::per_second(1), ManualClock::new());
    limiter.check().unwrap();
    let not_until = limiter.check_n(1).unwrap_err();
    let never = limiter.check_n(2).unwrap_err();
    for denied in [not_until, never] {
        let lines = chain(&denied);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0], denied.to_string());
    }
    assert!(chain(&not_until)[0].contains("try again in"));
    assert!(chain(&never)[0].contains("burst is 1"));
}

#[test]
fn rates_as_text_parse_as_the_limits_grammar_or_say_why() {
    use paceline::{Quota, QuotaError};
    use std::time::Duration;
    let parsed = |text: &str| text.parse::<Quota>();
    assert_eq!(parsed("10/second"), Ok(Quota::per_second(10)));
    assert_eq!(parsed(" 10 / second "), Ok(Quota::per_second(10)));
    assert_eq!(parsed("5 per minute"), Ok(Quota::per_minute(5)));
    assert_eq!(parsed("5/MINUTES"), Ok(Quota::per_minute(5)));
    assert_eq!(parsed("3600/hour"), Ok(Quota::per_hour(3600)));
    let day = parsed("1000/day").unwrap();
    assert_eq!(day.emission_interval(), Duration::from_micros(86_400_000));
    let two_hours = parsed("100 per 2 hours").unwrap();
    assert_eq!(two_hours.emission_interval(), Duration::from_secs(72));
    assert_eq!(
        parsed("1/month").unwrap().emission_interval(),
        Duration::from_secs(30 * 86_400)
    );
    for bad in [
        "",
        "ten/second",
        "10/fortnight",
        "10 per",
        "10second",
        "/second",
        "10 persecond",
        "4294967296/second",
    ] {
        assert_eq!(parsed(bad), Err(QuotaError::Unparsable), "{bad:?}");
    }
    assert_eq!(parsed("0/second"), Err(QuotaError::ZeroCount));
    assert_eq!(parsed("10/0 seconds"), Err(QuotaError::ZeroPeriod));
    assert_eq!(
        parsed("1/18446744073709551615 years"),
        Err(QuotaError::IntervalTooLong)
    );
    assert!(QuotaError::Unparsable.to_string().contains("\"10/second\""));
}
