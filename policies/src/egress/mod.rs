//! The egress allowlist: which hosts and ports a call may name, and which addresses it may
//! actually reach.
//!
//! A connection is allowed when both hold:
//!
//! 1. the host *as requested* matches a [`HostRule`] and its port
//!    ([`EgressPolicy::check_host`]), checked before any name is resolved so that a name not
//!    on the list never reaches DNS;
//! 2. the address *actually connected to* is public, or is covered by an `allow_addresses`
//!    [`Cidr`] ([`EgressPolicy::check_address`]). A name on the list that resolves to a
//!    loopback, private or link-local address is refused unless a CIDR covers that address.
//!
//! Requests for IP literals are strict: `1.2.3.4` or `[::1]` must match an IP-literal host
//! rule; a CIDR alone never admits a request, it only lifts the refusal of a non-public
//! address for a request that a host rule already admitted. So reaching `10.0.0.5:8080` by
//! literal needs both `10.0.0.5:8080` in the hosts and `10.0.0.0/8` (or narrower) in
//! `allow_addresses`.
//!
//! Unspecified, multicast and broadcast addresses are never connected to, whatever the CIDRs
//! say: none is a TCP destination, and connecting to `0.0.0.0` reaches this host.

mod address;
mod host;
#[cfg(test)]
mod tests;

use std::fmt;
use std::net::IpAddr;

pub use address::{AddressClass, Cidr, classify};
pub use host::{
    AllowParseError, DEFAULT_PORTS, Host, HostError, HostPattern, HostRule, MAX_ENTRY_LEN,
    PortZero, parse_port,
};

/// Why a connection was refused by the allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// No rule names the host.
    HostNotAllowed,
    /// A rule names the host, but not on this port.
    PortNotAllowed,
    /// Port 0.
    PortZero,
    /// The address is not public and no `allow_addresses` entry covers it.
    AddressNotAllowed {
        /// The address.
        address: IpAddr,
        /// Its class.
        class: AddressClass,
    },
    /// The address is never a destination (unspecified, multicast, broadcast).
    AddressNeverAllowed {
        /// The address.
        address: IpAddr,
        /// Its class.
        class: AddressClass,
    },
    /// The request named an IP literal, but the address to connect to is a different one.
    AddressMismatch {
        /// The address.
        address: IpAddr,
    },
}

impl DenyReason {
    /// A short stable code, for the `X-Airlock-Denied` header and records.
    pub fn code(&self) -> &'static str {
        match self {
            DenyReason::HostNotAllowed => "host-not-allowed",
            DenyReason::PortNotAllowed => "port-not-allowed",
            DenyReason::PortZero => "port-zero",
            DenyReason::AddressNotAllowed { .. } => "address-not-allowed",
            DenyReason::AddressNeverAllowed { .. } => "address-never-allowed",
            DenyReason::AddressMismatch { .. } => "address-mismatch",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::HostNotAllowed => f.write_str("the host is not on the egress allowlist"),
            DenyReason::PortNotAllowed => {
                f.write_str("the host is on the egress allowlist, but not with this port")
            }
            DenyReason::PortZero => f.write_str("port 0 is not a destination"),
            DenyReason::AddressNotAllowed { address, class } => write!(
                f,
                "{address} is a {class} address and no allow_addresses entry covers it"
            ),
            DenyReason::AddressNeverAllowed { address, class } => {
                write!(f, "{address} is a {class} address, never a destination")
            }
            DenyReason::AddressMismatch { address } => {
                write!(f, "{address} is not the address requested")
            }
        }
    }
}

/// The outcome of checking one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed by `rule` (the host rule, and the CIDR when one admitted the address).
    Allowed {
        /// The rule, as text for records.
        rule: String,
    },
    /// Refused.
    Denied {
        /// Why.
        reason: DenyReason,
    },
}

/// One call's egress policy: host rules and the CIDRs that make non-public addresses
/// reachable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    hosts: Vec<HostRule>,
    addresses: Vec<Cidr>,
    /// Admits every destination its rules do not (`airlock learn`, which records them).
    recording: bool,
}

/// The rule a recording policy admits an unlisted destination by.
static RECORD_ALL: HostRule = HostRule::RECORD_ALL;

/// Which list a bad entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryList {
    /// `hosts`.
    Hosts,
    /// `allow_addresses`.
    AllowAddresses,
}

/// A bad entry in one of the lists given to [`EgressPolicy::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{list:?} entry {index}: {error}")]
pub struct EntryError {
    /// The list.
    pub list: EntryList,
    /// The entry's index in it.
    pub index: usize,
    /// What is wrong (its `offset()` is within the entry).
    pub error: AllowParseError,
}

impl EgressPolicy {
    /// A policy of parsed rules.
    pub fn new(hosts: Vec<HostRule>, addresses: Vec<Cidr>) -> Self {
        EgressPolicy {
            hosts,
            addresses,
            recording: false,
        }
    }

    /// Parses both lists; the first bad entry is the error.
    pub fn parse<H: AsRef<str>, A: AsRef<str>>(
        hosts: &[H],
        addresses: &[A],
    ) -> Result<Self, EntryError> {
        let hosts = hosts
            .iter()
            .enumerate()
            .map(|(index, text)| {
                HostRule::parse(text.as_ref()).map_err(|error| EntryError {
                    list: EntryList::Hosts,
                    index,
                    error,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let addresses = addresses
            .iter()
            .enumerate()
            .map(|(index, text)| {
                Cidr::parse(text.as_ref()).map_err(|error| EntryError {
                    list: EntryList::AllowAddresses,
                    index,
                    error,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EgressPolicy {
            hosts,
            addresses,
            recording: false,
        })
    }

    /// This policy made a recording one, for a learning run: what its rules admit they
    /// still admit (by their own rule), and every other host and port is admitted too, by
    /// the catch-all rule, with any address the policy would refuse as loopback, private or
    /// link-local. Addresses that are never a destination stay refused, and an IP literal
    /// still connects only to itself. Never the policy of a call: a learning run's proxy
    /// lets the command reach whatever it asks for so that the learner can see what that is.
    #[must_use]
    pub fn recording(mut self) -> Self {
        self.recording = true;
        self
    }

    /// Whether this is a recording policy ([`recording`](Self::recording)).
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// The host rules.
    pub fn hosts(&self) -> &[HostRule] {
        &self.hosts
    }

    /// The CIDRs.
    pub fn addresses(&self) -> &[Cidr] {
        &self.addresses
    }

    /// The first rule admitting `host` on `port`. Done before resolving, so a name not on
    /// the list is never looked up (a lookup alone can carry data out through DNS).
    pub fn check_host(&self, host: &Host, port: u16) -> Result<&HostRule, DenyReason> {
        if port == 0 {
            return Err(DenyReason::PortZero);
        }
        let mut named = false;
        for rule in &self.hosts {
            if rule.pattern().matches(host) {
                if rule.allows_port(port) {
                    return Ok(rule);
                }
                named = true;
            }
        }
        if self.recording {
            return Ok(&RECORD_ALL);
        }
        Err(if named {
            DenyReason::PortNotAllowed
        } else {
            DenyReason::HostNotAllowed
        })
    }

    /// Whether `address`, the one about to be connected to for `host`, may be reached under
    /// `rule` (from [`check_host`](Self::check_host)); `this_host`: it is an address of one of
    /// the host's own interfaces, which needs an `allow_addresses` network however public.
    pub fn check_address(
        &self,
        rule: &HostRule,
        host: &Host,
        address: IpAddr,
        this_host: bool,
    ) -> Decision {
        if let Host::Ip(literal) = host
            && literal.to_canonical() != address.to_canonical()
        {
            return Decision::Denied {
                reason: DenyReason::AddressMismatch { address },
            };
        }
        let class = match classify(address) {
            AddressClass::Public if this_host => AddressClass::ThisHost,
            class => class,
        };
        if class.is_never_allowed() {
            return Decision::Denied {
                reason: DenyReason::AddressNeverAllowed { address, class },
            };
        }
        if class.is_public() {
            return Decision::Allowed {
                rule: rule.to_string(),
            };
        }
        match self.addresses.iter().find(|cidr| cidr.contains(address)) {
            Some(cidr) => Decision::Allowed {
                rule: format!("{rule} via {cidr}"),
            },
            None if self.recording => Decision::Allowed {
                rule: format!("{rule}, {class} address (recording)"),
            },
            None => Decision::Denied {
                reason: DenyReason::AddressNotAllowed { address, class },
            },
        }
    }

    /// The whole decision for one connection: `host` and `port` as requested, `address`
    /// the resolved address actually to be connected to (not one of the host's own).
    pub fn decide(&self, host: &Host, port: u16, address: IpAddr) -> Decision {
        match self.check_host(host, port) {
            Ok(rule) => self.check_address(rule, host, address, false),
            Err(reason) => Decision::Denied { reason },
        }
    }
}
