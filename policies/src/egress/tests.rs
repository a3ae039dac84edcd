//! The allowlist's parsing, classification and decisions, case by case.

use super::*;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn name(text: &str) -> Host {
    Host::parse(text).unwrap()
}

#[test]
fn host_rules_parse_in_every_form() {
    let cases: &[(&str, HostPattern, Option<u16>, &str)] = &[
        (
            "Example.COM",
            HostPattern::Name("example.com".into()),
            None,
            "example.com",
        ),
        (
            "example.com.",
            HostPattern::Name("example.com".into()),
            None,
            "example.com",
        ),
        (
            "api.example.com:8443",
            HostPattern::Name("api.example.com".into()),
            Some(8443),
            "api.example.com:8443",
        ),
        (
            "*.Example.com",
            HostPattern::Below("example.com".into()),
            None,
            "*.example.com",
        ),
        (
            "*.example.com:80",
            HostPattern::Below("example.com".into()),
            Some(80),
            "*.example.com:80",
        ),
        (
            "10.1.2.3",
            HostPattern::Ip(ip("10.1.2.3")),
            None,
            "10.1.2.3",
        ),
        (
            "10.1.2.3:99",
            HostPattern::Ip(ip("10.1.2.3")),
            Some(99),
            "10.1.2.3:99",
        ),
        (
            "[::1]:8080",
            HostPattern::Ip(ip("::1")),
            Some(8080),
            "[::1]:8080",
        ),
        (
            "[2001:DB8::1]",
            HostPattern::Ip(ip("2001:db8::1")),
            None,
            "2001:db8::1",
        ),
        ("::1", HostPattern::Ip(ip("::1")), None, "::1"),
        (
            "fe80::1:2",
            HostPattern::Ip(ip("fe80::1:2")),
            None,
            "fe80::1:2",
        ),
        (
            "under_score.example",
            HostPattern::Name("under_score.example".into()),
            None,
            "under_score.example",
        ),
    ];
    for (text, pattern, port, shown) in cases {
        let rule = HostRule::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(rule.pattern(), pattern, "{text}");
        assert_eq!(rule.port(), *port, "{text}");
        assert_eq!(rule.to_string(), *shown, "{text}");
    }
}

#[test]
fn bad_host_rules_say_what_and_where() {
    let long = "a".repeat(MAX_ENTRY_LEN + 1);
    let cases: &[(&str, AllowParseError)] = &[
        ("", AllowParseError::Empty),
        (
            &long,
            AllowParseError::TooLong {
                len: MAX_ENTRY_LEN + 1,
                max: MAX_ENTRY_LEN,
            },
        ),
        ("bücher.de", AllowParseError::NonAscii { at: 1 }),
        ("example.com:", AllowParseError::BadPort { at: 12 }),
        ("example.com:http", AllowParseError::BadPort { at: 12 }),
        ("example.com:65536", AllowParseError::BadPort { at: 12 }),
        ("example.com:+80", AllowParseError::BadPort { at: 12 }),
        ("example.com:0", AllowParseError::PortZero { at: 12 }),
        ("[::1]:0", AllowParseError::PortZero { at: 6 }),
        ("[::1]x", AllowParseError::BadPort { at: 5 }),
        (
            "[::1",
            AllowParseError::BadHost {
                at: 1,
                error: HostError::BadIpv6,
            },
        ),
        (
            "[1.2.3.4]:80",
            AllowParseError::BadHost {
                at: 1,
                error: HostError::BadIpv6,
            },
        ),
        (
            "[fe80::1%eth0]",
            AllowParseError::BadHost {
                at: 1,
                error: HostError::BadIpv6,
            },
        ),
        (
            "a..b",
            AllowParseError::BadHost {
                at: 2,
                error: HostError::EmptyLabel { at: 2 },
            },
        ),
        (
            "exa mple.com",
            AllowParseError::BadHost {
                at: 3,
                error: HostError::BadCharacter { at: 3, ch: ' ' },
            },
        ),
        (
            "-a.com",
            AllowParseError::BadHost {
                at: 0,
                error: HostError::Hyphen { at: 0 },
            },
        ),
        (
            "*.b-.com",
            AllowParseError::BadHost {
                at: 2,
                error: HostError::Hyphen { at: 2 },
            },
        ),
        (
            "a.*.com",
            AllowParseError::BadHost {
                at: 2,
                error: HostError::BadWildcard { at: 2 },
            },
        ),
        (
            "*",
            AllowParseError::BadHost {
                at: 0,
                error: HostError::BadWildcard { at: 0 },
            },
        ),
        (
            "*.*.com",
            AllowParseError::BadHost {
                at: 2,
                error: HostError::BadWildcard { at: 2 },
            },
        ),
        (
            "127.1",
            AllowParseError::BadHost {
                at: 4,
                error: HostError::NumericName { at: 4 },
            },
        ),
        (
            "0x7f000001:80",
            AllowParseError::BadHost {
                at: 0,
                error: HostError::NumericName { at: 0 },
            },
        ),
        (
            "1.2.3.04",
            AllowParseError::BadHost {
                at: 6,
                error: HostError::NumericName { at: 6 },
            },
        ),
        (
            ":80",
            AllowParseError::BadHost {
                at: 0,
                error: HostError::Empty,
            },
        ),
    ];
    for (text, want) in cases {
        let got = HostRule::parse(text).unwrap_err();
        assert_eq!(&got, want, "{text}");
        assert_eq!(got.offset(), want.offset());
        assert!(!got.to_string().is_empty());
    }
    let label = format!("{}.com", "a".repeat(64));
    assert_eq!(
        HostRule::parse(&label).unwrap_err(),
        AllowParseError::BadHost {
            at: 0,
            error: HostError::LabelTooLong { at: 0 }
        }
    );
    let name = format!("{}a", "a.".repeat(127));
    assert_eq!(
        HostRule::parse(&name).unwrap_err(),
        AllowParseError::BadHost {
            at: 0,
            error: HostError::NameTooLong
        }
    );
}

#[test]
fn wildcards_match_names_below_only() {
    let rule = HostRule::parse("*.example.com").unwrap();
    assert!(rule.pattern().matches(&name("a.example.com")));
    assert!(rule.pattern().matches(&name("a.b.example.com")));
    assert!(rule.pattern().matches(&name("A.Example.Com.")));
    assert!(!rule.pattern().matches(&name("example.com")));
    assert!(!rule.pattern().matches(&name("badexample.com")));
    assert!(!rule.pattern().matches(&name("example.com.evil")));
    assert!(!rule.pattern().matches(&Host::Ip(ip("93.184.216.34"))));
}

#[test]
fn rules_without_a_port_allow_80_and_443() {
    let rule = HostRule::parse("example.com").unwrap();
    assert!(rule.allows_port(80) && rule.allows_port(443));
    assert!(!rule.allows_port(8080) && !rule.allows_port(0));
    let rule = HostRule::parse("example.com:8080").unwrap();
    assert!(rule.allows_port(8080) && !rule.allows_port(443));
}

#[test]
fn hosts_as_requested_parse_strictly() {
    assert_eq!(name("Example.com."), Host::Name("example.com".into()));
    assert_eq!(name("1.2.3.4"), Host::Ip(ip("1.2.3.4")));
    assert_eq!(name("::ffff:127.0.0.1"), Host::Ip(ip("::ffff:127.0.0.1")));
    for bad in [
        "",
        "1.2.3",
        "127.1",
        "0x7f.0.0.1",
        "2130706433",
        "a b",
        "[::1]",
        "*.a.com",
        "é.com",
        "a..b",
        "::1%lo",
    ] {
        assert!(Host::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(Host::Ip(ip("::1")).authority(80), "[::1]:80");
    assert_eq!(name("a.com").authority(443), "a.com:443");
}

#[test]
fn cidrs_parse_and_contain() {
    let net = Cidr::parse("10.0.0.0/8").unwrap();
    assert!(net.contains(ip("10.255.0.1")));
    assert!(net.contains(ip("::ffff:10.0.0.1")));
    assert!(!net.contains(ip("11.0.0.1")));
    assert!(!net.contains(ip("::10.0.0.1")));
    let one = Cidr::parse("127.0.0.1").unwrap();
    assert_eq!(one.to_string(), "127.0.0.1/32");
    assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
    let all = Cidr::parse("0.0.0.0/0").unwrap();
    assert!(all.contains(ip("8.8.8.8")) && !all.contains(ip("::1")));
    let ula = Cidr::parse("fc00::/7").unwrap();
    assert!(ula.contains(ip("fd12::1")) && !ula.contains(ip("fe80::1")));
    let mapped = Cidr::parse("::ffff:192.168.0.0/112").unwrap();
    assert_eq!(mapped.to_string(), "192.168.0.0/16");
    assert!(mapped.contains(ip("192.168.3.4")));
    assert!(Cidr::parse("::/0").unwrap().contains(ip("2001:db8::1")));
}

#[test]
fn bad_cidrs_say_what_and_where() {
    let cases: &[(&str, AllowParseError)] = &[
        ("", AllowParseError::Empty),
        ("10.0.0/8", AllowParseError::BadCidr { at: 0 }),
        ("example.com/8", AllowParseError::BadCidr { at: 0 }),
        ("10.0.0.0/", AllowParseError::BadPrefix { at: 9 }),
        ("10.0.0.0/x", AllowParseError::BadPrefix { at: 9 }),
        ("10.0.0.0/1000", AllowParseError::BadPrefix { at: 9 }),
        (
            "10.0.0.0/33",
            AllowParseError::PrefixTooLong {
                at: 9,
                prefix: 33,
                max: 32,
            },
        ),
        (
            "::/129",
            AllowParseError::PrefixTooLong {
                at: 3,
                prefix: 129,
                max: 128,
            },
        ),
        (
            "10.0.0.1/8",
            AllowParseError::HostBitsSet {
                given: ip("10.0.0.1"),
                meant: ip("10.0.0.0"),
            },
        ),
        ("ü", AllowParseError::NonAscii { at: 0 }),
    ];
    for (text, want) in cases {
        assert_eq!(&Cidr::parse(text).unwrap_err(), want, "{text}");
    }
}

#[test]
fn addresses_are_classified() {
    let cases: &[(&str, AddressClass)] = &[
        ("8.8.8.8", AddressClass::Public),
        ("93.184.216.34", AddressClass::Public),
        ("0.0.0.0", AddressClass::Unspecified),
        ("0.1.2.3", AddressClass::ThisNetwork),
        ("127.0.0.1", AddressClass::Loopback),
        ("127.255.0.9", AddressClass::Loopback),
        ("10.0.0.1", AddressClass::Private),
        ("172.16.0.1", AddressClass::Private),
        ("172.31.255.255", AddressClass::Private),
        ("172.32.0.1", AddressClass::Public),
        ("192.168.1.1", AddressClass::Private),
        ("100.64.0.1", AddressClass::Private),
        ("100.128.0.1", AddressClass::Public),
        ("169.254.169.254", AddressClass::LinkLocal),
        ("224.0.0.1", AddressClass::Multicast),
        ("255.255.255.255", AddressClass::Broadcast),
        ("240.0.0.1", AddressClass::Reserved),
        ("198.18.0.1", AddressClass::Reserved),
        ("192.0.2.1", AddressClass::Documentation),
        ("::", AddressClass::Unspecified),
        ("::1", AddressClass::Loopback),
        ("::ffff:127.0.0.1", AddressClass::Loopback),
        ("::ffff:169.254.169.254", AddressClass::LinkLocal),
        ("::ffff:0.0.0.0", AddressClass::Unspecified),
        ("::ffff:8.8.8.8", AddressClass::Public),
        ("::127.0.0.1", AddressClass::Loopback),
        ("::10.0.0.1", AddressClass::Private),
        ("64:ff9b::127.0.0.1", AddressClass::Loopback),
        ("64:ff9b::8.8.8.8", AddressClass::Public),
        ("64:ff9b:1::1", AddressClass::Private),
        ("2002:7f00:1::", AddressClass::Reserved),
        ("2002:0808:0808::", AddressClass::Public),
        ("fe80::1", AddressClass::LinkLocal),
        ("fc00::1", AddressClass::Private),
        ("fd00:ec2::254", AddressClass::Private),
        ("fec0::1", AddressClass::Private),
        ("ff02::1", AddressClass::Multicast),
        ("2001:db8::1", AddressClass::Documentation),
        ("3fff::1", AddressClass::Documentation),
        ("3fff:1000::1", AddressClass::Public),
        ("2001::1", AddressClass::Reserved),
        ("100::1", AddressClass::Reserved),
        ("2606:4700::1111", AddressClass::Public),
    ];
    for (text, class) in cases {
        assert_eq!(classify(ip(text)), *class, "{text}");
    }
}

#[test]
fn an_address_of_this_host_needs_a_network_that_covers_it_however_public() {
    let policy = EgressPolicy::parse(&["api.example.com"], &[] as &[&str]).unwrap();
    let host = name("api.example.com");
    let rule = policy.check_host(&host, 443).unwrap();
    let public = ip("93.184.216.34");
    let Decision::Denied { reason } = policy.check_address(rule, &host, public, true) else {
        panic!("this host's public address allowed");
    };
    assert_eq!(reason.code(), "address-not-allowed");
    assert!(reason.to_string().contains("this-host"), "{reason}");
    assert!(matches!(
        policy.check_address(rule, &host, public, false),
        Decision::Allowed { .. }
    ));
    let covered = EgressPolicy::parse(&["api.example.com"], &["93.184.216.0/24"]).unwrap();
    let rule = covered.check_host(&host, 443).unwrap();
    assert!(matches!(
        covered.check_address(rule, &host, public, true),
        Decision::Allowed { .. }
    ));
}

#[test]
fn names_on_the_list_reach_public_addresses_only_unless_covered() {
    let policy = EgressPolicy::parse(&["api.example.com"], &[] as &[&str]).unwrap();
    let host = name("api.example.com");
    assert_eq!(
        policy.decide(&host, 443, ip("93.184.216.34")),
        Decision::Allowed {
            rule: "api.example.com".into()
        }
    );
    for bad in [
        "10.0.0.1",
        "169.254.169.254",
        "127.0.0.1",
        "::ffff:127.0.0.1",
        "::1",
        "fd00::1",
        "100.64.1.1",
    ] {
        let Decision::Denied { reason } = policy.decide(&host, 443, ip(bad)) else {
            panic!("{bad} allowed");
        };
        assert_eq!(reason.code(), "address-not-allowed", "{bad}");
    }
    let covered = EgressPolicy::parse(
        &["api.example.com"],
        &["10.0.0.0/8", "169.254.169.254", "127.0.0.1/32", "0.0.0.0/0"],
    )
    .unwrap();
    for ok in [
        "10.0.0.1",
        "169.254.169.254",
        "127.0.0.1",
        "::ffff:127.0.0.1",
    ] {
        assert!(
            matches!(covered.decide(&host, 443, ip(ok)), Decision::Allowed { .. }),
            "{ok}"
        );
    }
    assert_eq!(
        covered.decide(&host, 443, ip("10.0.0.1")),
        Decision::Allowed {
            rule: "api.example.com via 10.0.0.0/8".into()
        }
    );
    // Never destinations, even under 0.0.0.0/0.
    for never in ["0.0.0.0", "255.255.255.255", "224.0.0.1", "::ffff:0.0.0.0"] {
        let Decision::Denied { reason } = covered.decide(&host, 443, ip(never)) else {
            panic!("{never} allowed");
        };
        assert_eq!(reason.code(), "address-never-allowed", "{never}");
    }
}

#[test]
fn hosts_and_ports_not_on_the_list_are_refused() {
    let policy =
        EgressPolicy::parse(&["*.example.com", "example.org:8080"], &[] as &[&str]).unwrap();
    let public = ip("93.184.216.34");
    let denied = |host: &str, port| match policy.decide(&name(host), port, public) {
        Decision::Denied { reason } => reason,
        Decision::Allowed { rule } => panic!("{host}:{port} allowed by {rule}"),
    };
    assert_eq!(denied("example.com", 443), DenyReason::HostNotAllowed);
    assert_eq!(denied("evil.com", 443), DenyReason::HostNotAllowed);
    assert_eq!(denied("a.example.com", 22), DenyReason::PortNotAllowed);
    assert_eq!(denied("example.org", 443), DenyReason::PortNotAllowed);
    assert_eq!(denied("example.org", 0), DenyReason::PortZero);
    assert!(matches!(
        policy.decide(&name("example.org"), 8080, public),
        Decision::Allowed { .. }
    ));
}

#[test]
fn ip_literals_need_an_ip_rule_and_a_cidr_alone_admits_nothing() {
    let cidr_only = EgressPolicy::parse(&[] as &[&str], &["10.0.0.0/8", "0.0.0.0/0"]).unwrap();
    let literal = Host::Ip(ip("10.0.0.5"));
    assert_eq!(
        cidr_only.decide(&literal, 80, ip("10.0.0.5")),
        Decision::Denied {
            reason: DenyReason::HostNotAllowed
        }
    );
    let rule_only = EgressPolicy::parse(
        &["10.0.0.5:8080", "[::1]:80", "93.184.216.34"],
        &[] as &[&str],
    )
    .unwrap();
    assert!(matches!(
        rule_only.decide(&literal, 8080, ip("10.0.0.5")),
        Decision::Denied {
            reason: DenyReason::AddressNotAllowed { .. }
        }
    ));
    let public = Host::Ip(ip("93.184.216.34"));
    assert!(matches!(
        rule_only.decide(&public, 443, ip("93.184.216.34")),
        Decision::Allowed { .. }
    ));
    assert!(matches!(
        rule_only.decide(&public, 443, ip("93.184.216.35")),
        Decision::Denied {
            reason: DenyReason::AddressMismatch { .. }
        }
    ));
    // A name never matches an IP rule, even one it resolves to.
    let both = EgressPolicy::parse(&["10.0.0.5:8080", "[::1]:80"], &["10.0.0.0/8", "::1"]).unwrap();
    assert_eq!(
        both.decide(&name("internal.example"), 8080, ip("10.0.0.5")),
        Decision::Denied {
            reason: DenyReason::HostNotAllowed
        }
    );
    assert!(matches!(
        both.decide(&literal, 8080, ip("10.0.0.5")),
        Decision::Allowed { .. }
    ));
    assert!(matches!(
        both.decide(&Host::Ip(ip("::1")), 80, ip("::1")),
        Decision::Allowed { .. }
    ));
    // The mapped form of a listed IPv4 literal is the same destination.
    let mapped = Host::Ip(ip("::ffff:10.0.0.5"));
    assert!(matches!(
        both.decide(&mapped, 8080, ip("::ffff:10.0.0.5")),
        Decision::Allowed { .. }
    ));
}

#[test]
fn policy_parse_names_the_bad_entry() {
    let err = EgressPolicy::parse(&["a.com", "b.com:0"], &["10.0.0.0/8"]).unwrap_err();
    assert_eq!(
        (err.list, err.index, err.error),
        (EntryList::Hosts, 1, AllowParseError::PortZero { at: 6 })
    );
    let err = EgressPolicy::parse(&["a.com"], &["10.0.0.0/8", "::/200"]).unwrap_err();
    assert_eq!(err.list, EntryList::AllowAddresses);
    assert_eq!(err.index, 1);
    assert_eq!(err.error.offset(), 3);
}

#[test]
fn a_recording_policy_admits_every_destination_but_those_never_allowed() {
    let base = EgressPolicy::parse(&["example.com:443"], &[] as &[&str]).unwrap();
    assert!(!base.is_recording());
    let recording = base.clone().recording();
    assert!(recording.is_recording());
    // Its own rules still admit by their own name.
    let listed = recording.decide(&name("example.com"), 443, ip("93.184.216.34"));
    assert_eq!(
        listed,
        Decision::Allowed {
            rule: "example.com:443".into()
        }
    );
    // Anything else is admitted by the catch-all, non-public addresses included.
    for (host, port, address) in [
        ("other.example", 8443, "93.184.216.34"),
        ("example.com", 80, "93.184.216.34"),
        ("127.0.0.1", 9, "127.0.0.1"),
        ("intranet.example", 80, "10.0.0.5"),
    ] {
        let host = Host::parse(host).unwrap();
        assert!(
            matches!(
                recording.decide(&host, port, ip(address)),
                Decision::Allowed { .. }
            ),
            "{host}:{port} via {address}"
        );
        assert!(
            matches!(
                base.decide(&host, port, ip(address)),
                Decision::Denied { .. }
            ),
            "{host}:{port} via {address}"
        );
    }
    // Never a destination, recording or not; port 0 is none either; a literal is itself.
    for (host, port, address) in [
        ("any.example", 80, "0.0.0.0"),
        ("any.example", 80, "224.0.0.1"),
        ("any.example", 0, "93.184.216.34"),
        ("1.2.3.4", 80, "5.6.7.8"),
    ] {
        let host = Host::parse(host).unwrap();
        assert!(
            matches!(
                recording.decide(&host, port, ip(address)),
                Decision::Denied { .. }
            ),
            "{host}:{port} via {address}"
        );
    }
}
