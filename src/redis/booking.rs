//! A booking on the fleet limiter, refundable whatever happens to its answer.

use core::time::Duration;
use std::sync::Arc;

use super::conn::Conn;

/// How many times, and how far apart, a refund is sent before the cell is left spent.
const REFUND_TRIES: u32 = 5;
const REFUND_RETRY: Duration = Duration::from_millis(200);
/// How long one refund may take.
const REFUND_TIMEOUT: Duration = Duration::from_secs(2);

/// A booking, made before its call is sent: dropped unused (the caller went away, timed
/// out, or never heard the answer), it asks Redis, in the background, to give the cell
/// back by the booking's id (see `scripts`, "Bookings that can always be given back").
pub(super) struct Booking {
    conn: Conn,
    refund: Arc<redis::Script>,
    /// The Redis key; `None` once the booking is used (or was never made).
    key: Option<String>,
    id: String,
    /// Test mode's fixed time, in µs.
    fixed: Option<u64>,
}

impl Booking {
    pub(super) fn new(
        conn: Conn,
        refund: Arc<redis::Script>,
        key: String,
        id: String,
        fixed: Option<u64>,
    ) -> Booking {
        Booking {
            conn,
            refund,
            key: Some(key),
            id,
            fixed,
        }
    }

    /// The id the booking is sent with.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// The booking was used (its instant came) or never made (refused): nothing to give
    /// back.
    pub(super) fn settle(mut self) {
        self.key = None;
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut conn, refund) = (self.conn.clone(), Arc::clone(&self.refund));
        let id = core::mem::take(&mut self.id);
        let time = self.fixed.map(|t| t.to_string()).unwrap_or_default();
        runtime.spawn(async move {
            for _ in 0..REFUND_TRIES {
                let call = async {
                    refund
                        .key(&key)
                        .arg(&id)
                        .arg(&time)
                        .invoke_async::<i64>(&mut conn)
                        .await
                };
                match tokio::time::timeout(REFUND_TIMEOUT, call).await {
                    // Given back, or nothing to give back (never booked, or a plain
                    // admission relied on it): either way, done.
                    Ok(Ok(_)) => return,
                    // Not reached: try again once the connection is back. Past the last
                    // try the cell stays spent (the strict side).
                    Ok(Err(_)) | Err(_) => tokio::time::sleep(REFUND_RETRY).await,
                }
            }
        });
    }
}
