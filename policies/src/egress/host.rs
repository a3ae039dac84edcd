//! Host names and IP literals as clients name them, and the allowlist's host rules.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Longest allowlist entry accepted, in bytes (a full-length name with brackets and port).
pub const MAX_ENTRY_LEN: usize = 300;
/// Longest host name, without a trailing dot (RFC 1035).
const MAX_NAME_LEN: usize = 253;
/// Longest label of a host name (RFC 1035).
const MAX_LABEL_LEN: usize = 63;
/// The ports a host rule without a port allows: plain HTTP and HTTPS.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// A destination host as a client named it: a lower-case name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A host name, lower case, without a trailing dot.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl Host {
    /// Parses a host as a client sends it: a name, a dotted-quad IPv4 address, or an IPv6
    /// address without brackets.
    pub fn parse(text: &str) -> Result<Self, HostError> {
        if text.is_empty() {
            return Err(HostError::Empty);
        }
        if let Some(at) = text.bytes().position(|b| !b.is_ascii()) {
            return Err(HostError::NonAscii { at });
        }
        if text.contains(':') {
            return Ipv6Addr::from_str(text)
                .map(|ip| Host::Ip(IpAddr::V6(ip)))
                .map_err(|_| HostError::BadIpv6);
        }
        // std accepts only four decimal parts without leading zeros; every other form a
        // resolver might read as IPv4 (`127.1`, `0x7f.1`) is refused by `parse_name`.
        if let Ok(ip) = Ipv4Addr::from_str(text) {
            return Ok(Host::Ip(IpAddr::V4(ip)));
        }
        parse_name(text).map(Host::Name)
    }

    /// The host as an HTTP authority with `port` (IPv6 in brackets).
    pub fn authority(&self, port: u16) -> String {
        match self {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            other => format!("{other}:{port}"),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// What is wrong with a host. `at` is a byte offset into the text given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Nothing where a host should be.
    #[error("empty host")]
    Empty,
    /// A byte outside ASCII.
    #[error(
        "non-ASCII character at byte {at} (internationalised names are not supported; write the xn-- form)"
    )]
    NonAscii {
        /// Offset of the first such byte.
        at: usize,
    },
    /// A character a host name may not contain.
    #[error("character {ch:?} at byte {at} is not allowed in a host name")]
    BadCharacter {
        /// Offset of the character.
        at: usize,
        /// The character.
        ch: char,
    },
    /// Two dots in a row, or a leading dot.
    #[error("empty label at byte {at}")]
    EmptyLabel {
        /// Offset of the empty label.
        at: usize,
    },
    /// A label over 63 characters.
    #[error("label at byte {at} is longer than 63 characters")]
    LabelTooLong {
        /// Offset of the label.
        at: usize,
    },
    /// A label starting or ending with `-`.
    #[error("label at byte {at} starts or ends with '-'")]
    Hyphen {
        /// Offset of the label.
        at: usize,
    },
    /// A name over 253 characters.
    #[error("host name is longer than 253 characters")]
    NameTooLong,
    /// A last label that is a number: resolvers read such names (`127.1`, `0x7f000001`) as
    /// IPv4 addresses.
    #[error("label at byte {at} is numeric, so resolvers would read the name as an IPv4 address")]
    NumericName {
        /// Offset of the numeric label.
        at: usize,
    },
    /// Not an IPv6 address (zone identifiers such as `%eth0` are refused too).
    #[error("not a valid IPv6 address")]
    BadIpv6,
    /// A `*` anywhere but as the whole first label of a rule.
    #[error("'*' at byte {at} is allowed only as the whole first label, as in *.example.com")]
    BadWildcard {
        /// Offset of the `*`.
        at: usize,
    },
}

impl HostError {
    /// Byte offset of the problem in the text given (0 when it concerns the whole host).
    pub fn offset(&self) -> usize {
        match *self {
            HostError::NonAscii { at }
            | HostError::BadCharacter { at, .. }
            | HostError::EmptyLabel { at }
            | HostError::LabelTooLong { at }
            | HostError::Hyphen { at }
            | HostError::NumericName { at }
            | HostError::BadWildcard { at } => at,
            HostError::Empty | HostError::NameTooLong | HostError::BadIpv6 => 0,
        }
    }

    /// The same error with its offset moved by `by` bytes.
    fn shifted(self, by: usize) -> Self {
        match self {
            HostError::NonAscii { at } => HostError::NonAscii { at: at + by },
            HostError::BadCharacter { at, ch } => HostError::BadCharacter { at: at + by, ch },
            HostError::EmptyLabel { at } => HostError::EmptyLabel { at: at + by },
            HostError::LabelTooLong { at } => HostError::LabelTooLong { at: at + by },
            HostError::Hyphen { at } => HostError::Hyphen { at: at + by },
            HostError::NumericName { at } => HostError::NumericName { at: at + by },
            HostError::BadWildcard { at } => HostError::BadWildcard { at: at + by },
            other @ (HostError::Empty | HostError::NameTooLong | HostError::BadIpv6) => other,
        }
    }
}

/// Checks a host name (letters, digits, `-`, `_`; labels of 1 to 63; 253 in all) and returns
/// it in lower case without a trailing dot.
fn parse_name(text: &str) -> Result<String, HostError> {
    if text.is_empty() {
        return Err(HostError::Empty);
    }
    if let Some(at) = text.bytes().position(|b| !b.is_ascii()) {
        return Err(HostError::NonAscii { at });
    }
    // One trailing dot is the absolute form of the same name.
    let name = text.strip_suffix('.').unwrap_or(text);
    if name.len() > MAX_NAME_LEN {
        return Err(HostError::NameTooLong);
    }
    let mut start = 0;
    let mut last = (0, name);
    for label in name.split('.') {
        if label.is_empty() {
            return Err(HostError::EmptyLabel { at: start });
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(HostError::LabelTooLong { at: start });
        }
        if let Some((i, b)) = label
            .bytes()
            .enumerate()
            .find(|&(_, b)| !(b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        {
            return Err(HostError::BadCharacter {
                at: start + i,
                ch: char::from(b),
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(HostError::Hyphen { at: start });
        }
        last = (start, label);
        start += label.len() + 1;
    }
    if is_numeric_label(last.1) {
        return Err(HostError::NumericName { at: last.0 });
    }
    Ok(name.to_ascii_lowercase())
}

/// Whether inet_aton would read `label` as a number (decimal, octal or `0x` hex).
fn is_numeric_label(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"));
    match hex {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_hexdigit()),
        None => label.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// What is wrong with an allowlist entry (a host rule or a CIDR). `at` is a byte offset into
/// the entry, for the policy layer to turn into a line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AllowParseError {
    /// The entry is empty.
    #[error("empty entry")]
    Empty,
    /// The entry is longer than [`MAX_ENTRY_LEN`].
    #[error("entry is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A byte outside ASCII.
    #[error(
        "non-ASCII character at byte {at} (internationalised names are not supported; write the xn-- form)"
    )]
    NonAscii {
        /// Offset of the first such byte.
        at: usize,
    },
    /// The host part is wrong.
    #[error("bad host: {error}")]
    BadHost {
        /// Offset of the problem.
        at: usize,
        /// What is wrong.
        error: HostError,
    },
    /// The port is not a decimal number from 1 to 65535.
    #[error("bad port at byte {at}: expected a number from 1 to 65535")]
    BadPort {
        /// Offset of the port (or of what stands where it should).
        at: usize,
    },
    /// Port 0.
    #[error("port 0 at byte {at} is not a destination")]
    PortZero {
        /// Offset of the port.
        at: usize,
    },
    /// The address part of a CIDR is not an IP address.
    #[error("bad CIDR at byte {at}: expected an address such as 10.0.0.0/8 or fc00::/7")]
    BadCidr {
        /// Offset of the problem.
        at: usize,
    },
    /// The prefix length is not a decimal number.
    #[error("bad prefix length at byte {at}")]
    BadPrefix {
        /// Offset of the prefix.
        at: usize,
    },
    /// The prefix length is longer than the address.
    #[error("prefix length {prefix} at byte {at} is longer than {max}")]
    PrefixTooLong {
        /// Offset of the prefix.
        at: usize,
        /// The prefix given.
        prefix: u32,
        /// 32 for IPv4, 128 for IPv6.
        max: u8,
    },
    /// Bits set after the prefix: most likely a typo for a different network.
    #[error("{given} has bits set after the prefix; did you mean {meant}?")]
    HostBitsSet {
        /// The address given.
        given: IpAddr,
        /// The network it falls in.
        meant: IpAddr,
    },
}

impl AllowParseError {
    /// Byte offset of the problem in the entry (0 when it concerns the whole entry).
    pub fn offset(&self) -> usize {
        match *self {
            AllowParseError::NonAscii { at }
            | AllowParseError::BadHost { at, .. }
            | AllowParseError::BadPort { at }
            | AllowParseError::PortZero { at }
            | AllowParseError::BadCidr { at }
            | AllowParseError::BadPrefix { at }
            | AllowParseError::PrefixTooLong { at, .. } => at,
            AllowParseError::Empty
            | AllowParseError::TooLong { .. }
            | AllowParseError::HostBitsSet { .. } => 0,
        }
    }
}

/// The checks every entry gets first: not empty, bounded, ASCII.
pub(super) fn check_entry(text: &str) -> Result<(), AllowParseError> {
    if text.is_empty() {
        return Err(AllowParseError::Empty);
    }
    if text.len() > MAX_ENTRY_LEN {
        return Err(AllowParseError::TooLong {
            len: text.len(),
            max: MAX_ENTRY_LEN,
        });
    }
    if let Some(at) = text.bytes().position(|b| !b.is_ascii()) {
        return Err(AllowParseError::NonAscii { at });
    }
    Ok(())
}

/// Parses a decimal port from 1 to 65535 (digits only; no sign, no empty port).
pub fn parse_port(text: &str) -> Option<Result<u16, PortZero>> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match text.parse::<u16>() {
        Ok(0) => Some(Err(PortZero)),
        Ok(port) => Some(Ok(port)),
        Err(_) => None,
    }
}

/// Port 0 was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortZero;

fn entry_port(text: &str, at: usize) -> Result<u16, AllowParseError> {
    match parse_port(text) {
        Some(Ok(port)) => Ok(port),
        Some(Err(PortZero)) => Err(AllowParseError::PortZero { at }),
        None => Err(AllowParseError::BadPort { at }),
    }
}

/// Which hosts a [`HostRule`] matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this name.
    Name(String),
    /// Any name one or more labels below this one (`*.example.com`), not the name itself.
    Below(String),
    /// Exactly this IP literal (IPv4-mapped IPv6 compared as its IPv4 address).
    Ip(IpAddr),
    /// Every host. No entry parses to it: only a recording policy's catch-all rule has it
    /// (see `EgressPolicy::recording`).
    Any,
}

impl HostPattern {
    /// Whether a requested host matches. Names match only name patterns, IP literals only IP
    /// patterns: a literal never matches a rule by what some name resolves to.
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Name(want), Host::Name(name)) => want == name,
            (HostPattern::Below(suffix), Host::Name(name)) => name
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
            (HostPattern::Ip(want), Host::Ip(ip)) => want.to_canonical() == ip.to_canonical(),
            (HostPattern::Any, _) => true,
            _ => false,
        }
    }
}

/// One `hosts` entry: `host[:port]`, `*.suffix[:port]`, `1.2.3.4[:port]`, `[::1][:port]` or
/// a bare `::1`. Without a port it allows [`DEFAULT_PORTS`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostRule {
    pattern: HostPattern,
    port: Option<u16>,
}

impl HostRule {
    /// The rule of a recording policy that admits every host on every port.
    pub(super) const RECORD_ALL: HostRule = HostRule {
        pattern: HostPattern::Any,
        port: None,
    };

    /// Parses one entry.
    pub fn parse(text: &str) -> Result<Self, AllowParseError> {
        check_entry(text)?;
        let (host, host_at, port) = split_host_port(text)?;
        let pattern = parse_pattern(host).map_err(|error| AllowParseError::BadHost {
            at: host_at + error.offset(),
            error: error.shifted(host_at),
        })?;
        Ok(HostRule { pattern, port })
    }

    /// The hosts it matches.
    pub fn pattern(&self) -> &HostPattern {
        &self.pattern
    }

    /// The one port it allows, or `None` for [`DEFAULT_PORTS`].
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether it allows `port`.
    pub fn allows_port(&self, port: u16) -> bool {
        match self.port {
            Some(only) => port == only,
            None => DEFAULT_PORTS.contains(&port),
        }
    }
}

impl FromStr for HostRule {
    type Err = AllowParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        HostRule::parse(text)
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.pattern, self.port) {
            (HostPattern::Name(name), _) => f.write_str(name)?,
            (HostPattern::Below(suffix), _) => write!(f, "*.{suffix}")?,
            (HostPattern::Ip(IpAddr::V6(ip)), Some(_)) => write!(f, "[{ip}]")?,
            (HostPattern::Ip(ip), _) => write!(f, "{ip}")?,
            (HostPattern::Any, _) => return f.write_str("any destination (recording)"),
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// Splits an entry into its host text, the host's offset, and the port if one is given.
fn split_host_port(text: &str) -> Result<(&str, usize, Option<u16>), AllowParseError> {
    if let Some(rest) = text.strip_prefix('[') {
        let bad_host = AllowParseError::BadHost {
            at: 1,
            error: HostError::BadIpv6,
        };
        let Some((inner, after)) = rest.split_once(']') else {
            return Err(bad_host);
        };
        if Ipv6Addr::from_str(inner).is_err() {
            return Err(bad_host);
        }
        let after_at = inner.len() + 2;
        return match after.strip_prefix(':') {
            Some(port) => Ok((inner, 1, Some(entry_port(port, after_at + 1)?))),
            None if after.is_empty() => Ok((inner, 1, None)),
            None => Err(AllowParseError::BadPort { at: after_at }),
        };
    }
    // Two or more colons without brackets can only be a bare IPv6 address (no port).
    if text.bytes().filter(|&b| b == b':').count() >= 2 {
        return Ok((text, 0, None));
    }
    match text.split_once(':') {
        Some((host, port)) => Ok((host, 0, Some(entry_port(port, host.len() + 1)?))),
        None => Ok((text, 0, None)),
    }
}

fn parse_pattern(text: &str) -> Result<HostPattern, HostError> {
    let (below, name) = match text.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let shift = if below { 2 } else { 0 };
    if let Some(at) = name.find('*') {
        return Err(HostError::BadWildcard { at: at + shift });
    }
    if below {
        return parse_name(name)
            .map(HostPattern::Below)
            .map_err(|e| e.shifted(shift));
    }
    match Host::parse(name)? {
        Host::Name(name) => Ok(HostPattern::Name(name)),
        Host::Ip(ip) => Ok(HostPattern::Ip(ip)),
    }
}
