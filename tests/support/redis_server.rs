//! A `redis-server` of its own on a free loopback port, for `tests/redis.rs` and
//! `benches/redis.rs` (both include this file by path).

#![allow(dead_code)] // each includer uses a different part

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `redis-server` on a free loopback port, killed when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
}

impl Server {
    pub(crate) fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Server::on(port)
    }

    pub(crate) fn on(port: u16) -> Server {
        let mut child = Command::new("redis-server")
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is not installed (bash .ci/run installs it)");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Server { child, port };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not start on port {port}");
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
