//! Without the `metrics` feature: the same hooks, empty, so callers need no `cfg` and
//! the compiler removes every call.

use core::time::Duration;

/// One limit's metrics: nothing, without the feature.
#[derive(Clone, Debug, Default)]
pub(crate) struct LimitMetrics;

impl LimitMetrics {
    pub(crate) fn new(_name: &str) -> LimitMetrics {
        LimitMetrics
    }

    #[inline(always)]
    pub(crate) fn admitted(&self) {}

    #[inline(always)]
    pub(crate) fn refused(&self) {}

    #[inline(always)]
    pub(crate) fn waited(&self, _wait: Duration) {}

    #[inline(always)]
    pub(crate) fn keys(&self, _now: impl FnOnce() -> u64, _len: impl FnOnce() -> usize) {}

    #[inline(always)]
    pub(crate) fn redis_failure(&self, _kind: &'static str) {}

    #[inline(always)]
    pub(crate) fn policy_decision(&self, _policy: &'static str, _admitted: bool) {}
}
