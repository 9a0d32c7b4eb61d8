//! [`Followers`]: one [`Follower`] per upstream host, in a bounded table.
//!
//! # Implementation notes
//!
//! A client that calls many hosts must not keep a follower for every host it ever
//! called, nor put new hosts together on one limiter (a 60 s hold on one would hold the
//! others). The table keeps at most `max_hosts` followers while it can: when a new host
//! finds it full, the idle followers (nobody holds them, nobody waits on them, nothing
//! is held, their limiters are whole again: indistinguishable from new ones but for what
//! they learned) are forgotten, the longest unused first, until half the table is free.
//! A follower that is not idle is never forgotten, so a table full of busy hosts grows
//! past the bound, by the hosts the caller is busy with at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Follower, FollowerConfig};
use crate::clock::{Clock, DefaultClock};
use crate::Quota;

/// The most idle hosts a table keeps by default: about 1.2 KiB each (two limiters and
/// what the follower learned), so 5 MiB.
///
/// # Examples
///
/// ```
/// assert_eq!(paceline::upstream::MAX_HOSTS, 4_096);
/// ```
pub const MAX_HOSTS: usize = 4_096;

/// One [`Follower`] per upstream host, each configured alike, in a bounded table (see
/// the module docs). The client layers (`http::client`) and the Python package keep
/// theirs in one.
///
/// # Examples
///
/// ```
/// use paceline::upstream::{FollowerConfig, Followers};
/// use paceline::Quota;
///
/// let hosts = Followers::new(Quota::per_second(10), FollowerConfig::default());
/// let api = hosts.get("api.example.com:443");
/// assert!(std::sync::Arc::ptr_eq(&api, &hosts.get("api.example.com:443")));
/// assert_eq!(hosts.len(), 1);
/// ```
#[derive(Debug)]
pub struct Followers<C: Clock = DefaultClock> {
    configured: Quota,
    config: FollowerConfig,
    clock: C,
    max: usize,
    map: Mutex<Table<C>>,
}

#[derive(Debug)]
struct Table<C: Clock> {
    hosts: HashMap<String, Entry<C>>,
    /// The length at which a new host looks for idle ones to forget: `max`, or twice the
    /// length after a look that left the table full of busy hosts, so that a table of busy
    /// hosts costs each new host a constant share of a look, not a look.
    sweep_at: usize,
}

#[derive(Debug)]
struct Entry<C: Clock> {
    follower: Arc<Follower<C>>,
    /// When it was last handed out, by the clock.
    used: u64,
}

impl Followers {
    /// Followers configured with `configured` and `config`, on the default clock.
    ///
    /// # Examples
    ///
    /// See [`Followers`].
    pub fn new(configured: Quota, config: FollowerConfig) -> Followers {
        Followers::with_clock(configured, config, DefaultClock::default())
    }
}

impl<C: Clock> Followers<C> {
    /// [`Followers::new`] on `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Followers;
    /// let hosts = Followers::with_clock(paceline::Quota::per_second(1), Default::default(), paceline::clock::ManualClock::new());
    /// assert!(hosts.is_empty());
    /// ```
    pub fn with_clock(configured: Quota, config: FollowerConfig, clock: C) -> Followers<C> {
        Followers {
            configured,
            config,
            clock,
            max: MAX_HOSTS,
            map: Mutex::new(Table {
                hosts: HashMap::new(),
                sweep_at: 0,
            }),
        }
    }

    /// Keeps at most `max` hosts while their followers are idle (at least 1; the default
    /// is [`MAX_HOSTS`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Followers;
    /// let hosts = Followers::new(paceline::Quota::per_second(1), Default::default()).max_hosts(2);
    /// for host in ["a", "b", "c", "d"] {
    ///     hosts.get(host);
    /// }
    /// assert!(hosts.len() <= 2);
    /// ```
    pub fn max_hosts(mut self, max: usize) -> Followers<C> {
        self.max = max.max(1);
        self
    }

    /// The configured quota of every follower.
    ///
    /// # Examples
    ///
    /// ```
    /// let hosts = paceline::upstream::Followers::new(paceline::Quota::per_second(3), Default::default());
    /// assert_eq!(hosts.configured(), paceline::Quota::per_second(3));
    /// ```
    pub fn configured(&self) -> Quota {
        self.configured
    }

    /// How every follower follows its upstream.
    ///
    /// # Examples
    ///
    /// ```
    /// let hosts = paceline::upstream::Followers::new(paceline::Quota::per_second(3), Default::default());
    /// assert_eq!(hosts.config().hold_cap().as_secs(), 300);
    /// ```
    pub fn config(&self) -> FollowerConfig {
        self.config
    }

    /// The follower of `host` (made if it is new).
    ///
    /// # Examples
    ///
    /// See [`Followers`].
    pub fn get(&self, host: &str) -> Arc<Follower<C>> {
        let now = self.clock.now();
        let mut table = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = table.hosts.get_mut(host) {
            entry.used = now;
            return Arc::clone(&entry.follower);
        }
        if table.hosts.len() >= table.sweep_at.max(self.max) {
            forget_idle(&mut table.hosts, self.max / 2);
            let len = table.hosts.len();
            table.sweep_at = if len >= self.max {
                len.saturating_mul(2)
            } else {
                0
            };
        }
        let map = &mut table.hosts;
        let follower = Arc::new(Follower::with_clock(
            self.configured,
            self.config,
            self.clock.clone(),
        ));
        map.insert(
            host.to_owned(),
            Entry {
                follower: Arc::clone(&follower),
                used: now,
            },
        );
        follower
    }

    /// How many hosts the table keeps now.
    ///
    /// # Examples
    ///
    /// See [`Followers`].
    pub fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .hosts
            .len()
    }

    /// Whether the table keeps no host.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(paceline::upstream::Followers::new(paceline::Quota::per_second(1), Default::default()).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Forgets idle followers, the longest unused first, until at most `keep` are left (or
/// none is idle).
fn forget_idle<C: Clock>(map: &mut HashMap<String, Entry<C>>, keep: usize) {
    #[cfg(test)]
    tests::SWEEPS.with(|n| n.set(n.get() + 1));
    let mut idle: Vec<(u64, String)> = map
        .iter()
        .filter(|(_, e)| Arc::strong_count(&e.follower) == 1 && e.follower.is_idle())
        .map(|(host, e)| (e.used, host.clone()))
        .collect();
    let excess = map.len().saturating_sub(keep).min(idle.len());
    if excess == 0 {
        return;
    }
    idle.select_nth_unstable(excess - 1);
    for (_, host) in idle.into_iter().take(excess) {
        map.remove(&host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use core::time::Duration;

    std::thread_local! {
        /// Looks for idle hosts made on this thread.
        pub(super) static SWEEPS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    }

    /// A table of at most `max` hosts configured at `quota`, on a clock set by hand.
    fn table(quota: Quota, max: usize) -> (Followers<ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        let hosts = Followers::with_clock(quota, FollowerConfig::default(), clock.clone());
        (hosts.max_hosts(max), clock)
    }

    #[test]
    fn a_table_full_of_busy_hosts_looks_for_idle_ones_only_as_it_doubles() {
        let (hosts, clock) = table(Quota::per_second(1), 64);
        SWEEPS.with(|n| n.set(0));
        for i in 0..10_000 {
            // Busy: a request taken, its quota not whole again for a second.
            hosts.get(&format!("busy-{i}")).limiter().check().unwrap();
        }
        assert_eq!(hosts.len(), 10_000);
        let sweeps = SWEEPS.with(core::cell::Cell::get);
        assert!(sweeps <= 10, "{sweeps} looks for 10 000 new hosts");
        // Once they are idle, the next look forgets them.
        clock.advance(Duration::from_secs(2));
        for i in 0..20_000 {
            hosts.get(&format!("later-{i}"));
        }
        assert!(hosts.len() < 20_000, "{}", hosts.len());
    }

    #[test]
    fn idle_hosts_are_forgotten_oldest_first_and_busy_ones_never() {
        let (hosts, clock) = table(Quota::per_second(10), 4);
        let held = hosts.get("held");
        held.limiter().hold_for(Duration::from_secs(60));
        drop(held);
        let kept = hosts.get("kept");
        for i in 0..10 {
            clock.advance(Duration::from_secs(1));
            hosts.get(&format!("new-{i}"));
        }
        assert!(hosts.len() <= 4, "{}", hosts.len());
        // Neither the held host nor the one a caller holds was forgotten.
        assert!(hosts.get("held").limiter().check().is_err());
        assert!(Arc::ptr_eq(&kept, &hosts.get("kept")));
    }
}
