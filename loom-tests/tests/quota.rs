//! A quota change racing checks, under loom: no check ever decides with a quota that is
//! half the old one and half the new (the interval of one with the burst of the other).

#![cfg(loom)]

use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use paceline::clock::ManualClock;
use paceline::{Denied, Limiter, Quota};

#[test]
fn a_quota_change_racing_a_check_is_seen_whole_or_not_at_all() {
    loom::model(|| {
        // Old: 100 ns interval, burst 2. New: 50 ns interval, burst 8. A check for 3 cells
        // on a fresh limiter at time 0: refused by the old burst, admitted by the new
        // quota with TAT 150 ns. A mixed read (old interval, new burst) would admit it
        // with TAT 300 ns.
        let old = Quota::try_new(1, Duration::from_nanos(100))
            .unwrap()
            .with_burst(2);
        let new = Quota::try_new(1, Duration::from_nanos(50))
            .unwrap()
            .with_burst(8);
        let limiter = Arc::new(Limiter::with_clock(old, ManualClock::new()));
        let changer = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.set_quota(new))
        };
        let decided = limiter.check_n(3);
        changer.join().unwrap();
        match decided {
            Ok(()) => {
                // Admitted under the new quota: exactly its cost was spent.
                assert_eq!(limiter.snapshot().until_full(), Duration::from_nanos(150));
            }
            Err(Denied::InsufficientCapacity(e)) => {
                assert_eq!(e.burst(), 2, "refused by the old quota, whole");
                assert_eq!(limiter.remaining(), 8);
            }
            Err(other) => panic!("no quota gives {other:?}"),
        }
        assert_eq!(limiter.quota(), new);
    });
}
