//! Which address a request comes from when it passed through proxies you trust: read
//! from the right of `X-Forwarded-For` (or RFC 7239 `Forwarded`), stopping at the first
//! hop that is not one of them.

use core::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::HeaderMap;

use super::key::{canonical, Network};

/// The right-most untrusted hop: `peer` itself unless it is a trusted proxy; else the
/// right-most hop of the one header the proxies write that is not a trusted proxy.
///
/// Hops are read from the right and reading stops at the first untrusted one: only the
/// hops the trusted proxies appended matter, so a client that sends a long chain of its
/// own costs no more than a short one.
pub(crate) fn client_behind(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[Network],
    forwarded: bool,
) -> Option<IpAddr> {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(peer) {
        return Some(canonical(peer));
    }
    let mut leftmost = None;
    let name = if forwarded {
        http::header::FORWARDED
    } else {
        http::HeaderName::from_static("x-forwarded-for")
    };
    // The last header line holds the right-most hops.
    for value in headers.get_all(&name).iter().rev() {
        for element in value.as_bytes().rsplit(|&b| b == b',') {
            let hop = if forwarded {
                match forwarded_for(element) {
                    Some(hop) => hop,
                    // An element with no `for=` names no hop.
                    None => continue,
                }
            } else {
                x_forwarded_for(element)
            };
            // A hop we cannot read ends the chain: nothing to its left can be trusted.
            let ip = hop?;
            if !is_trusted(ip) {
                return Some(canonical(ip));
            }
            leftmost = Some(ip);
        }
    }
    // Every hop is a trusted proxy: the request started at the left-most of them.
    leftmost.map(canonical)
}

/// The `for=` address of one element of a `Forwarded` header: `None` if it has no `for=`
/// pair, `Some(None)` if it has one that cannot be read. Elements are split on bytes, not
/// on the header as text: a byte a client wrote that is not UTF-8 makes its own element
/// an unreadable hop, not the whole line (which would make the request keyless).
fn forwarded_for(element: &[u8]) -> Option<Option<IpAddr>> {
    let Ok(element) = core::str::from_utf8(element) else {
        return Some(None);
    };
    element.split(';').find_map(|pair| {
        let (name, addr) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| parse_node(addr.trim().trim_matches('"')))
    })
}

/// The address of one element of an `X-Forwarded-For` header (split on bytes, as above).
fn x_forwarded_for(element: &[u8]) -> Option<IpAddr> {
    core::str::from_utf8(element)
        .ok()
        .and_then(|hop| parse_node(hop.trim()))
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`, `[::1]`,
/// `[::1]:80`, `::1`.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sock) = node.parse::<SocketAddr>() {
        return Some(sock.ip());
    }
    node.strip_prefix('[')
        .and_then(|rest| rest.split(']').next())
        .and_then(|v6| v6.parse::<Ipv6Addr>().ok())
        .map(IpAddr::V6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let trusted = ["10.0.0.0/8".parse().unwrap()];
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.0.0.2")]);
        assert_eq!(
            client_behind(ip("10.0.0.1"), &h, &trusted, false),
            Some(ip("1.2.3.4"))
        );
        // An untrusted peer is the client, whatever it writes.
        assert_eq!(
            client_behind(ip("5.5.5.5"), &h, &trusted, false),
            Some(ip("5.5.5.5"))
        );
        // Only the header the proxies write is read: behind X-Forwarded-For proxies, a
        // `Forwarded` header is the client's own and changes nothing (and the other way
        // round); its bracketed IPv6 with a port parses.
        let h = headers(&[
            (
                "forwarded",
                "for=6.6.6.6;proto=http, for=\"[2001:db8::7]:443\"",
            ),
            ("x-forwarded-for", "9.9.9.9"),
        ]);
        assert_eq!(
            client_behind(ip("10.0.0.1"), &h, &trusted, false),
            Some(ip("9.9.9.9"))
        );
        assert_eq!(
            client_behind(ip("10.0.0.1"), &h, &trusted, true),
            Some(ip("2001:db8::7"))
        );
        // An unreadable hop ends the chain.
        let h = headers(&[("x-forwarded-for", "1.2.3.4, garbage")]);
        assert_eq!(client_behind(ip("10.0.0.1"), &h, &trusted, false), None);
    }

    #[test]
    fn bytes_a_client_writes_on_the_left_change_nothing() {
        // Not UTF-8 (obs-text, which HTTP allows in a field): only its own element is
        // unreadable; the proxy's right-most entry still names the client.
        let trusted = ["10.0.0.0/8".parse().unwrap()];
        for name in ["x-forwarded-for", "forwarded"] {
            let mut map = HeaderMap::new();
            let right = if name == "forwarded" {
                "for=1.2.3.4"
            } else {
                "1.2.3.4"
            };
            let value = [b"\xff\xfe junk".as_slice(), b", ", right.as_bytes()].concat();
            map.append(
                http::HeaderName::from_static(name),
                http::HeaderValue::from_bytes(&value).unwrap(),
            );
            assert_eq!(
                client_behind(ip("10.0.0.1"), &map, &trusted, name == "forwarded"),
                Some(ip("1.2.3.4")),
                "{name}"
            );
        }
    }

    #[test]
    fn a_long_forwarding_chain_costs_only_the_hops_that_matter() {
        let proxy: Network = "10.0.0.0/8".parse().unwrap();
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        // 300 KB of empty hops a client wrote, then what the trusted proxies appended.
        let chain = format!("{}9.9.9.9, 10.0.0.2", ",".repeat(300_000));
        for (name, value) in [
            ("x-forwarded-for", chain.clone()),
            (
                "forwarded",
                chain
                    .replace("9.9.9.9", "for=9.9.9.9")
                    .replace("10.0.0.2", "for=10.0.0.2"),
            ),
        ] {
            let h = headers(&[(name, &value)]);
            let start = std::time::Instant::now();
            for _ in 0..100 {
                let client = client_behind(peer, &h, &[proxy], name == "forwarded");
                assert_eq!(client, Some("9.9.9.9".parse().unwrap()));
            }
            // Reading the whole chain took milliseconds per request; the two hops that
            // matter take microseconds, even unoptimised on a loaded machine.
            let each = start.elapsed() / 100;
            assert!(
                each < std::time::Duration::from_millis(1),
                "{name}: {each:?} per request"
            );
        }
    }
}
