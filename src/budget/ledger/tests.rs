//! The ledger alone: the replay's exactness, the log's bound, and a property test against
//! a model that recomputes every TAT from the whole history.

use proptest::prelude::*;

use super::*;

const SEC: u64 = 1_000_000_000;

/// One dimension: `count` per second, burst `burst`.
fn params(count: u64, burst: u32) -> Params {
    Params::new(SEC / count, burst).unwrap()
}

/// Admits `cells` at `now`, which must conform.
fn admit(ledger: &mut Ledger, now: u64, cells: &[u32]) -> u64 {
    assert_eq!(ledger.ready(cells, now), Ready::Now, "{cells:?} at {now}");
    ledger.admit(now, cells.into())
}

/// A ledger of the one dimension `params` with a turn of `cells` booked at 0 s.
fn booked(params: Params, cells: u32) -> (Ledger, u64) {
    let mut ledger = Ledger::new(&[params]);
    let id = admit(&mut ledger, 0, &[cells]);
    (ledger, id)
}

/// Closes the turn `id`, after which the ledger must still add up.
fn close_consistent(ledger: &mut Ledger, id: u64) {
    ledger.close(id);
    assert!(ledger.consistent());
}

/// How many one-cell admissions of dimension 0 fit at `now`.
fn fits_now(ledger: &Ledger, now: u64) -> u64 {
    ledger.remaining(0, now)
}

#[test]
fn refund_gives_back_only_what_no_later_admission_relied_on() {
    // 1 cell a second, burst 20. A turn books 10 at 0 s; the dimension idles until 100 s
    // (refilled: its TAT, 10 s, is long past); another turn takes 1 cell at 100 s. Then
    // the first settles at 0 cells. Its 10 cells were absorbed by the idle time: the
    // second turn's admission found the dimension full anyway, so nothing can come back.
    // Subtracting 10 s from the TAT (a naive refund) would move it from 101 s to 91 s,
    // behind now: a whole burst of 20 admissible at 100 s besides the cell just spent,
    // 21 in one instant against a burst of 20.
    let (mut ledger, first) = booked(params(1, 20), 10);
    admit(&mut ledger, 100 * SEC, &[1]);
    assert_eq!(fits_now(&ledger, 100 * SEC), 19);
    ledger.settle(first, &[10], &[Some(0)]);
    assert_eq!(
        fits_now(&ledger, 100 * SEC),
        19,
        "the refund gave credit back twice"
    );
    assert!(ledger.consistent());
}

#[test]
fn refund_before_anyone_relied_on_it_comes_back_whole() {
    let (mut ledger, first) = booked(params(1, 20), 10);
    admit(&mut ledger, SEC, &[1]);
    // At 1 s: 20 - 10 - 1 + 1 (one second refilled) = 10 left.
    assert_eq!(fits_now(&ledger, SEC), 10);
    ledger.settle(first, &[10], &[Some(4)]);
    assert_eq!(fits_now(&ledger, SEC), 16);
    assert!(ledger.consistent());
}

#[test]
fn charge_raises_the_tat_and_delays_the_next_turn() {
    let (mut ledger, first) = booked(params(1, 10), 5);
    assert_eq!(ledger.ready(&[5], 0), Ready::Now);
    ledger.settle(first, &[5], &[Some(8)]);
    assert_eq!(ledger.ready(&[5], 0), Ready::At(3 * SEC));
    assert!(ledger.consistent());
}

#[test]
fn nothing_is_charged_unless_every_dimension_conforms() {
    let mut ledger = Ledger::new(&[params(1, 5), params(1, 100)]);
    admit(&mut ledger, 0, &[5, 1]);
    // Tokens would fit; requests do not: the answer is the later instant, and nothing
    // changed in either.
    assert_eq!(ledger.ready(&[1, 50], 0), Ready::At(SEC));
    assert_eq!((ledger.tat(0), ledger.tat(1)), (5 * SEC, SEC));
}

#[test]
fn beyond_the_log_the_oldest_turn_keeps_its_estimate_and_still_pays_a_charge() {
    let mut ledger = Ledger::new(&[params(1_000_000, u32::MAX)]);
    let oldest = admit(&mut ledger, 0, &[100]);
    let second = admit(&mut ledger, 0, &[100]);
    for i in 0..LOG_CAPACITY as u64 - 2 {
        let id = admit(&mut ledger, 0, &[1]);
        ledger.close(id);
        assert_eq!(ledger.logged() as u64, i + 3);
    }
    // Full: the next admission closes the oldest turn at its estimate.
    admit(&mut ledger, 0, &[1]);
    assert_eq!(ledger.logged(), LOG_CAPACITY);
    let tat = ledger.tat(0);
    ledger.settle(oldest, &[100], &[Some(0)]);
    assert_eq!(ledger.tat(0), tat, "a refund beyond the log is lost");
    ledger.settle(oldest, &[100], &[Some(150)]);
    assert_eq!(
        ledger.tat(0),
        tat + 50 * 1_000,
        "a charge beyond the log still applies"
    );
    // The second turn is in the log: its refund is exact.
    ledger.settle(second, &[100], &[Some(0)]);
    assert_eq!(ledger.tat(0), tat + 50 * 1_000 - 100 * 1_000);
    assert!(ledger.consistent());
}

#[test]
fn absurd_costs_saturate_instead_of_wrapping() {
    let hourly = Params::new(3_600 * SEC, u32::MAX).unwrap();
    let mut ledger = Ledger::new(&[hourly]);
    // Its own cost alone passes 584 years: never.
    assert_eq!(ledger.ready(&[u32::MAX], 0), Ready::Never);
    let id = admit(&mut ledger, 0, &[1]);
    ledger.settle(id, &[1], &[Some(u32::MAX)]);
    assert_eq!(ledger.tat(0), u64::MAX);
    assert_eq!(ledger.ready(&[1], u64::MAX - 1), Ready::Never);
    assert_eq!(ledger.remaining(0, 0), 0);
}

#[test]
fn forgetting_the_log_keeps_every_charge() {
    let (mut ledger, id) = booked(params(1, 10), 4);
    ledger.forget_log();
    assert_eq!(ledger.logged(), 0);
    ledger.settle(id, &[4], &[Some(0)]);
    assert_eq!(ledger.tat(0), 4 * SEC);
    close_consistent(&mut ledger, id);
}

#[test]
fn a_floor_survives_the_replay_of_an_earlier_refund() {
    // 1 cell a second, burst 10. A turn books 8 at 0 s; the upstream then says the
    // dimension is whole again only at 20 s (a floor); the turn settles at 1 cell. The
    // refund must not pull the TAT back below the floor.
    let (mut ledger, first) = booked(params(1, 10), 8);
    ledger.floor(0, 20 * SEC);
    assert_eq!(ledger.tat(0), 20 * SEC);
    ledger.settle(first, &[8], &[Some(1)]);
    assert_eq!(ledger.tat(0), 20 * SEC);
    assert!(ledger.consistent());
    // A floor below the TAT changes nothing; one on an empty log sets it directly.
    ledger.floor(0, 5 * SEC);
    assert_eq!(ledger.tat(0), 20 * SEC);
    assert_eq!(ledger.logged(), 0);
    ledger.floor(0, 30 * SEC);
    assert_eq!(ledger.tat(0), 30 * SEC);
    assert!(ledger.consistent());
}

#[test]
fn a_floor_below_the_tat_still_binds_after_a_refund() {
    // 2 cells a second, burst 12. A turn books 7 (TAT 3.5 s); the upstream says the
    // dimension is whole no sooner than 1.001 s, which is below the TAT now, but the turn
    // then settles at 0: the TAT falls to the floor, not to 0.
    let (mut ledger, first) = booked(params(2, 12), 7);
    ledger.floor(0, 1_001_000_000);
    assert_eq!(ledger.tat(0), 3_500_000_000);
    ledger.settle(first, &[7], &[Some(0)]);
    assert_eq!(ledger.tat(0), 1_001_000_000);
    assert!(ledger.consistent());
}

#[test]
fn a_rate_change_keeps_logged_cells_at_their_old_price() {
    // 10 a second (100 ms a cell), burst 10. A turn books 10 cells (1 s); the rate then
    // drops to 1 a second at 0: the backlog of 10 cells is 10 cells of 1 s (10 s), so no
    // cell is freed by the slower rate. The turn settles at 5: 5 cells come back, of the
    // new interval, as the backlog they were past the change.
    let (mut ledger, first) = booked(params(10, 10), 10);
    ledger.set_params(0, &params(1, 10), 0);
    assert_eq!(ledger.tat(0), 10 * SEC);
    assert_eq!(ledger.remaining(0, 0), 0);
    ledger.settle(first, &[10], &[Some(5)]);
    assert_eq!(ledger.tat(0), 5 * SEC);
    // New admissions are priced at the new interval.
    let second = admit(&mut ledger, 5 * SEC, &[2]);
    assert_eq!(ledger.tat(0), 7 * SEC);
    close_consistent(&mut ledger, second);
}

#[test]
fn a_faster_rate_keeps_the_backlog_in_cells_and_a_floor_below_the_base_still_binds() {
    // 1 a second, burst 10: 10 cells spent at 0 (a backlog of 10 s). Back to 10 a
    // second at 0: the same 10 cells are 1 s, so one cell waits 100 ms, not 9.1 s.
    let (mut ledger, first) = booked(params(1, 10), 10);
    ledger.set_params(0, &params(10, 10), 0);
    assert_eq!(ledger.tat(0), SEC);
    assert_eq!(ledger.ready(&[1], 0), Ready::At(SEC / 10));
    // A floor between the TAT and the base (10 s before the faster rate) binds.
    ledger.floor(0, 3 * SEC);
    assert_eq!(ledger.tat(0), 3 * SEC);
    ledger.settle(first, &[10], &[Some(1)]);
    assert_eq!(ledger.tat(0), 3 * SEC);
    assert!(ledger.consistent());
}

#[test]
fn a_hold_of_the_whole_budget_admits_nothing_before_it() {
    let mut ledger = Ledger::new(&[params(1, 10)]);
    ledger.hold(5 * SEC);
    assert_eq!(ledger.ready(&[0], 0), Ready::At(5 * SEC));
    assert_eq!(ledger.remaining(0, SEC), 0);
    assert_eq!(ledger.ready(&[1], 5 * SEC), Ready::Now);
    // An earlier hold does not shorten it.
    ledger.hold(SEC);
    assert_eq!(ledger.held(), 5 * SEC);
}

#[derive(Clone, Debug)]
enum Op {
    /// Advance time by this many ms, then admit these cells if they conform.
    Admit(u64, [u32; 2]),
    /// Settle the i-th open turn (modulo their number) with these costs.
    Settle(usize, [Option<u32>; 2]),
    /// Close the i-th open turn at its estimate.
    Close(usize),
    /// Floor dimension d's TAT at now + this many ms.
    Floor(usize, u64),
    /// Set dimension d's rate to this many cells a second (burst unchanged).
    Rate(usize, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let cells = || 0u32..12;
    prop_oneof![
        (0u64..3_000, [cells(), cells()]).prop_map(|(ms, c)| Op::Admit(ms, c)),
        (
            any::<usize>(),
            [
                proptest::option::of(0u32..30),
                proptest::option::of(0u32..30)
            ]
        )
            .prop_map(|(i, c)| Op::Settle(i, c)),
        any::<usize>().prop_map(Op::Close),
        (0usize..2, 0u64..20_000).prop_map(|(d, ms)| Op::Floor(d, ms)),
        (0usize..2, 1u64..8).prop_map(|(d, n)| Op::Rate(d, n)),
    ]
}

proptest! {
    /// Every TAT equals a replay of the whole history with each turn's current cost
    /// (settled: its real cost; open: its estimate), and the ledger's invariant holds.
    #[test]
    fn tats_equal_a_replay_of_the_whole_history(ops in proptest::collection::vec(op(), 1..120)) {
        let mut quotas = [params(2, 12), params(5, 20)];
        let mut ledger = Ledger::new(&quotas);
        let mut now = 0u64;
        // The model: every admission ever made, with its current cost and the intervals
        // it was priced at, and every floor.
        let mut history: Vec<Event> = Vec::new();
        // Open turns: (id, index in history, charged).
        let mut open: Vec<(u64, usize, [u32; 2])> = Vec::new();
        for op in ops {
            match op {
                Op::Admit(ms, cells) => {
                    now += ms * 1_000_000;
                    let ready = ledger.ready(&cells, now);
                    // The model's decision: conform in every dimension.
                    let conforms = (0..2).all(|d| {
                        let tat = model_tat(&history, d);
                        u128::from(tat) + u128::from(cells[d]) * u128::from(quotas[d].interval())
                            <= u128::from(now) + u128::from(quotas[d].tau())
                    });
                    prop_assert_eq!(ready == Ready::Now, conforms);
                    if conforms {
                        let id = ledger.admit(now, cells.into());
                        let intervals = [quotas[0].interval(), quotas[1].interval()];
                        history.push(Event::Admission(now, cells, intervals));
                        open.push((id, history.len() - 1, cells));
                    }
                }
                Op::Settle(i, actual) if !open.is_empty() => {
                    let (id, at, charged) = open.remove(i % open.len());
                    ledger.settle(id, &charged, &actual);
                    if let Event::Admission(_, cells, _) = &mut history[at] {
                        for (cell, new) in cells.iter_mut().zip(actual) {
                            if let Some(new) = new {
                                *cell = new;
                            }
                        }
                    }
                }
                Op::Close(i) if !open.is_empty() => {
                    let (id, _, _) = open.remove(i % open.len());
                    ledger.close(id);
                }
                Op::Floor(d, ms) => {
                    let at = now + ms * 1_000_000;
                    ledger.floor(d, at);
                    history.push(Event::Floor(d, at));
                }
                Op::Rate(d, n) => {
                    let from = quotas[d].interval();
                    quotas[d] = Params::new(SEC / n, quotas[d].burst()).unwrap();
                    ledger.set_params(d, &quotas[d], now);
                    history.push(Event::Rescale(d, now, from, quotas[d].interval()));
                }
                _ => {}
            }
            prop_assert!(ledger.consistent());
            for d in 0..2 {
                prop_assert_eq!(ledger.tat(d), model_tat(&history, d));
            }
            prop_assert!(ledger.logged() <= history.len());
            if open.is_empty() {
                prop_assert_eq!(ledger.logged(), 0);
            }
        }
    }
}

/// What the model remembers: admissions (instant, current cells, intervals at
/// admission) and floors (dimension, instant).
#[derive(Clone, Debug)]
enum Event {
    Admission(u64, [u32; 2], [u64; 2]),
    Floor(usize, u64),
    /// Dimension, instant, old interval, new interval.
    Rescale(usize, u64, u64, u64),
}

/// Dimension `d`'s TAT after replaying every event in `history` from 0.
fn model_tat(history: &[Event], d: usize) -> u64 {
    history.iter().fold(0u64, |x, event| match *event {
        Event::Admission(at, cells, intervals) => {
            (u128::from(x.max(at)) + u128::from(cells[d]) * u128::from(intervals[d])) as u64
        }
        Event::Floor(dim, at) if dim == d => x.max(at),
        Event::Rescale(dim, at, from, to) if dim == d && x > at => {
            let scaled = (u128::from(x - at) * u128::from(to)).div_ceil(u128::from(from));
            (u128::from(at) + scaled).min(u128::from(u64::MAX)) as u64
        }
        Event::Floor(..) | Event::Rescale(..) => x,
    })
}
