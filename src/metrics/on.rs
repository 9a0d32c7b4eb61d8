//! With the `metrics` feature: handles registered with the installed recorder on a limit's
//! first count, then one call each.

use core::time::Duration;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ::metrics::{Counter, Gauge, Histogram, Label};

/// How often the stored-key gauge is read, in the limit's clock (ns).
const KEYS_EVERY: u64 = 1_000_000_000;

/// One limit's metrics (module docs), shared by the limit's clones.
#[derive(Clone, Debug)]
pub(crate) struct LimitMetrics(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    name: Arc<str>,
    handles: OnceLock<Handles>,
    /// When the key gauge is next read (limiter time, ns). Relaxed: a schedule; two
    /// threads that both find it due both set the gauge, to about the same value.
    keys_due: AtomicU64,
}

#[derive(Debug)]
struct Handles {
    admitted: Counter,
    waited: Counter,
    refused: Counter,
    wait: Histogram,
    keys: Gauge,
}

impl LimitMetrics {
    pub(crate) fn new(name: &str) -> LimitMetrics {
        LimitMetrics(Arc::new(Inner {
            name: name.into(),
            handles: OnceLock::new(),
            keys_due: AtomicU64::new(0),
        }))
    }

    /// The handles, registered with the recorder installed at the first count (so a
    /// recorder installed after the limit was built, before it served, still gets them).
    #[inline]
    fn handles(&self) -> &Handles {
        self.0.handles.get_or_init(|| self.register())
    }

    #[cold]
    fn register(&self) -> Handles {
        describe();
        let labels = [self.label()];
        Handles {
            admitted: ::metrics::counter!("paceline_admitted_total", labels.iter()),
            waited: ::metrics::counter!("paceline_waited_total", labels.iter()),
            refused: ::metrics::counter!("paceline_refused_total", labels.iter()),
            wait: ::metrics::histogram!("paceline_wait_seconds", labels.iter()),
            keys: ::metrics::gauge!("paceline_keys", labels.iter()),
        }
    }

    fn label(&self) -> Label {
        Label::new("limit", self.0.name.to_string())
    }

    #[inline]
    pub(crate) fn admitted(&self) {
        self.handles().admitted.increment(1);
    }

    #[inline]
    pub(crate) fn refused(&self) {
        self.handles().refused.increment(1);
    }

    pub(crate) fn waited(&self, wait: Duration) {
        let handles = self.handles();
        handles.waited.increment(1);
        handles.wait.record(wait.as_secs_f64());
    }

    /// Sets the stored-key gauge to `len()` if a second (of `now()`, the limit's clock)
    /// has passed since it was last set.
    #[inline]
    pub(crate) fn keys(&self, now: impl FnOnce() -> u64, len: impl FnOnce() -> usize) {
        let now = now();
        let due = self.0.keys_due.load(Ordering::Relaxed);
        if now >= due {
            self.0
                .keys_due
                .store(now.saturating_add(KEYS_EVERY), Ordering::Relaxed);
            self.handles().keys.set(len() as f64);
        }
    }

    /// A Redis call that failed, by `kind` (module docs).
    pub(crate) fn redis_failure(&self, kind: &'static str) {
        let labels = [self.label(), Label::from_static_parts("kind", kind)];
        ::metrics::counter!("paceline_redis_failures_total", labels.iter()).increment(1);
    }

    /// What the failure `policy` decided while Redis could not answer.
    pub(crate) fn policy_decision(&self, policy: &'static str, admitted: bool) {
        let decision = if admitted { "admitted" } else { "refused" };
        let labels = [
            self.label(),
            Label::from_static_parts("policy", policy),
            Label::from_static_parts("decision", decision),
        ];
        ::metrics::counter!("paceline_redis_policy_total", labels.iter()).increment(1);
    }
}

/// The metrics' descriptions, given to the recorder with the first limit's handles.
fn describe() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        use ::metrics::Unit;
        const COUNTERS: [(&str, &str); 5] = [
            ("paceline_admitted_total", "Requests admitted at once"),
            (
                "paceline_waited_total",
                "Requests admitted after waiting their turn",
            ),
            ("paceline_refused_total", "Requests this limit refused"),
            (
                "paceline_redis_failures_total",
                "Redis calls that failed, by kind",
            ),
            (
                "paceline_redis_policy_total",
                "Decisions the failure policy made while Redis could not answer",
            ),
        ];
        for (name, description) in COUNTERS {
            ::metrics::describe_counter!(name, Unit::Count, description);
        }
        ::metrics::describe_histogram!(
            "paceline_wait_seconds",
            Unit::Seconds,
            "How long each waiting request waited"
        );
        ::metrics::describe_gauge!(
            "paceline_keys",
            Unit::Count,
            "Keys the limit stores (read at most once a second)"
        );
    });
}
