//! Which client a request comes from: the peer address, through trusted proxies only,
//! IPv6 grouped by prefix; or a header, one shared key, or a closure.

use core::fmt;
use core::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{Extensions, HeaderMap, Method, Request, Uri};

use super::forwarded::client_behind;
use super::network::{canonical, group, Network};

/// A request's head, borrowed: what key functions and exemption filters look at.
///
/// # Examples
///
/// ```
/// use paceline::http::Head;
/// let request = http::Request::get("/health").body(()).unwrap();
/// let head = Head::of(&request);
/// assert_eq!(head.uri().path(), "/health");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Head<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> Head<'a> {
    /// The head of `request` (nothing is copied).
    pub fn of<B>(request: &'a Request<B>) -> Head<'a> {
        Head {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The request method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The request headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions (where servers put the peer address).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

/// A connection's peer that has no IP address, by name: an ASGI test client's
/// `"testclient"`, a unix socket's path. Put it in a request's extensions where a
/// `SocketAddr` would go, and limits keyed by the peer count the request under that name
/// (as [`ClientKey::Text`]) instead of answering that the server gives no peer address.
/// A named peer is never a trusted proxy (those are networks of addresses).
///
/// # Examples
///
/// ```
/// use paceline::http::{Decision, Head, KeySource, Limit, PeerName, RateLimitLayer};
/// use paceline::Quota;
///
/// let layer = RateLimitLayer::new().limit(Limit::new("per-ip", Quota::per_hour(1), KeySource::peer_ip()));
/// let mut request = http::Request::get("/").body(()).unwrap();
/// request.extensions_mut().insert(PeerName("testclient".into()));
/// assert!(matches!(layer.decide::<String>(&Head::of(&request)), Decision::Admit(_)));
/// assert!(matches!(layer.decide::<String>(&Head::of(&request)), Decision::Refuse(_)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerName(pub Box<str>);

/// The key one limit counts a request under.
///
/// # Examples
///
/// ```
/// use paceline::http::ClientKey;
/// let key = ClientKey::Text("api-key-123".into());
/// assert_ne!(key, ClientKey::Global);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientKey {
    /// A client address (IPv6 already cut to its prefix).
    Ip(IpAddr),
    /// A header value or any other text: an API key, a token, a tenant.
    Text(Box<str>),
    /// Every request counts under one key.
    Global,
}

/// The longest text key stored as it is, in bytes. A longer one (a header a client made
/// 100 KB long) is stored as a digest of itself: [`ClientKey::bounded`].
pub(crate) const MAX_TEXT_KEY: usize = crate::TextKey::MAX_LEN;

impl ClientKey {
    /// The key a request without one shares with every other keyless request
    /// ([`MissingKey::Shared`](super::MissingKey::Shared)): text that starts with a NUL
    /// byte, which no header value (visible ASCII only) and no address can produce.
    pub(crate) fn keyless() -> ClientKey {
        ClientKey::Text("\0keyless".into())
    }

    /// The key as it is stored: text keys over [`MAX_TEXT_KEY`] bytes become a 128-bit
    /// digest of themselves (seeded per process, so clients cannot aim for collisions),
    /// written as text that starts with a byte no header can hold. So a stored key costs
    /// at most `MAX_TEXT_KEY` bytes besides its entry, whatever clients send.
    pub(crate) fn bounded(self) -> ClientKey {
        match self {
            ClientKey::Text(text) if text.len() > MAX_TEXT_KEY => ClientKey::Text(
                format!("\u{1}{:032x}", crate::keyed::digest(text.as_bytes())).into(),
            ),
            key => key,
        }
    }
}

/// One write per key (the derived hash would feed the hasher an enum tag, another tag and
/// a length-prefixed byte slice for an IPv4 address: four writes on every request).
impl core::hash::Hash for ClientKey {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        match self {
            ClientKey::Ip(IpAddr::V4(v4)) => state.write_u64(1 << 32 | u64::from(u32::from(*v4))),
            ClientKey::Ip(IpAddr::V6(v6)) => state.write_u128(u128::from(*v6)),
            ClientKey::Text(text) => text.hash(state),
            ClientKey::Global => state.write_u8(0),
        }
    }
}

/// Where a limit reads its key from. Built by the constructors below.
#[derive(Clone)]
pub struct KeySource {
    kind: Kind,
}

/// A key function of the request's head.
type KeyFn = Arc<dyn Fn(&Head<'_>) -> Option<ClientKey> + Send + Sync>;

#[derive(Clone)]
enum Kind {
    Peer {
        trusted: Arc<[Network]>,
        ipv6_prefix: u8,
        /// Read RFC 7239 `Forwarded` instead of `X-Forwarded-For`.
        forwarded: bool,
    },
    Header(http::HeaderName),
    Global,
    Custom(KeyFn),
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Peer {
                trusted,
                ipv6_prefix,
                forwarded,
            } => f
                .debug_struct("Peer")
                .field("trusted_proxies", &trusted.len())
                .field("ipv6_prefix", ipv6_prefix)
                .field(
                    "header",
                    &if *forwarded {
                        "forwarded"
                    } else {
                        "x-forwarded-for"
                    },
                )
                .finish(),
            Kind::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Kind::Global => f.write_str("Global"),
            Kind::Custom(_) => f.write_str("Custom"),
        }
    }
}

impl KeySource {
    /// The connection's peer address, IPv6 grouped by /64 (one client usually owns a whole
    /// /64). Forwarding headers are ignored: any client can write them. The address comes
    /// from axum's `ConnectInfo<SocketAddr>` (feature `axum`), tonic's `TcpConnectInfo`
    /// (feature `tonic`), or a `SocketAddr` in the request's extensions (insert it
    /// yourself with hyper).
    ///
    /// # Examples
    ///
    /// ```
    /// let by_ip = paceline::http::KeySource::peer_ip();
    /// # let _ = by_ip;
    /// ```
    pub fn peer_ip() -> KeySource {
        KeySource {
            kind: Kind::Peer {
                trusted: Arc::from([]),
                ipv6_prefix: 64,
                forwarded: false,
            },
        }
    }

    /// The client address behind trusted proxies: when the peer is one of `proxies`, the
    /// right-most address of `X-Forwarded-For` that is not itself in `proxies`. Everything
    /// left of it was written by the client and is ignored, so a spoofed left-most entry
    /// changes nothing. IPv6 grouped by /64. If your proxies write RFC 7239 `Forwarded`
    /// instead, add [`KeySource::forwarded_header`]: only the header your proxies write
    /// may be read, since any other one comes from the client as it is.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::KeySource;
    /// let behind_lb = KeySource::behind_proxies(["10.0.0.0/8".parse().unwrap()]);
    /// # let _ = behind_lb;
    /// ```
    pub fn behind_proxies(proxies: impl IntoIterator<Item = Network>) -> KeySource {
        KeySource {
            kind: Kind::Peer {
                trusted: proxies.into_iter().collect(),
                ipv6_prefix: 64,
                forwarded: false,
            },
        }
    }

    /// Behind trusted proxies that write RFC 7239 `Forwarded` (its `for=` parameters)
    /// rather than `X-Forwarded-For`: reads that header instead, by the same right-most
    /// rule. No effect on other sources.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::KeySource;
    /// let behind_envoy = KeySource::behind_proxies(["10.0.0.0/8".parse().unwrap()]).forwarded_header();
    /// # let _ = behind_envoy;
    /// ```
    pub fn forwarded_header(mut self) -> KeySource {
        if let Kind::Peer { forwarded, .. } = &mut self.kind {
            *forwarded = true;
        }
        self
    }

    /// Groups IPv6 clients by this prefix length instead of /64 (128: every address on its
    /// own). No effect on other sources.
    ///
    /// # Examples
    ///
    /// ```
    /// let by_56 = paceline::http::KeySource::peer_ip().ipv6_prefix(56);
    /// # let _ = by_56;
    /// ```
    pub fn ipv6_prefix(mut self, prefix: u8) -> KeySource {
        if let Kind::Peer { ipv6_prefix, .. } = &mut self.kind {
            *ipv6_prefix = prefix.min(128);
        }
        self
    }

    /// A header's value (an API key, a token); a request without it has no key. Any
    /// value is a key of its own, bytes that are not ASCII included: UTF-8 reads as its
    /// text, other bytes as a `\u{2}` followed by each byte as the character of that
    /// number, so no two different values share a bucket.
    ///
    /// # Examples
    ///
    /// ```
    /// let by_api_key = paceline::http::KeySource::header(http::HeaderName::from_static("x-api-key"));
    /// # let _ = by_api_key;
    /// ```
    pub fn header(name: http::HeaderName) -> KeySource {
        KeySource {
            kind: Kind::Header(name),
        }
    }

    /// One key for every request: a limit on the whole service.
    ///
    /// # Examples
    ///
    /// ```
    /// let whole_service = paceline::http::KeySource::global();
    /// # let _ = whole_service;
    /// ```
    pub fn global() -> KeySource {
        KeySource { kind: Kind::Global }
    }

    /// Any function of the request's head; `None` means no key.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::{ClientKey, KeySource};
    /// let by_tenant = KeySource::from_fn(|head| {
    ///     let host = head.uri().host()?;
    ///     Some(ClientKey::Text(host.into()))
    /// });
    /// # let _ = by_tenant;
    /// ```
    pub fn from_fn(
        f: impl Fn(&Head<'_>) -> Option<ClientKey> + Send + Sync + 'static,
    ) -> KeySource {
        KeySource {
            kind: Kind::Custom(Arc::new(f)),
        }
    }

    /// The key `head` counts under, or `None` when it has none (no such header, no peer
    /// address, a forwarding chain that cannot be read): for a store of your own, such
    /// as a limit kept in Redis for a fleet of servers. Addresses come grouped by the
    /// IPv6 prefix and read behind trusted proxies only, as the layer reads them; text
    /// comes as the request sent it, whatever its length (the layer's own table stores a
    /// long key as a digest seeded per process, which other processes could not
    /// recompute), and a header value that is not UTF-8 as [`KeySource::header`] says.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::{ClientKey, Head, KeySource};
    /// let request = http::Request::get("/").header("x-api-key", "k-123").body(()).unwrap();
    /// let source = KeySource::header(http::HeaderName::from_static("x-api-key"));
    /// assert_eq!(source.key_of(&Head::of(&request)), Some(ClientKey::Text("k-123".into())));
    /// assert_eq!(KeySource::peer_ip().key_of(&Head::of(&request)), None); // no peer address
    /// ```
    pub fn key_of(&self, head: &Head<'_>) -> Option<ClientKey> {
        match &self.kind {
            Kind::Header(name) => Some(ClientKey::Text(header_text(head.headers().get(name)?))),
            Kind::Custom(f) => f(head),
            Kind::Peer { .. } | Kind::Global => self.key(head).ok(),
        }
    }

    /// The key of a request, or why it has none.
    #[inline]
    pub(crate) fn key(&self, head: &Head<'_>) -> Result<ClientKey, Missing> {
        match &self.kind {
            // A server's usual source, the peer with no proxy to look behind (no headers
            // read), inline; the others out of line, so that this path's frame stays
            // small.
            Kind::Peer {
                trusted,
                ipv6_prefix,
                ..
            } if trusted.is_empty() => match peer_addr(head) {
                Some(peer) => Ok(ClientKey::Ip(group(canonical(peer), *ipv6_prefix))),
                None => named_peer(head),
            },
            _ => self.key_from_others(head),
        }
    }

    /// [`KeySource::key`] for every source but a peer with no trusted proxy (given one,
    /// it answers the same: an untrusted peer is the client).
    #[inline(never)]
    fn key_from_others(&self, head: &Head<'_>) -> Result<ClientKey, Missing> {
        match &self.kind {
            Kind::Global => Ok(ClientKey::Global),
            Kind::Header(name) => {
                let value = head.headers().get(name).ok_or(Missing::FromClient)?;
                Ok(ClientKey::Text(header_text(value)).bounded())
            }
            Kind::Custom(f) => f(head).map(ClientKey::bounded).ok_or(Missing::FromClient),
            Kind::Peer {
                trusted,
                ipv6_prefix,
                forwarded,
            } => {
                // Behind trusted proxies (with none, `key` reads the peer itself). A named
                // peer is never a trusted proxy: it is the client.
                let Some(peer) = peer_addr(head) else {
                    return named_peer(head);
                };
                let client = client_behind(peer, head.headers(), trusted, *forwarded)
                    .ok_or(Missing::FromClient)?;
                Ok(ClientKey::Ip(group(client, *ipv6_prefix)))
            }
        }
    }
}

/// A header's value as a key, whatever bytes the client sent: its text when the bytes are
/// UTF-8 (visible ASCII, as nearly every client sends, or `tenant-é`), else every byte as
/// the character of that number after a `\u{2}`, which no header value holds. So two
/// values are one key only when their bytes are equal: a client that sends the header has
/// a key of its own, never the keyless bucket or another client's.
fn header_text(value: &http::HeaderValue) -> Box<str> {
    let bytes = value.as_bytes();
    match core::str::from_utf8(bytes) {
        Ok(text) => text.into(),
        Err(_) => core::iter::once('\u{2}')
            .chain(bytes.iter().map(|&b| char::from(b)))
            .collect::<String>()
            .into(),
    }
}

/// The key of a peer without an address ([`PeerName`]), or the server's missing address.
#[cold]
fn named_peer(head: &Head<'_>) -> Result<ClientKey, Missing> {
    match head.extensions().get::<PeerName>() {
        Some(name) => Ok(ClientKey::Text(name.0.clone()).bounded()),
        None => Err(Missing::PeerAddress),
    }
}

/// Why a request has no key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Missing {
    /// The client sent none (no such header, a forwarding chain that cannot be read).
    FromClient,
    /// The server passes no peer address at all: a misconfiguration, the same for every
    /// request (axum served without connect info, say).
    PeerAddress,
}

/// The connection's peer address from the request's extensions.
#[inline]
fn peer_addr(head: &Head<'_>) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = head
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(info) = head
        .extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
    {
        if let Some(addr) = info.remote_addr() {
            return Some(addr.ip());
        }
    }
    head.extensions().get::<SocketAddr>().map(SocketAddr::ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    /// The bytes a header value may hold (`HeaderValue::from_bytes`), weighted towards
    /// the ones that are not ASCII.
    fn header_byte() -> impl proptest::strategy::Strategy<Value = u8> {
        proptest::prop_oneof![
            proptest::prelude::Just(b'\t'),
            0x20u8..0x7f,
            0x80u8..=0xff,
            proptest::prelude::Just(0xc3u8),
            proptest::prelude::Just(0xa9u8),
        ]
    }

    proptest::proptest! {
        /// The peer's key is the same whether `key` reads it inline (no trusted proxy) or
        /// out of line behind proxies that do not include the peer: the canonical
        /// address, IPv6 cut to its prefix.
        #[test]
        fn a_peer_is_keyed_alike_on_both_paths(
            v4: u32, v6: u128, is_v4: bool, mapped: bool, prefix in 0u8..=128,
        ) {
            let peer = match (is_v4, mapped) {
                (true, false) => IpAddr::V4(v4.into()),
                (true, true) => IpAddr::V6(Ipv4Addr::from(v4).to_ipv6_mapped()),
                (false, _) => IpAddr::V6(v6.into()),
            };
            let mut request = Request::new(());
            request.extensions_mut().insert(SocketAddr::new(peer, 40_000));
            let head = Head::of(&request);
            // A trusted network that never holds the peer: the other address family's
            // unspecified address alone.
            let elsewhere: Network = match canonical(peer) {
                IpAddr::V4(_) => "::/128",
                IpAddr::V6(_) => "0.0.0.0/32",
            }
            .parse()
            .unwrap();
            let direct = KeySource::peer_ip().ipv6_prefix(prefix).key(&head);
            let proxied = KeySource::behind_proxies([elsewhere]).ipv6_prefix(prefix).key(&head);
            let expected = Ok(ClientKey::Ip(group(canonical(peer), prefix)));
            proptest::prop_assert_eq!(&direct, &expected);
            proptest::prop_assert_eq!(&proxied, &expected);
        }

        /// Any bytes a client can send in a header are a key, and two values are one key
        /// only when their bytes are equal: a byte that is not ASCII neither makes the
        /// request keyless nor lets one client drain another's bucket. Both paths (the
        /// layer's own table and `key_of`) agree.
        #[test]
        fn every_header_value_is_a_key_of_its_own(
            a in proptest::collection::vec(header_byte(), 0..12),
            b in proptest::collection::vec(header_byte(), 0..12),
        ) {
            let source = KeySource::header(http::HeaderName::from_static("x-api-key"));
            let key = |bytes: &[u8]| {
                let mut request = Request::new(());
                let value = http::HeaderValue::from_bytes(bytes).unwrap();
                request.headers_mut().insert("x-api-key", value);
                let head = Head::of(&request);
                let stored = source.key(&head);
                proptest::prop_assert_eq!(stored.clone().ok(), source.key_of(&head));
                stored.map_err(|_| proptest::test_runner::TestCaseError::fail("no key"))
            };
            let (ka, kb) = (key(&a)?, key(&b)?);
            proptest::prop_assert_eq!(ka == kb, a == b);
        }
    }
}
