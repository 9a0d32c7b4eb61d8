//! IP networks (the trusted proxies' addresses) and the address a client is counted
//! under: IPv4-mapped IPv6 as IPv4, IPv6 cut to a prefix.

use core::fmt;
use core::net::{IpAddr, Ipv6Addr};

/// An IP network: an address and a prefix length, such as `10.0.0.0/8` or `fd00::/8`.
///
/// # Examples
///
/// ```
/// use paceline::http::Network;
/// let net: Network = "10.0.0.0/8".parse().unwrap();
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// assert!("10.0.0.0/33".parse::<Network>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
    /// Made once for `contains`, which runs for every hop of every request behind
    /// proxies: the address's top `prefix` bits (as a `u128`, IPv4 in the low 32) and
    /// their mask.
    net: u128,
    mask: u128,
}

/// Why a network could not be parsed.
#[derive(Clone, PartialEq, Eq)]
pub struct NetworkError(String);

impl fmt::Display for NetworkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an IP network (address/prefix): {}", self.0)
    }
}

impl core::error::Error for NetworkError {}

debug_as_display!(NetworkError);

impl core::str::FromStr for Network {
    type Err = NetworkError;

    fn from_str(s: &str) -> Result<Network, NetworkError> {
        let bad = || NetworkError(s.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Network::new(addr, prefix))
    }
}

impl Network {
    /// `addr/prefix`, with `prefix` at most the address's width.
    fn new(addr: IpAddr, prefix: u8) -> Network {
        let (bits, width) = match addr {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
            IpAddr::V6(v6) => (u128::from(v6), 128),
        };
        let mask = mask(u128::MAX, width, prefix);
        Network {
            addr,
            prefix,
            net: bits & mask,
            mask,
        }
    }

    /// Whether `ip` is inside this network (IPv4-mapped IPv6 addresses count as IPv4).
    ///
    /// # Examples
    ///
    /// ```
    /// let net: paceline::http::Network = "2001:db8::/32".parse().unwrap();
    /// assert!(net.contains("2001:db8::1".parse().unwrap()));
    /// ```
    #[inline]
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.holds(bits(ip))
    }

    /// [`Network::contains`] for an address already in [`bits`]'s form, so a caller
    /// that tries several networks converts it once.
    #[inline]
    pub(super) fn holds(&self, (bits, v4): (u128, bool)) -> bool {
        v4 == self.addr.is_ipv4() && bits & self.mask == self.net
    }
}

/// An address as a network compares it: its bits (IPv4 in the low 32) and whether it is
/// IPv4, IPv4-mapped IPv6 (`::ffff:a.b.c.d`) counting as IPv4.
#[inline]
pub(super) fn bits(ip: IpAddr) -> (u128, bool) {
    match ip {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), true),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            if bits >> 32 == 0xffff {
                (bits & u128::from(u32::MAX), true)
            } else {
                (bits, false)
            }
        }
    }
}

/// The top `prefix` bits of a `bits`-wide address.
fn mask(addr: u128, bits: u32, prefix: u8) -> u128 {
    let prefix = u32::from(prefix).min(bits);
    if prefix == 0 {
        return 0;
    }
    let keep = u128::MAX << (bits - prefix);
    let width = if bits == 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    };
    addr & keep & width
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) as the IPv4 address it is.
#[inline]
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An IPv6 client cut to its prefix (IPv4 as is).
#[inline]
pub(super) fn group(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(mask(u128::from(v6), 128, ipv6_prefix))),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_is_grouped_by_prefix_and_mapped_ipv4_is_ipv4() {
        assert_eq!(group(ip("2001:db8:1:2:aaaa::1"), 64), ip("2001:db8:1:2::"));
        assert_eq!(
            group(ip("2001:db8:1:2:aaaa::1"), 128),
            ip("2001:db8:1:2:aaaa::1")
        );
        assert_eq!(group(ip("2001:db8::1"), 0), ip("::"));
        assert_eq!(canonical(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
        let net: Network = "1.2.3.0/24".parse().unwrap();
        assert!(net.contains(ip("::ffff:1.2.3.9")));
        assert!("300.1.1.1/8".parse::<Network>().is_err());
        assert!("::/129".parse::<Network>().is_err());
    }

    proptest::proptest! {
        /// A network holds exactly the addresses whose top `prefix` bits are its own.
        #[test]
        fn a_network_holds_the_addresses_that_share_its_prefix(
            net: u32, addr: u32, prefix in 0u8..=32, net6: u128, addr6: u128, prefix6 in 0u8..=128,
        ) {
            let holds = |a: u128, b: u128, bits: u32, p: u8| {
                let p = u32::from(p);
                p == 0 || (a >> (bits - p)) == (b >> (bits - p))
            };
            let v4 = Network::new(IpAddr::V4(net.into()), prefix);
            proptest::prop_assert_eq!(
                v4.contains(IpAddr::V4(addr.into())),
                holds(net.into(), addr.into(), 32, prefix)
            );
            proptest::prop_assert!(v4.contains(IpAddr::V4(net.into())));
            let v6 = Network::new(IpAddr::V6(net6.into()), prefix6);
            proptest::prop_assert_eq!(
                v6.contains(IpAddr::V6(addr6.into())),
                holds(net6, addr6, 128, prefix6) && Ipv6Addr::from(addr6).to_ipv4_mapped().is_none()
            );
        }
    }
}
