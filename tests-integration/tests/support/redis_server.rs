//! A `redis-server` of its own on a free loopback port, or a 3-master Redis Cluster on
//! loopback ports, for `tests/redis.rs` and `benches/redis.rs` (both include this file by
//! path).

#![allow(dead_code)] // each includer uses a different part

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The server binary: `redis-server`, or another that speaks the protocol
/// (`PACELINE_REDIS_SERVER=valkey-server`, as CI runs the Redis tests a second time).
pub(crate) fn server_binary() -> String {
    std::env::var("PACELINE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// Its command-line client (`PACELINE_REDIS_CLI=valkey-cli`).
pub(crate) fn cli_binary() -> String {
    std::env::var("PACELINE_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// A `redis-server` on a free loopback port, killed when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
}

impl Server {
    pub(crate) fn start() -> Server {
        Server::on(free_port())
    }

    pub(crate) fn on(port: u16) -> Server {
        Server::spawn(port, &[])
    }

    /// A limiter of `quota` on this server.
    pub(crate) async fn limiter(&self, quota: paceline::Quota) -> paceline::redis::RedisLimiter {
        let url = self.url();
        paceline::redis::RedisLimiter::connect(&url, quota)
            .await
            .unwrap()
    }

    /// A server on a free port started with `extra` arguments.
    pub(crate) fn with_args(extra: &[&str]) -> Server {
        Server::spawn(free_port(), extra)
    }

    fn spawn(port: u16, extra: &[&str]) -> Server {
        let mut child = Command::new(server_binary())
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--enable-debug-command",
                "yes",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (bash .ci/run installs it)", server_binary()));
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Server { child, port };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("{} did not start on port {port}", server_binary());
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Redis Cluster of three masters (no replicas) on loopback ports, each node with its
/// config file in a directory of its own; stopped and cleaned up when dropped.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<Server>,
    dir: PathBuf,
}

impl Cluster {
    pub(crate) fn start() -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "paceline-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut nodes = Vec::new();
        while nodes.len() < 3 {
            // A node also listens on its port + 10000 (the cluster bus).
            let port = free_port();
            if port > 55_000 || TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() {
                continue;
            }
            nodes.push(Cluster::node(&dir, port));
        }
        let mut create = Command::new(cli_binary());
        create.args(["--cluster", "create"]);
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let status = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("{}: {e} (it comes with the server)", cli_binary()));
        assert!(status.success(), "{} --cluster create failed", cli_binary());
        let cluster = Cluster { nodes, dir };
        cluster.wait_until_ok();
        cluster
    }

    fn node(dir: &std::path::Path, port: u16) -> Server {
        let dir = dir.to_str().unwrap();
        let file = format!("nodes-{port}.conf");
        Server::spawn(
            port,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &file,
                "--cluster-node-timeout",
                "1000",
                "--dir",
                dir,
            ],
        )
    }

    /// Stops node `i` (its slots become unavailable).
    pub(crate) fn stop(&mut self, i: usize) {
        let _ = self.nodes[i].child.kill();
        let _ = self.nodes[i].child.wait();
    }

    /// Starts node `i` again from its config file and waits for the cluster to be whole.
    pub(crate) fn restart(&mut self, i: usize) {
        self.nodes[i] = Cluster::node(&self.dir, self.nodes[i].port);
        self.wait_until_ok();
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// `redis-cli` on node `i`, its output.
    pub(crate) fn cli(&self, i: usize, args: &[&str]) -> String {
        let out = Command::new(cli_binary())
            .args(["-p", &self.nodes[i].port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait_until_ok(&self) {
        for _ in 0..1_000 {
            if (0..self.nodes.len()).all(|i| {
                self.cli(i, &["cluster", "info"])
                    .contains("cluster_state:ok")
            }) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the Redis Cluster did not become ok");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
