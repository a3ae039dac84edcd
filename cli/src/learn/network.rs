//! From the destinations a learning run asked its egress proxy for to `network.allow`
//! entries (`host:port`, exactly as asked) and the `allow_addresses` the non-public ones
//! reached need, each with its evidence; and notes for what the sandbox's seccomp listener
//! saw the command address directly, around the proxy, which no grant could make work.

use std::collections::BTreeMap;
use std::net::IpAddr;

use airlock::observe::Observations;
use airlock_policy::compile::EGRESS_PORT;
use airlock_policy::egress::{Cidr, EgressPolicy, Host, HostRule, classify};
use airlock_policy::validated::{Network, Profile};

/// Most pieces of evidence quoted per entry.
const EVIDENCE_QUOTED: usize = 3;

/// One entry to add to a network list, with the evidence for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NetworkGrant {
    /// The entry as a policy writes it: `host:port`, or a CIDR.
    pub(super) entry: String,
    /// What the command did that needs it, e.g. `CONNECT example.com:443 (3x)`.
    pub(super) evidence: Vec<String>,
}

/// What the profile's network needs beyond its base.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct NetworkProposal {
    /// `network.allow` entries, sorted and distinct.
    pub(super) allow: Vec<NetworkGrant>,
    /// `network.allow_addresses` entries, sorted and distinct.
    pub(super) allow_addresses: Vec<NetworkGrant>,
    /// The base's network setting the egress proxy replaces (`"none"`, `"loopback"`), when
    /// there are entries and the base has no allowlist.
    pub(super) replaces: Option<&'static str>,
    /// Things seen and not granted, for the reviewer.
    pub(super) notes: Vec<String>,
}

/// The network entries the command needs beyond `base`, from what `observed` recorded.
pub(super) fn propose_network(base: &Profile, observed: &Observations) -> NetworkProposal {
    let mut proposal = NetworkProposal::default();
    let existing = match &base.network {
        Network::Egress(policy) => Some(policy),
        _ => None,
    };
    let mut allow: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut addresses: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for ((host, port), proxied) in &observed.proxied {
        // The proxy parsed the host already; an entry `check` would refuse is not proposed.
        let Some((host, entry)) = Host::parse(host)
            .ok()
            .map(|h| {
                let entry = h.authority(*port);
                (h, entry)
            })
            .filter(|(_, entry)| HostRule::parse(entry).is_ok())
        else {
            proposal.notes.push(format!(
                "not granted: the proxy was asked for {host:?} port {port}, which no allow entry can name"
            ));
            continue;
        };
        let evidence: Vec<String> = proxied
            .asked
            .iter()
            .map(|(how, count)| format!("{how} {entry} ({count}x)"))
            .collect();
        if matches!(base.network, Network::Host { .. }) {
            proposal.notes.push(format!(
                "not granted: {} (the base profile has the host's network, which reaches it without the proxy)",
                evidence.join("; ")
            ));
            continue;
        }
        if existing.is_none_or(|policy| policy.check_host(&host, *port).is_err()) {
            allow.insert(entry.clone(), evidence);
        }
        for address in &proxied.non_public {
            if covered(existing, *address) {
                continue;
            }
            let Some(cidr) = single_address(*address) else {
                continue;
            };
            addresses.entry(cidr).or_default().push(format!(
                "{entry} reached {address}, a {} address",
                classify(*address)
            ));
        }
    }
    proposal.allow = grants(allow);
    if !proposal.allow.is_empty() {
        proposal.replaces = match base.network {
            Network::None => Some("\"none\""),
            Network::Loopback => Some("\"loopback\""),
            Network::Host { .. } | Network::Egress(_) => None,
        };
    }
    proposal.allow_addresses = grants(addresses);
    if observed.proxied_dropped > 0 {
        proposal.notes.push(format!(
            "not granted: {} connection(s) to destinations past the learner's bound of {} \
             distinct ones (only the first {} are proposed)",
            observed.proxied_dropped,
            airlock::observe::MAX_PROXIED,
            airlock::observe::MAX_PROXIED
        ));
    }
    if observed.proxy_refused > 0 {
        proposal.notes.push(format!(
            "not granted: {} connection(s) the proxy refused while learning (its per-call \
             limits, a malformed request, or an address that is never a destination)",
            observed.proxy_refused
        ));
    }
    let proxy = format!("127.0.0.1:{EGRESS_PORT}");
    for (destination, count) in &observed.destinations {
        if *destination == proxy {
            continue; // the proxy itself, which the command was pointed at
        }
        let note = if destination.starts_with("unix:") {
            format!(
                "not granted: the command reached for {destination} ({count}x); the network stays as the base profile has it"
            )
        } else if destination.starts_with("127.") || destination.starts_with("[::1]:") {
            format!(
                "the command used {destination} ({count}x) on the sandbox's own loopback; nothing to grant"
            )
        } else {
            format!(
                "not granted: {destination} ({count}x) addressed directly, around the egress \
                 proxy; in the sandbox only the proxy leads out, so this works only if the \
                 program uses HTTP_PROXY, HTTPS_PROXY or ALL_PROXY"
            )
        };
        proposal.notes.push(note);
    }
    proposal
}

/// Whether the base allowlist's `allow_addresses` already cover `address`.
fn covered(existing: Option<&EgressPolicy>, address: IpAddr) -> bool {
    existing.is_some_and(|policy| policy.addresses().iter().any(|c| c.contains(address)))
}

/// The CIDR naming `address` alone, as `allow_addresses` writes it.
fn single_address(address: IpAddr) -> Option<String> {
    let prefix = if address.is_ipv4() { 32 } else { 128 };
    let text = format!("{address}/{prefix}");
    Cidr::parse(&text).ok().map(|_| text)
}

fn grants(map: BTreeMap<String, Vec<String>>) -> Vec<NetworkGrant> {
    map.into_iter()
        .map(|(entry, mut evidence)| {
            evidence.sort();
            evidence.dedup();
            evidence.truncate(EVIDENCE_QUOTED);
            NetworkGrant { entry, evidence }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use airlock::observe::Proxied;

    use super::*;

    fn profile(network: &str) -> Profile {
        let text = format!("version = 1\n[profiles.p]\nnetwork = {network}\n");
        let file = airlock_policy::parse_policy_str(&text, "p.toml").unwrap();
        let (mut valid, _) = airlock_policy::validate::validate_policy(
            &file,
            airlock_policy::Source::new("p", &text),
        )
        .unwrap();
        valid.profiles.remove("p").unwrap()
    }

    fn asked(entries: &[(&str, u16, &'static str, u64, Option<&str>)]) -> Observations {
        let mut observed = Observations::default();
        for (host, port, how, count, address) in entries {
            let proxied = observed
                .proxied
                .entry((host.to_string(), *port))
                .or_insert_with(Proxied::default);
            proxied.asked.insert(how, *count);
            if let Some(address) = address {
                proxied.non_public.insert(address.parse().unwrap());
            }
        }
        observed
    }

    fn entries(grants: &[NetworkGrant]) -> Vec<&str> {
        grants.iter().map(|g| g.entry.as_str()).collect()
    }

    #[test]
    fn destinations_asked_of_the_proxy_become_sorted_entries_with_evidence() {
        let observed = asked(&[
            ("pypi.org", 443, "CONNECT", 3, None),
            ("example.com", 80, "HTTP", 1, None),
            ("example.com", 80, "SOCKS5", 2, None),
            ("::1", 8080, "HTTP", 1, Some("::1")),
            ("127.0.0.1", 9000, "HTTP", 1, Some("127.0.0.1")),
        ]);
        let proposal = propose_network(&profile("\"none\""), &observed);
        assert_eq!(
            entries(&proposal.allow),
            [
                "127.0.0.1:9000",
                "[::1]:8080",
                "example.com:80",
                "pypi.org:443"
            ]
        );
        assert_eq!(
            proposal.allow[2].evidence,
            ["HTTP example.com:80 (1x)", "SOCKS5 example.com:80 (2x)"]
        );
        assert_eq!(
            entries(&proposal.allow_addresses),
            ["127.0.0.1/32", "::1/128"]
        );
        // Every entry is one `airlock check` accepts.
        let list = |grants: &[NetworkGrant]| {
            grants
                .iter()
                .map(|g| format!("{:?}", g.entry))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let learned = profile(&format!(
            "{{ allow = [{}], allow_addresses = [{}] }}",
            list(&proposal.allow),
            list(&proposal.allow_addresses)
        ));
        assert!(matches!(learned.network, Network::Egress(_)));
    }

    #[test]
    fn what_the_base_allowlist_already_admits_is_not_proposed_again() {
        let base = profile(
            r#"{ allow = ["pypi.org", "127.0.0.1:9000"], allow_addresses = ["127.0.0.0/8"] }"#,
        );
        let observed = asked(&[
            ("pypi.org", 443, "CONNECT", 1, None),
            ("pypi.org", 8443, "CONNECT", 1, None),
            ("127.0.0.1", 9000, "HTTP", 1, Some("127.0.0.1")),
            ("10.0.0.5", 80, "HTTP", 1, Some("10.0.0.5")),
        ]);
        let proposal = propose_network(&base, &observed);
        assert_eq!(entries(&proposal.allow), ["10.0.0.5:80", "pypi.org:8443"]);
        assert_eq!(entries(&proposal.allow_addresses), ["10.0.0.5/32"]);
    }

    #[test]
    fn direct_connections_are_noted_never_granted_and_the_proxy_itself_is_not_mentioned() {
        let mut observed = Observations::default();
        observed.destinations.insert("93.184.216.34:443".into(), 2);
        observed
            .destinations
            .insert(format!("127.0.0.1:{EGRESS_PORT}"), 5);
        let proposal = propose_network(&profile("\"none\""), &observed);
        assert!(proposal.allow.is_empty(), "{proposal:?}");
        assert_eq!(proposal.notes.len(), 1, "{proposal:?}");
        assert!(
            proposal.notes[0].contains("93.184.216.34:443 (2x) addressed directly"),
            "{proposal:?}"
        );
    }

    #[test]
    fn a_host_network_base_gets_notes_not_entries_and_bounds_are_reported() {
        let mut observed = asked(&[("example.com", 443, "CONNECT", 1, None)]);
        observed.proxied_dropped = 9_744;
        observed.proxy_refused = 3;
        let proposal = propose_network(&profile("\"host\""), &observed);
        assert!(proposal.allow.is_empty(), "{proposal:?}");
        let notes = proposal.notes.join("\n");
        assert!(notes.contains("host's network"), "{notes}");
        assert!(notes.contains("9744 connection(s)"), "{notes}");
        assert!(
            notes.contains("3 connection(s) the proxy refused"),
            "{notes}"
        );
    }
}
