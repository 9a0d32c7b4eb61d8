//! Which address a request comes from when it passed through proxies you trust: read
//! from the right of `X-Forwarded-For` (or RFC 7239 `Forwarded`), stopping at the first
//! hop that is not one of them.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::HeaderMap;

use super::network::{bits, canonical, Network};

/// Built once at compile time: `HeaderName::from_static` at run time validates the name
/// on every call.
static X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

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
    // The address is converted once for all the networks.
    let is_trusted = |ip: IpAddr| {
        let ip = bits(ip);
        trusted.iter().any(|net| net.holds(ip))
    };
    if !is_trusted(peer) {
        return Some(canonical(peer));
    }
    let mut leftmost = None;
    let name = if forwarded {
        &http::header::FORWARDED
    } else {
        &X_FORWARDED_FOR
    };
    // The last header line holds the right-most hops.
    for value in headers.get_all(name).iter().rev() {
        if !forwarded {
            // The usual line, one IPv4 address, read in one pass; anything else below.
            if let Some(ip) = lone_ipv4(value.as_bytes()) {
                let ip = IpAddr::V4(ip);
                if !is_trusted(ip) {
                    return Some(ip);
                }
                leftmost = Some(ip);
                continue;
            }
        }
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

/// The IPv4 address a header line holds alone (`1.2.3.4`, with ASCII whitespace around
/// it), read in one pass over the bytes; `None` for anything else (several hops, a port,
/// IPv6, text that is not an address), which [`x_forwarded_for`] then reads. Accepts
/// exactly what `Ipv4Addr`'s parser does: four decimal octets of at most 255, without
/// leading zeros, so the two paths never disagree (a unit test checks it).
fn lone_ipv4(line: &[u8]) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut filled = 0;
    let mut value: u32 = 0;
    let mut digits = 0;
    for &b in line.trim_ascii() {
        match b {
            b'0'..=b'9' => {
                if digits == 1 && value == 0 {
                    return None; // a leading zero
                }
                value = value * 10 + u32::from(b - b'0');
                digits += 1;
                if value > 255 {
                    return None;
                }
            }
            b'.' if digits > 0 && filled < 3 => {
                // value <= 255 (checked as each digit came).
                octets[filled] = value as u8;
                filled += 1;
                value = 0;
                digits = 0;
            }
            _ => return None,
        }
    }
    if filled != 3 || digits == 0 {
        return None;
    }
    octets[3] = value as u8;
    Some(Ipv4Addr::from(octets))
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

    /// The one-pass reading of a lone IPv4 line agrees with the general path wherever it
    /// answers, and answers for every address as a proxy writes it.
    #[test]
    fn a_lone_ipv4_line_reads_as_the_general_path_reads_it() {
        for line in [
            "1.2.3.4",
            " 1.2.3.4\t",
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "01.2.3.4",
            "1.2.3.04",
            "1.2.3",
            "1.2.3.4.5",
            "1..2.3",
            ".1.2.3",
            "1.2.3.",
            "1.2.3.4:80",
            "1.2.3.4,5.6.7.8",
            "::1",
            "",
            " ",
            "1.2.3.4 x",
            "00.1.2.3",
            "1.2.3.0",
            "1.2.3.1000",
            "\u{b}1.2.3.4",
        ] {
            if let Some(v4) = lone_ipv4(line.as_bytes()) {
                assert_eq!(
                    Some(IpAddr::V4(v4)),
                    x_forwarded_for(line.as_bytes()),
                    "{line:?}"
                );
            }
        }
        assert_eq!(lone_ipv4(b" 10.0.1.2 "), Some(Ipv4Addr::new(10, 0, 1, 2)));
    }

    proptest::proptest! {
        #[test]
        fn lone_ipv4_never_disagrees_with_the_general_path(line in "[ \t]{0,2}[0-9.]{0,18}[ \t,:]{0,2}") {
            let fast = lone_ipv4(line.as_bytes()).map(IpAddr::V4);
            if fast.is_some() {
                proptest::prop_assert_eq!(fast, x_forwarded_for(line.as_bytes()));
            } else if let Some(IpAddr::V4(_)) = x_forwarded_for(line.as_bytes()) {
                // Only what the fast path leaves on purpose: nothing on this alphabet but
                // a trailing comma or colon, which the general path never reads as one hop.
                proptest::prop_assert!(line.contains(',') || line.contains(':'), "{:?}", line);
            }
        }

        #[test]
        fn dotted_quads_read_as_the_general_path_reads_them(
            line in "[ \t]{0,1}[0-9]{1,4}\\.[0-9]{1,4}\\.[0-9]{1,4}\\.[0-9]{1,4}[ \t]{0,1}",
        ) {
            proptest::prop_assert_eq!(
                lone_ipv4(line.as_bytes()).map(IpAddr::V4),
                x_forwarded_for(line.as_bytes())
            );
        }

        #[test]
        fn every_ipv4_address_reads_in_one_pass(bits: u32) {
            let addr = Ipv4Addr::from(bits);
            proptest::prop_assert_eq!(lone_ipv4(addr.to_string().as_bytes()), Some(addr));
        }
    }
}
