use super::*;

const MS: u64 = 1_000_000;
/// A server time: nanoseconds since 1970, as Redis's `TIME` gives it.
const T0: u64 = 1_800_000_000_000_000_000;

/// What Redis keeps for one budget: the value, with the write script's check.
#[derive(Default)]
struct Redis {
    value: Option<Vec<u8>>,
    epochs: (u64, u64),
}

impl Redis {
    fn generation(&self) -> u64 {
        self.value.as_ref().map_or(0, |v| {
            let text = std::str::from_utf8(&v[5..v.iter().position(|&b| b == b'\n').unwrap()]);
            text.unwrap().parse().unwrap()
        })
    }

    /// `BUDGET_WRITE`: whether it was written.
    fn write(&mut self, w: &FleetWrite) -> bool {
        if self.generation() != w.expect {
            return false;
        }
        self.value = Some(w.value.clone());
        self.epochs.0 += w.head;
        self.epochs.1 += w.queue;
        true
    }

    /// Decides `op` and writes it: the outcome.
    fn run(&mut self, rules: &FleetRules, now: u64, me: u64, op: FleetOp<'_>) -> FleetOutcome {
        let d = rules.decide(self.value.as_deref(), now, me, op).unwrap();
        if let Some(w) = &d.write {
            assert!(self.write(w));
        }
        d.outcome
    }
}

fn rules(cap: Option<u32>) -> FleetRules {
    FleetRules::new([("requests", Quota::per_second(10).with_burst(2))], cap).unwrap()
}

/// Rules with a cap of one in flight, a Redis without the budget, and one turn's cells.
fn one_permit() -> (FleetRules, Redis, Box<[u32]>) {
    let r = rules(Some(1));
    let cells = r.cells(&[]).unwrap();
    (r, Redis::default(), cells)
}

/// A new caller for `cells`, with no deadline.
fn arrive(cells: &[u32]) -> FleetOp<'_> {
    FleetOp::Arrive {
        cells,
        deadline: None,
    }
}

fn ticket(o: FleetOutcome) -> u64 {
    match o {
        FleetOutcome::Admitted { ticket } | FleetOutcome::Waiting { ticket, .. } => ticket,
        other => panic!("no ticket: {other:?}"),
    }
}

#[test]
fn clients_share_one_fifo_queue_and_one_cap() {
    let r = rules(Some(2));
    let mut redis = Redis::default();
    let (a, b) = (1, 2);
    let cells = r.cells(&[]).unwrap();
    let arrive = arrive(&cells);
    let t1 = redis.run(&r, T0, a, arrive);
    assert!(matches!(t1, FleetOutcome::Admitted { .. }));
    assert!(matches!(
        redis.run(&r, T0, b, arrive),
        FleetOutcome::Admitted { .. }
    ));
    // The cap is reached: b's next caller waits, and a's after it is behind it.
    let w1 = redis.run(&r, T0, b, arrive);
    assert!(matches!(
        w1,
        FleetOutcome::Waiting {
            ahead: 0,
            at: None,
            ..
        }
    ));
    let w2 = redis.run(&r, T0, a, arrive);
    assert!(matches!(w2, FleetOutcome::Waiting { ahead: 1, .. }));
    let (w1, w2) = (ticket(w1), ticket(w2));
    // a's first turn ends: the permit is the head's (b's waiter), not a's who asks first.
    let end = FleetOp::End {
        ticket: ticket(t1),
        charged: &cells,
        actual: None,
    };
    assert_eq!(redis.run(&r, T0 + MS, a, end), FleetOutcome::Ended(true));
    assert_eq!(redis.epochs, (1, 0), "a permit returned");
    let again = |ticket| FleetOp::AskAgain {
        ticket,
        cells: &cells,
        deadline: None,
    };
    assert!(matches!(
        redis.run(&r, T0 + 2 * MS, a, again(w2)),
        FleetOutcome::Waiting { ahead: 1, .. }
    ));
    // The rates: two cells spent at T0, the third conforms at T0 + 100 ms.
    let head = redis.run(&r, T0 + 2 * MS, b, again(w1));
    assert_eq!(
        head,
        FleetOutcome::Waiting {
            ticket: w1,
            ahead: 0,
            at: Some(T0 + 100 * MS)
        }
    );
    assert!(matches!(
        redis.run(&r, T0 + 100 * MS, b, again(w1)),
        FleetOutcome::Admitted { .. }
    ));
    assert_eq!(redis.epochs, (1, 1), "the head left the queue");
}

#[test]
fn a_client_whose_lease_lapses_gives_its_permits_back() {
    let (r, mut redis, cells) = one_permit();
    let arrive = arrive(&cells);
    let (gone, me) = (1, 2);
    assert!(matches!(
        redis.run(&r, T0, gone, arrive),
        FleetOutcome::Admitted { .. }
    ));
    let w = ticket(redis.run(&r, T0, me, arrive));
    let again = FleetOp::AskAgain {
        ticket: w,
        cells: &cells,
        deadline: None,
    };
    // Within the lease, the permit stays taken.
    let within = T0 + LEASE.as_nanos() as u64 - MS;
    assert!(matches!(
        redis.run(&r, within, me, again),
        FleetOutcome::Waiting { .. }
    ));
    // Past it, the owner is gone: its turn ends at its estimate, its permit is mine.
    let past = T0 + LEASE.as_nanos() as u64 + 100 * MS;
    assert!(matches!(
        redis.run(&r, past, me, again),
        FleetOutcome::Admitted { .. }
    ));
}

#[test]
fn renewing_keeps_a_lease_and_writes_only_when_a_third_has_passed() {
    let (r, mut redis, cells) = one_permit();
    let holder = 1;
    let arrive = arrive(&cells);
    assert!(matches!(
        redis.run(&r, T0, holder, arrive),
        FleetOutcome::Admitted { .. }
    ));
    let soon = r
        .decide(redis.value.as_deref(), T0 + MS, holder, FleetOp::Renew)
        .unwrap();
    assert!(soon.write.is_none(), "nothing to renew yet");
    let lease = LEASE.as_nanos() as u64;
    // The holder renews every few seconds for a minute: its permit stays its own.
    let mut now = T0;
    while now < T0 + 60 * lease {
        now += RENEW_EVERY.as_nanos() as u64;
        redis.run(&r, now, holder, FleetOp::Renew);
    }
    let other = r.decide(
        redis.value.as_deref(),
        now,
        2,
        FleetOp::TryNow { cells: &cells },
    );
    assert_eq!(
        other.unwrap().outcome,
        FleetOutcome::Refused(BudgetError::WouldWait)
    );
}

#[test]
fn an_owner_cannot_end_another_owners_caller() {
    let (r, mut redis, cells) = one_permit();
    let t = ticket(redis.run(&r, T0, 1, FleetOp::TryNow { cells: &cells }));
    let end = FleetOp::End {
        ticket: t,
        charged: &cells,
        actual: None,
    };
    assert_eq!(redis.run(&r, T0, 2, end), FleetOutcome::Ended(false));
    assert_eq!(redis.run(&r, T0, 1, end), FleetOutcome::Ended(true));
}

#[test]
fn a_settle_refunds_for_every_client() {
    let r = FleetRules::new([("tokens", Quota::per_second(100).with_burst(100))], None).unwrap();
    let mut redis = Redis::default();
    let cells = r.cells(&[("tokens", 100)]).unwrap();
    let t = ticket(redis.run(&r, T0, 1, FleetOp::TryNow { cells: &cells }));
    let one = r.cells(&[("tokens", 60)]).unwrap();
    let refused = redis.run(&r, T0, 2, FleetOp::TryNow { cells: &one });
    assert_eq!(refused, FleetOutcome::Refused(BudgetError::WouldWait));
    let actual = r.settled(&[("tokens", 30)]).unwrap();
    let settle = FleetOp::End {
        ticket: t,
        charged: &cells,
        actual: Some(&actual),
    };
    assert_eq!(redis.run(&r, T0, 1, settle), FleetOutcome::Ended(true));
    assert!(matches!(
        redis.run(&r, T0, 2, FleetOp::TryNow { cells: &one }),
        FleetOutcome::Admitted { .. }
    ));
}

#[test]
fn rates_in_another_order_are_the_same_budget_and_other_rates_are_refused() {
    let ab = FleetRules::new(
        [("a", Quota::per_second(5)), ("b", Quota::per_second(7))],
        Some(3),
    )
    .unwrap();
    let ba = FleetRules::new(
        [("b", Quota::per_second(7)), ("a", Quota::per_second(5))],
        Some(3),
    )
    .unwrap();
    let other = FleetRules::new(
        [("a", Quota::per_second(5)), ("b", Quota::per_second(8))],
        Some(3),
    )
    .unwrap();
    let mut redis = Redis::default();
    let cells = ab.cells(&[("b", 2)]).unwrap();
    redis.run(&ab, T0, 1, FleetOp::TryNow { cells: &cells });
    let look = redis.run(&ba, T0, 2, FleetOp::Look);
    match look {
        FleetOutcome::Looked {
            in_flight,
            remaining,
            ..
        } => {
            assert_eq!(in_flight, 1);
            assert_eq!(&*remaining, &[4, 5]);
        }
        other => panic!("{other:?}"),
    }
    let mismatch = other.decide(redis.value.as_deref(), T0, 3, FleetOp::Look);
    assert_eq!(mismatch.unwrap_err(), FleetError::Mismatch);
}

#[test]
fn a_value_that_is_not_a_budget_is_refused_and_nothing_is_written() {
    let r = rules(None);
    for foreign in [
        &b"42"[..],
        b"PLB1 7\n",
        b"PLB1 x\n12345678",
        b"PLB1 1\n\x01\x02",
        b"",
    ] {
        let d = r.decide(Some(foreign), T0, 1, FleetOp::Renew);
        assert_eq!(d.unwrap_err(), FleetError::Corrupt, "{foreign:?}");
    }
    // A real value, cut anywhere, is refused too.
    let mut redis = Redis::default();
    let cells = r.cells(&[]).unwrap();
    redis.run(&r, T0, 1, FleetOp::TryNow { cells: &cells });
    let value = redis.value.clone().unwrap();
    for cut in 0..value.len() {
        assert!(
            r.decide(Some(&value[..cut]), T0, 1, FleetOp::Look).is_err(),
            "cut at {cut}"
        );
    }
}

#[test]
fn the_value_expires_only_once_whole_and_a_lease_has_run_out() {
    let r = FleetRules::new([("requests", Quota::per_minute(60).with_burst(60))], None).unwrap();
    let cells = r.cells(&[("requests", 60)]).unwrap();
    let d = r
        .decide(None, T0, 1, FleetOp::TryNow { cells: &cells })
        .unwrap();
    let ttl = d.write.unwrap().ttl_ms;
    // Whole again in 60 s; then one lease more.
    assert_eq!(ttl, 60_000 + LEASE.as_millis() as u64);
}

#[test]
fn a_cap_above_the_room_is_refused() {
    let too_high = FleetRules::new(Vec::<(String, Quota)>::new(), Some(MAX_CALLERS as u32 + 1));
    assert_eq!(
        too_high.unwrap_err(),
        BuildError::CapTooHigh { most: MAX_CALLERS }
    );
}

#[test]
fn a_waiter_asks_at_its_instant_when_the_queue_moves_and_at_its_deadline() {
    let mut w = FleetWait::new(Some(Duration::from_millis(500)));
    let cells = [1];
    assert!(
        matches!(w.op(&cells, T0), FleetOp::Arrive { deadline: Some(d), .. } if d == T0 + 500 * MS)
    );
    // Third in line: it reads the epochs, and asks once two have left.
    let waiting = FleetOutcome::Waiting {
        ticket: 9,
        ahead: 2,
        at: Some(T0 + 300 * MS),
    };
    assert_eq!(
        w.answer(waiting.clone(), (5, 10), T0, 0),
        FleetNext::Waiting
    );
    assert!(matches!(
        w.op(&cells, T0 + MS),
        FleetOp::AskAgain { ticket: 9, .. }
    ));
    assert_eq!(w.look(None, 0), FleetLook::Sleep(Duration::from_millis(2)));
    assert!(matches!(w.look(Some((5, 11)), 2 * MS), FleetLook::Sleep(_)));
    assert_eq!(w.look(Some((5, 12)), 3 * MS), FleetLook::Ask);
    // At its instant, whatever the epochs say.
    w.answer(waiting, (5, 10), T0, 0);
    assert_eq!(w.look(Some((5, 10)), 300 * MS), FleetLook::Ask);
    // The head asks when the head's epoch moves.
    let head = FleetOutcome::Waiting {
        ticket: 9,
        ahead: 0,
        at: None,
    };
    w.answer(head, (5, 12), T0, 0);
    assert!(matches!(w.look(Some((5, 12)), MS), FleetLook::Sleep(_)));
    assert_eq!(w.look(Some((6, 12)), MS), FleetLook::Ask);
    let refused = FleetOutcome::Refused(BudgetError::TimedOut);
    assert_eq!(
        w.answer(refused.clone(), (0, 0), T0, 0),
        FleetNext::Failed(refused)
    );
    assert_eq!(w.ticket(), None);
}

/// Several clients against one value, random operations at random times: after every
/// decision the cap holds, the callers are in ticket order, and the value written is read
/// back as written.
fn clients_run(ops: &[(u64, u8, u64, u32)]) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert;
    let r = FleetRules::new(
        [
            ("requests", Quota::per_second(20).with_burst(4)),
            ("tokens", Quota::per_second(100).with_burst(10)),
        ],
        Some(3),
    )
    .unwrap();
    let mut redis = Redis::default();
    let mut now = T0;
    // (owner, ticket, admitted)
    let mut mine: Vec<(u64, u64, bool)> = Vec::new();
    for &(owner, kind, dt, tokens) in ops {
        now += dt * MS;
        let owner = owner + 1;
        let cells = r.cells(&[("tokens", tokens)]).unwrap();
        let actual = r.settled(&[("tokens", tokens)]).unwrap();
        let held = |admitted: bool| mine.iter().position(|m| m.0 == owner && m.2 == admitted);
        let op = match (kind, held(false), held(true)) {
            (0, _, _) => arrive(&cells),
            (1, Some(i), _) => FleetOp::AskAgain {
                ticket: mine[i].1,
                cells: &cells,
                deadline: None,
            },
            (2.., _, Some(i)) => FleetOp::End {
                ticket: mine.remove(i).1,
                charged: &cells,
                actual: Some(&actual),
            },
            _ => continue,
        };
        match redis.run(&r, now, owner, op) {
            FleetOutcome::Admitted { ticket } => {
                mine.retain(|m| m.1 != ticket);
                mine.push((owner, ticket, true));
            }
            FleetOutcome::Waiting { ticket, .. } => {
                mine.retain(|m| m.1 != ticket);
                mine.push((owner, ticket, false));
            }
            _ => {}
        }
        let value = redis.value.as_deref().unwrap();
        let (_, stored) = codec::decode(value, 2, MAX_CALLERS, FLEET_LOG).unwrap();
        let s = &stored.state;
        prop_assert!(s.in_flight() <= 3, "the cap holds");
        let ordered = s.callers.windows(2).all(|w| w[0].ticket < w[1].ticket);
        prop_assert!(ordered, "in ticket order");
        let body = &value[value.iter().position(|&b| b == b'\n').unwrap() + 1..];
        let mut again = b"PLB1 7\n".to_vec();
        again.extend_from_slice(body);
        prop_assert!(codec::encode(7, &stored) == again, "read back as written");
    }
    Ok(())
}

#[test]
fn random_clients_keep_the_cap_and_the_queue_in_order() {
    use proptest::collection::vec;
    let config = proptest::test_runner::Config {
        cases: 64,
        ..Default::default()
    };
    let op = (0u64..3, 0u8..4, 0u64..200, 1u32..4);
    proptest::proptest!(config, |(ops in vec(op, 1..120))| { clients_run(&ops)?; });
}

#[test]
fn an_ask_that_changes_nothing_writes_nothing() {
    let (r, mut redis, cells) = one_permit();
    let arrive = arrive(&cells);
    // Two owners on record, each with a lease: the order of the leases is kept.
    redis.run(&r, T0, 1, arrive);
    let w = ticket(redis.run(&r, T0, 2, arrive));
    let w1 = ticket(redis.run(&r, T0, 1, arrive));
    let again = |ticket| FleetOp::AskAgain {
        ticket,
        cells: &cells,
        deadline: None,
    };
    redis.run(&r, T0 + 60 * MS, 2, again(w));
    for (owner, ticket) in [(2, w), (1, w1), (2, w)] {
        let d = r
            .decide(redis.value.as_deref(), T0 + 70 * MS, owner, again(ticket))
            .unwrap();
        assert!(matches!(d.outcome, FleetOutcome::Waiting { .. }));
        assert_eq!(
            d.write, None,
            "owner {owner} asking again changed the value"
        );
    }
}

#[test]
fn a_turn_of_a_lost_budget_ends_nothing_in_the_one_made_again() {
    let (r, mut redis, cells) = one_permit();
    let old = ticket(redis.run(&r, T0, 1, FleetOp::TryNow { cells: &cells }));
    // Redis restarts: the budget is made again, and the same client takes the permit.
    redis.value = None;
    let new = ticket(redis.run(&r, T0 + MS, 1, FleetOp::TryNow { cells: &cells }));
    assert_ne!(old, new);
    let end_old = FleetOp::End {
        ticket: old,
        charged: &cells,
        actual: None,
    };
    assert_eq!(
        redis.run(&r, T0 + 2 * MS, 1, end_old),
        FleetOutcome::Ended(false)
    );
    let other = redis.run(&r, T0 + 2 * MS, 2, FleetOp::TryNow { cells: &cells });
    assert_eq!(
        other,
        FleetOutcome::Refused(BudgetError::WouldWait),
        "the cap holds"
    );
}
