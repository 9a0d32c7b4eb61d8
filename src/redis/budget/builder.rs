//! Building a [`RedisBudget`]: its rates, its cap, its keys, and the connection.

use super::*;

/// Builds a [`RedisBudget`]: its rates, by name, and its in-flight cap.
///
/// # Examples
///
/// See [`RedisBudget`].
#[derive(Debug)]
pub struct RedisBudgetBuilder {
    rates: Vec<(String, Quota)>,
    in_flight: Option<u32>,
    prefix: String,
    timeout: Duration,
}

impl RedisBudget {
    /// A builder.
    ///
    /// # Examples
    ///
    /// See [`RedisBudget`].
    pub fn builder() -> RedisBudgetBuilder {
        RedisBudgetBuilder {
            rates: Vec::new(),
            in_flight: None,
            prefix: "paceline".into(),
            timeout: Duration::from_millis(250),
        }
    }
}

impl RedisBudgetBuilder {
    crate::budget::rate_and_in_flight! {
        /// Adds a dimension: `quota` of `name`.
        ///
        /// # Examples
        ///
        /// See [`RedisBudget`].
        fn rate;

        /// Caps the calls in flight over every client (at most
        /// [`MAX_CALLERS`](crate::budget::fleet::MAX_CALLERS)).
        ///
        /// # Examples
        ///
        /// See [`RedisBudget`].
        fn in_flight;
    }

    /// The prefix of the budget's Redis keys (default `paceline`): `<prefix>:{<name>}:budget`
    /// and `<prefix>:{<name>}:epochs`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # use paceline::{redis::RedisBudget, Quota};
    /// let budget = RedisBudget::builder()
    ///     .rate("requests", Quota::per_minute(60))
    ///     .prefix("billing")
    ///     .connect("redis://127.0.0.1/", "partner")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one round trip may take before the call fails with
    /// [`RedisBudgetError::Unavailable`] (default 250 ms).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # use paceline::{redis::RedisBudget, Quota};
    /// let budget = RedisBudget::builder()
    ///     .rate("requests", Quota::per_minute(60))
    ///     .timeout(std::time::Duration::from_millis(100))
    ///     .connect("redis://127.0.0.1/", "partner")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Connects to `url` and builds the budget named `name` there. The connection
    /// reconnects in the background after failures.
    ///
    /// # Errors
    ///
    /// [`RedisBudgetError::Build`] for rates no budget takes (see
    /// [`FleetRules::new`](crate::budget::fleet::FleetRules::new));
    /// [`RedisBudgetError::BadName`] for a name that cannot be its keys' hash tag;
    /// [`RedisBudgetError::Connect`] for a bad URL or a server that does not answer as
    /// Redis or does not run scripts.
    ///
    /// # Examples
    ///
    /// See [`RedisBudget`].
    pub async fn connect(self, url: &str, name: &str) -> Result<RedisBudget, RedisBudgetError> {
        let rules = FleetRules::new(self.rates, self.in_flight)?;
        // The name is the keys' hash tag: a '}' would end it early, and put the
        // budget's two keys on different slots of a cluster.
        if name.is_empty() || name.len() > crate::redis::MAX_KEY_LEN || name.contains('}') {
            return Err(RedisBudgetError::BadName);
        }
        let conn = crate::redis::conn::node(url)
            .await
            .map_err(RedisBudgetError::Connect)?;
        crate::redis::conn::load_scripts(&conn, &[BUDGET_READ, BUDGET_WRITE])
            .await
            .map_err(RedisBudgetError::Connect)?;
        let base = format!("{}:{{{name}}}", self.prefix);
        Ok(RedisBudget {
            inner: Arc::new(Inner {
                conn,
                rules,
                read: redis::Script::new(BUDGET_READ),
                write: redis::Script::new(BUDGET_WRITE),
                keys: [format!("{base}:budget"), format!("{base}:epochs")],
                name: name.into(),
                me: crate::budget::fleet::new_owner(),
                timeout: self.timeout,
                held: AtomicUsize::new(0),
                renewing: AtomicBool::new(false),
                origin: Instant::now(),
                epochs: std::sync::Mutex::new(None),
                turns: tokio::sync::Mutex::new(()),
                queue: tokio::sync::Mutex::new(()),
            }),
        })
    }
}
