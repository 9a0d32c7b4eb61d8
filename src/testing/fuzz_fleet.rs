//! The fleet budget's value as Redis may hold it: whatever bytes are at the key (another
//! application's, a damaged or hand-edited value), `FleetRules::decide` answers with an
//! outcome or a refusal and never panics; a value it writes is one it reads back.

use crate::budget::fleet::{FleetError, FleetOp, FleetRules};
use crate::Quota;

const T0: u64 = 1_800_000_000_000_000_000;

/// The first input byte picks what to do with the rest: read as the whole value, or as
/// edits (offset, byte) to a real value made by a few decisions.
pub fn fleet_value(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let rules = FleetRules::new(
        [
            ("requests", Quota::per_second(20).with_burst(4)),
            ("tokens", Quota::per_second(100).with_burst(50)),
        ],
        Some(3),
    )
    .expect("valid rules");
    let cells = rules.cells(&[("tokens", 7)]).expect("within the burst");
    let value = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut value = None::<Vec<u8>>;
        for owner in 1..=4u64 {
            let op = FleetOp::Arrive {
                cells: &cells,
                deadline: None,
            };
            let d = rules
                .decide(value.as_deref(), T0 + owner, owner, op)
                .expect("its own value");
            if let Some(w) = d.write {
                value = Some(w.value);
            }
        }
        let mut value = value.unwrap_or_default();
        for edit in rest.chunks_exact(3) {
            if value.is_empty() {
                break;
            }
            let at = usize::from(u16::from_le_bytes([edit[0], edit[1]])) % value.len();
            value[at] = edit[2];
        }
        value
    };
    let now = T0 + u64::from(mode) * 1_000_000;
    let actual = [Some(3), None];
    let ops = [
        FleetOp::Arrive {
            cells: &cells,
            deadline: Some(now + 5_000_000),
        },
        FleetOp::AskAgain {
            ticket: u64::from(mode),
            cells: &cells,
            deadline: None,
        },
        FleetOp::TryNow { cells: &cells },
        FleetOp::End {
            ticket: u64::from(mode) >> 1,
            charged: &cells,
            actual: Some(&actual),
        },
        FleetOp::Renew,
        FleetOp::Look,
    ];
    for op in ops {
        match rules.decide(Some(&value), now, 2, op) {
            Ok(d) => {
                if let Some(w) = d.write {
                    // What it writes, it reads back.
                    let again = rules.decide(Some(&w.value), now, 2, FleetOp::Look);
                    assert!(again.is_ok(), "a written value is refused: {again:?}");
                }
            }
            // Not this budget's value: refused, nothing to write.
            Err(FleetError::Corrupt | FleetError::Mismatch) => {}
        }
    }
}
