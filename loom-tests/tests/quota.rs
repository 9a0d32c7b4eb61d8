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

#[test]
fn a_quota_change_racing_a_one_cell_check_is_seen_whole_or_not_at_all() {
    loom::model(|| {
        // Old: 100 ns interval, burst 1 (room 0). New: 50 ns interval, burst 4 (room
        // 150). After one cell at time 0 the TAT is 100: the old quota refuses the next
        // cell (wait 100 ns); the new one admits it with TAT 150. A mixed read (old
        // interval, new room) would admit it with TAT 200.
        let old = Quota::try_new(1, Duration::from_nanos(100)).unwrap();
        let new = Quota::try_new(1, Duration::from_nanos(50))
            .unwrap()
            .with_burst(4);
        let limiter = Arc::new(Limiter::with_clock(old, ManualClock::new()));
        limiter.check().unwrap();
        let changer = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.set_quota(new))
        };
        let decided = limiter.check();
        changer.join().unwrap();
        match decided {
            Ok(()) => assert_eq!(limiter.snapshot().until_full(), Duration::from_nanos(150)),
            Err(e) => {
                assert_eq!(e.wait_time(), Duration::from_nanos(100));
                assert_eq!(limiter.snapshot().until_full(), Duration::from_nanos(100));
            }
        }
    });
}
