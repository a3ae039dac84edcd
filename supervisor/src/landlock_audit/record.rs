//! Audit records as text, read into what attribution needs: pure, so every shape the kernel
//! writes (and every shape a tool can make it write) is tested on captured strings.
//!
//! The kernel writes the fields; the tool chooses the paths inside them. `audit_log_untrustedstring`
//! quotes a value (`path="/tmp/a"`) unless it holds a space, a quote or a byte outside
//! printable ASCII, and then writes it as upper-case hex without quotes
//! (`path=2F746D702F6120622`…): a quoted value never holds a quote, an unquoted one never a
//! space, so a tool's path cannot end a field early or add one.

/// `AUDIT_LANDLOCK_ACCESS`.
pub const LANDLOCK_ACCESS: u16 = 1423;
/// `AUDIT_LANDLOCK_DOMAIN`.
pub const LANDLOCK_DOMAIN: u16 = 1424;

/// The longest object a denial keeps (bytes, cut at a character boundary).
pub const MAX_OBJECT: usize = 512;
/// The longest blockers list a denial keeps.
const MAX_BLOCKERS: usize = 256;

/// The text that starts every marker the supervisor logs, right after `msg='`.
pub const MARKER_PREFIX: &str = "airlock-landlock-audit mark=";

/// One record, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A refused access: the domain that refused it, the rights it lacked, the object.
    Access {
        domain: u64,
        blockers: String,
        object: String,
    },
    /// A domain logged for the first time, with the host pid of the process that created it.
    Allocated { domain: u64, pid: i32 },
    /// A domain freed.
    Deallocated { domain: u64 },
    /// A marker: the sending process's pid and the marker's number.
    Marker { pid: i32, mark: u64 },
}

/// Reads one record of netlink message type `kind`; `None` for every other type and for
/// anything malformed (which is never attributed).
pub fn parse(kind: u16, payload: &[u8]) -> Option<Record> {
    let text = std::str::from_utf8(payload).ok()?;
    let text = text.trim_end_matches(['\0', '\n']);
    // The multicast copy starts with "audit(<seconds>.<ms>:<serial>): ".
    let body = match text.strip_prefix("audit(") {
        Some(rest) => rest.split_once("): ")?.1,
        None => text,
    };
    match kind {
        LANDLOCK_ACCESS => access(body),
        LANDLOCK_DOMAIN => domain(body),
        crate::sys::audit::AUDIT_TRUSTED_APP => marker(body),
        _ => None,
    }
}

fn access(body: &str) -> Option<Record> {
    let fields = Fields::of(body)?;
    let domain = u64::from_str_radix(fields.raw("domain")?, 16).ok()?;
    let blockers = fields.raw("blockers")?;
    if blockers.is_empty() || blockers.len() > MAX_BLOCKERS {
        return None;
    }
    let object = if let Some(path) = fields.value("path") {
        path
    } else if let Some(port) = fields.raw("dest") {
        endpoint(fields.raw("daddr"), port)?
    } else if let Some(port) = fields.raw("src") {
        endpoint(fields.raw("saddr"), port)?
    } else if let Some(pid) = fields.raw("opid") {
        format!("pid {}", pid.parse::<u32>().ok()?)
    } else {
        "unknown".to_string()
    };
    Some(Record::Access {
        domain,
        blockers: blockers.to_string(),
        object: bounded(object),
    })
}

fn endpoint(address: Option<&str>, port: &str) -> Option<String> {
    let port: u16 = port.parse().ok()?;
    Some(
        match address.and_then(|a| a.parse::<std::net::IpAddr>().ok()) {
            Some(std::net::IpAddr::V6(a)) => format!("[{a}]:{port}"),
            Some(a) => format!("{a}:{port}"),
            None => format!("port {port}"),
        },
    )
}

fn domain(body: &str) -> Option<Record> {
    let fields = Fields::of(body)?;
    let domain = u64::from_str_radix(fields.raw("domain")?, 16).ok()?;
    match fields.raw("status")? {
        "allocated" => Some(Record::Allocated {
            domain,
            pid: fields.raw("pid")?.parse().ok().filter(|p: &i32| *p > 0)?,
        }),
        "deallocated" => Some(Record::Deallocated { domain }),
        _ => None,
    }
}

/// `pid=<sender> uid=... msg='airlock-landlock-audit mark=<n> call=...'`: only the pid
/// (the kernel's) and the number right after the fixed prefix are read.
fn marker(body: &str) -> Option<Record> {
    let pid = Fields::of(body)?.raw("pid")?.parse().ok()?;
    let (_, message) = body.split_once(" msg='")?;
    let rest = message.strip_prefix(MARKER_PREFIX)?;
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    Some(Record::Marker {
        pid,
        mark: digits.parse().ok()?,
    })
}

/// A record's `key=value` fields, in order; values quoted with `"` (never holding one)
/// or bare (never holding a space). The first field of a name wins.
struct Fields<'a>(Vec<(&'a str, &'a str, bool)>);

impl<'a> Fields<'a> {
    /// `None` for a quoted value that does not end: the record was cut.
    fn of(mut body: &'a str) -> Option<Self> {
        let mut fields = Vec::new();
        // Bounded by the record's own length; a few dozen fields at most in practice.
        while !body.is_empty() && fields.len() < 64 {
            body = body.trim_start_matches(' ');
            let Some((key, rest)) = body.split_once('=') else {
                break;
            };
            if let Some(space) = key.find(' ') {
                // A word without a value: skip it.
                body = &body[space + 1..];
                continue;
            }
            let (value, quoted, rest) = if let Some(inner) = rest.strip_prefix('"') {
                let (value, rest) = inner.split_once('"')?;
                (value, true, rest)
            } else if rest.starts_with('\'') {
                // `msg='...'` (markers) runs to the end: nothing after it is a field.
                (rest, false, "")
            } else {
                let end = rest.find(' ').unwrap_or(rest.len());
                (&rest[..end], false, &rest[end..])
            };
            fields.push((key, value, quoted));
            body = rest;
        }
        Some(Self(fields))
    }

    /// The value as written (quotes removed).
    fn raw(&self, key: &str) -> Option<&'a str> {
        self.0.iter().find(|(k, ..)| *k == key).map(|(_, v, _)| *v)
    }

    /// A value that may be hex-encoded: a bare value of hex digits is decoded, lossily
    /// where it is not UTF-8; a bare value that is not (`<too_long>`) is kept as written.
    fn value(&self, key: &str) -> Option<String> {
        let (_, value, quoted) = self.0.iter().find(|(k, ..)| *k == key)?;
        if *quoted {
            return Some((*value).to_string());
        }
        match decode_hex(value) {
            Some(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            None => Some((*value).to_string()),
        }
    }
}

fn decode_hex(value: &str) -> Option<Vec<u8>> {
    if value.is_empty()
        || !value.len().is_multiple_of(2)
        || !value.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    (0..value.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&value[i..i + 2], 16).ok())
        .collect()
}

/// At most [`MAX_OBJECT`] bytes, cut at a character boundary and marked.
fn bounded(mut object: String) -> String {
    if object.len() > MAX_OBJECT {
        let mut end = MAX_OBJECT - 3;
        while !object.is_char_boundary(end) {
            end -= 1;
        }
        object.truncate(end);
        object.push_str("...");
    }
    object
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn read(kind: u16, text: &str) -> Option<Record> {
        parse(kind, text.as_bytes())
    }

    #[test]
    fn a_refused_write_names_its_path_and_rights() {
        let record = read(
            LANDLOCK_ACCESS,
            "audit(1764790000.123:4567): domain=195ba459b blockers=fs.write_file path=\"/tmp/x\" dev=\"vda2\" ino=351",
        );
        assert_eq!(
            record,
            Some(Record::Access {
                domain: 0x195ba459b,
                blockers: "fs.write_file".into(),
                object: "/tmp/x".into(),
            })
        );
    }

    #[test]
    fn a_path_with_spaces_or_quotes_is_decoded_from_hex() {
        // "/tmp/a b\"c" hex-encoded by the kernel, then a path with invalid UTF-8.
        let hex: String = "/tmp/a b\"c dev=\"x\""
            .bytes()
            .map(|b| format!("{b:02X}"))
            .collect();
        let record = read(
            LANDLOCK_ACCESS,
            &format!("domain=1 blockers=fs.make_reg path={hex} dev=\"sda\" ino=2"),
        );
        let Some(Record::Access { object, .. }) = record else {
            panic!("not read: {record:?}");
        };
        assert_eq!(object, "/tmp/a b\"c dev=\"x\"");
        let record = read(
            LANDLOCK_ACCESS,
            "domain=1 blockers=fs.make_reg path=2FFF41 ino=2",
        );
        let Some(Record::Access { object, .. }) = record else {
            panic!("not read");
        };
        assert_eq!(object, "/\u{FFFD}A");
        // A bare value that is not hex is kept as the kernel wrote it.
        let record = read(
            LANDLOCK_ACCESS,
            "domain=1 blockers=fs.read_file path=<too_long>",
        );
        assert!(matches!(record, Some(Record::Access { object, .. }) if object == "<too_long>"));
    }

    #[test]
    fn a_huge_path_is_cut_and_a_bad_record_is_dropped() {
        let long = "/a".repeat(4000);
        let Some(Record::Access { object, .. }) = read(
            LANDLOCK_ACCESS,
            &format!("domain=ff blockers=fs.read_file path=\"{long}\""),
        ) else {
            panic!("not read");
        };
        assert_eq!(object.len(), MAX_OBJECT);
        assert!(object.ends_with("..."));
        for bad in [
            "domain=zz blockers=fs.read_file path=\"/x\"",
            "blockers=fs.read_file path=\"/x\"",
            "domain=1 path=\"/x\"",
            "domain=1 blockers= path=\"/x\"",
            "domain=1 blockers=fs.read_file path=\"/x",
            "",
            "audit(1.2:3)",
        ] {
            assert_eq!(read(LANDLOCK_ACCESS, bad), None, "{bad}");
        }
        assert_eq!(parse(LANDLOCK_ACCESS, b"domain=1 blockers=\xff"), None);
    }

    #[test]
    fn refused_tcp_ports_and_scopes_name_their_object() {
        let record = read(
            LANDLOCK_ACCESS,
            "domain=2a blockers=net.connect_tcp daddr=127.0.0.1 dest=9",
        );
        assert!(
            matches!(record, Some(Record::Access { object, blockers, .. })
            if object == "127.0.0.1:9" && blockers == "net.connect_tcp")
        );
        let record = read(LANDLOCK_ACCESS, "domain=2a blockers=net.bind_tcp src=8080");
        assert!(matches!(record, Some(Record::Access { object, .. }) if object == "port 8080"));
        let record = read(
            LANDLOCK_ACCESS,
            "domain=2a blockers=scope.signal opid=1 ocomm=\"systemd\"",
        );
        assert!(matches!(record, Some(Record::Access { object, .. }) if object == "pid 1"));
        let record = read(
            LANDLOCK_ACCESS,
            "domain=2a blockers=scope.abstract_unix_socket path=00666F6F",
        );
        assert!(matches!(record, Some(Record::Access { object, .. }) if object == "\0foo"));
        assert_eq!(
            read(LANDLOCK_ACCESS, "domain=2a blockers=net.bind_tcp src=99999"),
            None
        );
    }

    #[test]
    fn a_domain_record_gives_its_creator_pid_and_its_end() {
        let record = read(
            LANDLOCK_DOMAIN,
            "audit(1764790000.123:4567): domain=195ba459b status=allocated mode=enforcing pid=300 uid=0 exe=\"/memfd:airlock (deleted)\" comm=\"pid=7\"",
        );
        assert_eq!(
            record,
            Some(Record::Allocated {
                domain: 0x195ba459b,
                pid: 300
            })
        );
        assert_eq!(
            read(
                LANDLOCK_DOMAIN,
                "domain=195ba459b status=deallocated denials=3"
            ),
            Some(Record::Deallocated {
                domain: 0x195ba459b
            })
        );
        // A tool names its own comm: a pid in it is a quoted value, never the field.
        let hex: String = "x pid=1".bytes().map(|b| format!("{b:02X}")).collect();
        assert_eq!(
            read(
                LANDLOCK_DOMAIN,
                &format!("domain=5 status=allocated mode=enforcing comm={hex} pid=42")
            ),
            Some(Record::Allocated { domain: 5, pid: 42 })
        );
        assert_eq!(
            read(LANDLOCK_DOMAIN, "domain=5 status=allocated pid=0"),
            None
        );
        assert_eq!(read(LANDLOCK_DOMAIN, "domain=5 status=other pid=3"), None);
    }

    #[test]
    fn a_marker_is_read_from_the_fixed_prefix_only() {
        let record = read(
            crate::sys::audit::AUDIT_TRUSTED_APP,
            "audit(1.2:3): pid=77 uid=0 auid=4294967295 ses=4294967295 subj=unconfined msg='airlock-landlock-audit mark=12 call=c_1 mark=99'",
        );
        assert_eq!(record, Some(Record::Marker { pid: 77, mark: 12 }));
        assert_eq!(
            read(
                crate::sys::audit::AUDIT_TRUSTED_APP,
                "pid=77 uid=0 msg='something else mark=12'"
            ),
            None
        );
        assert_eq!(
            read(1100, "pid=77 msg='airlock-landlock-audit mark=12'"),
            None
        );
    }
}
