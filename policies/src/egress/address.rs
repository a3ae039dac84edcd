//! Addresses: the `allow_addresses` networks and what kind of address an IP is.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::Serialize;

use super::host::{AllowParseError, check_entry};

/// One `allow_addresses` entry: an IPv4 or IPv6 network, `10.0.0.0/8`, `fc00::/7`; a bare
/// address is that one address. IPv4-mapped IPv6 networks are stored as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses one entry. Bits set after the prefix (`10.0.0.1/8`) are refused as a likely
    /// typo rather than silently masked.
    pub fn parse(text: &str) -> Result<Self, AllowParseError> {
        check_entry(text)?;
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some((prefix, address.len() + 1))),
            None => (text, None),
        };
        let network = IpAddr::from_str(address).map_err(|_| AllowParseError::BadCidr { at: 0 })?;
        let max: u8 = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some((digits, at)) => {
                if digits.is_empty()
                    || digits.len() > 3
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(AllowParseError::BadPrefix { at });
                }
                let value: u32 = digits
                    .parse()
                    .map_err(|_| AllowParseError::BadPrefix { at })?;
                match u8::try_from(value) {
                    Ok(prefix) if prefix <= max => prefix,
                    _ => {
                        return Err(AllowParseError::PrefixTooLong {
                            at,
                            prefix: value,
                            max,
                        });
                    }
                }
            }
        };
        let cidr = Cidr::canonical(network, prefix);
        let meant = cidr.masked();
        if meant != cidr.network {
            return Err(AllowParseError::HostBitsSet {
                given: cidr.network,
                meant,
            });
        }
        Ok(cidr)
    }

    /// A v4-mapped v6 network (`::ffff:10.0.0.0/104`) as the IPv4 network it denotes, so
    /// that it matches the addresses [`contains`](Self::contains) compares as IPv4.
    fn canonical(network: IpAddr, prefix: u8) -> Self {
        if let IpAddr::V6(v6) = network
            && let Some(v4) = v6.to_ipv4_mapped()
            && prefix >= 96
        {
            return Cidr {
                network: IpAddr::V4(v4),
                prefix: prefix - 96,
            };
        }
        Cidr { network, prefix }
    }

    fn masked(&self) -> IpAddr {
        match self.network {
            IpAddr::V4(ip) => IpAddr::V4(Ipv4Addr::from(u32::from(ip) & mask_v4(self.prefix))),
            IpAddr::V6(ip) => IpAddr::V6(Ipv6Addr::from(u128::from(ip) & mask_v6(self.prefix))),
        }
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in the network. An IPv4-mapped IPv6 address is compared as its IPv4
    /// address (connecting to it reaches that IPv4 host); other embeddings are not.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask_v4(self.prefix);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask_v6(self.prefix);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

fn mask_v4(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0)
}

fn mask_v6(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0)
}

impl FromStr for Cidr {
    type Err = AllowParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Cidr::parse(text)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// What kind of address an IP is, for deciding whether it may be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressClass {
    /// Globally routable as far as we know.
    Public,
    /// `0.0.0.0`, `::`: connecting to it reaches this host.
    Unspecified,
    /// The rest of `0.0.0.0/8`.
    ThisNetwork,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918, CGNAT `100.64.0.0/10`, ULA `fc00::/7`, site-local `fec0::/10`, local NAT64.
    Private,
    /// `169.254.0.0/16` (cloud metadata services live here), `fe80::/10`.
    LinkLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// Other special-purpose ranges: `192.0.0.0/24`, benchmarking `198.18.0.0/15`,
    /// `240.0.0.0/4`, discard `100::/64`, Teredo `2001::/32`, the rest of `::/16`.
    Reserved,
    /// An otherwise public address of one of the host's own interfaces: connecting to it
    /// reaches the host's services, as loopback does. Never from [`classify`], which knows
    /// no host: the proxy says so when it connects.
    ThisHost,
}

impl AddressClass {
    /// Whether the class may be reached without an `allow_addresses` entry.
    pub fn is_public(self) -> bool {
        self == AddressClass::Public
    }

    /// Whether the class is never a TCP destination, whatever `allow_addresses` says.
    pub fn is_never_allowed(self) -> bool {
        matches!(
            self,
            AddressClass::Unspecified | AddressClass::Multicast | AddressClass::Broadcast
        )
    }

    /// Its name in messages and records.
    pub fn name(self) -> &'static str {
        match self {
            AddressClass::Public => "public",
            AddressClass::Unspecified => "unspecified",
            AddressClass::ThisNetwork => "this-network",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Multicast => "multicast",
            AddressClass::Broadcast => "broadcast",
            AddressClass::Documentation => "documentation",
            AddressClass::Reserved => "reserved",
            AddressClass::ThisHost => "this-host",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Classifies an address. IPv6 forms that carry an IPv4 address to an IPv4 host (mapped,
/// compatible, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are classified by that IPv4 address:
/// `::ffff:127.0.0.1` is loopback.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(ip) => classify_v4(ip),
        IpAddr::V6(ip) => classify_v6(ip),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    match ip.octets() {
        [0, 0, 0, 0] => AddressClass::Unspecified,
        [0, ..] => AddressClass::ThisNetwork,
        [127, ..] => AddressClass::Loopback,
        [10, ..] | [192, 168, ..] => AddressClass::Private,
        [172, b, ..] if (16..=31).contains(&b) => AddressClass::Private,
        [100, b, ..] if (64..=127).contains(&b) => AddressClass::Private,
        [169, 254, ..] => AddressClass::LinkLocal,
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => AddressClass::Documentation,
        [192, 0, 0, _] | [198, 18 | 19, ..] => AddressClass::Reserved,
        [255, 255, 255, 255] => AddressClass::Broadcast,
        [224..=239, ..] => AddressClass::Multicast,
        [240..=255, ..] => AddressClass::Reserved,
        _ => AddressClass::Public,
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    let segments = ip.segments();
    let bits = u128::from(ip);
    let low_v4 = Ipv4Addr::from(u32::try_from(bits & 0xffff_ffff).unwrap_or(0));
    if ip.is_unspecified() {
        return AddressClass::Unspecified;
    }
    if ip.is_loopback() {
        return AddressClass::Loopback;
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    // IPv4-compatible (deprecated), `::a.b.c.d`.
    if bits >> 32 == 0 {
        return classify_v4(low_v4);
    }
    match segments {
        // NAT64 well-known prefix: a NAT64 gateway forwards to the embedded IPv4 address.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => classify_v4(low_v4),
        [0x64, 0xff9b, 1, ..] => AddressClass::Private,
        // 6to4: a relay forwards to the IPv4 address in bits 16..48.
        [0x2002, hi, lo, ..] => {
            let v4 = Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
            match classify_v4(v4) {
                AddressClass::Public => AddressClass::Public,
                // The embedded address is what a relay would reach; never less strict.
                _ => AddressClass::Reserved,
            }
        }
        [0x100, 0, 0, 0, ..] => AddressClass::Reserved,
        [0x2001, 0xdb8, ..] => AddressClass::Documentation,
        [0x2001, 0, ..] => AddressClass::Reserved,
        [0x3fff, second, ..] if second & 0xf000 == 0 => AddressClass::Documentation,
        [first, ..] if first & 0xff00 == 0xff00 => AddressClass::Multicast,
        [first, ..] if first & 0xffc0 == 0xfe80 => AddressClass::LinkLocal,
        [first, ..] if first & 0xffc0 == 0xfec0 => AddressClass::Private,
        [first, ..] if first & 0xfe00 == 0xfc00 => AddressClass::Private,
        [0, ..] => AddressClass::Reserved,
        _ => AddressClass::Public,
    }
}
