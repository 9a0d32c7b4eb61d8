//! The connection a [`RedisLimiter`](super::RedisLimiter) talks through: one Redis
//! server, or (feature `redis-cluster`) a Redis Cluster routing each call by its key.

use core::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// How long connecting (and each answer while connecting) may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Cheap to clone: every clone shares the underlying multiplexed connection(s).
#[derive(Clone)]
pub(super) enum Conn {
    /// One server, reconnecting in the background.
    Node(ConnectionManager),
    /// A cluster: the script's one key picks the master that runs it.
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(conn) => conn.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(conn) => conn.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Loads `scripts` into the server's script cache (on every master of a cluster, where
/// `SCRIPT LOAD` goes to all of them), within [`CONNECT_TIMEOUT`]: a server that cannot
/// run them is refused when the limiter or budget is built, with its reason, not on
/// every later call.
pub(super) async fn load_scripts(conn: &Conn, scripts: &[&str]) -> redis::RedisResult<()> {
    let mut conn = conn.clone();
    let load = async {
        for script in scripts {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(*script)
                .query_async::<redis::Value>(&mut conn)
                .await?;
        }
        Ok(())
    };
    within(CONNECT_TIMEOUT, load).await
}

/// A connection to one server at `url`, reconnecting in the background, that has
/// answered a `PING`. No response timeout of its own: each call has its caller's (one
/// timer per call, not two).
pub(super) async fn node(url: &str) -> redis::RedisResult<Conn> {
    let client = redis::Client::open(url)?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(None)
        .set_number_of_retries(1);
    let mut conn = Conn::Node(ConnectionManager::new_with_config(client, config).await?);
    let ping = async { redis::cmd("PING").query_async::<String>(&mut conn).await };
    within(CONNECT_TIMEOUT, ping).await?;
    Ok(conn)
}

/// `call`'s answer, or a timeout error once `limit` has passed.
pub(super) async fn within<T>(
    limit: Duration,
    call: impl core::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "timed out",
            format!("no answer within {limit:?}"),
        ))),
    }
}
