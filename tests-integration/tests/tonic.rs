//! The tower middleware on a real tonic gRPC server on 127.0.0.1 (the standard health
//! service), called by a real tonic client: a refusal is `RESOURCE_EXHAUSTED` with the
//! limit in its message, and the peer address comes from tonic's own connection info.

use std::time::Duration;

use paceline::clock::ManualClock;
use paceline::http::{ClientKey, KeySource, Limit, RateLimitLayer};
use paceline::Quota;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test]
async fn a_tonic_server_refuses_with_resource_exhausted_per_peer_address() {
    let clock = ManualClock::new();
    let per_ip = Limit::with_clock(
        "per-ip",
        Quota::per_hour(2),
        KeySource::peer_ip(),
        clock.clone(),
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RateLimitLayer::default().limit(per_ip.clone()))
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let check = || {
        tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        })
    };
    for _ in 0..2 {
        client.check(check()).await.unwrap();
    }
    let refused = client.check(check()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("per-ip"),
        "{}",
        refused.message()
    );
    // Counted under the client's address (tonic's `TcpConnectInfo`), not the keyless key.
    let key = ClientKey::Ip("127.0.0.1".parse().unwrap());
    assert_eq!(per_ip.limiter().unwrap().remaining_key(&key), 0);
    // Half an hour later one more call passes.
    clock.advance(Duration::from_secs(1_800));
    client.check(check()).await.unwrap();
}
